//! Circuit breakers (issue 38): with a cluster's `max_requests` in flight, the next request is
//! answered 503 at once with the reason, on both codecs, and counted; with
//! `max_requests_per_member` a full member is passed over and a cluster of full members
//! refuses. Released requests lift the breaker.

use std::time::Duration;

use super::recorder::Recorder;
use super::support::*;

pub(crate) fn config(members: &str, limits: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"round-robin\"\n{limits}\nmembers = [{members}]\n"
    )
}

/// The metric's value for `limit` on cluster `c`.
pub(crate) fn refusals(r: &TestRouter, limit: &str) -> u64 {
    let text = r.live.metrics.render(&r.live.load());
    let line = format!("rondo_circuit_breaker_refusals_total{{cluster=\"c\",limit=\"{limit}\"}}");
    text.lines().find_map(|l| l.strip_prefix(&line).map(|v| v.trim().parse().unwrap())).unwrap_or(0)
}

/// `n` GETs of `url` on their own tasks, answered whenever their members let them.
pub(crate) fn send(url: &str, n: usize) -> Vec<tokio::task::JoinHandle<Reply>> {
    (0..n)
        .map(|_| {
            let url = url.to_owned();
            tokio::spawn(async move { get(&client(), &url).await })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_requests_refuses_at_once_and_lifts_when_requests_end() {
    let rec = Recorder::spawn("m");
    let r = router(&config(&rec.entry(), "max_requests = 2")).await;
    rec.hold();
    let held = send(&r.url("web", "/held"), 2);
    rec.wait_for(2).await;
    for c in [client(), h2_client()] {
        let reply = get(&c, &r.url("web", "/third")).await;
        assert_eq!(reply.status, 503, "{}", reply.body);
        assert!(reply.body.contains("circuit breaker open"), "{}", reply.body);
        assert!(reply.body.contains("max_requests"), "{}", reply.body);
        assert_eq!(reply.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    }
    assert_eq!(refusals(&r, "max_requests"), 2);
    assert_eq!(rec.ids().len(), 2, "the refused requests reached no member");
    rec.release();
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    assert_eq!(get(&client(), &r.url("web", "/after")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_member_is_passed_over_and_full_members_refuse() {
    let (a, b) = (Recorder::spawn("a"), Recorder::spawn("b"));
    let members = format!("{}, {}", a.entry(), b.entry());
    let r = router(&config(&members, "max_requests_per_member = 1")).await;
    a.hold();
    b.hold();
    let held = send(&r.url("web", "/held"), 2);
    // Round robin alone could send both to one member; the cap spreads them.
    a.wait_for(1).await;
    b.wait_for(1).await;
    let reply = get(&client(), &r.url("web", "/third")).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("max_requests_per_member"), "{}", reply.body);
    assert_eq!(refusals(&r, "max_requests_per_member"), 1);
    a.release();
    b.release();
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(get(&client(), &r.url("web", "/after")).await.status, 200);
}
