//! Client connections: [`TimedIo`] (the 503 over a listener's limit, [`Rejecter`], is
//! rondo-runtime's, named here for the accept loops), which enforces
//! the header read timeout and the keep-alive idle timeout on HTTP/1 connections, and the idle
//! timeout on HTTP/2 connections (no open stream for the route's idle timeout, or for the
//! header read timeout before the first request: [`ConnState::idle`] fires and the accept loop
//! shuts the connection down gracefully, with GOAWAY). Frames a client sends do not restart an
//! HTTP/2 idle timer: only streams do.
//!
//! On HTTP/2 connections `TimedIo` also follows the frames both ways ([`crate::frames`]): a
//! frame of a size RFC 9113 forbids, or more stream resets than the listener's budget (the
//! client's `RST_STREAM`s and the router's resets for the client's protocol errors), ends the
//! connection with a GOAWAY of the right code (`FRAME_SIZE_ERROR`, `ENHANCE_YOUR_CALM`), put
//! between two of hyper's frames, then a lingering close. A connection from an address whose
//! standing is [`frames::Standing::Refused`] gets that GOAWAY right after its preface.
//!
//! hyper's own `header_read_timeout` closes the connection silently (and is off unless a timer
//! is configured); a demanding client deserves `408 Request Timeout` when it started a request
//! and stalled, and a quiet close when an idle keep-alive connection times out. `TimedIo` sits
//! under hyper, counts the bytes of each request head as they arrive, and on expiry writes the
//! 408 itself before failing the read.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rondo_runtime::metrics::ListenerMetrics;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::frames::{self, ConnResets, Frames, ResetBudget, Seen};

const WAITING: u8 = 0;
const IN_REQUEST: u8 = 1;
const UPGRADED: u8 = 2;

const RESPONSE_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 53\r\n\r\nrondo: 408 the request header did not arrive in time\n";

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// After an HTTP/2 connection error's GOAWAY, at most this much of what the client still sends
/// is read and dropped (so the close is a FIN, not a reset that could destroy the GOAWAY).
const LINGER_BYTES: usize = 256 * 1024;

/// What the request handler tells the connection about where it is.
#[derive(Debug)]
pub struct ConnState {
    phase: AtomicU8,
    epoch: AtomicU64,
    idle_ms: AtomicU64,
    /// Requests (HTTP/2: streams) begun and not finished.
    open: AtomicU32,
    /// Signalled when an HTTP/2 connection has had no stream for its idle timeout: the accept
    /// loop then shuts it down gracefully (GOAWAY).
    idle: tokio::sync::Notify,
    /// Signalled when an HTTP/2 connection error began (GOAWAY being sent): the accept loop
    /// then bounds how long the connection may take to finish.
    aborted: tokio::sync::Notify,
    /// The reader parked while a request was in progress: when its response ends, hyper does
    /// not poll the socket again by itself, so the idle timer would never start unless we wake it.
    reader: Mutex<Option<Waker>>,
    /// The client's address as `X-Forwarded-For` gives it, made once per connection.
    pub(crate) client_ip: http::HeaderValue,
    /// Whether the listener trusts this client's own `X-Forwarded-For` and `Forwarded`
    /// (`trust_forwarded_for`), decided once per connection.
    pub(crate) forwarded_trusted: bool,
    /// The listener's metrics (timeouts and the 408s written here are counted there).
    pub(crate) metrics: Arc<ListenerMetrics>,
    /// On a TLS listener: what members are told of the client's certificate (`Some` with no
    /// values when it presented none). `None` on a plain listener.
    pub(crate) tls: Option<crate::tls::ClientCert>,
    /// Member connections that carry this client's PROXY header (clusters with
    /// `proxy_protocol`), kept for this connection alone.
    pub(crate) proxied: crate::proxied::PerConn,
}

