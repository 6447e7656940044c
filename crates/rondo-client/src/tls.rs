//! TLS for the client library: [`TlsConfig`] (rustls with [`crypto_provider`], TLS 1.2 and 1.3,
//! servers verified against the roots of a PEM file, an optional client certificate) serves
//! `https://` naming endpoints ([`crate::Builder::tls`]) and, through [`HttpsConnector`],
//! hyper-util clients that reach members speaking TLS (under [`crate::Client::layer`] a request
//! `https://service/path` goes to `https://member-address/path`). A handshake that fails is an
//! error naming the host and why: `tls to 10.0.0.7:8443: certificate not valid for 10.0.0.7 (it
//! is for api.internal)`.
//!
//! The configuration, the handshake and the wording of its failures are `rondo-tls`'s
//! [`rondo_tls::Connector`], the same as rondo's own command-line clients use; this file adds
//! the library's error type and the hyper-util connector for `http` and `https` URIs.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rondo_tls::{ClientFiles, Connector};
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tower_service::Service;

/// The crypto provider of every TLS configuration the library builds: ring by default;
/// aws-lc-rs with the feature `aws-lc` (winning when both rustls features are compiled in), with
/// X25519MLKEM768 offered first. The same choice as the router's ([`rondo_tls::provider`]).
pub use rondo_tls::crypto_provider;

/// TLS settings of a client: roots, an optional client certificate, an optional fixed server
/// name, the ALPN protocols offered.
#[derive(Debug, Clone)]
pub struct TlsConfig(Connector);

/// A TLS setting that cannot be used; the display names the file and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsConfigError(String);

impl TlsConfig {
    /// Servers verified against the CA certificates in the PEM file `ca`; no client
    /// certificate; no ALPN.
    pub fn from_ca_file(ca: impl AsRef<Path>) -> Result<TlsConfig, TlsConfigError> {
        Self::load(ClientFiles { ca: ca.as_ref().to_owned(), ..ClientFiles::default() })
    }

    /// [`TlsConfig::from_ca_file`], presenting the certificate chain `cert` (PEM, leaf first)
    /// with its private key `key` (PEM) to servers that ask for one.
    pub fn with_identity_files(
        ca: impl AsRef<Path>,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<TlsConfig, TlsConfigError> {
        let identity = Some((cert.as_ref().to_owned(), key.as_ref().to_owned()));
        Self::load(ClientFiles { ca: ca.as_ref().to_owned(), identity, server_name: None })
    }

    fn load(files: ClientFiles) -> Result<TlsConfig, TlsConfigError> {
        Connector::load(&files, &[]).map(TlsConfig).map_err(TlsConfigError)
    }

    /// A rustls configuration of the caller's (its roots, client certificate and ALPN as they
    /// are).
    pub fn from_rustls(config: Arc<ClientConfig>) -> TlsConfig {
        TlsConfig(Connector::from_config(config, "the configured roots"))
    }

    /// Verify every server for `name` (and send it as SNI) instead of the host connected to:
    /// members registered by IP address whose certificates name the service.
    pub fn server_name(self, name: impl Into<String>) -> Result<TlsConfig, TlsConfigError> {
        self.0.with_server_name(name).map(TlsConfig).map_err(TlsConfigError)
    }

    /// Offer these ALPN protocols (e.g. `[b"h2"]` for gRPC to TLS members).
    pub fn alpn(self, protocols: &[&[u8]]) -> TlsConfig {
        TlsConfig(self.0.with_alpn(protocols))
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
        self.0.connect(tcp, host, target).await
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
