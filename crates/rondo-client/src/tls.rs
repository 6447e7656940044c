//! TLS for the client library: [`TlsConfig`] (rustls with [`crypto_provider`], TLS 1.2 and 1.3,
//! servers verified against the roots of a PEM file, an optional client certificate) serves
//! `https://` naming endpoints ([`crate::Builder::tls`]) and, through [`HttpsConnector`],
//! hyper-util clients that reach members speaking TLS (under [`crate::Client::layer`] a request
//! `https://service/path` goes to `https://member-address/path`). A handshake that fails is an
//! error naming the host and why: `tls to 10.0.0.7:8443: certificate not valid for 10.0.0.7 (it
//! is for api.internal)`.
//!
//! This looks like `rondo_runtime::tls::upstream` (the router's TLS to members) and stays apart
//! on purpose: the client may use only `rondo-core` and `rondo-clock`, and what the two share
//! is written over rustls's types (the config builder, the reading of `rustls::Error`), which
//! the pure core must not depend on. The parts differ besides: the runtime sorts a failure into
//! `TlsFailure` for metrics and 502s, this file words it for a library user with the names and
//! roots involved, and only this one is a hyper-util connector for `http` and `https` URIs.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::{CertificateError, ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tower_service::Service;

/// The crypto provider of every TLS configuration the library builds: ring by default;
/// aws-lc-rs with the feature `aws-lc` (winning when both rustls features are compiled in), with
/// X25519MLKEM768 offered first. The library's own copy of `rondo_config::crypto`'s choice: it
/// may use no router crate.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            #[cfg(feature = "aws-lc")]
            let provider = {
                use rustls::crypto::aws_lc_rs::{self, kx_group};
                rustls::crypto::CryptoProvider {
                    kx_groups: vec![
                        kx_group::X25519MLKEM768,
                        kx_group::X25519,
                        kx_group::SECP256R1,
                        kx_group::SECP384R1,
                    ],
                    ..aws_lc_rs::default_provider()
                }
            };
            #[cfg(not(feature = "aws-lc"))]
            let provider = rustls::crypto::ring::default_provider();
            Arc::new(provider)
        })
        .clone()
}

/// TLS settings of a client: roots, an optional client certificate, an optional fixed server
/// name, the ALPN protocols offered.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    config: Arc<ClientConfig>,
    server_name: Option<String>,
    /// Where the roots came from (named in verification errors).
    roots: String,
}

/// A TLS setting that cannot be used; the display names the file and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsConfigError(String);

