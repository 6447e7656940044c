//! rondo's router data plane (`rondo serve`): HTTP/1.1 and HTTP/2 (h2c, prior knowledge) on
//! the same port, TCP and UDP ([`udp`]), balanced through `rondo-core` via the live state of
//! `rondo-runtime`.
//!
//! A request's path reads top to bottom in [`http`]: route, pick (sticky, hash or algorithm),
//! send with a per-try timeout, fail over to the next member and then to backup clusters,
//! stream the response back. Around it, [`conn`] enforces the connection limit, the HTTP/1
//! header and idle timers and the HTTP/2 idle timer, and (with [`frames`]) the HTTP/2 frame
//! checks and stream reset budgets; [`headers`] the header hygiene, [`body`] the streaming
//! bodies and in-flight accounting, [`error`] the explained errors, [`access`] the access logs.
//! [`tls`] terminates TLS on listeners that have a `tls` table, under the same timers; with
//! `http3 = true` such a listener also serves HTTP/3 over QUIC (`h3/`, feature `http3`).

pub mod access;
pub mod access_fields;
pub mod body;
mod chain;
pub mod client_body;
pub mod conn;
pub mod cores;
pub mod encode;
mod entropy;
pub mod error;
pub mod frames;
pub mod h1;
#[cfg(feature = "http3")]
mod h3;
pub mod headers;
pub mod http;
mod hyper_path;
pub mod multicast;
mod request_body;
// Tracing with OpenTelemetry (`[tracing]`): real with the `otel` feature, empty without.
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(not(feature = "otel"))]
#[path = "otel/off.rs"]
pub mod otel;
mod proxied;
mod proxy_protocol;
#[cfg(feature = "replay")]
pub mod replay;
pub mod session_replay;
pub mod sni;
pub mod splice;
pub mod sticky;
pub mod tcp;
pub mod tls;
pub mod udp;
pub mod upstream;

// Sign-on tokens and the header-field readers are the identity crate's (a queue listener's
// intake checks the same tokens); the stages name them as the router's own modules.
pub use rondo_identity::{auth, head};

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rondo_config::{ListenerProtocol, ListenerSpec};
use rondo_runtime::Live;
use rondo_runtime::metrics::{Handoff, ListenerMetrics};
use serde::Deserialize as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::access::AccessLog;
use crate::conn::{ClientIo, ConnState, Rejecter, TimedIo};
use crate::frames::ResetBudget;
use crate::http::HttpCtx;
use crate::upstream::Clients;

