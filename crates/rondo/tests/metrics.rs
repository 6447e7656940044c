//! `/metrics` on the admin API: an in-process router and admin API, some requests (answered,
//! answered 500, retried after a member that refuses connections), then a scrape parsed line by
//! line; and a real `rondo serve` answering a flood of 502s, a 404, a 408, a 431, a 400 and a refusal
//! over its connection limit, all of them seen in its `/metrics` with bytes and process figures.

mod common;
#[path = "router/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rondo_config::{AdminSpec, AdminToken};
use rondo_core::Actor;
use rondo_runtime::{Reloader, clock};
use support::*;

const TOKEN: &str = "metrics-token";

/// GET `url` with `token`: status, content type and body.
async fn scrape(url: &str, token: Option<&str>) -> (StatusCode, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .expect("admin API answers");
    let status = resp.status();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, ctype, String::from_utf8_lossy(&body).into_owned())
}

/// One sample line: name, labels, value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// The samples of a text exposition (label values here contain no `,`, `"` or spaces).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("`series value`");
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {l}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect("closing brace");
                    let labels = inner
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').expect("label=value");
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name, labels)
                }
            };
            Sample { name: name.to_owned(), labels, value }
        })
        .collect()
}

/// The sum of the samples called `name` that carry every label of `labels`.
fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    matching(samples, name, labels).map(|s| s.value).sum()
}

