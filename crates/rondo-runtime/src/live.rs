//! The live state: the current [`Snapshot`] (a view and one [`ClusterRt`] per cluster) behind an
//! atomic pointer swap. A request loads the snapshot once and keeps it to the end (WCF's
//! "messages in flight finish on the configuration they started with"); a new view is built
//! beside it, carrying every surviving member's state over, and swapped in whole.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arc_swap::ArcSwap;
use rondo_core::{
    AdminState, Algorithm, Balancer, ClusterSpec, Decision, Ejection, Entropy, Failover,
    MemberSpec, Outcome, PickError, PickRequest, SplitMix64, Stop, View, Why,
};

use crate::clock;
use crate::metrics::{ClusterLabels, Metrics};

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

/// Where [`ClusterRt::place`] put a try.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Placed {
    /// On the sticky session's member.
    Kept(usize),
    /// On the member the cluster's picker chose, with the algorithm and the deciding numbers.
    Picked(usize, Algorithm, Why),
}

impl Placed {
    /// The member's index.
    pub fn member(self) -> usize {
        match self {
            Placed::Kept(m) | Placed::Picked(m, ..) => m,
        }
    }
}

/// Why [`ClusterRt::place`] placed no try.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// The failover engine stopped the request (the retry budget is spent).
    Stop(Stop),
    /// The cluster has no eligible member left for it.
    NoEligible(PickError),
}

/// A cluster's balancer and random generator, behind one lock (held for nanoseconds: a pick or
/// a counter update, never across I/O).
#[derive(Debug)]
pub struct ClusterRt {
    /// The cluster as configured in this view.
    pub spec: Arc<ClusterSpec>,
    /// What a data plane derives from this view of the cluster once and keeps beside it (the
    /// router: its members' URI authorities). Opaque here: the runtime knows nothing of HTTP.
    pub data_plane: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    inner: Mutex<Inner>,
    /// The runtime that replaced this one in a newer view; requests that started on this one
    /// report their end there, so counts stay right across swaps.
    successor: OnceLock<Arc<ClusterRt>>,
    /// Event counters (for status and metrics).
    pub counters: Counters,
    /// The process's metrics (ejections are counted there too).
    metrics: Arc<Metrics>,
    /// Raised when a member's state changes in a way the naming answer shows.
    signal: Arc<StateSignal>,
    /// TLS to the members (`upstream_tls`), its files read when this view was made; `Err`:
    /// they could not be (every try then fails, saying so).
    pub tls: Option<Result<Arc<crate::upstream_tls::UpstreamTlsRt>, String>>,
}

