//! TLS from rondo's own command-line clients to rondo's control plane: `rondo ctl` to the admin
//! API and `rondo agent` to a router's first-contact listener. [`ClientTls`] is
//! [`rondo_tls::Connector`] (the configuration, the handshake, a failure in words: `tls to
//! 127.0.0.1:9900: certificate not valid for 127.0.0.1 (it is for admin.internal)`) with the
//! router's own checks of a client certificate first: an expired certificate or a key that does
//! not match it is named before any server is asked.

use std::path::Path;

use rondo_config::tls as ctls;
use rondo_tls::Connector;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub use rondo_tls::{ClientFiles as ClientTlsFiles, describe, describe_rustls, host_of, rustls_in};

/// A loaded client TLS configuration.
#[derive(Debug, Clone)]
pub struct ClientTls(Connector);

/// Checks a client certificate and its key as the router checks its own (both readable PEM,
/// the key of the leaf, the leaf not expired); the error names the file and why.
pub(crate) fn check_identity(cert: &Path, key: &Path) -> Result<(), String> {
    let paths = ctls::CertKeyPaths { cert: cert.to_owned(), key: key.to_owned(), ocsp: None };
    ctls::load_cert_key(&paths).map(|_| ()).map_err(|(_, e)| e)
}

impl ClientTls {
    /// Reads the files (`alpn`: the protocols offered); the error names the file and why.
    pub fn load(files: &ClientTlsFiles, alpn: &[&[u8]]) -> Result<ClientTls, String> {
        if let Some((cert, key)) = &files.identity {
            check_identity(cert, key)?;
        }
        Connector::load(files, alpn).map(ClientTls)
    }

    /// Where the roots came from (the CA file), as errors name it.
    pub fn roots(&self) -> &str {
        self.0.roots()
    }

    /// The name verified for `host` (the configured server name, else the host itself).
    pub fn name_for<'a>(&'a self, host: &'a str) -> &'a str {
        self.0.name_for(host)
    }

    /// The handshake over `tcp` with the server at `target` (`host:port`, as the user gave
    /// it); the error names `target` and why the handshake failed.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        target: &str,
    ) -> Result<TlsStream<TcpStream>, String> {
        self.0.connect(tcp, host_of(target), target).await.map_err(|e| e.to_string())
    }
}
