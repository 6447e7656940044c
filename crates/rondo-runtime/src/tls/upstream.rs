//! TLS from the router to a cluster's members (`upstream_tls`): the rustls client configuration
//! (the build's crypto provider, TLS 1.2 and 1.3, members verified against the cluster's `ca`,
//! the router's own certificate presented when set) loaded once per view ([`UpstreamTlsRt::load`], so a
//! config reload reads the files again), the handshake ([`UpstreamTlsRt::connect`]) and why one
//! failed ([`TlsFailure`]). The request path, TCP sessions and health checks all connect
//! through here, so they verify members the same way.

use std::sync::Arc;

use rondo_core::{TlsFailure, UpstreamTls};
use rustls::{CertificateError, ClientConfig};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A cluster's TLS to its members, loaded.
#[derive(Debug)]
pub struct UpstreamTlsRt {
    config: Arc<ClientConfig>,
    /// The same without ALPN, for HTTP/1.1 and TCP health checks, which must not be told `h2`
    /// (an `http2` cluster's HTTP checks and gRPC checks use `config`, with `h2`).
    probe_config: Arc<ClientConfig>,
    /// `server_name`, parsed; `None`: each member's host.
    server_name: Option<ServerName<'static>>,
    /// The name shown in errors when `server_name` is set.
    pub server_name_text: Option<String>,
}

/// A handshake failure: why, and a sentence for logs.
#[derive(Debug, Clone)]
pub struct TlsError {
    /// Why, in a word.
    pub why: TlsFailure,
    /// Which member name was expected, and what rustls said.
    pub detail: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.why, self.detail)
    }
}

impl std::error::Error for TlsError {}

/// Classifies a handshake error from tokio-rustls (an `io::Error` wrapping a `rustls::Error`).
pub fn classify(e: &std::io::Error) -> TlsFailure {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map_or(TlsFailure::Handshake, classify_rustls)
}

/// Why TLS failed, when an error in `e`'s chain is rustls's (with TLS 1.3 a member refuses the
/// router's certificate, or its lack of one, after the router's side of the handshake is done:
/// the alert comes with the first read, as a request's error).
pub fn failure_in(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<TlsError>() {
            return Some(t.why);
        }
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(classify_rustls(t));
        }
        if let Some(t) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(classify_rustls(t));
        }
        cur = err.source();
    }
    None
}

/// Why TLS failed, from rustls's error.
pub fn classify_rustls(tls: &rustls::Error) -> TlsFailure {
    match tls {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::NotValidForName
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => TlsFailure::Expired,
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                TlsFailure::UnknownIssuer
            }
            _ => TlsFailure::Handshake,
        },
        rustls::Error::AlertReceived(_) => TlsFailure::Refused,
        _ => TlsFailure::Handshake,
    }
}

impl UpstreamTlsRt {
    /// Reads the files of `spec`; `alpn` is offered (`h2` for HTTP/2 clusters, `http/1.1` for
    /// HTTP/1, nothing for TCP).
    pub fn load(spec: &UpstreamTls, alpn: &[&[u8]]) -> Result<UpstreamTlsRt, String> {
        let identity = match (&spec.cert, &spec.key) {
            (Some(cert), Some(key)) => {
                super::client::check_identity(cert, key)?;
                Some((cert.as_path(), key.as_path()))
            }
            _ => None,
        };
        let mut config = rondo_tls::client_config(&spec.ca, identity, &[])?;
        let probe_config = Arc::new(config.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let server_name = match &spec.server_name {
            None => None,
            Some(n) => Some(
                ServerName::try_from(n.clone())
                    .map_err(|_| format!("`{n}` is not a DNS name or IP address"))?,
            ),
        };
        Ok(UpstreamTlsRt {
            config: Arc::new(config),
            probe_config,
            server_name,
            server_name_text: spec.server_name.clone(),
        })
    }

    /// The TLS handshake with a member over `tcp`; `host` is the member's host (the name
    /// verified when the cluster sets no `server_name`).
    pub async fn connect(
        &self,
        tcp: TcpStream,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        self.connect_with(&self.config, tcp, host).await
    }

    /// [`UpstreamTlsRt::connect`] for an HTTP/1.1 or TCP health check (no ALPN).
    pub async fn connect_probe(
        &self,
        tcp: TcpStream,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        self.connect_with(&self.probe_config, tcp, host).await
    }

    async fn connect_with(
        &self,
        config: &Arc<ClientConfig>,
        tcp: TcpStream,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let (name, text) = match &self.server_name {
            Some(n) => (n.clone(), self.server_name_text.clone().unwrap_or_default()),
            None => {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(host.to_owned()).map_err(|_| TlsError {
                    why: TlsFailure::NotValidForName,
                    detail: format!("`{host}` is not a name a certificate can be checked for"),
                })?;
                (name, host.to_owned())
            }
        };
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| TlsError { why: classify(&e), detail: format!("expected {text}: {e}") })
    }
}

/// The host part of a member address (`host:port`, `[v6]:port`), without brackets: the name
/// its certificate is checked for.
pub use rondo_tls::host_of;
