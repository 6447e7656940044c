//! Members registered with the naming service: appended to their clusters (or to the clusters
//! their registrations declared), a change rebuilding only its own clusters, and what it
//! replaced freed by the updating thread after [`RETIRED_GRACE`]. Members discovered through
//! DNS change their cluster by the same rebuild.

use std::collections::BTreeSet;
use std::sync::Arc;

use rondo_core::{MemberSpec, View};

use crate::clock;

use super::layers::{Layers, Registered, RegisteredCluster, with_registered, yield_now_and_then};
use super::{ClusterRt, Registrations, Snapshot, ViewState};

/// A cluster runtime (with its spec) and the names of its registered members, replaced in a
/// view, and when.
#[derive(Debug)]
pub(super) struct Retired {
    at: std::time::Instant,
    rt: Arc<ClusterRt>,
    names: Option<Arc<BTreeSet<String>>>,
}

impl Retired {
    /// Frees what this held, when it held the last reference, a stretch of
    /// [`MEMBERS_PER_YIELD`] members at a time (a 10,000-member cluster's member list, names and
    /// balancer take milliseconds to free, which in one stretch would hold the CPU as a long
    /// composition does; see [`yield_now_and_then`]). What another holder still references is
    /// freed by that holder.
    fn dispose(self) {
        if let Some(names) = self.names.and_then(|n| Arc::try_unwrap(n).ok()) {
            for (i, name) in names.into_iter().enumerate() {
                yield_now_and_then(i);
                drop(name);
            }
        }
        let Ok(rt) = Arc::try_unwrap(self.rt) else { return };
        let ClusterRt { spec, inner, data_plane, successor, .. } = rt;
        // The balancer holds the other reference to the spec.
        drop((inner, data_plane, successor));
        if let Ok(spec) = Arc::try_unwrap(spec) {
            for (i, member) in spec.members.into_iter().enumerate() {
                yield_now_and_then(i);
                drop(member);
            }
        }
    }
}

/// How long [`Registrations::update_registered`] keeps what it replaced before the updating thread drops
/// it: longer than a request holds a snapshot, short enough to hold few.
pub const RETIRED_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

impl Registrations {
    /// Lets registrations declare clusters the configuration lacks (`[naming]
    /// allow_registered_clusters`; off by default). Call it before the registry starts: it
    /// takes effect at the next change of the registered members and swaps no view in (a swap
    /// would give every cluster a new runtime, away from the probes already started).
    pub fn allow_declared(&self, on: bool) {
        self.0.layers().allow_declared = on;
    }

    /// Replaces the registered members (the registry's whole state).
    pub fn set_registered(&self, registered: Registered) -> Arc<Snapshot> {
        let mut layers = self.0.layers();
        layers.registered = registered;
        self.0.swap(&layers, 0)
    }

    /// Replaces the registered members of the clusters in `changes` only (no members: the
    /// cluster has none left) and swaps in a view in which only those clusters are rebuilt
    /// (their spec composed again, their runtime carried over); every other cluster keeps its
    /// spec and its runtime (the same `Arc`s: balancer state, probe task, data-plane cache), so
    /// the cost is the changed clusters' size, not the whole view's. A declared cluster whose
    /// last member left leaves the view. Returns the new snapshot and the cluster runtimes it
    /// built, whose probes the caller starts ([`crate::probe::spawn_clusters`]).
    pub fn update_registered(
        &self,
        changes: Vec<(String, RegisteredCluster)>,
    ) -> (Arc<Snapshot>, Vec<Arc<ClusterRt>>) {
        let mut layers = self.0.layers();
        let mut changed = Vec::with_capacity(changes.len());
        for (cluster, reg) in changes {
            if reg.members.is_empty() {
                layers.registered.remove(&cluster);
            } else {
                layers.registered.insert(cluster.clone(), reg);
            }
            changed.push(cluster);
        }
        self.0.rebuild(&layers, changed)
    }

