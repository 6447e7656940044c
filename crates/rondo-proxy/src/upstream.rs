//! The router's connections to members: rondo-runtime's pools ([`rondo_runtime::pools`]) with
//! the request path's body.

/// The router's pools.
pub type Clients = rondo_runtime::pools::Clients<crate::body::UpstreamBody>;

pub use rondo_runtime::pools::tls_failure;