impl ConnState {
    /// A connection's state; `tls`: what its client's certificate tells members, when the
    /// router terminated its TLS; `addrs`: the client's address and the one it reached.
    pub(crate) fn with_tls(
        idle: Duration,
        (client_ip, forwarded_trusted): (http::HeaderValue, bool),
        metrics: Arc<ListenerMetrics>,
        tls: Option<crate::tls::ClientCert>,
        (client, local): (std::net::SocketAddr, std::net::SocketAddr),
    ) -> Arc<Self> {
        Arc::new(ConnState {
            phase: AtomicU8::new(WAITING),
            epoch: AtomicU64::new(0),
            idle_ms: AtomicU64::new(idle.as_millis() as u64),
            open: AtomicU32::new(0),
            idle: tokio::sync::Notify::new(),
            aborted: tokio::sync::Notify::new(),
            reader: Mutex::new(None),
            client_ip,
            forwarded_trusted,
            metrics,
            tls,
            proxied: crate::proxied::PerConn::new(client, local),
        })
    }

    /// A request head was parsed: no header timer until its response is over.
    pub fn request_started(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
        if self.phase.load(Ordering::Relaxed) != UPGRADED {
            self.phase.store(IN_REQUEST, Ordering::Relaxed);
            self.epoch.fetch_add(1, Ordering::Release);
        }
    }

    /// The response is over: wait for the next request for at most `idle`.
    pub fn response_finished(&self, idle: Duration) {
        let _ = self.open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if self.phase.load(Ordering::Relaxed) != UPGRADED {
            self.idle_ms.store(idle.as_millis() as u64, Ordering::Relaxed);
            self.phase.store(WAITING, Ordering::Relaxed);
            self.epoch.fetch_add(1, Ordering::Release);
            let parked = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = parked {
                w.wake();
            }
        }
    }

    /// The idle timeout that applies once the request in progress ends (its route's).
    pub fn set_idle(&self, idle: Duration) {
        self.idle_ms.store(idle.as_millis() as u64, Ordering::Relaxed);
    }

    /// A request ended without a response (an HTTP/2 stream the client reset, or a request
    /// whose handling was dropped): it no longer holds the connection open, which goes back to
    /// waiting under its last idle timeout.
    pub fn request_abandoned(&self) {
        self.response_finished(Duration::from_millis(self.idle_ms.load(Ordering::Relaxed)));
    }

    fn park_reader(&self, waker: &Waker) {
        let mut slot = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }

    /// Resolves when an HTTP/2 connection has been idle (no stream) for its idle timeout, or
    /// for the header read timeout before its first request.
    pub async fn idle(&self) {
        self.idle.notified().await;
    }

    /// Resolves when an HTTP/2 connection error began (its GOAWAY is being sent).
    pub async fn aborted(&self) {
        self.aborted.notified().await;
    }

    /// The connection switched protocols: no more HTTP timers.
    pub fn upgraded(&self) {
        self.phase.store(UPGRADED, Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::Release);
    }
}

/// Where an HTTP/2 connection error stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Abort {
    /// None.
    None,
    /// GOAWAY with this code to send at the next frame boundary of the write side.
    Pending(u32),
    /// The GOAWAY frame, of which `.1` bytes are out.
    Writing([u8; 17], usize),
    /// GOAWAY sent: shutting the write side down (FIN).
    Closing,
    /// Reading and dropping what the client still sends, at most this many more bytes.
    Draining(usize),
    /// Over: every read and write fails.
    Done,
}

/// The HTTP/2 side of a client connection: frames both ways, resets, a connection error.
#[derive(Debug)]
struct H2Side {
    rx: Frames,
    tx: Frames,
    /// Highest stream the client opened (the GOAWAY's last stream).
    last_stream: u32,
    resets: ConnResets,
    budget: Arc<ResetBudget>,
    peer: IpAddr,
    abort: Abort,
}

