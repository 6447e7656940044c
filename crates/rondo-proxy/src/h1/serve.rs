//! One client connection on the own HTTP/1 path: wait for a request without a buffer, read
//! its head into a borrowed one, run the shared stages (route, the failover loop of
//! [`crate::http::forward`]) with an [`OwnTries`] that writes the edited head straight to a
//! pooled member connection in this task, streams the body both ways, and gives the buffers
//! back when the response is over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use rondo_core::failover::is_idempotent_method;
use rondo_core::{Failover, FailureKind, Outcome, Route, UpstreamProtocol};
use rondo_runtime::{ClusterRt, Snapshot, clock};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::chunked::{ChunkError, Chunked};
use super::parse::{self, Field, Framing, HeadError, Limits, RequestHead, ResponseHead};
use super::pool::{self, Idle};
use crate::access::{self, Reason};
use crate::auth::{self, Identity, LOGIN_HEADER};
use crate::body::Finish;
use crate::error::Kind;
use crate::head::Headers;
use crate::headers::{has_looped, via_id};
use crate::http::{
    Begun, Choice, ClusterView, Decided, Failure, HttpCtx, Target, Tries, find_route, forward,
    looped, needs_hyper, on_route,
};

/// While a member has not answered for this long, the router watches whether the client went
/// away (a request it abandoned is ended on its member, not left counted in flight).
const WATCH_CLIENT_AFTER: Duration = Duration::from_millis(50);
/// Body bytes that arrived with a response head are sent with it in one write up to this many.
const COALESCE: usize = 16 * 1024;
/// A response head from a member larger than this is refused (502).
pub(super) const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// How long a member connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// After the router closes a connection, at most this much of what the client still sends is
/// read and dropped, for at most [`LINGER_FOR`], so the close is a FIN and not a reset that
/// could destroy the response.
const LINGER_BYTES: usize = 256 * 1024;
const LINGER_FOR: Duration = Duration::from_secs(1);

const RESPONSE_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 53\r\n\r\nrondo: 408 the request header did not arrive in time\n";

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
struct Client<S> {
    stream: S,
    peer: SocketAddr,
    /// On a TLS listener, what members are told of the client's certificate.
    tls: Option<crate::tls::ClientCert>,
    /// Bytes read past the last request (a pipelined request's start), if any.
    carry: Option<Vec<u8>>,
    /// How long to wait for the next request.
    idle: Duration,
    /// The client's address as text (`X-Forwarded-For`), made once.
    ip: IpText,
    /// When the connection was accepted, and the requests it has carried (the listener's
    /// `max_connection_age_ms` and `max_requests_per_connection`).
    born: tokio::time::Instant,
    served: u64,
}

impl<S> Client<S> {
    /// Whether the listener's limits end the connection after the request in progress.
    fn spent(&self, limits: &rondo_core::ConnectionLimits) -> bool {
        limits.max_requests.is_some_and(|n| self.served >= n)
            || limits.max_age.is_some_and(|age| self.born.elapsed() >= age)
    }
}

/// An IP address as text, inline (an IPv6 address has at most 39 characters; 45 with an
/// embedded IPv4 address).
struct IpText {
    text: [u8; 45],
    len: u8,
}

impl IpText {
    fn new(ip: std::net::IpAddr) -> Self {
        use std::io::Write as _;
        let mut text = [0u8; 45];
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        let _ = write!(cursor, "{ip}");
        let len = cursor.position() as u8;
        IpText { text, len }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.text[..self.len as usize]
    }
}

/// Serves `stream` until it closes, or until a request this path declines: then the
/// connection and the bytes already read from it are returned, for hyper.
pub(crate) async fn serve<S: ClientStream>(
    ctx: &Arc<HttpCtx>,
    stream: S,
    peer: SocketAddr,
    tls: Option<crate::tls::ClientCert>,
) -> Option<(S, Option<crate::tls::ClientCert>, Vec<u8>)> {
    let idle = ctx.listener.header_read_timeout;
    let ip = IpText::new(peer.ip());
    let born = tokio::time::Instant::now();
    let mut c = Client { stream, peer, tls, carry: None, idle, ip, born, served: 0 };
    // The listener's `max_connection_age_ms`: the wait for the next request ends there too.
    let aged_at = ctx.listener.connections.max_age.map(|age| born + age);
    // When the wait for the next request ends (set as it begins).
    let mut wait_until = None;
    // The connection's one timer, for each wait for a request and each try: see
    // `wait_before`. Set in the past, it is moved to the first deadline when first used.
    let timer = tokio::time::sleep_until(born);
    tokio::pin!(timer);
    // The process's drain, heard by one waiter for all of the connection's waits.
    let drain = &ctx.live.drain;
    let drained = drain.notified();
    tokio::pin!(drained);
    loop {
        if c.carry.is_none() {
            // No buffer while waiting: only the socket's readiness, or the process's drain,
            // which closes a connection that stays idle for `DRAIN_IDLE_GRACE` after it began
            // (a request that comes sooner is served, with `Connection: close`).
            let ready = async {
                tokio::select! {
                    biased;
                    r = c.stream.ready() => Some(r),
                    () = async {
                        if !drain.is_on() {
                            drained.as_mut().await;
                        }
                        // Boxed: made only when the process drains, it takes no room in every
                        // idle connection's future (which holds the connection's timer).
                        Box::pin(tokio::time::sleep(crate::DRAIN_IDLE_GRACE)).await;
                    } => None,
                }
            };
            let idle_until = (!c.idle.is_zero())
                .then(|| *wait_until.get_or_insert_with(|| tokio::time::Instant::now() + c.idle));
            let end = match (idle_until, aged_at) {
                (None, None) => None,
                (Some(t), None) | (None, Some(t)) => Some(t),
                (Some(a), Some(b)) => Some(a.min(b)),
            };
            let ready = match end {
                None => Some(ready.await),
                Some(end) => wait_before(timer.as_mut(), end, std::pin::pin!(ready)).await,
            };
            match ready {
                Some(Some(Ok(()))) => {}
                Some(Some(Err(_))) => return None,
                Some(None) => {
                    Box::pin(linger(&mut c.stream)).await;
                    return None;
                }
                None if aged_at.is_some_and(|t| t <= tokio::time::Instant::now()) => {
                    // Old enough: closed between requests, so that the client reconnects.
                    Box::pin(linger(&mut c.stream)).await;
                    return None;
                }
                None => {
                    ctx.metrics.idle_timeouts.inc();
                    return None;
                }
            }
            // Readiness can be a false positive (tokio says so; a fresh or just-read socket
            // often is one): a buffer is borrowed only for bytes that are there.
            let mut buf = pool::take();
            match c.stream.read_ready(&mut buf) {
                Ok(n) if n > 0 => c.carry = Some(buf),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    pool::give(buf);
                    continue;
                }
                _ => {
                    // The client closed (or its connection failed) between requests.
                    pool::give(buf);
                    return None;
                }
            }
        }
        wait_until = None;
        // Boxed: the request's state exists only while a request is in flight.
        match Box::pin(request(ctx, &mut c, timer.as_mut())).await {
            Next::KeepAlive => {}
            Next::Close => {
                // Boxed, as the request is: an idle connection's task carries neither.
                Box::pin(linger(&mut c.stream)).await;
                return None;
            }
            Next::Decline(bytes) => return Some((c.stream, c.tls, bytes)),
        }
    }
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
async fn wait_before<F: Future>(
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

/// Closes the write side, then reads and drops what the client still sends, bounded.
async fn linger<S: ClientStream>(stream: &mut S) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut scratch = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_FOR, drain).await;
}

