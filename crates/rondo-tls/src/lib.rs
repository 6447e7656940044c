//! TLS client plumbing shared by rondo's router (its command-line clients and its connections to
//! members, in `rondo-runtime`) and the published client library (`rondo-client`), written once
//! over rustls's types:
//!
//! - [`provider`]: the one crypto provider of every TLS configuration (ring, or aws-lc-rs under
//!   the feature `aws-lc`);
//! - [`pem`]: certificates, private keys and CA roots read from PEM files, with errors naming
//!   the file and why;
//! - [`connector`]: a verifying client configuration built from a CA file and an optional client
//!   certificate, and [`Connector`], the handshake whose failure names the host and the reason;
//! - [`mod@describe`]: a failed handshake in words (`certificate not valid for 10.0.0.7 (it is for
//!   api.internal)`).
//!
//! The crate depends on no other rondo crate, so the client library can use it without pulling
//! in the router.

pub mod connector;
pub mod describe;
pub mod pem;
pub mod provider;

pub use connector::{ClientFiles, Connector, client_config};
pub use describe::{describe, describe_rustls, host_of, rustls_in};
pub use provider::crypto_provider;
