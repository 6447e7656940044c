//! The own path's accept/connection stage: one client connection's loop. It waits for a
//! request without a buffer (only the socket's readiness, the listener's idle and age limits
//! and the process's drain, all on the connection's one timer), reads the head into a borrowed
//! buffer, refuses a head it cannot serve, declines what is hyper's (the connection goes there
//! with every byte already read), and runs the request's stages ([`super::tries`]); between
//! requests it keeps only a pipelined request's bytes. Also the client's byte stream as the
//! path needs it ([`ClientStream`]: plain TCP, or TLS over it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rondo_runtime::metrics::Handoff;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{Client, ClientStream, IpText, Next};
use super::parse::{self, HeadError, Limits, RequestHead};
use super::pool;
use super::pump::read_more;
use super::tries::OwnTries;
use super::write::local_head;
use crate::http::HttpCtx;

/// After the router closes a connection, at most this much of what the client still sends is
/// read and dropped, for at most [`LINGER_FOR`], so the close is a FIN and not a reset that
/// could destroy the response.
const LINGER_BYTES: usize = 256 * 1024;
const LINGER_FOR: Duration = Duration::from_secs(1);

const RESPONSE_408: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 53\r\n\r\nrondo: 408 the request header did not arrive in time\n";

/// A connection the own path declined, for hyper: the stream, the client's certificate, the
/// bytes already read from it, and the addresses.
pub(crate) struct Declined<S> {
    pub(crate) stream: S,
    pub(crate) cert: Option<crate::tls::ClientCert>,
    pub(crate) read: Vec<u8>,
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
}

