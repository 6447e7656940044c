//! A member's state beyond one cluster's balancer: a `[member.NAME]` listed by several
//! clusters (SGD's server in several load-balancing groups) and, with a tier load view, what the
//! other routers of the tier have at each member.
//!
//! Each cluster's [`Balancer`] keeps its own member state behind its own lock, and a pick never
//! looks past it. What others know reaches it two ways:
//! - **load**: every request begun or ended and every session opened or closed on a shared
//!   member adds to one atomic count per member ([`SharedMember::local`]); before each pick a
//!   cluster holding shared members sets each one's addend ([`Balancer::set_external`]) to that
//!   count less its own, plus the tier's ([`SharedMember::tier`]). So a pick sees the other
//!   clusters' requests as of the moment it runs, at the cost of one atomic read per shared
//!   member of the cluster; a cluster without shared members pays one branch.
//! - **verdicts**: a health change (the member is probed by one of its clusters only: the first
//!   in name order with a `health` table), a passive ejection, an agent report are applied to
//!   every other cluster holding the member, one lock at a time, after the lock of the cluster
//!   that saw it is released.
//!
//! The table survives view swaps by member name, as member state does; a cluster's runtime
//! attaches to it when a view builds it. The state is generic over the holder `H` (the
//! cluster's runtime): this file knows nothing of a runtime but that it is held by reference,
//! and the verdicts a runtime relays to the others are in `relay.rs`, above both.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rondo_core::{Balancer, MemberSpec};

/// One member's state shared beyond a cluster: counts and the clusters that hold it.
#[derive(Debug)]
pub struct SharedMember<H> {
    /// Requests in flight plus sessions that this process's clusters have at the member
    /// (signed: a member that became shared while requests were out sees their ends; read as
    /// at least zero).
    local: AtomicI64,
    /// What the other routers of the tier have at it (set by the tier's load view).
    pub tier: AtomicU32,
    holders: Mutex<Holders<H>>,
}

impl<H> Default for SharedMember<H> {
    fn default() -> Self {
        SharedMember {
            local: AtomicI64::new(0),
            tier: AtomicU32::new(0),
            holders: Mutex::default(),
        }
    }
}

/// The clusters that list a shared member, and their runtimes in the view in effect.
#[derive(Debug)]
struct Holders<H> {
    /// The clusters that list it (in name order).
    listed: Vec<String>,
    /// Each cluster's newest runtime holding it, with the member's index there and whether
    /// the cluster has health checks.
    rts: Vec<(String, Weak<H>, usize, bool)>,
}

impl<H> Default for Holders<H> {
    fn default() -> Self {
        Holders { listed: Vec::new(), rts: Vec::new() }
    }
}

impl<H> SharedMember<H> {
    /// What this process's clusters have at the member (requests in flight and sessions).
    pub fn local(&self) -> u32 {
        u32::try_from(self.local.load(Ordering::Relaxed).max(0)).unwrap_or(u32::MAX)
    }

    fn add(&self, delta: i64) {
        self.local.fetch_add(delta, Ordering::Relaxed);
    }

    /// The other clusters holding the member, newest runtimes first found; `me` left out.
    pub(super) fn others(&self, me: &str) -> Vec<(Arc<H>, usize)> {
        let holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        holders
            .rts
            .iter()
            .filter(|(c, _, _, _)| c != me)
            .filter_map(|(_, rt, i, _)| rt.upgrade().map(|rt| (rt, *i)))
            .collect()
    }

    /// The names of the clusters holding it, in name order.
    pub fn clusters(&self) -> Vec<String> {
        self.holders.lock().unwrap_or_else(|e| e.into_inner()).listed.clone()
    }

    /// The cluster whose health checks judge the member for all: the first that lists it (in
    /// name order) and has a `health` table; `None`: none checks it.
    pub(super) fn prober(&self) -> Option<String> {
        let holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        holders.listed.iter().find_map(|c| {
            let (_, rt, _, checks) = holders.rts.iter().find(|(name, _, _, _)| name == c)?;
            (*checks && rt.strong_count() > 0).then(|| c.clone())
        })
    }
}

/// What a cluster's runtime knows of its members' shared state (absent: none is shared).
#[derive(Debug)]
pub struct External<H> {
    /// Parallel to the members: the shared state of each shared one.
    by_member: Vec<Option<Arc<SharedMember<H>>>>,
    /// The members whose addend a pick refreshes.
    shared: Vec<u32>,
}

impl<H> External<H> {
    /// Sets every shared member's addend in `b` from the counts (before a pick).
    #[inline]
    pub(super) fn refresh(&self, b: &mut Balancer) {
        for &i in &self.shared {
            let i = i as usize;
            if let Some(s) = &self.by_member[i] {
                let own = b.states()[i].load;
                let own = own.in_flight.saturating_add(own.sessions);
                let others = s.local().saturating_sub(own);
                b.set_external(i, others.saturating_add(s.tier.load(Ordering::Relaxed)));
            }
        }
    }

