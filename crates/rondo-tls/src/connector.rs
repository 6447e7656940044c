//! The client side of a TLS connection: [`client_config`] builds the rustls configuration every
//! rondo client uses (the provider of [`crate::provider`], TLS 1.3 and 1.2, servers verified
//! against the roots of a CA file, an optional client certificate, the ALPN offered), and
//! [`Connector`] does the handshake, verifying either the host connected to or a fixed server
//! name, and turns a failure into a sentence naming the target and why (`tls to
//! 127.0.0.1:9900: certificate not signed by a ca in ca.pem`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;

use crate::describe::describe;
use crate::pem::{load_roots, read_certs, read_key};

/// Where a client's TLS settings come from (command-line options, a library's builder).
#[derive(Debug, Clone, Default)]
pub struct ClientFiles {
    /// The CA file servers are verified against.
    pub ca: PathBuf,
    /// The client's certificate chain (PEM, leaf first) and key, for servers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name to verify (and send as SNI) instead of the host the client connects to.
    pub server_name: Option<String>,
}

/// The rustls client configuration: servers verified against the roots in the PEM file `ca`,
/// the certificate chain and key of `identity` (PEM files) presented to servers that ask for
/// one, `alpn` offered. The error names the file and why.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> Result<ClientConfig, String> {
    let roots = load_roots(ca, "ca")?;
    let builder = ClientConfig::builder_with_provider(crate::provider::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("tls versions: {e}"))?
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = read_certs(cert, "certificate")?;
            builder.with_client_auth_cert(chain, read_key(key)?).map_err(|e| {
                format!("client certificate {} with key {}: {e}", cert.display(), key.display())
            })?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A loaded client TLS configuration and the handshake with it.
#[derive(Debug, Clone)]
pub struct Connector {
    config: Arc<ClientConfig>,
    /// Verified instead of the host connected to, when set.
    server_name: Option<String>,
    /// Where the roots came from (named when a server's certificate is not signed by them).
    roots: String,
}

impl Connector {
    /// Reads the files (`alpn`: the protocols offered); the error names the file and why.
    pub fn load(files: &ClientFiles, alpn: &[&[u8]]) -> Result<Connector, String> {
        let identity = files.identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        let config = client_config(&files.ca, identity, alpn)?;
        let connector = Connector::from_config(Arc::new(config), files.ca.display().to_string());
        match &files.server_name {
            Some(n) => connector.with_server_name(n.clone()),
            None => Ok(connector),
        }
    }

    /// A rustls configuration built elsewhere; `roots` says where its roots came from.
    pub fn from_config(config: Arc<ClientConfig>, roots: impl Into<String>) -> Connector {
        Connector { config, server_name: None, roots: roots.into() }
    }

    /// Verify every server for `name` (and send it as SNI) instead of the host connected to.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Result<Connector, String> {
        let name = name.into();
        ServerName::try_from(name.as_str())
            .map_err(|_| format!("server name `{name}` is not a DNS name or IP address"))?;
        self.server_name = Some(name);
        Ok(self)
    }

    /// Offer these ALPN protocols instead.
    pub fn with_alpn(mut self, protocols: &[&[u8]]) -> Connector {
        let mut config = (*self.config).clone();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        self.config = Arc::new(config);
        self
    }

    /// The rustls configuration.
    pub fn config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// Where the roots came from (the CA file's path, as errors name it).
    pub fn roots(&self) -> &str {
        &self.roots
    }

    /// The name verified for `host` (the configured server name, else the host itself).
    pub fn name_for<'a>(&'a self, host: &'a str) -> &'a str {
        self.server_name.as_deref().unwrap_or(host)
    }

    /// The handshake over `io` with `host` (brackets of an IPv6 literal allowed); `target`
    /// (`host:port`, as the user gave it) names the server in the error, which says why the
    /// handshake failed.
    pub async fn connect<IO>(
        &self,
        io: IO,
        host: &str,
        target: &str,
    ) -> Result<TlsStream<IO>, std::io::Error>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = self.name_for(host);
        let server_name = ServerName::try_from(name.to_owned()).map_err(|_| {
            std::io::Error::other(format!(
                "tls to {target}: `{name}` is not a DNS name or IP address"
            ))
        })?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(server_name, io)
            .await
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("tls to {target}: {}", describe(&e, name, &self.roots)),
                )
            })
    }
}
