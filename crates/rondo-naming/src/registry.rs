//! Registrations with leases, behind one interface over the backends: [`Registry::Embedded`]
//! (in-process, the default) and `Registry::Etcd` (feature `etcd`, shared by a tier of
//! routers). A backend owns the registrations and feeds the whole set into the live view with
//! `Live::set_registered` whenever it changes (and the etcd backend feeds the tier's shared
//! configuration with `Live::set_shared`).

use std::sync::Arc;
use std::time::Duration;

use rondo_core::MemberSpec;
use rondo_core::wire::Lease;

use crate::embedded::Embedded;

/// Default lease time to live.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Shortest lease time to live accepted.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// Longest lease time to live accepted.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// One member registering into a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The cluster (service) it joins.
    pub cluster: String,
    /// The member (admin state `active`).
    pub member: MemberSpec,
    /// The lease's time to live; the member is removed everywhere when it lapses.
    pub ttl: Duration,
}

/// Why a registry operation failed; each maps to one HTTP status in the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// No such lease or registration (404).
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be satisfied as given (400).
    #[error("{0}")]
    Invalid(String),
    /// The backend cannot be reached now (503); the running view stays.
    #[error("{0}")]
    Unavailable(String),
    /// This backend does not do that (501).
    #[error("{0}")]
    Unsupported(String),
}

/// What a registry reports in status and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryStatus {
    /// `embedded` or `etcd`.
    pub backend: &'static str,
    /// Whether the backend is reachable (always true for the embedded one).
    pub connected: bool,
    /// Where it lives: the snapshot file, or the etcd endpoints and prefix.
    pub detail: String,
    /// The latest error, if any since the last success.
    pub last_error: Option<String>,
    /// Registrations known.
    pub registrations: usize,
    /// Full resynchronisations done (etcd: at start, after a reconnect or a compacted watch).
    pub resyncs: u64,
}

/// The registry backend in use.
#[derive(Debug, Clone)]
pub enum Registry {
    /// In-process.
    Embedded(Arc<Embedded>),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(Arc<crate::etcd::EtcdRegistry>),
}

impl Registry {
    /// Registers (or re-registers, replacing the address, weight and group) a member with a
    /// new lease.
    pub async fn register(&self, reg: Registration) -> Result<Lease, RegistryError> {
        match self {
            Registry::Embedded(r) => r.register(reg),
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
            Registry::Embedded(r) => r.deregister(cluster, member),
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
}
