//! TLS material: the settings of a listener's `tls` table ([`ListenerTls`]) and the loading and
//! checking of the PEM files they name ([`load_cert_key`], [`load_roots`]). The same
//! functions serve `rondo check` (which reports a missing file, unreadable PEM, a key that does
//! not match its certificate or an expired certificate at the field that names the file), the
//! router at start, and the router's certificate reloads (which keep the old certificate when a
//! new file fails them). PEM files are read by [`rondo_tls::pem`] (shared with the client
//! library); key loading and matching go through the build's crypto provider
//! ([`crate::crypto`]); names and validity dates through `x509-parser`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::sign::CertifiedKey;

pub use rondo_tls::pem::{load_roots, read_certs, read_key};

/// Whether a TLS listener asks clients for a certificate (`client_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// Asked for; a client without one is served, a client with one that does not verify
    /// against `client_ca` is refused.
    Optional,
    /// Required: the handshake fails without a certificate that verifies against `client_ca`.
    Required,
}

impl ClientAuth {
    /// Every setting.
    pub const ALL: [ClientAuth; 3] = [ClientAuth::None, ClientAuth::Optional, ClientAuth::Required];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "required",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        ClientAuth::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// One certificate chain and its private key (PEM files; relative paths resolved against the
/// configuration file's directory).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertKeyPaths {
    /// The chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Where the OCSP response stapled to handshakes comes from (listeners only; none: no
    /// staple).
    pub ocsp: Option<crate::ocsp::OcspSource>,
}

/// A listener's `tls`: terminate TLS 1.2 and 1.3 with these certificates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenerTls {
    /// The certificates, chosen by SNI; the first is the default (no SNI, or no name matches).
    pub certs: Vec<CertKeyPaths>,
    /// The roots client certificates are verified against (needed unless `client_auth` is
    /// `none`).
    pub client_ca: Option<PathBuf>,
    /// Whether clients are asked for a certificate.
    pub client_auth: ClientAuth,
}

/// A certificate and key loaded and checked: ready for rustls, with the names it serves.
#[derive(Debug, Clone)]
pub struct LoadedCert {
    /// The chain and signing key.
    pub certified: Arc<CertifiedKey>,
    /// The DNS names the leaf serves (its DNS subject alternative names, or its common name
    /// when it has none), lower case; a wildcard as `*.example.com`.
    pub names: Vec<String>,
    /// The end of the leaf's validity, seconds since the Unix epoch.
    pub not_after: i64,
}

/// Which file of a certificate and key pair a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The certificate file.
    Cert,
    /// The key file.
    Key,
}

fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// The names and validity end of a DER certificate.
pub fn cert_facts(der: &[u8]) -> Result<(Vec<String>, i64), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("not a valid X.509 certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push(d.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_ascii_lowercase());
            }
        }
    }
    Ok((names, cert.validity().not_after.timestamp()))
}

/// Loads and checks a certificate chain and its key: both readable PEM, the key of the leaf,
/// the leaf not expired. The error says which file failed and why.
pub fn load_cert_key(paths: &CertKeyPaths) -> Result<LoadedCert, (Which, String)> {
    let chain = read_certs(&paths.cert, "certificate").map_err(|e| (Which::Cert, e))?;
    let (names, not_after) = cert_facts(&chain[0])
        .map_err(|e| (Which::Cert, format!("certificate file {}: {e}", paths.cert.display())))?;
    if not_after < now_unix() {
        let when = x509_parser::time::ASN1Time::from_timestamp(not_after)
            .map_or_else(|_| not_after.to_string(), |t| t.to_string());
        return Err((
            Which::Cert,
            format!("certificate in {} expired on {when}", paths.cert.display()),
        ));
    }
    let key = read_key(&paths.key).map_err(|e| (Which::Key, e))?;
    let provider = crate::crypto::crypto_provider();
    let signer = provider.key_provider.load_private_key(key).map_err(|e| {
        (Which::Key, format!("key file {} holds an unusable key: {e}", paths.key.display()))
    })?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|_| {
        (
            Which::Key,
            format!(
                "the key in {} does not match the certificate in {}",
                paths.key.display(),
                paths.cert.display()
            ),
        )
    })?;
    Ok(LoadedCert { certified: Arc::new(certified), names, not_after })
}

/// Checks a certificate's `ocsp` setting against the loaded certificate: a response file must
/// hold a current `good` response about it; `fetch` needs the issuer in the chain (for the
/// request's CertID) and an `http://` OCSP responder in the leaf. Returns the file's staple.
pub fn check_ocsp(
    paths: &CertKeyPaths,
    loaded: &LoadedCert,
) -> Result<Option<crate::ocsp::Staple>, String> {
    use crate::ocsp::{self, OcspSource};
    let chain = &loaded.certified.cert;
    match &paths.ocsp {
        None => Ok(None),
        Some(OcspSource::File(file)) => {
            let issuer = chain.get(1).map(|c| c.as_ref());
            ocsp::load_file(file, &chain[0], issuer, now_unix()).map(Some)
        }
        Some(OcspSource::Fetch) => {
            if chain.len() < 2 {
                return Err(format!(
                    "ocsp = \"fetch\" needs the issuer's certificate after the leaf in {}",
                    paths.cert.display()
                ));
            }
            ocsp::responder_url(&chain[0])
                .map(|_| None)
                .map_err(|e| format!("ocsp = \"fetch\": {}: {e}", paths.cert.display()))
        }
    }
}

/// Whether a certificate name (`a.example.com` or `*.example.com`) covers `host` (ASCII case
/// insensitive; a wildcard covers exactly one leftmost label).
pub fn name_matches(name: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    match name.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest.eq_ignore_ascii_case(suffix)),
        None => name.eq_ignore_ascii_case(host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(name_matches("*.example.com", "a.example.com"));
        assert!(name_matches("*.example.com", "A.Example.COM"));
        assert!(!name_matches("*.example.com", "example.com"));
        assert!(!name_matches("*.example.com", "a.b.example.com"));
        assert!(name_matches("api.test", "API.test."));
        assert!(!name_matches("api.test", "web.test"));
    }

    #[test]
    fn client_auth_spellings_round_trip() {
        for a in ClientAuth::ALL {
            assert_eq!(ClientAuth::parse(a.as_str()), Some(a));
        }
        assert_eq!(ClientAuth::parse("yes"), None);
    }
}
