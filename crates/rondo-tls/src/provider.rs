//! The one place that decides rondo's TLS crypto provider ([`crypto_provider`]): ring by
//! default, aws-lc-rs with the cargo feature `aws-lc`. Every rustls configuration rondo builds
//! (listeners, member connections, probes, the naming and agent clients, the client library)
//! and every private key it loads takes its provider from here, so a key is signed with the
//! same library that runs the handshake (aws-lc's RSA is what makes RSA handshakes
//! OpenSSL-class). With `aws-lc` the key exchange groups are X25519MLKEM768 (the hybrid
//! post-quantum group browsers offer) first, then X25519, P-256 and P-384; with ring, ring's
//! defaults (X25519, P-256, P-384). The list is spelt out rather than left to rustls's
//! `prefer-post-quantum` feature, so that feature unification cannot reorder it.
//!
//! When both rustls features are compiled in (`cargo build --all-features`), aws-lc wins: the
//! choice is made here by `cfg`, never by rustls's process default, which panics when it finds
//! two. [`install_default`] makes the same choice the process default for the libraries that
//! ask rustls for it (the NATS client's TLS).

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

/// The name of the provider this build uses (`ring` or `aws-lc-rs`), for logs and docs.
pub const PROVIDER_NAME: &str = if cfg!(feature = "aws-lc") { "aws-lc-rs" } else { "ring" };

/// The crypto provider of every TLS configuration rondo builds (built once per process).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(build())).clone()
}

#[cfg(feature = "aws-lc")]
fn build() -> CryptoProvider {
    use rustls::crypto::aws_lc_rs::{self, kx_group};
    CryptoProvider {
        kx_groups: vec![
            kx_group::X25519MLKEM768,
            kx_group::X25519,
            kx_group::SECP256R1,
            kx_group::SECP384R1,
        ],
        ..aws_lc_rs::default_provider()
    }
}

#[cfg(not(feature = "aws-lc"))]
fn build() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Makes [`crypto_provider`] the process's rustls default (for libraries that build their own
/// configurations from it); a default already installed stays. Called once at start by the
/// `rondo` binary.
pub fn install_default() {
    let _ = CryptoProvider::install_default((*crypto_provider()).clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_offers_the_groups_of_its_build() {
        let names: Vec<String> =
            crypto_provider().kx_groups.iter().map(|g| format!("{:?}", g.name())).collect();
        if cfg!(feature = "aws-lc") {
            assert_eq!(names, ["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"]);
        } else {
            assert_eq!(names, ["X25519", "secp256r1", "secp384r1"]);
        }
    }
}