/// A client connection's byte stream as the own path needs it: plain TCP, or TLS over it.
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + Sync {
    /// Resolves when a read would make progress, without holding a buffer meanwhile.
    fn ready(&self) -> impl Future<Output = std::io::Result<()>> + Send;

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
    async fn ready(&self) -> std::io::Result<()> {
        tcp_read_ready(self).await
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
    async fn ready(&self) -> std::io::Result<()> {
        let (tcp, tls) = self.get_ref();
        // Plaintext rustls already holds is ready now; else the socket must bring more.
        if tls.wants_read() { tcp_read_ready(tcp).await } else { Ok(()) }
    }

    async fn closed(&self) {
        tcp_closed(self.get_ref().0).await;
    }

    async fn stirs(&self) {
        let _ = tcp_read_ready(self.get_ref().0).await;
    }
}

/// A parsed request head over its buffer: the stages' view of its header fields.
struct OwnHead<'a> {
    buf: &'a [u8],
    fields: &'a [Field],
}

impl Headers for OwnHead<'_> {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |f| f.name.get(self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(self.buf))
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.name.get(self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(self.buf))
    }
}

/// Reads more of the connection into `buf` (growing it when full).
async fn read_more<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(pool::BUF_SIZE);
    }
    stream.read_buf(buf).await
}

/// One request: its head read and checked, then routed and forwarded (or answered by the
/// router itself, or declined to hyper).
async fn request<S: ClientStream>(
    ctx: &Arc<HttpCtx>,
    c: &mut Client<S>,
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
) -> Next {
    let mut buf = c.carry.take().unwrap_or_else(pool::take);
    let listener = &ctx.listener;
    let limits = Limits {
        max_bytes: listener.max_header_bytes as usize,
        max_fields: listener.max_headers as usize,
    };
    let header_timeout = listener.header_read_timeout;
    // Set when the head is first waited for.
    let mut deadline = None;
    let mut scan = parse::HeadScan::default();
    let head = loop {
        if parse::is_h2_preface(&buf) {
            if buf.len() >= 24 {
                ctx.metrics.handoffs[0].inc();
                pool::disown();
                return Next::Decline(buf);
            }
        } else if !buf.is_empty() {
            match scan.request(&buf, limits) {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(e) => {
                    pool::give(buf);
                    refuse_head(ctx, c, e).await;
                    return Next::Close;
                }
            }
        }
        // What has arrived already needs no timer (the usual case: the whole head is there).
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(pool::BUF_SIZE);
        }
        let read = match c.stream.read_ready(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let read = read_more(&mut c.stream, &mut buf);
                if header_timeout.is_zero() {
                    Ok(read.await)
                } else {
                    let now = tokio::time::Instant::now();
                    let d = *deadline.get_or_insert(now + header_timeout);
                    tokio::time::timeout_at(d, read).await
                }
            }
            done => Ok(done),
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => {
                // The client closed (or failed) before a whole head: nothing to answer.
                pool::give(buf);
                return Next::Close;
            }
            Err(_) if buf.is_empty() => {
                ctx.metrics.idle_timeouts.inc();
                pool::give(buf);
                return Next::Close;
            }
            Err(_) => {
                // A request was started and stalled: say so, then close.
                ctx.metrics.header_timeouts.inc();
                ctx.metrics.router_response(408, None, None);
                let _ = c.stream.write_all(RESPONSE_408).await;
                pool::give(buf);
                return Next::Close;
            }
        }
    };
    if let Some(why) = head.decline {
        tracing::trace!(listener = %listener.name, ?why, "request declined to hyper");
        let reason = match why {
            parse::Decline::Http10 => 1,
            parse::Decline::TargetForm => 2,
            parse::Decline::Upgrade => 3,
        };
        ctx.metrics.handoffs[reason].inc();
        pool::disown();
        return Next::Decline(buf);
    }
    let snapshot = ctx.live.load();
    let mut req = OwnTries::new(ctx, c, timer, buf, head);
    let next = req.serve(&snapshot).await;
    let OwnTries { buf, head, body, extra, out, .. } = req;
    pool::give(out);
    match next {
        Next::KeepAlive => {
            // What follows this request in the buffer (a pipelined request) is kept for the next.
            let consumed = head.len + body.in_buf;
            let mut buf = buf;
            if buf.len() > consumed || !extra.is_empty() {
                buf.drain(..consumed);
                buf.extend_from_slice(&extra);
                c.carry = Some(buf);
            } else {
                pool::give(buf);
            }
            Next::KeepAlive
        }
        // The buffer went with the connection (and was disowned).
        decline @ Next::Decline(_) => decline,
        Next::Close => {
            pool::give(buf);
            Next::Close
        }
    }
}

/// A head that cannot be served: its status, a sentence, and the connection closed.
async fn refuse_head<S: ClientStream>(ctx: &HttpCtx, c: &mut Client<S>, e: HeadError) {
    ctx.metrics.router_response(e.status, None, None);
    let body = format!("rondo: {} {}\n", e.status, e.why);
    let mut out = Vec::with_capacity(256 + body.len());
    local_head(&mut out, e.status, body.len(), &[], true);
    out.extend_from_slice(body.as_bytes());
    let _ = c.stream.write_all(&out).await;
}

