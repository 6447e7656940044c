//! The etcd registry: registrations and the tier's shared configuration kept in etcd, so that
//! every router of a tier sees the same members and the same routes and clusters.
//!
//! Layout under the prefix `P` (default `/rondo`):
//!
//! - `P/config`: the shared configuration, TOML in the config file's schema. It replaces each
//!   router's own routes and clusters while present; an invalid one is logged (every error with
//!   its `etcd:P/config:line:column` and field) and the last good one stays in effect.
//! - `P/members/{cluster}/{member}`: one registered member, JSON
//!   `{"address":"127.0.0.1:8001","weight":100,"group":null}` (and `"policy":{...}`, the policy
//!   it declared, for a cluster the configuration lacks), put with the registration's etcd
//!   lease, so that a lapsed lease removes it from etcd and, through every router's watch, from
//!   every router.
//! - `P/revoked/{token_id|subject}/{value}`: a revoked sign-on token id or subject, JSON
//!   `{"until":UNIX_SECONDS}`, put by the admin API of the router that revoked it with a lease
//!   that lapses at `until`; every router's watch brings it into its
//!   `Live::revocations` (issue 20: in force on every router within about a second).
//!
//! Static stability: a background task reads the whole prefix, publishes it into the live view,
//! then watches the prefix and applies each change. When etcd cannot be reached (down, stopped,
//! partitioned: HTTP/2 keep-alive pings notice a silent server within about
//! [`KEEPALIVE_INTERVAL`] + [`KEEPALIVE_TIMEOUT`]) the last view stays in effect, the registry
//! reports itself disconnected, and the task retries with a backoff from [`BACKOFF_MIN`] to
//! [`BACKOFF_MAX`]; after reconnecting (or after a watch that fell behind a compaction) it reads
//! the whole prefix again so changes made meanwhile are picked up. Registry requests from the API
//! are bounded by [`REQUEST_TIMEOUT`] and answer `Unavailable` rather than wait.

mod sync;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, DeleteOptions, KeyValue, PutOptions};
use rondo_core::MemberSpec;
use rondo_core::wire::Lease;
use rondo_runtime::metrics::Metrics;
use rondo_runtime::revoke::Revocations;
use rondo_runtime::revoke::{Revocation, RevokeKind};
use rondo_runtime::{Registrations, TierKeys, Views};
use serde::{Deserialize, Serialize};

use crate::registry::{self, Declared, Limits, Registration, RegistryError, RegistryStatus};

/// Longest wait for a TCP connection to an etcd endpoint.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest wait for one etcd request (the sync task's reads and every API request).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 keep-alive ping interval (also while idle, so a stopped etcd is noticed).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_millis(500);
/// How long a keep-alive ping may go unanswered before the connection is dropped.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// First retry delay after etcd could not be reached.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest retry delay (the delay doubles from [`BACKOFF_MIN`] up to this).
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The registry backed by etcd, shared by a tier of routers.
pub struct EtcdRegistry {
    inner: Arc<Inner>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Puts this router's new revocations into etcd.
    publisher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Keeps this router's presence key alive ([`crate::presence`]).
    presence: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What the background task and the API requests share.
struct Inner {
    endpoints: Vec<String>,
    /// The prefix without a trailing `/`.
    prefix: String,
    /// The view, which the tier's shared configuration replaces while set.
    views: Views,
    /// The registered members' layer of the view, which the tier's members fill.
    registrations: Registrations,
    metrics: Arc<Metrics>,
    /// The revocations shared with the tier.
    revocations: Arc<Revocations>,
    /// The tier key the shared configuration sets.
    tier_keys: TierKeys,
    /// The current connection (cheap to clone); `None` until one was made.
    client: Mutex<Option<Client>>,
    state: Mutex<State>,
    /// The caps on registrations, checked against this router's copy of the tier's members.
    limits: Mutex<Limits>,
}

#[derive(Debug, Default)]
struct State {
    /// Registered members by (cluster, member), as last read from etcd, with the policy each
    /// declared.
    members: BTreeMap<(String, String), Held>,
    /// The raw `P/config` value last seen (applied or rejected), to skip identical ones.
    config: Option<Vec<u8>>,
    connected: bool,
    /// Whether the current outage was logged (once per outage, not per retry).
    outage_logged: bool,
    /// Why etcd could not be reached, while it cannot.
    conn_error: Option<String>,
    /// Why the shared configuration in etcd was rejected, while it is.
    config_error: Option<String>,
    resyncs: u64,
    /// Revoked token ids and subjects (kind, value) → until, as last read from etcd.
    revoked: BTreeMap<(RevokeKind, String), u64>,
    /// Whether `revoked` changed since it was last handed to the live state.
    revoked_dirty: bool,
    /// The tier's routers present in etcd, by id (this one among them once its key is in).
    routers: std::collections::BTreeSet<String>,
}

/// A registered member as last read from etcd, and the policy it declared.
type Held = (MemberSpec, Option<Arc<Declared>>);

/// A revocation's value under `P/revoked/{kind}/{value}`.
#[derive(Debug, Serialize, Deserialize)]
struct RevokedValue {
    until: u64,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A member's value under `P/members/{cluster}/{member}`.
#[derive(Debug, Serialize, Deserialize)]
struct MemberValue {
    address: String,
    weight: u32,
    group: Option<String>,
    /// The policy declared for a cluster the configuration lacks (absent in values written
    /// before declared policies, and for configured clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<serde_json::Value>,
}

impl fmt::Debug for EtcdRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdRegistry")
            .field("endpoints", &self.inner.endpoints)
            .field("prefix", &self.inner.prefix)
            .field("state", &*self.inner.lock())
            .finish_non_exhaustive()
    }
}

