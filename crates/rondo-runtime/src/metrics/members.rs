//! Clusters and their members: ejections, returns and completed drains counted as they happen
//! (by [`crate::ClusterRt`]), and the state gauges (in flight, sessions, health, eligibility,
//! ejection, agent heartbeat age, shadow evaluations) read from the snapshot at scrape time.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of a cluster event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ClusterLabels {
    /// Cluster name.
    pub cluster: String,
}

/// Labels of a member's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MemberLabels {
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
}

/// Labels of the reason a member takes no new requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MemberReasonLabels {
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
    /// [`rondo_core::Ineligible::as_str`].
    pub reason: &'static str,
}

/// Labels of a cluster's shadow evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ShadowLabels {
    /// Cluster name.
    pub cluster: String,
    /// The live algorithm.
    pub live: &'static str,
    /// The shadow algorithm.
    pub shadow: &'static str,
}

/// Labels of one side's (live or shadow) picks of a member in a shadow evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ShadowPickLabels {
    /// Cluster name.
    pub cluster: String,
    /// The shadow algorithm.
    pub shadow: &'static str,
    /// Member name (`(departed)` for the members that left since the shadow started).
    pub member: String,
    /// `live` or `shadow`.
    pub side: &'static str,
    /// `all`, `failed` (the member's next request to end failed) or `slow` (made while the
    /// member was slow).
    pub kind: &'static str,
}

impl Metrics {
    /// Sets the shadow gauges of `cluster` from its shadow's report.
    fn shadow(&self, cluster: &str, r: &rondo_core::ShadowReport) {
        let gauge = |n: u64| n.min(i64::MAX as u64) as i64;
        let labels = ShadowLabels {
            cluster: cluster.to_owned(),
            live: r.live.as_str(),
            shadow: r.algorithm.as_str(),
        };
        self.shadow_decisions.get_or_create(&labels).set(gauge(r.decisions));
        self.shadow_differed.get_or_create(&labels).set(gauge(r.differed()));
        for m in &r.members {
            let member = if m.name.is_empty() { "(departed)".to_owned() } else { m.name.clone() };
            for (side, c) in [("live", m.live), ("shadow", m.shadow)] {
                for (kind, n) in [("all", c.picks), ("failed", c.failed), ("slow", c.slow)] {
                    let l = ShadowPickLabels {
                        cluster: cluster.to_owned(),
                        shadow: r.algorithm.as_str(),
                        member: member.clone(),
                        side,
                        kind,
                    };
                    self.shadow_picks.get_or_create(&l).set(gauge(n));
                }
            }
        }
    }

    /// Refills the member state gauges from `snap` (the caller holds the scrape lock).
    pub(super) fn member_state(&self, snap: &dyn Scraped, now: rondo_core::Instant) {
        for f in [&self.in_flight, &self.sessions, &self.healthy, &self.eligible, &self.ejected] {
            f.clear();
        }
        self.ineligible.clear();
        let group = self.group.get().cloned().flatten();
        self.agent_age.clear();
        self.shadow_decisions.clear();
        self.shadow_differed.clear();
        self.shadow_picks.clear();
        for name in snap.view().clusters.keys() {
            snap.with_balancer(name, &mut |members, b| {
                // Event counters of every cluster are shown from zero on.
                let cl = ClusterLabels { cluster: name.clone() };
                self.ejections.get_or_create(&cl).inc_by(0);
                self.returns.get_or_create(&cl).inc_by(0);
                let (eligibility, _) = b.eligibility(now, group.as_deref());
                for ((m, s), e) in members.iter().zip(b.states()).zip(eligibility) {
                    let l = MemberLabels { cluster: name.clone(), member: m.name.clone() };
                    self.in_flight.get_or_create(&l).set(s.load.in_flight as i64);
                    self.sessions.get_or_create(&l).set(s.load.sessions as i64);
                    self.healthy.get_or_create(&l).set(i64::from(s.healthy));
                    self.eligible.get_or_create(&l).set(i64::from(e.eligible));
                    if let (false, Some(why)) = (e.eligible, e.reason) {
                        let l = MemberReasonLabels {
                            cluster: name.clone(),
                            member: m.name.clone(),
                            reason: why.as_str(),
                        };
                        self.ineligible.get_or_create(&l).set(1);
                    }
                    let ejected = s.ejected_until.is_some_and(|u| u > now);
                    self.ejected.get_or_create(&l).set(i64::from(ejected));
                    if let Some(r) = s.load.agent {
                        self.agent_age.get_or_create(&l).set(now.since(r.at).as_secs_f64());
                    }
                }
                if let Some(r) = b.shadow_report(now) {
                    self.shadow(name, &r);
                }
            });
        }
    }
}

