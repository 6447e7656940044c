//! A member's bytes never reach another exchange (issue 41): a member that speaks out of turn
//! on a pooled connection (a second, unsolicited response while the connection is idle, or a
//! response padded with another) loses that connection, and every client gets the answer to its
//! own request, on the own HTTP/1 path and on hyper's. A member whose chunked body breaks before
//! any byte reached the client costs the client a 502 that names it, not an empty reply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::support;

/// What a scripted member sends besides its honest answer.
#[derive(Clone, Copy)]
enum Script {
    /// An honest answer, then, while the connection sits idle, a second whole response.
    Unsolicited,
    /// An honest answer with a second whole response in the same write.
    Padded,
    /// A chunked answer whose second chunk-size line is not hex, all in one write.
    BrokenChunk,
    /// A chunked answer with one good chunk, then after a pause a chunk-size line that is not
    /// hex.
    LateBrokenChunk,
    /// An honest answer, nothing more.
    Honest,
    /// Reads a request's head and its `content-length` body, then closes without an answer.
    TakeBodyAndClose,
}

const STALE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTALE";

/// A member on a free port that answers each request head with the request's path as the body
/// (so a client can tell whose answer it got) and follows `script`. Counts the connections it
/// accepted.
struct Scripted {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    /// The first line of every request head it read.
    lines: Arc<std::sync::Mutex<Vec<String>>>,
}

async fn scripted(script: Script) -> Scripted {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let conns = Arc::new(AtomicUsize::new(0));
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (counted, seen) = (conns.clone(), lines.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(s, script, seen.clone()));
        }
    });
    Scripted { addr, conns, lines }
}