/// The head of a response the router makes itself.
fn local_head(out: &mut Vec<u8>, status: u16, len: usize, extra: &[&str], close: bool) {
    use std::io::Write as _;
    let reason =
        http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    let _ = write!(
        out,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {len}\r\ndate: {}\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    for h in extra {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Where a request's body stands.
#[derive(Debug)]
struct ReqBody {
    framing: Framing,
    /// Body bytes in the buffer right after the head.
    in_buf: usize,
    /// Whether the whole body is in the buffer (a try can always send it again).
    complete: bool,
    /// A try began reading the rest of the body from the client: no other try can send it.
    touched: bool,
    /// Content-length bytes still to come from the client.
    remaining: u64,
    /// The chunked framing, past the bytes in the buffer.
    chunked: Option<Chunked>,
    /// Body bytes received in all.
    received: u64,
}

/// A request on the own path, with what its tries need.
struct OwnTries<'a, S> {
    ctx: &'a Arc<HttpCtx>,
    c: &'a mut Client<S>,
    /// The connection's timer, for the tries' timeouts (taken while a try runs).
    timer: Option<std::pin::Pin<&'a mut tokio::time::Sleep>>,
    buf: Vec<u8>,
    head: RequestHead,
    body: ReqBody,
    /// The head (and a body wholly in the buffer) as members get it.
    out: Vec<u8>,
    /// Bytes read from the client past the end of the body (the next request's start).
    extra: Vec<u8>,
    route: Option<&'a Route>,
    start: Option<access::Start>,
    /// Whether the connection must close after this request.
    close: bool,
    /// The client closed its connection while its request was in flight.
    gone: bool,
    /// Whether the method is idempotent (a pooled connection found closed may be replaced).
    idempotent: bool,
    /// The request target with its path normalized, when that changed it (members get this).
    target: Option<String>,
    /// The `Host` value without its port (members get it as `X-Forwarded-Host`).
    host: parse::Span,
}

impl<'a, S: ClientStream> OwnTries<'a, S> {
    fn new(
        ctx: &'a Arc<HttpCtx>,
        c: &'a mut Client<S>,
        timer: std::pin::Pin<&'a mut tokio::time::Sleep>,
        buf: Vec<u8>,
        head: RequestHead,
    ) -> Self {
        let body = ReqBody {
            framing: head.framing,
            in_buf: 0,
            complete: true,
            touched: false,
            remaining: 0,
            chunked: None,
            received: 0,
        };
        let start = ctx.access.as_ref().map(|_| {
            let method = std::str::from_utf8(head.method.get(&buf)).unwrap_or("");
            let target = std::str::from_utf8(head.target.get(&buf)).unwrap_or("/");
            access::Start::from_head(c.peer, method, target)
        });
        c.served += 1;
        let close = head.close || c.spent(&ctx.listener.connections);
        OwnTries {
            ctx,
            c,
            timer: Some(timer),
            buf,
            head,
            body,
            out: pool::take(),
            extra: Vec::new(),
            route: None,
            target: None,
            host: parse::Span::default(),
            start,
            close,
            gone: false,
            idempotent: false,
        }
    }

    /// The stages, then the response the client gets.
    async fn serve(&mut self, snapshot: &'a Snapshot) -> Next {
        match self.stages(snapshot).await {
            Ok(next) => next,
            Err(Decline) => {
                pool::disown();
                Next::Decline(std::mem::take(&mut self.buf))
            }
        }
    }

    async fn stages(&mut self, snapshot: &'a Snapshot) -> Result<Next, Decline> {
        // The request line and the host are made text once each (the method and the target
        // are parts of the line, the path is the target's start, the host without its port is
        // kept for the head members get): every conversion checks its UTF-8 again.
        let buf = &self.buf;
        let (method, target) = request_line(buf, &self.head);
        self.idempotent = is_idempotent_method(method);
        let path_len = (self.head.path.end - self.head.path.start) as usize;
        let path = target.get(..path_len).unwrap_or(target);
        // Routes match, and members get, the normalized path (`/%6Frders` is `/orders`).
        self.target = rondo_core::path::normalize(path).map(|path| match target.split_once('?') {
            Some((_, query)) => format!("{path}?{query}"),
            None => path,
        });
        let host = without_port(text(buf, self.head.host));
        self.host = parse::Span {
            start: self.head.host.start,
            end: self.head.host.start + host.len() as u32,
        };
        let headers = OwnHead { buf: &self.buf, fields: &self.head.fields };
        let found = if has_looped(&headers) {
            Err(looped())
        } else {
            let target = self.target.as_deref().unwrap_or(target);
            let (path, query) = match target.split_once('?') {
                Some((path, query)) => (path, Some(query)),
                None => (target, None),
            };
            let target = Target { host: Some(host), method, path, query };
            // A body that came whole with the head is there for body filters to read; any
            // other body makes a route that reads it hyper's (which reads it before routing).
            let after = &self.buf[self.head.len..];
            let body = match self.head.framing {
                Framing::None | Framing::Length(0) => Some(&after[..0]),
                Framing::Length(n) => usize::try_from(n).ok().and_then(|n| after.get(..n)),
                _ => None,
            };
            let body = body.map(|bytes| rondo_core::BodyPeek { bytes, complete: true });
            find_route(self.ctx, snapshot, &headers, target, body)
        };
        let route = match found {
            Ok(Decided::Route(routed)) if !needs_hyper(&routed) => routed.route,
            // Body filters, multicast copies and session replay are hyper's path's.
            Ok(_) => {
                self.ctx.metrics.handoffs[5].inc();
                return Err(Decline);
            }
            Err(failure) => return Ok(self.fail(failure).await),
        };
        self.route = Some(route);
        // Members spoken to over TLS or HTTP/2 are hyper's: the whole connection goes there
        // before anything is sent.
        let plain = |name: &String| {
            snapshot.clusters.get(name).is_none_or(|rt| {
                rt.tls.is_none() && rt.spec.upstream_protocol != UpstreamProtocol::Http2
            })
        };
        if !plain(&route.cluster) || !route.backups.iter().all(plain) {
            self.ctx.metrics.handoffs[4].inc();
            return Err(Decline);
        }
        self.c.idle = route.idle_timeout;
        // Sign-on: a route with `auth` forwards only a request whose token holds.
        let headers = OwnHead { buf: &self.buf, fields: &self.head.fields };
        let gate = self.ctx.auth.gate(route, &self.ctx.live, &headers);
        let identity = match gate {
            Ok(identity) => identity,
            Err(e) => {
                let e = crate::error::ProxyError::unauthorized(e, &route.name, &route.cluster);
                return Ok(self.fail((e, route.idle_timeout)).await);
            }
        };
        if let Err(failure) = self.prepare(route, identity.as_ref()) {
            return Ok(self.fail(failure).await);
        }
        let idempotent = self.idempotent;
        let peer = self.c.peer;
        Ok(match forward(self.ctx, snapshot, peer, route, idempotent, self).await {
            Ok(next) => next,
            // Nobody is left to answer.
            Err(_) if self.gone => Next::Close,
            Err(failure) => self.fail(failure).await,
        })
    }

    /// The body limit and the body's start; the head as members get it.
    fn prepare(&mut self, route: &Route, identity: Option<&Identity>) -> Result<(), Failure> {
        let limit = self.ctx.listener.max_body_bytes;
        let after = &self.buf[self.head.len..];
        match self.body.framing {
            Framing::Length(n) => {
                if limit > 0 && n > limit {
                    self.close = true;
                    let detail = format!("request body over the limit of {limit} bytes");
                    return Err(on_route(route, Kind::BodyTooLarge, detail));
                }
                let have = (after.len() as u64).min(n);
                self.body.in_buf = have as usize;
                self.body.remaining = n - have;
                self.body.complete = self.body.remaining == 0;
            }
            Framing::Chunked => {
                let mut chunked = Chunked::new(self.ctx.listener.max_header_bytes as usize);
                match chunked.feed(after) {
                    Ok(n) => self.body.in_buf = n,
                    Err(e) => {
                        self.close = true;
                        return Err(on_route(route, Kind::ClientBody, e.to_string()));
                    }
                }
                self.body.complete = chunked.is_done();
                self.body.chunked = Some(chunked);
            }
            Framing::None | Framing::Close => {}
        }
        self.body.received = self.body.in_buf as u64;
        if limit > 0 && self.body.received > limit {
            self.close = true;
            let detail = format!("request body over the limit of {limit} bytes");
            return Err(on_route(route, Kind::BodyTooLarge, detail));
        }
        let mut out = std::mem::take(&mut self.out);
        let host = self.host.get(&self.buf);
        out.clear();
        let client = (self.c.ip.as_bytes(), self.c.tls.as_ref());
        let target = self.target.as_deref().map(str::as_bytes);
        let head = (&self.head, target);
        write_request_head(&mut out, &self.buf, head, self.ctx, client, host, identity);
        if self.body.complete {
            let start = self.head.len;
            out.extend_from_slice(&self.buf[start..start + self.body.in_buf]);
        }
        self.out = out;
        Ok(())
    }

    /// The router's own answer to a request it could not serve.
    async fn fail(&mut self, (e, idle): Failure) -> Next {
        self.c.idle = idle;
        let ctx = self.ctx;
        let status = e.kind.status().as_u16();
        ctx.metrics.router_response(status, e.route.as_deref(), e.cluster.as_deref());
        tracing::debug!(listener = %ctx.listener.name, error = %e, "request failed");
        let text = e.render(ctx.listener.error_detail);
        // The connection can carry another request only when this one's body is behind us.
        let close = self.close
            || ctx.live.drain.is_on()
            || self.c.spent(&ctx.listener.connections)
            || !self.body.complete
            || matches!(
                e.kind,
                Kind::BodyTooLarge | Kind::ClientBody | Kind::ClientBodyTimeout | Kind::BadRequest
            );
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let challenge;
        let extra: &[&str] = match e.kind {
            Kind::NoEligible => &["retry-after: 1"],
            Kind::Unauthorized(refusal) => {
                let value = refusal.challenge();
                challenge = [format!("www-authenticate: {}", value.to_str().unwrap_or("Bearer"))];
                &[challenge[0].as_str()]
            }
            _ => &[],
        };
        local_head(&mut out, status, text.len(), extra, close);
        if !self.is_head() {
            out.extend_from_slice(text.as_bytes());
        }
        let written = self.c.stream.write_all(&out).await.is_ok();
        self.out = out;
        if let (Some(log), Some(start)) = (&ctx.access, self.start.take()) {
            let line = access::Pending::failed(log, start, &e);
            line.finish(None, 0, Reason::None, self.body.received, text.len() as u64);
        }
        if close || !written { Next::Close } else { Next::KeepAlive }
    }

    fn is_head(&self) -> bool {
        self.head.method.get(&self.buf) == b"HEAD"
    }
}

/// `stages` gave the request to hyper.
struct Decline;

/// The text of a span of a head (empty if it is not UTF-8, which the parser already refused).
fn text(buf: &[u8], span: parse::Span) -> &str {
    std::str::from_utf8(span.get(buf)).unwrap_or("")
}

/// The method and the target of `head`, from one conversion of the request line's start (the
/// parser's spans of both, with the space between).
fn request_line<'b>(buf: &'b [u8], head: &RequestHead) -> (&'b str, &'b str) {
    let (method, target) = (head.method, head.target);
    let line = text(buf, parse::Span { start: method.start, end: target.end });
    let part = |span: parse::Span| {
        let (start, end) =
            ((span.start - method.start) as usize, (span.end - method.start) as usize);
        line.get(start..end).unwrap_or("")
    };
    (part(method), part(target))
}

impl<S: ClientStream> Tries for OwnTries<'_, S> {
    type Response = Next;
    type Headers = Self;

    fn headers(&self) -> &Self {
        self
    }

    fn replayable(&self) -> bool {
        self.body.complete || !self.body.touched
    }

    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> Result<Next, Kind> {
        let member = choice.member;
        let begun = Begun::new(rt, member);
        let started = Instant::now();
        let per_try = failover.try_timeout(clock::from_std(started));
        let Some(view) = ClusterView::of(rt) else {
            begun.end(Outcome::Cancelled);
            return Err(Kind::Connect);
        };
        let idle = &view.idle[member];
        let address = &rt.spec.members[member].address;
        let waiting_client = AtomicBool::new(false);
        // On the connection's timer (no `Timeout` of its own): taken, as the exchange borrows
        // all of `self`.
        let mut timer = self.timer.take();
        let end = tokio::time::Instant::from_std(started).checked_add(per_try);
        let exchange = self.exchange(idle, address, started, &waiting_client);
        let exchanged = match (timer.as_mut(), end) {
            (Some(timer), Some(end)) => {
                wait_before(timer.as_mut(), end, std::pin::pin!(exchange)).await
            }
            // Only if an earlier try of this request was dropped while it held the timer.
            (None, Some(_)) => tokio::time::timeout(per_try, exchange).await.ok(),
            (_, None) => Some(exchange.await),
        };
        self.timer = timer;
        let failed = |kind: FailureKind| Outcome::Failure { kind, latency: started.elapsed() };
        let (upstream, rbuf, rhead, early) = match exchanged {
            Some(Ok(x)) => x,
            Some(Err(kind)) => {
                begun.end(match kind {
                    Kind::Connect | Kind::Resolve => failed(FailureKind::Connect),
                    Kind::Reset | Kind::BadStatus => failed(FailureKind::Reset),
                    _ => Outcome::Cancelled,
                });
                return Err(kind);
            }
            None if waiting_client.load(Ordering::Relaxed) => {
                // The try waited on the client's body, not on the member: 408, and the member
                // is not charged.
                begun.end(Outcome::Cancelled);
                return Err(Kind::ClientBodyTimeout);
            }
            None => {
                begun.end(failed(FailureKind::Timeout));
                return Err(Kind::Timeout);
            }
        };
        let latency = started.elapsed();
        let route = self.route.map_or("", |r| r.name.as_str());
        let latency_s = latency.as_secs_f64();
        let counted = crate::http::record_response(rt, route, member, rhead.status, latency_s);
        begun.disarm();
        let outcome = if rhead.status >= 500 {
            Outcome::Failure { kind: FailureKind::Status5xx, latency }
        } else {
            Outcome::Success { latency }
        };
        let mut finish = Finish::default().request(rt.clone(), member, outcome).served(
            counted,
            None,
            failover.tries(),
            choice.reason,
        );
        if let (Some(log), Some(start)) = (&self.ctx.access, self.start.take()) {
            finish = finish.log(Some(access::Pending::served(log, start, rhead.status)));
        }
        if early {
            // The member answered before the whole body arrived: the rest is never read.
            self.close = true;
        }
        self.respond(upstream, idle, rbuf, rhead, choice.set_cookie, finish).await
    }
}