impl EtcdRegistry {
    /// Starts the registry on etcd `endpoints` (`host:port` or URLs) under `prefix` (e.g.
    /// `/rondo`) and its background sync task, then returns at once: it neither fails nor waits
    /// when etcd is down (the task keeps trying, and the configured view stays in effect until
    /// it succeeds). Must run inside a tokio runtime.
    pub fn start(
        endpoints: Vec<String>,
        prefix: String,
        parts: &crate::NamingParts,
    ) -> Arc<EtcdRegistry> {
        let prefix = prefix.trim_end_matches('/').to_owned();
        parts.metrics.registry_connected.set(0);
        let inner = Arc::new(Inner {
            endpoints,
            prefix,
            views: parts.views.clone(),
            registrations: parts.registrations.clone(),
            metrics: parts.metrics.clone(),
            revocations: parts.revocations.clone(),
            tier_keys: parts.tier_keys.clone(),
            client: Mutex::new(None),
            state: Mutex::new(State::default()),
            limits: Mutex::new(Limits::default()),
        });
        let task = tokio::spawn(inner.clone().sync_loop());
        let key = crate::presence::key(&inner.prefix);
        let presence = tokio::spawn(crate::presence::keep(inner.endpoints.clone(), key));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        inner.revocations.set_publisher(tx);
        let putter = inner.clone();
        let publisher = tokio::spawn(async move {
            while let Some((r, done)) = rx.recv().await {
                let put = putter.put_revocation(&r).await.map_err(|e| e.to_string());
                if let Err(e) = &put {
                    // In force here already; the admin API says the tier missed it.
                    tracing::error!(kind = r.kind.as_str(), value = r.value, error = %e, "revocation not shared through etcd");
                }
                let _ = done.send(put);
            }
        });
        Arc::new(EtcdRegistry {
            inner,
            task: Mutex::new(Some(task)),
            publisher: Mutex::new(Some(publisher)),
            presence: Mutex::new(Some(presence)),
        })
    }

