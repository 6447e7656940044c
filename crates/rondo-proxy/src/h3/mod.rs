//! HTTP/3 listeners (feature `http3`): a TLS `http` listener with `http3 = true` also serves
//! QUIC on UDP at its port, through quinn (the ring provider, the listener's certificates and
//! their reloads) and the h3 crate. Requests go through hyper's path ([`crate::hyper_path`]):
//! the same routes, filters, auth, sessions and failover as HTTP/1 and HTTP/2, to HTTP/1.1 or
//! HTTP/2 members.
//!
//! The accept loop here is where the protections are: a new connection over the listener's
//! `max_connections` (shared with its TCP connections) is refused; once more than
//! `http3_retry_above` handshakes are in progress, a client must first prove its address with
//! a stateless Retry, so a flood of Initials from spoofed addresses holds no state; quinn
//! itself keeps the anti-amplification limit (three times what an unvalidated address sent),
//! bounds the Initials waiting here, and drops datagrams that parse as no QUIC packet.
//! [`conn`] serves one connection (its streams' cap and idle timeout are the transport's).
//! 0-RTT is off unless `http3_0rtt`; then [`conn`] answers 425 to unsafe requests that arrive
//! before the handshake is complete.

mod amplify;
pub(crate) mod body;
mod conn;
mod socket;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use quinn::crypto::rustls::QuicServerConfig;
use rondo_config::Http3Spec;
use rondo_runtime::metrics::Http3Metrics;
use rondo_runtime::tls::server::TlsServer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::http::HttpCtx;

/// The ALPN of HTTP/3 (RFC 9114 3.1).
const ALPN_H3: &[u8] = b"h3";

/// Unidirectional streams a client may open: HTTP/3's control stream and QPACK's two, with
/// room for reserved (grease) stream types; push is not offered.
const MAX_UNI_STREAMS: u32 = 8;

/// Initials quinn keeps waiting for this loop (beyond them, it drops new ones unanswered).
const MAX_INCOMING: usize = 4096;

/// What the accept loop and every connection of one listener share.
struct Shared {
    ctx: Arc<HttpCtx>,
    spec: Http3Spec,
    metrics: Http3Metrics,
    /// Handshakes begun and not finished.
    handshaking: AtomicU32,
    /// The endpoint's socket (steering, amplification accounting).
    socket: Arc<socket::Socket>,
}

/// The QUIC configuration new handshakes get, made again whenever the listener's TLS
/// configuration in force changes (a reload of its certificates or of its `client_ca`: the
/// client certificate checks are fixed in a rustls configuration, so they cannot be looked up
/// per handshake as the certificate is).
struct Current {
    tls: Arc<TlsServer>,
    /// The TLS configuration `quic` was made from, and `quic`.
    made: (Arc<rustls::ServerConfig>, Arc<quinn::ServerConfig>),
}

impl Current {
    /// The configuration for a new handshake: the one made last, or a new one when the TLS
    /// configuration changed (one that cannot be made keeps the last: the reload was accepted
    /// for TCP, so this cannot fail but on a QUIC-only limit).
    fn get(&mut self, spec: Http3Spec) -> Arc<quinn::ServerConfig> {
        let now = self.tls.config();
        if !Arc::ptr_eq(&now, &self.made.0) {
            match server_config(&self.tls, &now, spec) {
                Ok(quic) => self.made = (now, Arc::new(quic)),
                Err(e) => {
                    tracing::warn!(error = %e, "http3: the reloaded tls configuration is not usable for quic")
                }
            }
        }
        self.made.1.clone()
    }
}