    /// `member`'s own count changed by `delta` (a request or a session began or ended).
    #[inline]
    pub(super) fn count(&self, member: usize, delta: i64) {
        if let Some(Some(s)) = self.by_member.get(member) {
            s.add(delta);
        }
    }

    /// The shared state of `member`, when it is shared.
    pub fn member(&self, member: usize) -> Option<&Arc<SharedMember<H>>> {
        self.by_member.get(member)?.as_ref()
    }
}

/// The process's shared members by name: which clusters list each (from the configuration)
/// and their state.
#[derive(Debug)]
pub struct SharedMembers<H> {
    table: Mutex<Table<H>>,
}

impl<H> Default for SharedMembers<H> {
    fn default() -> Self {
        SharedMembers { table: Mutex::default() }
    }
}

#[derive(Debug)]
struct Table<H> {
    /// Member name -> the clusters that list it (two or more, in name order), in effect.
    listed: BTreeMap<String, Vec<String>>,
    /// The configuration file's (with admin API changes).
    file: BTreeMap<String, Vec<String>>,
    /// The tier's shared configuration's, which replaces the file's while set.
    shared: Option<BTreeMap<String, Vec<String>>>,
    members: HashMap<String, Arc<SharedMember<H>>>,
}

impl<H> Default for Table<H> {
    fn default() -> Self {
        Table {
            listed: BTreeMap::new(),
            file: BTreeMap::new(),
            shared: None,
            members: HashMap::new(),
        }
    }
}

impl<H> SharedMembers<H> {
    /// Sets which clusters list which shared member (a config's `shared_members`); state of a
    /// member that stays shared is kept. Returns whether anything changed (the caller then
    /// swaps a view in, so that the clusters' runtimes attach).
    pub fn set(&self, listed: BTreeMap<String, Vec<String>>) -> bool {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.file = listed;
        Self::in_effect(&mut t)
    }

    /// Sets or clears the tier's shared configuration's shared members, which replace the
    /// file's while set (as its view replaces the file's). Returns whether anything changed.
    pub fn set_shared(&self, listed: Option<BTreeMap<String, Vec<String>>>) -> bool {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.shared = listed;
        Self::in_effect(&mut t)
    }

    /// Makes the layer in force the table in effect, keeping the state of every member that
    /// stays shared.
    fn in_effect(t: &mut Table<H>) -> bool {
        let listed = t.shared.clone().unwrap_or_else(|| t.file.clone());
        if t.listed == listed {
            return false;
        }
        t.members.retain(|name, _| listed.contains_key(name));
        for (name, clusters) in &listed {
            let s = t.members.entry(name.clone()).or_default();
            let mut holders = s.holders.lock().unwrap_or_else(|e| e.into_inner());
            holders.listed = clusters.clone();
            holders.rts.retain(|(c, _, _, _)| clusters.contains(c));
        }
        t.listed = listed;
        true
    }

