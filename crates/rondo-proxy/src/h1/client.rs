//! What the own path's stages share about the client: its connection between requests
//! ([`Client`]) and what happens to it after a request ([`Next`]), its byte stream, plain TCP or
//! TLS ([`ClientStream`]), where a request's body stands ([`ReqBody`]), and a wait bounded by
//! the connection's one timer ([`wait_before`]). Below the connection loop (`conn.rs`), the
//! tries (`tries.rs`) and the pumps (`pump.rs`), which all use it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

use super::chunked::Chunked;
use super::parse::Framing;

/// What a connection does after a request.
pub(crate) enum Next {
    /// Waits for the next request.
    KeepAlive,
    /// Closes.
    Close,
    /// Hands the connection, with these bytes already read from it, to hyper.
    Decline(Vec<u8>),
}

/// A client connection between requests: its socket and what it costs while idle.
pub(super) struct Client<S> {
    pub(super) stream: S,
    pub(super) peer: SocketAddr,
    /// On a TLS listener, what members are told of the client's certificate (boxed: a plain
    /// connection, idle, does not carry its room).
    pub(super) tls: Option<Box<crate::tls::ClientCert>>,
    /// Bytes read past the last request (a pipelined request's start), if any.
    pub(super) carry: Option<Vec<u8>>,
    /// How long to wait for the next request.
    pub(super) idle: Duration,
    /// The client's address as text (`X-Forwarded-For`), made once.
    pub(super) ip: IpText,
    /// Whether the listener trusts this client's own `X-Forwarded-For` and `Forwarded`
    /// (`trust_forwarded_for`), decided once.
    pub(super) trusted: bool,
    /// When the connection was accepted, and the requests it has carried (the listener's
    /// `max_connection_age_ms` and `max_requests_per_connection`).
    pub(super) born: tokio::time::Instant,
    pub(super) served: u64,
    /// The address the client reached (a PROXY header's destination towards members).
    pub(super) local: SocketAddr,
    /// The member connection kept for this client alone (a cluster with `proxy_protocol`).
    pub(super) proxied: crate::proxied::Kept,
}

impl<S> Client<S> {
    /// Whether the listener's limits end the connection after the request in progress.
    pub(super) fn spent(&self, limits: &rondo_core::ConnectionLimits) -> bool {
        limits.max_requests.is_some_and(|n| self.served >= n)
            || limits.max_age.is_some_and(|age| self.born.elapsed() >= age)
    }
}

/// An IP address as text, inline (an IPv6 address has at most 39 characters; 45 with an
/// embedded IPv4 address).
pub(super) struct IpText {
    text: [u8; 45],
    len: u8,
}

impl IpText {
    pub(super) fn new(ip: std::net::IpAddr) -> Self {
        use std::io::Write as _;
        let mut text = [0u8; 45];
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        let _ = write!(cursor, "{ip}");
        let len = cursor.position() as u8;
        IpText { text, len }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.text[..self.len as usize]
    }
}

/// Where a request's body stands.
#[derive(Debug)]
pub(super) struct ReqBody {
    pub(super) framing: Framing,
    /// Body bytes in the buffer right after the head.
    pub(super) in_buf: usize,
    /// Whether the whole body is in the buffer (a try can always send it again).
    pub(super) complete: bool,
    /// A try began reading the rest of the body from the client: no other try can send it.
    pub(super) touched: bool,
    /// Content-length bytes still to come from the client.
    pub(super) remaining: u64,
    /// The chunked framing, past the bytes in the buffer.
    pub(super) chunked: Option<Chunked>,
    /// Body bytes received in all.
    pub(super) received: u64,
}

/// `wait` if it ends before `end`, else `None`; `timer` is the connection's. A `Timeout` per
/// wait put a timer into tokio's wheel and took it out again for every request (and woke the
/// driver through its eventfd when it was the earliest). So the timer is moved only to an
/// earlier end; one that fires before its wait's `end` (it was set for an earlier wait or
/// try) is set again to `end` then: about once per timeout's length of traffic, not once per
/// request. Meanwhile it may wake the connection's task during a request, for nothing, as
/// rarely.
///
/// `wait` is pinned by the caller: moved in, it took its room twice in the connection's future
/// (as the argument and as the pinned local).
pub(super) async fn wait_before<F: Future>(
    mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
    end: tokio::time::Instant,
    mut wait: std::pin::Pin<&mut F>,
) -> Option<F::Output> {
    if timer.deadline() > end {
        timer.as_mut().reset(end);
    }
    loop {
        tokio::select! {
            biased;
            r = &mut wait => return Some(r),
            () = timer.as_mut() => {}
        }
        if timer.deadline() >= end {
            return None;
        }
        timer.as_mut().reset(end);
    }
}

/// A client connection's byte stream as the own path needs it: plain TCP, or TLS over it.
pub(crate) trait ClientStream:
    AsyncRead + AsyncWrite + Unpin + Send + Sync + crate::splice::PlainTcp
{
    /// Ready when a read would make progress, without holding a buffer meanwhile (a poll, for
    /// the idle wait that polls it by hand beside the drain and the timer).
    fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>>;

    /// Resolves when the client has closed its side; never while it only sends more (a
    /// pipelined request, left for later).
    fn closed(&self) -> impl Future<Output = ()> + Send;

    /// Resolves when the socket under the client has anything new to read, a close included;
    /// waiting costs no system call.
    fn stirs(&self) -> impl Future<Output = ()> + Send;

    /// Reads what has arrived into `buf` without waiting (`WouldBlock` when nothing has).
    fn read_ready(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut read = std::pin::pin!(self.read_buf(buf));
        match read.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// Resolves when the TCP peer closed (a read of 0), never while it has bytes to read.
async fn tcp_closed(stream: &TcpStream) {
    let mut probe = [0u8; 1];
    match stream.peek(&mut probe).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// Resolves when `tcp` has something to read (or is closed, or failed). Through tokio's
/// `poll_read_ready`, not `readable()`: `readable()` puts a waiter into the socket's list under
/// its lock and takes it out again under the lock when dropped, twice per request (the wait for
/// the next request, the watch on the client while the member thinks); `poll_read_ready` keeps
/// one waker in the socket's reader slot, which nothing else uses while these wait (the client
/// is not read meanwhile).
async fn tcp_read_ready(tcp: &TcpStream) -> std::io::Result<()> {
    std::future::poll_fn(|cx| tcp.poll_read_ready(cx)).await
}

impl ClientStream for TcpStream {
    fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        self.poll_read_ready(cx)
    }

    async fn closed(&self) {
        tcp_closed(self).await;
    }

    async fn stirs(&self) {
        let _ = tcp_read_ready(self).await;
    }

    // `read_ready` is the trait's, through tokio's `poll_read` and not `try_read_buf`: a read
    // that leaves the buffer part empty has drained the socket, and only `poll_read` then
    // forgets the readiness. With `try_read_buf` the next wait for a request found the socket
    // "ready" and made a read that returned `EAGAIN`, one per request on a keep-alive
    // connection.
}

impl ClientStream for tokio_rustls::server::TlsStream<TcpStream> {
    fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let (tcp, tls) = self.get_ref();
        // Plaintext rustls already holds is ready now; else the socket must bring more.
        if tls.wants_read() { tcp.poll_read_ready(cx) } else { std::task::Poll::Ready(Ok(())) }
    }

    async fn closed(&self) {
        tcp_closed(self.get_ref().0).await;
    }

    async fn stirs(&self) {
        let _ = tcp_read_ready(self.get_ref().0).await;
    }
}
