//! One load view for the tier (SGD's array shares load information between its servers):
//! every `[tier] interval_ms` this router publishes the load it measures per member (requests
//! in flight, sessions, EWMA latency) on the tier's NATS core subject, and adds up the other
//! routers' reports into each member's external addend ([`rondo_core::load::Load::external`]), so that
//! its load-counting pickers see the tier's in-flight total. A router silent for
//! [`FORGET_AFTER`] intervals is forgotten.
//!
//! Members are matched across routers by [`key`]: `CLUSTER/MEMBER`, or `@NAME` for a shared
//! `[member.NAME]` (one server, whichever clusters list it). [`TierView`] is the pure part
//! (reports in, sums out, with the time as an argument); [`measure`] and [`apply`] read and set
//! the live balancers, one cluster lock at a time; `run` (feature `nats`) is the loop.
//!
//! Why NATS and not etcd: at 100 ms per router, N routers make 10·N writes a second of the
//! whole member table; etcd replicates and fsyncs each one (docs/benchmarks.md measures it),
//! NATS core fans them out from memory and keeps nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rondo_core::Instant;
use serde::{Deserialize, Serialize};

use crate::live::Snapshot;
#[cfg(feature = "nats")]
use crate::live::{Views, WeakViews};
#[cfg(feature = "nats")]
use crate::metrics::Metrics;

/// Intervals a router may stay silent before its reports stop counting.
pub const FORGET_AFTER: u32 = 3;
/// Other routers counted at most: reports from more are dropped (a tier is a few routers;
/// this bounds what a stray publisher on the subject can make us hold).
pub const MAX_ROUTERS: usize = 256;
/// Members in one report at most; a longer report is dropped whole.
pub const MAX_MEMBERS_PER_REPORT: usize = 100_000;

/// One member's load as a router measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemberLoad {
    /// Requests in flight there.
    pub in_flight: u32,
    /// Sessions pinned there.
    pub sessions: u32,
    /// The peak EWMA latency estimate, microseconds.
    pub ewma_us: u64,
}

/// What one router publishes each interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The publishing router's id (random per process).
    pub router: u64,
    /// Grows with every report of that router (a late duplicate is ignored).
    pub seq: u64,
    /// Load by member [`key`].
    pub members: BTreeMap<String, MemberLoad>,
}

/// The key that names a member across the tier's routers.
pub fn key(cluster: &str, member: &str, shared: bool) -> String {
    if shared { format!("@{member}") } else { format!("{cluster}/{member}") }
}

/// The other routers' latest reports.
#[derive(Debug, Default)]
pub struct TierView {
    routers: HashMap<u64, (Instant, Report)>,
}

impl TierView {
    /// Takes `report`, received at `now`, unless it is older than one already taken from its
    /// router, too big, or from one router too many.
    pub fn heard(&mut self, report: Report, now: Instant) -> bool {
        if report.members.len() > MAX_MEMBERS_PER_REPORT {
            return false;
        }
        let full = self.routers.len() >= MAX_ROUTERS;
        match self.routers.get_mut(&report.router) {
            Some((_, r)) if r.seq >= report.seq => false,
            Some(slot) => {
                *slot = (now, report);
                true
            }
            None if full => false,
            None => {
                self.routers.insert(report.router, (now, report));
                true
            }
        }
    }

    /// Forgets the routers not heard from for [`FORGET_AFTER`] `interval`s at `now`; returns
    /// how many.
    pub fn forget_silent(&mut self, now: Instant, interval: Duration) -> usize {
        let before = self.routers.len();
        let limit = interval * FORGET_AFTER;
        self.routers.retain(|_, (at, _)| now.since(*at) <= limit);
        before - self.routers.len()
    }

    /// The routers counted.
    pub fn routers(&self) -> usize {
        self.routers.len()
    }

    /// Requests in flight plus sessions at each member, summed over the other routers.
    pub fn sums(&self) -> HashMap<&str, u32> {
        let mut out: HashMap<&str, u32> = HashMap::new();
        for (_, r) in self.routers.values() {
            for (k, l) in &r.members {
                let v = out.entry(k.as_str()).or_default();
                *v = v.saturating_add(l.in_flight).saturating_add(l.sessions);
            }
        }
        out
    }
}

/// This router's load per member key now: each cluster locked once, a shared member summed
/// over its clusters.
pub fn measure(snap: &Snapshot, router: u64, seq: u64) -> Report {
    let now = crate::clock::now();
    let mut members: BTreeMap<String, MemberLoad> = BTreeMap::new();
    for (name, rt) in &snap.clusters {
        let decay = rt.spec.policy.ewma.decay;
        let loads: Vec<(String, MemberLoad)> = rt.with(|b| {
            b.states()
                .iter()
                .enumerate()
                .map(|(i, st)| {
                    let shared = rt.shared_member(i).is_some();
                    let load = MemberLoad {
                        in_flight: st.load.in_flight,
                        sessions: st.load.sessions,
                        ewma_us: (st.load.ewma.get_at(now, decay) / 1000.0) as u64,
                    };
                    (key(name, &rt.spec.members[i].name, shared), load)
                })
                .collect()
        });
        for (k, l) in loads {
            let m = members.entry(k).or_default();
            m.in_flight = m.in_flight.saturating_add(l.in_flight);
            m.sessions = m.sessions.saturating_add(l.sessions);
            m.ewma_us = m.ewma_us.max(l.ewma_us);
        }
    }
    Report { router, seq, members }
}

