//! The etcd registry's sync task: it reads the whole prefix, publishes it into the live view,
//! then watches the prefix and applies each change (members, the shared configuration,
//! revocations, the tier's routers); when etcd cannot be reached the last view stays and the
//! task retries with a backoff (see the parent module's docs).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};
use rondo_core::{AdminState, MemberSpec};
use rondo_runtime::live::{Registered, RegisteredCluster};
use rondo_runtime::probe;
use rondo_runtime::revoke::{Revocation, RevokeKind};

use super::{
    BACKOFF_MAX, BACKOFF_MIN, Inner, MemberValue, REQUEST_TIMEOUT, RevokedValue, State, unix_now,
};
use crate::registry::Declared;

/// Why a sync session ended.
pub(super) enum SessionEnd {
    /// The watch fell behind a compaction (or was cancelled): read everything again.
    Resync(String),
    /// etcd could not be reached or the stream broke.
    Failed(String),
}

impl Inner {
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
        self.revocations.set_shared(set, unix_now());
    }

    /// Tells the live state how many routers the tier has (at least this one).
    fn publish_routers(&self, st: &State) {
        let n = i64::try_from(st.routers.len()).unwrap_or(i64::MAX).max(1);
        self.metrics.tier_routers.set(n);
    }

    /// The background task: connect, read everything, watch; on failure keep the view and
    /// retry with a backoff.
    pub(super) async fn sync_loop(self: Arc<Self>) {
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
        self.metrics.registry_resyncs.inc();
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
            self.metrics.registry_connected.set(1);
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
                self.tier_keys.set_shared(None);
                self.views.shared_members().set_shared(None);
                let snapshot = self.views.set_shared(None);
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
                self.tier_keys.set_shared(tier_key);
                self.views.shared_members().set_shared(Some(config.shared_members));
                let snapshot = self.views.set_shared(Some(config.view));
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
        self.metrics.registrations.set(st.members.len() as i64);
        let snapshot = self.registrations.set_registered(registered);
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
        self.metrics.registry_connected.set(0);
    }
}
