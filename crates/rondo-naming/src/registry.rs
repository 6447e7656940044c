//! Registrations with leases, and what every backend shares: the registration, its limits,
//! errors and status, and the settling of declared policies. The interface over the backends
//! ([`crate::Registry`]) is in `backend`, above them. A backend owns the registrations and feeds them into the live view: the embedded
//! one the member lists of the clusters a batch changed (`Registrations::update_registered`), the etcd
//! one the whole set whenever it changes (`Registrations::set_registered`), and the tier's shared
//! configuration (`Views::set_shared`).

use std::sync::Arc;
use std::time::Duration;

use rondo_core::{ClusterSpec, MemberSpec};

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
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// The cluster (service) it joins.
    pub cluster: String,
    /// The member (admin state `active`).
    pub member: MemberSpec,
    /// The lease's time to live; the member is removed everywhere when it lapses.
    pub ttl: Duration,
    /// What it says about its cluster's policy.
    pub policy: PolicyClaim,
}

/// What a registration says about its cluster's policy (`[naming] allow_registered_clusters`).
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyClaim {
    /// The cluster is configured: the file's policy holds, a `policy` in the body is ignored.
    Configured,
    /// No `policy` in the body, into a cluster the configuration lacks: the registration joins
    /// whatever its cluster's registrations declared (the default policy if it is the first).
    Join,
    /// A `policy` in the body, into a cluster the configuration lacks: it creates the cluster
    /// with this policy, or must agree with the one declared (409 otherwise).
    Declare(Arc<Declared>),
}

/// A policy declared by registrations for a cluster the configuration lacks (PKUAS's
/// deployment descriptor): the body's `policy` object as given (stored and shared as it is),
/// and the cluster it compiles to with `rondo_config::compile_declared_policy` (no members).
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    /// The `policy` object, in the `[cluster.NAME]` table's fields.
    pub raw: serde_json::Value,
    /// The compiled cluster, without members.
    pub spec: Arc<ClusterSpec>,
}

impl Declared {
    /// Compiles `raw` for `cluster`; the error names the field (`policy.algorithm: ...`).
    pub fn compile(cluster: &str, raw: serde_json::Value) -> Result<Declared, String> {
        let spec =
            rondo_config::compile_declared_policy(cluster, &raw).map_err(|e| e.to_string())?;
        Ok(Declared { raw, spec: Arc::new(spec) })
    }

    /// The default policy (`{}`), what a first registration without a `policy` declares.
    pub fn default_for(cluster: &str) -> Declared {
        let raw = serde_json::Value::Object(serde_json::Map::new());
        let spec = rondo_config::compile_declared_policy(cluster, &raw)
            .unwrap_or_else(|_| ClusterSpec { name: cluster.to_owned(), ..empty_spec() });
        Declared { raw, spec: Arc::new(spec) }
    }

    /// What the policy compiles to, as one JSON object in the wire's field names: the policy's
    /// fields, `session` and `upstream_protocol`. Two declarations agree when these are equal.
    fn effective(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.spec.policy).unwrap_or_default();
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("session".into(), serde_json::to_value(&self.spec.sticky).unwrap_or_default());
            m.insert(
                "upstream_protocol".into(),
                serde_json::to_value(self.spec.upstream_protocol).unwrap_or_default(),
            );
        }
        v
    }
}

fn empty_spec() -> ClusterSpec {
    ClusterSpec {
        name: String::new(),
        members: Vec::new(),
        policy: Default::default(),
        upstream_protocol: Default::default(),
        sticky: Default::default(),
        upstream_tls: None,
    }
}

/// The first field (in sorted order, depth first) where `a` and `b` differ, with both values.
/// Only the two levels of a cluster table are fields (`policy.hash.key`): deeper objects are
/// values (a hash key's `{"header":"x-user"}`).
fn first_difference(
    path: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if path.matches('.').count() < 2 => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let null = Value::Null;
                let (va, vb) = (x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null));
                first_difference(&format!("{path}.{k}"), va, vb)
            })
        }
        _ if a == b => None,
        _ => Some((path.to_owned(), a.to_string(), b.to_string())),
    }
}

/// The policy a registration into `cluster` gets, given its `claim` and the policy its cluster's
/// other registrations declared (`current`): none for a configured cluster, the current one (or
/// the default) for one that joins, its own when it is the first to declare or agrees with the
/// current one; a [`RegistryError::Conflict`] naming the first differing field and both values
/// otherwise.
pub fn settle(
    cluster: &str,
    claim: &PolicyClaim,
    current: Option<&Arc<Declared>>,
) -> Result<Option<Arc<Declared>>, RegistryError> {
    match (claim, current) {
        (PolicyClaim::Configured, _) => Ok(None),
        (PolicyClaim::Join, Some(current)) => Ok(Some(current.clone())),
        (PolicyClaim::Join, None) => Ok(Some(Arc::new(Declared::default_for(cluster)))),
        (PolicyClaim::Declare(d), None) => Ok(Some(d.clone())),
        (PolicyClaim::Declare(d), Some(current)) => {
            match first_difference("policy", &current.effective(), &d.effective()) {
                None => Ok(Some(current.clone())),
                Some((field, was, given)) => Err(RegistryError::Conflict(format!(
                    "{field}: service `{cluster}` is declared with {was} by its registered \
                     members, this registration declares {given} (declare the same policy, or \
                     none to join it)"
                ))),
            }
        }
    }
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
    /// The registration's declared policy differs from its cluster's (409); the message names
    /// the first differing field and both values.
    #[error("{0}")]
    Conflict(String),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn declare(raw: serde_json::Value) -> PolicyClaim {
        PolicyClaim::Declare(Arc::new(Declared::compile("orders", raw).expect("compiles")))
    }

    #[test]
    fn a_declared_policy_is_settled_against_the_clusters() {
        let hash = serde_json::json!({ "algorithm": "hash", "hash": { "key": "header:x-user" } });
        let first = settle("orders", &declare(hash.clone()), None).unwrap().unwrap();
        assert_eq!(first.raw, hash);
        // The same policy written otherwise (a default spelled out) agrees.
        let same = serde_json::json!({
            "algorithm": "hash", "hash": { "key": "header:x-user" }, "granularity": "request",
        });
        let agreed = settle("orders", &declare(same), Some(&first)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&agreed, &first));
        // No policy joins; into a configured cluster there is none.
        let joined = settle("orders", &PolicyClaim::Join, Some(&first)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&joined, &first));
        assert_eq!(settle("orders", &PolicyClaim::Configured, Some(&first)).unwrap(), None);
        let alone = settle("orders", &PolicyClaim::Join, None).unwrap().unwrap();
        assert_eq!(alone.spec.policy, rondo_core::Policy::default());

        let other =
            serde_json::json!({ "algorithm": "hash", "hash": { "key": "header:x-tenant" } });
        let Err(RegistryError::Conflict(msg)) = settle("orders", &declare(other), Some(&first))
        else {
            panic!("no conflict")
        };
        assert!(
            msg.starts_with(
                "policy.hash.key: service `orders` is declared with {\"header\":\"x-user\"} by its \
                 registered members, this registration declares {\"header\":\"x-tenant\"}"
            ),
            "{msg}"
        );
        let rr = serde_json::json!({ "algorithm": "round-robin" });
        let Err(RegistryError::Conflict(msg)) = settle("orders", &declare(rr), Some(&first)) else {
            panic!("no conflict")
        };
        assert!(msg.starts_with("policy.algorithm: "), "{msg}");
        assert!(msg.contains("\"hash\"") && msg.contains("\"round-robin\""), "{msg}");
    }
}
