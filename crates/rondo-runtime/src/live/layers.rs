//! The layered view: the configuration file's view (with admin API changes), replaced by the
//! tier's shared configuration while one is set, composed with the registered members and
//! swapped in with a higher view id, each cluster's runtime carried over; long compositions
//! yield the CPU every [`MEMBERS_PER_YIELD`] members. The registered members' layer is
//! defined here too ([`Registered`]), as the composition reads it; `registered.rs` changes it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use rondo_core::{Balancer, ClusterSpec, MemberSpec, View};

use crate::clock;

use super::{ClusterRt, Clusters, Snapshot, ViewState, Views};

/// The layers the view in effect is composed from, behind the view's replacement lock ([`Views`]).
#[derive(Debug)]
pub(super) struct Layers {
    /// The config file's view, with admin API changes.
    pub(super) file: View,
    /// The tier's shared configuration (etcd), which replaces `file` while set.
    pub(super) shared: Option<View>,
    /// Members discovered through DNS by cluster (`members_dns`), appended to the configured
    /// members before the registered ones.
    pub(super) dns: BTreeMap<String, Vec<MemberSpec>>,
    /// Registered members by cluster.
    pub(super) registered: Registered,
    /// Whether registrations may declare clusters the configuration lacks (`[naming]
    /// allow_registered_clusters`); off, their members wait for a configured cluster, whatever
    /// a snapshot or another router of the tier recorded.
    pub(super) allow_declared: bool,
}

impl Layers {
    pub(super) fn configured(&self) -> &View {
        self.shared.as_ref().unwrap_or(&self.file)
    }

    /// The view in effect: the configuration with registered members appended to their
    /// clusters (a registered name that a configured member already has is left out).
    /// Clusters the configuration lacks come in as their registrations declared them.
    pub(super) fn compose(
        &self,
    ) -> (View, BTreeMap<String, Arc<BTreeSet<String>>>, BTreeSet<String>) {
        let mut view = self.configured().clone();
        for (cluster, members) in &self.dns {
            if let Some(spec) = view.clusters.get_mut(cluster)
                && let Some((with, _)) = with_registered(spec, members)
            {
                *spec = with;
            }
        }
        let mut names = BTreeMap::new();
        let mut declared = BTreeSet::new();
        for (cluster, reg) in &self.registered {
            let Some((base, is_declared)) = self.base_of(cluster) else { continue };
            if let Some((with, added)) = with_registered(&base, &reg.members) {
                view.clusters.insert(cluster.clone(), with);
                names.insert(cluster.clone(), added);
                if is_declared {
                    declared.insert(cluster.clone());
                }
            }
        }
        (view, names, declared)
    }

    /// What `cluster`'s registered members are appended to: the configured cluster, else the
    /// cluster they declared (`true`), else nothing (they wait for a configured one).
    pub(super) fn base_of(&self, cluster: &str) -> Option<(Arc<ClusterSpec>, bool)> {
        match self.configured().clusters.get(cluster) {
            Some(spec) => {
                // Its members from DNS count as configured ones (a configured name wins).
                let dns = self.dns.get(cluster).map_or(&[][..], |m| &m[..]);
                let with = with_registered(spec, dns).map_or_else(|| spec.clone(), |(w, _)| w);
                Some((with, false))
            }
            None if self.allow_declared => {
                self.registered.get(cluster)?.declared.clone().map(|d| (d, true))
            }
            None => None,
        }
    }
}

/// One cluster's registered members, and the cluster their registrations declared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegisteredCluster {
    /// The members, in the registry's order.
    pub members: Vec<MemberSpec>,
    /// The cluster as its registrations declared it (policy, session, protocol; no members),
    /// composed into the view with the members while the configuration has no cluster of that
    /// name (`[naming] allow_registered_clusters`); `None`: the members wait for a configured
    /// cluster. A configured cluster of the name always wins, with its own policy.
    pub declared: Option<Arc<ClusterSpec>>,
}

/// Members registered with the naming service, by cluster.
pub type Registered = BTreeMap<String, RegisteredCluster>;

