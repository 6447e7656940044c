//! The live state: the current [`Snapshot`] (a view and one [`ClusterRt`] per cluster) behind an
//! atomic pointer swap. A request loads the snapshot once and keeps it to the end (WCF's
//! "messages in flight finish on the configuration they started with"); a new view is built
//! beside it, carrying every surviving member's state over, and swapped in whole.
//!
//! By concept: `cluster` holds a cluster's runtime (placing tries, ending requests, the
//! shadow, state changes a naming answer shows); `layers` composes the view in effect from
//! the configuration and the tier's shared configuration and swaps it in; `registered` adds
//! the members registered with the naming service, rebuilding only their clusters and freeing
//! what they replaced after [`RETIRED_GRACE`].

mod cluster;
mod handoff;
mod layers;
mod registered;
mod relay;
mod shared;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use rondo_core::{Balancer, View};

use crate::clock;
use crate::metrics::Metrics;

pub use cluster::{ClusterRt, Counters, Placed, Refused, StateSignal};
use layers::Layers;
pub use layers::{MEMBERS_PER_YIELD, Registered, RegisteredCluster, yield_now_and_then};
pub use registered::RETIRED_GRACE;
use registered::Retired;
pub use shared::External;

/// A member listed by several clusters: its state shared beyond a cluster.
pub type SharedMember = shared::SharedMember<ClusterRt>;
/// The process's shared members by name.
pub type SharedMembers = shared::SharedMembers<ClusterRt>;

/// Cluster state by name. Looked up for every request (twice on the router's own HTTP/1 path)
/// with names from the configuration and from authenticated registrations, never from client
/// traffic: hashed with foldhash (randomly seeded per map), not SipHash, whose resistance to
/// keys an attacker chooses costs more than the rest of a lookup.
pub type Clusters = HashMap<String, Arc<ClusterRt>, foldhash::fast::RandomState>;

/// One view and the run-time state of each of its clusters.
#[derive(Debug)]
pub struct Snapshot {
    /// The view.
    pub view: Arc<View>,
    /// Cluster state by name.
    pub clusters: Clusters,
    /// The names of registered (not configured) members, by cluster (shared between
    /// snapshots: a registration replaces one cluster's set, not a copy of every set).
    pub registered: BTreeMap<String, Arc<BTreeSet<String>>>,
    /// The clusters that are in the view because registrations declared them (not in the
    /// configuration): their policy is the one their members declared.
    pub declared: Arc<BTreeSet<String>>,
}

impl Snapshot {
    /// Whether `cluster` is in the view as a declared cluster (created by its registrations,
    /// with their policy) rather than a configured one.
    pub fn is_declared(&self, cluster: &str) -> bool {
        self.declared.contains(cluster)
    }

    /// Whether `member` of `cluster` came from the registry rather than the configuration.
    pub fn is_registered(&self, cluster: &str, member: &str) -> bool {
        self.registered.get(cluster).is_some_and(|m| m.contains(member))
    }

    /// Whether `member` is one of `cluster`'s configured members (not a registered one). The
    /// configured members come first in the cluster's member list and the registered ones after
    /// them, so only the configured ones are looked at, however many are registered (a
    /// registration's check on the naming API's request path).
    pub fn is_configured(&self, cluster: &str, member: &str) -> bool {
        let Some(spec) = self.view.clusters.get(cluster) else { return false };
        let registered = self.registered.get(cluster).map_or(0, |m| m.len());
        let configured = spec.members.len().saturating_sub(registered);
        spec.members[..configured].iter().any(|m| m.name == member)
    }
}

/// The view in effect and its cluster runtimes: a handle (one `Arc`), cloned into every
/// consumer that reads the view (a request loads the snapshot through it once) or changes its
/// configuration layers.
///
/// The view in effect is composed from layers: the configuration (the config file and admin
/// API changes), replaced by the tier's shared configuration when one is set (etcd), plus the
/// members discovered through DNS (`members_dns`) and the members registered with the naming
/// service, appended to their clusters in that order. Changing any layer swaps in a new
/// snapshot with a higher view id. The registered and DNS layers change through
/// [`Registrations`], a handle on the same state.
#[derive(Debug, Clone)]
pub struct Views(Arc<ViewState>);

/// The registered members' and the DNS members' layers of the view in effect ([`Views`]), as
/// the naming service and the DNS discovery change them: a handle (one `Arc`) on the same
/// state.
#[derive(Debug, Clone)]
pub struct Registrations(Arc<ViewState>);

/// A [`Views`] that does not keep the view alive: a background task's, which stops once the
/// process's view is gone.
#[derive(Debug, Clone)]
pub struct WeakViews(std::sync::Weak<ViewState>);

impl WeakViews {
    /// The view, while a [`Views`] holds it.
    pub fn upgrade(&self) -> Option<Views> {
        self.0.upgrade().map(Views)
    }
}

