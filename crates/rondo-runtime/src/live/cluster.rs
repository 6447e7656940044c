//! A cluster's runtime in one view ([`ClusterRt`]): its balancer and generators behind one lock,
//! placing a request's tries, ending requests (on the newest runtime, across view swaps),
//! the shadow algorithm, and the state changes a naming answer shows.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rondo_core::{
    AdminState, Algorithm, Balancer, ClusterSpec, Decision, Ejection, Entropy, Failover, Outcome,
    PickError, PickRequest, SplitMix64, Stop, Why,
};

use crate::clock;
use crate::metrics::{ClusterLabels, Metrics};

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
    pub(super) inner: Mutex<Inner>,
    /// The runtime that replaced this one in a newer view; requests that started on this one
    /// report their end there, so counts stay right across swaps.
    pub(super) successor: OnceLock<Arc<ClusterRt>>,
    /// Event counters (for status and metrics).
    pub counters: Counters,
    /// The process's metrics (ejections are counted there too).
    metrics: Arc<Metrics>,
    /// Raised when a member's state changes in a way the naming answer shows.
    signal: Arc<StateSignal>,
    /// TLS to the members (`upstream_tls`), its files read when this view was made; `Err`:
    /// they could not be (every try then fails, saying so).
    pub tls: Option<Result<Arc<crate::tls::upstream::UpstreamTlsRt>, String>>,
    /// The shared state of its shared members (`[member.NAME]` listed by several clusters),
    /// set when a view builds it; unset for a cluster without any, which then pays one branch.
    pub(super) external: OnceLock<super::shared::External<ClusterRt>>,
}

/// Member state changes that a naming answer shows (an operator's drain, a health check or an
/// agent taking a member out or back), raised by whoever made the change once its lock is
/// released; [`Views::spawn_touch`](super::Views::spawn_touch) turns them into a new view id, so that naming watchers see
/// them.
#[derive(Debug, Default)]
pub struct StateSignal {
    pub(super) pending: std::sync::atomic::AtomicBool,
    pub(super) notify: tokio::sync::Notify,
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
pub(super) struct Inner {
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
    pub(super) fn new(balancer: Balancer, metrics: Arc<Metrics>, signal: Arc<StateSignal>) -> Self {
        let seed = clock::now().0 ^ rondo_core::hash::hash_key(balancer.spec().name.as_bytes());
        let spec = balancer.spec();
        let tls = spec.upstream_tls.as_ref().map(|t| {
            let alpn: &[&[u8]] = match spec.upstream_protocol {
                rondo_core::UpstreamProtocol::Http1 => &[b"http/1.1"],
                rondo_core::UpstreamProtocol::Http2 => &[b"h2"],
                rondo_core::UpstreamProtocol::Tcp | rondo_core::UpstreamProtocol::Udp => &[],
            };
            crate::tls::upstream::UpstreamTlsRt::load(t, alpn).map(Arc::new).inspect_err(|e| {
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
            external: OnceLock::new(),
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
        let mut g = self.lock();
        let ext = self.external.get();
        if let Some(e) = ext {
            e.refresh(&mut g.balancer);
        }
        let d = g.pick_and_begin(req).cloned();
        if let (Some(e), Ok(d)) = (ext, &d) {
            e.count(d.member, 1);
        }
        d
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
        let ext = self.external.get();
        if let Some(e) = ext {
            e.refresh(&mut g.balancer);
        }
        failover.admit(&mut g.balancer, now).map_err(Refused::Stop)?;
        if let Some(m) = keep
            && !failover.tried().contains(&m)
            && g.balancer.can_keep_session(m, now)
        {
            // A session's own member too: `max_requests` caps the whole cluster (a pick checks
            // it itself).
            g.balancer.under_max_requests().map_err(Refused::NoEligible)?;
            g.balancer.begin_request(m);
            if let Some(e) = ext {
                e.count(m, 1);
            }
            failover.began(m);
            return Ok(Placed::Kept(m));
        }
        let req = PickRequest { now, group, hash, context: None, exclude: failover.tried() };
        let d = g.pick_and_begin(&req).map_err(Refused::NoEligible)?;
        let placed = Placed::Picked(d.member, d.algorithm, d.why);
        if let Some(e) = ext {
            e.count(d.member, 1);
        }
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
    /// be swapped in ([`Views::with_current`](super::Views::with_current)), or a swap in between keeps the old state.
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
        if let Some(e) = self.external.get() {
            e.refresh(balancer);
        }
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
    pub(super) fn on_newest<R>(
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
        // Counted where it began (a member's shared count is one across view swaps).
        if let Some(e) = self.external.get() {
            e.count(member, -1);
        }
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
            rt.share_ejection(idx, e);
        }
        ejection
    }

    /// A session was pinned to `member`.
    pub fn open_session(self: &Arc<Self>, member: usize) {
        if let Some(e) = self.external.get() {
            e.count(member, 1);
        }
        self.on_newest(member, |b, idx| b.open_session(idx));
    }

    /// A session on `member` ended.
    pub fn close_session(self: &Arc<Self>, member: usize) {
        if let Some(e) = self.external.get() {
            e.count(member, -1);
        }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use rondo_core::{FailureKind, View};

    use super::*;

    use crate::live::tests::live;

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
}
