//! TLS termination on router listeners: a [`Terminator`] per listener with a `tls` table is
//! the listener's [`TlsServer`] (rondo-runtime's: the rustls configuration in force, SNI,
//! ALPN `h2` and `http/1.1` on HTTP listeners, reloads on file changes and SIGHUP, the
//! handshake counters) plus what the request path needs from a handshake: a verified client
//! certificate's subject and subject alternative names, which go to members in
//! [`CLIENT_CERT_SUBJECT`] and [`CLIENT_CERT_SAN`]; incoming copies of those headers are always
//! removed ([`crate::headers::add_client_cert`]).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use rondo_config::tls::ListenerTls;
use rondo_runtime::metrics::Metrics;
use rondo_runtime::tls_server::{ALPN_H2_HTTP1, TlsServer};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

/// The header carrying a verified client certificate's subject (RFC 4514 form).
pub const CLIENT_CERT_SUBJECT: &str = "x-client-cert-subject";
/// The header carrying a verified client certificate's subject alternative names
/// (`DNS:a.example, IP:127.0.0.1, URI:spiffe://..., email:x@y`, comma separated).
pub const CLIENT_CERT_SAN: &str = "x-client-cert-san";

/// A listener's TLS: its [`TlsServer`].
#[derive(Debug)]
pub struct Terminator {
    server: Arc<TlsServer>,
    /// How long a handshake may take.
    pub handshake_timeout: Duration,
}

/// What a completed handshake tells the request path.
#[derive(Debug, Clone, Default)]
pub struct ClientCert {
    /// [`CLIENT_CERT_SUBJECT`]'s value.
    pub subject: Option<HeaderValue>,
    /// [`CLIENT_CERT_SAN`]'s value.
    pub san: Option<HeaderValue>,
}

/// A header value from text, with anything not visible ASCII escaped (`\u{..}`).
fn header_value(s: &str) -> Option<HeaderValue> {
    let clean: String = s
        .chars()
        .flat_map(|c| {
            if c.is_ascii_graphic() || c == ' ' { vec![c] } else { c.escape_unicode().collect() }
        })
        .collect();
    HeaderValue::from_str(&clean).ok()
}

/// The subject and subject alternative names of a (verified) client certificate.
pub fn client_cert(der: &[u8]) -> ClientCert {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return ClientCert::default();
    };
    let subject = header_value(&cert.subject().to_string());
    let mut sans = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => sans.push(format!("DNS:{d}")),
                GeneralName::RFC822Name(e) => sans.push(format!("email:{e}")),
                GeneralName::URI(u) => sans.push(format!("URI:{u}")),
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b)
                            .ok()
                            .map(|a| std::net::IpAddr::from(a).to_string()),
                        16 => <[u8; 16]>::try_from(*b)
                            .ok()
                            .map(|a| std::net::IpAddr::from(a).to_string()),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        sans.push(format!("IP:{ip}"));
                    }
                }
                _ => {}
            }
        }
    }
    let san = (!sans.is_empty()).then(|| header_value(&sans.join(", "))).flatten();
    ClientCert { subject, san }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_escape_what_a_header_cannot_hold() {
        assert_eq!(header_value("CN=a, O=b").unwrap(), "CN=a, O=b");
        assert_eq!(header_value("CN=\u{e9}\n").unwrap(), "CN=\\u{e9}\\u{a}");
    }
}