/// What [`Views`] and [`Registrations`] share.
#[derive(Debug)]
struct ViewState {
    current: ArcSwap<Snapshot>,
    /// The layers, and the lock that serialises replacements (readers never wait).
    layers: Mutex<Layers>,
    /// The current view id, for watchers.
    view_id: tokio::sync::watch::Sender<u64>,
    /// The process's metrics (the cluster runtimes count there; a swap updates the member
    /// series).
    metrics: Arc<Metrics>,
    /// Member state changes waiting to become a new view id.
    signal: Arc<StateSignal>,
    /// What [`Registrations::update_registered`] replaced, kept for [`RETIRED_GRACE`] and then
    /// dropped by the thread that updates the view ([`Registrations::reap_retired`]): a cluster
    /// of 10,000 registered members takes milliseconds to free, and the request thread that
    /// happened to hold the last old snapshot would otherwise free it and stall the requests it
    /// carries.
    retired: Mutex<Vec<Retired>>,
    /// The members listed by several clusters, and their state shared between them.
    shared_members: SharedMembers,
}

/// The process's live state, as the handles its parts receive: each consumer is given the
/// handles it uses (each cheap to clone), not `Live`. `Live` itself is for the process's
/// start and its upgrade hand-off (`handoff.rs`), which cross every part.
#[derive(Debug)]
pub struct Live {
    /// The view in effect and its cluster runtimes.
    pub views: Views,
    /// The registered and DNS members' layers of the view.
    pub registrations: Registrations,
    /// This router's locality group.
    pub group: Option<String>,
    /// The process's Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The key every router of the tier shares.
    pub tier_keys: crate::tier_key::TierKeys,
    /// Revoked sign-on tokens (by id or subject), this router's and the tier's.
    pub revocations: Arc<crate::revoke::Revocations>,
    /// Every socket the process listens on (bound here or handed over by the process this one
    /// replaced).
    pub sockets: Arc<crate::sockets::Sockets>,
    /// The process's drain (`SIGTERM`, or an upgrade's hand-off).
    pub drain: Arc<crate::sockets::drain::Drain>,
    /// How the admin API starts a hitless upgrade.
    pub upgrader: Arc<crate::sockets::handoff::Upgrader>,
    /// The defaults set through the admin API, and what they apply to.
    pub defaults: Arc<crate::defaults::Defaults>,
}

impl Live {
    /// Live state starting at `view`.
    pub fn new(view: View, group: Option<String>) -> Self {
        let metrics = Arc::new(Metrics::new());
        let _ = metrics.group.set(group.clone());
        let views = Views::new(view, metrics.clone());
        Live {
            registrations: Registrations(views.0.clone()),
            views,
            group,
            metrics,
            tier_keys: Default::default(),
            revocations: Default::default(),
            sockets: Default::default(),
            drain: Default::default(),
            upgrader: Default::default(),
            defaults: Default::default(),
        }
    }
}

/// Transitional: `Live`'s former methods, for the consumers not yet moved to the handles
/// (issue 39); each is the handle's.
impl Live {
    /// [`Views::load`].
    pub fn load(&self) -> Arc<Snapshot> {
        self.views.load()
    }

    /// [`Views::apply`].
    pub fn apply(&self, view: View) -> Arc<Snapshot> {
        self.views.apply(view)
    }

    /// [`Views::configured`].
    pub fn configured(&self) -> View {
        self.views.configured()
    }

    /// [`Views::set_shared_members`].
    pub fn set_shared_members(
        &self,
        listed: BTreeMap<String, Vec<String>>,
    ) -> Option<Arc<Snapshot>> {
        self.views.set_shared_members(listed)
    }

    /// [`Views::set_shared`].
    pub fn set_shared(&self, view: Option<View>) -> Arc<Snapshot> {
        self.views.set_shared(view)
    }

    /// [`crate::TierKeys::set_file`].
    pub fn set_tier_key(&self, key: crate::secret::TierKey) {
        self.tier_keys.set_file(key)
    }

    /// [`crate::TierKeys::get`].
    pub fn tier_key(&self) -> Option<Arc<crate::secret::TierKey>> {
        self.tier_keys.get()
    }
}

impl Views {
    /// The view `view` with a fresh runtime per cluster, counting into `metrics`.
    fn new(view: View, metrics: Arc<Metrics>) -> Self {
        let now = clock::now();
        let signal = Arc::new(StateSignal::default());
        let clusters = view
            .clusters
            .iter()
            .map(|(name, spec)| {
                let balancer = Balancer::new(spec.clone(), now);
                let rt = ClusterRt::new(balancer, metrics.clone(), signal.clone());
                (name.clone(), Arc::new(rt))
            })
            .collect();
        let (view_id, _) = tokio::sync::watch::channel(view.id);
        let snapshot = Snapshot {
            view: Arc::new(view.clone()),
            clusters,
            registered: BTreeMap::new(),
            declared: Arc::default(),
        };
        Views(Arc::new(ViewState {
            current: ArcSwap::from_pointee(snapshot),
            layers: Mutex::new(Layers {
                file: view,
                shared: None,
                dns: BTreeMap::new(),
                registered: BTreeMap::new(),
                allow_declared: false,
            }),
            view_id,
            metrics,
            signal,
            retired: Mutex::default(),
            shared_members: SharedMembers::default(),
        }))
    }

