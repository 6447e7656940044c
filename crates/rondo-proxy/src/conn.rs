//! Client connections: the accept loop with its connection limit, and [`TimedIo`], which
//! enforces the header read timeout and the keep-alive idle timeout on HTTP/1 connections, and
//! the idle timeout on HTTP/2 connections (no open stream for the route's idle timeout, or for
//! the header read timeout before the first request: [`ConnState::idle`] fires and the accept
//! loop shuts the connection down gracefully, with GOAWAY).
//!
//! hyper's own `header_read_timeout` closes the connection silently (and is off unless a timer
//! is configured); a demanding client deserves `408 Request Timeout` when it started a request
//! and stalled, and a quiet close when an idle keep-alive connection times out. `TimedIo` sits
//! under hyper, counts the bytes of each request head as they arrive, and on expiry writes the
//! 408 itself before failing the read.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use rondo_runtime::metrics::ListenerMetrics;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

const WAITING: u8 = 0;
const IN_REQUEST: u8 = 1;
const UPGRADED: u8 = 2;

const RESPONSE_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 53\r\n\r\nrondo: 408 the request header did not arrive in time\n";

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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
    /// The reader parked while a request was in progress: when its response ends, hyper does
    /// not poll the socket again by itself, so the idle timer would never start unless we wake it.
    reader: Mutex<Option<Waker>>,
    /// The client's address as `X-Forwarded-For` gives it, made once per connection.
    pub(crate) client_ip: http::HeaderValue,
    /// The listener's metrics (timeouts and the 408s written here are counted there).
    pub(crate) metrics: Arc<ListenerMetrics>,
}

impl ConnState {
    pub(crate) fn new(
        idle: Duration,
        client_ip: http::HeaderValue,
        metrics: Arc<ListenerMetrics>,
    ) -> Arc<Self> {
        Arc::new(ConnState {
            phase: AtomicU8::new(WAITING),
            epoch: AtomicU64::new(0),
            idle_ms: AtomicU64::new(idle.as_millis() as u64),
            open: AtomicU32::new(0),
            idle: tokio::sync::Notify::new(),
            reader: Mutex::new(None),
            client_ip,
            metrics,
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

    /// The connection switched protocols: no more HTTP timers.
    pub fn upgraded(&self) {
        self.phase.store(UPGRADED, Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::Release);
    }
}

pin_project! {
    /// A client TCP stream with HTTP/1 header and idle timers.
    pub struct TimedIo {
        #[pin]
        inner: TcpStream,
        sleep: Pin<Box<Sleep>>,
        state: Arc<ConnState>,
        seen_epoch: u64,
        armed: bool,
        header_timeout: Duration,
        // Bytes of the current request head received so far.
        received: u64,
        // Unknown until the first bytes; HTTP/2 connections have no HTTP/1 timers.
        h2: Option<bool>,
        first: Vec<u8>,
        // The idle close was counted (its end of stream is returned again on every read).
        idle_counted: bool,
    }
}

impl std::fmt::Debug for TimedIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedIo").field("received", &self.received).finish_non_exhaustive()
    }
}

impl TimedIo {
    /// Wraps `inner`; the first request head must arrive within `header_timeout`.
    pub fn new(inner: TcpStream, state: Arc<ConnState>, header_timeout: Duration) -> Self {
        TimedIo {
            inner,
            sleep: Box::pin(tokio::time::sleep(header_timeout)),
            state,
            seen_epoch: 0,
            armed: !header_timeout.is_zero(),
            header_timeout,
            received: 0,
            h2: None,
            first: Vec::new(),
            idle_counted: false,
        }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut this = self.project();
        let epoch = this.state.epoch.load(Ordering::Acquire);
        if epoch != *this.seen_epoch {
            *this.seen_epoch = epoch;
            *this.received = 0;
            let h2_busy = *this.h2 == Some(true) && this.state.open.load(Ordering::Relaxed) > 0;
            match this.state.phase.load(Ordering::Relaxed) {
                WAITING if !h2_busy => {
                    let idle = Duration::from_millis(this.state.idle_ms.load(Ordering::Relaxed));
                    *this.armed = !idle.is_zero();
                    this.sleep.as_mut().reset(Instant::now() + idle);
                }
                _ => *this.armed = false,
            }
        }
        if *this.armed && *this.h2 == Some(true) && this.sleep.as_mut().poll(cx).is_ready() {
            *this.armed = false;
            if this.state.open.load(Ordering::Relaxed) == 0 {
                // No stream for the idle timeout: the accept loop sends GOAWAY and closes.
                this.state.idle.notify_one();
            }
        }
        if *this.armed && *this.h2 != Some(true) && this.sleep.as_mut().poll(cx).is_ready() {
            if *this.received > 0 {
                *this.armed = false;
                // A request was started and stalled: say so, then fail the read so hyper closes.
                this.state.metrics.header_timeouts.inc();
                this.state.metrics.router_response(408, None, None);
                let _ = this.inner.as_mut().poll_write(cx, RESPONSE_408);
                let _ = this.inner.as_mut().poll_flush(cx);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request header read timed out",
                )));
            }
            // Idle keep-alive connection: a quiet end of stream, and it stays ended (the timer
            // stays armed and expired): hyper-util's protocol sniffing consumes the first EOF.
            if !*this.idle_counted {
                *this.idle_counted = true;
                this.state.metrics.idle_timeouts.inc();
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        if this.inner.as_mut().poll_read(cx, buf)?.is_pending() {
            if this.state.phase.load(Ordering::Relaxed) == IN_REQUEST {
                this.state.park_reader(cx.waker());
                // The response may have finished between the phase check and parking: then
                // nobody will wake us, so poll again now.
                if this.state.epoch.load(Ordering::Acquire) != *this.seen_epoch {
                    cx.waker().wake_by_ref();
                }
            }
            return Poll::Pending;
        }
        let new = &buf.filled()[before..];
        if !new.is_empty() {
            if this.h2.is_none() {
                this.first.extend_from_slice(&new[..new.len().min(H2_PREFACE.len())]);
                let n = this.first.len().min(H2_PREFACE.len());
                if this.first[..n] != H2_PREFACE[..n] {
                    *this.h2 = Some(false);
                } else if n == H2_PREFACE.len() {
                    *this.h2 = Some(true);
                }
            }
            if this.state.phase.load(Ordering::Relaxed) == WAITING {
                if *this.received == 0 && !this.header_timeout.is_zero() {
                    *this.armed = true;
                    this.sleep.as_mut().reset(Instant::now() + *this.header_timeout);
                }
                *this.received += new.len() as u64;
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
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Answers a connection over the listener's limit with a 503 and closes it.
pub(crate) async fn reject_over_limit(mut stream: TcpStream, listener: &str, limit: u32) {
    use tokio::io::AsyncWriteExt;
    let body = format!(
        "rondo: 503 listener {listener} is at its limit of {limit} client connections; retry shortly\n"
    );
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(resp.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