/// Member state changes that a naming answer shows (an operator's drain, a health check or an
/// agent taking a member out or back), raised by whoever made the change once its lock is
/// released; [`Live::spawn_touch`] turns them into a new view id, so that naming watchers see
/// them.
#[derive(Debug, Default)]
pub struct StateSignal {
    pending: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl StateSignal {
    fn raise(&self) {
        self.pending.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// A cluster's event counters since its runtime was created.
#[derive(Debug, Default)]
pub struct Counters {
    /// Passive ejections.
    pub ejections: AtomicU64,
    /// Members back from an ejection (first success after it ended).
    pub returns: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    balancer: Balancer,
    rng: SplitMix64,
    /// The shadow algorithm's own generator ([`ClusterRt::set_shadow`]): drawing from `rng`
    /// would change the live picks.
    shadow_rng: SplitMix64,
    /// The latest picks (when, decision), newest last, for the admin API's explain.
    recent: VecDeque<(rondo_core::Instant, Decision)>,
}

impl Inner {
    /// Picks, asks the shadow (if any) what it would have picked for the same request, counts
    /// the request as begun, and keeps the decision for explain, stamped with the pick's own
    /// time (no clock reading here); the caller holds the lock, so the shadow's pick is in the
    /// same lock hold as the live one.
    fn pick_and_begin(&mut self, req: &PickRequest<'_>) -> Result<&Decision, PickError> {
        let d = self.balancer.pick(req, &mut self.rng);
        let live = d.as_ref().ok().map(|d| d.member);
        self.balancer.shadow_pick(req, live, &mut self.shadow_rng);
        let d = d?;
        self.balancer.begin_request(d.member);
        if self.recent.len() == RECENT_DECISIONS {
            self.recent.pop_front();
        }
        self.recent.push_back((req.now, d));
        Ok(&self.recent.back().expect("just pushed").1)
    }
}

impl ClusterRt {
    fn new(balancer: Balancer, metrics: Arc<Metrics>, signal: Arc<StateSignal>) -> Self {
        let seed = clock::now().0 ^ rondo_core::hash::hash_key(balancer.spec().name.as_bytes());
        let spec = balancer.spec();
        let tls = spec.upstream_tls.as_ref().map(|t| {
            let alpn: &[&[u8]] = match spec.upstream_protocol {
                rondo_core::UpstreamProtocol::Http1 => &[b"http/1.1"],
                rondo_core::UpstreamProtocol::Http2 => &[b"h2"],
                rondo_core::UpstreamProtocol::Tcp => &[],
            };
            crate::upstream_tls::UpstreamTlsRt::load(t, alpn).map(Arc::new).inspect_err(|e| {
                tracing::warn!(cluster = %spec.name, "upstream_tls cannot be loaded: {e}");
            })
        });
        ClusterRt {
            spec: balancer.spec().clone(),
            data_plane: OnceLock::new(),
            inner: Mutex::new(Inner {
                balancer,
                rng: SplitMix64::new(seed),
                shadow_rng: SplitMix64::new(seed ^ SHADOW_SEED),
                recent: VecDeque::with_capacity(RECENT_DECISIONS),
            }),
            successor: OnceLock::new(),
            counters: Counters::default(),
            metrics,
            signal,
            tls,
        }
    }

    /// Says that a member's admin state, health or availability changed (call it after the
    /// change, with no lock held): the view id moves on so that naming watchers refetch.
    pub fn state_changed(&self) {
        self.signal.raise();
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the balancer half-updated in a way that
        // matters more than stopping the router would, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a newer view replaced this cluster runtime.
    pub fn is_retired(&self) -> bool {
        self.successor.get().is_some()
    }

    /// Runs `f` with the balancer locked.
    pub fn with<R>(&self, f: impl FnOnce(&mut Balancer) -> R) -> R {
        f(&mut self.lock().balancer)
    }

    /// Picks a member and counts a request as begun on it, in one lock (a single try with no
    /// failover; requests go through [`ClusterRt::place`]).
    pub fn pick_and_begin(&self, req: &PickRequest<'_>) -> Result<Decision, PickError> {
        self.lock().pick_and_begin(req).cloned()
    }

    /// Places a request's next try in one lock hold: the failover engine admits it (the
    /// request's deposit into the retry budget, or a retry's withdrawal), then `keep` (a sticky
    /// session's member) stays when it may and was not tried, else the cluster's picker chooses
    /// among the members not yet tried; the request is counted as begun on the member and the
    /// try recorded with `failover`. A pick is kept for the admin API's explain.
    pub fn place(
        &self,
        failover: &mut Failover,
        now: rondo_core::Instant,
        group: Option<&str>,
        hash: Option<u64>,
        keep: Option<usize>,
    ) -> Result<Placed, Refused> {
        let mut g = self.lock();
        failover.admit(&mut g.balancer, now).map_err(Refused::Stop)?;
        if let Some(m) = keep
            && !failover.tried().contains(&m)
            && g.balancer.can_keep_session(m, now)
        {
            g.balancer.begin_request(m);
            failover.began(m);
            return Ok(Placed::Kept(m));
        }
        let req = PickRequest { now, group, hash, context: None, exclude: failover.tried() };
        let d = g.pick_and_begin(&req).map_err(Refused::NoEligible)?;
        let placed = Placed::Picked(d.member, d.algorithm, d.why);
        failover.began(d.member);
        Ok(placed)
    }

    /// The latest `n` picks made by [`ClusterRt::place`] and [`ClusterRt::pick_and_begin`] (unix milliseconds and the
    /// decision), oldest first; at most the last 256 are kept.
    pub fn recent_decisions(&self, n: usize) -> Vec<(u64, Decision)> {
        // Read before the lock (picks wait for it): a pick made meanwhile shows as "now".
        let now = clock::now();
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_millis() as u64);
        let g = self.lock();
        let recent = &g.recent;
        recent
            .iter()
            .skip(recent.len().saturating_sub(n))
            .map(|(at, d)| {
                let ago = now.since(*at).as_millis() as u64;
                (unix_now.saturating_sub(ago), d.clone())
            })
            .collect()
    }

    /// Starts shadow evaluation of `algorithm` beside the cluster's live algorithm (a fresh
    /// report; replacing a running shadow), or with `None` stops it; returns the shadow that was
    /// running. From then on every pick [`ClusterRt::place`] makes also asks the shadow, in the
    /// same lock hold, what it would have picked ([`Balancer::shadow_pick`]); no traffic moves.
    /// The shadow is run-time state like a member's drain: it is carried over to the cluster's
    /// next view and ends with the cluster. Call it on the snapshot in effect while no view can
    /// be swapped in ([`Live::with_current`]), or a swap in between keeps the old state.
    pub fn set_shadow(&self, algorithm: Option<Algorithm>) -> Option<Algorithm> {
        let now = clock::now();
        self.with(|b| {
            let was = b.shadow();
            b.set_shadow(algorithm, now);
            was
        })
    }

    /// The shadow algorithm being evaluated, if any.
    pub fn shadow(&self) -> Option<Algorithm> {
        self.with(|b| b.shadow())
    }

    /// The shadow's report now, and when it started in unix milliseconds; `None` without a
    /// shadow.
    pub fn shadow_report(&self) -> Option<(rondo_core::ShadowReport, u64)> {
        self.shadow_report_and(false)
    }

    /// Stops the shadow and returns its last report (as [`ClusterRt::shadow_report`]), both
    /// in one lock hold, so no pick falls between them; `None`: there was none.
    pub fn stop_shadow(&self) -> Option<(rondo_core::ShadowReport, u64)> {
        self.shadow_report_and(true)
    }

    fn shadow_report_and(&self, stop: bool) -> Option<(rondo_core::ShadowReport, u64)> {
        let now = clock::now();
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_millis() as u64);
        let report = self.with(|b| {
            let r = b.shadow_report(now);
            if stop {
                b.set_shadow(None, now);
            }
            r
        })?;
        let since = unix_now.saturating_sub(now.since(report.since).as_millis() as u64);
        Some((report, since))
    }

    /// The process's metrics (a data plane counts its responses there).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Picks a member without counting anything (sessions count themselves).
    pub fn pick(&self, req: &PickRequest<'_>) -> Result<Decision, PickError> {
        let mut g = self.lock();
        let Inner { balancer, rng, .. } = &mut *g;
        balancer.pick(req, rng)
    }

    /// Restarts this cluster's generator from `seed`, so that a recorded sequence of picks can
    /// be replayed exactly (the golden vectors); the router seeds from the clock.
    pub fn reseed(&self, seed: u64) {
        self.lock().rng = SplitMix64::new(seed);
    }

    /// A random draw from this cluster's generator.
    pub fn random(&self) -> u64 {
        self.lock().rng.next_u64()
    }

    /// The newest runtime for this cluster and `member`'s index there (by name), following
    /// view swaps; `None` when the member is gone.
    fn resolve(self: &Arc<Self>, member: usize) -> Option<(Arc<ClusterRt>, usize)> {
        let mut rt = self.clone();
        let mut idx = member;
        while let Some(next) = rt.successor.get() {
            let name = &rt.spec.members.get(idx)?.name;
            idx = next.spec.members.iter().position(|m| &m.name == name)?;
            rt = next.clone();
        }
        Some((rt, idx))
    }

    /// Runs `f` on the newest runtime's balancer for `member` (by name), under that runtime's
    /// lock, so that a swap cannot slip in between finding the runtime and updating it: the
    /// successor is linked under the old runtime's lock, and a runtime found retired once locked
    /// is left for its successor.
    fn on_newest<R>(
        self: &Arc<Self>,
        member: usize,
        f: impl Fn(&mut Balancer, usize) -> R,
    ) -> Option<(Arc<ClusterRt>, usize, R)> {
        loop {
            let (rt, idx) = self.resolve(member)?;
            let done = rt.with(|b| (!rt.is_retired()).then(|| f(b, idx)));
            if let Some(r) = done {
                return Some((rt, idx, r));
            }
        }
    }

    /// Sets `member`'s admin state (the operator's word), and notes a drain that is complete
    /// already (nothing in flight, no session).
    pub fn set_admin(&self, member: usize, to: AdminState, by: rondo_core::Actor) {
        let drained = self.with(|b| {
            b.set_admin(member, to, by);
            is_drained(b, member)
        });
        if drained {
            self.drained(member);
        }
    }

    /// Logs and counts the moment a draining member has nothing left (`rondo ctl drain
    /// --wait` watches for the same state).
    fn drained(&self, member: usize) {
        self.metrics
            .drains_completed
            .get_or_create(&ClusterLabels { cluster: self.spec.name.clone() })
            .inc();
        tracing::info!(
            cluster = %self.spec.name,
            member = %self.spec.members[member].name,
            "member drained: no request in flight and no session"
        );
    }

    /// A request begun with [`ClusterRt::pick_and_begin`] ended.
    pub fn end_request(self: &Arc<Self>, member: usize, outcome: Outcome) -> Option<Ejection> {
        let now = clock::now();
        let (rt, idx, (ejection, returned, drained)) = self.on_newest(member, |b, idx| {
            let was_out = b.states()[idx].ejected_until.is_some_and(|u| now >= u);
            let ejection = b.end_request(idx, now, outcome);
            (ejection, was_out && b.states()[idx].ejected_until.is_none(), is_drained(b, idx))
        })?;
        if drained {
            rt.drained(idx);
        }
        if returned {
            rt.counters.returns.fetch_add(1, Ordering::Relaxed);
            rt.metrics
                .returns
                .get_or_create(&ClusterLabels { cluster: rt.spec.name.clone() })
                .inc();
            tracing::info!(
                cluster = %rt.spec.name,
                member = %rt.spec.members[idx].name,
                "member back from ejection: first success after its ejection time"
            );
        }
        if let Some(e) = ejection {
            rt.counters.ejections.fetch_add(1, Ordering::Relaxed);
            rt.metrics
                .ejections
                .get_or_create(&ClusterLabels { cluster: rt.spec.name.clone() })
                .inc();
            let reason = match outcome {
                Outcome::Failure { kind, .. } => format!(
                    "{} consecutive failure(s), the last {}",
                    rt.spec.policy.outlier.consecutive_failures,
                    failure_text(kind)
                ),
                _ => "consecutive failures".to_owned(),
            };
            tracing::warn!(
                cluster = %rt.spec.name,
                member = %rt.spec.members[idx].name,
                count = e.count,
                for_ms = e.until.since(now).as_millis() as u64,
                reason = reason.as_str(),
                "member ejected by outlier detection"
            );
        }
        ejection
    }

    /// A session was pinned to `member`.
    pub fn open_session(self: &Arc<Self>, member: usize) {
        self.on_newest(member, |b, idx| b.open_session(idx));
    }

    /// A session on `member` ended.
    pub fn close_session(self: &Arc<Self>, member: usize) {
        let ended = self.on_newest(member, |b, idx| {
            b.close_session(idx);
            is_drained(b, idx)
        });
        if let Some((rt, idx, true)) = ended {
            rt.drained(idx);
        }
    }
}

/// Whether `member` is draining with no request in flight and no session left.
fn is_drained(b: &Balancer, member: usize) -> bool {
    let s = &b.states()[member];
    s.admin == AdminState::Draining && s.load.in_flight == 0 && s.load.sessions == 0
}

/// A failure as the ejection log line names it.
fn failure_text(kind: rondo_core::FailureKind) -> &'static str {
    use rondo_core::FailureKind as K;
    match kind {
        K::Connect => "a refused or failed connection",
        K::Reset => "a connection reset before a response",
        K::Timeout => "a timeout",
        K::Status5xx => "a 5xx response",
    }
}

/// Picks kept per cluster runtime for [`ClusterRt::recent_decisions`].
const RECENT_DECISIONS: usize = 256;

/// Mixed into a cluster runtime's seed for its shadow's generator ("SHADOW").
const SHADOW_SEED: u64 = 0x5348_4144_4f57;

/// The current snapshot and how to replace it.
///
/// The view in effect is composed from layers: the configuration (the config file and admin
/// API changes), replaced by the tier's shared configuration when one is set (etcd), plus the
/// members registered with the naming service, appended to their clusters. Changing any layer
/// swaps in a new snapshot with a higher view id.
#[derive(Debug)]
pub struct Live {
    current: ArcSwap<Snapshot>,
    /// The layers, and the lock that serialises replacements (readers never wait).
    layers: Mutex<Layers>,
    /// The current view id, for watchers.
    view_id: tokio::sync::watch::Sender<u64>,
    /// This router's locality group.
    pub group: Option<String>,
    /// The process's Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Member state changes waiting to become a new view id.
    signal: Arc<StateSignal>,
    /// The key every router of the tier shares: the tier's shared configuration's
    /// `[router] tier_key` while it has one, else the file's (set at start).
    tier_key: arc_swap::ArcSwapOption<crate::secret::TierKey>,
    /// The two layers of [`Live::tier_key`]: the file's and the shared configuration's.
    tier_keys: Mutex<TierKeys>,
    /// Revoked sign-on tokens (by id or subject), this router's and the tier's.
    pub revocations: crate::revoke::Revocations,
    /// Every socket the process listens on (bound here or handed over by the process this one
    /// replaced).
    pub sockets: crate::sockets::Sockets,
    /// The process's drain (`SIGTERM`, or an upgrade's hand-off).
    pub drain: crate::drain::Drain,
    /// How the admin API starts a hitless upgrade.
    pub upgrader: crate::handoff::Upgrader,
    /// What [`Live::update_registered`] replaced, kept for [`RETIRED_GRACE`] and then dropped by
    /// the thread that updates the view ([`Live::reap_retired`]): a cluster of 10,000
    /// registered members takes milliseconds to free, and the request thread that happened to
    /// hold the last old snapshot would otherwise free it and stall the requests it carries.
    retired: Mutex<Vec<Retired>>,
}

/// A cluster runtime (with its spec) and the names of its registered members, replaced in a
/// view, and when.
#[derive(Debug)]
struct Retired {
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

/// How long [`Live::update_registered`] keeps what it replaced before the updating thread drops
/// it: longer than a request holds a snapshot, short enough to hold few.
pub const RETIRED_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

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

/// The layers of the tier key: the configuration file's, and the tier's shared
/// configuration's, which is in force while set.
#[derive(Debug, Default)]
struct TierKeys {
    file: Option<Arc<crate::secret::TierKey>>,
    shared: Option<Arc<crate::secret::TierKey>>,
}

impl TierKeys {
    fn in_force(&self) -> Option<Arc<crate::secret::TierKey>> {
        self.shared.clone().or_else(|| self.file.clone())
    }
}

/// Members registered with the naming service, by cluster.
pub type Registered = BTreeMap<String, RegisteredCluster>;

#[derive(Debug)]
struct Layers {
    /// The config file's view, with admin API changes.
    file: View,
    /// The tier's shared configuration (etcd), which replaces `file` while set.
    shared: Option<View>,
    /// Registered members by cluster.
    registered: Registered,
    /// Whether registrations may declare clusters the configuration lacks (`[naming]
    /// allow_registered_clusters`); off, their members wait for a configured cluster, whatever
    /// a snapshot or another router of the tier recorded.
    allow_declared: bool,
}

impl Layers {
    fn configured(&self) -> &View {
        self.shared.as_ref().unwrap_or(&self.file)
    }