/// Registers the clusters' event counters.
pub(super) fn register_events(m: &Metrics, r: &mut Registry) {
    r.register("ejections", "Members ejected by outlier detection", m.ejections.clone());
    r.register(
        "ejection_returns",
        "Members back from an ejection (first success after it ended)",
        m.returns.clone(),
    );
    r.register(
        "drains_completed",
        "Draining members that reached no request in flight and no session",
        m.drains_completed.clone(),
    );
}

/// Registers the member state and shadow gauges.
pub(super) fn register_state(m: &Metrics, r: &mut Registry) {
    r.register("member_in_flight", "Requests in flight on a member", m.in_flight.clone());
    r.register("member_sessions", "Sessions pinned to a member", m.sessions.clone());
    r.register(
            "member_healthy",
            "1 when the member's health checks (or the registry) say it is up, else 0; see member_eligible for whether it gets traffic",
            m.healthy.clone(),
        );
    r.register(
            "member_eligible",
            "1 when the member is a candidate for new requests and sessions now (admin state, health checks, ejection, agent, locality, panic), else 0",
            m.eligible.clone(),
        );
    r.register(
            "member_ineligible",
            "1 for the reason a member gets no new requests (disabled, draining, health_check, ejected, agent_silent, other_group); absent while it is eligible",
            m.ineligible.clone(),
        );
    r.register(
        "member_ejected",
        "1 while outlier detection keeps the member ejected, else 0",
        m.ejected.clone(),
    );
    r.register(
        "member_agent_heartbeat_age_seconds",
        "Age of the member's latest load-agent report (absent before the first)",
        m.agent_age.clone(),
    );
    r.register(
        "shadow_decisions",
        "Picks compared since the cluster's shadow algorithm started (rondo ctl shadow)",
        m.shadow_decisions.clone(),
    );
    r.register(
        "shadow_differed",
        "Of the picks compared, those where the shadow algorithm would have chosen another member",
        m.shadow_differed.clone(),
    );
    r.register(
            "shadow_picks",
            "Picks of a member by the live and by the shadow algorithm since the shadow started: all, those whose member's next request to end failed, those made while the member was slow",
            m.shadow_picks.clone(),
        );
}

/// The live state as a scrape reads it (the live view's `Snapshot` is one): the view, and each
/// cluster's members with its balancer.
pub trait Scraped {
    /// The view in effect.
    fn view(&self) -> &rondo_core::View;
    /// Runs `f` with cluster `name`'s members and its balancer, under the cluster's lock (not at
    /// all when the view has no runtime for it).
    fn with_balancer(
        &self,
        name: &str,
        f: &mut dyn FnMut(&[rondo_core::MemberSpec], &mut rondo_core::Balancer),
    );
}

impl<S: Scraped> Scraped for std::sync::Arc<S> {
    fn view(&self) -> &rondo_core::View {
        (**self).view()
    }

    fn with_balancer(
        &self,
        name: &str,
        f: &mut dyn FnMut(&[rondo_core::MemberSpec], &mut rondo_core::Balancer),
    ) {
        (**self).with_balancer(name, f);
    }
}
