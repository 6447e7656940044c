//! Eligibility, shared by every picker. Who may take a new request or session:
//!
//! - never a disabled member, and no draining member (draining members keep their sticky
//!   sessions, see [`crate::MemberState::can_keep_session`], but get nothing new);
//! - only healthy members (probes, passive ejection, agent heartbeats), unless the cluster is in
//!   **panic**: when fewer than `panic_threshold_percent` of the active members are healthy, every
//!   active member is a candidate again. We chose Envoy's behaviour over "keep sending to the
//!   survivors" because health checks fail for overload too: when most of a cluster looks down,
//!   piling all traffic on the few that still answer is how a partial outage becomes a total one.
//!   Retries and failover then absorb what the unhealthy ones drop;
//! - with a locality group given and `prefer_local` on, the healthy members of that group while
//!   it has at least one; otherwise healthy members of every group (spill).
//!
//! The result is cached and recomputed only when the balancer's generation changes or a
//! time-based transition (ejection end, agent silence, slow-start step) comes due.
//!
//! [`Ineligible`] names the rule that keeps a member out, and [`Eligibility`] (from
//! [`crate::Balancer::eligibility`]) says, per member, whether it is a candidate now and why
//! not: status pages, `rondo ctl`, metrics and the naming service all read it from here, so no
//! view can disagree with the picks about who gets traffic.

use crate::explain::Scope;
use crate::ineligible::Ineligible;
use crate::member::{MemberState, health_reason};
use crate::model::{AdminState, ClusterSpec, Policy};
use crate::time::Instant;

use super::NONE;

/// Whether one member is a candidate for new requests now, and what keeps it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eligibility {
    /// A candidate for the next pick (before per-request exclusions and slow start).
    pub eligible: bool,
    /// What is wrong with it: the reason it is not eligible, or, while the cluster is in panic
    /// mode, the health reason it is eligible despite. `None` for a member with nothing wrong.
    pub reason: Option<Ineligible>,
}

/// The member's own reason to stay out at `now` (admin state first, then health), before the
/// cluster-wide rules (panic, locality).
pub fn own_reason(st: &MemberState, now: Instant, policy: &Policy) -> Option<Ineligible> {
    match st.admin {
        AdminState::Disabled => Some(Ineligible::Disabled),
        AdminState::Draining => Some(Ineligible::Draining),
        AdminState::Active => health_reason(st, now, policy),
    }
}

#[derive(Debug, Default)]
pub(crate) struct Candidates {
    generation: u64,
    valid_until: Instant,
    group: Option<String>,
    pub(crate) scope: Scope,
    /// Member indexes of the candidates, in member order.
    pub(crate) slots: Vec<u32>,
    /// Member index -> slot, or `NONE`.
    pub(crate) slot_of: Vec<u32>,
    /// Effective (slow-start) weight per slot.
    pub(crate) eff_weight: Vec<u64>,
    /// Sum of `eff_weight`.
    pub(crate) total_weight: u64,
}

impl Candidates {
    pub(crate) fn is_current(&self, generation: u64, now: Instant, group: Option<&str>) -> bool {
        self.generation == generation && now < self.valid_until && self.group.as_deref() == group
    }

    /// Each member's [`Eligibility`] under these candidates (built for `now`).
    pub(crate) fn eligibility(
        &self,
        spec: &ClusterSpec,
        states: &[MemberState],
        now: Instant,
    ) -> Vec<Eligibility> {
        states
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let eligible = self.slot_of.get(i).is_some_and(|&s| s != NONE);
                let own = own_reason(st, now, &spec.policy);
                // Out although nothing is wrong with it: only locality does that.
                let reason =
                    if eligible || own.is_some() { own } else { Some(Ineligible::OtherGroup) };
                Eligibility { eligible, reason }
            })
            .collect()
    }

    pub(crate) fn build(
        spec: &ClusterSpec,
        states: &[MemberState],
        generation: u64,
        now: Instant,
        group: Option<&str>,
    ) -> Self {
        let policy = &spec.policy;
        let mut valid_until = Instant::NEVER;
        let mut active = 0usize;
        let mut healthy_active = 0usize;
        let mut local_healthy = 0usize;
        for (m, st) in spec.members.iter().zip(states) {
            if let Some(until) = st.ejected_until
                && until > now
            {
                valid_until = valid_until.min(until);
            }
            if let Some(r) = st.load.agent
                && r.is_fresh(now, policy.agent.timeout)
            {
                valid_until = valid_until
                    .min(r.at + policy.agent.timeout + std::time::Duration::from_nanos(1));
            }
            if st.admin != AdminState::Active {
                continue;
            }
            active += 1;
            if health_reason(st, now, policy).is_none() {
                healthy_active += 1;
                if group.is_some() && m.group.as_deref() == group {
                    local_healthy += 1;
                }
            }
        }
        let threshold = usize::from(policy.panic_threshold_percent);
        let panic = threshold > 0 && active > 0 && healthy_active * 100 < threshold * active;
        let local = !panic && policy.locality.prefer_local && local_healthy > 0;
        let scope = if panic {
            Scope::Panic { healthy: healthy_active, active }
        } else if local {
            Scope::Local
        } else {
            Scope::All
        };

        let mut slots = Vec::with_capacity(active);
        let mut slot_of = vec![NONE; states.len()];
        let mut eff_weight = Vec::with_capacity(active);
        for (i, (m, st)) in spec.members.iter().zip(states).enumerate() {
            let eligible = match own_reason(st, now, policy) {
                None => true,
                Some(why) => panic && why.is_health(),
            } && (!local || m.group.as_deref() == group);
            if !eligible {
                continue;
            }
            let (factor, next) = st.ramp(now, policy);
            if let Some(next) = next {
                valid_until = valid_until.min(next);
            }
            let w = ((f64::from(m.weight) * factor).round() as u64).max(1);
            slot_of[i] = slots.len() as u32;
            slots.push(i as u32);
            eff_weight.push(w);
        }
        let total_weight = eff_weight.iter().sum();
        Candidates {
            generation,
            valid_until,
            group: group.map(str::to_owned),
            scope,
            slots,
            slot_of,
            eff_weight,
            total_weight,
        }
    }
}
