//! Multicast (docs/router.md "Multicast"): every branch gets each request exactly once while it
//! is up, a dead branch's backup takes its share, a slow branch never delays the client's answer,
//! a full branch queue drops copies and counts them, a body over `multicast_max_body_bytes` is
//! refused before anything is sent, and `routing = "all-matches"` copies to every matching
//! route's cluster. Members are [`Recorder`]s that log each request id they receive.

use std::time::{Duration, Instant};

use http::StatusCode;

use super::filters::send;
use super::recorder::Recorder;
use super::support::{self, TestRouter, cluster_table, listener_table, route_table};

fn cluster_of(r: &Recorder) -> String {
    format!("members = [{}]", r.entry())
}

/// `rondo_multicast_copies_total` of `route`, `branch` and `outcome`.
fn copies(r: &TestRouter, route: &str, branch: &str, outcome: &str) -> f64 {
    let text = r.live.metrics.render(&r.live.load());
    let line = format!(
        "rondo_multicast_copies_total{{route=\"{route}\",branch=\"{branch}\",outcome=\"{outcome}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0.0, |v| v.trim().parse().unwrap_or(0.0))
}

/// Waits (5 s at most) until `copies(...)` reaches `n`.
async fn wait_copies(r: &TestRouter, route: &str, branch: &str, outcome: &str, n: f64) {
    let start = Instant::now();
    while copies(r, route, branch, outcome) < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{route}/{branch}/{outcome}: {} of {n}",
            copies(r, route, branch, outcome)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// POSTs request `id` with body `body-ID` to `path`: the answering member's name.
async fn post(r: &TestRouter, path: &str, id: usize) -> String {
    let id = id.to_string();
    let body = format!("body-{id}");
    let s = send("POST", &r.url("web", path), &[("x-request-id", &id)], body.as_bytes()).await;
    assert_eq!(s.status, StatusCode::OK, "{}", String::from_utf8_lossy(&s.body));
    s.member().to_owned()
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_branch_gets_each_request_exactly_once() {
    let (orders, audit, billing) =
        (Recorder::spawn("orders"), Recorder::spawn("audit"), Recorder::spawn("billing"));
    let multicast = "multicast = [ { cluster = \"audit\" }, { cluster = \"billing\" } ]";
    let config = listener_table("web", "")
        + &route_table(
            "orders",
            "web",
            "orders",
            &format!("match = {{ path_prefix = \"/orders\" }}\n{multicast}"),
        )
        + &cluster_table("orders", &cluster_of(&orders))
        + &cluster_table("audit", &cluster_of(&audit))
        + &cluster_table("billing", &cluster_of(&billing));
    let r = support::router(&config).await;
    for i in 0..20 {
        // The client's answer is the primary's, as without multicast.
        assert_eq!(post(&r, "/orders/new", i).await, "orders");
    }
    assert_eq!(orders.ids(), ids(20), "the primary got each request once, in order");
    for branch in [&audit, &billing] {
        let mut got = branch.wait_for(20).await;
        got.sort_by_key(|id| id.parse::<usize>().unwrap());
        assert_eq!(got, ids(20), "{} got each request exactly once", branch.name);
        for seen in branch.seen() {
            // The same method, path, headers and body.
            assert_eq!((seen.method.as_str(), seen.path.as_str()), ("POST", "/orders/new"));
            assert_eq!(seen.body, format!("body-{}", seen.id).into_bytes());
            assert!(seen.headers.contains_key("x-forwarded-for"), "{:?}", seen.headers);
        }
        wait_copies(&r, "orders", &branch.name, "answered", 20.0).await;
    }
    // Nothing more arrives later.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((audit.ids().len(), billing.ids().len()), (20, 20));
    // A request the route does not match is not copied.
    let other = send("GET", &r.url("web", "/elsewhere"), &[], b"").await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert_eq!(audit.ids().len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_branch_s_backup_takes_its_share() {
    let (orders, mut audit, audit_dr) =
        (Recorder::spawn("orders"), Recorder::spawn("audit"), Recorder::spawn("audit-dr"));
    let multicast = "multicast = [ { cluster = \"audit\", backups = [\"audit-dr\"] } ]";
    let config = listener_table("web", "")
        + &route_table("orders", "web", "orders", multicast)
        + &cluster_table("orders", &cluster_of(&orders))
        + &cluster_table("audit", &cluster_of(&audit))
        + &cluster_table("audit-dr", &cluster_of(&audit_dr));
    let r = support::router(&config).await;
    for i in 0..5 {
        assert_eq!(post(&r, "/", i).await, "orders");
    }
    audit.wait_for(5).await;
    wait_copies(&r, "orders", "audit", "answered", 5.0).await;
    assert!(audit_dr.ids().is_empty(), "the backup is idle while the branch is up");
    audit.kill().await;
    for i in 5..15 {
        assert_eq!(post(&r, "/", i).await, "orders", "the client never notices");
    }
    let mut got = audit_dr.wait_for(10).await;
    got.sort_by_key(|id| id.parse::<usize>().unwrap());
    assert_eq!(got, (5..15).map(|i| i.to_string()).collect::<Vec<_>>());
    wait_copies(&r, "orders", "audit", "answered", 15.0).await;
    assert_eq!(audit.ids().len(), 5);
    assert_eq!(copies(&r, "orders", "audit", "failed"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_branch_never_delays_the_client() {
    let (orders, audit) = (Recorder::spawn("orders"), Recorder::spawn("audit"));
    let config = listener_table("web", "")
        + &route_table("orders", "web", "orders", "multicast = [ { cluster = \"audit\" } ]")
        + &cluster_table("orders", &cluster_of(&orders))
        + &cluster_table("audit", &cluster_of(&audit));
    let r = support::router(&config).await;
    audit.hold();
    for i in 0..3 {
        // Each answer arrives while the branch holds its copies unanswered.
        assert_eq!(post(&r, "/", i).await, "orders");
    }
    let held = audit.wait_for(3).await;
    assert_eq!(held.len(), 3);
    assert_eq!(copies(&r, "orders", "audit", "answered"), 0.0, "no copy was answered yet");
    assert_eq!(orders.ids(), ids(3));
    audit.release();
    wait_copies(&r, "orders", "audit", "answered", 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_branch_queue_drops_and_counts() {
    let (orders, audit) = (Recorder::spawn("orders"), Recorder::spawn("audit"));
    let config = listener_table("web", "")
        + &route_table(
            "orders",
            "web",
            "orders",
            "multicast = [ { cluster = \"audit\", queue = 2 } ]",
        )
        + &cluster_table("orders", &cluster_of(&orders))
        + &cluster_table("audit", &cluster_of(&audit));
    let r = support::router(&config).await;
    audit.hold();
    for i in 0..2 {
        assert_eq!(post(&r, "/", i).await, "orders");
    }
    // Both places of the queue are taken (held by the branch) before the next requests.
    audit.wait_for(2).await;
    for i in 2..6 {
        assert_eq!(post(&r, "/", i).await, "orders", "overflow never touches the client");
    }
    assert_eq!(copies(&r, "orders", "audit", "overflow"), 4.0);
    audit.release();
    wait_copies(&r, "orders", "audit", "answered", 2.0).await;
    assert_eq!(audit.ids(), ids(2));
    // The queue has room again.
    assert_eq!(post(&r, "/", 6).await, "orders");
    wait_copies(&r, "orders", "audit", "answered", 3.0).await;
    assert_eq!(orders.ids().len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_multicast_limit_is_refused_before_anything_is_sent() {
    let (orders, audit) = (Recorder::spawn("orders"), Recorder::spawn("audit"));
    let route = "multicast = [ { cluster = \"audit\" } ]\nmulticast_max_body_bytes = 100";
    let config = listener_table("web", "error_detail = \"full\"")
        + &route_table("orders", "web", "orders", route)
        + &cluster_table("orders", &cluster_of(&orders))
        + &cluster_table("audit", &cluster_of(&audit));
    let r = support::router(&config).await;
    let s = send("POST", &r.url("web", "/"), &[("x-request-id", "big")], &[b'x'; 101]).await;
    assert_eq!(s.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(String::from_utf8_lossy(&s.body).contains("multicast_max_body_bytes"));
    // Chunked (no length known ahead): read up to the limit, then refused all the same.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let chunked = format!(
        "POST / HTTP/1.1\r\nhost: x\r\nx-request-id: chunked\r\ntransfer-encoding: chunked\r\n\r\n65\r\n{}\r\n0\r\n\r\n",
        "y".repeat(101)
    );
    let resp = support::raw_request(&mut conn, chunked).await;
    assert_eq!(resp.status, 413);
    let s = send("POST", &r.url("web", "/"), &[("x-request-id", "ok")], &[b'x'; 100]).await;
    assert_eq!(s.status, StatusCode::OK);
    audit.wait_for(1).await;
    assert_eq!(orders.ids(), ["ok"]);
    assert_eq!(audit.ids(), ["ok"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_matches_routing_copies_to_every_matching_route() {
    let (orders, audit, other) =
        (Recorder::spawn("orders"), Recorder::spawn("audit"), Recorder::spawn("other"));
    let config = listener_table("web", "routing = \"all-matches\"")
        + &route_table("orders", "web", "orders", "match = { path_prefix = \"/orders\" }")
        + &route_table("audit-posts", "web", "audit", "match = { method = \"POST\" }")
        + &route_table("rest", "web", "other", "")
        + &cluster_table("orders", &cluster_of(&orders))
        + &cluster_table("audit", &cluster_of(&audit))
        + &cluster_table("other", &cluster_of(&other));
    let parsed = rondo_config::parse_str(&config, std::path::Path::new("t.toml"), 1).unwrap();
    assert!(
        parsed.warnings.is_empty(),
        "no route is shadowed under all-matches: {:?}",
        parsed.warnings
    );
    let r = support::router(&config).await;
    // POST /orders: answered by `orders`, copied to `audit` (POST) and `other` (everything).
    assert_eq!(post(&r, "/orders", 1).await, "orders");
    audit.wait_for(1).await;
    other.wait_for(1).await;
    // GET /orders: `orders` answers, `other` gets a copy, `audit` does not (not a POST).
    let s = send("GET", &r.url("web", "/orders"), &[("x-request-id", "2")], b"").await;
    assert_eq!(s.member(), "orders");
    other.wait_for(2).await;
    // POST /x: `audit` is the first match and answers; `other` gets a copy.
    assert_eq!(post(&r, "/x", 3).await, "audit");
    other.wait_for(3).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(orders.ids(), ["1", "2"]);
    assert_eq!(audit.ids(), ["1", "3"]);
    assert_eq!(other.ids(), ["1", "2", "3"]);
    wait_copies(&r, "audit-posts", "audit", "answered", 1.0).await;
    wait_copies(&r, "rest", "other", "answered", 2.0).await;
}
