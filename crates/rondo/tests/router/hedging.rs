//! Hedged requests (issue 38 item 4, `retry.hedge`): two real members, one answering at once,
//! one that takes 500 ms. A GET whose first try went to the slow one gets a hedge on the fast
//! one after 50 ms, and the fast answer wins; the slow member's connection is closed (never
//! kept for another request); the hedges are counted. A POST (without `retry_non_idempotent`)
//! is never hedged: the slow member answers it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::recorder::Recorder;
use super::support::*;

/// A member that answers `slow` after 500 ms, unless the router closes the connection first:
/// it counts the requests it read and the connections closed on it before its answer.
struct Slow {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
}

async fn slow_member() -> Slow {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (requests, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (r, c) = (requests.clone(), cut.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (r, c) = (r.clone(), c.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                // One request per connection is enough: its head, then the wait.
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                r.fetch_add(1, Ordering::SeqCst);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => {
                        // One request per connection: the router is told so.
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\
                                   connection: close\r\n\r\nslow\n";
                        let _ = s.write_all(ok).await;
                    }
                    n = s.read(&mut buf) => {
                        if matches!(n, Ok(0) | Err(_)) {
                            c.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    Slow { addr, requests, cut }
}

fn config(fast: &Recorder, slow: &Slow) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"round-robin\"\nretry = {{ hedge = {{ after = \"50ms\", max = 1 }} }}\n\
         members = [{}, {{ name = \"slow\", address = \"{}\" }}]\n",
        fast.entry(),
        slow.addr
    )
}

/// `rondo_hedges_total{cluster="c",outcome=...}`.
fn hedges(r: &TestRouter, outcome: &str) -> u64 {
    let text = r.live.metrics.render(&r.live.load());
    let line = format!("rondo_hedges_total{{cluster=\"c\",outcome=\"{outcome}\"}}");
    text.lines().find_map(|l| l.strip_prefix(&line).map(|v| v.trim().parse().unwrap())).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_try_is_hedged_and_the_fast_answer_wins() {
    let (fast, slow) = (Recorder::spawn("fast"), slow_member().await);
    let r = router(&config(&fast, &slow)).await;
    // Round robin: half of the first tries go to the slow member.
    for i in 0..6 {
        let reply = get(&client(), &r.url("web", &format!("/get-{i}"))).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(reply.body.starts_with("fast "), "/get-{i} answered by: {}", reply.body);
    }
    let to_slow = slow.requests.load(Ordering::SeqCst);
    assert!(to_slow >= 1, "round robin sent no first try to the slow member");
    assert_eq!(hedges(&r, "won"), to_slow, "each slow first try was hedged, and the hedge won");
    assert_eq!(hedges(&r, "lost"), 0);
    // The slow member's connections were closed under its pending answer, not kept (bounded
    // wait: the close follows the winner's answer).
    for _ in 0..100 {
        if slow.cut.load(Ordering::SeqCst) == to_slow {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(slow.cut.load(Ordering::SeqCst), to_slow, "a cancelled try's connection closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_not_hedged() {
    let (fast, slow) = (Recorder::spawn("fast"), slow_member().await);
    let r = router(&config(&fast, &slow)).await;
    let mut answered_by_slow = 0;
    for i in 0..4 {
        let mut conn = raw_connect(r.addr("web")).await;
        let request = format!("POST /post-{i} HTTP/1.1\r\nHost: t\r\ncontent-length: 0\r\n\r\n");
        let resp = raw_request(&mut conn, request).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        if resp.text() == "slow\n" {
            answered_by_slow += 1;
        }
    }
    assert!(answered_by_slow >= 1, "round robin sent no POST to the slow member");
    assert_eq!(hedges(&r, "won") + hedges(&r, "lost"), 0);
    assert_eq!(slow.cut.load(Ordering::SeqCst), 0);
}
