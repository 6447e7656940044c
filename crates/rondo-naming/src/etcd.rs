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

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, DeleteOptions, EventType, GetOptions, KeyValue, PutOptions,
    WatchOptions,
};
use rondo_core::wire::Lease;
use rondo_core::{AdminState, MemberSpec};
use rondo_runtime::live::{Registered, RegisteredCluster};
use rondo_runtime::revoke::{Revocation, RevokeKind};
use rondo_runtime::{Live, probe};
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
    live: Arc<Live>,
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

/// Why a sync session ended.
enum SessionEnd {
    /// The watch fell behind a compaction (or was cancelled): read everything again.
    Resync(String),
    /// etcd could not be reached or the stream broke.
    Failed(String),
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
    pub fn start(endpoints: Vec<String>, prefix: String, live: Arc<Live>) -> Arc<EtcdRegistry> {
        let prefix = prefix.trim_end_matches('/').to_owned();
        live.metrics.registry_connected.set(0);
        let inner = Arc::new(Inner {
            endpoints,
            prefix,
            live,
            client: Mutex::new(None),
            state: Mutex::new(State::default()),
            limits: Mutex::new(Limits::default()),
        });
        let task = tokio::spawn(inner.clone().sync_loop());
        let key = crate::presence::key(&inner.prefix);
        let presence = tokio::spawn(crate::presence::keep(inner.endpoints.clone(), key));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        inner.live.revocations.set_publisher(tx);
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

    /// Hands the tier's revocations to the live state, when they changed.
    fn publish_revoked(&self, st: &mut State) {
        if !std::mem::take(&mut st.revoked_dirty) {
            return;
        }
        let set = st.revoked.iter().map(|((kind, value), until)| Revocation {
            kind: *kind,
            value: value.clone(),
            until: *until,
        });
        self.live.revocations.set_shared(set, unix_now());
    }

    fn routers_prefix(&self) -> String {
        format!("{}/routers/", self.prefix)
    }

    /// Tells the live state how many routers the tier has (at least this one).
    fn publish_routers(&self, st: &State) {
        let n = i64::try_from(st.routers.len()).unwrap_or(i64::MAX).max(1);
        self.live.metrics.tier_routers.set(n);
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

    /// The background task: connect, read everything, watch; on failure keep the view and
    /// retry with a backoff.
    async fn sync_loop(self: Arc<Self>) {
        let mut backoff = BACKOFF_MIN;
        // The connection in use; a resynchronisation after a compacted watch keeps it, a
        // failure drops it (a fresh one is made for the next attempt).
        let mut current: Option<Client> = None;
        loop {
            let client = match current.clone() {
                Some(c) => Ok(c),
                None => self.connect().await.inspect(|c| {
                    *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
                    current = Some(c.clone());
                }),
            };
            let end = match client {
                Ok(client) => self.session(client, &mut backoff).await,
                Err(e) => SessionEnd::Failed(e),
            };
            match end {
                SessionEnd::Resync(why) => {
                    tracing::info!(prefix = self.prefix, "etcd watch {why}: resynchronising");
                    // Not at once: a watch that etcd keeps cancelling must not spin.
                    tokio::time::sleep(BACKOFF_MIN).await;
                }
                SessionEnd::Failed(e) => {
                    current = None;
                    self.disconnected(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// One connection's life: a full read, then the watch until it fails or falls behind.
    async fn session(&self, mut client: Client, backoff: &mut Duration) -> SessionEnd {
        let root = format!("{}/", self.prefix);
        let get = tokio::time::timeout(
            REQUEST_TIMEOUT,
            client.get(root.clone(), Some(GetOptions::new().with_prefix())),
        )
        .await;
        let resp = match get {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return SessionEnd::Failed(e.to_string()),
            Err(_) => {
                return SessionEnd::Failed(format!(
                    "no answer within {} ms",
                    REQUEST_TIMEOUT.as_millis()
                ));
            }
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        self.full_resync(resp.kvs(), revision);

        let opts = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let watch = tokio::time::timeout(REQUEST_TIMEOUT, client.watch(root, Some(opts))).await;
        let mut stream = match watch {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return SessionEnd::Failed(format!("watch: {e}")),
            Err(_) => {
                return SessionEnd::Failed(format!(
                    "watch: no answer within {} ms",
                    REQUEST_TIMEOUT.as_millis()
                ));
            }
        };
        // Up only once the watch is: a connection whose reads work but whose watches fail
        // (a role without watch permission, a proxy killing streams) keeps backing off and logs
        // its outage once.
        *backoff = BACKOFF_MIN;
        self.watching(revision);
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return SessionEnd::Failed("watch stream ended".to_owned()),
                Err(e) => return SessionEnd::Failed(format!("watch: {e}")),
            };
            if resp.compact_revision() > 0 {
                return SessionEnd::Resync(format!(
                    "fell behind compaction at revision {}",
                    resp.compact_revision()
                ));
            }
            if resp.canceled() {
                let reason = resp.cancel_reason();
                return SessionEnd::Resync(if reason.is_empty() {
                    "cancelled".to_owned()
                } else {
                    format!("cancelled ({reason})")
                });
            }
            if resp.events().is_empty() {
                continue;
            }
            let mut st = self.lock();
            let mut members_changed = false;
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let put = ev.event_type() == EventType::Put;
                members_changed |= self.apply(&mut st, kv, put);
            }
            if members_changed {
                self.publish_members(&st);
            }
            self.publish_revoked(&mut st);
        }
    }

    /// Replaces everything known with `kvs`, the whole prefix at `revision`.
    fn full_resync(&self, kvs: &[KeyValue], revision: i64) {
        let mut st = self.lock();
        st.resyncs += 1;
        self.live.metrics.registry_resyncs.inc();
        let old = std::mem::take(&mut st.members);
        st.revoked.clear();
        st.revoked_dirty = true;
        st.routers.clear();
        let mut config_seen = false;
        for kv in kvs {
            config_seen |= kv.key() == self.config_key().as_bytes();
            self.apply(&mut st, kv, true);
        }
        if !config_seen && st.config.is_some() {
            self.apply_config(&mut st, None);
        }
        self.publish_routers(&st);
        let changed = old != st.members;
        if changed || st.resyncs == 1 {
            self.publish_members(&st);
        }
        self.publish_revoked(&mut st);
        st.conn_error = None;
        if !st.connected {
            st.connected = true;
            self.live.metrics.registry_connected.set(1);
        }
        tracing::debug!(revision, registrations = st.members.len(), "etcd full resync");
    }

    /// The watch is up after a full read at `revision`: logs the (re)connection once.
    fn watching(&self, revision: i64) {
        let mut st = self.lock();
        let again = std::mem::take(&mut st.outage_logged);
        let (endpoints, registrations) = (self.endpoints_text(), st.members.len());
        drop(st);
        if again {
            tracing::info!(
                endpoints,
                revision,
                registrations,
                "etcd reachable again: resynchronised"
            );
        } else {
            tracing::info!(endpoints, revision, registrations, "etcd registry watching");
        }
    }

    /// Applies one key's put (`put`) or deletion; returns whether the members changed (a
    /// configuration change is published on its own).
    fn apply(&self, st: &mut State, kv: &KeyValue, put: bool) -> bool {
        let key = String::from_utf8_lossy(kv.key());
        if *key == self.config_key() {
            self.apply_config(st, put.then(|| kv.value()));
            return false;
        }
        if let Some(id) = crate::presence::id_of(&key, &self.routers_prefix()) {
            let changed =
                if put { st.routers.insert(id.to_owned()) } else { st.routers.remove(id) };
            if changed {
                self.publish_routers(st);
            }
            return false;
        }
        if let Some(rest) = key.strip_prefix(&self.revoked_prefix()) {
            let Some((kind, value)) =
                rest.split_once('/').and_then(|(k, v)| Some((RevokeKind::parse(k)?, v)))
            else {
                tracing::warn!(key = %key, "etcd key is not {{prefix}}/revoked/{{token_id|subject}}/{{value}}: ignored");
                return false;
            };
            let id = (kind, value.to_owned());
            let until =
                put.then(|| serde_json::from_slice::<RevokedValue>(kv.value()).ok()).flatten();
            match until {
                Some(v) => st.revoked.insert(id, v.until),
                None => st.revoked.remove(&id),
            };
            st.revoked_dirty = true;
            return false;
        }
        let Some(rest) = key.strip_prefix(&self.members_prefix()) else { return false };
        let Some((cluster, name)) = rest.split_once('/') else {
            tracing::warn!(key = %key, "etcd key is not {{prefix}}/members/{{cluster}}/{{member}}: ignored");
            return false;
        };
        let id = (cluster.to_owned(), name.to_owned());
        if !put {
            return st.members.remove(&id).is_some();
        }
        let value: MemberValue = match serde_json::from_slice(kv.value()) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(key = %key, "etcd member value is not valid JSON ({e}): ignored");
                return st.members.remove(&id).is_some();
            }
        };
        let policy = match value.policy {
            None => None,
            // An unchanged policy keeps its compiled cluster (no recompiling per keepalive).
            Some(raw) => match st.members.get(&id) {
                Some((_, Some(p))) if p.raw == raw => Some(p.clone()),
                _ => match Declared::compile(cluster, raw) {
                    Ok(d) => Some(Arc::new(d)),
                    Err(e) => {
                        tracing::warn!(key = %key, "etcd member's declared policy refused ({e}): ignored");
                        return st.members.remove(&id).is_some();
                    }
                },
            },
        };
        let member = MemberSpec {
            name: name.to_owned(),
            address: value.address,
            weight: value.weight,
            group: value.group,
            admin: AdminState::Active,
        };
        if let Some((m, p)) = st.members.get(&id)
            && *m == member
            && p.as_ref().map(|p| &p.raw) == policy.as_ref().map(|p| &p.raw)
        {
            return false;
        }
        st.members.insert(id, (member, policy));
        true
    }

    /// Applies the shared configuration's new text (`None`: the key is gone).
    fn apply_config(&self, st: &mut State, value: Option<&[u8]>) {
        let key = self.config_key();
        let Some(value) = value else {
            if st.config.take().is_some() {
                st.config_error = None;
                tracing::info!(key, "shared configuration removed from etcd: using the file's");
                self.live.set_shared_tier_key(None);
                self.live.shared_members.set_shared(None);
                let snapshot = self.live.set_shared(None);
                probe::spawn(&snapshot);
            }
            return;
        };
        if st.config.as_deref() == Some(value) {
            return;
        }
        st.config = Some(value.to_vec());
        let name = format!("etcd:{key}");
        let text = String::from_utf8_lossy(value);
        match rondo_config::parse_str(&text, Path::new(&name), 0) {
            Ok(config) => {
                // The tier's key travels with its shared configuration: every router signs and
                // checks session cookies with the same one (the file's while it names none).
                let tier_key = match &config.router.tier_key {
                    None => None,
                    Some(k) => match rondo_runtime::secret::read_token(k) {
                        Ok(bytes) if bytes.len() >= 16 => {
                            Some(rondo_runtime::secret::TierKey::new(&bytes))
                        }
                        Ok(_) => {
                            tracing::error!(
                                key,
                                "shared configuration rejected: [router] tier_key must be at least 16 bytes; keeping the last one"
                            );
                            st.config_error = Some(format!(
                                "{name}: [router] tier_key must be at least 16 bytes"
                            ));
                            return;
                        }
                        Err(e) => {
                            tracing::error!(key, error = %e, "shared configuration rejected: [router] tier_key cannot be read; keeping the last one");
                            st.config_error = Some(format!("{name}: [router] tier_key: {e}"));
                            return;
                        }
                    },
                };
                st.config_error = None;
                tracing::info!(key, summary = config.summary(), "shared configuration applied");
                self.live.set_shared_tier_key(tier_key);
                self.live.shared_members.set_shared(Some(config.shared_members));
                let snapshot = self.live.set_shared(Some(config.view));
                probe::spawn(&snapshot);
            }
            Err(errors) => {
                for e in errors.iter() {
                    tracing::error!("{e}");
                }
                tracing::error!(key, "shared configuration rejected: keeping the last one");
                st.config_error = Some(errors.to_string());
            }
        }
    }

    fn publish_members(&self, st: &State) {
        let mut registered = Registered::new();
        for ((cluster, _), (m, policy)) in &st.members {
            let reg: &mut RegisteredCluster = registered.entry(cluster.clone()).or_default();
            reg.members.push(m.clone());
            // The first member in name order that declares a policy gives the cluster's.
            if reg.declared.is_none()
                && let Some(p) = policy
            {
                reg.declared = Some(p.spec.clone());
            }
        }
        self.live.metrics.registrations.set(st.members.len() as i64);
        let snapshot = self.live.set_registered(registered);
        probe::spawn(&snapshot);
    }

    /// Marks etcd unreachable (the view stays); logs once per outage.
    fn disconnected(&self, error: &str) {
        let mut st = self.lock();
        let message = format!("etcd {}: {error}", self.endpoints_text());
        if !st.outage_logged {
            tracing::warn!(
                "{message}; keeping the last view ({} registrations), retrying",
                st.members.len()
            );
            st.outage_logged = true;
        } else {
            tracing::debug!("{message}; retrying");
        }
        st.connected = false;
        st.conn_error = Some(message);
        self.live.metrics.registry_connected.set(0);
    }
}