/// At most 64 requests on one connection, each head at most 64 KiB.
async fn answer(
    mut s: tokio::net::TcpStream,
    script: Script,
    lines: Arc<std::sync::Mutex<Vec<String>>>,
) {
    let mut buf = Vec::new();
    for _ in 0..64 {
        let Some(head) = support::next_head(&mut s, &mut buf).await else { return };
        lines.lock().unwrap().push(head.lines().next().unwrap_or("").to_owned());
        let path = head.split(' ').nth(1).unwrap_or("?").to_owned();
        let honest = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}", path.len());
        let sent = match script {
            Script::Honest => s.write_all(honest.as_bytes()).await,
            Script::TakeBodyAndClose => {
                let lower = head.to_ascii_lowercase();
                let len = lower
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; len.saturating_sub(buf.len()).min(65536)];
                use tokio::io::AsyncReadExt;
                let _ = s.read_exact(&mut body).await;
                return;
            }
            Script::Unsolicited => {
                if s.write_all(honest.as_bytes()).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                s.write_all(STALE).await
            }
            Script::Padded => s.write_all(&[honest.as_bytes(), STALE].concat()).await,
            Script::BrokenChunk => {
                let r =
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n";
                s.write_all(r).await
            }
            Script::LateBrokenChunk => {
                let r = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
                if s.write_all(r).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                s.write_all(b"ZZ\r\n").await
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// A router with one cluster of the one scripted member `m1`.
async fn router_to(member: &Scripted) -> support::TestRouter {
    let entry = support::member_entry("m1", member.addr, "");
    support::router(&support::one_cluster(&support::members_of([entry]))).await
}

/// Three clients, one after the other, each on a connection of its own, ask for their own path
/// within a second (the member's extra bytes arrive between them): each gets its own answer.
async fn three_clients_each_get_their_own_answer(script: Script) {
    let m = scripted(script).await;
    let r = router_to(&m).await;
    for path in ["/a", "/b", "/c"] {
        let mut conn = support::raw_connect(r.addr("web")).await;
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        let resp = support::raw_request(&mut conn, req).await;
        assert_eq!((resp.status, resp.text()), (200, path.to_owned()), "client asking {path}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The member's connections that spoke out of turn were not used again.
    assert_eq!(m.conns.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_unsolicited_response_on_an_idle_member_connection_reaches_nobody() {
    three_clients_each_get_their_own_answer(Script::Unsolicited).await;
}

#[tokio::test]
async fn a_response_padded_with_another_reaches_nobody_else() {
    three_clients_each_get_their_own_answer(Script::Padded).await;
}

/// The same on hyper's path (HTTP/2 clients, the member spoken to over HTTP/1.1 from hyper's
/// pool): the stale response goes to nobody.
async fn three_h2_clients_each_get_their_own_answer(script: Script) {
    let m = scripted(script).await;
    let r = router_to(&m).await;
    for path in ["/a", "/b", "/c"] {
        let client = support::h2_client();
        let reply = support::get(&client, &r.url("web", path)).await;
        assert_eq!((reply.status.as_u16(), reply.body), (200, path.to_owned()), "asking {path}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn an_unsolicited_response_reaches_no_http2_client() {
    three_h2_clients_each_get_their_own_answer(Script::Unsolicited).await;
}

#[tokio::test]
async fn a_padded_response_reaches_no_other_http2_client() {
    three_h2_clients_each_get_their_own_answer(Script::Padded).await;
}

#[tokio::test]
async fn a_chunked_body_broken_before_any_byte_went_is_a_502_naming_the_member() {
    let m = scripted(Script::BrokenChunk).await;
    let r = router_to(&m).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    // POST: not tried again, so the one member's failure is the answer.
    let req = "POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi";
    let resp = support::raw_request(&mut conn, req).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    let text = resp.text();
    assert!(text.contains("c/m1: sent a malformed response body"), "{text}");
    // The connection carries the next request (the 502 was a whole response).
    let resp = support::raw_request(&mut conn, "GET /y HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(resp.status, 502, "{}", resp.text());
}

#[tokio::test]
async fn a_chunked_body_broken_after_bytes_went_resets_the_client() {
    let m = scripted(Script::LateBrokenChunk).await;
    let r = router_to(&m).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    support::raw_send(&mut conn, b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let (status, _) = support::read_head(&mut conn).await.expect("head");
    assert_eq!(status, 200);
    assert_eq!(support::read_chunk(&mut conn).await.expect("first chunk"), Some(b"hello".to_vec()));
    // The rest never comes: the connection ends without the last chunk.
    let (rest, closed) = support::read_until_closed(&mut conn, Duration::from_secs(5)).await;
    assert!(closed, "the connection stays open after a broken body");
    assert!(!rest.starts_with(b"0\r\n"), "a last chunk was made up: {rest:?}");
}

/// A router over members `a` then `b` (round-robin from `a`), one cluster.
async fn router_over(a: &Scripted, b: &Scripted) -> support::TestRouter {
    let entries = [support::member_entry("a", a.addr, ""), support::member_entry("b", b.addr, "")];
    support::router(&support::one_cluster(&support::members_of(entries))).await
}

#[tokio::test]
async fn a_try_after_a_broken_body_sends_the_next_member_the_request_not_the_response() {
    let (a, b) = (scripted(Script::BrokenChunk).await, scripted(Script::Honest).await);
    let r = router_over(&a, &b).await;
    // Whichever member each GET meets first, every answer is the honest member's.
    for path in ["/x", "/y", "/z", "/w"] {
        let mut conn = support::raw_connect(r.addr("web")).await;
        let resp =
            support::raw_request(&mut conn, format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n"))
                .await;
        assert_eq!((resp.status, resp.text()), (200, path.to_owned()));
    }
    assert!(!a.lines.lock().unwrap().is_empty(), "the broken member was never tried");
    for line in b.lines.lock().unwrap().iter() {
        assert!(line.starts_with("GET /"), "the honest member was sent {line:?}");
    }
}

#[tokio::test]
async fn a_streamed_body_is_never_sent_again_without_itself() {
    // Member a takes a PUT's body and closes; a PUT is idempotent, but its body was streamed
    // from the client, so no member can be sent it again: 502, and b is sent nothing.
    let (a, b) = (scripted(Script::TakeBodyAndClose).await, scripted(Script::Honest).await);
    let r = router_over(&a, &b).await;
    let mut status = Vec::new();
    for _ in 0..2 {
        let mut conn = support::raw_connect(r.addr("web")).await;
        support::raw_send(&mut conn, b"PUT /p HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        support::raw_send(&mut conn, b"hello").await;
        let (s, _) = support::read_head(&mut conn).await.expect("an answer");
        status.push(s);
        if !a.lines.lock().unwrap().is_empty() {
            break;
        }
    }
    assert!(!a.lines.lock().unwrap().is_empty(), "member a was never tried");
    assert_eq!(status.last(), Some(&502), "{status:?}");
    let sent_b: Vec<String> = b.lines.lock().unwrap().clone();
    assert!(sent_b.len() < status.len(), "b was sent the body-less PUT again: {sent_b:?}");
}
