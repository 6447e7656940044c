//! The embedded registry's registrations in memory: each member's entry with its lease, the
//! counts the caps and declared policies need, and how an entry is put in, taken out, lapses,
//! is composed into a view and is stored and restored.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rondo_core::{AdminState, MemberSpec, SplitMix64};
use rondo_runtime::live::{Registered, RegisteredCluster};

use crate::journal::{SavedRef, SavedRegistration};
use crate::registry::{self, Declared};

pub(super) type Key = (String, String);

#[derive(Debug)]
pub(super) struct State {
    pub(super) regs: BTreeMap<Key, Entry>,
    /// Lease id to (cluster, member).
    pub(super) leases: HashMap<u64, Key>,
    /// Registered members per service (for the caps).
    pub(super) per_service: HashMap<String, usize>,
    /// The policy a cluster's registrations declared, and how many of them hold it (every
    /// registration of a cluster the configuration lacks holds its cluster's one).
    pub(super) declared: HashMap<String, (Arc<Declared>, usize)>,
    /// No lease lapses before this (a lower bound: keepalives only push deadlines later).
    pub(super) next_expiry: Option<Instant>,
    pub(super) rng: SplitMix64,
    pub(super) last_error: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) member: MemberSpec,
    /// The policy it declared or joined (none: into a configured cluster).
    pub(super) policy: Option<Arc<Declared>>,
    pub(super) lease: u64,
    pub(super) ttl: Duration,
    pub(super) expires: Instant,
}

pub(super) fn insert(st: &mut State, key: Key, entry: Entry) {
    st.leases.insert(entry.lease, key.clone());
    *st.per_service.entry(key.0.clone()).or_default() += 1;
    if let Some(p) = &entry.policy {
        st.declared.entry(key.0.clone()).or_insert_with(|| (p.clone(), 0)).1 += 1;
    }
    st.next_expiry = Some(st.next_expiry.map_or(entry.expires, |t| t.min(entry.expires)));
    st.regs.insert(key, entry);
}

pub(super) fn remove(st: &mut State, key: &Key) -> Option<Entry> {
    let old = st.regs.remove(key)?;
    st.leases.remove(&old.lease);
    if old.policy.is_some()
        && let Some((_, n)) = st.declared.get_mut(&key.0)
    {
        *n -= 1;
        if *n == 0 {
            st.declared.remove(&key.0);
        }
    }
    if let Some(n) = st.per_service.get_mut(&key.0) {
        *n -= 1;
        if *n == 0 {
            st.per_service.remove(&key.0);
        }
    }
    Some(old)
}

/// Removes every registration whose lease lapsed by `now`; returns their keys.
pub(super) fn expire(st: &mut State, now: Instant) -> Vec<Key> {
    if st.next_expiry.is_none_or(|t| t > now) {
        return Vec::new();
    }
    // A pass over every lease, at most once per tick and only once the earliest deadline
    // known passed (keepalives only push deadlines later, so it is a lower bound).
    let lapsed: Vec<Key> =
        st.regs.iter().filter(|(_, e)| e.expires <= now).map(|(k, _)| k.clone()).collect();
    for key in &lapsed {
        remove(st, key);
        tracing::info!(cluster = key.0, member = key.1, "lease lapsed: member removed");
    }
    st.next_expiry = st.regs.values().map(|e| e.expires).min();
    lapsed
}

/// The registered members by cluster, and their number.
pub(super) fn registered(st: &State) -> (Registered, usize) {
    let mut registered = Registered::new();
    for ((cluster, _), e) in &st.regs {
        registered.entry(cluster.clone()).or_default().members.push(e.member.clone());
    }
    for (cluster, reg) in &mut registered {
        reg.declared = declared_of(st, cluster);
    }
    (registered, st.regs.len())
}

/// The registered members of `cluster`, in name order (a range of the map: the cluster's
/// size, not the registry's), and the cluster they declared.
pub(super) fn members_of(st: &State, cluster: &str) -> RegisteredCluster {
    let members = st
        .regs
        .range((cluster.to_owned(), String::new())..)
        .take_while(|((c, _), _)| c == cluster)
        .enumerate()
        .map(|(i, (_, e))| {
            rondo_runtime::live::yield_now_and_then(i);
            e.member.clone()
        })
        .collect();
    RegisteredCluster { members, declared: declared_of(st, cluster) }
}

/// The cluster `cluster`'s registrations declared, if they did.
fn declared_of(st: &State, cluster: &str) -> Option<Arc<rondo_core::ClusterSpec>> {
    st.declared.get(cluster).map(|(d, _)| d.spec.clone())
}

/// `e` of `cluster` as the snapshot and the log store it.
pub(super) fn saved<'a>(cluster: &'a str, e: &'a Entry) -> SavedRef<'a> {
    SavedRef {
        cluster,
        name: &e.member.name,
        address: &e.member.address,
        weight: e.member.weight,
        group: e.member.group.as_deref(),
        ttl_ms: e.ttl.as_millis() as u64,
        lease: e.lease.to_string(),
        policy: e.policy.as_ref().map(|p| &p.raw),
    }
}

/// A stored registration checked as the API checks one, with a fresh lease deadline.
pub(super) fn restore(r: SavedRegistration, now: Instant) -> Result<(Key, Entry), String> {
    let ttl = Duration::from_millis(r.ttl_ms);
    registry::check_name("service", &r.cluster)
        .and_then(|()| registry::check_name("member", &r.name))
        .and_then(|()| registry::check_address(&r.address))
        .and_then(|()| registry::check_weight(r.weight))
        .and_then(|()| {
            r.group.as_deref().map_or(Ok(()), |g| registry::check_name("field `group`", g))
        })
        .and_then(|()| registry::check_ttl(ttl))?;
    let lease = match r.lease.parse::<u64>() {
        Ok(l) if l != 0 => l,
        _ => return Err(format!("lease `{}` is not a non-zero number", r.lease)),
    };
    let policy = match r.policy {
        Some(raw) => Some(Arc::new(Declared::compile(&r.cluster, raw)?)),
        None => None,
    };
    let key = (r.cluster, r.name.clone());
    let member = MemberSpec {
        name: r.name,
        address: r.address,
        weight: r.weight,
        group: r.group,
        admin: AdminState::Active,
    };
    Ok((key, Entry { member, policy, lease, ttl, expires: now + ttl }))
}