/// Binds `ctx`'s listener's UDP socket at `addr` (its TCP socket's address: the same port;
/// handed over in an upgrade like the TCP one) and serves HTTP/3 on it until `stopped`.
pub(crate) async fn start(
    ctx: Arc<HttpCtx>,
    addr: SocketAddr,
    tls: &Arc<TlsServer>,
    limit: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
) -> std::io::Result<JoinHandle<()>> {
    let name = &ctx.listener.name;
    let Some(spec) = ctx.listener.http3 else {
        return Err(std::io::Error::other(format!("listener {name}: no http3")));
    };
    let what = format!("listener {name} quic");
    let (socket, steer) =
        ctx.live.sockets.quic(&what, ctx.listener.listen, addr).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot bind {what} to udp {addr}: {e}"))
        })?;
    let base = tls.config();
    let config = server_config(tls, &base, spec)
        .map_err(|e| std::io::Error::other(format!("listener {name}: http3: {e}")))?;
    let metrics = ctx.live.metrics.http3(name);
    let runtime = Arc::new(quinn::TokioRuntime);
    let inner = quinn::Runtime::wrap_udp_socket(&*runtime, socket.into_std()?)?;
    let prefix = steer.prefix();
    let socket = Arc::new(socket::Socket::new(inner, steer, &metrics));
    let mut endpoint_config = quinn::EndpointConfig::default();
    // The connection ids say which process issued them: an upgrade steers by them.
    endpoint_config.cid_generator(move || Box::new(socket::Cids(prefix)));
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        endpoint_config,
        Some(config.clone()),
        socket.clone(),
        runtime,
    )?;
    let current = Current { tls: tls.clone(), made: (base, Arc::new(config)) };
    let shared = Arc::new(Shared { ctx, spec, metrics, handshaking: AtomicU32::new(0), socket });
    tracing::debug!(listener = %shared.ctx.listener.name, %addr, "listening for http3 (udp)");
    Ok(tokio::spawn(accept(endpoint, shared, current, limit, stopped)))
}

/// The QUIC server configuration made from the listener's TLS configuration `base` (its
/// certificate looked up in the configuration in force at each handshake, its client
/// certificate checks `base`'s) with ALPN `h3`, TLS 1.3 only (QUIC's), no early data, and
/// the listener's stream cap and idle timeout.
fn server_config(
    tls: &Arc<TlsServer>,
    base: &rustls::ServerConfig,
    spec: Http3Spec,
) -> Result<quinn::ServerConfig, String> {
    let mut rustls = base.clone();
    rustls.alpn_protocols = vec![ALPN_H3.to_vec()];
    // Early data only with `http3_0rtt` (QUIC allows no size but 0 or all): it can be replayed
    // by anyone who saw it, so `conn` serves only safe methods from it. rustls accepts it only
    // on a resumption its session cache has (each ticket once).
    rustls.max_early_data_size = if spec.zero_rtt { u32::MAX } else { 0 };
    rustls.cert_resolver = Arc::new(Reloaded(tls.clone()));
    let crypto = QuicServerConfig::try_from(Arc::new(rustls)).map_err(|e| e.to_string())?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(spec.max_streams))
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(MAX_UNI_STREAMS))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(spec.idle_timeout).map_err(|e| e.to_string())?,
        ));
    config.transport_config(Arc::new(transport)).max_incoming(MAX_INCOMING);
    Ok(config)
}

/// The certificate of the listener's TLS configuration in force: a reload of its files
/// (`TlsServer::reload`) reaches new QUIC handshakes too.
#[derive(Debug)]
struct Reloaded(Arc<TlsServer>);

impl ResolvesServerCert for Reloaded {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.config().cert_resolver.resolve(hello)
    }
}

/// Takes new connections until `stopped`: refused over the connection limit, asked for a
/// Retry under load, otherwise handed to [`conn::serve`]. Then new connections are refused and
/// those open finish on their own.
async fn accept(
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    mut current: Current,
    limit: Arc<Semaphore>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let incoming = tokio::select! {
            biased;
            _ = stopped.changed() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let m = &shared.metrics;
        if incoming.remote_address_validated() {
            // A Retry token: quinn lifted the amplification limit.
            shared.socket.forget(incoming.remote_address());
        }
        if !incoming.remote_address_validated()
            && shared.handshaking.load(Ordering::Relaxed) >= shared.spec.retry_above
        {
            if incoming.may_retry() {
                m.retried.inc();
                let _ = incoming.retry();
            } else {
                // A Retry token that did not validate: no second Retry for it.
                m.ignored.inc();
                incoming.ignore();
            }
            continue;
        }
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            m.refused.inc();
            shared.ctx.metrics.refused.inc();
            incoming.refuse();
            continue;
        };
        match incoming.accept_with(current.get(shared.spec)) {
            Ok(connecting) => {
                shared.handshaking.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(conn::serve(shared.clone(), connecting, permit));
            }
            Err(_) => {
                m.handshake_failed.inc();
            }
        }
    }
    // Connections open keep the endpoint's driver running until they close.
    endpoint.set_server_config(None);
}
