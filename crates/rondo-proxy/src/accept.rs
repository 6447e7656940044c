//! The accept stage of `http` listeners: each accepted connection's task. A plain connection
//! starts on the own HTTP/1 path ([`PlainTask`]: its future and three pointers, what every idle
//! connection holds); TLS, a PROXY header and hyper's serving (HTTP/2, h2c, and what the own
//! path declines) are boxed, made only for the connections that need them. Hyper's servers and
//! the listener's HTTP/2 reset budget are shared by the listener's connections ([`Shared`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rondo_config::ListenerSpec;
use rondo_runtime::metrics::{Handoff, ListenerMetrics};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::conn::{ClientIo, ConnState, Rejecter, TimedIo};
use crate::frames::{self, ResetBudget};
use crate::http::HttpCtx;
use crate::{client_body, h1, headers, hyper_path, proxy_protocol, tls};

/// See [`rondo_runtime::sockets::drain::IDLE_GRACE`].
const DRAIN_IDLE_GRACE: Duration = rondo_runtime::sockets::drain::IDLE_GRACE;

/// Streams the client reset before the router accepted them, per HTTP/2 connection, past which
/// h2 itself ends the connection with GOAWAY `ENHANCE_YOUR_CALM` (h2's own default, made
/// explicit; resets of accepted streams are counted by [`frames::ResetBudget`]).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;

/// Streams the router may reset for the client's protocol errors over an HTTP/2 connection's
/// life before h2 ends it with `ENHANCE_YOUR_CALM` (hyper's default, made explicit; the
/// listener's windowed `h2_max_resets` budget usually trips first).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// After an HTTP/2 connection error's GOAWAY, how long the connection may take to finish its
/// lingering close before it is dropped.
const ABORT_LINGER: Duration = Duration::from_secs(1);

/// The hyper server for `spec`'s connections; `max_streams`: the HTTP/2 streams a connection
/// may have open at once (`None`: hyper's 200).
fn http_builder(spec: &ListenerSpec, max_streams: Option<u32>) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .keep_alive(true)
        .max_buf_size(spec.max_header_bytes.max(8192) as usize)
        .max_headers(spec.max_headers as usize);
    // The timer drives the keepalive PINGs: one unanswered for `keepalive_timeout` closes the
    // connection, which frees its slot even while a stream keeps the idle timer off.
    b.http2()
        .max_header_list_size(spec.max_header_bytes)
        .timer(TokioTimer::new())
        .keep_alive_interval(spec.http2.keepalive_interval)
        .keep_alive_timeout(spec.http2.keepalive_timeout)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS);
    if let Some(n) = max_streams {
        b.http2().max_concurrent_streams(n);
    }
    b
}

/// A listener's hyper servers: the usual one, and the one for connections from an address
/// over its HTTP/2 reset budget ([`frames::Standing::Reduced`]).
struct Builders {
    usual: auto::Builder<TokioExecutor>,
    reduced: auto::Builder<TokioExecutor>,
}

/// A listener's parts that its connections share: hyper's servers (for what the own path
/// declines) and the HTTP/2 reset budget. One `Arc`, so that an idle connection's task holds
/// one pointer for them.
struct Shared {
    builders: Builders,
    budget: Arc<ResetBudget>,
}

/// What a connection's task holds until it ends: its slot among the listener's
/// `max_connections` and its count in the listener's metrics.
struct Held {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _open: rondo_runtime::metrics::OpenConn,
}