    /// The shared member `name`, if it is one.
    pub fn get(&self, name: &str) -> Option<Arc<SharedMember<H>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).members.get(name).cloned()
    }

    /// The clusters that list the shared member `name` (empty: it is not shared).
    pub fn clusters_of(&self, name: &str) -> Vec<String> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.listed.get(name).cloned().unwrap_or_default()
    }

    /// Whether any member is shared.
    pub fn is_empty(&self) -> bool {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).listed.is_empty()
    }

    /// Attaches the new runtime `rt` of `cluster` (of `members`; `checks`: it has health
    /// checks) to the shared members it holds: its [`External`] (returned; `None` when it holds
    /// none) and its place among their holders.
    pub(super) fn attach(
        &self,
        rt: &Arc<H>,
        cluster: &str,
        members: &[MemberSpec],
        checks: bool,
    ) -> Option<External<H>> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.listed.is_empty() {
            return None;
        }
        let mut ext = External { by_member: vec![None; members.len()], shared: Vec::new() };
        for (i, m) in members.iter().enumerate() {
            let Some(clusters) = t.listed.get(&m.name) else { continue };
            if !clusters.iter().any(|c| c == cluster) {
                continue;
            }
            let Some(s) = t.members.get(&m.name) else { continue };
            let mut holders = s.holders.lock().unwrap_or_else(|e| e.into_inner());
            holders.rts.retain(|(c, _, _, _)| c != cluster);
            holders.rts.push((cluster.to_owned(), Arc::downgrade(rt), i, checks));
            drop(holders);
            ext.by_member[i] = Some(s.clone());
            ext.shared.push(i as u32);
        }
        (!ext.shared.is_empty()).then_some(ext)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rondo_core::{FailureKind, Outcome, PickRequest, View};

    use super::*;
    use crate::clock;
    use crate::live::ClusterRt;
    use crate::live::Live;
    use crate::live::tests::live;

    /// `live()`'s cluster `c` (members `a`, `b`, quick to eject) and a copy `d`, sharing `a`.
    fn two_clusters() -> Live {
        let live = live();
        let mut view = (*live.load().view).clone();
        let mut d = (*view.clusters["c"]).clone();
        d.name = "d".into();
        view.clusters.insert("d".into(), Arc::new(d));
        live.apply(View { id: 2, ..view });
        let listed = [("a".to_owned(), vec!["c".to_owned(), "d".to_owned()])];
        assert!(live.set_shared_members(listed.into_iter().collect()).is_some());
        live
    }

    /// The tier's shared configuration replaces the file's shared members while set, and the
    /// file's come back when it is cleared, with the state of a member shared in both.
    #[test]
    fn the_shared_configurations_members_replace_the_files_while_set() {
        let t = SharedMembers::<ClusterRt>::default();
        let file: BTreeMap<String, Vec<String>> =
            [("a".to_owned(), vec!["c".to_owned(), "d".to_owned()])].into_iter().collect();
        assert!(t.set(file.clone()));
        let a = t.get("a").expect("shared");
        assert!(t.set_shared(Some(BTreeMap::new())));
        assert!(t.clusters_of("a").is_empty() && t.is_empty());
        assert!(t.set_shared(Some(file.clone())));
        assert!(!t.set_shared(Some(file)), "unchanged");
        assert!(!t.set_shared(None), "the file's are the same");
        assert_eq!(t.clusters_of("a"), ["c", "d"]);
        assert!(!Arc::ptr_eq(&a, &t.get("a").expect("shared")), "a new state after a gap");
    }

    #[test]
    fn an_ejection_in_one_cluster_takes_the_member_out_of_the_other() {
        let live = two_clusters();
        let snap = live.load();
        let (c, d) = (snap.clusters["c"].clone(), snap.clusters["d"].clone());
        let fail = Outcome::Failure { kind: FailureKind::Connect, latency: Duration::ZERO };
        for _ in 0..2 {
            let req = PickRequest { now: clock::now(), exclude: &[1], ..PickRequest::default() };
            let m = c.pick_and_begin(&req).expect("a member").member;
            assert_eq!(m, 0);
            c.end_request(m, fail);
        }
        let ejected = |rt: &ClusterRt| rt.with(|b| b.states()[0].ejected_until.is_some());
        assert!(ejected(&c) && ejected(&d), "one ejection state");
        // `b` is no shared member: nothing of it crosses.
        let req = PickRequest { now: clock::now(), exclude: &[0], ..PickRequest::default() };
        let m = d.pick_and_begin(&req).expect("b").member;
        d.end_request(m, fail);
        d.pick_and_begin(&req).expect("b");
        assert!(c.with(|b| b.states()[1].ejected_until.is_none()));
    }

    #[test]
    fn counts_cross_clusters_and_survive_a_reload() {
        let live = two_clusters();
        let snap = live.load();
        let (c, d) = (snap.clusters["c"].clone(), snap.clusters["d"].clone());
        let req = PickRequest { now: clock::now(), exclude: &[1], ..PickRequest::default() };
        for _ in 0..2 {
            c.pick_and_begin(&req).expect("a");
        }
        let shared = live.views.shared_members().get("a").expect("shared");
        assert_eq!(shared.local(), 2);
        // A pick in `d` sees `c`'s two: its addend, while its own count stays its own.
        d.pick(&PickRequest { now: clock::now(), ..PickRequest::default() }).expect("a member");
        assert_eq!(d.with(|b| (b.states()[0].load.external, b.states()[0].load.in_flight)), (2, 0));
        // A reload: the requests end on the new runtimes, the count with them.
        let view = (*live.load().view).clone();
        let next = live.apply(View { id: 10, ..view });
        for _ in 0..2 {
            c.end_request(0, Outcome::Success { latency: Duration::from_millis(1) });
        }
        assert_eq!(shared.local(), 0);
        let d2 = next.clusters["d"].clone();
        d2.pick(&PickRequest { now: clock::now(), ..PickRequest::default() }).expect("a member");
        assert_eq!(d2.with(|b| b.states()[0].load.external), 0);
        assert!(d2.shared_member(0).is_some() && d2.shared_member(1).is_none());
        // No longer shared: the runtimes detach.
        assert!(live.set_shared_members(Default::default()).is_some());
        assert!(live.load().clusters["d"].shared_member(0).is_none());
    }
}