/// A client connection's byte stream: plain TCP, or TLS over it (the timers and frame checks of
/// [`TimedIo`] sit above either, on the plaintext).
#[derive(Debug)]
pub enum ClientIo {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS terminated by the router.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl From<TcpStream> for ClientIo {
    fn from(s: TcpStream) -> Self {
        ClientIo::Plain(s)
    }
}

impl From<tokio_rustls::server::TlsStream<TcpStream>> for ClientIo {
    fn from(s: tokio_rustls::server::TlsStream<TcpStream>) -> Self {
        ClientIo::Tls(Box::new(s))
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientIo::Plain(s) => s.is_write_vectored(),
            ClientIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A client stream (plain or TLS) with HTTP/1 header and idle timers, and HTTP/2 frame checks.
pub struct TimedIo {
    inner: ClientIo,
    sleep: Pin<Box<Sleep>>,
    state: Arc<ConnState>,
    seen_epoch: u64,
    armed: bool,
    header_timeout: Duration,
    // Bytes of the current request head received so far.
    received: u64,
    // Unknown until the first bytes; HTTP/2 connections have no HTTP/1 timers.
    h2: Option<bool>,
    // Bytes of the HTTP/2 client preface seen so far.
    preface: usize,
    // HTTP/2 from this client is refused (its address is over its reset budget and kept
    // resetting): GOAWAY `ENHANCE_YOUR_CALM` right after the preface.
    refuse_h2: bool,
    side: H2Side,
    // The idle close was counted (its end of stream is returned again on every read).
    idle_counted: bool,
    // Bytes read from the connection before hyper took it (by the own HTTP/1 path), read first.
    prefix: bytes::Bytes,
    // On HTTP/1: the requests' framing, followed so that chunked bodies meet the own path's
    // rules (set by `following`).
    follow: Option<crate::h1::follow::Follow>,
}

impl std::fmt::Debug for TimedIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedIo").field("received", &self.received).finish_non_exhaustive()
    }
}

impl TimedIo {
    /// Wraps `inner` from `peer`; the first request head must arrive within `header_timeout`;
    /// HTTP/2 stream resets count against `budget`.
    pub fn new(
        inner: impl Into<ClientIo>,
        state: Arc<ConnState>,
        header_timeout: Duration,
        budget: Arc<ResetBudget>,
        peer: IpAddr,
    ) -> Self {
        TimedIo {
            inner: inner.into(),
            sleep: Box::pin(tokio::time::sleep(header_timeout)),
            state,
            seen_epoch: 0,
            armed: !header_timeout.is_zero(),
            header_timeout,
            received: 0,
            h2: None,
            preface: 0,
            refuse_h2: false,
            side: H2Side {
                rx: Frames::default(),
                tx: Frames::default(),
                last_stream: 0,
                resets: ConnResets::default(),
                budget,
                peer,
                abort: Abort::None,
            },
            idle_counted: false,
            prefix: bytes::Bytes::new(),
            follow: None,
        }
    }

    /// The same, following HTTP/1 requests' framing within `limits` (the listener's) so that
    /// a malformed chunked body fails the read ([`crate::h1::follow`]).
    pub fn following(mut self, limits: crate::h1::parse::Limits) -> Self {
        self.follow = Some(crate::h1::follow::Follow::new(limits));
        self
    }

    /// The same, answering an HTTP/2 preface with GOAWAY `ENHANCE_YOUR_CALM` before any
    /// stream ([`frames::Standing::Refused`]); HTTP/1 requests are served as ever.
    pub fn refusing_h2(mut self, refuse: bool) -> Self {
        self.refuse_h2 = refuse;
        self
    }