pub(crate) async fn accept_http(
    socket: TcpListener,
    ctx: Arc<HttpCtx>,
    tls: Option<Arc<tls::Terminator>>,
    (limit, budget): (Arc<Semaphore>, Arc<ResetBudget>),
    mut stopped: watch::Receiver<bool>,
) {
    let shared = Arc::new(Shared {
        builders: Builders {
            usual: http_builder(&ctx.listener, None),
            reduced: http_builder(&ctx.listener, Some(frames::REDUCED_STREAMS)),
        },
        budget,
    });
    // Connections over the limit get a 503 from one task for the whole listener.
    let rejecter = Rejecter::spawn(&ctx.listener.name, ctx.listener.max_connections);
    // The address clients reach (a PROXY header's destination towards members): the bound
    // one, asked of each connection only when the listener listens on a wildcard address.
    let bound = socket.local_addr().unwrap_or(ctx.listener.listen);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = stopped.changed() => return,
            r = socket.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(listener = %ctx.listener.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            ctx.metrics.refused.inc();
            // A TLS client cannot read a plain-text 503: it is closed at once.
            if tls.is_none() && rejecter.reject(stream) {
                ctx.metrics.router_response(503, None, None);
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let local =
            if bound.ip().is_unspecified() { stream.local_addr().unwrap_or(bound) } else { bound };
        let held = Held { _permit: permit, _open: ctx.metrics.opened() };
        let conn = Conn { ctx: ctx.clone(), shared: shared.clone(), stream, peer, local, held };
        match &tls {
            None if ctx.listener.proxy_protocol.is_none() => tokio::spawn(conn.plain()),
            _ => tokio::spawn(Box::pin(conn.other(tls.clone()))),
        };
    }
}

/// An accepted connection, before its task begins. What the task holds for its whole life is
/// every idle connection's cost (issue 36): a plain connection's task is the own path's
/// future and three pointers ([`Conn::plain`]); the rest (TLS, a PROXY header, hyper) is
/// boxed, made only on the listeners or connections that need it.
struct Conn {
    ctx: Arc<HttpCtx>,
    shared: Arc<Shared>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    held: Held,
}

impl Conn {
    /// A plain-text connection on a listener without PROXY headers: the own HTTP/1 path
    /// first, hyper if it declines ([`PlainTask`]).
    fn plain(self) -> PlainTask<impl Future<Output = Option<h1::conn::Declined<TcpStream>>>> {
        let Conn { ctx, shared, stream, peer, local, held } = self;
        let own = h1::conn::serve(ctx.clone(), stream, (peer, local), None);
        PlainTask { own, then: Some((ctx, shared, held)), hyper: None }
    }

    /// A connection over TLS, or with a PROXY header first.
    async fn other(self, tls: Option<Arc<tls::Terminator>>) {
        let Conn { ctx, shared, mut stream, mut peer, local, held } = self;
        if ctx.listener.proxy_protocol.is_some() {
            // Boxed: the reading's state is the largest of all, and only its start needs it.
            let read = client_address(&mut stream, peer, &ctx.listener, &ctx.metrics);
            match Box::pin(read).await {
                Some(client) => peer = client,
                None => return,
            }
        }
        let addrs = (peer, local);
        let Some(t) = tls else {
            if let Some(declined) = h1::conn::serve(ctx.clone(), stream, addrs, None).await {
                let hyper = Hyper { ctx: &ctx, shared, peer, local };
                Box::pin(hyper.serve(ClientIo::from(declined.stream), None, declined.read)).await;
            }
            return drop(held);
        };
        match t.accept(stream).await {
            Ok((s, cert)) => {
                let mut cert = cert.unwrap_or_default();
                let conn = s.get_ref().1;
                cert.version = conn.protocol_version().map(tls::version_name);
                cert.sni = conn.server_name().map(std::sync::Arc::from);
                let cert = Some(cert);
                if s.get_ref().1.alpn_protocol() == Some(b"h2") {
                    ctx.metrics.handoffs.inc(Handoff::H2);
                    Hyper { ctx: &ctx, shared, peer, local }
                        .serve(ClientIo::from(s), cert, Vec::new())
                        .await;
                } else if let Some(declined) = h1::conn::serve(ctx.clone(), s, addrs, cert).await {
                    let h1::conn::Declined { stream, cert, read, .. } = declined;
                    Box::pin(Hyper { ctx: &ctx, shared, peer, local }.serve(
                        ClientIo::from(stream),
                        cert,
                        read,
                    ))
                    .await;
                }
            }
            Err(e) => tracing::debug!(listener = %ctx.listener.name, %peer, "{e}"),
        }
        drop(held);
    }
}

pin_project_lite::pin_project! {
    /// A plain connection's task: the own path's future (made before the task, so that the
    /// stream and the addresses are in it alone), then hyper's, boxed, if the own path
    /// declines. Written by hand: an `async` block awaiting the own path's future would hold
    /// it twice, once captured and once moved into the await.
    struct PlainTask<F> {
        #[pin]
        own: F,
        then: Option<(Arc<HttpCtx>, Arc<Shared>, Held)>,
        hyper: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
    }
}

impl<F: Future<Output = Option<h1::conn::Declined<TcpStream>>>> Future for PlainTask<F> {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if this.hyper.is_none() {
            let Poll::Ready(declined) = this.own.as_mut().poll(cx) else { return Poll::Pending };
            let (Some(declined), Some((ctx, shared, held))) = (declined, this.then.take()) else {
                *this.then = None;
                return Poll::Ready(());
            };
            let h1::conn::Declined { stream, read, peer, local, .. } = declined;
            *this.hyper = Some(Box::pin(async move {
                let hyper = Hyper { ctx: &ctx, shared, peer, local };
                hyper.serve(ClientIo::from(stream), None, read).await;
                drop(held);
            }));
        }
        match this.hyper.as_mut().map(|h| h.as_mut().poll(cx)) {
            Some(Poll::Pending) => Poll::Pending,
            _ => Poll::Ready(()),
        }
    }
}

