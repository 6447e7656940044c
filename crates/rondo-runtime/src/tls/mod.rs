//! TLS: the router's listeners (`server.rs`), its connections to members (`upstream.rs`),
//! rondo's own command-line clients to its control plane (`client.rs`), and OCSP staples
//! fetched and refreshed for listeners (`ocsp_fetch.rs`).

pub mod client;
pub mod ocsp_fetch;
pub mod server;
pub mod upstream;
