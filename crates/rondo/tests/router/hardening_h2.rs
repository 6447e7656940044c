//! HTTP/2 (h2c) hardening against single hostile clients, with hand-written frames on raw
//! sockets: idle and never-reading clients lose their connection slots in bounded time, stream
//! reset floods (open-then-reset, "made you reset") end in GOAWAY `ENHANCE_YOUR_CALM` with a
//! bounded cost to members, and malformed frame sizes are `FRAME_SIZE_ERROR`s. Also the
//! refusal of connections over `max_connections`, which costs no task each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use rondo::member::Member;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::support::{self, TestRouter};

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

pub(crate) const CANCEL: u32 = 0x8;
const FRAME_SIZE_ERROR: u32 = 0x6;
pub(crate) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Upper bound for any single wait of a test.
const GUARD: Duration = Duration::from_secs(10);

/// One HTTP/2 frame.
pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// An HPACK string literal (no Huffman coding; short strings only).
fn literal(s: &str) -> Vec<u8> {
    assert!(s.len() < 127);
    let mut v = vec![s.len() as u8];
    v.extend(s.as_bytes());
    v
}

/// A HEADERS frame opening `stream` with `method` (2 = GET, 3 = POST: HPACK static indexes
/// 0x82, 0x83) on `path`, with a `content-length` when given.
pub(crate) fn request(
    stream: u32,
    post: bool,
    path: &str,
    content_length: Option<&str>,
    end: bool,
) -> Vec<u8> {
    // :method, :scheme http, then :path and :authority as literals without indexing.
    let mut block = vec![if post { 0x83 } else { 0x82 }, 0x86, 0x04];
    block.extend(literal(path));
    block.push(0x01);
    block.extend(literal("h2.test"));
    if let Some(len) = content_length {
        // content-length is static index 28: 4-bit prefix 15, then 13.
        block.extend([0x0f, 0x0d]);
        block.extend(literal(len));
    }
    let flags = END_HEADERS | if end { END_STREAM } else { 0 };
    frame(HEADERS, flags, stream, &block)
}

/// A raw h2c client: it has sent the preface and an empty SETTINGS frame.
async fn open(addr: SocketAddr) -> (OwnedReadHalf, OwnedWriteHalf) {
    let s = TcpStream::connect(addr).await.expect("connect");
    let (read, mut write) = s.into_split();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    write.write_all(&hello).await.expect("preface");
    (read, write)
}

/// A frame read off the wire: type, flags, stream, payload.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
    pub(crate) payload: Vec<u8>,
}

impl Frame {
    /// A GOAWAY's error code.
    pub(crate) fn goaway_code(&self) -> Option<u32> {
        (self.kind == GOAWAY && self.payload.len() >= 8)
            .then(|| u32::from_be_bytes(self.payload[4..8].try_into().unwrap()))
    }
}

/// The next frame, or `None` when the connection ended (or failed).
pub(crate) async fn next_frame(r: &mut OwnedReadHalf) -> Option<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.ok()?;
    let stream = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
    Some(Frame { kind: head[3], flags: head[4], stream, payload })
}

/// Reads frames until the connection ends or `wait` passes: the GOAWAY codes seen, and whether
/// the connection ended.
async fn goaways_until_closed(r: &mut OwnedReadHalf, wait: Duration) -> (Vec<u32>, bool) {
    let mut codes = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, next_frame(r)).await {
            Ok(Some(f)) => codes.extend(f.goaway_code()),
            Ok(None) => return (codes, true),
            Err(_) => return (codes, false),
        }
    }
}

/// A router over one member `m1` (no delay), listener `web` and route `main`.
async fn setup(listener: &str, route: &str) -> (TestRouter, Vec<Member>) {
    let ms = support::members(1, Duration::ZERO).await;
    let r =
        support::router(&support::web_config(listener, route, &support::member_list(&ms))).await;
    (r, ms)
}