/// The client's address: the connection's own, or the one its PROXY protocol header names
/// (`proxy_protocol`); `None`: the connection was refused (counted; dropping it closes it).
pub(crate) async fn client_address(
    stream: &mut tokio::net::TcpStream,
    peer: SocketAddr,
    listener: &ListenerSpec,
    metrics: &ListenerMetrics,
) -> Option<SocketAddr> {
    let Some(spec) = &listener.proxy_protocol else { return Some(peer) };
    let tcp = listener.protocol == rondo_config::ListenerProtocol::Tcp;
    let timeout = listener.header_read_timeout;
    match proxy_protocol::read(stream, peer, spec, tcp, timeout).await {
        Ok(outcome) => {
            metrics.proxy_protocol(outcome.label());
            Some(match outcome {
                proxy_protocol::Outcome::Client(addr) => addr,
                proxy_protocol::Outcome::Own => peer,
            })
        }
        Err(refused) => {
            metrics.proxy_protocol(refused.label());
            tracing::debug!(listener = %listener.name, %peer, "PROXY protocol: {}", refused.label());
            None
        }
    }
}

/// Requests a connection on hyper's path has carried, against the listener's
/// `max_requests_per_connection`.
#[derive(Default)]
struct ServedCount {
    served: std::sync::atomic::AtomicU64,
    reached: tokio::sync::Notify,
}

impl ServedCount {
    /// One more request; at the `n`th, the connection is told to end.
    fn served(&self, n: u64) {
        if self.served.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n {
            self.reached.notify_one();
        }
    }
}

/// A connection's way to hyper's server.
struct Hyper<'a> {
    ctx: &'a Arc<HttpCtx>,
    shared: Arc<Shared>,
    peer: SocketAddr,
    /// The address the client reached.
    local: SocketAddr,
}

