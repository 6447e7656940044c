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
//! - `dns` (feature `dns`): A and SRV answers for clients that only speak DNS.
//!
//! The wire format is `rondo_core::wire`, shared with the client library.

pub mod answer;
pub mod api;
pub mod embedded;
mod journal;
pub mod registry;

#[cfg(feature = "dns")]
pub mod dns;
#[cfg(feature = "etcd")]
pub mod etcd;

pub use registry::{Limits, Registration, Registry, RegistryError, RegistryStatus, StartError};

use std::sync::Arc;

use rondo_config::RegistrySpec;
use rondo_runtime::Live;

/// Starts the configured registry backend feeding `live` (inside a tokio runtime) with the
/// default [`Limits`]. Fails with a message naming what failed: an unreadable or invalid
/// snapshot file, or a backend this build leaves out.
pub fn start_registry(spec: &RegistrySpec, live: Arc<Live>) -> Result<Registry, StartError> {
    start_registry_with(spec, Limits::default(), live)
}

/// [`start_registry`] with the caps on registrations `limits`.
pub fn start_registry_with(
    spec: &RegistrySpec,
    limits: Limits,
    live: Arc<Live>,
) -> Result<Registry, StartError> {
    match spec {
        RegistrySpec::Embedded { snapshot } => {
            embedded::Embedded::start(live, snapshot.clone(), limits).map(Registry::Embedded)
        }
        #[cfg(feature = "etcd")]
        RegistrySpec::Etcd { endpoints, prefix } => {
            let r = etcd::EtcdRegistry::start(endpoints.clone(), prefix.clone(), live);
            r.set_limits(limits);
            Ok(Registry::Etcd(r))
        }
        #[cfg(not(feature = "etcd"))]
        RegistrySpec::Etcd { .. } => Err(StartError::NotBuilt { backend: "etcd", feature: "etcd" }),
    }
}
