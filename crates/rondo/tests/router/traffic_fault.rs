//! The `fault` filter (docs/router.md "Traffic filters"): with 100 % abort every request gets
//! the status and no member sees it; with `header`, only requests carrying the header are hit,
//! and its value may name the fault; a delay holds the request at least as long. Through curl
//! on HTTP/1.1 (the own path) and h2c (hyper's path), with the injections counted.

use std::time::{Duration, Instant};

use super::recorder::Recorder;
use super::support::{TestRouter, router};
use super::traffic::{Got, curl};

/// `rondo_filter_faults_total` of `route` and `kind`.
fn faults(r: &TestRouter, route: &str, kind: &str) -> f64 {
    let text = r.live.metrics.render(&r.live.load());
    let line = format!("rondo_filter_faults_total{{route=\"{route}\",kind=\"{kind}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0.0, |v| v.trim().parse().unwrap())
}

/// A route `name` on `path_prefix`, to the recorder's cluster, with `filters`.
fn route(name: &str, prefix: &str, filters: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nlistener = \"web\"\nmatch = {{ path_prefix = \"{prefix}\" }}\n\
         cluster = \"c\"\nfilters = [ {filters} ]\n\n"
    )
}

async fn start(m: &Recorder, routes: &str) -> (TestRouter, u16) {
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n{routes}\
         [cluster.c]\nmembers = [ {} ]\n",
        m.entry()
    );
    let r = router(&config).await;
    let port = r.addr("web").port();
    (r, port)
}

/// curl GET of `path` (HTTP/1.1 or h2c) with header lines, and how long it took.
async fn get(h2: bool, port: u16, path: &str, headers: &[&'static str]) -> (Got, Duration) {
    let url = format!("http://127.0.0.1:{port}{path}");
    let headers = headers.to_vec();
    let started = Instant::now();
    let got = tokio::task::spawn_blocking(move || curl(h2, &url, &headers)).await.unwrap();
    (got, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_abort_answers_every_request_without_reaching_the_member() {
    let m = Recorder::spawn("m1");
    let routes =
        route("down", "/down/", "{ fault = { abort_status = 503, abort_percent = 100.0 } }")
            + &route("up", "/", "{ fault = { abort_status = 503, abort_percent = 0.0 } }");
    let (r, port) = start(&m, &routes).await;
    for h2 in [false, true] {
        for _ in 0..10 {
            let (got, _) = get(h2, port, "/down/x", &[]).await;
            assert_eq!(got.status, 503, "h2={h2}");
            assert_eq!(got.body, "fault filter abort\n", "h2={h2}");
        }
        // 0 %: never.
        let (got, _) = get(h2, port, "/other", &[]).await;
        assert_eq!(got.status, 200, "h2={h2}: {}", got.body);
    }
    let seen: Vec<String> = m.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(seen, ["/other", "/other"], "only the requests of the 0 % route reached the member");
    assert_eq!(faults(&r, "down", "abort"), 20.0);
    assert_eq!(faults(&r, "up", "abort"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_header_only_flagged_requests_are_hit_and_the_value_may_name_the_fault() {
    let m = Recorder::spawn("m1");
    let routes =
        route("flag", "/flag/", "{ fault = { abort_status = 503, header = \"x-rondo-fault\" } }")
            + &route("free", "/", "{ fault = { header = \"x-rondo-fault\" } }");
    let (r, port) = start(&m, &routes).await;
    for h2 in [false, true] {
        let before = m.seen().len();
        // Unflagged: untouched.
        let (got, _) = get(h2, port, "/flag/a", &[]).await;
        assert_eq!(got.status, 200, "h2={h2}: {}", got.body);
        // Flagged: the configured abort.
        let (got, _) = get(h2, port, "/flag/a", &["x-rondo-fault: 1"]).await;
        assert_eq!((got.status, got.body.as_str()), (503, "fault filter abort\n"), "h2={h2}");
        // The value names another status.
        let (got, _) = get(h2, port, "/flag/a", &["x-rondo-fault: abort=429"]).await;
        assert_eq!(got.status, 429, "h2={h2}");
        // A route whose fault only the header names: nothing without a fault in the value,
        // the named delay with one.
        let (got, _) = get(h2, port, "/free", &["x-rondo-fault: nothing"]).await;
        assert_eq!(got.status, 200, "h2={h2}");
        let (got, took) = get(h2, port, "/free", &["x-rondo-fault: delay=300"]).await;
        assert_eq!(got.status, 200, "h2={h2}");
        assert!(took >= Duration::from_millis(300), "h2={h2}: answered after {took:?}");
        let (got, _) = get(h2, port, "/free", &["x-rondo-fault: delay=1, abort=418"]).await;
        assert_eq!(got.status, 418, "h2={h2}");
        assert_eq!(m.seen().len() - before, 3, "h2={h2}: the aborted requests never arrived");
    }
    assert_eq!(faults(&r, "flag", "abort"), 4.0);
    assert_eq!(faults(&r, "free", "delay"), 4.0);
    assert_eq!(faults(&r, "free", "abort"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_holds_the_request_before_the_member_gets_it() {
    let m = Recorder::spawn("m1");
    let routes = route("slow", "/", "{ fault = { delay_ms = 400 } }");
    let (r, port) = start(&m, &routes).await;
    for h2 in [false, true] {
        let (got, took) = get(h2, port, "/x", &[]).await;
        assert_eq!(got.status, 200, "h2={h2}: {}", got.body);
        assert!(took >= Duration::from_millis(400), "h2={h2}: answered after {took:?}");
    }
    assert_eq!(m.seen().len(), 2);
    assert_eq!(faults(&r, "slow", "delay"), 2.0);
}
