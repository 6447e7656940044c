//! Which path serves which request: the router's own HTTP/1 path for plain HTTP/1.1, hyper's
//! for what it declines (each hand-off counted in `rondo_http1_handoffs_total` by reason), and a
//! connection handed over mid-way keeps being served.

use std::time::Duration;

use rondo_runtime::metrics::Handoff;

use super::support::{self, RawConn, TestRouter};

/// The listener `web`'s hand-off counters, in `Handoff::ALL` order.
fn handoffs(r: &TestRouter) -> Vec<u64> {
    r.live.metrics.listener("web").handoffs.counts().into_iter().map(|(_, n)| n).collect()
}

/// The listener `web`'s hand-offs for `reason`.
fn handoff(r: &TestRouter, reason: Handoff) -> u64 {
    r.live.metrics.listener("web").handoffs.get(reason)
}

async fn setup(cluster_extra: &str) -> (TestRouter, Vec<rondo::member::Member>) {
    let ms = support::members(1, Duration::ZERO).await;
    let cluster = format!("{cluster_extra}\n{}", support::member_list(&ms));
    (support::router(&support::one_cluster(&cluster)).await, ms)
}

/// Reads a response, skipping an interim `100 Continue`.
async fn final_response(conn: &mut RawConn) -> support::RawResponse {
    loop {
        let resp = support::read_response(conn).await.expect("response");
        if resp.status != 100 {
            return resp;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_and_pipelined_requests_stay_on_the_own_path() {
    let (r, _ms) = setup("").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    // Three requests in one write, one with a body: three answers, in order, on one connection.
    let one = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
    let post = "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
    let chunked =
        "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    support::raw_send(&mut conn, format!("{one}{post}{chunked}").as_bytes()).await;
    for _ in 0..3 {
        let resp = support::read_response(&mut conn).await.expect("response");
        assert_eq!(resp.status, 200, "{}", resp.text());
        let via = resp.header("via").expect("via");
        assert!(via.contains(rondo_proxy::headers::via_id()), "{via}");
    }
    // And again later on the same connection.
    let resp = support::raw_request(&mut conn, one).await;
    assert_eq!(resp.status, 200);
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_declined_request_goes_to_hyper_with_its_connection() {
    let (r, _ms) = setup("").await;
    let cases: [(&str, &str, Handoff); 3] = [
        ("HTTP/1.0", "GET / HTTP/1.0\r\nHost: x\r\n\r\n", Handoff::Http10),
        ("absolute-form", "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", Handoff::TargetForm),
        (
            "Upgrade",
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: demo\r\n\r\n",
            Handoff::Upgrade,
        ),
    ];
    for (what, request, reason) in cases {
        let before = handoff(&r, reason);
        let mut conn = support::raw_connect(r.addr("web")).await;
        // A first request on the own path, then the declined one on the same connection.
        let first = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(first.status, 200, "{what}: first request");
        support::raw_send(&mut conn, request.as_bytes()).await;
        if what == "HTTP/1.0" {
            // Answered in HTTP/1.0, and closed (no keep-alive asked for).
            let (bytes, closed) =
                support::read_until_closed(&mut conn, Duration::from_secs(10)).await;
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.starts_with("HTTP/1.0 200"), "{what}: {text}");
            assert!(closed, "{what}: closed after the response");
        } else {
            let resp = final_response(&mut conn).await;
            assert_eq!(resp.status, 200, "{what}: {}", resp.text());
        }
        let after = handoffs(&r);
        assert_eq!(handoff(&r, reason), before + 1, "{what}: counted as {reason:?}: {after:?}");
        if what != "HTTP/1.0" {
            // hyper now serves the rest of the connection.
            let again = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert_eq!(again.status, 200, "{what}: after the hand-off");
        }
    }
    // HTTP/2 prior knowledge (h2c) is recognised by its preface.
    let reply = support::get(&support::h2_client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, 200);
    assert_eq!(handoff(&r, Handoff::H2), 1, "h2c counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_http2_members_goes_to_hyper() {
    let (r, _ms) = setup("upstream_protocol = \"http2\"").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(handoff(&r, Handoff::Upstream), 1, "counted as upstream");
}

/// A member that answers GETs and, for each POST, reads it whole and closes the connection
/// without answering (as a member that dies right after a request arrived). Counts the POSTs.
async fn post_eating_member() -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU32>)
{
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let posts = std::sync::Arc::new(AtomicU32::new(0));
    let counted = posts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end + 4);
                    if head.starts_with("POST") {
                        counted.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    if s.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, posts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_on_a_pooled_connection_that_dies_is_never_sent_again() {
    let (addr, posts) = post_eating_member().await;
    let cluster = support::members_of([support::member_entry("m1", addr, "")]);
    let r = support::router(&support::one_cluster(&cluster)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    // The GET leaves a pooled connection to the member; the POST goes on it and the member
    // closes it after reading the POST: whether the POST was acted on cannot be known, so it
    // must not be sent again (not on a new connection, not elsewhere).
    let get = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(get.status, 200);
    let post = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
    let resp = support::raw_request(&mut conn, post).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        posts.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the POST arrived more than once"
    );
    // A GET in the same situation is idempotent: the router may send it again on a new
    // connection, and the client gets its answer.
    let again = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(again.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_on_the_own_path() {
    let (r, _ms) = setup("").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let head =
        "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
    support::raw_send(&mut conn, head.as_bytes()).await;
    // The client waits for the interim answer before it sends its body.
    let (status, _) = support::read_head(&mut conn).await.expect("interim response");
    assert_eq!(status, 100);
    support::raw_send(&mut conn, b"hello").await;
    let resp = support::read_response(&mut conn).await.expect("response");
    assert_eq!((resp.status, resp.text().as_str()), (200, "hello"));
    // Any other expectation cannot be met.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let teapot = "GET / HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n";
    let resp = support::raw_request(&mut conn, teapot).await;
    assert_eq!(resp.status, 417, "{}", resp.text());
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_chunk_extension_is_refused_and_the_connection_closed() {
    let (r, _ms) = setup("").await;
    for ext in ["a\0b", "a\rb", "a\x01"] {
        let mut conn = support::raw_connect(r.addr("web")).await;
        // The whole body, and a pipelined canary after it, in one write.
        let request = format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;{ext}\r\nhello\r\n0\r\n\r\nGET /canary HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        support::raw_send(&mut conn, request.as_bytes()).await;
        let resp = support::read_response(&mut conn).await.expect("response");
        assert_eq!(resp.status, 400, "{ext:?}: {}", resp.text());
        assert!(resp.text().contains("malformed chunked body"), "{ext:?}: {}", resp.text());
        let (rest, closed) = support::read_until_closed(&mut conn, Duration::from_secs(5)).await;
        assert!(closed, "{ext:?}: the connection stays open");
        assert!(
            rest.is_empty(),
            "{ext:?}: the canary was answered: {}",
            String::from_utf8_lossy(&rest)
        );
    }
}

/// The same probes on connections this path hands to hyper, which does not read chunk
/// extensions: the connection's bytes are followed under hyper (`h1::follow`), so the request
/// fails with 400 there too (to a member that reads the whole body before it answers: one that
/// has begun answering has its response cut), the connection closes and the pipelined canary is
/// not answered. The member is not charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_chunk_extension_is_refused_on_hyper_path_too() {
    // Declined for its HTTP/2 members (the request streams to them), and for its target form.
    let (h2, _ms) = setup("upstream_protocol = \"http2\"").await;
    let (plain, _ms2) = setup("").await;
    let cases =
        [(&h2, "/collect", Handoff::Upstream), (&plain, "http://x/collect", Handoff::TargetForm)];
    for (r, target, reason) in cases {
        for ext in ["a\0b", "a\rb", "a\x01"] {
            let before = handoff(r, reason);
            let mut conn = support::raw_connect(r.addr("web")).await;
            let request = format!(
                "POST {target} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;{ext}\r\nhello\r\n0\r\n\r\nGET /canary HTTP/1.1\r\nHost: x\r\n\r\n"
            );
            support::raw_send(&mut conn, request.as_bytes()).await;
            let (bytes, closed) =
                support::read_until_closed(&mut conn, Duration::from_secs(5)).await;
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.starts_with("HTTP/1.1 400"), "{target} {ext:?}: {text}");
            assert!(closed, "{target} {ext:?}: the connection stays open");
            assert_eq!(
                text.matches("HTTP/1.1").count(),
                1,
                "{target} {ext:?}: the canary was answered: {text}"
            );
            assert_eq!(handoff(r, reason), before + 1, "{target} {ext:?}: not hyper's");
        }
        // A well-formed extension still passes.
        let mut conn = support::raw_connect(r.addr("web")).await;
        let request = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;name=\"v\"\r\nhello\r\n0\r\n\r\n"
        );
        let resp = support::raw_request(&mut conn, &request).await;
        assert_eq!((resp.status, resp.text().as_str()), (200, "m1 got 5 bytes\n"), "{target}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_larger_than_a_pooled_buffer_stay_on_the_own_path_up_to_the_limit() {
    let (r, _ms) = setup("").await;
    // The pooled buffer is 16 KiB; the default limit is 64 KiB: a 40 KiB head grows the
    // connection's buffer for that request and is forwarded whole.
    let big = "b".repeat(40 * 1024);
    let mut conn = support::raw_connect(r.addr("web")).await;
    let request = format!("GET /headers HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let resp = support::raw_request(&mut conn, &request).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.text().contains(&big), "the member did not get the whole field");
    // The same connection goes on with a small request.
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.status, 200);
    // Over the limit: 431 and closed.
    let huge = "h".repeat(70 * 1024);
    let mut conn = support::raw_connect(r.addr("web")).await;
    let request = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Huge: {huge}\r\n\r\n");
    let resp = support::raw_request(&mut conn, &request).await;
    assert_eq!(resp.status, 431, "{}", resp.text());
    let (_, closed) = support::read_until_closed(&mut conn, Duration::from_secs(5)).await;
    assert!(closed, "the connection stays open after a 431");
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
}

/// A member that, per connection, records what it read until the end of a chunked request's
/// trailer section (`x-req-trailer: yes` and the empty line), then answers with a chunked body
/// and a trailer of its own.
async fn trailer_member() -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let end = b"x-req-trailer: yes\r\n\r\n";
                while !buf.windows(end.len()).any(|w| w.eq_ignore_ascii_case(end)) {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tx.send(buf);
                let reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-resp-trailer\r\n\r\n\
                             2\r\nok\r\n0\r\nx-resp-trailer: done\r\n\r\n";
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_trailers_pass_both_ways_on_the_own_path() {
    let (addr, mut seen) = trailer_member().await;
    let cluster = support::members_of([support::member_entry("m1", addr, "")]);
    let r = support::router(&support::one_cluster(&cluster)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let request = "POST /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\n\r\n\
                   5\r\nhello\r\n0\r\nx-req-trailer: yes\r\n\r\n";
    support::raw_send(&mut conn, request.as_bytes()).await;
    // The client gets the member's body and its trailer.
    let (status, headers) = support::read_head(&mut conn).await.expect("head");
    assert_eq!(status, 200);
    assert!(
        headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked"),
        "{headers:?}"
    );
    let mut body = Vec::new();
    let (rest, _) = support::read_until_closed(&mut conn, Duration::from_millis(500)).await;
    body.extend_from_slice(&rest);
    let body = String::from_utf8_lossy(&body).into_owned();
    assert!(body.contains("2\r\nok\r\n0\r\nx-resp-trailer: done\r\n\r\n"), "{body:?}");
    // The member got the client's body and its trailer.
    let got = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await.unwrap().unwrap();
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(got.contains("\r\n\r\n5\r\nhello\r\n0\r\nx-req-trailer: yes\r\n\r\n"), "{got:?}");
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
}

/// A member that answers every request with `Connection: close` and closes; counts the
/// connections it accepted.
async fn closing_member() -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU32>) {
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = std::sync::Arc::new(AtomicU32::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_from_either_side_ends_only_that_sides_connection() {
    use std::sync::atomic::Ordering;
    // The member closes after each answer: the client's connection stays open (the router
    // strips the member's `Connection: close` and opens a new member connection next time).
    let (addr, accepted) = closing_member().await;
    let cluster = support::members_of([support::member_entry("m1", addr, "")]);
    let r = support::router(&support::one_cluster(&cluster)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    for i in 1..=3 {
        let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!((resp.status, resp.text().as_str()), (200, "ok"), "request {i}");
        assert!(resp.header("connection").is_none_or(|v| !v.contains("close")), "request {i}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "one member connection per answer");
    // The client says close: its answer says so and the router closes after it.
    let resp =
        support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("connection"), Some("close"));
    let (rest, closed) = support::read_until_closed(&mut conn, Duration::from_secs(5)).await;
    assert!(closed && rest.is_empty(), "the router kept the client's connection open");
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
}
