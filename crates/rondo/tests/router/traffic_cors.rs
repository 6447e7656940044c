//! The `cors` filter through real clients: curl on the own HTTP/1.1 path and on HTTP/2 (h2c,
//! hyper's path) sends preflights and actual requests, a recording member says which reached
//! it; and a headless Chromium page on another origin makes a preflighted `fetch` through the
//! router (`tests/ui/cors.mjs`).

use std::time::Duration;

use super::recorder::Recorder;
use super::support::router;
use super::traffic::{Got, parse};
use crate::common::browser::{repo, run_node, tools_or_skip};
use crate::common::{TempDir, free_port};

fn config(m: &Recorder, extra: &str, origins: &str) -> String {
    format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"
{extra}
[[route]]
listener = "web"
cluster = "c"
filters = [
  {{ request_id = {{}} }},
  {{ headers = {{ response = {{ set = {{ "x-hidden" = "1" }} }} }} }},
  {{ cors = {{ allow_origins = [{origins}], allow_methods = ["GET", "POST", "PUT"],
               allow_headers = ["content-type"], expose_headers = ["x-request-id"],
               allow_credentials = true, max_age_s = 600 }} }},
]

[cluster.c]
members = [ {} ]
"#,
        m.entry()
    )
}

const ORIGINS: &str = r#""https://app.example.com", "https://*.example.org""#;

/// curl `method url` (HTTP/1.1, or h2c with prior knowledge) with extra `-H` headers.
async fn send(h2: bool, method: &str, url: &str, headers: Vec<String>) -> Got {
    let (method, url) = (method.to_owned(), url.to_owned());
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "-D", "-", "-o", "-", "--request", &method])
            .arg(if h2 { "--http2-prior-knowledge" } else { "--http1.1" })
            .args(headers.iter().flat_map(|h| ["-H", h.as_str()]))
            .arg(&url)
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
        parse(&out.stdout)
    })
    .await
    .unwrap()
}