    /// Sets the caps on registrations (default [`Limits::default`]).
    pub fn set_limits(&self, limits: Limits) {
        *self.inner.limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// See [`crate::Registry::register`]: grants an etcd lease of the registration's time to
    /// live (rounded up to whole seconds) and puts the member's key with it; a member registered
    /// again gets the new lease and its old lease is revoked. The caps are checked against the
    /// tier's members as this router last read them from etcd: routers registering at the
    /// same moment can pass a cap by the registrations in flight.
    ///
    /// A declared policy is settled against the policy of the cluster's other members as this
    /// router last read them: two routers registering conflicting policies at the same moment
    /// can both succeed, and every router then uses the policy of the cluster's first member in
    /// name order that declares one.
    pub async fn register(&self, reg: Registration) -> Result<Lease, RegistryError> {
        let key = self.inner.member_key(&reg.cluster, &reg.member.name)?;
        let policy = {
            let limits = *self.inner.limits.lock().unwrap_or_else(|e| e.into_inner());
            let st = self.inner.lock();
            let id = (reg.cluster.clone(), reg.member.name.clone());
            let cluster = st
                .members
                .range((reg.cluster.clone(), String::new())..)
                .take_while(|((c, _), _)| *c == reg.cluster);
            if !st.members.contains_key(&id) {
                limits.check(&reg.cluster, cluster.clone().count(), st.members.len())?;
            }
            let current = cluster.filter(|(k, _)| **k != id).find_map(|(_, (_, p))| p.as_ref());
            registry::settle(&reg.cluster, &reg.policy, current)?
        };
        let value = serde_json::to_vec(&MemberValue {
            address: reg.member.address.clone(),
            weight: reg.member.weight,
            group: reg.member.group.clone(),
            policy: policy.map(|p| p.raw.clone()),
        })
        .map_err(|e| RegistryError::Invalid(format!("cannot encode the registration: {e}")))?;
        let ttl = (reg.ttl.as_millis().div_ceil(1000) as i64).max(1);
        let inner = &self.inner;
        let (id, granted, old_lease) = inner
            .request("register", |mut c| async move {
                let grant = c.lease_grant(ttl, None).await?;
                let opts = PutOptions::new().with_lease(grant.id()).with_prev_key();
                let put = c.put(key, value, Some(opts)).await?;
                let old = put.prev_key().map(KeyValue::lease).filter(|&l| l != 0);
                Ok((grant.id(), grant.ttl(), old.filter(|&l| l != grant.id())))
            })
            .await?;
        if let Some(old) = old_lease {
            // The replaced registration's lease would otherwise linger until it lapses.
            let _ = inner.request("revoke", |mut c| async move { c.lease_revoke(old).await }).await;
        }
        tracing::info!(
            cluster = reg.cluster,
            member = reg.member.name,
            address = reg.member.address,
            lease = id,
            ttl_s = granted,
            "member registered in etcd"
        );
        Ok(Lease { lease: id.to_string(), ttl_ms: granted.max(0) as u64 * 1000 })
    }

    /// See [`crate::Registry::keepalive`]: one keep-alive request on the etcd lease (granted
    /// through any router of the tier).
    pub async fn keepalive(&self, lease: &str) -> Result<Lease, RegistryError> {
        let id = match lease.parse::<i64>() {
            Ok(id) if id > 0 => id,
            _ => {
                return Err(RegistryError::Invalid(format!(
                    "lease id `{lease}` is not a decimal number"
                )));
            }
        };
        let gone = || {
            RegistryError::NotFound(format!("no lease `{lease}` (it lapsed or was never granted)"))
        };
        let result = self
            .inner
            .request("keepalive", |mut c| async move {
                // Sends one keep-alive request and reads its answer (a time to live of 0, the
                // lease being gone, is an error there).
                let (_keeper, _stream) = c.lease_keep_alive(id).await?;
                let opts = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
                let ttl = c.lease_time_to_live(id, Some(opts)).await?;
                Ok((ttl.granted_ttl().max(ttl.ttl()), !ttl.keys().is_empty()))
            })
            .await;
        match result {
            // A lease with no key left (its registration was replaced or deleted while a revoke
            // failed) keeps nobody registered: the member must register again.
            Ok((ttl, true)) if ttl > 0 => {
                Ok(Lease { lease: lease.to_owned(), ttl_ms: ttl as u64 * 1000 })
            }
            Ok(_) => Err(gone()),
            Err(RegistryError::NotFound(_)) => Err(gone()),
            Err(e) => Err(e),
        }
    }

    /// See [`crate::Registry::deregister`]: deletes the member's key (and revokes its lease).
    pub async fn deregister(&self, cluster: &str, member: &str) -> Result<(), RegistryError> {
        let key = self.inner.member_key(cluster, member)?;
        let lease = self
            .inner
            .request("deregister", |mut c| async move {
                let del = c.delete(key, Some(DeleteOptions::new().with_prev_key())).await?;
                Ok((del.deleted() > 0).then(|| del.prev_kvs().first().map_or(0, KeyValue::lease)))
            })
            .await?;
        let Some(lease) = lease else {
            return Err(RegistryError::NotFound(format!(
                "no registered member `{member}` in service `{cluster}`"
            )));
        };
        if lease != 0 {
            let _ = self
                .inner
                .request("revoke", |mut c| async move { c.lease_revoke(lease).await })
                .await;
        }
        tracing::info!(cluster, member, "member deregistered from etcd");
        Ok(())
    }

    /// See [`crate::Registry::put_config`]: checks `text` as a configuration (every error, with
    /// line, column and field, joined by newlines, in `Invalid`), then stores it under
    /// `P/config`, from where every router of the tier applies it.
    pub async fn put_config(&self, text: String) -> Result<(), RegistryError> {
        let key = self.inner.config_key();
        let name = format!("etcd:{key}");
        rondo_config::parse_str(&text, Path::new(&name), 0)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        self.inner
            .request("put config", |mut c| async move { c.put(key, text, None).await })
            .await?;
        tracing::info!(key = self.inner.config_key(), "shared configuration stored in etcd");
        Ok(())
    }

    /// See [`crate::Registry::status`] (backend `etcd`).
    pub fn status(&self) -> RegistryStatus {
        let st = self.inner.lock();
        RegistryStatus {
            backend: "etcd",
            connected: st.connected,
            detail: format!(
                "etcd {} prefix {}",
                self.inner.endpoints.join(","),
                if self.inner.prefix.is_empty() { "/" } else { &self.inner.prefix }
            ),
            last_error: st.conn_error.clone().or_else(|| st.config_error.clone()),
            registrations: st.members.len(),
            resyncs: st.resyncs,
        }
    }

    /// Stops the background sync task (also done on drop); the last view stays.
    pub fn stop(&self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
        if let Some(t) = self.publisher.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
        // The key stays until its lease runs out (`presence::TTL_SECS`).
        if let Some(t) = self.presence.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl Drop for EtcdRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn config_key(&self) -> String {
        format!("{}/config", self.prefix)
    }

    fn revoked_prefix(&self) -> String {
        format!("{}/revoked/", self.prefix)
    }

    /// Puts a revocation under `P/revoked/` with a lease that lapses when it does.
    async fn put_revocation(&self, r: &Revocation) -> Result<(), RegistryError> {
        let key = format!("{}{}/{}", self.revoked_prefix(), r.kind.as_str(), r.value);
        let ttl = (r.until.saturating_sub(unix_now()) as i64).max(1);
        let value = serde_json::to_vec(&RevokedValue { until: r.until })
            .map_err(|e| RegistryError::Invalid(format!("cannot encode the revocation: {e}")))?;
        self.request("revoke", |mut c| async move {
            let grant = c.lease_grant(ttl, None).await?;
            c.put(key, value, Some(PutOptions::new().with_lease(grant.id()))).await
        })
        .await?;
        Ok(())
    }

    fn routers_prefix(&self) -> String {
        format!("{}/routers/", self.prefix)
    }

    fn members_prefix(&self) -> String {
        format!("{}/members/", self.prefix)
    }

    fn member_key(&self, cluster: &str, member: &str) -> Result<String, RegistryError> {
        if cluster.is_empty() || cluster.contains('/') {
            return Err(RegistryError::Invalid(format!(
                "service name `{cluster}` must be non-empty and contain no `/`"
            )));
        }
        if member.is_empty() {
            return Err(RegistryError::Invalid("member name must be non-empty".to_owned()));
        }
        Ok(format!("{}{cluster}/{member}", self.members_prefix()))
    }

    fn endpoints_text(&self) -> String {
        self.endpoints.join(",")
    }

    fn options() -> ConnectOptions {
        ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
            .with_keep_alive_while_idle(true)
            // A member cut off from its quorum answers nothing new; with this, etcd cancels
            // watches there (and the sync loop resyncs elsewhere) instead of a silent stall.
            .with_require_leader(true)
    }

    /// A new connection (no I/O happens yet: the channel connects on first use).
    async fn connect(&self) -> Result<Client, String> {
        match tokio::time::timeout(
            REQUEST_TIMEOUT,
            Client::connect(&self.endpoints, Some(Self::options())),
        )
        .await
        {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no connection within {} ms", REQUEST_TIMEOUT.as_millis())),
        }
    }

    /// The shared connection, made now if there is none.
    async fn client(&self) -> Result<Client, String> {
        if let Some(c) = self.client.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let c = self.connect().await?;
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        Ok(slot.get_or_insert(c).clone())
    }

    /// Runs one API request on the shared connection, bounded by [`REQUEST_TIMEOUT`]; etcd
    /// being unreachable or slow maps to `Unavailable` naming the endpoints and the error.
    async fn request<T, F, Fut>(&self, what: &str, f: F) -> Result<T, RegistryError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let unavailable = |e: &dyn fmt::Display| {
            RegistryError::Unavailable(format!("etcd {}: {what}: {e}", self.endpoints_text()))
        };
        let attempt = async {
            let client = self.client().await.map_err(|e| unavailable(&e))?;
            f(client).await.map_err(|e| match &e {
                etcd_client::Error::LeaseKeepAliveError(m) if m.contains("not found") => {
                    RegistryError::NotFound(m.clone())
                }
                etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found") => {
                    RegistryError::NotFound(s.message().to_owned())
                }
                _ => unavailable(&e),
            })
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            Ok(r) => r,
            Err(_) => Err(unavailable(&format_args!(
                "no answer within {} ms",
                REQUEST_TIMEOUT.as_millis()
            ))),
        }
    }
}
