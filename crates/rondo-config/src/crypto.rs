//! rondo's TLS crypto provider, as the router's crates know it: [`rondo_tls::provider`] decides
//! it (ring by default, aws-lc-rs with the cargo feature `aws-lc`, which this crate passes on),
//! once for the router and the client library alike. Every rustls configuration the router
//! builds and every private key it loads ([`crate::tls::load_cert_key`]) takes its provider
//! from there.

pub use rondo_tls::provider::{PROVIDER_NAME, crypto_provider, install_default};