fn preflight(origin: &str, method: &str, headers: Option<&str>) -> Vec<String> {
    let mut out =
        vec![format!("origin: {origin}"), format!("access-control-request-method: {method}")];
    out.extend(headers.map(|h| format!("access-control-request-headers: {h}")));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_by_the_router_and_refused_ones_lack_the_allow_fields() {
    let m = Recorder::spawn("m1");
    let r = router(&config(&m, "", ORIGINS)).await;
    let url = format!("http://127.0.0.1:{}/api/items", r.addr("web").port());
    for h2 in [false, true] {
        let mut cmd = preflight("https://app.example.com", "POST", Some("Content-Type"));
        cmd.push("x-probe: 1".into());
        let got = send(h2, "OPTIONS", &url, cmd).await;
        assert_eq!(got.status, 204, "h2={h2}: {}", got.body);
        assert_eq!(got.header("access-control-allow-origin"), Some("https://app.example.com"));
        assert_eq!(got.header("access-control-allow-credentials"), Some("true"), "h2={h2}");
        assert_eq!(got.header("access-control-allow-methods"), Some("GET, POST, PUT"));
        assert_eq!(got.header("access-control-allow-headers"), Some("content-type"));
        assert_eq!(got.header("access-control-max-age"), Some("600"), "h2={h2}");
        assert_eq!(got.header("vary"), Some("origin"), "h2={h2}");
        assert!(got.body.is_empty(), "h2={h2}");
        // RFC 9110 section 8.6: no `Content-Length` on a 204.
        assert_eq!(got.header("content-length"), None, "h2={h2}");
        // A wildcard origin: one or more labels before the suffix.
        let got =
            send(h2, "OPTIONS", &url, preflight("https://a.b.example.org", "PUT", None)).await;
        assert_eq!(got.status, 204);
        assert_eq!(got.header("access-control-allow-origin"), Some("https://a.b.example.org"));
        // Refused: an origin, a method or a header not allowed. 204, no allow fields.
        for (origin, method, headers) in [
            ("https://example.org", "POST", None),
            ("https://evil.com", "POST", None),
            ("http://app.example.com", "POST", None),
            ("https://app.example.com", "DELETE", None),
            ("https://app.example.com", "POST", Some("content-type, x-secret")),
        ] {
            let got = send(h2, "OPTIONS", &url, preflight(origin, method, headers)).await;
            let what = format!("h2={h2} {origin} {method} {headers:?}");
            assert_eq!(got.status, 204, "{what}");
            assert_eq!(got.header("vary"), Some("origin"), "{what}");
            for (name, _) in &got.headers {
                assert!(!name.starts_with("access-control-"), "{what}: {name}");
            }
        }
    }
    assert!(m.seen().is_empty(), "no preflight reached the member: {:?}", m.seen());
    // An OPTIONS that is no preflight (no request method asked) is the member's.
    let got = send(false, "OPTIONS", &url, vec!["origin: https://app.example.com".into()]).await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(m.seen().len(), 1);
    assert_eq!(m.seen()[0].method, "OPTIONS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_to_allowed_origins_carry_the_cors_fields_and_others_only_vary() {
    let m = Recorder::spawn("m1");
    let r = router(&config(&m, "", ORIGINS)).await;
    let url = format!("http://127.0.0.1:{}/api/items", r.addr("web").port());
    for h2 in [false, true] {
        let got = send(h2, "GET", &url, vec!["origin: https://x.example.org".into()]).await;
        assert_eq!(got.status, 200, "h2={h2}: {}", got.body);
        assert_eq!(got.header("access-control-allow-origin"), Some("https://x.example.org"));
        assert_eq!(got.header("access-control-allow-credentials"), Some("true"), "h2={h2}");
        assert_eq!(got.header("access-control-expose-headers"), Some("x-request-id"));
        assert_eq!(got.header("vary"), Some("origin"), "h2={h2}");
        assert!(got.body.starts_with("m1 "), "h2={h2}: the member answered: {}", got.body);
        for origin in ["https://evil.com", "null"] {
            let got = send(h2, "GET", &url, vec![format!("origin: {origin}")]).await;
            assert_eq!(got.status, 200, "h2={h2}");
            assert_eq!(got.header("vary"), Some("origin"), "h2={h2}: caches must know");
            for (name, _) in &got.headers {
                assert!(!name.starts_with("access-control-"), "h2={h2} {origin}: {name}");
            }
        }
        let got = send(h2, "GET", &url, vec![]).await;
        assert_eq!(got.header("access-control-allow-origin"), None, "h2={h2}: no origin");
    }
    assert_eq!(m.seen().len(), 8, "every actual request reached the member");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_origin_without_credentials_is_answered_with_a_star_and_no_vary() {
    let m = Recorder::spawn("m1");
    let text =
        config(&m, "", r#""*""#).replace("allow_credentials = true", "allow_credentials = false");
    let r = router(&text).await;
    let url = format!("http://127.0.0.1:{}/", r.addr("web").port());
    for h2 in [false, true] {
        let got = send(h2, "GET", &url, vec!["origin: https://anyone.test".into()]).await;
        assert_eq!(got.header("access-control-allow-origin"), Some("*"), "h2={h2}");
        assert_eq!(got.header("access-control-allow-credentials"), None, "h2={h2}");
        assert_eq!(got.header("vary"), None, "h2={h2}");
    }
}

/// A page served on one origin (a `respond` route of listener `page`) `fetch`es the API on
/// another (listener `web`): Chromium sends the preflight, the router answers it, and the PUT
/// that follows reaches the member; a DELETE's preflight is refused, so the browser never
/// sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_on_another_origin_passes_the_preflight_and_reads_the_exposed_fields() {
    let Some(tools) = tools_or_skip("cors browser test") else { return };
    let m = Recorder::spawn("m1");
    let page_port = free_port();
    let page = format!(
        r#"
[[listener]]
name = "page"
listen = "127.0.0.1:{page_port}"

[[route]]
listener = "page"
filters = [ {{ respond = {{ headers = {{ "content-type" = "text/html" }}, body = "<!doctype html><title>cors page</title>" }} }} ]
"#
    );
    let origins = format!(r#""http://127.0.0.1:{page_port}""#);
    let r = router(&config(&m, &page, &origins)).await;
    let dir = TempDir::new("cors-browser");
    let env = [
        ("PAGE_URL", format!("http://127.0.0.1:{page_port}/")),
        ("API_URL", format!("http://127.0.0.1:{}/api/items", r.addr("web").port())),
    ];
    let script = repo().join("crates/rondo/tests/ui/cors.mjs");
    let run = tokio::task::spawn_blocking(move || {
        run_node(&tools, &script, &env, &dir.0, Duration::from_secs(90))
    });
    if let Err(why) = run.await.unwrap() {
        panic!("{why}");
    }
    let seen = m.seen();
    let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(methods, ["PUT"], "only the allowed request reached the member");
    assert_eq!(seen[0].body, br#"{"n":1}"#);
}

/// A 204 of the router's own (a preflight's, or a `respond` with status 204 even when given a
/// body) carries no length and no body on HTTP/1.1: the next request on the connection is
/// answered on its own, not read after stray body bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_204_answer_has_no_body_and_the_connection_carries_on() {
    use super::support::{raw_connect, raw_send, read_response};
    let m = Recorder::spawn("m1");
    let extra = r#"
[[route]]
listener = "web"
match = { path_prefix = "/gone" }
filters = [ { respond = { status = 204, body = "stray bytes" } } ]
"#;
    let r = router(&config(&m, extra, ORIGINS)).await;
    let mut conn = raw_connect(r.addr("web")).await;
    let pipelined = "GET /gone HTTP/1.1\r\nhost: a\r\n\r\n\
        OPTIONS /api HTTP/1.1\r\nhost: a\r\norigin: https://app.example.com\r\n\
        access-control-request-method: GET\r\n\r\n\
        GET /api HTTP/1.1\r\nhost: a\r\n\r\n";
    raw_send(&mut conn, pipelined.as_bytes()).await;
    let first = read_response(&mut conn).await.expect("the 204");
    assert_eq!((first.status, first.header("content-length")), (204, None));
    let second = read_response(&mut conn).await.expect("the preflight's 204");
    assert_eq!(second.status, 204);
    assert_eq!(second.header("access-control-allow-origin"), Some("https://app.example.com"));
    let third = read_response(&mut conn).await.expect("the member's answer");
    assert_eq!(third.status, 200);
    assert!(third.text().starts_with("m1 "), "{}", third.text());
}
