//! Serving an axum API (the admin API, the naming API) on one of the process's TCP listeners:
//! plain or over TLS, stopping with the process's drain. Written once here so that both APIs
//! take TLS, handshakes and the drain the same way.

use std::net::SocketAddr;
use std::sync::Arc;

use rondo_config::tls::ListenerTls;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::sockets::drain::Drain;
use crate::sockets::drain::IDLE_GRACE;
use crate::tls::server::{ALPN_HTTP1, HANDSHAKE_TIMEOUT, TlsIncoming, TlsServer};

/// The TLS server of an API whose section is `section` (`[admin]`, `[naming]`): HTTP/1 only,
/// its handshakes counted in `metrics`; `None` without `spec`.
pub fn tls(
    section: &str,
    spec: Option<&ListenerTls>,
    metrics: &Arc<Metrics>,
) -> std::io::Result<Option<Arc<TlsServer>>> {
    let Some(spec) = spec else { return Ok(None) };
    TlsServer::new(section, spec, ALPN_HTTP1, HANDSHAKE_TIMEOUT, metrics.clone())
        .map(Some)
        .map_err(|e| std::io::Error::other(format!("{section} tls: {e}")))
}

/// Serves `app` on `listener` (through `tls` when set) until the process `drain`s: the drain
/// stops accepting and lets the requests in progress finish. A failure is logged as `what`
/// stopped (`admin API`, `naming API`).
pub fn spawn(
    what: &'static str,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    app: axum::Router,
    drain: Arc<Drain>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let served = match tls {
            Some(tls) => match TlsIncoming::new(listener, tls) {
                Ok(incoming) => {
                    axum::serve(Draining::new(TlsListener(incoming), drain.clone()), app)
                        .with_graceful_shutdown(drained(drain))
                        .await
                }
                Err(e) => Err(e),
            },
            None => {
                axum::serve(Draining::new(listener, drain.clone()), app)
                    .with_graceful_shutdown(drained(drain))
                    .await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "{what} stopped");
        }
    })
}

/// An API listener with TLS: connections come out of their handshake ([`TlsIncoming`], which
/// runs handshakes side by side and counts them) into axum.
struct TlsListener(TlsIncoming);

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.0.next().await {
            Some(conn) => conn,
            // The acceptor only stops when the server is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.0.local_addr())
    }
}

/// Resolves [`IDLE_GRACE`] after `drain` has started: a `'static` future for an axum
/// server's graceful shutdown (`with_graceful_shutdown`), which then closes its idle
/// connections and waits for the requests in progress. Its listener stops accepting at the
/// start of the drain ([`Draining`]).
pub async fn drained(drain: Arc<Drain>) {
    drain.started().await;
    tokio::time::sleep(IDLE_GRACE).await;
}

/// An axum listener that stops accepting when the process's drain starts (the socket itself
/// may live on in the process that took over).
#[derive(Debug)]
pub struct Draining<L> {
    inner: L,
    drain: Arc<Drain>,
}

impl<L> Draining<L> {
    /// `inner`, until `drain` starts.
    pub fn new(inner: L, drain: Arc<Drain>) -> Self {
        Draining { inner, drain }
    }
}

impl<L: axum::serve::Listener> axum::serve::Listener for Draining<L> {
    type Io = L::Io;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        tokio::select! {
            biased;
            () = self.drain.started() => std::future::pending().await,
            conn = self.inner.accept() => conn,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
