//! Route filters (`filters`) through real clients, on the own HTTP/1.1 path and on HTTP/2
//! (h2c, hyper's path) alike: curl sends, a recording member says exactly what it got, and the
//! client's view of the response is curl's. Header edits with variables, request ids and trace
//! context, rewrites, redirects, direct answers, and a listener's filters before a route's.

use std::net::SocketAddr;
use std::process::Command;

use super::recorder::Recorder;
use super::support::{TestRouter, router};

/// What curl got: the status, the response's header fields (lower-case names) and the body.
pub(crate) struct Got {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Got {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// curl `url` (HTTP/1.1, or h2c with prior knowledge) with extra `-H` headers; never follows
/// redirects.
pub(crate) fn curl(h2: bool, url: &str, headers: &[&str]) -> Got {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-D", "-", "-o", "-"]);
    cmd.arg(if h2 { "--http2-prior-knowledge" } else { "--http1.1" });
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).output().expect("curl runs");
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    parse(&out.stdout)
}

/// curl's `-D - -o -` output: the head, then the body.
pub(super) fn parse(stdout: &[u8]) -> Got {
    let text = String::from_utf8_lossy(stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok());
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Got { status: status.expect("a status"), headers, body: body.to_owned() }
}

async fn start(config: String) -> (TestRouter, SocketAddr) {
    let r = router(&config).await;
    let addr = r.addr("web");
    (r, addr)
}

fn cluster(m: &Recorder) -> String {
    format!("[cluster.c]\nmembers = [ {{ name = \"{}\", address = \"{}\" }} ]\n", m.name, m.addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_member_sees_the_edited_request_and_the_client_the_edited_response() {
    let m = Recorder::spawn("m1");
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
cluster = "c"
filters = [
  {{ request_id = {{}} }},
  {{ headers = {{ request = {{ set = {{ "x-env" = "prod", "x-from" = "${{client_ip}} via ${{host}}${{path}}" }}, remove = ["x-debug"], add = {{ "x-tag" = "id=${{request_id}}" }} }},
                 response = {{ add = {{ "strict-transport-security" = "max-age=31536000" }}, set = {{ "x-served-by" = "${{member}}" }}, remove = ["x-member"] }} }} }},
]

{}"#,
        cluster(&m)
    );
    let (_r, addr) = start(config).await;
    for h2 in [false, true] {
        let url = format!("http://localhost:{}/a/b?q=1", addr.port());
        let sent = [
            "x-debug: secret",
            "x-env: dev",
            "x-request-id: client-id-1",
            "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate: vendor=1",
        ];
        let got = tokio::task::spawn_blocking(move || curl(h2, &url, &sent)).await.unwrap();
        assert_eq!(got.status, 200, "h2={h2} {}", got.body);
        let seen = m.seen().pop().expect("the member got the request");
        let h = |n: &str| seen.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(h("x-debug"), None, "h2={h2}: removed");
        assert_eq!(seen.headers.get_all("x-env").iter().count(), 1, "h2={h2}: set replaces");
        assert_eq!(h("x-env").as_deref(), Some("prod"));
        assert_eq!(h("x-from").as_deref(), Some("127.0.0.1 via localhost/a/b"), "h2={h2}");
        assert_eq!(h("x-tag").as_deref(), Some("id=client-id-1"), "h2={h2}");
        assert_eq!(h("x-request-id").as_deref(), Some("client-id-1"), "h2={h2}: id kept");
        let tp = h("traceparent").expect("traceparent");
        assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "h2={h2}: {tp}");
        assert!(!tp.contains("00f067aa0ba902b7"), "h2={h2}: the try has a span of its own");
        assert_eq!(h("tracestate").as_deref(), Some("vendor=1"), "h2={h2}: passed through");
        // The client's view.
        assert_eq!(got.header("x-request-id"), Some("client-id-1"), "h2={h2}");
        assert_eq!(got.header("strict-transport-security"), Some("max-age=31536000"));
        assert_eq!(got.header("x-served-by"), Some("m1"), "h2={h2}");
        assert_eq!(got.header("x-member"), None, "h2={h2}: removed from the response");
    }
    // Without a client id, one is made, and member and client see the same.
    let url = format!("http://127.0.0.1:{}/", addr.port());
    let got = tokio::task::spawn_blocking(move || curl(false, &url, &[])).await.unwrap();
    let seen = m.seen().pop().expect("request");
    let made = got.header("x-request-id").expect("an id").to_owned();
    assert_eq!(made.len(), 36, "{made}");
    assert_eq!(seen.headers.get("x-request-id").unwrap(), made.as_str());
    let tp = seen.headers.get("traceparent").expect("a new trace").to_str().unwrap().to_owned();
    assert!(tp.starts_with("00-") && tp.len() == 55, "{tp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_change_what_the_member_sees_and_keep_the_query() {
    let m = Recorder::spawn("m1");
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
match = {{ path_prefix = "/api/" }}
cluster = "c"
filters = [ {{ rewrite = {{ path_prefix = "/v2/", host = "backend.internal" }} }} ]

[[route]]
listener = "web"
match = {{ path_prefix = "/users/" }}
cluster = "c"
filters = [ {{ rewrite = {{ path_regex = "^/users/([0-9]+)/profile$", to = "/profiles/$1" }} }} ]

[[route]]
listener = "web"
match = {{ path_prefix = "/dots/" }}
cluster = "c"
filters = [ {{ rewrite = {{ path_prefix = "/safe/../admin/" }} }} ]

{}"#,
        cluster(&m)
    );
    let (_r, addr) = start(config).await;
    for h2 in [false, true] {
        let port = addr.port();
        let get = move |path: &'static str| {
            let url = format!("http://localhost:{port}{path}");
            tokio::task::spawn_blocking(move || curl(h2, &url, &[]))
        };
        assert_eq!(get("/api/items?x=1&y=2").await.unwrap().status, 200);
        let seen = m.seen().pop().unwrap();
        assert_eq!(seen.target, "/v2/items?x=1&y=2", "h2={h2}");
        assert_eq!(seen.headers.get("host").unwrap(), "backend.internal", "h2={h2}");
        // Members still learn which host the client asked for.
        assert_eq!(seen.headers.get("x-forwarded-host").unwrap(), "localhost", "h2={h2}");
        assert_eq!(get("/users/42/profile").await.unwrap().status, 200);
        assert_eq!(m.seen().pop().unwrap().target, "/profiles/42", "h2={h2}");
        // No match of the expression: the path stays.
        assert_eq!(get("/users/x/other").await.unwrap().status, 200);
        assert_eq!(m.seen().pop().unwrap().target, "/users/x/other", "h2={h2}");
        // A rewritten path is normalized as a client's is.
        assert_eq!(get("/dots/file").await.unwrap().status, 200);
        assert_eq!(m.seen().pop().unwrap().target, "/admin/file", "h2={h2}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_and_direct_answers_never_reach_a_member() {
    let m = Recorder::spawn("m1");
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"
filters = [ {{ headers = {{ response = {{ add = {{ "x-listener" = "web" }} }} }} }} ]

[[route]]
listener = "web"
match = {{ path = "/healthz" }}
filters = [ {{ respond = {{ status = 200, body = "ok\n", headers = {{ "content-type" = "text/plain" }} }} }} ]

[[route]]
listener = "web"
match = {{ path_prefix = "/old/" }}
filters = [ {{ redirect = {{ path = "/new/", status = 308 }} }} ]

[[route]]
listener = "web"
match = {{ path_prefix = "/secure/" }}
filters = [ {{ redirect = {{ scheme = "https" }} }} ]

[[route]]
listener = "web"
match = {{ path_prefix = "/elsewhere" }}
filters = [ {{ redirect = {{ host = "example.org", port = 8443, scheme = "https", keep_query = false, status = 302 }} }} ]

[[route]]
listener = "web"
cluster = "c"

{}"#,
        cluster(&m)
    );
    let (r, addr) = start(config).await;
    let port = addr.port();
    for h2 in [false, true] {
        let before = m.seen().len();
        let get = move |path: &'static str| {
            let url = format!("http://localhost:{port}{path}");
            tokio::task::spawn_blocking(move || curl(h2, &url, &[]))
        };
        let got = get("/healthz").await.unwrap();
        assert_eq!((got.status, got.body.as_str()), (200, "ok\n"), "h2={h2}");
        assert_eq!(got.header("content-type"), Some("text/plain"));
        assert_eq!(got.header("x-listener"), Some("web"), "h2={h2}: the listener's filter ran");
        let got = get("/old/page?a=1").await.unwrap();
        assert_eq!(got.status, 308, "h2={h2}");
        let want = format!("http://localhost:{port}/new/?a=1");
        assert_eq!(got.header("location"), Some(want.as_str()), "h2={h2}");
        let got = get("/secure/x?k=v").await.unwrap();
        assert_eq!(got.status, 301, "h2={h2}");
        // The scheme changed: the plain port is not the https one.
        assert_eq!(got.header("location"), Some("https://localhost/secure/x?k=v"), "h2={h2}");
        let got = get("/elsewhere?drop=me").await.unwrap();
        assert_eq!(got.status, 302);
        assert_eq!(got.header("location"), Some("https://example.org:8443/elsewhere"));
        assert_eq!(m.seen().len(), before, "h2={h2}: a member was asked: {:?}", m.seen());
        // Other requests still reach the member, with the listener's edits.
        let got = get("/other").await.unwrap();
        assert_eq!((got.status, got.header("x-listener")), (200, Some("web")), "h2={h2}");
        assert_eq!(m.seen().len(), before + 1);
    }
    // The filters' answers count as the router's own responses, by status.
    let text = r.live.metrics.render(&r.live.load());
    let line = text
        .lines()
        .find(|l| l.starts_with("rondo_router_responses_total") && l.contains("status=\"308\""))
        .unwrap_or_else(|| panic!("no 308 counted:\n{text}"));
    assert!(line.ends_with(" 2"), "one per protocol: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_id_is_in_the_access_log_line() {
    let m = Recorder::spawn("m1");
    let dir = std::env::temp_dir().join(format!("rondo-traffic-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"
access_log = {{ path = "{}" }}
filters = [ {{ request_id = {{}} }} ]

[[route]]
listener = "web"
match = {{ path = "/answered" }}
filters = [ {{ respond = {{ status = 204 }} }} ]

[[route]]
listener = "web"
cluster = "c"

{}"#,
        log.display(),
        cluster(&m)
    );
    let (_r, addr) = start(config).await;
    for (h2, path, id) in
        [(false, "/x", "id-h1"), (true, "/x", "id-h2"), (false, "/answered", "id-204")]
    {
        let url = format!("http://127.0.0.1:{}{path}", addr.port());
        let header = format!("x-request-id: {id}");
        tokio::task::spawn_blocking(move || curl(h2, &url, &[&header])).await.unwrap();
    }
    let start = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let found = ["id-h1", "id-h2", "id-204"]
            .iter()
            .all(|id| text.lines().any(|l| l.contains(&format!(" request_id={id}"))));
        if found {
            break;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "log lines:\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The router's own error answers carry the response edits of the filters that ran (as a
/// filter's answer does): a 502 from a dead member and a 401 from `auth` have the request id
/// and the listener's HSTS, on both paths. Before, they carried none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_own_error_answers_carry_the_response_edits() {
    let dead = super::support::dead_addr();
    let dir = std::env::temp_dir().join(format!("rondo-traffic-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys.json");
    std::fs::write(
        &keys,
        r#"{"keys": [{"kty": "oct", "kid": "k", "k": "dGhlIHNlY3JldCBvZiB0aGUgZXJyb3ItZWRpdHMgdGVzdA"}]}"#,
    )
    .unwrap();
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"
filters = [
  {{ request_id = {{}} }},
  {{ headers = {{ response = {{ add = {{ "strict-transport-security" = "max-age=31536000" }} }} }} }},
]

[[route]]
listener = "web"
match = {{ path_prefix = "/private/" }}
cluster = "c"
auth = {{ issuer = "https://issuer.test", audience = "rondo", keys = "{}" }}

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [ {{ name = "gone", address = "{dead}" }} ]
"#,
        keys.display()
    );
    let (_r, addr) = start(config).await;
    for h2 in [false, true] {
        for (path, status) in [("/x", 502), ("/private/x", 401)] {
            let url = format!("http://127.0.0.1:{}{path}", addr.port());
            let got = tokio::task::spawn_blocking(move || curl(h2, &url, &["x-request-id: err-1"]))
                .await
                .unwrap();
            assert_eq!(got.status, status, "h2={h2} {path}: {}", got.body);
            assert_eq!(got.header("x-request-id"), Some("err-1"), "h2={h2} {path}");
            let hsts = got.header("strict-transport-security");
            assert_eq!(hsts, Some("max-age=31536000"), "h2={h2} {path}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
