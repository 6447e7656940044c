//! The live state: the current [`Snapshot`] (a view and one [`ClusterRt`] per cluster) behind an
//! atomic pointer swap. A request loads the snapshot once and keeps it to the end (WCF's
//! "messages in flight finish on the configuration they started with"); a new view is built
//! beside it, carrying every surviving member's state over, and swapped in whole.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arc_swap::ArcSwap;
use rondo_core::{
    Balancer, ClusterSpec, Decision, Ejection, Entropy, Outcome, PickError, PickRequest,
    SplitMix64, View,
};

use crate::clock;

/// One view and the run-time state of each of its clusters.
#[derive(Debug)]
pub struct Snapshot {
    /// The view.
    pub view: Arc<View>,
    /// Cluster state by name.
    pub clusters: HashMap<String, Arc<ClusterRt>>,
}

/// A cluster's balancer and random generator, behind one lock (held for nanoseconds: a pick or
/// a counter update, never across I/O).
#[derive(Debug)]
pub struct ClusterRt {
    /// The cluster as configured in this view.
    pub spec: Arc<ClusterSpec>,
    inner: Mutex<Inner>,
    /// The runtime that replaced this one in a newer view; requests that started on this one
    /// report their end there, so counts stay right across swaps.
    successor: OnceLock<Arc<ClusterRt>>,
}

#[derive(Debug)]
struct Inner {
    balancer: Balancer,
    rng: SplitMix64,
}

impl ClusterRt {
    fn new(balancer: Balancer) -> Self {
        let seed = clock::now().0 ^ rondo_core::hash::hash_key(balancer.spec().name.as_bytes());
        ClusterRt {
            spec: balancer.spec().clone(),
            inner: Mutex::new(Inner { balancer, rng: SplitMix64::new(seed) }),
            successor: OnceLock::new(),
        }
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

    /// Picks a member and counts a request as begun on it, in one lock.
    pub fn pick_and_begin(&self, req: &PickRequest<'_>) -> Result<Decision, PickError> {
        let mut g = self.lock();
        let Inner { balancer, rng } = &mut *g;
        let d = balancer.pick(req, rng)?;
        balancer.begin_request(d.member);
        Ok(d)
    }

    /// Counts a request as begun on `member` if it may still keep a session (sticky requests).
    pub fn keep_and_begin(&self, member: usize, now: rondo_core::Instant) -> bool {
        let mut g = self.lock();
        let ok = g.balancer.can_keep_session(member, now);
        if ok {
            g.balancer.begin_request(member);
        }
        ok
    }

    /// Picks a member without counting anything (sessions count themselves).
    pub fn pick(&self, req: &PickRequest<'_>) -> Result<Decision, PickError> {
        let mut g = self.lock();
        let Inner { balancer, rng } = &mut *g;
        balancer.pick(req, rng)
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

    /// A request begun with [`ClusterRt::pick_and_begin`] ended.
    pub fn end_request(self: &Arc<Self>, member: usize, outcome: Outcome) -> Option<Ejection> {
        let (rt, idx) = self.resolve(member)?;
        let now = clock::now();
        let ejection = rt.with(|b| b.end_request(idx, now, outcome));
        if let Some(e) = ejection {
            tracing::warn!(
                cluster = %rt.spec.name,
                member = %rt.spec.members[idx].name,
                count = e.count,
                for_ms = e.until.since(now).as_millis() as u64,
                "member ejected by outlier detection"
            );
        }
        ejection
    }

    /// A session was pinned to `member`.
    pub fn open_session(self: &Arc<Self>, member: usize) {
        if let Some((rt, idx)) = self.resolve(member) {
            rt.with(|b| b.open_session(idx));
        }
    }

    /// A session on `member` ended.
    pub fn close_session(self: &Arc<Self>, member: usize) {
        if let Some((rt, idx)) = self.resolve(member) {
            rt.with(|b| b.close_session(idx));
        }
    }
}

/// The current snapshot and how to replace it.
#[derive(Debug)]
pub struct Live {
    current: ArcSwap<Snapshot>,
    /// Serialises replacements (readers never wait).
    apply: Mutex<()>,
    /// This router's locality group.
    pub group: Option<String>,
}

impl Live {
    /// Live state starting at `view`.
    pub fn new(view: View, group: Option<String>) -> Self {
        let now = clock::now();
        let clusters = view
            .clusters
            .iter()
            .map(|(name, spec)| {
                (name.clone(), Arc::new(ClusterRt::new(Balancer::new(spec.clone(), now))))
            })
            .collect();
        let snapshot = Snapshot { view: Arc::new(view), clusters };
        Live { current: ArcSwap::from_pointee(snapshot), apply: Mutex::new(()), group }
    }

    /// The current snapshot; hold it for the whole request.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Replaces the view, keeping the state of every cluster and member that survives.
    /// Returns the new snapshot.
    pub fn apply(&self, view: View) -> Arc<Snapshot> {
        let _serial = self.apply.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.load_full();
        let now = clock::now();
        let clusters: HashMap<String, Arc<ClusterRt>> = view
            .clusters
            .iter()
            .map(|(name, spec)| {
                let balancer = match old.clusters.get(name) {
                    Some(prev) => prev.with(|b| Balancer::carry_over(spec.clone(), b, now)),
                    None => Balancer::new(spec.clone(), now),
                };
                (name.clone(), Arc::new(ClusterRt::new(balancer)))
            })
            .collect();
        for (name, rt) in &clusters {
            if let Some(prev) = old.clusters.get(name) {
                let _ = prev.successor.set(rt.clone());
            }
        }
        let snapshot = Arc::new(Snapshot { view: Arc::new(view), clusters });
        self.current.store(snapshot.clone());
        snapshot
    }
}
