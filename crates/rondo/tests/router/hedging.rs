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
                // The body's bytes, if any, are read and dropped while the answer waits.
                let answer = tokio::time::sleep(Duration::from_millis(500));
                tokio::pin!(answer);
                loop {
                    tokio::select! {
                        () = &mut answer => {
                            // One request per connection: the router is told so.
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\
                                       connection: close\r\n\r\nslow\n";
                            let _ = s.write_all(ok).await;
                            return;
                        }
                        n = s.read(&mut buf) => {
                            if matches!(n, Ok(0) | Err(_)) {
                                c.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Slow { addr, requests, cut }
}

fn config(fast: &Recorder, slow: &Slow) -> String {
    config_with(fast, slow, "")
}

/// The cluster's retry table has `hedge` and `more` (other retry settings).
fn config_with(fast: &Recorder, slow: &Slow, more: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"round-robin\"\n\
         retry = {{ hedge = {{ after = \"50ms\", max = 1 }}{more} }}\n\
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

/// An idempotent request with a body (PUT, as content-length and chunked) is hedged too: its
/// body is read whole first (it fits `retry_buffer_bytes`), and each try sends all of it. A body
/// over `retry_buffer_bytes` streams to its first member, unhedged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_with_a_body_is_hedged_and_each_try_sends_all_of_it() {
    let (fast, slow) = (Recorder::spawn("fast"), slow_member().await);
    let r = router(&config_with(&fast, &slow, ", retry_buffer_bytes = \"1KiB\"")).await;
    for i in 0..6 {
        let mut conn = raw_connect(r.addr("web")).await;
        let body = format!("payload-{i}-").repeat(20);
        let request = if i % 2 == 0 {
            format!(
                "PUT /put-{i} HTTP/1.1\r\nHost: t\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        } else {
            let (a, b) = body.split_at(37);
            format!(
                "PUT /put-{i} HTTP/1.1\r\nHost: t\r\ntransfer-encoding: chunked\r\n\r\n\
                 {:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                a.len(),
                b.len()
            )
        };
        let resp = raw_request(&mut conn, request).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert!(resp.text().starts_with("fast "), "/put-{i} answered by: {}", resp.text());
        let seen = fast.seen();
        let got =
            seen.iter().find(|s| s.path == format!("/put-{i}")).expect("the fast member got it");
        assert_eq!(String::from_utf8_lossy(&got.body), body, "/put-{i}: the whole body");
    }
    let to_slow = slow.requests.load(Ordering::SeqCst);
    assert!(to_slow >= 1, "round robin sent no first try to the slow member");
    assert_eq!(hedges(&r, "won"), to_slow, "each slow first try was hedged, and the hedge won");

    // Over `retry_buffer_bytes`: streamed, never hedged (the slow member answers its share).
    let mut answered_by_slow = 0;
    for i in 0..4 {
        let mut conn = raw_connect(r.addr("web")).await;
        let body = "x".repeat(4096);
        let request =
            format!("PUT /big-{i} HTTP/1.1\r\nHost: t\r\ncontent-length: 4096\r\n\r\n{body}");
        let resp = raw_request(&mut conn, request).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        if resp.text() == "slow\n" {
            answered_by_slow += 1;
        }
    }
    assert!(answered_by_slow >= 1, "round robin sent no big PUT to the slow member");
    assert_eq!(hedges(&r, "won"), to_slow, "no big PUT was hedged");
}

/// A hedged try's answer is declined on its status like any try's (`retry_on`): a member
/// answering 503 loses the race to the slow member's 200, whichever try it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_try_answered_5xx_is_declined_and_the_other_try_answers() {
    let (fast, slow) = (Recorder::spawn("fast"), slow_member().await);
    fast.answer_with(503);
    let r = router(&config_with(&fast, &slow, ", retry_on = [\"5xx\"]")).await;
    for i in 0..4 {
        let reply = get(&client(), &r.url("web", &format!("/get-{i}"))).await;
        assert_eq!((reply.status.as_u16(), reply.body.as_str()), (200, "slow\n"), "/get-{i}");
    }
    assert!(fast.seen().len() >= 2, "the 503 member was tried: {}", fast.seen().len());
}
