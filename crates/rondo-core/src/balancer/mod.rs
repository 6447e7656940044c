//! [`Balancer`]: one cluster's run-time state and its picker. The router, the naming service and
//! the client library each hold one per cluster (behind whatever lock they like) and drive it
//! with the same calls: [`Balancer::pick`], [`Balancer::begin_request`] /
//! [`Balancer::end_request`], session open/close, health, admin and agent updates.
//!
//! A pick runs in three stages, the same for every algorithm:
//! 1. **eligibility** (`candidates.rs`): active, healthy members; the caller's locality group
//!    while it has one; every active member in panic mode. Cached until something changes.
//! 2. **choice** (`pickers.rs`; the latency-aware `p2c-ewma` and `adaptive` in `delay.rs`): the
//!    cluster's algorithm over the candidates.
//! 3. **exclusion and slow start**: a member already tried for this request, or held back by its
//!    slow-start ramp, gives way to the next eligible member.

mod candidates;
mod delay;
mod external;
pub mod handoff;
mod hashing;
mod least;
mod pickers;
mod request;
mod shadow_picks;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::RetryBudget;
use crate::explain::{CandidateInfo, Decision, Explanation, Scope, Why};
use crate::load::AgentReport;
use crate::member::{Ejection, FailureKind, MemberState, Outcome, ProbeFailure};
use crate::model::{Actor, AdminState, Algorithm, ClusterSpec};
use crate::rng::Entropy;
use crate::time::Instant;

pub use crate::ineligible::Ineligible;
pub use crate::member::health_reason;
use candidates::Candidates;
pub use candidates::{Eligibility, own_reason};
pub use delay::{ADAPTIVE_EXPLORE_ONE_IN, ADAPTIVE_SCAN, ADAPTIVE_STALL};
use pickers::{AlgoState, OwnPicks};
pub use request::{PickError, PickRequest};
use shadow_picks::Shadow;

pub(crate) const NONE: u32 = u32::MAX;

/// One cluster's members, their run-time state, and the picker over them.
#[derive(Debug)]
pub struct Balancer {
    spec: Arc<ClusterSpec>,
    states: Vec<MemberState>,
    /// Bumped by every change that can alter eligibility.
    generation: u64,
    cands: Candidates,
    algo: AlgoState,
    /// Picks made so far.
    seq: u64,
    /// Sum of every member's sessions + in-flight (for bounded-load caps).
    total_active: u64,
    /// Sum of every member's requests in flight, kept only while the cluster has a
    /// `max_requests` (a balancer is made anew when its spec changes).
    in_flight: u64,
    /// Rotating: next context.
    next_context: u32,
    /// Retries allowed on this cluster.
    budget: RetryBudget,
    /// A candidate algorithm evaluated beside the live one ([`Balancer::set_shadow`]).
    shadow: Option<Box<Shadow>>,
}

impl Balancer {
    /// A balancer for a cluster coming up with the process: members start healthy at full
    /// weight (no slow start at boot, as in HAProxy).
    pub fn new(spec: Arc<ClusterSpec>, now: Instant) -> Self {
        let states =
            spec.members.iter().map(|m| MemberState::new(m.admin, &spec.policy, now)).collect();
        Self::with_states(spec, states)
    }

    /// A balancer for a new version of a cluster that keeps the state of every member surviving
    /// from `old` (matched by name): health, load, EWMA, sessions, admin changes by operators.
    /// New members join with slow start; members whose configured admin state changed take it.
    pub fn carry_over(spec: Arc<ClusterSpec>, old: &Balancer, now: Instant) -> Self {
        Self::carry_over_pausing(spec, old, now, &mut |_| {})
    }