/// How many samples called `name` carry every label of `labels`.
fn count(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> usize {
    matching(samples, name, labels).count()
}

fn matching<'a>(
    samples: &'a [Sample],
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = &'a Sample> {
    samples.iter().filter(move |s| {
        s.name == name
            && labels.iter().all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_responses_retries_and_state() {
    let ms = members(2, Duration::ZERO).await;
    let dead = member_entry("dead", dead_addr(), "");
    let cluster = format!(
        "algorithm = \"round-robin\"\nretry = {{ attempts = 3 }}\n\
         outlier = {{ consecutive_failures = 0 }}\n{}",
        members_of([entry(&ms[0], ""), entry(&ms[1], ""), dead])
    );
    let config_text = one_cluster(&cluster);
    let dir = std::env::temp_dir().join(format!("rondo-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rondo.toml");
    std::fs::write(&path, &config_text).unwrap();
    let config = rondo_config::load_file(&path, 1).expect("valid config");

    let r = router(&config_text).await;
    let spec = AdminSpec {
        listen: any_port(),
        token: Some(AdminToken::Inline(TOKEN.into())),
        tls: None,
        probes: Default::default(),
    };
    let admin = rondo_admin::start(&spec, rondo_admin::AdminParts::of(&r.live))
        .await
        .expect("admin starts");
    let url = format!("http://{}/metrics", admin.addr);

    // Without the token: 401, like every other call.
    let (status, _, _) = scrape(&url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = scrape(&url, Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // 9 answered requests and 3 answered 500; round robin sends about a third of the tries to
    // the dead member, whose refusal is retried on the next member.
    let client = support::client();
    for _ in 0..9 {
        let reply = get(&client, &r.url("web", "/")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }
    for _ in 0..3 {
        let reply = get(&client, &r.url("web", "/status/500")).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", reply.body);
    }

    // A rejected and an accepted reload of the config file.
    let reloader = Arc::new(Reloader::new(
        &path,
        r.live.views.clone(),
        r.live.registrations.clone(),
        r.live.metrics.clone(),
        r.live.defaults.clone(),
        &config,
    ));
    std::fs::write(&path, "[cluster.c]\nalgoritm = \"x\"\n").unwrap();
    assert!(reloader.reload("test").is_err());
    std::fs::write(&path, &config_text).unwrap();
    assert_eq!(reloader.reload("test").expect("valid"), 2);
    let _ = std::fs::remove_dir_all(&dir);

    // The dead member found down (as a health check would).
    let rt = r.live.load().clusters["c"].clone();
    let dead_idx = rt.spec.members.iter().position(|m| m.name == "dead").unwrap();
    rt.with(|b| b.set_health(dead_idx, false, Actor::HealthCheck, clock::now()));

    // In-flight counts end when the last body frame passes: wait for them to settle.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (ctype, text) = loop {
        let (status, ctype, text) = scrape(&url, Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let s = parse(&text);
        if sum(&s, "rondo_member_in_flight", &[]) == 0.0 || Instant::now() > deadline {
            break (ctype, text);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let s = parse(&text);
    let main = ("route", "main");
    let c = ("cluster", "c");

    // Responses by status class and member.
    let req = "rondo_requests_total";
    assert_eq!(sum(&s, req, &[main, c, ("class", "2xx")]), 9.0, "{text}");
    assert_eq!(sum(&s, req, &[main, c, ("class", "5xx")]), 3.0, "{text}");
    assert_eq!(sum(&s, req, &[main, c]), 12.0, "{text}");
    let m1 = sum(&s, req, &[("member", "m1")]);
    let m2 = sum(&s, req, &[("member", "m2")]);
    assert_eq!(m1 + m2, 12.0, "{text}");
    assert!(m1 >= 4.0 && m2 >= 4.0, "both members answered: {text}");
    assert_eq!(count(&s, req, &[("member", "dead")]), 0, "the dead member answered nothing");

    // Latency histograms: one observation per response, per member.
    let hist = "rondo_request_duration_seconds";
    assert_eq!(sum(&s, &format!("{hist}_count"), &[main, c]), 12.0, "{text}");
    assert_eq!(sum(&s, &format!("{hist}_count"), &[("member", "m1")]), m1, "{text}");
    assert_eq!(sum(&s, &format!("{hist}_bucket"), &[("member", "m2"), ("le", "+Inf")]), m2);
    assert!(sum(&s, &format!("{hist}_sum"), &[main]) > 0.0, "{text}");

    // Retries after the dead member's refusals; no budget was exhausted.
    assert!(sum(&s, "rondo_retries_total", &[main, c]) >= 3.0, "{text}");
    assert_eq!(sum(&s, "rondo_retry_budget_exhausted_total", &[]), 0.0, "{text}");

    // State at rest: nothing in flight, not ejected; the dead member is down.
    for (m, healthy) in [("m1", 1.0), ("m2", 1.0), ("dead", 0.0)] {
        let l = [c, ("member", m)];
        assert_eq!(count(&s, "rondo_member_in_flight", &l), 1, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_in_flight", &l), 0.0, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_sessions", &l), 0.0, "{m}: {text}");
        assert_eq!(count(&s, "rondo_member_healthy", &l), 1, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_healthy", &l), healthy, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_ejected", &l), 0.0, "{m}: {text}");
    }
    assert_eq!(count(&s, "rondo_member_agent_heartbeat_age_seconds", &[]), 0, "no agent");

    // The view and the reloads.
    assert_eq!(sum(&s, "rondo_view_id", &[]), 2.0, "{text}");
    let reloads = "rondo_config_reloads_total";
    assert_eq!(sum(&s, reloads, &[("result", "accepted")]), 1.0, "{text}");
    assert_eq!(sum(&s, reloads, &[("result", "rejected")]), 1.0, "{text}");
    assert_eq!(sum(&s, "rondo_ejections_total", &[c]), 0.0, "{text}");
    assert_eq!(count(&s, "rondo_ejections_total", &[c]), 1, "{text}");
    assert_eq!(count(&s, "rondo_ejection_returns_total", &[c]), 1, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_router_exposes_view_and_reload_counters_at_zero() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&one_cluster(&member_list(&ms))).await;
    let spec = AdminSpec {
        listen: any_port(),
        token: Some(AdminToken::Inline(TOKEN.into())),
        tls: None,
        probes: Default::default(),
    };
    let admin = rondo_admin::start(&spec, rondo_admin::AdminParts::of(&r.live))
        .await
        .expect("admin starts");
    let (status, _, text) = scrape(&format!("http://{}/metrics", admin.addr), Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let s = parse(&text);
    assert_eq!(sum(&s, "rondo_view_id", &[]), 1.0, "{text}");
    assert_eq!(count(&s, "rondo_config_reloads_total", &[]), 2, "{text}");
    assert_eq!(sum(&s, "rondo_config_reloads_total", &[]), 0.0, "{text}");
    assert_eq!(count(&s, "rondo_requests_total", &[]), 0, "{text}");
    assert_eq!(sum(&s, "rondo_member_healthy", &[("member", "m1")]), 1.0, "{text}");
}

/// `bytes` sent on a fresh connection to `addr`, and everything answered until it closes.
fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(bytes).expect("send");
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn a_real_router_counts_its_own_answers_connections_bytes_and_process_figures() {
    use common::{Proc, TempDir, free_port, request, start_member};
    let dir = TempDir::new("metrics");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (admin, web, tiny, dead) = (free_port(), free_port(), free_port(), free_port());
    let raw = free_port();
    let path = dir.0.join("rondo.toml");
    let text = format!(
        r#"
[admin]
listen = "127.0.0.1:{admin}"
token = "{TOKEN}"

[[listener]]
name = "web"
listen = "127.0.0.1:{web}"
header_read_timeout_ms = 300

[[listener]]
name = "tiny"
listen = "127.0.0.1:{tiny}"
max_connections = 1

[[listener]]
name = "raw"
listen = "127.0.0.1:{raw}"
protocol = "tcp"

[[route]]
name = "spliced"
listener = "raw"
cluster = "ct"

[cluster.ct]
upstream_protocol = "tcp"
members = [{{ name = "m1", address = "{a1}" }}]

[[route]]
name = "broken"
listener = "web"
match = {{ path_prefix = "/broken" }}
cluster = "dead"

[[route]]
name = "main"
listener = "web"
match = {{ path_prefix = "/echo" }}
cluster = "c"

[[route]]
name = "small"
listener = "tiny"
cluster = "c"

[cluster.c]
members = [{{ name = "m1", address = "{a1}" }}]

[cluster.dead]
members = [{{ name = "d1", address = "127.0.0.1:{dead}" }}]
"#
    );
    std::fs::write(&path, text).expect("write config");
    let mut router =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    router.line_with("admin API on", Duration::from_secs(10));
    let addr = |port: u16| -> std::net::SocketAddr { format!("127.0.0.1:{port}").parse().unwrap() };
    let started = std::time::SystemTime::now();

    // A flood of 502s (the only member refuses), a 404, a body echoed.
    for _ in 0..40 {
        assert_eq!(request(addr(web), "GET", "/broken", b"").0, 502);
    }
    assert_eq!(request(addr(web), "GET", "/nowhere", b"").0, 404);
    let (status, echoed) = request(addr(web), "POST", "/echo", &[b'x'; 1000]);
    assert_eq!((status, echoed.len()), (200, 1000));

    // Through the TCP listener: bytes both ways, counted when the connection ends.
    let head = b"GET /spliced HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let spliced_answer = exchange(addr(raw), head);
    assert!(spliced_answer.starts_with("HTTP/1.1 200"), "{spliced_answer}");

    // A request head that stalls: 408 after the header read timeout.
    let answer = exchange(addr(web), b"GET /echo HTTP/1.1\r\nHost: x\r\n");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // A header over max_header_bytes: hyper answers 431 itself.
    let big = format!("GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(100_000));
    let answer = exchange(addr(web), big.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    // A malformed request line: hyper answers 400 itself.
    let answer = exchange(addr(web), b"GET /a b c HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // `tiny` takes one connection: the second is refused with a 503.
    let held = std::net::TcpStream::connect(addr(tiny)).expect("connect");
    std::thread::sleep(Duration::from_millis(300));
    let answer = exchange(addr(tiny), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");

    let scrape = || {
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        );
        let answer = exchange(addr(admin), req.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
    };
    let router_made = "rondo_router_responses_total";
    let wanted = |s: &[Sample]| {
        sum(s, router_made, &[("status", "431")]) == 1.0
            && sum(s, router_made, &[("status", "400")]) == 1.0
            && sum(s, "rondo_bytes_out_total", &[("route", "main")]) == 1000.0
            && sum(s, router_made, &[("status", "503")]) == 1.0
            && sum(s, "rondo_bytes_out_total", &[("route", "spliced")]) > 0.0
    };
    // Some counts land just after the client has its answer: scrape until they are in.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape();
        if wanted(&parse(&text)) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let s = parse(&text);
    let web_l = ("listener", "web");
    let tiny_l = ("listener", "tiny");

    // Every answer the router made itself, by listener, route, cluster and status.
    let broken = [web_l, ("route", "broken"), ("cluster", "dead"), ("status", "502")];
    assert_eq!(sum(&s, router_made, &broken), 40.0, "{text}");
    assert_eq!(sum(&s, router_made, &[web_l, ("route", ""), ("status", "404")]), 1.0, "{text}");
    assert_eq!(sum(&s, router_made, &[web_l, ("status", "408")]), 1.0, "{text}");
    assert_eq!(sum(&s, router_made, &[web_l, ("status", "431")]), 1.0, "{text}");
    assert_eq!(sum(&s, router_made, &[web_l, ("status", "400")]), 1.0, "{text}");
    assert_eq!(sum(&s, router_made, &[tiny_l, ("status", "503")]), 1.0, "{text}");
    assert_eq!(sum(&s, router_made, &[]), 45.0, "nothing else: {text}");
    // The member's own answers are not the router's: the 200 is in rondo_requests_total.
    assert_eq!(sum(&s, "rondo_requests_total", &[("route", "main"), ("class", "2xx")]), 1.0);

    // Connections.
    assert_eq!(sum(&s, "rondo_connections_refused_total", &[tiny_l]), 1.0, "{text}");
    assert_eq!(sum(&s, "rondo_connections_refused_total", &[web_l]), 0.0, "{text}");
    assert_eq!(sum(&s, "rondo_connections_active", &[tiny_l]), 1.0, "the held one: {text}");
    assert_eq!(sum(&s, "rondo_connections_accepted_total", &[web_l]), 45.0, "{text}");
    let closed = "rondo_connections_closed_total";
    assert_eq!(sum(&s, closed, &[web_l, ("reason", "header_timeout")]), 1.0, "{text}");

    // Body bytes by route and cluster.
    let main = [("route", "main"), ("cluster", "c")];
    assert_eq!(sum(&s, "rondo_bytes_in_total", &main), 1000.0, "{text}");
    assert_eq!(sum(&s, "rondo_bytes_out_total", &main), 1000.0, "{text}");
    let spliced = [("route", "spliced"), ("cluster", "ct")];
    assert_eq!(sum(&s, "rondo_bytes_in_total", &spliced), head.len() as f64, "{text}");
    assert_eq!(sum(&s, "rondo_bytes_out_total", &spliced), spliced_answer.len() as f64, "{text}");

    // The process's figures, plausible.
    let one = |name: &str| {
        assert_eq!(count(&s, name, &[]), 1, "{name} once: {text}");
        sum(&s, name, &[])
    };
    assert!(one("process_resident_memory_bytes") > 1_000_000.0, "{text}");
    assert!(one("process_virtual_memory_bytes") >= one("process_resident_memory_bytes"));
    let fds = one("process_open_fds");
    assert!(fds >= 5.0 && fds <= one("process_max_fds"), "{text}");
    // Ticks of 10 ms: a short-lived router may show 0.
    let cpu = one("process_cpu_seconds_total");
    assert!((0.0..60.0).contains(&cpu), "{text}");
    assert!(one("process_threads") >= 1.0, "{text}");
    let since_epoch = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64()
    };
    let start = one("process_start_time_seconds");
    assert!(
        start <= since_epoch(started) + 1.0 && start >= since_epoch(started) - 60.0,
        "started {start}, test at {}",
        since_epoch(started)
    );
    drop(held);
}