/// A running router: its bound listeners and a way to stop it.
#[derive(Debug)]
pub struct Router {
    /// Each listener's name and the address it is bound to (useful with port 0).
    pub listeners: Vec<(String, SocketAddr)>,
    stop: watch::Sender<bool>,
    /// Each listener's connection slots (all free: no connection open).
    slots: Vec<(Arc<Semaphore>, u32)>,
    /// The HTTP listeners' shared state (their sticky sessions).
    http: Vec<Arc<HttpCtx>>,
    /// The accept loops (they end on [`Router::stop`]).
    accepting: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Router {
    /// The bound address of listener `name`.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    /// Stops accepting connections (connections in progress finish on their own).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Open client connections, over every listener.
    pub fn open_connections(&self) -> usize {
        self.slots
            .iter()
            .map(|(s, max)| (*max as usize).saturating_sub(s.available_permits()))
            .sum()
    }

    /// Resolves when no client connection is open on any listener (after [`Router::stop`] and
    /// the process's drain, once the last one has finished).
    pub async fn drained(&self) {
        // First the accept loops' end: a connection accepted just before the stop holds its
        // slot by then, so that it is waited for too.
        let loops = std::mem::take(&mut *self.accepting.lock().unwrap_or_else(|e| e.into_inner()));
        for l in loops {
            let _ = l.await;
        }
        for (slots, max) in &self.slots {
            let _ = slots.acquire_many(*max).await;
        }
    }

    /// The HTTP listeners' sticky sessions and sessions' kept requests, for the process that
    /// replaces this one ([`RouterHandoff`]).
    pub fn export_sessions(&self) -> serde_json::Value {
        let now = std::time::Instant::now();
        let mut budget = session_replay::MAX_HANDOFF_BYTES;
        let mut doc = RouterHandoff::default();
        for ctx in &self.http {
            let name = ctx.listener.name.clone();
            doc.sessions.insert(name.clone(), ctx.sessions.export(now));
            doc.replay.insert(name, ctx.sessions.replay.export(now, &mut budget));
        }
        serde_json::to_value(doc).unwrap_or_default()
    }

    /// Takes over what a previous process exported ([`Router::export_sessions`]), by listener,
    /// route, cluster and member name: at the offer, and again at the hand-over (what this
    /// process changed since wins); returns how many sessions were pinned and how many logs
    /// of kept requests were taken.
    pub fn import_sessions(&self, from: &serde_json::Value, live: &Live) -> (usize, usize) {
        let doc = match RouterHandoff::deserialize(from) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("upgrade: the router's sessions are not taken over: {e}");
                return (0, 0);
            }
        };
        let snapshot = live.load();
        let now = std::time::Instant::now();
        let limits = |route: &str| {
            let r = snapshot.view.routes.iter().find(|r| r.name == route)?;
            let rt = snapshot.clusters.get(&r.cluster)?;
            Some((r.session_replay?, rt.spec.sticky.idle_timeout))
        };
        let (mut pinned, mut logs) = (0, 0);
        for ctx in &self.http {
            if let Some(list) = doc.sessions.get(&ctx.listener.name) {
                pinned += ctx.sessions.import(list, &snapshot, now);
            }
            if let Some(list) = doc.replay.get(&ctx.listener.name) {
                logs += ctx.sessions.replay.import(list, &limits, now);
            }
        }
        (pinned, logs)
    }
}

/// The router's part of an upgrade's state document, by listener name. Fields added later
/// have serde defaults: a new process accepts an older one's document.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RouterHandoff {
    /// Header-identified sticky sessions.
    #[serde(default)]
    pub sessions: std::collections::BTreeMap<String, Vec<sticky::Handoff>>,
    /// Sessions' kept requests, for replay.
    #[serde(default)]
    pub replay: std::collections::BTreeMap<String, Vec<session_replay::Handoff>>,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds every listener and starts serving. Errors name the listener and address that failed.
pub async fn start(listeners: &[ListenerSpec], live: Arc<Live>) -> std::io::Result<Router> {
    start_traced(listeners, live, None).await
}

/// [`start`], with every HTTP listener's requests traced by `tracer` (`[tracing]`).
pub async fn start_traced(
    listeners: &[ListenerSpec],
    live: Arc<Live>,
    tracer: Option<Arc<otel::Tracer>>,
) -> std::io::Result<Router> {
    start_on(listeners, live, tracer, &cores::Cores::default()).await
}