fn read(path: &Path, what: &str) -> Result<Vec<u8>, TlsConfigError> {
    std::fs::read(path)
        .map_err(|e| TlsConfigError(format!("cannot read {what} file {}: {e}", path.display())))
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let pem = read(path, what)?;
    let certs: Vec<_> =
        CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| {
            TlsConfigError(format!("{what} file {} is not valid PEM: {e}", path.display()))
        })?;
    if certs.is_empty() {
        return Err(TlsConfigError(format!(
            "{what} file {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

impl TlsConfig {
    /// Servers verified against the CA certificates in the PEM file `ca`; no client
    /// certificate; no ALPN.
    pub fn from_ca_file(ca: impl AsRef<Path>) -> Result<TlsConfig, TlsConfigError> {
        Self::build(ca.as_ref(), None)
    }

    /// [`TlsConfig::from_ca_file`], presenting the certificate chain `cert` (PEM, leaf first)
    /// with its private key `key` (PEM) to servers that ask for one.
    pub fn with_identity_files(
        ca: impl AsRef<Path>,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<TlsConfig, TlsConfigError> {
        Self::build(ca.as_ref(), Some((cert.as_ref(), key.as_ref())))
    }

    fn build(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<TlsConfig, TlsConfigError> {
        let mut roots = RootCertStore::empty();
        for c in certs(ca, "ca")? {
            roots.add(c).map_err(|e| {
                TlsConfigError(format!("ca file {}: unusable CA certificate: {e}", ca.display()))
            })?;
        }
        let builder = ClientConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsConfigError(format!("tls versions: {e}")))?
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certs(cert, "certificate")?;
                let pem = read(key, "key")?;
                let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    TlsConfigError(format!("key file {}: no usable PEM key: {e}", key.display()))
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    TlsConfigError(format!(
                        "client certificate {} with key {}: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?
            }
        };
        Ok(TlsConfig {
            config: Arc::new(config),
            server_name: None,
            roots: ca.display().to_string(),
        })
    }

    /// A rustls configuration of the caller's (its roots, client certificate and ALPN as they
    /// are).
    pub fn from_rustls(config: Arc<ClientConfig>) -> TlsConfig {
        TlsConfig { config, server_name: None, roots: "the configured roots".to_owned() }
    }

    /// Verify every server for `name` (and send it as SNI) instead of the host connected to:
    /// members registered by IP address whose certificates name the service.
    pub fn server_name(mut self, name: impl Into<String>) -> Result<TlsConfig, TlsConfigError> {
        let name = name.into();
        ServerName::try_from(name.as_str())
            .map_err(|_| TlsConfigError(format!("`{name}` is not a DNS name or IP address")))?;
        self.server_name = Some(name);
        Ok(self)
    }

    /// Offer these ALPN protocols (e.g. `[b"h2"]` for gRPC to TLS members).
    pub fn alpn(mut self, protocols: &[&[u8]]) -> TlsConfig {
        let mut config = (*self.config).clone();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        self.config = Arc::new(config);
        self
    }

    /// A hyper-util connector: `https` URIs over TLS with these settings, `http` ones plain.
    pub fn connector(&self) -> HttpsConnector {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        HttpsConnector { http, tls: self.clone() }
    }

    /// The handshake over `tcp` with `host` (`target`, `host:port`, names it in errors).
    pub async fn connect(
        &self,
        tcp: TcpStream,
        host: &str,
        target: &str,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = self.server_name.as_deref().unwrap_or(host);
        let server_name = ServerName::try_from(name.to_owned()).map_err(|_| {
            std::io::Error::other(format!("tls to {target}: `{name}` is not a DNS name or IP"))
        })?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(server_name, tcp)
            .await
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("tls to {target}: {}", describe(&e, name, &self.roots)),
                )
            })
    }
}

/// A name as rustls lists a certificate's names (`DnsName("a.test")`, `IpAddress(10.0.0.1)`),
/// without the wrapping.
fn plain_name(n: &str) -> &str {
    n.strip_prefix("DnsName(\"")
        .and_then(|r| r.strip_suffix("\")"))
        .or_else(|| n.strip_prefix("IpAddress(").and_then(|r| r.strip_suffix(')')))
        .unwrap_or(n)
}

/// Why a handshake failed, in words (`name`: the name the certificate was checked for).
fn describe(e: &std::io::Error, name: &str, roots: &str) -> String {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the server closed the connection in the handshake (does it speak tls?)".to_owned()
            }
            _ => format!("handshake failed: {e}"),
        };
    };
    match tls {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::NotValidForNameContext { presented, .. } => format!(
                "certificate not valid for {name} (it is for {})",
                if presented.is_empty() {
                    "no name".to_owned()
                } else {
                    presented.iter().map(|n| plain_name(n)).collect::<Vec<_>>().join(", ")
                }
            ),
            CertificateError::NotValidForName => format!("certificate not valid for {name}"),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "certificate expired".to_owned()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "certificate not valid yet".to_owned()
            }
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("certificate not signed by a ca in {roots}")
            }
            other => format!("invalid certificate: {other:?}"),
        },
        rustls::Error::AlertReceived(alert) => format!(
            "the server refused the handshake ({alert:?}): it may want a client certificate \
             it trusts"
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server does not speak tls (or not tls 1.2 or 1.3)".to_owned()
        }
        other => format!("handshake failed: {other}"),
    }
}

/// hyper-util's connector for `https` (TLS with a [`TlsConfig`]) and `http` URIs; see
/// [`TlsConfig::connector`].
#[derive(Debug, Clone)]
pub struct HttpsConnector {
    http: HttpConnector,
    tls: TlsConfig,
}

impl HttpsConnector {
    /// How long connecting (TCP) may take.
    pub fn set_connect_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.http.set_connect_timeout(timeout);
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Service<Uri> for HttpsConnector {
    type Response = MaybeTls;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<MaybeTls, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let https = uri.scheme_str() == Some("https");
            let host = uri.host().unwrap_or_default().to_owned();
            let target = uri.authority().map_or_else(|| host.clone(), |a| a.to_string());
            let tcp = http.call(uri).await?;
            if !https {
                return Ok(MaybeTls::Plain(tcp));
            }
            let s = tls.connect(tcp.into_inner(), &host, &target).await?;
            Ok(MaybeTls::Tls(Box::new(TokioIo::new(s))))
        })
    }
}

/// A connection made by [`HttpsConnector`].
#[derive(Debug)]
pub enum MaybeTls {
    /// An `http` URI's.
    Plain(TokioIo<TcpStream>),
    /// An `https` URI's.
    Tls(Box<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>),
}

impl hyper::rt::Read for MaybeTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for MaybeTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

impl Connection for MaybeTls {
    fn connected(&self) -> Connected {
        match self {
            MaybeTls::Plain(s) => s.connected(),
            MaybeTls::Tls(s) => {
                let (tcp, session) = s.inner().get_ref();
                let c = tcp.connected();
                if session.alpn_protocol() == Some(b"h2") { c.negotiated_h2() } else { c }
            }
        }
    }
}
