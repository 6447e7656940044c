//! [`Registry`], the one interface over the registry backends: [`Registry::Embedded`]
//! (in-process, the default) and `Registry::Etcd` (feature `etcd`, shared by a tier of
//! routers), and [`start_registry`], which picks the configured one. It sits above the backends
//! and `registry` (what they share), so neither has to name the other.

use std::sync::Arc;

use crate::NamingParts;
use rondo_config::RegistrySpec;
use rondo_core::wire::Lease;

use crate::embedded::{self, Embedded};
#[cfg(feature = "etcd")]
use crate::etcd;
use crate::registry::{Limits, Registration, RegistryError, RegistryStatus, StartError};

/// Starts the configured registry backend feeding `parts`' view (inside a tokio runtime) with the
/// default [`Limits`]. Fails with a message naming what failed: an unreadable or invalid
/// snapshot file, or a backend this build leaves out.
pub fn start_registry(spec: &RegistrySpec, parts: &NamingParts) -> Result<Registry, StartError> {
    start_registry_with(spec, Limits::default(), parts)
}

/// [`start_registry`] with the caps on registrations `limits`.
pub fn start_registry_with(
    spec: &RegistrySpec,
    limits: Limits,
    parts: &NamingParts,
) -> Result<Registry, StartError> {
    match spec {
        RegistrySpec::Embedded { snapshot } => {
            embedded::Embedded::start(parts, snapshot.clone(), limits).map(Registry::Embedded)
        }
        #[cfg(feature = "etcd")]
        RegistrySpec::Etcd { endpoints, prefix } => {
            let r = etcd::EtcdRegistry::start(endpoints.clone(), prefix.clone(), parts);
            r.set_limits(limits);
            Ok(Registry::Etcd(r))
        }
        #[cfg(not(feature = "etcd"))]
        RegistrySpec::Etcd { .. } => Err(StartError::NotBuilt { backend: "etcd", feature: "etcd" }),
    }
}

/// The registry backend in use.
#[derive(Debug, Clone)]
pub enum Registry {
    /// In-process.
    Embedded(Arc<Embedded>),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(Arc<etcd::EtcdRegistry>),
}

impl Registry {
    /// Registers (or re-registers, replacing the address, weight and group) a member with a
    /// new lease.
    pub async fn register(&self, reg: Registration) -> Result<Lease, RegistryError> {
        match self {
            Registry::Embedded(r) => r.register(reg).await,
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => r.register(reg).await,
        }
    }

    /// Renews a lease for its full time to live.
    pub async fn keepalive(&self, lease: &str) -> Result<Lease, RegistryError> {
        match self {
            Registry::Embedded(r) => r.keepalive(lease),
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => r.keepalive(lease).await,
        }
    }

    /// Removes a registered member now.
    pub async fn deregister(&self, cluster: &str, member: &str) -> Result<(), RegistryError> {
        match self {
            Registry::Embedded(r) => r.deregister(cluster, member).await,
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => r.deregister(cluster, member).await,
        }
    }

    /// Stores the tier's shared configuration (TOML, the config file's schema; its routes and
    /// clusters replace every router's own). Only the etcd backend shares one.
    pub async fn put_config(&self, text: String) -> Result<(), RegistryError> {
        match self {
            Registry::Embedded(_) => {
                let _ = text;
                Err(RegistryError::Unsupported(
                    "the embedded registry has no shared configuration; edit the config file or \
                     use the admin API (`registry = \"etcd\"` shares one across routers)"
                        .to_owned(),
                ))
            }
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => r.put_config(text).await,
        }
    }

    /// Backend, connection and counts.
    pub fn status(&self) -> RegistryStatus {
        match self {
            Registry::Embedded(r) => r.status(),
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => r.status(),
        }
    }

    /// Stops the backend's background tasks.
    pub fn stop(&self) {
        match self {
            Registry::Embedded(r) => r.stop(),
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => r.stop(),
        }
    }

    /// Stops for a hitless upgrade's hand-off: the embedded registry's writer finishes its
    /// batch in progress and ends, so the new process can open its files (waits at most
    /// `timeout`; returns whether it ended in time); an etcd registry just stops (etcd keeps
    /// the registrations).
    pub fn release(&self, timeout: std::time::Duration) -> bool {
        match self {
            Registry::Embedded(r) => r.release(timeout),
            #[cfg(feature = "etcd")]
            Registry::Etcd(r) => {
                r.stop();
                true
            }
        }
    }
}
