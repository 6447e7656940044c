//! A failed TLS handshake in words, for the person who has to fix it: which name the
//! certificate was checked for and which names it has, which roots it is not signed by, or that
//! the server does not speak TLS at all. The router's own command-line clients and the client
//! library say the same things the same way.

use rustls::CertificateError;

/// Why a client handshake failed, in words: `name` is the name the server's certificate was
/// checked for, `roots` where the roots came from (a CA file's path).
pub fn describe(e: &std::io::Error, name: &str, roots: &str) -> String {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the server closed the connection in the handshake (does it speak tls?)".to_owned()
            }
            _ => format!("handshake failed: {e}"),
        };
    };
    describe_rustls(tls, name, roots)
}

/// [`describe`] from rustls's error.
pub fn describe_rustls(tls: &rustls::Error, name: &str, roots: &str) -> String {
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

/// The host of `host:port` or `[v6]:port`, without brackets.
pub fn host_of(target: &str) -> &str {
    let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A name as rustls lists a certificate's names (`DnsName("a.test")`, `IpAddress(10.0.0.1)`),
/// without the wrapping.
fn plain_name(n: &str) -> &str {
    n.strip_prefix("DnsName(\"")
        .and_then(|r| r.strip_suffix("\")"))
        .or_else(|| n.strip_prefix("IpAddress(").and_then(|r| r.strip_suffix(')')))
        .unwrap_or(n)
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