impl Hyper<'_> {
    /// Serves `stream` (whose first bytes, already read, are `read`) with hyper until it
    /// closes. `cert`: what a TLS client's certificate tells members.
    async fn serve(self, stream: ClientIo, cert: Option<tls::ClientCert>, read: Vec<u8>) {
        let Hyper { ctx, shared, peer, local } = self;
        let budget = &shared.budget;
        let client_ip = headers::client_ip_value(peer.ip());
        let header_timeout = ctx.listener.header_read_timeout;
        let shutdown_timeout = ctx.listener.http2.shutdown_timeout;
        let trusted = ctx.listener.trust_forwarded_for.trusts(peer.ip());
        let metrics = ctx.metrics.clone();
        let state =
            ConnState::with_tls(header_timeout, (client_ip, trusted), metrics, cert, (peer, local));
        let limits = h1::parse::Limits {
            max_bytes: ctx.listener.max_header_bytes as usize,
            max_fields: ctx.listener.max_headers as usize,
        };
        // An address over its reset budget gets fewer HTTP/2 streams, then none, until its
        // window ends: a flood that reconnects after each GOAWAY no longer gets a full
        // connection's streams forwarded each time.
        let standing = budget.standing(peer.ip(), std::time::Instant::now());
        let builder = match standing {
            frames::Standing::Good => &shared.builders.usual,
            _ => &shared.builders.reduced,
        };
        let io = TimedIo::new(stream, state.clone(), header_timeout, budget.clone(), peer.ip())
            .with_prefix(read)
            .following(limits)
            .refusing_h2(standing == frames::Standing::Refused);
        let handler = state.clone();
        let live = ctx.live.clone();
        // The listener's `max_connection_age_ms` and `max_requests_per_connection`: GOAWAY
        // (HTTP/2) or a close after the response in progress (HTTP/1) once reached.
        let limits = ctx.listener.connections;
        let aged_at = limits.max_age.map(|age| tokio::time::Instant::now() + age);
        let counted = limits.max_requests.map(|n| (n, Arc::new(ServedCount::default())));
        let count = counted.as_ref().map(|(n, c)| (*n, c.clone()));
        let ctx = ctx.clone();
        let service = service_fn(move |req| {
            if let Some((n, c)) = &count {
                c.served(*n);
            }
            hyper_path::handle(
                ctx.clone(),
                handler.clone(),
                peer,
                req.map(client_body::ClientBody::Hyper),
            )
        });
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => {
                if let Some(status) = r.err().and_then(|e| answered_by_hyper(&*e)) {
                    state.metrics.router_response(status, None, None);
                }
            }
            () = state.idle() => {
                // An idle HTTP/2 connection: GOAWAY, then a bounded wait for it to close
                // (a client that never reads or never acknowledges keeps it no longer).
                state.metrics.idle_timeouts.inc();
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(shutdown_timeout, conn).await;
            }
            () = state.aborted() => {
                // An HTTP/2 connection error: the GOAWAY and the lingering close are under
                // way in `TimedIo`; they get a bounded time.
                let _ = tokio::time::timeout(ABORT_LINGER, conn).await;
            }
            () = async {
                match aged_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            () = async {
                match &counted {
                    Some((_, c)) => c.reached.notified().await,
                    None => std::future::pending().await,
                }
            } => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            () = async {
                live.drain.started().await;
                tokio::time::sleep(DRAIN_IDLE_GRACE).await;
            } => {
                // The process drains: GOAWAY (HTTP/2) or a close once the request in progress
                // is answered (HTTP/1); streams, upgrades and tunnels in progress finish, and
                // the process's drain timeout bounds them all.
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}

/// The status hyper answered a request head it could not parse with, itself, before ending the
/// connection with `e` (its HTTP/1 server's `on_error`): 431 for a head over `max_header_bytes`
/// or `max_headers`, 414 for a URI too long, 400 for a malformed method, URI, header or version.
fn answered_by_hyper(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let e = e.downcast_ref::<hyper::Error>()?;
    if !e.is_parse() {
        return None;
    }
    // hyper's error kinds are private; its messages (`Display`) tell them apart.
    let text = e.to_string();
    if e.is_parse_too_large() {
        return Some(if text.contains("URI") { 414 } else { 431 });
    }
    let malformed = ["invalid HTTP method parsed", "invalid URI", "invalid HTTP version parsed"];
    (malformed.contains(&text.as_str()) || text.starts_with("invalid HTTP header")).then_some(400)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain connection's whole task is what every idle connection holds beside its socket
    /// (issue 36): the own path's future (bounded in `h1::conn`'s tests) and little more.
    #[tokio::test]
    async fn a_plain_connections_task_is_the_own_paths_future_and_three_pointers() {
        let ctx = HttpCtx::plain_for_tests();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client =
            tokio::net::TcpStream::connect(listener.local_addr().expect("addr")).await.expect("c");
        let (stream, peer) = listener.accept().await.expect("accept");
        let shared = Arc::new(Shared {
            builders: Builders {
                usual: http_builder(&ctx.listener, None),
                reduced: http_builder(&ctx.listener, None),
            },
            budget: Arc::new(ResetBudget::new(ctx.listener.http2)),
        });
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().expect("permit");
        let held = Held { _permit: permit, _open: ctx.metrics.opened() };
        let own = std::mem::size_of_val(&h1::conn::serve(
            ctx.clone(),
            tokio::net::TcpStream::connect(listener.local_addr().expect("addr")).await.expect("c"),
            (peer, peer),
            None,
        ));
        let conn = Conn { ctx, shared, stream, peer, local: peer, held };
        let task = std::mem::size_of_val(&conn.plain());
        drop(client);
        assert!(
            task <= own + 64,
            "a plain connection's task is {task} bytes, its own path's {own}"
        );
    }
}
