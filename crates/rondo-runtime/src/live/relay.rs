//! The verdicts a cluster's runtime relays to the other clusters holding a shared member (a
//! health check's, a passive ejection, an agent report) and the tier's load it sets, through the
//! shared state of `shared.rs`; see there for why and when.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rondo_core::load::AgentReport;
use rondo_core::{Actor, Ejection, ProbeFailure};

use super::ClusterRt;
use super::shared::SharedMember;
use crate::clock;

impl ClusterRt {
    /// Whether another cluster's health checks judge `member` for this one (a shared member
    /// is probed once).
    pub fn probed_elsewhere(&self, member: usize) -> bool {
        self.shared_member(member).is_some_and(|s| s.prober().is_some_and(|p| p != self.spec.name))
    }

    /// The shared state of `member`, when it is a shared member.
    pub fn shared_member(&self, member: usize) -> Option<&Arc<SharedMember<ClusterRt>>> {
        self.external.get()?.member(member)
    }

    /// `member`'s health as this cluster's checks judged it, applied to every other cluster
    /// holding it (with why its latest check failed); each one that changed says so.
    pub fn share_health(&self, member: usize, healthy: bool, why: Option<ProbeFailure>) {
        let Some(s) = self.shared_member(member) else { return };
        let now = clock::now();
        for (rt, i) in s.others(&self.spec.name) {
            let changed = rt.on_newest(i, |b, j| {
                if let Some(why) = why {
                    b.note_probe_failure(j, why, now);
                }
                b.set_health(j, healthy, Actor::HealthCheck, now)
            });
            if let Some((rt, j, true)) = changed {
                let word = if healthy { "member up" } else { "member down" };
                tracing::info!(
                    cluster = %rt.spec.name,
                    member = %rt.spec.members[j].name,
                    by = %self.spec.name,
                    "{word}: a shared member, judged by its health checks in another cluster"
                );
                rt.state_changed();
            }
        }
    }

    /// What the other routers of the tier have at each member (parallel to the members): a
    /// shared member's through its shared state, which every pick adds to the other clusters'
    /// count, any other's straight into the balancer's addend; set in one lock hold.
    pub fn set_tier_load(&self, values: &[u32]) {
        let ext = self.external.get();
        for (i, &v) in values.iter().enumerate() {
            if let Some(s) = ext.and_then(|e| e.member(i)) {
                s.tier.store(v, Ordering::Relaxed);
            }
        }
        self.with(|b| {
            for (i, &v) in values.iter().enumerate() {
                if ext.and_then(|e| e.member(i)).is_none() {
                    b.set_external(i, v);
                }
            }
            if let Some(e) = ext {
                e.refresh(b);
            }
        });
    }

    /// A passive ejection of `member` here, applied to every other cluster holding it.
    pub(super) fn share_ejection(&self, member: usize, e: Ejection) {
        let Some(s) = self.shared_member(member) else { return };
        for (rt, i) in s.others(&self.spec.name) {
            rt.on_newest(i, |b, j| b.set_ejection(j, e.until, e.count));
        }
    }

    /// An agent report on `member` received through this cluster, applied to every other
    /// cluster holding it.
    pub fn share_agent_report(&self, member: usize, report: AgentReport) {
        let Some(s) = self.shared_member(member) else { return };
        for (rt, i) in s.others(&self.spec.name) {
            rt.on_newest(i, |b, j| b.report_agent(j, report));
        }
    }
}