/// [`start_traced`], the TCP listeners' connections accepted and served on `cores` (UDP and
/// HTTP/3 on the calling runtime).
pub async fn start_on(
    listeners: &[ListenerSpec],
    live: Arc<Live>,
    tracer: Option<Arc<otel::Tracer>>,
    cores: &cores::Cores,
) -> std::io::Result<Router> {
    let (stop, stopped) = watch::channel(false);
    let clients = Clients::new(rondo_core::Policy::DEFAULT_CONNECT_TIMEOUT);
    let auth = Arc::new(auth::Auth::default());
    // A route's key file that cannot be read is an error at start, not a 401 at the first request.
    for route in live.load().view.routes.iter() {
        if let Some(a) = &route.auth {
            auth.preload(&a.keys).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("route {}: {e}", route.name),
                )
            })?;
        }
    }
    let mut bound = Vec::new();
    let mut slots = Vec::new();
    let mut http = Vec::new();
    let mut accepting = Vec::new();
    // Queue listeners are rondo-queue's (their messages are delivered later, not proxied).
    for spec in listeners.iter().filter(|l| l.protocol != ListenerProtocol::Queue) {
        if spec.protocol == ListenerProtocol::Udp {
            let (addr, flows, receiving) = udp::start(spec, live.clone(), stopped.clone()).await?;
            bound.push((spec.name.clone(), addr));
            slots.push(flows);
            accepting.push(receiving);
            continue;
        }
        let sockets = cores::listen(&live.sockets, spec, cores)?;
        let addr = sockets[0].0.local_addr()?;
        bound.push((spec.name.clone(), addr));
        let limit = Arc::new(Semaphore::new(spec.max_connections as usize));
        slots.push((limit.clone(), spec.max_connections));
        let metrics = live.metrics.listener(&spec.name);
        let tls = match &spec.tls {
            None => None,
            Some(t) => {
                let alpn = spec.protocol == ListenerProtocol::Http;
                let term = tls::Terminator::new(
                    &spec.name,
                    t,
                    alpn,
                    spec.header_read_timeout,
                    live.metrics.clone(),
                )
                .map_err(std::io::Error::other)?;
                term.clone().watch(stopped.clone());
                Some(term)
            }
        };
        match spec.protocol {
            ListenerProtocol::Http => {
                let access = match &spec.access_log {
                    Some(a) => {
                        Some(AccessLog::open(&spec.name, a, metrics.access_dropped.clone())?)
                    }
                    None => None,
                };
                // RFC 7838: the TCP responses point clients at the same port over UDP.
                let alt_svc = spec.http3.and_then(|_| {
                    ::http::HeaderValue::from_str(&format!("h3=\":{}\"", addr.port())).ok()
                });
                let ctx = Arc::new(HttpCtx {
                    listener: spec.clone(),
                    live: live.clone(),
                    views: live.views.clone(),
                    drain: live.drain.clone(),
                    clients: clients.clone(),
                    sessions: Default::default(),
                    metrics,
                    access,
                    auth: auth.clone(),
                    copies: Default::default(),
                    limits: Default::default(),
                    alt_svc,
                    tracer: tracer.clone(),
                });
                http.push(ctx.clone());
                if spec.http3.is_some() {
                    let tls = tls.as_ref().map(|t| t.server());
                    accepting.push(http3(&ctx, addr, tls, limit.clone(), stopped.clone()).await?);
                }
                // One reset budget per listener, whichever runtime accepts a connection.
                let budget = Arc::new(ResetBudget::new(spec.http2));
                for (socket, on) in sockets {
                    let (ctx, tls, stopped) = (ctx.clone(), tls.clone(), stopped.clone());
                    let slots = (limit.clone(), budget.clone());
                    accepting.push(cores::spawn_accept(socket, on.as_ref(), move |l| {
                        accept_http(l, ctx, tls, slots, stopped)
                    }));
                }
            }
            ListenerProtocol::Queue | ListenerProtocol::Udp => {}
            ListenerProtocol::Tcp => {
                let spec = Arc::new(spec.clone());
                for (socket, on) in sockets {
                    let (live, spec, tls) = (live.clone(), spec.clone(), tls.clone());
                    let (slots, stopped) = ((limit.clone(), metrics.clone()), stopped.clone());
                    accepting.push(cores::spawn_accept(socket, on.as_ref(), move |l| {
                        accept_tcp(l, live, spec, tls, slots, stopped)
                    }));
                }
            }
        }
        // Announced by the caller (`rondo serve`'s status line) once every part is bound.
        tracing::debug!(listener = %spec.name, %addr, protocol = spec.protocol.as_str(), tls = spec.tls.is_some(), "listening");
    }
    Ok(Router { listeners: bound, stop, slots, http, accepting: std::sync::Mutex::new(accepting) })
}