/// Whether a fresh HTTP/1.1 connection is served (200) within `tries` attempts 100 ms apart;
/// 503s from the connection limit are retried.
async fn served_within(addr: SocketAddr, tries: usize) -> bool {
    const GET: &str = "GET / HTTP/1.1\r\nHost: h2.test\r\n\r\n";
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

// Regression: an idle h2c connection got GOAWAY + PING and then the router waited without a
// time limit for the client to acknowledge; clients that never read kept their
// max_connections slots forever and everyone else got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_reading_http2_clients_lose_their_slots_in_bounded_time() {
    let (r, _ms) = setup(
        "max_connections = 3\nheader_read_timeout_ms = 300\nh2_shutdown_timeout_ms = 300",
        "",
    )
    .await;
    let addr = r.addr("web");
    // Three clients take every slot: preface and SETTINGS, then they never read a byte.
    let mut hostile = Vec::new();
    for _ in 0..3 {
        hostile.push(open(addr).await);
    }
    // Idle past the header timer: GOAWAY; no PING ACK within the shutdown timeout: dropped.
    // Bounded polling: 50 tries 100 ms apart.
    assert!(served_within(addr, 50).await, "never-reading h2c clients kept every slot");
    drop(hostile);
}

// Regression: any frame after a response (here the client's SETTINGS ACK, sent late) restarted
// an h2c connection's timer with the header read timeout instead of the route's idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_after_the_response_does_not_shorten_the_http2_idle_timeout() {
    let (r, _ms) = setup("header_read_timeout_ms = 200", "idle_timeout_ms = 3000").await;
    let (mut read, mut write) = open(r.addr("web")).await;
    write.write_all(&request(1, false, "/", None, true)).await.expect("request");
    // Read up to the end of the response.
    let got_response = tokio::time::timeout(GUARD, async {
        while let Some(f) = next_frame(&mut read).await {
            assert_eq!(f.goaway_code(), None, "GOAWAY before the response");
            if f.stream == 1 && f.flags & END_STREAM != 0 {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(got_response.ok(), Some(true), "no complete response");
    // Now the SETTINGS ACK (the client acknowledges the router's settings late).
    write.write_all(&frame(SETTINGS, ACK, 0, &[])).await.expect("settings ack");
    let quiet_since = Instant::now();
    let (early, closed) = goaways_until_closed(&mut read, Duration::from_millis(1500)).await;
    assert!(
        early.is_empty() && !closed,
        "GOAWAY {early:?} (closed: {closed}) {:?} after the SETTINGS ACK, before the 3 s idle timeout",
        quiet_since.elapsed()
    );
    // The idle timeout itself still holds: GOAWAY, then the close (bounded).
    let (later, closed) = goaways_until_closed(&mut read, GUARD).await;
    assert!(!later.is_empty() && closed, "idle h2c connection not closed: {later:?} {closed}");
    assert!(quiet_since.elapsed() >= Duration::from_millis(2500), "{:?}", quiet_since.elapsed());
}

// A stream open at the member keeps the idle timer off; the keepalive PING is what frees the
// slot of a client that vanished without closing (here: one that never reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_keepalive_ping_frees_a_busy_connection() {
    let (r, _ms) = setup(
        "max_connections = 1\nheader_read_timeout_ms = 30000\nh2_keepalive_interval_ms = 200\nh2_keepalive_timeout_ms = 300",
        "request_timeout_ms = 30000",
    )
    .await;
    let addr = r.addr("web");
    let (_read, mut write) = open(addr).await;
    write.write_all(&request(1, false, "/slow/20000", None, true)).await.expect("request");
    // Without PINGs the slot stays taken for the member's 20 s.
    assert!(served_within(addr, 50).await, "a client that answers no PING kept its slot");
}

/// Counts 200s a well-behaved h2c client gets, one GET every 20 ms, until `stop`; any other
/// answer fails the test.
fn normal_client(r: &TestRouter, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let url = r.url("web", "/");
    tokio::spawn(async move {
        let client = support::h2_client();
        let mut served = 0;
        for _ in 0..2000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let reply = support::get(&client, &url).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            served += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        served
    })
}

/// Opens up to 1000 streams on one connection, each made with `open(id)` and followed 1 ms
/// later by `then(id)`, until the router closes the connection: the streams opened, the GOAWAY
/// codes received and whether the connection was closed.
async fn reset_flood(
    addr: SocketAddr,
    open_stream: impl Fn(u32) -> Vec<u8>,
    then: impl Fn(u32) -> Vec<u8>,
) -> (u32, Vec<u32>, bool) {
    let (mut read, mut write) = open(addr).await;
    let reader = tokio::spawn(async move { goaways_until_closed(&mut read, GUARD).await });
    let mut opened = 0u32;
    for i in 0..1000u32 {
        if reader.is_finished() {
            break;
        }
        let id = 2 * i + 1;
        if write.write_all(&open_stream(id)).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        if write.write_all(&then(id)).await.is_err() {
            break;
        }
        opened += 1;
    }
    let (codes, closed) = reader.await.expect("reader");
    (opened, codes, closed)
}

// Regression: streams reset after the router accepted them were not counted by any limit: one
// connection drove tens of thousands of resets, each costing a member request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_flood_gets_goaway_enhance_your_calm() {
    let (r, ms) = setup("h2_max_resets = 20", "").await;
    let stop = Arc::new(AtomicBool::new(false));
    let normal = normal_client(&r, stop.clone());
    // Streams opened and reset by the client 1 ms later.
    let (opened, codes, closed) = reset_flood(
        r.addr("web"),
        |id| request(id, false, "/slow/300", None, true),
        |id| frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let served_normally = normal.await.expect("the normal client was always served");
    assert!(closed, "the resetting connection was not closed after {opened} streams");
    assert_eq!(codes, [ENHANCE_YOUR_CALM], "after {opened} streams");
    assert!(opened < 100, "{opened} streams before the GOAWAY");
    let reached = ms[0].served.load(Ordering::Relaxed);
    assert!(reached <= 60, "{reached} of {opened} reset streams reached the member");
    assert!(served_normally > 0);
    // Everyone else is still served afterwards.
    assert!(served_within(r.addr("web"), 1).await);
}

// "Made you reset": the router resets the stream for the client's own error (2 bytes of DATA
// after content-length 1); h2's own limit did not count these before a connection's 1024th.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_the_router_resets_for_client_errors_count_too() {
    let (r, ms) = setup("h2_max_resets = 20", "").await;
    let (opened, codes, closed) = reset_flood(
        r.addr("web"),
        |id| request(id, true, "/slow/300", Some("1"), false),
        |id| frame(DATA, END_STREAM, id, b"ab"),
    )
    .await;
    assert!(closed, "the connection was not closed after {opened} streams");
    assert_eq!(codes, [ENHANCE_YOUR_CALM], "after {opened} streams");
    assert!(opened < 100, "{opened} streams before the GOAWAY");
    let reached = ms[0].served.load(Ordering::Relaxed);
    assert!(reached <= 60, "{reached} of {opened} reset streams reached the member");
    assert!(served_within(r.addr("web"), 1).await);
}

/// Reads frames until stream `id` ends; a GOAWAY or the connection ending first fails.
async fn read_to_end_of(r: &mut OwnedReadHalf, id: u32, what: &str) {
    let ended = tokio::time::timeout(GUARD, async {
        while let Some(f) = next_frame(r).await {
            assert_eq!(f.goaway_code(), None, "{what}: GOAWAY");
            if f.stream == id && f.flags & END_STREAM != 0 {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ended.ok(), Some(true), "{what}: stream {id} did not end");
}

// The budget is for floods, not for clients that cancel some of their many requests (gRPC
// deadlines, a browser navigating away): resets past the limit end the connection only when
// they are over half of the streams the client opened in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_minority_of_streams_is_not_a_flood() {
    let (r, _ms) = setup("h2_max_resets = 5", "").await;
    let (mut read, mut write) = open(r.addr("web")).await;
    // 30 streams, every third reset while at the member: 10 resets, twice the budget.
    for i in 0..30u32 {
        let id = 2 * i + 1;
        if i % 3 == 0 {
            write.write_all(&request(id, false, "/slow/300", None, true)).await.expect("open");
            tokio::time::sleep(Duration::from_millis(1)).await;
            let rst = frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes());
            write.write_all(&rst).await.expect("reset");
        } else {
            write.write_all(&request(id, false, "/", None, true)).await.expect("open");
            read_to_end_of(&mut read, id, &format!("stream {i}")).await;
        }
    }
    write.write_all(&request(61, false, "/", None, true)).await.expect("open");
    read_to_end_of(&mut read, 61, "after 10 resets of 30 streams").await;
}

// Connections that each stay under the per-connection budget are caught by the budget of their
// client address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_spread_over_connections_count_per_client_address() {
    let (r, _ms) = setup("h2_max_resets = 10\nh2_max_resets_per_address = 25", "").await;
    let addr = r.addr("web");
    let mut conns = Vec::new();
    let mut codes_of = Vec::new();
    for _ in 0..3 {
        let (mut read, mut write) = open(addr).await;
        // 9 resets each: under the connection's budget of 10; 27 in all, over the address's 25.
        for i in 0..9u32 {
            let id = 2 * i + 1;
            if write.write_all(&request(id, false, "/slow/300", None, true)).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            if write.write_all(&frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes())).await.is_err() {
                break;
            }
        }
        let (codes, closed) = goaways_until_closed(&mut read, Duration::from_millis(500)).await;
        codes_of.push((codes, closed));
        conns.push(write);
    }
    assert_eq!(codes_of[0], (vec![], false), "first connection");
    assert_eq!(codes_of[1], (vec![], false), "second connection");
    assert_eq!(codes_of[2], (vec![ENHANCE_YOUR_CALM], true), "third connection");
    // A client that does not reset is not affected by its address's budget.
    assert!(served_within(addr, 1).await);
}