impl<S> Headers for OwnTries<'_, S> {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.head
            .fields
            .iter()
            .filter(move |f| f.name.get(&self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(&self.buf))
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.head
            .fields
            .iter()
            .find(|f| f.name.get(&self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(&self.buf))
    }
}

/// A member connection ready for a request.
async fn connect(idle: &Idle, address: &str) -> Result<TcpStream, Kind> {
    let target = match idle.literal {
        Some(addr) => addr,
        None => match tokio::net::lookup_host(address).await.map(|mut a| a.next()) {
            Ok(Some(addr)) => addr,
            _ => return Err(Kind::Resolve),
        },
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        _ => Err(Kind::Connect),
    }
}

impl<S: ClientStream> OwnTries<'_, S> {
    /// Sends the request to the member and reads its response head: a pooled connection when
    /// one is idle, else a new one. A pooled connection that turns out closed before any answer
    /// is replaced by a new one only for an idempotent request: whether the member got the
    /// request before it went cannot be known, and a POST must never arrive twice.
    async fn exchange(
        &mut self,
        idle: &Idle,
        address: &str,
        started: Instant,
        waiting_client: &AtomicBool,
    ) -> Result<(TcpStream, Vec<u8>, ResponseHead, bool), Kind> {
        let mut pooled = idle.take(started);
        // A body that came with the head is sent in the time of a write: the try's start is
        // then the start of the wait for the answer, without another clock reading.
        let sent_at_start = self.body.complete;
        loop {
            let reused = pooled.is_some();
            let mut upstream = match pooled.take() {
                Some(s) => s,
                None => {
                    let s = connect(idle, address).await?;
                    idle.opened(&s);
                    s
                }
            };
            match self.send(&mut upstream, waiting_client).await {
                Ok(early) => {
                    let mut rbuf = pool::take();
                    // While the member thinks, a client that closes its connection ends the try.
                    let since = if sent_at_start {
                        tokio::time::Instant::from_std(started)
                    } else {
                        tokio::time::Instant::now()
                    };
                    let watch = (!early).then_some((&self.c.stream, since + WATCH_CLIENT_AFTER));
                    let head_request = self.is_head();
                    match read_response_head(&mut upstream, &mut rbuf, head_request, watch).await {
                        Ok(head) => return Ok((upstream, rbuf, head, early)),
                        Err(failure) => {
                            pool::give(rbuf);
                            match failure {
                                HeadFailure::Stale if reused && self.may_replace() && !early => {
                                    continue;
                                }
                                HeadFailure::Stale => return Err(Kind::Reset),
                                HeadFailure::Failed(kind) => return Err(kind),
                                HeadFailure::ClientGone => {
                                    self.gone = true;
                                    self.close = true;
                                    return Err(Kind::ClientBody);
                                }
                            }
                        }
                    }
                }
                Err(SendError::Member) if reused && self.may_replace() => continue,
                Err(SendError::Member) => return Err(Kind::Reset),
                Err(SendError::Client(kind)) => return Err(kind),
            }
        }
    }

    /// Whether a try may go again on a new connection to the same member.
    fn may_replace(&self) -> bool {
        self.idempotent && self.replayable()
    }

    /// Writes the head (and the body in the buffer), then streams the rest of the body from the
    /// client. `Ok(true)`: the member answered before the body was complete.
    async fn send(
        &mut self,
        upstream: &mut TcpStream,
        waiting_client: &AtomicBool,
    ) -> Result<bool, SendError> {
        if upstream.write_all(&self.out).await.is_err() {
            return Err(SendError::Member);
        }
        if self.body.complete {
            return Ok(false);
        }
        if self.body.touched {
            // Another try read part of the body already (never reached: not replayable).
            return Err(SendError::Client(Kind::ClientBody));
        }
        self.body.touched = true;
        if self.head.expect_continue {
            // The client waits for this before it sends its body (RFC 9110 10.1.1).
            if self.c.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
                return Err(SendError::Client(Kind::ClientBody));
            }
        }
        let start = self.head.len;
        let in_buf = &self.buf[start..start + self.body.in_buf];
        if !in_buf.is_empty() && upstream.write_all(in_buf).await.is_err() {
            return Err(SendError::Member);
        }
        let limit = (self.ctx.listener.max_body_bytes, self.ctx.listener.body_read_timeout);
        let (up_read, mut up_write) = upstream.split();
        let sent = pump_body(
            &mut self.body,
            &mut self.extra,
            limit,
            &mut self.c.stream,
            &mut up_write,
            Some(up_read.as_ref()),
            waiting_client,
        )
        .await;
        if sent.is_err() {
            self.close = true;
        }
        sent
    }

    /// Streams the member's response to the client; the member connection goes back to its
    /// pool when the response was whole and the member keeps it open. A body that broke its
    /// framing before any byte went to the client is the try's failure (`BadBody`): the client
    /// then gets the router's 502, or another member's answer, instead of nothing.
    async fn respond(
        &mut self,
        mut upstream: TcpStream,
        idle: &Idle,
        mut rbuf: Vec<u8>,
        rhead: ResponseHead,
        set_cookie: Option<HeaderValue>,
        finish: Finish,
    ) -> Result<Next, Kind> {
        let mut finish = Some(finish);
        if let Some(f) = finish.as_mut() {
            // A body still streaming (the member answered early) is counted as far as it came.
            f.received(self.body.received);
        }
        if rhead.framing == Framing::Close {
            self.close = true;
        }
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        // A member's `x-rondo-login` never reaches the client (`write_response_head` drops it
        // on every route); on a login route it becomes the tier session's cookie.
        let login = self.route.filter(|route| route.login.is_some()).and_then(|route| {
            let vouched =
                rhead.fields.iter().find(|f| is(f.name.get(&rbuf), LOGIN_HEADER.as_bytes()))?;
            let (tier, tls) = (self.ctx.live.tier_key(), self.ctx.listener.tls.is_some());
            let (value, now) = (vouched.value.get(&rbuf), SystemTime::now());
            auth::login_cookie(route, rhead.status, value, tier.as_deref(), tls, now)
        });
        let cookies = [login.as_ref(), set_cookie.as_ref()];
        // A draining process says so on the response in progress, and then closes; so does a
        // connection past the listener's age limit.
        self.close |= self.ctx.live.drain.is_on() || self.c.spent(&self.ctx.listener.connections);
        write_response_head(&mut out, &rbuf, &rhead, cookies, self.close);
        let pumped = if self.body.complete {
            let client = &mut self.c.stream;
            pump_response(&rhead, &mut out, &mut rbuf, &mut upstream, client, &mut finish).await
        } else {
            // The member answered before the body was over (a stream, an echo): both ways at
            // once, until the response ends; a client body that then fails cuts the response.
            // Boxed: the two pumps side by side took 1 KiB more in every request's future, which
            // is made (and copied into its box) for every request, and this case is rare.
            self.close = true;
            let limit = (self.ctx.listener.max_body_bytes, self.ctx.listener.body_read_timeout);
            Box::pin(async {
                let never = AtomicBool::new(false);
                let (mut client_read, mut client_write) = tokio::io::split(&mut self.c.stream);
                let (mut up_read, mut up_write) = upstream.split();
                let body = pump_body(
                    &mut self.body,
                    &mut self.extra,
                    limit,
                    &mut client_read,
                    &mut up_write,
                    None,
                    &never,
                );
                let response = pump_response(
                    &rhead,
                    &mut out,
                    &mut rbuf,
                    &mut up_read,
                    &mut client_write,
                    &mut finish,
                );
                tokio::pin!(body, response);
                let mut body_over = false;
                loop {
                    tokio::select! {
                        r = &mut response => break r,
                        r = &mut body, if !body_over => {
                            body_over = true;
                            // A member that stops reading the body (it answered, then closed)
                            // still gets its answer to the client; a client whose body fails
                            // does not.
                            if let Err(SendError::Client(_)) = r {
                                break Ok((false, false, false));
                            }
                        }
                    }
                }
            })
            .await
        };
        self.out = out;
        pool::give(rbuf);
        let (whole, client_ok, clean) = match pumped {
            Ok(pumped) => pumped,
            Err(Unsent(why)) => {
                tracing::debug!(error = why.0, "member's response body refused before it was sent");
                self.close |= !self.body.complete;
                if let Some(mut f) = finish.take() {
                    f.failed();
                    // The line is the router's answer's now (written with the 502, or with
                    // the next member's response).
                    self.start = f.take_log().map(access::Pending::into_start);
                }
                return Err(Kind::BadBody);
            }
        };
        if !whole {
            self.close = true;
        }
        if whole && clean && rhead.reusable && self.body.complete {
            idle.give(upstream);
        } else if !whole && client_ok {
            // The member broke off mid-body.
            if let Some(f) = finish.as_mut() {
                f.failed();
            }
        }
        drop(finish);
        Ok(if self.close || !client_ok { Next::Close } else { Next::KeepAlive })
    }
}