/// Sets every member's tier share from `sums` (a member no other router reports: zero): a
/// shared member's through its shared state (each pick adds the other clusters' count to it),
/// any other's straight into its balancer's addend.
pub fn apply(snap: &Snapshot, sums: &HashMap<&str, u32>) {
    for (name, rt) in &snap.clusters {
        let values: Vec<u32> = rt
            .spec
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let shared = rt.shared_member(i).is_some();
                sums.get(key(name, &m.name, shared).as_str()).copied().unwrap_or(0)
            })
            .collect();
        rt.set_tier_load(&values);
    }
}

/// A random id for this process's reports.
pub fn router_id() -> u64 {
    let pid = u64::from(std::process::id());
    rondo_core::hash::hash_key(&(crate::clock::now().0 ^ (pid << 32)).to_le_bytes())
}

/// Starts the tier's load view on `spec`'s NATS server over `views` (the routers' count in
/// `metrics`); runs while the view lives.
#[cfg(feature = "nats")]
pub fn spawn(
    views: &Views,
    metrics: std::sync::Arc<Metrics>,
    spec: rondo_config::TierSpec,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(views.downgrade(), metrics, spec))
}

#[cfg(feature = "nats")]
async fn run(views: WeakViews, metrics: std::sync::Arc<Metrics>, spec: rondo_config::TierSpec) {
    use futures_util::StreamExt;

    let me = router_id();
    let (client, mut sub) = loop {
        match connect(&spec).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(nats = %spec.nats, "tier load view: {e}; trying again in 1 s");
                if views.upgrade().is_none() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    tracing::info!(nats = %spec.nats, subject = %spec.subject, router = me, "tier load view on");
    let mut view = TierView::default();
    let mut seq = 0u64;
    let mut tick = tokio::time::interval(spec.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let Some(live) = views.upgrade() else { return };
                let snap = live.load();
                drop(live);
                seq += 1;
                let report = measure(&snap, me, seq);
                match serde_json::to_vec(&report) {
                    Ok(body) => {
                        if let Err(e) = client.publish(spec.subject.clone(), body.into()).await {
                            tracing::debug!("tier load view: publish failed: {e}");
                        }
                    }
                    Err(e) => tracing::debug!("tier load view: {e}"),
                }
                let now = crate::clock::now();
                let forgotten = view.forget_silent(now, spec.interval);
                if forgotten > 0 {
                    tracing::info!(forgotten, "tier load view: routers silent for {FORGET_AFTER} intervals forgotten");
                }
                apply(&snap, &view.sums());
                metrics.tier_load_routers.set(view.routers() as i64);
            }
            msg = sub.next() => {
                let Some(msg) = msg else { return };
                let Ok(report) = serde_json::from_slice::<Report>(&msg.payload) else {
                    tracing::debug!("tier load view: a report that is not one, ignored");
                    continue;
                };
                if report.router != me {
                    view.heard(report, crate::clock::now());
                }
            }
        }
    }
}

#[cfg(feature = "nats")]
async fn connect(
    spec: &rondo_config::TierSpec,
) -> Result<(async_nats::Client, async_nats::Subscriber), String> {
    let client = async_nats::connect(spec.nats.as_str()).await.map_err(|e| e.to_string())?;
    let sub = client.subscribe(spec.subject.clone()).await.map_err(|e| e.to_string())?;
    Ok((client, sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(router: u64, seq: u64, loads: &[(&str, u32, u32)]) -> Report {
        let members = loads
            .iter()
            .map(|&(k, in_flight, sessions)| {
                (k.to_owned(), MemberLoad { in_flight, sessions, ewma_us: 0 })
            })
            .collect();
        Report { router, seq, members }
    }

    #[test]
    fn sums_add_routers_and_a_silent_router_is_forgotten_after_three_intervals() {
        let interval = Duration::from_millis(100);
        let mut v = TierView::default();
        assert!(v.heard(report(1, 1, &[("c/a", 3, 1), ("@s", 2, 0)]), Instant::from_millis(0)));
        assert!(v.heard(report(2, 1, &[("c/a", 4, 0)]), Instant::from_millis(10)));
        let sums = v.sums();
        assert_eq!((sums["c/a"], sums["@s"]), (8, 2));
        // A late duplicate is ignored; a newer report replaces the older.
        assert!(!v.heard(report(1, 1, &[("c/a", 99, 0)]), Instant::from_millis(20)));
        assert!(v.heard(report(1, 2, &[("c/a", 1, 0)]), Instant::from_millis(250)));
        assert_eq!(v.sums()["c/a"], 5);
        // Router 2 was last heard at 10 ms: still counted at 310 ms, gone after.
        assert_eq!(v.forget_silent(Instant::from_millis(310), interval), 0);
        assert_eq!(v.forget_silent(Instant::from_millis(311), interval), 1);
        assert_eq!((v.routers(), v.sums()["c/a"]), (1, 1));
    }

    #[test]
    fn reports_are_bounded() {
        let mut v = TierView::default();
        for r in 0..MAX_ROUTERS as u64 {
            assert!(v.heard(report(r, 1, &[]), Instant::ZERO));
        }
        assert!(!v.heard(report(u64::MAX, 1, &[]), Instant::ZERO), "one router too many");
        let big: BTreeMap<String, MemberLoad> =
            (0..=MAX_MEMBERS_PER_REPORT).map(|i| (i.to_string(), MemberLoad::default())).collect();
        let mut v = TierView::default();
        assert!(!v.heard(Report { router: 1, seq: 1, members: big }, Instant::ZERO));
    }

    #[test]
    fn keys_name_a_shared_member_by_itself() {
        assert_eq!(key("api", "w1", false), "api/w1");
        assert_eq!(key("api", "w1", true), "@w1");
    }
}