/// Sends `bad` after the preface and asserts the router answers GOAWAY `FRAME_SIZE_ERROR`
/// and closes.
async fn assert_frame_size_error(r: &TestRouter, bad: &[u8], what: &str) {
    let (mut read, mut write) = open(r.addr("web")).await;
    write.write_all(bad).await.expect("write");
    let (codes, closed) = goaways_until_closed(&mut read, GUARD).await;
    assert_eq!(codes, [FRAME_SIZE_ERROR], "{what}");
    assert!(closed, "{what}: connection left open");
}

// Conformance (RFC 9113 §6.5, §6.7): h2 answered these with PROTOCOL_ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_ping_and_settings_ack_are_frame_size_errors() {
    let (r, _ms) = setup("", "").await;
    assert_frame_size_error(&r, &frame(PING, 0, 0, &[0; 6]), "PING of 6 bytes").await;
    assert_frame_size_error(&r, &frame(PING, 0, 0, &[0; 9]), "PING of 9 bytes").await;
    let ack_with_payload = frame(SETTINGS, ACK, 0, &[0, 3, 0, 0, 0, 100]);
    assert_frame_size_error(&r, &ack_with_payload, "SETTINGS ACK with a payload").await;
    // After a good request on the same connection, too: the GOAWAY names the last stream.
    let (mut read, mut write) = open(r.addr("web")).await;
    let mut bytes = request(1, false, "/", None, true);
    bytes.extend(frame(PING, 0, 0, &[0; 6]));
    write.write_all(&bytes).await.expect("write");
    let mut goaway = None;
    while let Ok(Some(f)) = tokio::time::timeout(GUARD, next_frame(&mut read)).await {
        if f.kind == GOAWAY {
            goaway = Some(f);
        }
    }
    let goaway = goaway.expect("GOAWAY");
    assert_eq!(goaway.goaway_code(), Some(FRAME_SIZE_ERROR));
    assert_eq!(&goaway.payload[..4], &1u32.to_be_bytes(), "last stream id");
    // A well-formed PING is answered as ever.
    let (mut read, mut write) = open(r.addr("web")).await;
    write.write_all(&frame(PING, 0, 0, b"12345678")).await.expect("ping");
    let pong = tokio::time::timeout(GUARD, async {
        while let Some(f) = next_frame(&mut read).await {
            if f.kind == PING {
                return Some(f);
            }
        }
        None
    })
    .await
    .expect("PING answered in time")
    .expect("PING answered");
    assert_eq!((pong.flags, pong.payload.as_slice()), (ACK, &b"12345678"[..]));
}