/// Streams the rest of the request body from the client (`from`) to the member (`to`), held to
/// the listener's body `limit` and waiting at most `stall` (`body_read_timeout_ms`) for each
/// next byte (then [`Kind::ClientBodyTimeout`]: 408, or a cut response when the member already
/// answered); bytes past the body's end are kept in `extra`. With `watch`, stops as soon as the
/// member starts answering: `Ok(true)`.
async fn pump_body<R, W>(
    body: &mut ReqBody,
    extra: &mut Vec<u8>,
    (limit, stall): (u64, Duration),
    from: &mut R,
    to: &mut W,
    watch: Option<&TcpStream>,
    waiting_client: &AtomicBool,
) -> Result<bool, SendError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut chunk = pool::take();
    let result = loop {
        if body.remaining == 0 && body.chunked.as_ref().is_none_or(Chunked::is_done) {
            body.complete = true;
            break Ok(false);
        }
        chunk.clear();
        waiting_client.store(true, Ordering::Relaxed);
        let read = tokio::select! {
            biased;
            () = answered(watch) => None,
            r = tokio::time::timeout(stall, read_more(from, &mut chunk)) => Some(r),
        };
        waiting_client.store(false, Ordering::Relaxed);
        let n = match read {
            None => break Ok(true),
            Some(Err(_stalled)) => break Err(SendError::Client(Kind::ClientBodyTimeout)),
            Some(Ok(Ok(0) | Err(_))) => break Err(SendError::Client(Kind::ClientBody)),
            Some(Ok(Ok(n))) => n,
        };
        let take = match &mut body.chunked {
            Some(c) => match c.feed(&chunk[..n]) {
                Ok(k) => k,
                Err(_) => break Err(SendError::Client(Kind::ClientBody)),
            },
            None => {
                let k = (n as u64).min(body.remaining);
                body.remaining -= k;
                k as usize
            }
        };
        body.received += take as u64;
        if limit > 0 && body.received > limit {
            break Err(SendError::Client(Kind::BodyTooLarge));
        }
        extra.extend_from_slice(&chunk[take..n]);
        if to.write_all(&chunk[..take]).await.is_err() {
            break Err(SendError::Member);
        }
    };
    pool::give(chunk);
    result
}