    /// Replaces `cluster`'s members discovered through DNS (none: it has none left) and
    /// rebuilds that cluster alone, as [`Registrations::update_registered`] does: survivors keep their
    /// state. Returns the new snapshot and the runtimes built, whose probes the caller starts.
    pub fn update_dns(
        &self,
        cluster: &str,
        members: Vec<MemberSpec>,
    ) -> (Arc<Snapshot>, Vec<Arc<ClusterRt>>) {
        let mut layers = self.0.layers();
        if members.is_empty() {
            layers.dns.remove(cluster);
        } else {
            layers.dns.insert(cluster.to_owned(), members);
        }
        self.0.rebuild(&layers, vec![cluster.to_owned()])
    }

    /// Drops what [`Registrations::update_registered`] replaced more than [`RETIRED_GRACE`]
    /// ago (called by it, and by the registry's writer between batches), on the calling thread.
    pub fn reap_retired(&self) {
        self.0.reap_retired();
    }
}

impl ViewState {
    /// Swaps in a view in which the `changed` clusters are composed again from `layers` (their
    /// runtime carried over) and every other cluster keeps its spec and runtime.
    fn rebuild(
        &self,
        layers: &Layers,
        changed: Vec<String>,
    ) -> (Arc<Snapshot>, Vec<Arc<ClusterRt>>) {
        let old = self.current.load_full();
        // The previous view was composed from these same layers (every change to them swaps a
        // view in under this lock), so only the changed clusters need composing again.
        let mut view = View {
            id: old.view.id + 1,
            routes: old.view.routes.clone(),
            clusters: old.view.clusters.clone(),
        };
        let mut registered = old.registered.clone();
        let mut declared = old.declared.clone();
        let mut clusters = old.clusters.clone();
        let mut built = Vec::with_capacity(changed.len());
        let now = clock::now();
        let retiring = std::time::Instant::now();
        let mut retired: Vec<Retired> = changed
            .iter()
            .filter_map(|name| {
                Some(Retired {
                    at: retiring,
                    rt: old.clusters.get(name)?.clone(),
                    names: old.registered.get(name).cloned(),
                })
            })
            .collect();
        // Whose departed members' series to look at once the view is in.
        let names = changed.clone();
        for name in changed {
            let composed = layers.base_of(&name).and_then(|(base, is_declared)| {
                let members = layers.registered.get(&name).map_or(&[][..], |r| &r.members[..]);
                match with_registered(&base, members) {
                    Some((spec, added)) => Some((spec, Some(added), is_declared)),
                    // A configured cluster stays without registered members; a declared one
                    // leaves with its last member.
                    None => (!is_declared).then_some((base, None, false)),
                }
            });
            let Some((spec, added, is_declared)) = composed else {
                // Neither configured nor declared (any more): out of the view if it was
                // declared; registered members of a cluster the configuration lacks and that
                // nobody declared are kept for when it has one, as `compose` does.
                if declared.contains(&name) {
                    Arc::make_mut(&mut declared).remove(&name);
                    view.clusters.remove(&name);
                    clusters.remove(&name);
                    registered.remove(&name);
                }
                continue;
            };
            match added {
                Some(added) => registered.insert(name.clone(), added),
                None => registered.remove(&name),
            };
            if is_declared != declared.contains(&name) {
                let set = Arc::make_mut(&mut declared);
                if is_declared {
                    set.insert(name.clone())
                } else {
                    set.remove(&name)
                };
            }
            view.clusters.insert(name.clone(), spec.clone());
            let rt = self.runtime_for(&spec, old.clusters.get(&name), now);
            clusters.insert(name, rt.clone());
            built.push(rt);
        }
        let id = view.id;
        let snapshot = Arc::new(Snapshot { view: Arc::new(view), clusters, registered, declared });
        self.current.store(snapshot.clone());
        self.view_id.send_replace(id);
        self.metrics.members_changed(&snapshot.view, Some(&names));
        drop(old);
        self.retired.lock().unwrap_or_else(|e| e.into_inner()).append(&mut retired);
        self.reap_retired();
        (snapshot, built)
    }