    /// The same, with `prefix` (bytes already read from the connection) to be read first.
    pub fn with_prefix(mut self, prefix: Vec<u8>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Starts an HTTP/2 connection error with GOAWAY `code` (the first one wins).
    fn start_abort(&mut self, code: u32) {
        if self.side.abort == Abort::None {
            tracing::debug!(peer = %self.side.peer, code, "http/2 connection error, sending GOAWAY");
            self.side.abort = Abort::Pending(code);
            self.state.aborted.notify_one();
        }
    }

    /// Drives a connection error: GOAWAY at a frame boundary, FIN, a bounded lingering read;
    /// then the error hyper gets from every read and write.
    fn poll_abort(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            match self.side.abort {
                Abort::None | Abort::Done => break,
                Abort::Pending(code) => {
                    if !self.side.tx.at_boundary() {
                        // hyper's write of a frame is unfinished: its next write completes the
                        // frame (see `poll_write`), and that write's readiness wakes us.
                        return Poll::Pending;
                    }
                    let frame = frames::goaway(self.side.last_stream, code);
                    self.side.abort = Abort::Writing(frame, 0);
                }
                Abort::Writing(frame, done) => {
                    match Pin::new(&mut self.inner).poll_write(cx, &frame[done..]) {
                        Poll::Ready(Ok(n)) if n > 0 && done + n < frame.len() => {
                            self.side.abort = Abort::Writing(frame, done + n);
                        }
                        Poll::Ready(Ok(n)) if n > 0 => self.side.abort = Abort::Closing,
                        Poll::Ready(_) => self.side.abort = Abort::Done,
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Abort::Closing => {
                    if Pin::new(&mut self.inner).poll_shutdown(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.side.abort = Abort::Draining(LINGER_BYTES);
                }
                Abort::Draining(left) => {
                    let mut scratch = [0u8; 4096];
                    let mut sink = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut self.inner).poll_read(cx, &mut sink) {
                        Poll::Ready(Ok(())) if !sink.filled().is_empty() => {
                            let n = sink.filled().len();
                            self.side.abort =
                                if n >= left { Abort::Done } else { Abort::Draining(left - n) };
                        }
                        Poll::Ready(_) => self.side.abort = Abort::Done,
                        Poll::Pending => return Poll::Pending,
                    }
                }
            }
        }
        Poll::Ready(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "http/2 connection closed with GOAWAY",
        ))
    }

    /// Follows the frames the router wrote: resets of the client's streams for its own errors
    /// count against its budget, and so does a connection error of the client's (h2's GOAWAY
    /// with an error code, as for a WINDOW_UPDATE of 0), as the connection's whole budget.
    fn track_written(&mut self, written: &[u8], cx: &mut Context<'_>) {
        let side = &mut self.side;
        let mut over = false;
        let (resets, budget, peer) = (&mut side.resets, &side.budget, side.peer);
        side.tx.feed(written, true, |seen| {
            let now = std::time::Instant::now();
            over |= match seen {
                Seen::ResetCode(code) if frames::counts_against_client(code) => {
                    resets.note(budget, peer, now)
                }
                Seen::GoawayCode(code) if code != frames::NO_ERROR => {
                    // Which of its streams were still open is a race with their handlers'
                    // ends: the connection's whole budget is the cost, as if it had spent it.
                    resets.note_many(budget, peer, now, budget.limits.max_resets)
                }
                _ => false,
            };
            false
        });
        if over {
            self.start_abort(frames::ENHANCE_YOUR_CALM);
            // Reads and writes go through the error path from now on; make sure one comes.
            cx.waker().wake_by_ref();
        }
    }
}

impl AsyncRead for TimedIo {
    /// A read in named steps: the timers (re-armed when a request began or ended; an expiry
    /// answers 408 or ends an idle connection), the prefix or the socket's bytes, then the
    /// bytes followed: the HTTP/2 preface, HTTP/2 frames or HTTP/1 heads.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.side.abort != Abort::None {
            return this.poll_abort(cx).map(Err);
        }
        this.rearm_on_epoch();
        if let Some(expired) = this.poll_timers(cx) {
            return expired;
        }
        if let Some(e) = this.follow.as_ref().and_then(crate::h1::follow::Follow::refused) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
        }
        let before = buf.filled().len();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
        } else if Pin::new(&mut this.inner).poll_read(cx, buf)?.is_pending() {
            if this.state.phase.load(Ordering::Relaxed) == IN_REQUEST {
                this.state.park_reader(cx.waker());
                // The response may have finished between the phase check and parking: then
                // nobody will wake us, so poll again now.
                if this.state.epoch.load(Ordering::Acquire) != this.seen_epoch {
                    cx.waker().wake_by_ref();
                }
            }
            return Poll::Pending;
        }
        if buf.filled().len() == before {
            return Poll::Ready(Ok(()));
        }
        let frames_from = match this.sniff_preface(buf, before) {
            Ok(from) => from,
            Err(refused) => return refused,
        };
        match this.h2 {
            Some(true) => this.follow_frames(cx, buf, (before, before + frames_from)),
            _ => this.follow_heads(buf, before),
        }
    }
}

