//! Connection breakers (issue 38 item 3): a cluster's `max_connections` caps the connections
//! open to its members, whichever client's request opened them; `max_pending` caps the requests
//! waiting for one (one more is answered 503 at once, with the reason, and counted), and a
//! waiting request proceeds when a connection comes free, or gets a 503 once the cluster's
//! `connect_timeout` has passed. The member holds its answers, so the connections stay busy.

use std::time::Duration;

use super::breakers::{config, refusals, send};
use super::recorder::Recorder;
use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_caps_the_members_connections_and_waiting_requests_proceed() {
    let rec = Recorder::spawn("m");
    let r = router(&config(&rec.entry(), "max_connections = 2\nmax_pending = 10")).await;
    rec.hold();
    let held = send(&r.url("web", "/held"), 6);
    rec.wait_for(2).await;
    // Bounded: the other four wait in the router (an HTTP/1 member connection carries one
    // request at a time); without the cap they would all have reached the member by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rec.ids().len(), 2, "only max_connections requests reached the member");
    rec.release();
    for h in held {
        let reply = h.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(rec.ids().len(), 6);
    assert_eq!(refusals(&r, "max_pending") + refusals(&r, "max_connections"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_pending_is_answered_503_at_once() {
    let rec = Recorder::spawn("m");
    let r = router(&config(&rec.entry(), "max_connections = 1\nmax_pending = 1")).await;
    rec.hold();
    let first = send(&r.url("web", "/first"), 1);
    rec.wait_for(1).await;
    let waiting = send(&r.url("web", "/waiting"), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    for c in [client(), h2_client()] {
        let reply = get(&c, &r.url("web", "/over")).await;
        assert_eq!(reply.status, 503, "{}", reply.body);
        assert!(reply.body.contains("circuit breaker open"), "{}", reply.body);
        assert!(reply.body.contains("max_pending"), "{}", reply.body);
    }
    assert_eq!(refusals(&r, "max_pending"), 2);
    rec.release();
    for h in first.into_iter().chain(waiting) {
        assert_eq!(h.await.unwrap().status, 200);
    }
    let seen: Vec<String> = rec.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(seen, ["/first", "/waiting"], "the refused requests reached no member");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_gives_up_after_connect_timeout() {
    let rec = Recorder::spawn("m");
    let limits = "max_connections = 1\nconnect_timeout = \"300ms\"";
    let r = router(&config(&rec.entry(), limits)).await;
    rec.hold();
    let first = send(&r.url("web", "/first"), 1);
    rec.wait_for(1).await;
    let reply = get(&client(), &r.url("web", "/late")).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("max_connections"), "{}", reply.body);
    assert_eq!(refusals(&r, "max_connections"), 1);
    rec.release();
    for h in first {
        assert_eq!(h.await.unwrap().status, 200);
    }
    assert_eq!(get(&client(), &r.url("web", "/after")).await.status, 200);
}