// Regression: a stream the client reset while the router waited on the member dropped the
// request's handling without ending it on the connection, which then counted a stream open
// forever: its idle timer never ran again and the connection kept its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_while_waiting_on_the_member_leaves_the_connection_idle() {
    let (r, ms) = setup(
        "header_read_timeout_ms = 30000",
        "idle_timeout_ms = 500\nrequest_timeout_ms = 30000",
    )
    .await;
    let (mut read, mut write) = open(r.addr("web")).await;
    write.write_all(&request(1, false, "/slow/20000", None, true)).await.expect("request");
    // Reset once the request is at the member.
    for _ in 0..100 {
        if ms[0].served.load(Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ms[0].served.load(Ordering::Relaxed), 1, "the request did not reach the member");
    write.write_all(&frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes())).await.expect("reset");
    // Nothing is open any more: GOAWAY after the route's 500 ms idle timeout, then the close.
    let (codes, closed) = goaways_until_closed(&mut read, GUARD).await;
    assert!(
        codes.contains(&0) && closed,
        "connection kept after its only stream was reset: {codes:?} {closed}"
    );
}

// Refusals over max_connections are answered by one task per listener (no task each): a burst
// of them is still answered (503 with Retry-After) or closed at once, every one is closed,
// and the listener serves again as soon as a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_refused_connections_is_answered_or_closed() {
    let (r, _ms) = setup("max_connections = 1\nheader_read_timeout_ms = 30000", "").await;
    let addr = r.addr("web");
    let holder = TcpStream::connect(addr).await.expect("connect");
    // The holder is accepted before the burst (accepts are in arrival order): give the router
    // a moment to count it, then check that the slot is taken.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (reply, closed) = support::raw_until_closed(addr, b"", GUARD).await;
    assert!(reply.starts_with("HTTP/1.1 503") && closed, "{reply:?} {closed}");
    // 400 refused connections at once, none of which reads until all are open.
    let mut conns = Vec::new();
    for _ in 0..400 {
        conns.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let mut set = tokio::task::JoinSet::new();
    for mut c in conns {
        set.spawn(async move {
            let mut out = Vec::new();
            let ended = tokio::time::timeout(GUARD, c.read_to_end(&mut out)).await;
            (String::from_utf8_lossy(&out).into_owned(), ended.is_ok())
        });
    }
    let mut answered = 0;
    while let Some(done) = set.join_next().await {
        let (reply, ended) = done.expect("reader");
        assert!(ended, "a refused connection was left open");
        if !reply.is_empty() {
            assert!(reply.starts_with("HTTP/1.1 503"), "{reply:?}");
            assert!(reply.contains("Retry-After: 1"), "{reply:?}");
            answered += 1;
        }
    }
    assert!(answered > 0, "no refused connection got its 503");
    drop(holder);
    assert!(served_within(addr, 50).await, "no slot freed after the holder left");
}
