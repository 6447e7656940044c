//! A cluster's run-time state as one process hands it to the next (a hitless restart or binary
//! upgrade, `rondo serve --upgrade`): by member name, with every instant turned into an age or
//! a time left at the moment of the hand-off, since two processes' clocks have different
//! origins.
//!
//! What travels: the admin state and who set it (with the admin state the configuration gave,
//! so a new configuration's own change still wins, as in [`crate::Balancer::carry_over`]),
//! health and who set it, the health checks passed or failed in a row, passive ejections and
//! the time they have left, slow start, the peak EWMA, the latest agent report and its age, the
//! latest probe round trip, `rotating`'s order and `response-time`'s smoothed round trips, the
//! retry budget, and the pick sequence. What does not: requests in flight and sessions (they
//! stay with the process that holds their connections), and why the last failed health check
//! failed (the next failing check says it again).

use std::collections::HashMap;
use std::time::Duration;

use super::Balancer;
use super::pickers::AlgoState;
use crate::load::{AgentReport, PeakEwma};
use crate::model::{Actor, AdminState};
use crate::time::Instant;

/// One cluster's state, as [`Balancer::export`] gives it and [`Balancer::import`] takes it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClusterHandoff {
    /// Every member the previous process knew.
    pub members: Vec<MemberHandoff>,
    /// Picks made so far (the least-recently-picked tie-breaker keeps counting).
    pub seq: u64,
    /// The retry budget's banked deposits and floor.
    pub budget: (f64, f64),
    /// `rotating`'s order, as member names.
    pub order: Vec<String>,
}

/// One member's state.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberHandoff {
    /// The member's name (state is matched by it).
    pub name: String,
    /// The admin state the previous process's configuration gave the member.
    pub configured_admin: AdminState,
    /// Its admin state.
    pub admin: AdminState,
    /// Who set it.
    pub admin_by: Actor,
    /// Whether health checks (or the registry) consider it up.
    pub healthy: bool,
    /// Who said so.
    pub health_by: Actor,
    /// How long ago (ns) `healthy` last changed.
    pub health_age_ns: u64,
    /// Health checks passed and failed in a row.
    pub probe_streak: (u32, u32),
    /// How long (ns) a passive ejection has left.
    pub ejected_for_ns: Option<u64>,
    /// Consecutive ejections.
    pub ejections: u32,
    /// How long ago (ns) its slow-start ramp began.
    pub slow_start_age_ns: Option<u64>,
    /// The peak EWMA's estimate (ns) and how long ago (ns) it was last updated.
    pub ewma: (f64, u64),
    /// The latest agent report and its age.
    pub agent: Option<AgentHandoff>,
    /// The latest probe round's round trip (ns).
    pub probe_rtt_ns: Option<u64>,
    /// `response-time`'s smoothed probe round trip (ns).
    pub smoothed_rtt_ns: Option<f64>,
    /// Requests completed.
    pub completed: u64,
    /// Failures in a row (passive outlier detection).
    pub consecutive_failures: u32,
}

/// A member's latest agent report.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AgentHandoff {
    /// CPU in use, 0.0..=1.0.
    pub cpu_used: f32,
    /// Free memory in bytes.
    pub mem_free: u64,
    /// Sessions the member counts itself.
    pub sessions: u32,
    /// The heartbeat's sequence number.
    pub seq: u64,
    /// How long ago (ns) it arrived.
    pub age_ns: u64,
}

fn age(now: Instant, then: Instant) -> u64 {
    now.0.saturating_sub(then.0)
}

/// `age_ns` before `now`; the origin when that is before this process's clock began.
fn ago(now: Instant, age_ns: u64) -> Instant {
    Instant(now.0.saturating_sub(age_ns))
}