    fn reap_retired(&self) {
        let due: Vec<Retired> = {
            let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            let keep = retired.iter().position(|r| r.at.elapsed() < RETIRED_GRACE);
            let upto = keep.unwrap_or(retired.len());
            retired.drain(..upto).collect()
        };
        for r in due {
            r.dispose();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rondo_core::{Algorithm, ClusterSpec, Policy, UpstreamProtocol};

    use super::*;

    use crate::live::tests::{live, member, names};

    fn regd(members: Vec<MemberSpec>) -> RegisteredCluster {
        RegisteredCluster { members, declared: None }
    }

    /// A cluster `name` declared with `algorithm` (no members).
    fn declared(name: &str, algorithm: Algorithm) -> Arc<ClusterSpec> {
        Arc::new(ClusterSpec {
            name: name.into(),
            members: Vec::new(),
            policy: Policy { algorithm, ..Policy::default() },
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: Default::default(),
            upstream_tls: None,
        })
    }

    /// Registered members in name order (the registry's), out of order, with a name given
    /// twice and with configured names: the same members and names as one search of a set
    /// per member gives.
    #[test]
    fn registered_members_are_appended_once_in_any_order() {
        let mut spec = (*declared("c", Algorithm::RoundRobin)).clone();
        spec.members = vec![member("b"), member("x")];
        let spec = Arc::new(spec);
        let names = |ms: &[MemberSpec]| ms.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
        for (given, want) in [
            (vec!["a", "b", "c", "d"], vec!["a", "c", "d"]),
            (vec!["d", "a", "x", "c", "a"], vec!["d", "a", "c"]),
            (vec!["a", "c", "c", "e", "d", "a"], vec!["a", "c", "e", "d"]),
            (vec!["b", "x"], vec![]),
        ] {
            let members: Vec<MemberSpec> = given.iter().map(|n| member(n)).collect();
            match with_registered(&spec, &members) {
                Some((with, added)) => {
                    assert_eq!(names(&with.members[2..]), want, "{given:?}");
                    assert_eq!(names(&with.members[..2]), ["b", "x"], "{given:?}");
                    let want: BTreeSet<String> = want.iter().map(|n| n.to_string()).collect();
                    assert_eq!(*added, want, "{given:?}");
                }
                None => assert!(want.is_empty(), "{given:?}"),
            }
        }
    }

    /// A cluster the configuration lacks comes into the view with the policy its registrations
    /// declared, is rebuilt alone, and leaves with its last member; a configured cluster keeps
    /// its own policy whatever its registrations declare.
    #[test]
    fn declared_clusters_come_with_their_members_and_leave_with_the_last() {
        let live = live();
        // Off (the default), a declared cluster's members wait like any others.
        let off = vec![(
            "orders".into(),
            RegisteredCluster {
                members: vec![member("o1")],
                declared: Some(declared("orders", Algorithm::Hash)),
            },
        )];
        let (snap, built) = live.registrations.update_registered(off);
        assert!(built.is_empty() && !snap.view.clusters.contains_key("orders"));
        live.registrations.update_registered(vec![("orders".into(), regd(vec![]))]);
        live.registrations.allow_declared(true);
        let before = live.load();
        let reg = |members, algorithm| RegisteredCluster {
            members,
            declared: Some(declared("orders", algorithm)),
        };
        let (snap, built) = live
            .registrations
            .update_registered(vec![("orders".into(), reg(vec![member("o1")], Algorithm::Hash))]);
        assert_eq!(built.len(), 1);
        assert!(snap.is_declared("orders") && !snap.is_declared("c"));
        let orders = &snap.view.clusters["orders"];
        assert_eq!(orders.policy.algorithm, Algorithm::Hash);
        assert_eq!(orders.members.len(), 1);
        assert!(snap.is_registered("orders", "o1") && !snap.is_configured("orders", "o1"));
        assert!(Arc::ptr_eq(&before.clusters["c"], &snap.clusters["c"]), "c is not rebuilt");

        // A whole composition agrees.
        let whole = live.apply(live.configured());
        assert_eq!(whole.view.clusters["orders"], snap.view.clusters["orders"]);
        assert_eq!(whole.declared, snap.declared);

        // Declared into a configured cluster: the configuration's policy stays.
        let (snap, _) = live.registrations.update_registered(vec![(
            "c".into(),
            RegisteredCluster {
                members: vec![member("r1")],
                declared: Some(declared("c", Algorithm::Hash)),
            },
        )]);
        assert_eq!(snap.view.clusters["c"].policy.algorithm, Policy::default().algorithm);
        assert!(!snap.is_declared("c"));

        // The last member gone, the declared cluster leaves the view.
        let (snap, built) =
            live.registrations.update_registered(vec![("orders".into(), regd(vec![]))]);
        assert!(built.is_empty());
        assert!(
            !snap.view.clusters.contains_key("orders") && !snap.clusters.contains_key("orders")
        );
        assert!(!snap.is_declared("orders") && !snap.registered.contains_key("orders"));
        let whole = live.apply(live.configured());
        assert!(!whole.view.clusters.contains_key("orders"));
    }

    #[test]
    fn registered_members_join_their_clusters_and_survive_config_changes() {
        let live = live();
        let mut rx = live.views.subscribe();
        let regs: Registered = [
            ("c".to_owned(), regd(vec![member("r1"), member("a")])),
            ("unknown".to_owned(), regd(vec![member("r2")])),
        ]
        .into_iter()
        .collect();
        let snap = live.registrations.set_registered(regs);
        // `a` is configured, so its registration is left out; `unknown` is no cluster.
        assert_eq!(names(&snap), ["a", "b", "r1"]);
        assert!(snap.is_registered("c", "r1") && !snap.is_registered("c", "a"));
        assert_eq!(*rx.borrow_and_update(), snap.view.id);

        // A config change keeps the registrations; the base excludes them.
        let mut base = live.configured();
        assert_eq!(base.clusters["c"].members.len(), 2);
        base.id = 1;
        let snap = live.apply(base);
        assert_eq!(names(&snap), ["a", "b", "r1"]);
        assert!(rx.has_changed().unwrap());
    }

    /// A registration rebuilds its own cluster only: every other cluster keeps its spec and its
    /// runtime (the same `Arc`s), and the result is the view `set_registered` composes.
    #[test]
    fn a_registration_rebuilds_only_its_own_cluster() {
        let live = live();
        live.views
            .update_configured(|v| {
                let mut d = (*v.clusters["c"]).clone();
                d.name = "d".into();
                v.clusters.insert("d".into(), Arc::new(d));
                Ok::<(), ()>(())
            })
            .unwrap();
        let before = live.load();
        let mut rx = live.views.subscribe();
        let (snap, built) =
            live.registrations.update_registered(vec![("c".into(), regd(vec![member("r1")]))]);
        assert_eq!(names(&snap), ["a", "b", "r1"]);
        assert!(snap.is_registered("c", "r1"));
        assert!(snap.is_configured("c", "a") && snap.is_configured("c", "b"));
        assert!(!snap.is_configured("c", "r1") && !snap.is_configured("nope", "a"));
        assert_eq!(built.len(), 1);
        assert!(Arc::ptr_eq(&built[0], &snap.clusters["c"]));
        assert!(before.clusters["c"].is_retired(), "c's runtime is replaced");
        assert!(Arc::ptr_eq(&before.clusters["d"], &snap.clusters["d"]), "d's runtime is kept");
        assert!(Arc::ptr_eq(&before.view.clusters["d"], &snap.view.clusters["d"]));
        assert!(!before.clusters["d"].is_retired());
        assert!(snap.view.id > before.view.id);
        assert_eq!(*rx.borrow_and_update(), snap.view.id);

        // A configured name is left out, as a whole composition does; the layers agree.
        let (snap, _) = live
            .registrations
            .update_registered(vec![("c".into(), regd(vec![member("r1"), member("a")]))]);
        assert_eq!(names(&snap), ["a", "b", "r1"]);
        let whole = live.apply(live.configured());
        assert_eq!(names(&whole), names(&snap));
        assert_eq!(whole.registered, snap.registered);

        // Its last registered member gone, the cluster is its configured self again.
        let (snap, _) = live.registrations.update_registered(vec![("c".into(), regd(vec![]))]);
        assert_eq!(names(&snap), ["a", "b"]);
        assert!(!snap.is_registered("c", "r1") && snap.registered.is_empty());
        // A cluster the configuration lacks: kept in the layers, in no view.
        let (snap, built) =
            live.registrations.update_registered(vec![("nope".into(), regd(vec![member("x")]))]);
        assert!(built.is_empty() && !snap.view.clusters.contains_key("nope"));
    }

    /// Members from DNS and registered members are separate layers of one cluster: neither
    /// change replaces the other's, a config reload keeps both, and a member that stays in the
    /// DNS answer keeps its state (here a drain) through the rebuild.
    #[test]
    fn dns_members_sit_between_configured_and_registered_and_keep_their_state() {
        use rondo_core::{Actor, AdminState};
        let live = live();
        live.registrations.update_registered(vec![("c".into(), regd(vec![member("r1")]))]);
        let (snap, built) =
            live.registrations.update_dns("c", vec![member("10.0.0.1:80"), member("a")]);
        assert_eq!(built.len(), 1);
        // `a` is configured: the configured member wins.
        assert_eq!(names(&snap), ["a", "b", "10.0.0.1:80", "r1"]);
        assert!(snap.is_configured("c", "10.0.0.1:80") && snap.is_registered("c", "r1"));
        snap.clusters["c"].with(|b| {
            let i = b.member_index("10.0.0.1:80").unwrap();
            b.set_admin(i, AdminState::Draining, Actor::Operator("t".into()));
        });

        // A registration leaves the DNS members alone, and the other way round.
        let (snap, _) =
            live.registrations.update_registered(vec![("c".into(), regd(vec![member("r2")]))]);
        assert_eq!(names(&snap), ["a", "b", "10.0.0.1:80", "r2"]);
        let (snap, _) =
            live.registrations.update_dns("c", vec![member("10.0.0.1:80"), member("10.0.0.2:80")]);
        assert_eq!(names(&snap), ["a", "b", "10.0.0.1:80", "10.0.0.2:80", "r2"]);
        // A reload composes every layer again, agreeing with the partial rebuilds.
        let whole = live.apply(live.configured());
        assert_eq!(names(&whole), names(&snap));
        whole.clusters["c"].with(|b| {
            let admin = |n: &str| b.states()[b.member_index(n).unwrap()].admin;
            assert_eq!(admin("10.0.0.1:80"), AdminState::Draining, "the survivor's drain");
            assert_eq!(admin("10.0.0.2:80"), AdminState::Active);
        });

        // No members from DNS any more: the configured and registered ones stay.
        let (snap, _) = live.registrations.update_dns("c", Vec::new());
        assert_eq!(names(&snap), ["a", "b", "r2"]);
    }

    /// A runtime replaced by a registration is not freed by whichever thread drops the last
    /// old snapshot (a request's): `update_registered` keeps it for `RETIRED_GRACE`, and the
    /// updating thread frees it once that has passed.
    #[test]
    fn a_replaced_runtime_is_freed_by_the_updating_thread_after_the_grace() {
        let live = live();
        let before = live.load();
        let old = Arc::downgrade(&before.clusters["c"]);
        live.registrations.update_registered(vec![("c".into(), regd(vec![member("r1")]))]);
        // A request that held the old snapshot lets go of it: the runtime outlives it.
        drop(before);
        assert!(old.upgrade().is_some(), "freed by the thread that dropped the old snapshot");
        live.registrations.reap_retired();
        assert!(old.upgrade().is_some(), "freed before the grace");
        std::thread::sleep(RETIRED_GRACE + Duration::from_millis(20));
        live.registrations.reap_retired();
        assert!(old.upgrade().is_none(), "kept after the grace");
    }
}