    /// A new view id for the same view and the same cluster runtimes (a new `View` value equal
    /// but for its id): member state changed in a way a naming answer shows.
    pub fn touch(&self) -> Arc<Snapshot> {
        self.0.touch()
    }

    /// Turns member state changes ([`ClusterRt::state_changed`]) into new view ids
    /// ([`Views::touch`]), at most one per 20 ms; stops when the last handle on the view is
    /// dropped. Started by the naming service, whose watchers need them.
    pub fn spawn_touch(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.0);
        let signal = self.0.signal.clone();
        tokio::spawn(async move {
            loop {
                signal.notify.notified().await;
                // Coalesce a burst (a probe round taking several members out).
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let Some(state) = weak.upgrade() else { return };
                if signal.pending.swap(false, Ordering::AcqRel) {
                    state.touch();
                }
            }
        })
    }

    /// The current snapshot; hold it for the whole request.
    #[inline]
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.current.load_full()
    }

    /// A receiver of the current view id, updated at every swap (for the naming service's
    /// watch).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.view_id.subscribe()
    }

    /// Runs `f` on the current snapshot while no view can be swapped in (the lock that
    /// serialises replacements is held): a check of the view id and the change it guards happen
    /// as one. `f` must not call back into this view's replacing methods.
    pub fn with_current<R>(&self, f: impl FnOnce(&Arc<Snapshot>) -> R) -> R {
        let _serial = self.0.layers();
        f(&self.0.current.load_full())
    }

    /// The members listed by several clusters, and their state shared between them.
    pub fn shared_members(&self) -> &SharedMembers {
        &self.0.shared_members
    }

    /// A handle that does not keep the view alive.
    pub fn downgrade(&self) -> WeakViews {
        WeakViews(Arc::downgrade(&self.0))
    }
}

impl ViewState {
    fn layers(&self) -> MutexGuard<'_, Layers> {
        self.layers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) -> Arc<Snapshot> {
        let _serial = self.layers();
        let old = self.current.load_full();
        let view = View { id: old.view.id + 1, ..(*old.view).clone() };
        let id = view.id;
        let snapshot = Arc::new(Snapshot {
            view: Arc::new(view),
            clusters: old.clusters.clone(),
            registered: old.registered.clone(),
            declared: old.declared.clone(),
        });
        self.current.store(snapshot.clone());
        self.view_id.send_replace(id);
        snapshot
    }
}

impl crate::metrics::Scraped for Snapshot {
    fn view(&self) -> &rondo_core::View {
        &self.view
    }

    fn with_balancer(
        &self,
        name: &str,
        f: &mut dyn FnMut(&[rondo_core::MemberSpec], &mut rondo_core::Balancer),
    ) {
        if let Some(rt) = self.clusters.get(name) {
            rt.with(|b| f(&rt.spec.members, b));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use rondo_core::{ClusterSpec, MemberSpec, OutlierDetection, Policy, UpstreamProtocol};

    use super::*;

    /// A router's state: cluster `c` of members `a` and `b`, quick to eject.
    pub(crate) fn live() -> Live {
        let policy = Policy {
            outlier: OutlierDetection {
                consecutive_failures: 2,
                base_ejection: Duration::from_millis(5),
                max_ejection: Duration::from_millis(5),
                ..OutlierDetection::default()
            },
            ..Policy::default()
        };
        let spec = ClusterSpec {
            name: "c".into(),
            members: vec![member("a"), member("b")],
            policy,
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: Default::default(),
            upstream_tls: None,
        };
        let view = View {
            id: 1,
            routes: vec![],
            clusters: [("c".to_owned(), Arc::new(spec))].into_iter().collect(),
        };
        Live::new(view, None)
    }

    #[test]
    fn apply_if_swaps_only_while_the_expected_view_is_in_effect() {
        let live = live();
        let base = (*live.load().view).clone();
        assert_eq!(
            live.views.apply_if(View { id: 2, ..base.clone() }, 7).map(|s| s.view.id),
            Err(1)
        );
        assert_eq!(live.load().view.id, 1, "nothing swapped");
        assert_eq!(
            live.views.apply_if(View { id: 2, ..base.clone() }, 1).map(|s| s.view.id),
            Ok(2)
        );
        // A touch (member state a naming answer shows) is a new id too.
        live.views.touch();
        assert_eq!(live.views.apply_if(View { id: 4, ..base }, 2).map(|s| s.view.id), Err(3));
        assert_eq!(live.views.with_current(|s| s.view.id), 3);
    }

    /// Member `name` at an address nobody dials.
    pub(crate) fn member(name: &str) -> MemberSpec {
        MemberSpec {
            name: name.into(),
            address: "127.0.0.1:1".into(),
            weight: 100,
            group: None,
            admin: Default::default(),
        }
    }

    pub(super) fn names(snap: &Snapshot) -> Vec<String> {
        snap.view.clusters["c"].members.iter().map(|m| m.name.clone()).collect()
    }
}
