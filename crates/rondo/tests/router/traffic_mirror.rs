//! The `mirror` filter (docs/router.md "Traffic filters"): at 100 % every request is copied to
//! the shadow cluster while the client gets the primary's answer; at a lower share about that
//! share is copied; a shadow that hangs, is down or has its queue full never delays or fails
//! the client; a body too large to copy skips the copy, not the request. Through curl on
//! HTTP/1.1 (the route takes hyper's path either way) and h2c.

use std::process::Command;
use std::time::{Duration, Instant};

use super::recorder::Recorder;
use super::support::{TestRouter, router};
use super::traffic_split::send_many;

/// `rondo_multicast_copies_total` of route `main`, branch `shadow` and `outcome`.
fn copies(r: &TestRouter, outcome: &str) -> f64 {
    let text = r.live.metrics.render(&r.live.load());
    let line = format!(
        "rondo_multicast_copies_total{{route=\"main\",branch=\"shadow\",outcome=\"{outcome}\"}} "
    );
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Waits (5 s at most) until the shadow has seen `n` requests or more.
async fn wait_seen(shadow: &Recorder, n: usize) {
    let start = Instant::now();
    while shadow.seen().len() < n {
        assert!(start.elapsed() < Duration::from_secs(5), "shadow saw {}", shadow.seen().len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (5 s at most) until `copies(outcome)` reaches `n`.
async fn wait_copies(r: &TestRouter, outcome: &str, n: f64) {
    let start = Instant::now();
    while copies(r, outcome) < n {
        assert!(start.elapsed() < Duration::from_secs(5), "{outcome}: {}", copies(r, outcome));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A router whose route `main` goes to `primary` and mirrors to `shadow` with `mirror`'s
/// options (`cluster` added), and `route` extra keys.
async fn start(
    primary: &Recorder,
    shadow: &Recorder,
    mirror: &str,
    route: &str,
) -> (TestRouter, u16) {
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"app\"\n{route}\n\
         filters = [ {{ mirror = {{ cluster = \"shadow\"{mirror} }} }} ]\n\n\
         [cluster.app]\nmembers = [ {} ]\n\n[cluster.shadow]\nmembers = [ {} ]\n",
        primary.entry(),
        shadow.entry()
    );
    let r = router(&config).await;
    let port = r.addr("web").port();
    (r, port)
}

/// curl POSTs `body` with request id `id` (HTTP/1.1 or h2c): the status and the body.
async fn post(h2: bool, port: u16, id: &str, body: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", "--data-binary", body]);
    cmd.arg(if h2 { "--http2-prior-knowledge" } else { "--http1.1" });
    cmd.args(["-H", &format!("x-request-id: {id}")]);
    cmd.arg(format!("http://127.0.0.1:{port}/orders"));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "curl failed: {}", err.lines().next().unwrap_or(""));
    let (body, status) = text.rsplit_once('\n').expect("a status line");
    (status.parse().expect("a status"), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_mirrored_and_the_client_gets_the_primarys_answer() {
    let (primary, shadow) = (Recorder::spawn("primary"), Recorder::spawn("shadow"));
    let (r, port) = start(&primary, &shadow, ", percent = 100.0", "").await;
    let mut ids = Vec::new();
    for h2 in [false, true] {
        for i in 0..10 {
            let id = format!("{h2}-{i}");
            let (status, body) = post(h2, port, &id, &format!("body-{id}")).await;
            assert_eq!((status, body), (200, format!("primary {id}\n")), "h2={h2}");
            ids.push(id);
        }
    }
    assert_eq!(primary.ids(), ids, "the primary got each request once, in order");
    wait_seen(&shadow, 20).await;
    let mut got: Vec<(String, Vec<u8>)> =
        shadow.seen().into_iter().map(|s| (s.id, s.body)).collect();
    got.sort();
    let mut want: Vec<(String, Vec<u8>)> =
        ids.iter().map(|id| (id.clone(), format!("body-{id}").into_bytes())).collect();
    want.sort();
    assert_eq!(got, want, "the shadow got each request once, with its body");
    wait_copies(&r, "answered", 20.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_mirror_copies_about_its_share() {
    let (primary, shadow) = (Recorder::spawn("primary"), Recorder::spawn("shadow"));
    let (r, port) = start(&primary, &shadow, ", percent = 30.0", "").await;
    const N: usize = 200;
    let url = format!("http://127.0.0.1:{port}/a");
    for h2 in [false, true] {
        let lines = send_many(h2, &url, N, &[]).await;
        assert_eq!(lines.len(), N);
        assert!(lines.iter().all(|l| l.starts_with("primary")), "h2={h2}");
    }
    // Every copy ends (answered) before it is counted; wait until the count settles.
    let start = Instant::now();
    let mut last = -1.0;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = copies(&r, "answered");
        if now == last || start.elapsed() > Duration::from_secs(5) {
            break;
        }
        last = now;
    }
    let copied = shadow.seen().len();
    assert_eq!(copied as f64, copies(&r, "answered"));
    // Binomial(400, 0.3): mean 120, sd 9.2; 60..=180 is over six deviations each way.
    assert!((60..=180).contains(&copied), "the shadow got {copied} of {}", 2 * N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_full_or_dead_shadow_never_delays_or_fails_the_client() {
    let (primary, mut shadow) = (Recorder::spawn("primary"), Recorder::spawn("shadow"));
    let (r, port) = start(&primary, &shadow, ", queue = 2", "request_timeout_ms = 30000").await;
    // The shadow takes copies and never answers: the client's answers still come (curl gives
    // up after 10 s, so a wait for the copy would fail the request), and past the queue's two
    // copies in flight the rest are dropped and counted.
    shadow.hold();
    for h2 in [false, true] {
        for i in 0..3 {
            let id = format!("held-{h2}-{i}");
            assert_eq!(post(h2, port, &id, "x").await, (200, format!("primary {id}\n")));
        }
    }
    wait_seen(&shadow, 2).await;
    assert_eq!(copies(&r, "overflow"), 4.0, "two in flight, four dropped");
    shadow.release();
    wait_copies(&r, "answered", 2.0).await;
    // Down: the copies fail, the client does not notice.
    shadow.kill().await;
    for h2 in [false, true] {
        let id = format!("dead-{h2}");
        assert_eq!(post(h2, port, &id, "x").await, (200, format!("primary {id}\n")));
    }
    wait_copies(&r, "failed", 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_too_large_to_copy_skips_the_copy_not_the_request() {
    let (primary, shadow) = (Recorder::spawn("primary"), Recorder::spawn("shadow"));
    let (r, port) = start(&primary, &shadow, "", "multicast_max_body_bytes = 16").await;
    let big = "x".repeat(1000);
    for h2 in [false, true] {
        let id = format!("big-{h2}");
        assert_eq!(post(h2, port, &id, &big).await, (200, format!("primary {id}\n")), "h2={h2}");
        assert_eq!(primary.seen().last().unwrap().body.len(), 1000, "h2={h2}: the whole body");
        let id = format!("small-{h2}");
        assert_eq!(post(h2, port, &id, "tiny").await, (200, format!("primary {id}\n")));
    }
    wait_seen(&shadow, 2).await;
    let ids: Vec<String> = shadow.ids();
    assert!(ids.iter().all(|id| id.starts_with("small-")), "{ids:?}");
    assert_eq!(copies(&r, "too_large"), 2.0);
}