/// `spec` with the registered `members` appended (a name it already has is left out), and the
/// names added; `None` when none is. Linear in the cluster, whatever the other clusters hold.
pub(super) fn with_registered(
    spec: &Arc<ClusterSpec>,
    members: &[MemberSpec],
) -> Option<(Arc<ClusterSpec>, Arc<BTreeSet<String>>)> {
    let mut with = (**spec).clone();
    // The configured names once, not a scan of the growing member list per registered member
    // (quadratic: 10,000 registrations made every view swap take ~100 ms).
    let configured: HashSet<&str> = spec.members.iter().map(|c| c.name.as_str()).collect();
    with.members.reserve(members.len());
    // The registry gives its members in name order: then a repeated name is the one before,
    // and the set of names is built in bulk from the sorted list (no search per name). In any
    // other order, one search of the set per member (`insert` says whether the name was new).
    let mut names: Vec<String> = Vec::with_capacity(members.len());
    let mut unordered: Option<BTreeSet<String>> = None;
    for (i, m) in members.iter().enumerate() {
        yield_now_and_then(i);
        if configured.contains(m.name.as_str()) {
            tracing::debug!(cluster = spec.name, member = m.name, "registered name is configured");
            continue;
        }
        let repeated = match &mut unordered {
            None if names.last().is_none_or(|last| *last < m.name) => false,
            None => {
                let mut set: BTreeSet<String> = names.drain(..).collect();
                let repeated = !set.insert(m.name.clone());
                unordered = Some(set);
                repeated
            }
            Some(set) => !set.insert(m.name.clone()),
        };
        if repeated {
            tracing::debug!(cluster = spec.name, member = m.name, "registered name given twice");
            continue;
        }
        if unordered.is_none() {
            names.push(m.name.clone());
        }
        with.members.push(m.clone());
    }
    let added = unordered.unwrap_or_else(|| names.into_iter().collect());
    (!added.is_empty()).then(|| (Arc::new(with), Arc::new(added)))
}

/// Members composed between two yields of the thread composing a big cluster's view.
pub const MEMBERS_PER_YIELD: usize = 256;

/// Every [`MEMBERS_PER_YIELD`]th member (`i`) of a long composition, gives the CPU to any thread
/// waiting for it (`sched_yield`). A composition of 10,000 registered members takes tens of
/// milliseconds; run in one stretch, it holds its CPU for a whole scheduler slice at a time, and
/// a request thread woken on that CPU waits the slice out (milliseconds added to the proxied
/// p99 while a big service takes registrations). With yields, it waits for one stretch of 256
/// members at most; with no thread waiting, a yield returns at once.
pub fn yield_now_and_then(i: usize) {
    if i > 0 && i.is_multiple_of(MEMBERS_PER_YIELD) {
        std::thread::yield_now();
    }
}

impl Views {
    /// Replaces the config file's view (a reload, or a config applied through the admin API),
    /// keeping the state of every cluster and member that survives. The new view's id is raised
    /// above the current one if needed. Returns the new snapshot.
    pub fn apply(&self, view: View) -> Arc<Snapshot> {
        let mut layers = self.0.layers();
        let id = view.id;
        layers.file = view;
        self.0.swap(&layers, id)
    }

    /// Like [`Views::apply`], only when the current view's id is `expected` (checked and swapped
    /// under one lock); else the current id. For the admin API's `If-Match`.
    pub fn apply_if(&self, view: View, expected: u64) -> Result<Arc<Snapshot>, u64> {
        let mut layers = self.0.layers();
        let current = self.0.current.load().view.id;
        if current != expected {
            return Err(current);
        }
        let id = view.id;
        layers.file = view;
        Ok(self.0.swap(&layers, id))
    }

    /// The configuration in effect (the shared one when set, else the file's), without
    /// registered members: the base for a change such as a new weight.
    pub fn configured(&self) -> View {
        self.0.layers().configured().clone()
    }

    /// Changes the configuration in effect (the shared one when set, else the file's) with
    /// `change`, read, modified and swapped in under one lock, so that two concurrent changes
    /// (two admin calls, or one racing a registration) both land. An `Err` from `change` leaves
    /// everything as it was.
    pub fn update_configured<E>(
        &self,
        change: impl FnOnce(&mut View) -> Result<(), E>,
    ) -> Result<Arc<Snapshot>, E> {
        let mut layers = self.0.layers();
        let mut view = layers.configured().clone();
        change(&mut view)?;
        match &mut layers.shared {
            Some(shared) => *shared = view,
            None => layers.file = view,
        }
        Ok(self.0.swap(&layers, 0))
    }

    /// Sets which clusters list which shared member (a config's `shared_members`) and, when
    /// that changed, swaps the view in anew so that every cluster's runtime attaches to them.
    pub fn set_shared_members(
        &self,
        listed: BTreeMap<String, Vec<String>>,
    ) -> Option<Arc<Snapshot>> {
        let layers = self.0.layers();
        self.0.shared_members.set(listed).then(|| self.0.swap(&layers, 0))
    }

    /// Whether the tier's shared configuration (etcd) is in effect, replacing the file's.
    pub fn has_shared(&self) -> bool {
        self.0.layers().shared.is_some()
    }

    /// Sets or clears the tier's shared configuration; `None` goes back to the file's.
    pub fn set_shared(&self, view: Option<View>) -> Arc<Snapshot> {
        let mut layers = self.0.layers();
        let id = view.as_ref().map_or(0, |v| v.id);
        layers.shared = view;
        self.0.swap(&layers, id)
    }
}