/// Resolves when the watched member connection has something to read (its answer).
async fn answered(watch: Option<&TcpStream>) {
    match watch {
        Some(s) => {
            let _ = s.readable().await;
        }
        None => std::future::pending().await,
    }
}

/// Streams the member's response to the client (`to`): `head` (the head as the client gets it,
/// sent with the first body bytes in one write), then the body, whose first bytes are already
/// in `rbuf` after the member's head, then the rest from `from`. Returns whether the body was
/// whole, whether the client took every byte, and whether nothing followed the response (else
/// the member connection goes). A member that sent bytes past its response loses its
/// connection, not the client its own. A body that breaks its chunked coding before the head
/// was written is [`Unsent`]: nothing reached the client.
async fn pump_response<R, W>(
    rhead: &ResponseHead,
    head: &mut Vec<u8>,
    rbuf: &mut Vec<u8>,
    from: &mut R,
    to: &mut W,
    finish: &mut Option<Finish>,
) -> Result<(bool, bool, bool), Unsent>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut pending = rhead.len;
    let mut chunked = (rhead.framing == Framing::Chunked).then(|| Chunked::new(MAX_RESPONSE_HEAD));
    let mut remaining = match rhead.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    loop {
        let avail = &rbuf[pending..];
        let (take, done) = match (rhead.framing, &mut chunked) {
            (Framing::None, _) => (0, true),
            (Framing::Length(_), _) => {
                let k = (avail.len() as u64).min(remaining) as usize;
                remaining -= k as u64;
                (k, remaining == 0)
            }
            (Framing::Chunked, Some(c)) => match c.feed(avail) {
                Ok(k) => (k, c.is_done()),
                Err(why) if !head.is_empty() => return Err(Unsent(why)),
                Err(_) => return Ok((false, true, false)),
            },
            _ => (avail.len(), false),
        };
        if let Some(f) = finish.as_mut() {
            f.sent(take);
        }
        if done {
            // The member's request ends before the client can see the response's end, so a
            // next request the client sends at once finds the member's load as it is.
            drop(finish.take());
        }
        let written = if !head.is_empty() {
            // The head and what came with it in one write (one system call for a small answer).
            if take <= COALESCE {
                head.extend_from_slice(&avail[..take]);
                to.write_all(head).await
            } else {
                match to.write_all(head).await {
                    Ok(()) => to.write_all(&avail[..take]).await,
                    e => e,
                }
            }
        } else if take > 0 {
            to.write_all(&avail[..take]).await
        } else {
            Ok(())
        };
        head.clear();
        if written.is_err() {
            return Ok((false, false, false));
        }
        if done {
            // Bytes past the response: the member spoke out of turn; its connection goes.
            return Ok((true, true, take == avail.len()));
        }
        rbuf.clear();
        pending = 0;
        match read_more(from, rbuf).await {
            // A body delimited by the close is whole when the member closes.
            Ok(0) if rhead.framing == Framing::Close => {
                drop(finish.take());
                return Ok((true, true, false));
            }
            Ok(0) | Err(_) => return Ok((false, true, false)),
            Ok(_) => {}
        }
    }
}

