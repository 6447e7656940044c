//! PEM files read into rustls's types through `rustls-pki-types`: certificate chains
//! ([`read_certs`]), private keys ([`read_key`]) and CA roots ([`load_roots`]). Every error
//! names the file and what is wrong with it (`ca file /etc/rondo/ca.pem holds no PEM
//! certificate`), since it reaches a user as it is: `rondo check`, a reload that keeps the old
//! certificate, a client library's builder.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} file {}: {e}", path.display()))
}

/// Reads the certificates of the PEM file `path` (`what` names it in errors); at least one.
pub fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, what)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} file {} is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} file {} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// Reads the private key (PKCS#8, PKCS#1 or SEC1) of the PEM file `path`.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read(path, "key")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("key file {} holds no PEM private key", path.display())
        }
        e => format!("key file {} is not valid PEM: {e}", path.display()),
    })
}

/// Loads the roots of a CA file (`what` names it in errors, e.g. `client_ca`).
pub fn load_roots(path: &Path, what: &str) -> Result<RootCertStore, String> {
    let certs = read_certs(path, what)?;
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("{what} file {}: unusable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}