/// Serves HTTP/3 beside listener `ctx`'s TCP socket at `addr`, over its `tls`.
#[cfg(feature = "http3")]
async fn http3(
    ctx: &Arc<HttpCtx>,
    addr: SocketAddr,
    tls: Option<&Arc<rondo_runtime::tls::server::TlsServer>>,
    limit: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let name = &ctx.listener.name;
    let tls =
        tls.ok_or_else(|| std::io::Error::other(format!("listener {name}: http3 needs tls")))?;
    h3::start(ctx.clone(), addr, tls, limit, stopped).await
}

/// Without the `http3` feature, a listener with `http3 = true` is an error at start.
#[cfg(not(feature = "http3"))]
async fn http3(
    ctx: &Arc<HttpCtx>,
    _: SocketAddr,
    _: Option<&Arc<rondo_runtime::tls::server::TlsServer>>,
    _: Arc<Semaphore>,
    _: watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    Err(std::io::Error::other(format!(
        "listener {}: http3 needs a rondo built with the `http3` feature",
        ctx.listener.name
    )))
}

/// Streams the client reset before the router accepted them, per HTTP/2 connection, past which
/// h2 itself ends the connection with GOAWAY `ENHANCE_YOUR_CALM` (h2's own default, made
/// explicit; resets of accepted streams are counted by [`frames::ResetBudget`]).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;

/// Streams the router may reset for the client's protocol errors over an HTTP/2 connection's
/// life before h2 ends it with `ENHANCE_YOUR_CALM` (hyper's default, made explicit; the
/// listener's windowed `h2_max_resets` budget usually trips first).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// See [`rondo_runtime::sockets::drain::IDLE_GRACE`]: also how long hyper's connections get before
/// their graceful shutdown (HTTP/2 GOAWAY) once the process drains.
pub const DRAIN_IDLE_GRACE: Duration = rondo_runtime::sockets::drain::IDLE_GRACE;

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

async fn accept_http(
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
        budget: Arc::new(ResetBudget::new(ctx.listener.http2)),
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
async fn client_address(
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

async fn accept_tcp(
    socket: TcpListener,
    live: Arc<Live>,
    spec: Arc<ListenerSpec>,
    tls: Option<Arc<tls::Terminator>>,
    (limit, metrics): (Arc<Semaphore>, Arc<ListenerMetrics>),
    mut stopped: watch::Receiver<bool>,
) {
    let name: Arc<str> = spec.name.as_str().into();
    let (hello_timeout, splice) = (spec.header_read_timeout, spec.splice);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = stopped.changed() => return,
            r = socket.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            metrics.refused.inc();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (live, name, tls, spec) = (live.clone(), name.clone(), tls.clone(), spec.clone());
        let open = metrics.opened();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            let local = stream.local_addr().unwrap_or(spec.listen);
            let Some(peer) = client_address(&mut stream, peer, &spec, &metrics).await else {
                return;
            };
            match tls {
                None => {
                    let opts = (hello_timeout, splice);
                    tcp::handle_plain(live, name, stream, (peer, local), opts).await
                }
                Some(t) => match t.accept(stream).await {
                    Ok((s, _)) => {
                        let sni = s.get_ref().1.server_name().map(str::to_owned);
                        let opts = (sni.as_deref(), splice);
                        tcp::handle(live, name, s, (peer, local), opts, &[]).await;
                    }
                    Err(e) => tracing::debug!(listener = %name, %peer, "{e}"),
                },
            }
            drop(permit);
            drop(open);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain connection's whole task is what every idle connection holds beside its socket
    /// (issue 36): the own path's future (bounded in `h1::conn`'s tests) and little more.
    #[tokio::test]
    async fn a_plain_connections_task_is_the_own_paths_future_and_three_pointers() {
        let config = rondo_config::parse_str(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n",
            std::path::Path::new("t.toml"),
            1,
        )
        .expect("config");
        let live = Arc::new(Live::new(config.view.clone(), None));
        let ctx = Arc::new(HttpCtx::detached(config.listeners[0].clone(), live));
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
