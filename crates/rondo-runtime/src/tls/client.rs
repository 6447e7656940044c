//! TLS from rondo's own command-line clients to rondo's control plane: `rondo ctl` to the admin
//! API and `rondo agent` to a router's first-contact listener. [`ClientTls`] holds the rustls
//! client configuration (the build's crypto provider, TLS 1.2 and 1.3, the servers verified
//! against the roots of a CA file, an optional client certificate) and does the handshake; a failed handshake
//! becomes a sentence naming the host and why ([`describe`]), e.g. `tls to 127.0.0.1:9900:
//! certificate not valid for 127.0.0.1 (it names admin.internal)`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rondo_config::tls as ctls;
use rustls::{CertificateError, ClientConfig};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Where a client's TLS settings come from (command-line options).
#[derive(Debug, Clone, Default)]
pub struct ClientTlsFiles {
    /// The CA file servers are verified against.
    pub ca: PathBuf,
    /// The client's certificate chain and key, for servers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name to verify instead of the host the client connects to.
    pub server_name: Option<String>,
}

/// A loaded client TLS configuration.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    ca: PathBuf,
    server_name: Option<String>,
}

impl ClientTls {
    /// Reads the files (`alpn`: the protocols offered); the error names the file and why.
    pub fn load(files: &ClientTlsFiles, alpn: &[&[u8]]) -> Result<ClientTls, String> {
        let roots = ctls::load_roots(&files.ca, "ca")?;
        let builder = ClientConfig::builder_with_provider(rondo_config::crypto::crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("tls versions: {e}"))?
            .with_root_certificates(roots);
        let mut config = match &files.identity {
            Some((cert, key)) => {
                let paths = ctls::CertKeyPaths { cert: cert.clone(), key: key.clone(), ocsp: None };
                let loaded = ctls::load_cert_key(&paths).map_err(|(_, e)| e)?;
                builder
                    .with_client_auth_cert(loaded.certified.cert.clone(), ctls::read_key(key)?)
                    .map_err(|e| format!("client certificate {}: {e}", cert.display()))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        if let Some(n) = &files.server_name {
            ServerName::try_from(n.as_str())
                .map_err(|_| format!("server name `{n}` is not a DNS name or IP address"))?;
        }
        Ok(ClientTls {
            config: Arc::new(config),
            ca: files.ca.clone(),
            server_name: files.server_name.clone(),
        })
    }

    /// The CA file.
    pub fn ca(&self) -> &Path {
        &self.ca
    }

    /// The name verified for `host` (the configured server name, else the host itself).
    pub fn name_for<'a>(&'a self, host: &'a str) -> &'a str {
        self.server_name.as_deref().unwrap_or(host)
    }

    /// The handshake over `tcp` with the server at `target` (`host:port`, as the user gave
    /// it); the error names `target` and why the handshake failed.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        target: &str,
    ) -> Result<TlsStream<TcpStream>, String> {
        let host = host_of(target);
        let name = self.name_for(host);
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|_| format!("tls to {target}: `{name}` is not a DNS name or IP address"))?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("tls to {target}: {}", describe(&e, name, &self.ca)))
    }
}

/// The host of `host:port` or `[v6]:port`, without brackets.
pub fn host_of(target: &str) -> &str {
    let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Why a client handshake failed, in words: `name` is the name the server's certificate was
/// checked for, `ca` the roots' file.
pub fn describe(e: &std::io::Error, name: &str, ca: &Path) -> String {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the server closed the connection in the handshake (does it speak tls?)".to_owned()
            }
            _ => format!("handshake failed: {e}"),
        };
    };
    describe_rustls(tls, name, ca)
}

/// A name as rustls lists a certificate's names (`DnsName("a.test")`, `IpAddress(10.0.0.1)`),
/// without the wrapping.
fn plain_name(n: &str) -> &str {
    n.strip_prefix("DnsName(\"")
        .and_then(|r| r.strip_suffix("\")"))
        .or_else(|| n.strip_prefix("IpAddress(").and_then(|r| r.strip_suffix(')')))
        .unwrap_or(n)
}

/// The rustls error in `e`'s chain, if any (an alert that arrives after the handshake, as TLS
/// 1.3 servers refuse client certificates, comes with the first read).
pub fn rustls_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        if let Some(t) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// [`describe`] from rustls's error.
pub fn describe_rustls(tls: &rustls::Error, name: &str, ca: &Path) -> String {
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
                format!("certificate not signed by a ca in {}", ca.display())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_port_and_brackets() {
        assert_eq!(host_of("127.0.0.1:9900"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9900"), "::1");
        assert_eq!(host_of("admin.internal:443"), "admin.internal");
    }

    #[test]
    fn certificate_names_lose_their_wrapping() {
        assert_eq!(plain_name("DnsName(\"a.test\")"), "a.test");
        assert_eq!(plain_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(plain_name("URI(x)"), "URI(x)");
    }
}