/// A member's response body was refused before any of it went to the client.
struct Unsent(ChunkError);

/// Why sending a request failed.
enum SendError {
    /// The member's side of the connection failed.
    Member,
    /// The client's body failed, for this reason.
    Client(Kind),
}

/// Why reading a response head failed.
enum HeadFailure {
    /// The connection closed before any byte of a response (a pooled connection the member
    /// closed as it was reused).
    Stale,
    /// The member failed, or answered what the router does not pass on.
    Failed(Kind),
    /// The client closed its connection while waiting.
    ClientGone,
}
use HeadFailure::{Failed, Stale};

/// Reads the member's response head (skipping interim 1xx responses) into `rbuf`.
async fn read_response_head<S: ClientStream, R: AsyncRead + Unpin>(
    upstream: &mut R,
    rbuf: &mut Vec<u8>,
    head_request: bool,
    client: Option<(&S, tokio::time::Instant)>,
) -> Result<ResponseHead, HeadFailure> {
    let mut seen_any = false;
    loop {
        if !rbuf.is_empty() {
            match parse::response(rbuf, head_request) {
                Ok(Some(head)) if head.status == 101 => return Err(Failed(Kind::Reset)),
                Ok(Some(head)) if (100..200).contains(&head.status) => {
                    rbuf.drain(..head.len);
                    continue;
                }
                Ok(Some(head)) if head.status > 599 || head.status < 100 => {
                    return Err(Failed(Kind::BadStatus));
                }
                Ok(Some(head)) => return Ok(head),
                Ok(None) if rbuf.len() >= MAX_RESPONSE_HEAD => return Err(Failed(Kind::Reset)),
                Ok(None) => {}
                Err(why) => {
                    tracing::debug!("member's response refused: {why}");
                    return Err(Failed(Kind::Reset));
                }
            }
        }
        let read = tokio::select! {
            r = read_more(upstream, rbuf) => r,
            () = client_gone(client) => return Err(HeadFailure::ClientGone),
        };
        match read {
            Ok(0) | Err(_) if !seen_any => return Err(Stale),
            Ok(0) | Err(_) => return Err(Failed(Kind::Reset)),
            Ok(_) => seen_any = true,
        }
    }
}

/// What the own path made of a member's response body, for the `h1_member` fuzz target
/// (`super::fuzz::member_input`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Relayed {
    /// The response body bytes the client got (after the head).
    pub(super) body: Vec<u8>,
    /// Whether the body was whole.
    pub(super) whole: bool,
    /// Whether the member connection would go back to the pool.
    pub(super) pooled: bool,
    /// Whether the body was refused before anything went to the client.
    pub(super) unsent: bool,
}

/// Reads a response head off `member` into `rbuf` as a try does (interim responses skipped):
/// its length and framing, with what followed it left in `rbuf`.
pub(super) async fn relay_head<R: AsyncRead + Unpin>(
    member: &mut R,
    rbuf: &mut Vec<u8>,
    head_request: bool,
) -> Option<ResponseHead> {
    let none = None::<(&TcpStream, tokio::time::Instant)>;
    read_response_head(member, rbuf, head_request, none).await.ok()
}

/// Streams the body of `rhead` as [`OwnTries::respond`] does, to a client that takes every
/// byte.
pub(super) async fn relay_body<R: AsyncRead + Unpin>(
    member: &mut R,
    mut rbuf: Vec<u8>,
    rhead: &ResponseHead,
) -> Relayed {
    // A one-byte head marks where the body starts in what the client got.
    let (mut head, mut client) = (vec![b'#'], Vec::new());
    let pumped = pump_response(rhead, &mut head, &mut rbuf, member, &mut client, &mut None).await;
    match pumped {
        Ok((whole, _, clean)) => Relayed {
            body: client.split_off(1.min(client.len())),
            whole,
            pooled: whole && clean && rhead.reusable,
            unsent: false,
        },
        Err(Unsent(_)) => Relayed { body: Vec::new(), whole: false, pooled: false, unsent: true },
    }
}

/// Resolves when the client (if any is watched) has closed its connection; never when it sends
/// more (a pipelined request, left for later). It is looked at no sooner than `look_at`
/// ([`WATCH_CLIENT_AFTER`] into the wait for the answer).
async fn client_gone<S: ClientStream>(client: Option<(&S, tokio::time::Instant)>) {
    match client {
        Some((client, look_at)) => {
            // Not at once: most members answer sooner, and looking costs a system call. Nor
            // while the client's socket stays quiet, the usual case: waiting for its readiness
            // (which the read that drained it cleared) costs nothing, where a timer set for
            // every request cost its place in tokio's wheel.
            client.stirs().await;
            tokio::time::sleep_until(look_at).await;
            client.closed().await;
        }
        None => std::future::pending().await,
    }
}

/// Whether `name` (as sent) is `lower` (lower case), ignoring case.
fn is(name: &[u8], lower: &[u8]) -> bool {
    name.eq_ignore_ascii_case(lower)
}

/// Hop-by-hop fields (RFC 9110 7.6.1), never forwarded either way.
fn hop_by_hop(name: &[u8]) -> bool {
    [
        &b"connection"[..],
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"upgrade",
        b"proxy-authorization",
    ]
    .iter()
    .any(|h| is(name, h))
}

/// The fields `Connection` names in `fields` (never `Host`, nor the framing fields: bodies pass
/// through as they came, so the fields that delimit them must too, or a member reads the body
/// of `Connection: Content-Length` as a request of its own).
fn connection_named<'b>(buf: &'b [u8], fields: &[Field]) -> Vec<&'b [u8]> {
    let mut named = Vec::new();
    for f in fields.iter().filter(|f| is(f.name.get(buf), b"connection")) {
        named.extend(parse::tokens(f.value.get(buf)).filter(|t| {
            !is(t, b"host") && !is(t, b"content-length") && !is(t, b"transfer-encoding")
        }));
    }
    named
}

