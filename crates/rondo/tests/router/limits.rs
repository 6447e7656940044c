//! Listener and route limits: each gives the right status, ends that connection, and the router
//! keeps serving everyone else (after each, a normal GET on a fresh connection succeeds).

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use rondo::member::Member;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

use super::support::{self, RawConn, TestRouter};

/// Upper bound for waiting on the router to close a connection.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

const GET: &str = "GET / HTTP/1.1\r\nHost: limits.test\r\n\r\n";

/// A router over one member `m1`.
async fn setup(listener: &str, route: &str) -> (TestRouter, Vec<Member>) {
    let ms = support::members(1, Duration::ZERO).await;
    let r =
        support::router(&support::web_config(listener, route, &support::member_list(&ms))).await;
    (r, ms)
}

/// A normal GET on a fresh connection is served.
async fn still_serves(r: &TestRouter) {
    let reply = support::get(&support::client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body.trim(), "m1");
}

/// Sends `bytes` on a new connection and reads until the router closes it (at most
/// `CLOSE_WAIT`); a failed write (the router already closed) is not an error.
async fn send_and_wait_close(addr: SocketAddr, bytes: &[u8]) -> (String, bool) {
    let mut conn = support::raw_connect(addr).await;
    let _ = conn.get_mut().write_all(bytes).await;
    let (out, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// The router answered `reply` with `status` and closed the connection.
fn assert_refused(reply: &str, closed: bool, status: u16) {
    assert!(reply.starts_with(&format!("HTTP/1.1 {status}")), "{reply:?}");
    assert!(closed, "the connection stays open after the {status}");
}

/// The next response on `conn` is a 413 with `Connection: close`, and the router closes.
async fn assert_413_and_closed(conn: &mut RawConn) {
    let resp = support::read_response(conn).await.expect("response");
    assert_eq!(resp.status, 413, "{}", resp.text());
    assert_eq!(resp.header("connection").map(str::to_ascii_lowercase).as_deref(), Some("close"));
    let (_, closed) = support::read_until_closed(conn, CLOSE_WAIT).await;
    assert!(closed, "the connection stays open after the 413");
}

/// A fresh connection sending `request` is answered with `status`.
async fn assert_served_fresh(r: &TestRouter, request: &str, status: u16) {
    let mut conn = support::raw_connect(r.addr("web")).await;
    assert_eq!(support::raw_request(&mut conn, request).await.status, status);
}

fn has_header(text: &str, name: &str, value: &str) -> bool {
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    head.lines().skip(1).any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case(name) && v.trim().eq_ignore_ascii_case(value)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_head_gets_408_and_is_closed() {
    let (r, _ms) = setup("header_read_timeout_ms = 300", "").await;
    let (reply, closed) =
        send_and_wait_close(r.addr("web"), b"GET / HTTP/1.1\r\nHost: x\r\n").await;
    assert_refused(&reply, closed, 408);
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_header_bytes_does_not_extend_the_header_timeout() {
    let (r, _ms) = setup("header_read_timeout_ms = 300", "").await;
    let conn = tokio::net::TcpStream::connect(r.addr("web")).await.expect("connect");
    let (mut read, mut write) = conn.into_split();
    // One header line every 100 ms for 3 s, then the end of the head: a router that restarted
    // its timer on every byte would answer that request 200 instead of 408.
    let writer = tokio::spawn(async move {
        if write.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.is_err() {
            return;
        }
        for i in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if write.write_all(format!("x-pad-{i}: y\r\n").as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = write.write_all(b"\r\n").await;
    });
    let (out, closed) = support::read_until_closed(&mut read, Duration::from_secs(8)).await;
    writer.abort();
    assert_refused(&String::from_utf8_lossy(&out), closed, 408);
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_new_connection_is_closed_quietly_after_the_header_timeout() {
    let (r, _ms) = setup("header_read_timeout_ms = 300", "").await;
    let (reply, closed) = send_and_wait_close(r.addr("web"), b"").await;
    assert!(closed, "a connection that never sent a byte is kept past the header timeout");
    assert_eq!(reply, "", "nothing was asked, so nothing should be answered");
    still_serves(&r).await;
}

// Regression: the idle timer was never armed after a response (hyper does not poll a blocked
// reader again by itself), so idle keep-alive connections held a max_connections slot forever.
// `response_finished` now wakes the parked reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connection_is_closed_quietly_after_the_route_idle_timeout() {
    // The header timer is long, so a close within CLOSE_WAIT can only be the idle timer.
    let (r, _ms) = setup("header_read_timeout_ms = 30000", "idle_timeout_ms = 1000").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    for _ in 0..2 {
        // Keep-alive works while requests follow each other.
        let resp = support::raw_request(&mut conn, GET).await;
        assert_eq!((resp.status, resp.text().trim()), (200, "m1"));
    }
    let (rest, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
    assert!(closed, "idle keep-alive connection not closed by the route's idle timeout");
    assert!(rest.is_empty(), "idle close sent bytes: {:?}", String::from_utf8_lossy(&rest));
    still_serves(&r).await;
}

// The own HTTP/1 path keeps one timer per connection and moves it later only when it fires
// (not once per request): a connection busy for longer than the idle timeout must not be
// closed by the deadline of its first wait, and must still be closed once it is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_http1_connection_is_not_closed_as_idle_and_is_once_it_idles() {
    let (r, _ms) = setup("header_read_timeout_ms = 30000", "idle_timeout_ms = 300").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    // Requests more often than the idle timeout, for about three times its length.
    for i in 0..9 {
        let resp = support::raw_request(&mut conn, GET).await;
        assert_eq!(resp.status, 200, "request {i} on a busy keep-alive connection");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = std::time::Instant::now();
    let (rest, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
    assert!(closed, "idle keep-alive connection not closed by the route's idle timeout");
    assert!(rest.is_empty(), "idle close sent bytes: {:?}", String::from_utf8_lossy(&rest));
    // The last wait began about 100 ms before `started`: its timeout ends about 200 ms after.
    assert!(started.elapsed() >= Duration::from_millis(100), "closed before the idle timeout");
    still_serves(&r).await;
}

/// An h2c connection and its connection task (which ends when the router closes it).
async fn h2(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let io = hyper_util::rt::TokioIo::new(stream);
    let (sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
    (sender, tokio::spawn(conn))
}

// Regression: HTTP/2 connections had no idle timeout, so idle h2c connections held
// max_connections slots forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connection_gets_goaway_after_the_route_idle_timeout() {
    let (r, _ms) =
        setup("header_read_timeout_ms = 30000\nmax_connections = 1", "idle_timeout_ms = 500").await;
    let (mut sender, conn) = h2(r.addr("web")).await;
    for _ in 0..3 {
        let req = http::Request::get(r.url("web", "/")).body(Default::default()).unwrap();
        let resp = sender.send_request(req).await.expect("served over h2");
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
    }
    let started = std::time::Instant::now();
    let ended = tokio::time::timeout(CLOSE_WAIT, conn).await;
    assert!(ended.is_ok(), "idle h2 connection still open after {CLOSE_WAIT:?}");
    let after = started.elapsed();
    assert!(after >= Duration::from_millis(400), "closed before the idle timeout: {after:?}");
    // Its slot frees as soon as the router has closed its side (bounded polling).
    assert!(served_within(r.addr("web"), 50).await, "the idle h2 connection's slot stayed taken");
}

/// Whether a fresh connection is served (200) within `tries` attempts 100 ms apart; 503s from
/// the connection limit are retried.
async fn served_within(addr: SocketAddr, tries: usize) -> bool {
    for _ in 0..tries {
        let mut conn = support::raw_connect(addr).await;
        let _ = conn.get_mut().write_all(GET.as_bytes()).await;
        match support::read_response(&mut conn).await {
            Ok(resp) if resp.status == 200 => return true,
            Ok(resp) => assert_eq!(resp.status, 503, "{}", resp.text()),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_http2_connection_is_not_closed_as_idle() {
    let (r, _ms) = setup("header_read_timeout_ms = 30000", "idle_timeout_ms = 300").await;
    let (mut sender, conn) = h2(r.addr("web")).await;
    // Requests keep coming more often than the idle timeout, for three times its length.
    for _ in 0..9 {
        let req = http::Request::get(r.url("web", "/")).body(Default::default()).unwrap();
        let resp = sender.send_request(req).await.expect("served over h2");
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!conn.is_finished(), "a busy h2 connection was closed");
}

// Regression: a client that declared a body and stalled made the try time out against the
// member, which was charged a timeout (and ejected, with a low outlier threshold) for the
// client's slowness; the client got a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_gets_408_and_does_not_charge_the_member() {
    let ms = support::members(2, Duration::ZERO).await;
    let cluster =
        format!("outlier = {{ consecutive_failures = 1 }}\n{}", support::member_list(&ms));
    let r = support::router(&support::web_config(
        "header_read_timeout_ms = 30000",
        "request_timeout_ms = 400",
        &cluster,
    ))
    .await;
    // Part of the body and none of it, in HTTP/1.1 and 1.0 (an even number of requests, so
    // that round robin comes back to m1 for `still_serves`).
    for (version, sent) in
        [("1.1", "0123456789"), ("1.1", ""), ("1.0", ""), ("1.0", "01"), ("1.1", "0")]
    {
        let mut conn = support::raw_connect(r.addr("web")).await;
        let head = format!(
            "POST /collect HTTP/{version}\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{sent}"
        );
        support::raw_send(&mut conn, head.as_bytes()).await;
        let (out, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408") || text.starts_with("HTTP/1.0 408"), "{text}");
        assert!(text.contains("request body did not arrive in time"), "{text}");
        assert!(closed, "connection kept after a stalled body");
    }
    let rt = r.live.load().clusters["c"].clone();
    rt.with(|b| {
        for (i, st) in b.states().iter().enumerate() {
            assert_eq!(st.ejected_until, None, "member {i} charged for the client's stall");
            assert_eq!(st.load.in_flight, 0, "member {i}");
        }
    });
    // A member that reads slowly is still the member's fault: a whole body, a slow answer.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let req = "POST /slow/2000 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
    let resp = support::raw_request(&mut conn, req).await;
    assert_eq!(resp.status, 504, "{}", resp.text());
    still_serves(&r).await;
}

// Issue 41: a client that sends a body's head and a few bytes, then nothing, held its
// connection (and slot) until the route's request timeout ran out, and for ever once the member
// had begun to answer. Now no byte for `body_read_timeout_ms` is a 408 and a close, on the own
// HTTP/1.1 path and on hyper's (HTTP/1.0), whatever the request timeout, and the member is not
// charged; a response already under way is cut. A slow body that keeps coming is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_stalled_for_body_read_timeout_gets_408_and_is_closed() {
    let ms = support::members(2, Duration::ZERO).await;
    let cluster =
        format!("outlier = {{ consecutive_failures = 1 }}\n{}", support::member_list(&ms));
    let r = support::router(&support::web_config(
        "header_read_timeout_ms = 30000\nbody_read_timeout_ms = 500",
        "request_timeout_ms = 60000",
        &cluster,
    ))
    .await;
    for (version, sent) in [("1.1", "0123456789"), ("1.1", ""), ("1.0", ""), ("1.0", "01")] {
        let mut conn = support::raw_connect(r.addr("web")).await;
        let head = format!(
            "POST /collect HTTP/{version}\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{sent}"
        );
        support::raw_send(&mut conn, head.as_bytes()).await;
        let (out, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408") || text.starts_with("HTTP/1.0 408"), "{text}");
        assert!(text.contains("body_read_timeout_ms"), "{text}");
        assert!(closed, "connection kept after a stalled body (HTTP/{version}, sent {sent:?})");
    }
    let rt = r.live.load().clusters["c"].clone();
    rt.with(|b| {
        for (i, st) in b.states().iter().enumerate() {
            assert_eq!(st.ejected_until, None, "member {i} charged for the client's stall");
            assert_eq!(st.load.in_flight, 0, "member {i}");
        }
    });
    // A route that reads the body to choose (body filters): the same rule while it peeks.
    let filtered = support::router(&support::web_config(
        "header_read_timeout_ms = 30000\nbody_read_timeout_ms = 500",
        "request_timeout_ms = 60000\nmatch = { body_json = { \"$.kind\" = \"a\" } }",
        &support::member_list(&ms),
    ))
    .await;
    let mut conn = support::raw_connect(filtered.addr("web")).await;
    let head = "POST /collect HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"kind\"";
    support::raw_send(&mut conn, head.as_bytes()).await;
    let (out, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_read_timeout_ms"), "{text}");
    assert!(closed, "connection kept after a stalled body on a body filter's route");
    // The member answers (an echo) before the body is over: the stall cuts the response.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789";
    support::raw_send(&mut conn, head.as_bytes()).await;
    let (out, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "a response to a stalled body kept its connection: {text}");
    // Each byte within the timeout, the whole body over twice as long: served.
    let mut conn = support::raw_connect(r.addr("web")).await;
    support::raw_send(
        &mut conn,
        b"POST /collect HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
    )
    .await;
    for b in b"0123456789" {
        tokio::time::sleep(Duration::from_millis(100)).await;
        support::raw_send(&mut conn, &[*b]).await;
    }
    let resp = support::read_response(&mut conn).await.expect("response");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.text().contains("got 10 bytes"), "{}", resp.text());
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_head_gets_431() {
    let (r, _ms) = setup("max_header_bytes = 8192", "").await;
    let big = "a".repeat(20 * 1024);
    let req = format!("GET / HTTP/1.1\r\nHost: x\r\nx-big: {big}\r\n\r\n");
    let (reply, closed) = send_and_wait_close(r.addr("web"), req.as_bytes()).await;
    assert_refused(&reply, closed, 431);
    // Just under the limit is fine.
    let ok = format!("GET / HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n", "a".repeat(7 * 1024));
    assert_served_fresh(&r, &ok, 200).await;
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_header_fields_get_431() {
    let (r, _ms) = setup("max_headers = 10", "").await;
    let fields = |n: usize| (0..n).map(|i| format!("x-h{i}: {i}\r\n")).collect::<String>();
    let req = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", fields(30));
    let (reply, closed) = send_and_wait_close(r.addr("web"), req.as_bytes()).await;
    assert_refused(&reply, closed, 431);
    // Host plus 9 more is exactly the limit.
    assert_served_fresh(&r, &format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", fields(9)), 200).await;
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_body_over_the_limit_gets_413_and_close() {
    let (r, _ms) = setup("max_body_bytes = 1000", "").await;
    // Only the head is sent: the router answers from Content-Length alone, without reading
    // (or waiting for) the body.
    let mut conn = support::raw_connect(r.addr("web")).await;
    support::raw_send(&mut conn, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .await;
    assert_413_and_closed(&mut conn).await;

    // Exactly the limit passes (echoed back).
    let body = "b".repeat(1000);
    let mut conn = support::raw_connect(r.addr("web")).await;
    let req = format!("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{body}");
    let resp = support::raw_request(&mut conn, req).await;
    assert_eq!((resp.status, resp.text()), (200, body));
    still_serves(&r).await;
}

/// `data` as one chunk of a chunked body.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", data.len()).into_bytes();
    v.extend_from_slice(data);
    v.extend_from_slice(b"\r\n");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_before_the_answer_gets_413() {
    let (r, _ms) = setup("max_body_bytes = 1000", "").await;
    // The whole body (one 2000-byte chunk) arrives with the head: the limit trips on the
    // first frame, before anything reached the member, so the client gets a clean 413.
    let mut req = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend(chunk(&[b'c'; 2000]));
    req.extend_from_slice(b"0\r\n\r\n");
    let mut conn = support::raw_connect(r.addr("web")).await;
    support::raw_send(&mut conn, &req).await;
    assert_413_and_closed(&mut conn).await;
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_after_the_answer_started_is_cut() {
    let (r, _ms) = setup("max_body_bytes = 1000", "").await;
    let mut conn: RawConn = support::raw_connect(r.addr("web")).await;
    let mut req = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend(chunk(&[b'1'; 500]));
    support::raw_send(&mut conn, &req).await;
    // /echo answers at once: the 200 is out before the body is over the limit.
    let (status, headers) = support::read_head(&mut conn).await.expect("response head");
    assert_eq!(status, 200, "{headers:?}");
    let mut echoed = Vec::new();
    for _ in 0..500 {
        if echoed.len() >= 500 {
            break;
        }
        match support::read_chunk(&mut conn).await.expect("echoed chunk") {
            Some(data) => echoed.extend(data),
            None => panic!("response ended after {} bytes", echoed.len()),
        }
    }
    assert_eq!(echoed, [b'1'; 500]);
    // Now past the limit: the status can no longer change, so the response is cut off
    // (no last chunk) and the connection closed; nothing past the limit reaches the member.
    support::raw_send(&mut conn, &chunk(&[b'2'; 600])).await;
    let mut after = Vec::new();
    let mut ended_cleanly = false;
    for _ in 0..1000 {
        match support::read_chunk(&mut conn).await {
            Ok(Some(data)) => after.extend(data),
            Ok(None) => {
                ended_cleanly = true;
                break;
            }
            Err(_) => break,
        }
    }
    assert!(!ended_cleanly, "a body over the limit looked complete to the client");
    assert!(after.is_empty(), "{} bytes past the limit were echoed", after.len());
    let (_, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
    assert!(closed, "the connection stays open after the cut response");
    still_serves(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_member_gets_504_after_the_request_timeout() {
    let (r, _ms) = setup("", "request_timeout_ms = 200").await;
    let client = support::client();
    let reply = support::get(&client, &r.url("web", "/slow/1500")).await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{}", reply.body);
    assert!(reply.body.contains("route main"), "{}", reply.body);
    // A 504 is the member's fault, not the client's: the client's connection may stay (hyper's
    // pool reuses it here), and everyone else is served.
    let reply = support::get(&client, &r.url("web", "/")).await;
    assert_eq!((reply.status, reply.body.trim()), (StatusCode::OK, "m1"));
    still_serves(&r).await;
}

// The own HTTP/1 path times a try on the connection's one timer, which also times the wait for
// the next request (a later deadline here): on one keep-alive connection, a slow answer after
// fast ones, and again after a pause, must each end at the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_timeout_holds_on_a_kept_alive_connection() {
    let (r, _ms) = setup("header_read_timeout_ms = 30000", "request_timeout_ms = 300").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    for round in 0..2 {
        for _ in 0..3 {
            let resp = support::raw_request(&mut conn, GET).await;
            assert_eq!(resp.status, 200, "round {round}");
        }
        let started = std::time::Instant::now();
        let slow = "GET /slow/3000 HTTP/1.1\r\nHost: limits.test\r\n\r\n";
        let resp = support::raw_request(&mut conn, slow).await;
        let took = started.elapsed();
        assert_eq!(resp.status, 504, "round {round}: {}", resp.text());
        assert!(took >= Duration::from_millis(250), "round {round}: 504 after {took:?}");
        assert!(took < Duration::from_millis(2000), "round {round}: 504 after {took:?}");
        if resp.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
            conn = support::raw_connect(r.addr("web")).await;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_over_max_connections_gets_503_then_recovers() {
    // A long header timer so the idle connections are not closed under the test.
    let (r, _ms) = setup("max_connections = 2\nheader_read_timeout_ms = 30000", "").await;
    let addr = r.addr("web");
    // Two connections take both slots: one idle from the start, one after a request. The
    // router accepts in arrival order, so the first is counted before the second.
    let first = support::raw_connect(addr).await;
    let mut second = support::raw_connect(addr).await;
    support::raw_send(&mut second, GET.as_bytes()).await;
    let resp = support::read_response(&mut second).await.expect("second is served");
    assert_eq!(resp.status, 200);

    // The third is turned away with 503 and Retry-After, and closed.
    let (reply, closed) = send_and_wait_close(r.addr("web"), GET.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply:?}");
    assert!(has_header(&reply, "retry-after", "1"), "{reply:?}");
    assert!(closed, "the rejected connection stays open");

    // Once the idle one goes, its slot frees (as soon as the router sees the close): a new
    // connection is served. Bounded polling, since the close is noticed asynchronously.
    drop(first);
    let served = served_within(addr, 50).await;
    assert!(served, "no slot freed after a connection closed");
    // The connection that held its slot all along is still served.
    support::raw_send(&mut second, GET.as_bytes()).await;
    let resp = support::read_response(&mut second).await.expect("second still served");
    assert_eq!((resp.status, resp.text().trim()), (200, "m1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_malformed_requests_does_not_stop_the_router() {
    let (r, _ms) = setup("header_read_timeout_ms = 2000", "").await;
    let malformed: [&[u8]; 5] = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"\x00\x01\x02\xff\xfe\xfd\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
    ];
    let addr = r.addr("web");
    let mut replies = Vec::new();
    // 200 connections, 20 at a time.
    for batch in 0..10 {
        let mut set = JoinSet::new();
        for i in 0..20 {
            let bytes = malformed[(batch * 20 + i) % malformed.len()];
            set.spawn(async move {
                let (reply, closed) = send_and_wait_close(addr, bytes).await;
                (bytes, reply, closed)
            });
        }
        while let Some(done) = set.join_next().await {
            replies.push(done.expect("task"));
        }
    }
    assert_eq!(replies.len(), 200);
    for (sent, reply, closed) in &replies {
        let sent = String::from_utf8_lossy(sent);
        assert!(reply.starts_with("HTTP/1.1 400"), "{sent:?} got {reply:?}");
        assert!(closed, "{sent:?}: connection left open");
    }
    still_serves(&r).await;
}
