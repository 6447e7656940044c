//! Registrations with leases, behind one interface over the backends: [`Registry::Embedded`]
//! (in-process, the default) and `Registry::Etcd` (feature `etcd`, shared by a tier of
//! routers). A backend owns the registrations and feeds them into the live view: the embedded
//! one the member lists of the clusters a batch changed (`Live::update_registered`), the etcd
//! one the whole set whenever it changes (`Live::set_registered`), and the tier's shared
//! configuration (`Live::set_shared`).

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

/// Names (services, members, groups): what the config file allows (letters, digits, `.`, `_`,
/// `-`; 1 to 128). `what` names the field in the error.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("{what} `{name}`: use 1 to 128 letters, digits, `.`, `_` or `-`"))
    }
}

/// A member address: `host:port` with a port in 1..=65535 (an IP address, a bracketed IPv6
/// address, or a host name).
pub fn check_address(address: &str) -> Result<(), String> {
    let bad = || format!("field `address`: `{address}` is not host:port (e.g. 127.0.0.1:8001)");
    if address.parse::<std::net::SocketAddr>().is_ok_and(|a| a.port() != 0) {
        return Ok(());
    }
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'));
    if port_ok && host_ok { Ok(()) } else { Err(bad()) }
}

/// A registered member's weight: 1 to the config file's largest.
pub fn check_weight(weight: u32) -> Result<(), String> {
    if (1..=rondo_config::MAX_WEIGHT).contains(&u64::from(weight)) {
        Ok(())
    } else {
        Err(format!("field `weight`: {weight} is out of range 1..={}", rondo_config::MAX_WEIGHT))
    }
}

/// A lease's time to live: [`MIN_TTL`] to [`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<(), String> {
    if (MIN_TTL..=MAX_TTL).contains(&ttl) {
        Ok(())
    } else {
        Err(format!(
            "field `ttl_ms`: {} is out of range {}..={}",
            ttl.as_millis(),
            MIN_TTL.as_millis(),
            MAX_TTL.as_millis()
        ))
    }
}

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
    /// A registration cap is reached (507); the message names the cap and its value.
    #[error("{0}")]
    Full(String),
}

/// Why a registry did not start; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The snapshot file cannot be read, is not a snapshot, or holds an entry the API would
    /// refuse (the file is left untouched).
    #[error("naming snapshot {path}: {reason}")]
    Snapshot {
        /// The snapshot file.
        path: std::path::PathBuf,
        /// What is wrong with it (the entry, for an invalid one).
        reason: String,
    },
    /// The snapshot's log cannot be read, or a record before its last one is damaged, or a
    /// record holds an entry the API would refuse (the file is left untouched). A damaged last
    /// record is a torn write, ignored and reported instead.
    #[error("naming log {path}: {reason}")]
    Log {
        /// The log file.
        path: std::path::PathBuf,
        /// Where the bad record starts (0 when the file cannot be read at all).
        offset: u64,
        /// What is wrong: `record at byte offset N: ...`, or `cannot read: ...`.
        reason: String,
    },
    /// A backend this build leaves out.
    #[error(
        "[naming] registry = \"{backend}\": this rondo was built without the `{feature}` feature (cargo build --features {feature})"
    )]
    NotBuilt {
        /// The backend's config spelling.
        backend: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// The registry's writer thread could not be started.
    #[error("cannot start the registry's writer thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The caps on registrations (`[naming] max_registrations_per_service` and
/// `max_registrations`); a registration that would pass one is refused with
/// [`RegistryError::Full`]. Registering an already registered member again does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most registered members in one service.
    pub per_service: usize,
    /// Most registered members in all.
    pub total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_service: rondo_config::NamingSpec::DEFAULT_MAX_REGISTRATIONS_PER_SERVICE as usize,
            total: rondo_config::NamingSpec::DEFAULT_MAX_REGISTRATIONS as usize,
        }
    }
}

impl Limits {
    /// The caps of a `[naming]` section.
    pub fn of(spec: &rondo_config::NamingSpec) -> Limits {
        Limits {
            per_service: spec.max_registrations_per_service as usize,
            total: spec.max_registrations as usize,
        }
    }

    /// Whether one more member fits, with `in_service` members in its service and `total` in
    /// all (the member not among them).
    pub fn check(
        &self,
        service: &str,
        in_service: usize,
        total: usize,
    ) -> Result<(), RegistryError> {
        if in_service >= self.per_service {
            return Err(RegistryError::Full(format!(
                "registration cap reached: service `{service}` has {in_service} registered \
                 members, `[naming] max_registrations_per_service` = {}",
                self.per_service
            )));
        }
        if total >= self.total {
            return Err(RegistryError::Full(format!(
                "registration cap reached: {total} registered members in all, \
                 `[naming] max_registrations` = {}",
                self.total
            )));
        }
        Ok(())
    }
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
}
