//! rondo's naming service (PKUAS's balancing at the naming service, CLB's shared routing list).
//!
//! - [`answer`]: what a lookup returns, computed from the live snapshot with the same core
//!   pickers the router uses: one member chosen by the cluster's policy ([`answer::lookup`]), or
//!   every eligible member with the policy and the view id ([`answer::answer`]).
//! - [`registry`]: registrations with TTL leases, fed into the live view as registered members;
//!   an embedded backend ([`embedded`], optionally kept in a snapshot file and an append-only
//!   log beside it, `journal`) and an etcd backend
//!   (`etcd`, feature `etcd`) that a tier of routers shares.
//! - [`api`]: the HTTP API on the naming listener (lookup, full answer, register, keepalive,
//!   deregister, watch).
//! - [`parent`]: a naming hierarchy: names not held here asked of the parent service, cached
//!   and kept current by its watch (`hierarchy` marks answers with the level that gave them).
//! - `redirect`: `GET /v1/lookup/NAME?redirect=1`, a 307 to the picked member's URL.
//! - `dns` (feature `dns`): A and SRV answers for clients that only speak DNS.
//! - `xds` (feature `xds`): an ADS server that drives proxyless gRPC clients.
//!
//! The wire format is `rondo_core::wire`, shared with the client library.

pub mod answer;
pub mod api;
mod backend;
pub mod embedded;
mod hierarchy;
mod journal;
pub mod parent;
mod parts;
mod redirect;
pub mod registry;

#[cfg(feature = "dns")]
pub mod dns;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod presence;
#[cfg(feature = "xds")]
pub mod xds;

pub use backend::{Registry, start_registry, start_registry_with};
pub use parts::NamingParts;
pub use registry::{Limits, Registration, RegistryError, RegistryStatus, StartError};