impl ViewState {
    /// Composes the layers and swaps the result in, with an id above the current one.
    pub(super) fn swap(&self, layers: &Layers, id: u64) -> Arc<Snapshot> {
        let (mut view, registered, declared) = layers.compose();
        let old = self.current.load_full();
        // View ids only ever grow, whoever built the view (file reload, admin API, registry)
        // and whatever id it guessed: two changes computed from the same view get distinct,
        // ordered ids.
        view.id = id.max(old.view.id + 1);
        let now = clock::now();
        let clusters: Clusters = view
            .clusters
            .iter()
            .map(|(name, spec)| (name.clone(), self.runtime_for(spec, old.clusters.get(name), now)))
            .collect();
        let id = view.id;
        let declared = Arc::new(declared);
        let snapshot = Arc::new(Snapshot { view: Arc::new(view), clusters, registered, declared });
        self.current.store(snapshot.clone());
        self.view_id.send_replace(id);
        self.metrics.members_changed(&snapshot.view, None);
        snapshot
    }

    /// The runtime of `spec` in a new view: `prev`'s state carried over when the cluster was
    /// in the previous view, else a fresh one.
    pub(super) fn runtime_for(
        &self,
        spec: &Arc<ClusterSpec>,
        prev: Option<&Arc<ClusterRt>>,
        now: rondo_core::Instant,
    ) -> Arc<ClusterRt> {
        let attach = |rt: Arc<ClusterRt>| {
            let checks = rt.spec.policy.health.is_some();
            if let Some(ext) =
                self.shared_members.attach(&rt, &rt.spec.name, &rt.spec.members, checks)
            {
                let _ = rt.external.set(ext);
            }
            rt
        };
        match prev {
            // Copy the state and link the successor under the old runtime's lock, so no
            // request can end on the old runtime after its counts were copied.
            Some(prev) => prev.with(|b| {
                let balancer =
                    Balancer::carry_over_pausing(spec.clone(), b, now, &mut yield_now_and_then);
                let rt =
                    Arc::new(ClusterRt::new(balancer, self.metrics.clone(), self.signal.clone()));
                let rt = attach(rt);
                let _ = prev.successor.set(rt.clone());
                rt
            }),
            None => {
                let balancer = Balancer::new(spec.clone(), now);
                attach(Arc::new(ClusterRt::new(
                    balancer,
                    self.metrics.clone(),
                    self.signal.clone(),
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use crate::live::tests::{live, names};

    #[test]
    fn view_ids_only_grow_even_when_two_changes_guess_the_same_id() {
        let live = live();
        let base = (*live.load().view).clone();
        let a = live.apply(View { id: 2, ..base.clone() }).view.id;
        let b = live.apply(View { id: 2, ..base.clone() }).view.id;
        let c = live.apply(View { id: 1, ..base }).view.id;
        assert_eq!((a, b, c), (2, 3, 4));
    }

    #[test]
    fn a_shared_config_replaces_the_file_until_cleared() {
        let live = live();
        let file = live.configured();
        let mut shared = file.clone();
        let mut c = (*shared.clusters["c"]).clone();
        c.members.truncate(1);
        shared.clusters.insert("c".into(), Arc::new(c));
        let id1 = live.set_shared(Some(shared)).view.id;
        assert_eq!(names(&live.load()), ["a"]);
        // An admin change edits the configuration in effect: the shared one.
        let id2 = live
            .views
            .update_configured(|v| {
                assert_eq!(v.clusters["c"].members.len(), 1);
                Ok::<(), ()>(())
            })
            .unwrap()
            .view
            .id;
        // A file reload while the shared config is set changes the file layer only.
        let id3 = live.apply(file).view.id;
        assert_eq!(names(&live.load()), ["a"]);
        let id4 = live.set_shared(None).view.id;
        assert_eq!(names(&live.load()), ["a", "b"], "back to the file's");
        assert!(id1 < id2 && id2 < id3 && id3 < id4, "{id1} {id2} {id3} {id4}");
    }

    /// Regression: the admin API read the configuration, changed it and applied it in separate
    /// steps, so of two concurrent changes the later silently undid the earlier. Here one change
    /// is held open while a second is made: the second waits, and both land.
    #[test]
    fn concurrent_changes_to_the_configuration_both_land() {
        let live = Arc::new(live());
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let first = {
            let live = live.clone();
            std::thread::spawn(move || {
                live.views.update_configured(|v| {
                    inside_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                    let mut c = (*v.clusters["c"]).clone();
                    c.members[0].weight = 7;
                    v.clusters.insert("c".into(), Arc::new(c));
                    Ok::<(), ()>(())
                })
            })
        };
        inside_rx.recv().unwrap();
        live.views
            .update_configured(|v| {
                let mut c = (*v.clusters["c"]).clone();
                c.members[1].weight = 9;
                v.clusters.insert("c".into(), Arc::new(c));
                Ok::<(), ()>(())
            })
            .unwrap();
        first.join().unwrap().unwrap();
        let weights: Vec<u32> =
            live.load().view.clusters["c"].members.iter().map(|m| m.weight).collect();
        assert_eq!(weights, [7, 9]);
        // A refused change leaves everything as it was.
        let id = live.load().view.id;
        assert_eq!(live.views.update_configured(|_| Err("no")).unwrap_err(), "no");
        assert_eq!(live.load().view.id, id);
    }
}