impl Balancer {
    /// What this balancer knows at `now`, for the process that takes over.
    pub fn export(&mut self, now: Instant) -> ClusterHandoff {
        let (order, smoothed) = self.algo.exported();
        let spec = self.spec.clone();
        let members = spec
            .members
            .iter()
            .zip(&self.states)
            .enumerate()
            .map(|(i, (m, st))| {
                let (estimate, stamp) = st.load.ewma.last();
                MemberHandoff {
                    name: m.name.clone(),
                    configured_admin: m.admin,
                    admin: st.admin,
                    admin_by: st.admin_by.clone(),
                    healthy: st.healthy,
                    health_by: st.health_by.clone(),
                    health_age_ns: age(now, st.health_changed),
                    probe_streak: st.probe_streak,
                    ejected_for_ns: st
                        .ejected_until
                        .filter(|&until| until > now)
                        .map(|until| age(until, now)),
                    ejections: st.ejections,
                    slow_start_age_ns: st.up_since.map(|t| age(now, t)),
                    ewma: (estimate, age(now, stamp)),
                    agent: st.load.agent.map(|r| AgentHandoff {
                        cpu_used: r.cpu_used,
                        mem_free: r.mem_free,
                        sessions: r.sessions,
                        seq: r.seq,
                        age_ns: age(now, r.at),
                    }),
                    probe_rtt_ns: st.load.probe_rtt.map(|d| d.as_nanos() as u64),
                    smoothed_rtt_ns: smoothed.get(i).copied().flatten(),
                    completed: st.load.completed,
                    consecutive_failures: st.load.consecutive_failures,
                }
            })
            .collect();
        let order = order
            .iter()
            .filter_map(|&m| spec.members.get(m as usize).map(|s| s.name.clone()))
            .collect();
        ClusterHandoff { members, seq: self.seq, budget: self.budget.banked(now), order }
    }

    /// Takes over what a previous process knew at its hand-off, which is `now` here: every
    /// member of this cluster that the previous process knew by the same name gets its state
    /// (its configured admin state wins if this configuration changed it); the others keep
    /// theirs. Requests in flight and sessions stay this process's own.
    pub fn import(&mut self, from: &ClusterHandoff, now: Instant) {
        let index: HashMap<&str, usize> =
            self.spec.members.iter().enumerate().map(|(i, m)| (m.name.as_str(), i)).collect();
        let spec = self.spec.clone();
        let mut smoothed: Vec<Option<f64>> = Vec::new();
        for h in &from.members {
            let Some(&i) = index.get(h.name.as_str()) else { continue };
            let st = &mut self.states[i];
            if spec.members[i].admin == h.configured_admin {
                st.admin = h.admin;
                st.admin_by = h.admin_by.clone();
            }
            st.healthy = h.healthy;
            st.health_by = h.health_by.clone();
            st.health_changed = ago(now, h.health_age_ns);
            st.probe_streak = h.probe_streak;
            st.ejected_until = h.ejected_for_ns.map(|left| Instant(now.0.saturating_add(left)));
            st.ejections = h.ejections;
            st.up_since = h.slow_start_age_ns.map(|a| ago(now, a));
            st.load.ewma = PeakEwma::restore(h.ewma.0, ago(now, h.ewma.1));
            st.load.agent = h.agent.map(|a| AgentReport {
                cpu_used: a.cpu_used,
                mem_free: a.mem_free,
                sessions: a.sessions,
                seq: a.seq,
                at: ago(now, a.age_ns),
            });
            st.load.probe_rtt = h.probe_rtt_ns.map(Duration::from_nanos);
            st.load.completed = h.completed;
            st.load.consecutive_failures = h.consecutive_failures;
            if let Some(rtt) = h.smoothed_rtt_ns {
                if smoothed.len() <= i {
                    smoothed.resize(i + 1, None);
                }
                smoothed[i] = Some(rtt);
            }
        }
        let order =
            from.order.iter().filter_map(|n| index.get(n.as_str()).map(|&i| i as u32)).collect();
        self.algo = AlgoState::imported(spec.policy.algorithm, (order, smoothed), Some);
        self.seq = self.seq.max(from.seq);
        self.budget.restore(from.budget, now);
        self.invalidate();
    }
}