/// Whether a client's field `name` never reaches a member: an identity header
/// (`x-rondo-subject`, `x-rondo-claim-*`, in any spelling), the router's to set, or an
/// underscore spelling of a field the router owns (`X_Forwarded_For`).
fn is_identity_header(name: &[u8]) -> bool {
    auth::is_identity_header(name) || crate::headers::is_reserved_alias(name)
}

/// The request head as members get it: the request line and fields as the client sent them,
/// minus hop-by-hop fields, those `Connection` names, incoming forwarding, certificate and
/// identity fields; plus `X-Forwarded-*`, the identity the route verified and this hop in
/// `Via`. The target is `target` when the path was normalized.
fn write_request_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    (head, target): (&RequestHead, Option<&[u8]>),
    ctx: &HttpCtx,
    (ip, tls): (&[u8], Option<&crate::tls::ClientCert>),
    host: &[u8],
    identity: Option<&Identity>,
) {
    out.extend_from_slice(head.method.get(buf));
    out.push(b' ');
    out.extend_from_slice(target.unwrap_or_else(|| head.target.get(buf)));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let named = connection_named(buf, &head.fields);
    let mut te_trailers = false;
    let mut prior_xff: Option<&[u8]> = None;
    let mut vias: Vec<&[u8]> = Vec::new();
    for f in &head.fields {
        let (name, value) = (f.name.get(buf), f.value.get(buf));
        if is(name, b"te") {
            te_trailers |= parse::tokens(value).any(|t| is(t, b"trailers"));
            continue;
        }
        if is(name, b"x-forwarded-for") {
            prior_xff.get_or_insert(value);
            continue;
        }
        if is(name, b"via") {
            vias.push(value);
            continue;
        }
        if hop_by_hop(name)
            || is(name, b"expect")
            || is(name, b"x-forwarded-proto")
            || is(name, b"x-forwarded-host")
            || is(name, crate::tls::CLIENT_CERT_SUBJECT.as_bytes())
            || is(name, crate::tls::CLIENT_CERT_SAN.as_bytes())
            || is_identity_header(name)
            || named.iter().any(|n| is(name, n))
        {
            continue;
        }
        if is(name, b"cookie")
            && let Some(rest) = auth::cookie_without_session(value)
        {
            // The tier session's cookie is no member's to see.
            if !rest.is_empty() {
                field(out, name, &rest);
            }
            continue;
        }
        field(out, name, value);
    }
    for (name, value) in identity.into_iter().flat_map(Identity::headers) {
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if te_trailers {
        out.extend_from_slice(b"te: trailers\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if let Some(prior) = prior_xff.filter(|_| ctx.listener.trust_forwarded_for) {
        out.extend_from_slice(prior);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(ip);
    out.extend_from_slice(b"\r\n");
    match tls {
        None => out.extend_from_slice(b"x-forwarded-proto: http\r\n"),
        Some(cert) => {
            out.extend_from_slice(b"x-forwarded-proto: https\r\n");
            let names = [crate::tls::CLIENT_CERT_SUBJECT, crate::tls::CLIENT_CERT_SAN];
            for (name, value) in names.into_iter().zip([&cert.subject, &cert.san]) {
                if let Some(v) = value {
                    field(out, name.as_bytes(), v.as_bytes());
                }
            }
        }
    }
    if !host.is_empty() {
        field(out, b"x-forwarded-host", host);
    }
    write_via(out, &vias);
    out.extend_from_slice(b"\r\n");
}

/// The member's response head as the client gets it: status line in HTTP/1.1, fields minus
/// hop-by-hop ones (the transfer coding stays: the body passes through as it came), this hop
/// in `Via`, a new session cookie, and `Connection: close` when the connection ends after it.
fn write_response_head(
    out: &mut Vec<u8>,
    rbuf: &[u8],
    head: &ResponseHead,
    cookies: [Option<&HeaderValue>; 2],
    close: bool,
) {
    // The status has three digits (the parser reads exactly three).
    let s = head.status;
    let digits = [b'0' + (s / 100 % 10) as u8, b'0' + (s / 10 % 10) as u8, b'0' + (s % 10) as u8];
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&digits);
    out.push(b' ');
    out.extend_from_slice(head.reason.get(rbuf));
    out.extend_from_slice(b"\r\n");
    let named = connection_named(rbuf, &head.fields);
    let has_te = head.fields.iter().any(|f| is(f.name.get(rbuf), b"transfer-encoding"));
    let mut vias: Vec<&[u8]> = Vec::new();
    for f in &head.fields {
        let (name, value) = (f.name.get(rbuf), f.value.get(rbuf));
        if is(name, b"via") {
            vias.push(value);
            continue;
        }
        // RFC 9112 6.3: with both, the transfer coding frames the body and the length is wrong.
        if hop_by_hop(name)
            || (has_te && is(name, b"content-length"))
            || is(name, LOGIN_HEADER.as_bytes())
            || named.iter().any(|n| is(name, n))
        {
            continue;
        }
        field(out, name, value);
    }
    write_via(out, &vias);
    for cookie in cookies.into_iter().flatten() {
        field(out, b"set-cookie", cookie.as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `Via` with the prior hops, then this one.
fn write_via(out: &mut Vec<u8>, prior: &[&[u8]]) {
    out.extend_from_slice(b"via: ");
    for v in prior {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(b"1.1 ");
    out.extend_from_slice(via_id().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `host[:port]` without the port, minding IPv6 literals.
fn without_port(full: &str) -> &str {
    match full.rfind(':') {
        Some(i) if !full[i..].contains(']') => &full[..i],
        _ => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an idle keep-alive connection's task holds is the `serve` future (its request and
    /// its lingering close are boxed): it must stay small, or every idle connection pays.
    #[tokio::test]
    async fn an_idle_connection_holds_a_small_future() {
        // (It was 4.5 KiB with the lingering close's scratch buffer inline; 1,008 bytes before
        // the connection kept its one timer, a tokio `Sleep`, for all its waits and tries,
        // 1,088 with it: a timer per wait was made and dropped for every request instead; 984
        // since the drain's waiter is one pinned `Notified` for all waits, not a `started()`
        // future per wait.)
        let config = rondo_config::parse_str(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n",
            std::path::Path::new("t.toml"),
            1,
        )
        .expect("config");
        let live = Arc::new(rondo_runtime::Live::new(config.view.clone(), None));
        let ctx = Arc::new(HttpCtx {
            listener: config.listeners[0].clone(),
            metrics: live.metrics.listener("web"),
            live,
            clients: crate::upstream::Clients::new(Duration::from_secs(1)),
            sessions: Default::default(),
            access: None,
            auth: Default::default(),
            copies: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("c");
        let (server, peer) = listener.accept().await.expect("accept");
        let future = serve(&ctx, server, peer, None);
        let size = std::mem::size_of_val(&future);
        drop(client);
        assert!(size <= 1152, "an idle connection's future is {size} bytes");
    }
}