impl TimedIo {
    /// A request began or ended since the last read (the connection's epoch moved): the idle
    /// timer is armed while the connection waits for a request (and, on HTTP/2, has no stream).
    fn rearm_on_epoch(&mut self) {
        let epoch = self.state.epoch.load(Ordering::Acquire);
        if epoch == self.seen_epoch {
            return;
        }
        self.seen_epoch = epoch;
        self.received = 0;
        let h2_busy = self.h2 == Some(true) && self.state.open.load(Ordering::Relaxed) > 0;
        match self.state.phase.load(Ordering::Relaxed) {
            WAITING if !h2_busy => {
                let idle = Duration::from_millis(self.state.idle_ms.load(Ordering::Relaxed));
                self.armed = !idle.is_zero();
                self.sleep.as_mut().reset(Instant::now() + idle);
            }
            _ => self.armed = false,
        }
    }

    /// The armed timer, if it expired: on HTTP/2 the accept loop is told (it sends GOAWAY); on
    /// HTTP/1 a started head gets 408 and a failed read, an idle connection a quiet end.
    fn poll_timers(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<()>>> {
        if !self.armed || self.sleep.as_mut().poll(cx).is_pending() {
            return None;
        }
        if self.h2 == Some(true) {
            self.armed = false;
            if self.state.open.load(Ordering::Relaxed) == 0 {
                // No stream for the idle timeout: the accept loop sends GOAWAY and closes.
                self.state.idle.notify_one();
            }
            return None;
        }
        if self.received > 0 {
            self.armed = false;
            // A request was started and stalled: say so, then fail the read so hyper closes.
            self.state.metrics.header_timeouts.inc();
            self.state.metrics.router_response(408, None, None);
            let _ = Pin::new(&mut self.inner).poll_write(cx, RESPONSE_408);
            let _ = Pin::new(&mut self.inner).poll_flush(cx);
            let e = io::Error::new(io::ErrorKind::TimedOut, "request header read timed out");
            return Some(Poll::Ready(Err(e)));
        }
        // Idle keep-alive connection: a quiet end of stream, and it stays ended (the timer
        // stays armed and expired): hyper-util's protocol sniffing consumes the first EOF.
        if !self.idle_counted {
            self.idle_counted = true;
            self.state.metrics.idle_timeouts.inc();
        }
        Some(Poll::Ready(Ok(())))
    }

    /// Follows the HTTP/2 preface in the bytes read from `before` on, until the connection is
    /// known to be HTTP/2 or not: where its frames start in them, or the read's end when the
    /// listener refuses HTTP/2 from this client.
    fn sniff_preface(
        &mut self,
        buf: &mut ReadBuf<'_>,
        before: usize,
    ) -> Result<usize, Poll<io::Result<()>>> {
        if self.h2.is_some() {
            return Ok(0);
        }
        let new = &buf.filled()[before..];
        let n = (H2_PREFACE.len() - self.preface).min(new.len());
        if new[..n] != H2_PREFACE[self.preface..self.preface + n] {
            self.h2 = Some(false);
            return Ok(0);
        }
        self.preface += n;
        if self.preface == H2_PREFACE.len() {
            self.h2 = Some(true);
            if self.refuse_h2 {
                // hyper gets the preface and nothing after it, then the GOAWAY's error.
                buf.set_filled(before + n);
                self.start_abort(frames::ENHANCE_YOUR_CALM);
                return Err(Poll::Ready(Ok(())));
            }
        }
        Ok(n)
    }

    /// Follows the HTTP/2 frames of the read that began at `before`, from `from` on: a frame of
    /// a forbidden size, or a reset over the budget, ends the connection (hyper gets the frames
    /// before it). An HTTP/2 idle timer is not restarted by frames, only by streams.
    fn follow_frames(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        (before, from): (usize, usize),
    ) -> Poll<io::Result<()>> {
        let side = &mut self.side;
        let (resets, budget, peer) = (&mut side.resets, &side.budget, side.peer);
        let last_stream = &mut side.last_stream;
        let mut code = None;
        let stop = side.rx.feed(&buf.filled()[from..], false, |seen| {
            let Seen::Head(h) = seen else { return false };
            if frames::frame_size_error(&h) {
                code = Some(frames::FRAME_SIZE_ERROR);
            } else if h.kind == frames::HEADERS && h.stream % 2 == 1 && h.stream > *last_stream {
                *last_stream = h.stream;
                resets.stream_opened(std::time::Instant::now());
            } else if h.kind == frames::RST_STREAM
                && resets.note(budget, peer, std::time::Instant::now())
            {
                code = Some(frames::ENHANCE_YOUR_CALM);
            }
            code.is_some()
        });
        if let (Some(at), Some(code)) = (stop, code) {
            // hyper gets the frames before the offending one, not that one.
            buf.set_filled(from + at);
            self.start_abort(code);
            if buf.filled().len() == before {
                return self.poll_abort(cx).map(Err);
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Follows the HTTP/1 bytes read from `before` on: the header read timer starts with a
    /// head's first byte, and a malformed head (`follow`) is cut where it goes wrong.
    fn follow_heads(&mut self, buf: &mut ReadBuf<'_>, before: usize) -> Poll<io::Result<()>> {
        let new = buf.filled().len() - before;
        if self.state.phase.load(Ordering::Relaxed) == WAITING {
            if self.received == 0 && !self.header_timeout.is_zero() {
                self.armed = true;
                self.sleep.as_mut().reset(Instant::now() + self.header_timeout);
            }
            self.received += new as u64;
        }
        if let Some(follow) = &mut self.follow
            && let Err((at, e)) = follow.feed(&buf.filled()[before..])
        {
            tracing::debug!(peer = %self.side.peer, "{e}");
            // hyper gets the bytes before the malformed one (the head, so that it answers the
            // request), and the next read fails.
            buf.set_filled(before + at);
            if at == 0 {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut len = buf.len();
        match this.side.abort {
            Abort::None => {}
            // A GOAWAY waits for the frame being written to end: let that much through.
            Abort::Pending(_) if !this.side.tx.at_boundary() => {
                len = len.min(this.side.tx.to_boundary());
            }
            _ => return this.poll_abort(cx).map(Err),
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, &buf[..len]);
        if let Poll::Ready(Ok(n)) = r
            && this.h2 == Some(true)
        {
            this.track_written(&buf[..n], cx);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.side.abort != Abort::None {
            // One slice at a time while a GOAWAY waits for a frame boundary.
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
            return Pin::new(this).poll_write(cx, first);
        }
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = r
            && this.h2 == Some(true)
        {
            for b in bufs {
                if n == 0 {
                    break;
                }
                let k = n.min(b.len());
                this.track_written(&b[..k], cx);
                n -= k;
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

// The 503 of a connection over the listener's limit is the runtime's (a queue listener's intake
// answers with it too); the accept loops name it here.
pub use rondo_runtime::reject::{MAX_REJECTING, Rejecter};

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