    /// [`Balancer::carry_over`], calling `pause` with each member's index as it goes (twice
    /// per member: the old list, then the new one), so that a caller composing a big cluster
    /// can let other work run between members (the runtime gives up its CPU every few hundred).
    pub fn carry_over_pausing(
        spec: Arc<ClusterSpec>,
        old: &Balancer,
        now: Instant,
        pause: &mut dyn FnMut(usize),
    ) -> Self {
        // By name, in one pass each way (a view swap of a 10,000-member cluster stays linear).
        let previous: HashMap<&str, usize> = old
            .spec
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                pause(i);
                (m.name.as_str(), i)
            })
            .collect();
        let states = spec
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (pause(i), m).1)
            .map(|m| match previous.get(m.name.as_str()) {
                Some(&i) => {
                    let mut st = old.states[i].clone();
                    if old.spec.members[i].admin != m.admin {
                        st.admin = m.admin;
                        st.admin_by = Actor::Config;
                    }
                    st
                }
                None => {
                    let mut st = MemberState::new(m.admin, &spec.policy, now);
                    st.up_since = Some(now);
                    st
                }
            })
            .collect();
        let mut b = Self::with_states(spec, states);
        // Order state that outlives a view: `rotating`'s list, `response-time`'s round trips.
        if matches!(b.spec.policy.algorithm, Algorithm::Rotating | Algorithm::ResponseTime) {
            let index = b.index_by_name();
            b.algo = AlgoState::carry_over(b.spec.policy.algorithm, &old.algo, |m| {
                index.get(old.spec.members[m as usize].name.as_str()).copied()
            });
        }
        b.seq = old.seq;
        b.next_context = old.next_context;
        if old.spec.policy.retry == b.spec.policy.retry {
            b.budget = old.budget.clone();
        }
        if let Some(sh) = old.shadow.as_deref() {
            b.shadow = Some(Box::new(b.carry_shadow(sh, old, &previous, now)));
        }
        b
    }

    /// Member name -> index in this version of the cluster, to carry order state over by name.
    fn index_by_name(&self) -> HashMap<&str, u32> {
        self.spec.members.iter().enumerate().map(|(i, m)| (m.name.as_str(), i as u32)).collect()
    }

    fn with_states(spec: Arc<ClusterSpec>, states: Vec<MemberState>) -> Self {
        let total_active = states.iter().map(|s| s.load.active()).sum();
        let in_flight = states.iter().map(|s| u64::from(s.load.in_flight)).sum();
        let algo = AlgoState::new(spec.policy.algorithm);
        let retry = &spec.policy.retry;
        let budget =
            RetryBudget::new(retry.budget_percent, retry.budget_min_per_sec, Instant::ZERO);
        Balancer {
            budget,
            spec,
            states,
            generation: 1,
            cands: Candidates::default(),
            algo,
            seq: 0,
            total_active,
            in_flight,
            next_context: 0,
            shadow: None,
        }
    }

    /// The cluster this balancer serves.
    pub fn spec(&self) -> &Arc<ClusterSpec> {
        &self.spec
    }

    /// Every member's state, parallel to `spec().members`.
    pub fn states(&self) -> &[MemberState] {
        &self.states
    }

    /// A member's index by name.
    pub fn member_index(&self, name: &str) -> Option<usize> {
        self.spec.members.iter().position(|m| m.name == name)
    }

    /// Picks a member for a new request or session.
    pub fn pick(
        &mut self,
        req: &PickRequest<'_>,
        rng: &mut dyn Entropy,
    ) -> Result<Decision, PickError> {
        self.refresh(req.now, req.group);
        if self.cands.slots.is_empty() {
            return Err(self.no_eligible(req.now));
        }
        self.under_max_requests()?;
        let context = match req.context {
            Some(c) => c,
            None if self.spec.policy.algorithm == Algorithm::Rotating => self.new_context(),
            None => 0,
        };
        let (slot, why) = self.algo.pick(
            &self.cands,
            &self.states,
            &self.spec.policy,
            self.total_active,
            req,
            context,
            rng,
            OwnPicks,
        );
        let member = self.cands.slots[slot as usize] as usize;
        let cap = self.spec.policy.limits.max_requests_per_member;
        let states = &self.states;
        let full = |m: usize| cap.is_some_and(|c| states[m].load.in_flight >= c);
        let excluded = req.exclude.contains(&member) || full(member);
        let held_back = !excluded
            && slow_start_holds_back(
                self.spec.policy.algorithm,
                &self.states[member],
                &self.spec.policy,
                req.now,
                rng,
            );
        let (member, why) = if excluded || held_back {
            let next = self.algo.next_after(
                &self.cands,
                &self.states,
                slot,
                context,
                &|m| req.exclude.contains(&m) || full(m),
                OwnPicks,
            );
            match next {
                Some(other) => (other, Why::Failover { from: member, slow_start: held_back }),
                None if held_back => (member, why),
                None if cap.is_some() && !req.exclude.contains(&member) => {
                    return Err(PickError::AtMaxPerMember {
                        cluster: self.spec.name.clone(),
                        limit: cap.unwrap_or_default(),
                    });
                }
                None => {
                    return Err(PickError::AllTried {
                        cluster: self.spec.name.clone(),
                        tried: req.exclude.len(),
                    });
                }
            }
        } else {
            (member, why)
        };
        self.seq += 1;
        self.states[member].last_pick = self.seq;
        if self.states[member].load.in_flight == 0 {
            self.states[member].load.latency.start_idle(req.now);
        }
        self.algo.picked(&self.cands, member);
        Ok(Decision {
            member,
            algorithm: self.spec.policy.algorithm,
            scope: self.cands.scope.clone(),
            why,
        })
    }

    /// A request (not a retry) is being placed on this cluster: it adds to the retry budget.
    pub fn note_request(&mut self, now: Instant) {
        self.budget.deposit(now);
    }

    /// Whether the retry budget allows one more retry now (and takes it if so).
    pub fn retry_allowed(&mut self, now: Instant) -> bool {
        self.budget.try_withdraw(now)
    }

    /// Starts a new `rotating` context (GlassFish: each new InitialContext rotates the list).
    pub fn new_context(&mut self) -> u32 {
        let c = self.next_context;
        self.next_context = self.next_context.wrapping_add(1);
        c
    }

    /// Whether a sticky session may stay on `member`.
    pub fn can_keep_session(&self, member: usize, now: Instant) -> bool {
        self.states.get(member).is_some_and(|s| s.can_keep_session(now, &self.spec.policy))
    }

    /// After a real pick for `req` that chose `live` (`None`: it failed; the shadow is asked
    /// all the same, so that its algorithm state follows every request the live one saw), and
    /// before [`Balancer::begin_request`], asks the shadow, if one is set, what it would have
    /// picked for the same request, and records both; `rng` must be a generator of the
    /// shadow's own (drawing from the live picks' generator would change what they pick).
    /// Returns the shadow's member (`None`: no shadow, or it found none). Without a shadow this
    /// is one branch.
    #[inline]
    pub fn shadow_pick(
        &mut self,
        req: &PickRequest<'_>,
        live: Option<usize>,
        rng: &mut dyn Entropy,
    ) -> Option<usize> {
        if self.shadow.is_some() { self.shadow_pick_inner(req, live, rng) } else { None }
    }

    /// A member's sessions or in-flight count changed: the algorithm's indexes follow, and the
    /// shadow's. Without a shadow, one branch and the live update as before (each side ends
    /// in its own call, so the live path needs no stack frame for the shadow's).
    #[inline]
    fn load_changed(&mut self, member: usize) {
        if self.shadow.is_some() {
            return self.load_changed_shadowed(member);
        }
        self.algo.load_changed(&self.cands, &self.states, member);
    }

    fn no_eligible(&self, now: Instant) -> PickError {
        let policy = &self.spec.policy;
        let active: Vec<&MemberState> =
            self.states.iter().filter(|s| s.admin == AdminState::Active).collect();
        PickError::NoEligible {
            cluster: self.spec.name.clone(),
            members: self.states.len(),
            active: active.len(),
            healthy: active.iter().filter(|s| s.is_healthy(now, policy)).count(),
        }
    }

    fn refresh(&mut self, now: Instant, group: Option<&str>) {
        if self.cands.is_current(self.generation, now, group) {
            return;
        }
        let fresh = Candidates::build(&self.spec, &self.states, self.generation, now, group);
        let same_members =
            fresh.slots == self.cands.slots && fresh.eff_weight == self.cands.eff_weight;
        self.cands = fresh;
        if !same_members || !self.algo.is_built() {
            self.algo.rebuild(&self.spec, &self.cands, &self.states);
        }
        if let Some(sh) = self.shadow.as_deref_mut()
            && (!same_members || !sh.algo.is_built())
        {
            sh.algo.rebuild(&self.spec, &self.cands, &self.states);
        }
    }

    fn invalidate(&mut self) {
        self.generation += 1;
    }

    /// `Err` when the cluster has its `max_requests` in flight (a new request must be
    /// refused, whichever member it would go to).
    pub fn under_max_requests(&self) -> Result<(), PickError> {
        match self.spec.policy.limits.max_requests {
            Some(limit) if self.in_flight >= u64::from(limit) => {
                Err(PickError::AtMaxRequests { cluster: self.spec.name.clone(), limit })
            }
            _ => Ok(()),
        }
    }

    /// A request was sent to `member`.
    pub fn begin_request(&mut self, member: usize) {
        self.states[member].load.in_flight += 1;
        if self.spec.policy.limits.max_requests.is_some() {
            self.in_flight += 1;
        }
        self.total_active += 1;
        self.load_changed(member);
    }

    /// A request to `member` ended. Returns an ejection when passive outlier detection just
    /// ejected the member.
    pub fn end_request(
        &mut self,
        member: usize,
        now: Instant,
        outcome: Outcome,
    ) -> Option<Ejection> {
        let policy = &self.spec.policy;
        let st = &mut self.states[member];
        if st.load.in_flight > 0 && policy.limits.max_requests.is_some() {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        st.load.in_flight = st.load.in_flight.saturating_sub(1);
        self.total_active = self.total_active.saturating_sub(1);
        st.load.completed += 1;
        let mut ejection = None;
        match outcome {
            Outcome::Success { latency } => {
                st.load.ewma.observe(latency, now, policy.ewma.decay);
                st.load.latency.observe(latency, now);
                st.load.consecutive_failures = 0;
                if st.ejected_until.is_some_and(|u| now >= u) {
                    st.ejected_until = None;
                    st.ejections = 0;
                }
            }
            Outcome::Failure { kind, .. } => {
                st.load.ewma.observe_failure(now, policy.ewma.decay, policy.ewma.failure_penalty);
                let counts = kind != FailureKind::Status5xx || policy.outlier.count_5xx;
                if counts {
                    st.load.consecutive_failures += 1;
                }
                let od = &policy.outlier;
                if counts
                    && od.consecutive_failures > 0
                    && st.load.consecutive_failures >= od.consecutive_failures
                    && st.ejected_until.is_none_or(|u| now >= u)
                {
                    ejection = self.try_eject(member, now);
                }
            }
            Outcome::Cancelled => {}
        }
        self.algo.load_changed(&self.cands, &self.states, member);
        if self.shadow.is_some() {
            self.shadow_ended(member, now, outcome);
        }
        ejection
    }

    /// Ejects `member` unless that would push the ejected share over the cap.
    fn try_eject(&mut self, member: usize, now: Instant) -> Option<Ejection> {
        let od = &self.spec.policy.outlier;
        let ejected =
            self.states.iter().filter(|s| s.ejected_until.is_some_and(|u| now < u)).count();
        if (ejected + 1) * 100 > usize::from(od.max_ejected_percent) * self.states.len() {
            return None;
        }
        let st = &mut self.states[member];
        st.ejections += 1;
        let time = od.base_ejection.saturating_mul(st.ejections).min(od.max_ejection);
        let until = now + time;
        st.ejected_until = Some(until);
        st.up_since = Some(until);
        st.load.consecutive_failures = 0;
        let count = st.ejections;
        self.invalidate();
        Some(Ejection { member, until, count })
    }

    /// A session (sticky HTTP session, TCP connection) was pinned to `member`.
    pub fn open_session(&mut self, member: usize) {
        self.states[member].load.sessions += 1;
        self.total_active += 1;
        self.load_changed(member);
    }

    /// A session on `member` ended.
    pub fn close_session(&mut self, member: usize) {
        let s = &mut self.states[member].load.sessions;
        *s = s.saturating_sub(1);
        self.total_active = self.total_active.saturating_sub(1);
        self.load_changed(member);
    }

    /// Health checks (or the registry) say `member` is up or down. Returns whether it changed.
    /// Coming back up lifts a passive ejection.
    pub fn set_health(&mut self, member: usize, healthy: bool, by: Actor, now: Instant) -> bool {
        let st = &mut self.states[member];
        if st.healthy == healthy {
            return false;
        }
        st.healthy = healthy;
        st.health_by = by;
        st.health_changed = now;
        if healthy {
            st.up_since = Some(now);
            // The member went down and came back (a restart): a passive ejection from before
            // it went down is stale. Steady passing probes do not lift an ejection, though: a
            // member can pass `/health` while failing real requests.
            st.ejected_until = None;
            st.ejections = 0;
            st.load.consecutive_failures = 0;
        }
        self.generation += 1;
        true
    }

    /// The operator (or config) changes a member's admin state.
    pub fn set_admin(&mut self, member: usize, admin: AdminState, by: Actor) {
        let st = &mut self.states[member];
        st.admin_by = by;
        if st.admin != admin {
            st.admin = admin;
            self.invalidate();
        }
    }

    /// A load agent's heartbeat arrived.
    pub fn report_agent(&mut self, member: usize, report: AgentReport) {
        let timeout = self.spec.policy.agent.timeout;
        let st = &mut self.states[member];
        let was_fresh = st.load.agent.is_some_and(|r| r.is_fresh(report.at, timeout));
        st.load.agent = Some(report);
        if !was_fresh {
            st.up_since = Some(report.at);
            self.generation += 1;
        }
    }

    /// Each member's [`Eligibility`] at `now` for a caller in `group`: exactly the candidate set
    /// the next pick would use (same rules, same cache), with the reason each other member is
    /// out, and whether the cluster is in panic mode.
    pub fn eligibility(&mut self, now: Instant, group: Option<&str>) -> (Vec<Eligibility>, bool) {
        self.refresh(now, group);
        let panic = matches!(self.cands.scope, Scope::Panic { .. });
        (self.cands.eligibility(&self.spec, &self.states, now), panic)
    }

    /// One health check of `member` passed or failed: returns how many in a row now passed, or
    /// failed (the probe's `rise` / `fall` counters, kept with the member's state so that a view
    /// swap or a hand-off to a new process keeps them).
    pub fn count_probe(&mut self, member: usize, passed: bool) -> u32 {
        let Some(st) = self.states.get_mut(member) else { return 0 };
        let (ok, failed) = &mut st.probe_streak;
        if passed {
            *failed = 0;
            *ok = ok.saturating_add(1);
            *ok
        } else {
            *ok = 0;
            *failed = failed.saturating_add(1);
            *failed
        }
    }

    /// A health check of `member` failed for `why` at `now` (shown by status pages).
    pub fn note_probe_failure(&mut self, member: usize, why: ProbeFailure, now: Instant) {
        if let Some(st) = self.states.get_mut(member) {
            st.last_probe_failure = Some((why, now));
        }
    }

    /// A completed probe round (CLB): each member's round trip, `None` for a failed probe. The
    /// response-time table is re-ranked fastest first and the next pick starts at its top
    /// (`response-time-clb` walks it round robin; `response-time` shares it by inverse round trip).
    pub fn record_probe_round(&mut self, results: &[(usize, Option<Duration>)]) {
        for &(member, rtt) in results {
            if let Some(st) = self.states.get_mut(member) {
                st.load.probe_rtt = rtt;
            }
        }
        self.algo.rerank(&self.states);
        if let Some(sh) = self.shadow.as_deref_mut() {
            sh.algo.rerank(&self.states);
        }
    }

    /// Expands a decision with every current candidate's numbers.
    pub fn explain(
        &mut self,
        decision: &Decision,
        now: Instant,
        group: Option<&str>,
    ) -> Explanation {
        self.refresh(now, group);
        let policy = &self.spec.policy;
        let candidates = self
            .cands
            .slots
            .iter()
            .zip(&self.cands.eff_weight)
            .map(|(&m, &w)| {
                let st = &self.states[m as usize];
                let fresh = st.load.agent.filter(|r| r.is_fresh(now, policy.agent.timeout));
                CandidateInfo {
                    name: self.spec.members[m as usize].name.clone(),
                    weight: self.spec.members[m as usize].weight,
                    effective_weight: w,
                    in_flight: st.load.in_flight,
                    sessions: st.load.sessions,
                    ewma_us: (st.load.ewma.get_at(now, policy.ewma.decay) / 1000.0) as u64,
                    probe_rtt_us: st.load.probe_rtt.map(|d| d.as_micros() as u64),
                    cpu_percent: fresh.map(|r| r.cpu_used * 100.0),
                    free_mib: fresh.map(|r| r.mem_free >> 20),
                }
            })
            .collect();
        let chosen =
            self.spec.members.get(decision.member).map(|m| m.name.clone()).unwrap_or_default();
        let summary = format!(
            "{} chose {chosen} among {}: {}",
            decision.algorithm, decision.scope, decision.why
        );
        Explanation { decision: decision.clone(), chosen, candidates, summary }
    }

    /// The scope of the current candidate set (for status pages).
    pub fn scope(&mut self, now: Instant, group: Option<&str>) -> Scope {
        self.refresh(now, group);
        self.cands.scope.clone()
    }
}

/// Whether slow start holds `member` back from this pick under `algorithm`: only algorithms
/// that ignore weights are gated (a draw against the ramp's factor); weight-aware ones ramp the
/// weight itself.
fn slow_start_holds_back(
    algorithm: Algorithm,
    member: &MemberState,
    policy: &crate::model::Policy,
    now: Instant,
    rng: &mut dyn Entropy,
) -> bool {
    let gated = matches!(
        algorithm,
        Algorithm::RoundRobin
            | Algorithm::Random
            | Algorithm::Rotating
            | Algorithm::ResponseTime
            | Algorithm::ResponseTimeClb
    );
    if !gated {
        return false;
    }
    let (factor, _) = member.ramp(now, policy);
    factor < 1.0 && rng.unit() >= factor
}
