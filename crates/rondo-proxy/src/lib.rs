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

mod accept;
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
use std::time::Duration;

use rondo_config::{ListenerProtocol, ListenerSpec};
use rondo_runtime::Live;
use rondo_runtime::metrics::ListenerMetrics;
use serde::Deserialize as _;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::accept::{accept_http, client_address};
use crate::access::AccessLog;
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

/// See [`rondo_runtime::sockets::drain::IDLE_GRACE`]: also how long hyper's connections get before
/// their graceful shutdown (HTTP/2 GOAWAY) once the process drains.
pub const DRAIN_IDLE_GRACE: Duration = rondo_runtime::sockets::drain::IDLE_GRACE;

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
