//! TLS termination on router listeners: a [`Terminator`] per listener with a `tls` table is
//! the listener's [`TlsServer`] (rondo-runtime's: the rustls configuration in force, SNI,
//! ALPN `h2` and `http/1.1` on HTTP listeners, reloads on file changes and SIGHUP, the
//! handshake counters) plus what the request path needs from a handshake: a verified client
//! certificate's subject and subject alternative names, which go to members in
//! [`CLIENT_CERT_SUBJECT`] and [`CLIENT_CERT_SAN`]; incoming copies of those headers are always
//! removed ([`crate::headers::add_client_cert`]).

use std::sync::Arc;
use std::time::Duration;

use rondo_config::tls::ListenerTls;
use rondo_runtime::metrics::Metrics;
use rondo_runtime::tls::server::{ALPN_H2_HTTP1, TlsServer};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

pub use rondo_runtime::tls::server::{
    CLIENT_CERT_SAN, CLIENT_CERT_SUBJECT, ClientCert, client_cert,
};

/// A listener's TLS: its [`TlsServer`].
#[derive(Debug)]
pub struct Terminator {
    server: Arc<TlsServer>,
    /// How long a handshake may take.
    pub handshake_timeout: Duration,
}

impl Terminator {
    /// Loads listener `listener`'s `tls` (`alpn`: offer `h2` and `http/1.1`); handshakes get
    /// `handshake_timeout`.
    pub fn new(
        listener: &str,
        spec: &ListenerTls,
        alpn: bool,
        handshake_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, String> {
        let alpn = if alpn { ALPN_H2_HTTP1 } else { &[] };
        let server = TlsServer::new(listener, spec, alpn, handshake_timeout, metrics)
            .map_err(|e| format!("listener {listener}: tls: {e}"))?;
        Ok(Arc::new(Terminator { server, handshake_timeout }))
    }

    /// The listener's [`TlsServer`] (an HTTP/3 listener's QUIC handshakes take its
    /// certificates, reloads included).
    pub fn server(&self) -> &Arc<TlsServer> {
        &self.server
    }

    /// Reloads every file; on failure the configuration in force stays and the reason is
    /// logged. `source` says what asked (`file change`, `SIGHUP`).
    pub fn reload(&self, source: &str) -> Result<(), String> {
        self.server.reload(source)
    }

    /// The TLS handshake with a client, bounded by the handshake timeout; the stream and, when
    /// the client presented a verified certificate, what to tell members about it.
    pub async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<(TlsStream<TcpStream>, Option<ClientCert>), String> {
        let tls = self.server.accept(stream).await?;
        let cert =
            tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| client_cert(c));
        Ok((tls, cert))
    }

    /// Reloads when any file changes and on SIGHUP, until `stopped`.
    pub fn watch(self: Arc<Self>, stopped: watch::Receiver<bool>) {
        self.server.clone().watch(stopped);
    }
}

/// A negotiated TLS version as access logs write it (`TLSv1.3`).
pub fn version_name(v: tokio_rustls::rustls::ProtocolVersion) -> &'static str {
    use tokio_rustls::rustls::ProtocolVersion;
    match v {
        ProtocolVersion::TLSv1_3 => "TLSv1.3",
        ProtocolVersion::TLSv1_2 => "TLSv1.2",
        ProtocolVersion::TLSv1_1 => "TLSv1.1",
        ProtocolVersion::TLSv1_0 => "TLSv1.0",
        _ => "other",
    }
}