    /// The view in effect: the configuration with registered members appended to their
    /// clusters (a registered name that a configured member already has is left out).
    /// Clusters the configuration lacks come in as their registrations declared them.
    fn compose(&self) -> (View, BTreeMap<String, Arc<BTreeSet<String>>>, BTreeSet<String>) {
        let mut view = self.configured().clone();
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
    fn base_of(&self, cluster: &str) -> Option<(Arc<ClusterSpec>, bool)> {
        match self.configured().clusters.get(cluster) {
            Some(spec) => Some((spec.clone(), false)),
            None if self.allow_declared => {
                self.registered.get(cluster)?.declared.clone().map(|d| (d, true))
            }
            None => None,
        }
    }
}

/// `spec` with the registered `members` appended (a name it already has is left out), and the
/// names added; `None` when none is. Linear in the cluster, whatever the other clusters hold.
fn with_registered(
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

impl Live {
    /// Live state starting at `view`.
    pub fn new(view: View, group: Option<String>) -> Self {
        let now = clock::now();
        let metrics = Arc::new(Metrics::new());
        let _ = metrics.group.set(group.clone());
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
        Live {
            current: ArcSwap::from_pointee(snapshot),
            layers: Mutex::new(Layers {
                file: view,
                shared: None,
                registered: BTreeMap::new(),
                allow_declared: false,
            }),
            view_id,
            group,
            metrics,
            signal,
            tier_key: arc_swap::ArcSwapOption::empty(),
            tier_keys: Mutex::default(),
            revocations: Default::default(),
            sockets: Default::default(),
            drain: Default::default(),
            upgrader: Default::default(),
            retired: Mutex::default(),
        }
    }

    /// Sets the configuration file's tier key (at start).
    pub fn set_tier_key(&self, key: crate::secret::TierKey) {
        let mut keys = self.tier_keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.file = Some(Arc::new(key));
        self.tier_key.store(keys.in_force());
    }

    /// Sets (or, with `None`, clears) the tier's shared configuration's key, which is in force
    /// instead of the file's while set.
    pub fn set_shared_tier_key(&self, key: Option<crate::secret::TierKey>) {
        let mut keys = self.tier_keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.shared = key.map(Arc::new);
        self.tier_key.store(keys.in_force());
    }

    /// The tier's key in force, when the configuration (the file's, or the tier's shared one)
    /// gives one.
    pub fn tier_key(&self) -> Option<Arc<crate::secret::TierKey>> {
        self.tier_key.load_full()
    }

    /// A new view id for the same view and the same cluster runtimes (a new `View` value equal
    /// but for its id): member state changed in a way a naming answer shows.
    pub fn touch(&self) -> Arc<Snapshot> {
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

    /// Turns member state changes ([`ClusterRt::state_changed`]) into new view ids
    /// ([`Live::touch`]), at most one per 20 ms; stops when `live` is dropped. Started by the
    /// naming service, whose watchers need them.
    pub fn spawn_touch(live: &Arc<Live>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(live);
        let signal = live.signal.clone();
        tokio::spawn(async move {
            loop {
                signal.notify.notified().await;
                // Coalesce a burst (a probe round taking several members out).
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let Some(live) = weak.upgrade() else { return };
                if signal.pending.swap(false, Ordering::AcqRel) {
                    live.touch();
                }
            }
        })
    }

    /// The current snapshot; hold it for the whole request.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// A receiver of the current view id, updated at every swap (for the naming service's
    /// watch).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.view_id.subscribe()
    }

    fn layers(&self) -> MutexGuard<'_, Layers> {
        self.layers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the config file's view (a reload, or a config applied through the admin API),
    /// keeping the state of every cluster and member that survives. The new view's id is raised
    /// above the current one if needed. Returns the new snapshot.
    pub fn apply(&self, view: View) -> Arc<Snapshot> {
        let mut layers = self.layers();
        let id = view.id;
        layers.file = view;
        self.swap(&layers, id)
    }

    /// Like [`Live::apply`], only when the current view's id is `expected` (checked and swapped
    /// under one lock); else the current id. For the admin API's `If-Match`.
    pub fn apply_if(&self, view: View, expected: u64) -> Result<Arc<Snapshot>, u64> {
        let mut layers = self.layers();
        let current = self.current.load().view.id;
        if current != expected {
            return Err(current);
        }
        let id = view.id;
        layers.file = view;
        Ok(self.swap(&layers, id))
    }

    /// Runs `f` on the current snapshot while no view can be swapped in (the lock that
    /// serialises replacements is held): a check of the view id and the change it guards happen
    /// as one. `f` must not call back into this `Live`'s replacing methods.
    pub fn with_current<R>(&self, f: impl FnOnce(&Arc<Snapshot>) -> R) -> R {
        let _serial = self.layers();
        f(&self.current.load_full())
    }

    /// The configuration in effect (the shared one when set, else the file's), without
    /// registered members: the base for a change such as a new weight.
    pub fn configured(&self) -> View {
        self.layers().configured().clone()
    }

    /// Changes the configuration in effect (the shared one when set, else the file's) with
    /// `change`, read, modified and swapped in under one lock, so that two concurrent changes
    /// (two admin calls, or one racing a registration) both land. An `Err` from `change` leaves
    /// everything as it was.
    pub fn update_configured<E>(
        &self,
        change: impl FnOnce(&mut View) -> Result<(), E>,
    ) -> Result<Arc<Snapshot>, E> {
        let mut layers = self.layers();
        let mut view = layers.configured().clone();
        change(&mut view)?;
        match &mut layers.shared {
            Some(shared) => *shared = view,
            None => layers.file = view,
        }
        Ok(self.swap(&layers, 0))
    }

    /// Whether the tier's shared configuration (etcd) is in effect, replacing the file's.
    pub fn has_shared(&self) -> bool {
        self.layers().shared.is_some()
    }

    /// Sets or clears the tier's shared configuration; `None` goes back to the file's.
    pub fn set_shared(&self, view: Option<View>) -> Arc<Snapshot> {
        let mut layers = self.layers();
        let id = view.as_ref().map_or(0, |v| v.id);
        layers.shared = view;
        self.swap(&layers, id)
    }

    /// Lets registrations declare clusters the configuration lacks (`[naming]
    /// allow_registered_clusters`; off by default). Call it before the registry starts: it
    /// takes effect at the next change of the registered members and swaps no view in (a swap
    /// would give every cluster a new runtime, away from the probes already started).
    pub fn allow_declared(&self, on: bool) {
        self.layers().allow_declared = on;
    }

    /// Replaces the registered members (the registry's whole state).
    pub fn set_registered(&self, registered: Registered) -> Arc<Snapshot> {
        let mut layers = self.layers();
        layers.registered = registered;
        self.swap(&layers, 0)
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
        let mut layers = self.layers();
        let mut changed = Vec::with_capacity(changes.len());
        for (cluster, reg) in changes {
            if reg.members.is_empty() {
                layers.registered.remove(&cluster);
            } else {
                layers.registered.insert(cluster.clone(), reg);
            }
            changed.push(cluster);
        }
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
        drop(old);
        self.retired.lock().unwrap_or_else(|e| e.into_inner()).append(&mut retired);
        self.reap_retired();
        (snapshot, built)
    }

    /// Drops what [`Live::update_registered`] replaced more than [`RETIRED_GRACE`] ago (called
    /// by it, and by the registry's writer between batches), on the calling thread.
    pub fn reap_retired(&self) {
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

    /// Composes the layers and swaps the result in, with an id above the current one.
    fn swap(&self, layers: &Layers, id: u64) -> Arc<Snapshot> {
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
        snapshot
    }

    /// The runtime of `spec` in a new view: `prev`'s state carried over when the cluster was
    /// in the previous view, else a fresh one.
    fn runtime_for(
        &self,
        spec: &Arc<ClusterSpec>,
        prev: Option<&Arc<ClusterRt>>,
        now: rondo_core::Instant,
    ) -> Arc<ClusterRt> {
        match prev {
            // Copy the state and link the successor under the old runtime's lock, so no
            // request can end on the old runtime after its counts were copied.
            Some(prev) => prev.with(|b| {
                let balancer =
                    Balancer::carry_over_pausing(spec.clone(), b, now, &mut yield_now_and_then);
                let rt =
                    Arc::new(ClusterRt::new(balancer, self.metrics.clone(), self.signal.clone()));
                let _ = prev.successor.set(rt.clone());
                rt
            }),
            None => {
                let balancer = Balancer::new(spec.clone(), now);
                Arc::new(ClusterRt::new(balancer, self.metrics.clone(), self.signal.clone()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rondo_core::{
        ClusterSpec, FailureKind, MemberSpec, OutlierDetection, PickRequest, Policy,
        UpstreamProtocol,
    };

    use super::*;

    fn live() -> Live {
        let policy = Policy {
            outlier: OutlierDetection {
                consecutive_failures: 2,
                base_ejection: Duration::from_millis(5),
                max_ejection: Duration::from_millis(5),
                ..OutlierDetection::default()
            },
            ..Policy::default()
        };
        let member = |n: &str| MemberSpec {
            name: n.into(),
            address: "127.0.0.1:1".into(),
            weight: 100,
            group: None,
            admin: Default::default(),
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
    fn recent_decisions_carry_wall_clock_times() {
        let live = live();
        let rt = live.load().clusters["c"].clone();
        let before =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
                as u64;
        for _ in 0..3 {
            rt.pick_and_begin(&PickRequest { now: clock::now(), ..PickRequest::default() })
                .expect("a member");
        }
        let recent = rt.recent_decisions(2);
        assert_eq!(recent.len(), 2);
        for (unix_ms, _) in &recent {
            assert!(
                *unix_ms + 1_000 >= before && *unix_ms <= before + 60_000,
                "{unix_ms} vs {before}"
            );
        }
    }

    #[test]
    fn ejections_and_returns_are_counted() {
        let live = live();
        let rt = live.load().clusters["c"].clone();
        let fail = Outcome::Failure { kind: FailureKind::Connect, latency: Duration::ZERO };
        for _ in 0..2 {
            let req = PickRequest { now: clock::now(), exclude: &[1], ..PickRequest::default() };
            let d = rt.pick_and_begin(&req).expect("a member");
            assert_eq!(d.member, 0);
            rt.end_request(0, fail);
        }
        assert_eq!(rt.counters.ejections.load(Ordering::Relaxed), 1);
        std::thread::sleep(Duration::from_millis(10));
        let req = PickRequest { now: clock::now(), exclude: &[1], ..PickRequest::default() };
        let d = rt.pick_and_begin(&req).expect("back after the ejection time");
        rt.end_request(d.member, Outcome::Success { latency: Duration::from_millis(1) });
        assert_eq!(rt.counters.returns.load(Ordering::Relaxed), 1);
        let c = ClusterLabels { cluster: "c".into() };
        assert_eq!(live.metrics.ejections.get_or_create(&c).get(), 1);
        assert_eq!(live.metrics.returns.get_or_create(&c).get(), 1);
    }

    #[test]
    fn requests_begun_before_a_swap_end_on_the_successor() {
        let live = live();
        let old = live.load().clusters["c"].clone();
        let req = PickRequest { now: clock::now(), ..PickRequest::default() };
        let d = old.pick_and_begin(&req).expect("a member");
        let view = (*live.load().view).clone();
        let new = live.apply(View { id: 2, ..view }).clusters["c"].clone();
        assert_eq!(new.with(|b| b.states()[d.member].load.in_flight), 1, "carried over");
        old.end_request(d.member, Outcome::Success { latency: Duration::from_millis(1) });
        assert_eq!(new.with(|b| b.states()[d.member].load.in_flight), 0, "ended on the successor");
    }

    /// A shadow beside round-robin: every placed try is compared in the same lock hold, the
    /// live picks are round-robin's exactly, the shadow survives a view swap (its counts too)
    /// and ends with its cluster.
    #[test]
    fn a_shadow_compares_every_placed_try_and_lives_as_long_as_its_cluster() {
        let live = live();
        let rt = live.load().clusters["c"].clone();
        assert_eq!(rt.set_shadow(Some(Algorithm::Random)), None);
        assert_eq!(rt.shadow(), Some(Algorithm::Random));
        let place = |rt: &Arc<ClusterRt>| {
            let mut f = Failover::new(1, true, clock::now(), Duration::from_secs(1));
            let m = rt.place(&mut f, clock::now(), None, None, None).expect("placed").member();
            rt.end_request(m, Outcome::Success { latency: Duration::from_millis(1) });
            m
        };
        let picked: Vec<usize> = (0..10).map(|_| place(&rt)).collect();
        assert_eq!(picked, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1], "round-robin as without a shadow");
        // A try kept on its session's member is no pick: not compared.
        let mut f = Failover::new(1, true, clock::now(), Duration::from_secs(1));
        assert_eq!(rt.place(&mut f, clock::now(), None, None, Some(1)), Ok(Placed::Kept(1)));
        rt.end_request(1, Outcome::Cancelled);
        let (r, since) = rt.shadow_report().expect("a report");
        assert_eq!((r.decisions, r.live_total().picks, r.shadow_total().picks), (10, 10, 10));
        assert_eq!((r.members[0].live.picks, r.members[1].live.picks), (5, 5));
        assert_eq!((r.algorithm, r.live), (Algorithm::Random, Algorithm::RoundRobin));
        let unix_now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
                as u64;
        assert!(since <= unix_now && since + 60_000 > unix_now, "{since} vs {unix_now}");

        // A view swap carries it over, counts and all.
        let view = (*live.load().view).clone();
        let next = live.apply(View { id: 2, ..view.clone() }).clusters["c"].clone();
        assert_eq!(next.shadow(), Some(Algorithm::Random));
        place(&next);
        assert_eq!(next.shadow_report().unwrap().0.decisions, 11);
        // Stopped, it is gone; so it is when its cluster leaves the view, and a cluster that
        // comes back starts without one.
        assert_eq!(next.set_shadow(None), Some(Algorithm::Random));
        assert!(next.shadow_report().is_none());
        next.set_shadow(Some(Algorithm::P2cEwma));
        let gone = live.apply(View { id: 3, clusters: BTreeMap::new(), ..view.clone() });
        assert!(gone.clusters.is_empty());
        let back = live.apply(View { id: 4, ..view }).clusters["c"].clone();
        assert_eq!(back.shadow(), None);
    }

    #[test]
    fn apply_if_swaps_only_while_the_expected_view_is_in_effect() {
        let live = live();
        let base = (*live.load().view).clone();
        assert_eq!(live.apply_if(View { id: 2, ..base.clone() }, 7).map(|s| s.view.id), Err(1));
        assert_eq!(live.load().view.id, 1, "nothing swapped");
        assert_eq!(live.apply_if(View { id: 2, ..base.clone() }, 1).map(|s| s.view.id), Ok(2));
        // A touch (member state a naming answer shows) is a new id too.
        live.touch();
        assert_eq!(live.apply_if(View { id: 4, ..base }, 2).map(|s| s.view.id), Err(3));
        assert_eq!(live.with_current(|s| s.view.id), 3);
    }

    #[test]
    fn view_ids_only_grow_even_when_two_changes_guess_the_same_id() {
        let live = live();
        let base = (*live.load().view).clone();
        let a = live.apply(View { id: 2, ..base.clone() }).view.id;
        let b = live.apply(View { id: 2, ..base.clone() }).view.id;
        let c = live.apply(View { id: 1, ..base }).view.id;
        assert_eq!((a, b, c), (2, 3, 4));
    }

    fn member(name: &str) -> MemberSpec {
        MemberSpec {
            name: name.into(),
            address: "127.0.0.1:1".into(),
            weight: 100,
            group: None,
            admin: Default::default(),
        }
    }

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
        let (snap, built) = live.update_registered(off);
        assert!(built.is_empty() && !snap.view.clusters.contains_key("orders"));
        live.update_registered(vec![("orders".into(), regd(vec![]))]);
        live.allow_declared(true);
        let before = live.load();
        let reg = |members, algorithm| RegisteredCluster {
            members,
            declared: Some(declared("orders", algorithm)),
        };
        let (snap, built) = live
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
        let (snap, _) = live.update_registered(vec![(
            "c".into(),
            RegisteredCluster {
                members: vec![member("r1")],
                declared: Some(declared("c", Algorithm::Hash)),
            },
        )]);
        assert_eq!(snap.view.clusters["c"].policy.algorithm, Policy::default().algorithm);
        assert!(!snap.is_declared("c"));

        // The last member gone, the declared cluster leaves the view.
        let (snap, built) = live.update_registered(vec![("orders".into(), regd(vec![]))]);
        assert!(built.is_empty());
        assert!(
            !snap.view.clusters.contains_key("orders") && !snap.clusters.contains_key("orders")
        );
        assert!(!snap.is_declared("orders") && !snap.registered.contains_key("orders"));
        let whole = live.apply(live.configured());
        assert!(!whole.view.clusters.contains_key("orders"));
    }

    fn names(snap: &Snapshot) -> Vec<String> {
        snap.view.clusters["c"].members.iter().map(|m| m.name.clone()).collect()
    }

    #[test]
    fn registered_members_join_their_clusters_and_survive_config_changes() {
        let live = live();
        let mut rx = live.subscribe();
        let regs: Registered = [
            ("c".to_owned(), regd(vec![member("r1"), member("a")])),
            ("unknown".to_owned(), regd(vec![member("r2")])),
        ]
        .into_iter()
        .collect();
        let snap = live.set_registered(regs);
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
        live.update_configured(|v| {
            let mut d = (*v.clusters["c"]).clone();
            d.name = "d".into();
            v.clusters.insert("d".into(), Arc::new(d));
            Ok::<(), ()>(())
        })
        .unwrap();
        let before = live.load();
        let mut rx = live.subscribe();
        let (snap, built) = live.update_registered(vec![("c".into(), regd(vec![member("r1")]))]);
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
        let (snap, _) =
            live.update_registered(vec![("c".into(), regd(vec![member("r1"), member("a")]))]);
        assert_eq!(names(&snap), ["a", "b", "r1"]);
        let whole = live.apply(live.configured());
        assert_eq!(names(&whole), names(&snap));
        assert_eq!(whole.registered, snap.registered);

        // Its last registered member gone, the cluster is its configured self again.
        let (snap, _) = live.update_registered(vec![("c".into(), regd(vec![]))]);
        assert_eq!(names(&snap), ["a", "b"]);
        assert!(!snap.is_registered("c", "r1") && snap.registered.is_empty());
        // A cluster the configuration lacks: kept in the layers, in no view.
        let (snap, built) = live.update_registered(vec![("nope".into(), regd(vec![member("x")]))]);
        assert!(built.is_empty() && !snap.view.clusters.contains_key("nope"));
    }

    /// A runtime replaced by a registration is not freed by whichever thread drops the last
    /// old snapshot (a request's): `update_registered` keeps it for `RETIRED_GRACE`, and the
    /// updating thread frees it once that has passed.
    #[test]
    fn a_replaced_runtime_is_freed_by_the_updating_thread_after_the_grace() {
        let live = live();
        let before = live.load();
        let old = Arc::downgrade(&before.clusters["c"]);
        live.update_registered(vec![("c".into(), regd(vec![member("r1")]))]);
        // A request that held the old snapshot lets go of it: the runtime outlives it.
        drop(before);
        assert!(old.upgrade().is_some(), "freed by the thread that dropped the old snapshot");
        live.reap_retired();
        assert!(old.upgrade().is_some(), "freed before the grace");
        std::thread::sleep(RETIRED_GRACE + Duration::from_millis(20));
        live.reap_retired();
        assert!(old.upgrade().is_none(), "kept after the grace");
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
                live.update_configured(|v| {
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
        live.update_configured(|v| {
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
        assert_eq!(live.update_configured(|_| Err("no")).unwrap_err(), "no");
        assert_eq!(live.load().view.id, id);
    }
}