/// Serves `stream` until it closes, or until a request this path declines: then the
/// connection and the bytes already read from it are returned, for hyper.
///
/// Not an `async fn`: an async fn keeps its arguments in its future for its whole life, beside
/// the [`Client`] made of them, so the stream, both addresses and the certificate took their
/// room twice in every idle connection (issue 36). The returned future holds only the client.
pub(crate) fn serve<'a, S: ClientStream + 'a>(
    ctx: Arc<HttpCtx>,
    stream: S,
    (peer, local): (SocketAddr, SocketAddr),
    tls: Option<crate::tls::ClientCert>,
) -> impl Future<Output = Option<Declined<S>>> + Send + 'a {
    let mut c = Client {
        stream,
        peer,
        tls: tls.map(Box::new),
        carry: None,
        idle: ctx.listener.header_read_timeout,
        ip: IpText::new(peer.ip()),
        trusted: ctx.listener.trust_forwarded_for.trusts(peer.ip()),
        born: tokio::time::Instant::now(),
        served: 0,
        local,
        proxied: crate::proxied::Kept::default(),
    };
    // `c` is the block's own capture, used in place: moved into a `let` or an async fn's
    // argument, it would take its room twice.
    async move {
        // The listener's `max_connection_age_ms`: the wait for the next request ends there too.
        let aged_at = ctx.listener.connections.max_age.map(|age| c.born + age);
        // When the wait for the next request ends (set as it begins).
        let mut wait_until = None;
        // The connection's one timer, for each wait for a request and each try: see
        // `wait_before`. Set in the past, it is moved to the first deadline when first used.
        let timer = tokio::time::sleep_until(c.born);
        tokio::pin!(timer);
        // The process's drain, heard by one waiter for all of the connection's waits.
        let drain = &*ctx.drain;
        let drained = drain.notified();
        tokio::pin!(drained);
        loop {
            if c.carry.is_none() {
                // No buffer while waiting: only the socket's readiness, or the process's drain,
                // which closes a connection that stays idle for `DRAIN_IDLE_GRACE` after it began
                // (a request that comes sooner is served, with `Connection: close`).
                let idle_until = (!c.idle.is_zero()).then(|| {
                    *wait_until.get_or_insert_with(|| tokio::time::Instant::now() + c.idle)
                });
                let end = match (idle_until, aged_at) {
                    (None, None) => None,
                    (Some(t), None) | (None, Some(t)) => Some(t),
                    (Some(a), Some(b)) => Some(a.min(b)),
                };
                if let Some(end) = end
                    && timer.deadline() > end
                {
                    timer.as_mut().reset(end);
                }
                let mut grace = None;
                let woke = std::future::poll_fn(|cx| {
                    let waits = (drain, drained.as_mut(), &mut grace, timer.as_mut(), end);
                    poll_idle(cx, &c.stream, waits)
                })
                .await;
                match woke {
                    Woke::Ready(Ok(())) => {}
                    Woke::Ready(Err(_)) => return None,
                    Woke::Drained => {
                        Box::pin(linger(&mut c.stream)).await;
                        return None;
                    }
                    Woke::Ended if aged_at.is_some_and(|t| t <= tokio::time::Instant::now()) => {
                        // Old enough: closed between requests, so that the client reconnects.
                        Box::pin(linger(&mut c.stream)).await;
                        return None;
                    }
                    Woke::Ended => {
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
            match Box::pin(request(&ctx, &mut c, timer.as_mut())).await {
                Next::KeepAlive => {}
                Next::Close => {
                    // Boxed, as the request is: an idle connection's task carries neither.
                    Box::pin(linger(&mut c.stream)).await;
                    return None;
                }
                Next::Decline(read) => {
                    let cert = c.tls.map(|t| *t);
                    return Some(Declined {
                        stream: c.stream,
                        cert,
                        read,
                        peer: c.peer,
                        local: c.local,
                    });
                }
            }
        }
    }
}

/// What ended an idle connection's wait for its next request.
enum Woke {
    /// The client's socket has something to read (or failed).
    Ready(std::io::Result<()>),
    /// The process drains and the connection stayed idle for `DRAIN_IDLE_GRACE` since.
    Drained,
    /// The wait's end (the idle timeout or the connection's age) came first.
    Ended,
}

/// What an idle connection's wait watches besides its socket: the process's drain (its waiter,
/// and the grace sleep once it began: boxed, made only when the process drains), and the
/// connection's timer with the wait's end.
type IdleWaits<'a, 'b> = (
    &'a rondo_runtime::sockets::drain::Drain,
    std::pin::Pin<&'a mut tokio::sync::futures::Notified<'b>>,
    &'a mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    std::pin::Pin<&'a mut tokio::time::Sleep>,
    Option<tokio::time::Instant>,
);

/// One poll of an idle connection's wait, in this order: the socket, the drain, the timer (as
/// [`wait_before`] treats it: set for an earlier wait or try, it is set again to `end`). A poll
/// by hand, not a `select!` of futures: those futures took their room in every idle
/// connection's task (issue 36).
fn poll_idle<S: ClientStream>(
    cx: &mut std::task::Context<'_>,
    stream: &S,
    (drain, drained, grace, mut timer, end): IdleWaits<'_, '_>,
) -> std::task::Poll<Woke> {
    use std::task::Poll;
    if let Poll::Ready(r) = stream.poll_ready(cx) {
        return Poll::Ready(Woke::Ready(r));
    }
    if grace.is_none() && (drain.is_on() || drained.poll(cx).is_ready()) {
        *grace = Some(Box::pin(tokio::time::sleep(crate::DRAIN_IDLE_GRACE)));
    }
    if let Some(sleep) = grace
        && sleep.as_mut().poll(cx).is_ready()
    {
        return Poll::Ready(Woke::Drained);
    }
    if let Some(end) = end {
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= end {
                return Poll::Ready(Woke::Ended);
            }
            timer.as_mut().reset(end);
        }
    }
    Poll::Pending
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

/// Reads a request head into `buf` (what the connection carried over, if anything): the head
/// and its buffer, or what the connection does instead (a head refused or never complete, the
/// HTTP/2 preface declined to hyper).
async fn read_head<S: ClientStream>(
    ctx: &HttpCtx,
    c: &mut Client<S>,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, RequestHead), Next> {
    let listener = &ctx.listener;
    let limits = Limits {
        max_bytes: listener.max_header_bytes as usize,
        max_fields: listener.max_headers as usize,
    };
    let header_timeout = listener.header_read_timeout;
    // Set when the head is first waited for.
    let mut deadline = None;
    let mut scan = parse::HeadScan::default();
    loop {
        if parse::is_h2_preface(&buf) {
            if buf.len() >= 24 {
                ctx.metrics.handoffs.inc(Handoff::H2);
                pool::disown();
                return Err(Next::Decline(buf));
            }
        } else if !buf.is_empty() {
            match scan.request(&buf, limits) {
                Ok(Some(head)) => return Ok((buf, head)),
                Ok(None) => {}
                Err(e) => {
                    pool::give(buf);
                    refuse_head(ctx, c, e).await;
                    return Err(Next::Close);
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
                return Err(Next::Close);
            }
            Err(_) if buf.is_empty() => {
                ctx.metrics.idle_timeouts.inc();
                pool::give(buf);
                return Err(Next::Close);
            }
            Err(_) => {
                // A request was started and stalled: say so, then close.
                ctx.metrics.header_timeouts.inc();
                ctx.metrics.router_response(408, None, None);
                let _ = c.stream.write_all(RESPONSE_408).await;
                pool::give(buf);
                return Err(Next::Close);
            }
        }
    }
}

/// One request: its head read and checked, then routed and forwarded (or answered by the
/// router itself, or declined to hyper).
async fn request<S: ClientStream>(
    ctx: &Arc<HttpCtx>,
    c: &mut Client<S>,
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
) -> Next {
    let buf = c.carry.take().unwrap_or_else(pool::take);
    let (buf, head) = match read_head(ctx, c, buf).await {
        Ok(read) => read,
        Err(next) => return next,
    };
    if let Some(why) = head.decline {
        tracing::trace!(listener = %ctx.listener.name, ?why, "request declined to hyper");
        let reason = match why {
            parse::Decline::Http10 => Handoff::Http10,
            parse::Decline::TargetForm => Handoff::TargetForm,
            parse::Decline::Upgrade => Handoff::Upgrade,
        };
        ctx.metrics.handoffs.inc(reason);
        pool::disown();
        return Next::Decline(buf);
    }
    let snapshot = ctx.views.load();
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
    local_head(&mut out, e.status, body.len(), &[], None, None, true);
    out.extend_from_slice(body.as_bytes());
    let _ = c.stream.write_all(&out).await;
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpStream;

    use super::*;

    /// What an idle keep-alive connection's task holds is the `serve` future (its request and
    /// its lingering close are boxed): it must stay small, or every idle connection pays.
    #[tokio::test]
    async fn an_idle_connection_holds_a_small_future() {
        // (It was 4.5 KiB with the lingering close's scratch buffer inline; 1,008 bytes before
        // the connection kept its one timer, a tokio `Sleep`, for all its waits and tries,
        // 1,088 with it: a timer per wait was made and dropped for every request instead; 984
        // since the drain's waiter is one pinned `Notified` for all waits, not a `started()`
        // future per wait; 744 since `serve` is no async fn, whose arguments stayed in the future
        // beside the `Client` made of them, and the client's certificate is boxed: issue 36.)
        let ctx = HttpCtx::plain_for_tests();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("c");
        let (server, peer) = listener.accept().await.expect("accept");
        let future = serve(ctx.clone(), server, (peer, peer), None);
        let size = std::mem::size_of_val(&future);
        drop(client);
        assert!(size <= 800, "an idle connection's future is {size} bytes");
    }

    /// Every request's future is boxed (by `serve`), and so is each of its tries (the bulk of
    /// its state, `OwnTries::attempt`): each must fit glibc's per-thread cache of small blocks
    /// (1,032 bytes), or its allocation goes through the allocator's slower paths, and the larger
    /// the future, the more is copied into its box. (3,208 bytes, all in one, before the tries were
    /// boxed and what the awaits kept beside them was cut.)
    #[tokio::test]
    async fn a_request_and_its_tries_fit_the_allocators_small_block_cache() {
        use crate::http::Tries as _;
        let config = rondo_config::parse_str(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n[[route]]\n\
             listener = \"web\"\ncluster = \"app\"\n\n[cluster.app]\n\
             members = [ { name = \"m1\", address = \"127.0.0.1:9\" } ]\n",
            std::path::Path::new("t.toml"),
            1,
        )
        .expect("config");
        let live = Arc::new(rondo_runtime::Live::new(config.view.clone(), None));
        let ctx = Arc::new(HttpCtx::detached(config.listeners[0].clone(), live));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("c");
        let (server, peer) = listener.accept().await.expect("accept");
        let born = tokio::time::Instant::now();
        let (ip, idle) = (IpText::new(peer.ip()), Duration::from_secs(1));
        let mut c = Client {
            stream: server,
            peer,
            tls: None,
            carry: None,
            idle,
            ip,
            trusted: false,
            born,
            served: 0,
            local: peer,
            proxied: Default::default(),
        };
        let timer = tokio::time::sleep_until(c.born);
        tokio::pin!(timer);
        let size = std::mem::size_of_val(&request(&ctx, &mut c, timer.as_mut()));
        assert!(size <= 1032, "a request's future is {size} bytes");
        let raw = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec();
        let limits = Limits { max_bytes: 8192, max_fields: 100 };
        let head = parse::request(&raw, limits).expect("valid").expect("whole");
        let snapshot = ctx.views.load();
        let rt = snapshot.clusters.get("app").expect("cluster").clone();
        let mut req = OwnTries::new(&ctx, &mut c, timer.as_mut(), raw, head);
        let now = rondo_runtime::clock::now();
        let failover = rondo_core::Failover::new(1, true, now, Duration::from_secs(1));
        let choice = crate::http::Choice {
            member: 0,
            set_cookie: None,
            split_cookie: None,
            reason: crate::access::Reason::None,
            traceparent: None,
        };
        let size = std::mem::size_of_val(&*req.attempt(&rt, choice, &failover));
        assert!(size <= 1032, "a try's future is {size} bytes");
        drop(client);
    }
}
