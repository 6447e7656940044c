//! The algorithms. Each chooses a slot among the candidates (see [`super::candidates`]); none
//! looks at eligibility itself, so "no picker returns an ineligible member" holds by
//! construction and is checked by property tests for every algorithm.

use std::cmp::Ordering;

use crate::explain::Why;
use crate::load::inverse_nanos;
use crate::member::MemberState;
use crate::model::{Algorithm, ClusterSpec, Policy};
use crate::rng::Entropy;
use crate::tree::MinTree;

use super::candidates::Candidates;
use super::delay::{adaptive, p2c};
use super::hashing::Table;
use super::least::{LeastIndex, gcd};
use super::{NONE, PickRequest};

/// Fixed-point scale of the smooth-weighted phases.
const PHASE_SCALE: u64 = 1 << 16;
/// `weighted` precomputes its whole cycle when the gcd-reduced weights sum to at most this many
/// picks (4 MiB of schedule); beyond it, it walks the tree live.
const SCHEDULE_MAX: u64 = 1 << 20;

/// Which picks break a tie between equally loaded members (the least recently picked wins): the
/// balancer's own, kept in each member's state, or a shadow's ([`super::Balancer::shadow_pick`]),
/// which keeps its own so that its choices never read the live picks'.
pub(crate) trait Recency: Copy {
    /// The sequence number of the last pick of `member`, whose state is `st` (0: never).
    fn last_pick(&self, st: &MemberState, member: usize) -> u64;
}

/// The balancer's own picks (`MemberState::last_pick`).
#[derive(Clone, Copy)]
pub(crate) struct OwnPicks;

impl Recency for OwnPicks {
    #[inline(always)]
    fn last_pick(&self, st: &MemberState, _: usize) -> u64 {
        st.last_pick
    }
}

/// A shadow's picks, by member index.
impl Recency for &[u64] {
    #[inline]
    fn last_pick(&self, _: &MemberState, member: usize) -> u64 {
        self.get(member).copied().unwrap_or(0)
    }
}

#[derive(Debug)]
pub(crate) struct AlgoState {
    built: bool,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    RoundRobin {
        cursor: usize,
    },
    Random,
    /// Smooth weighted round robin as a priority order: slot `s`'s next turn falls at virtual
    /// time `(picks_s + phase_s) / weight_s` with `phase_s` in `(0, 1]`. In every unit of virtual
    /// time each member gets exactly `weight_s` turns, so each cycle of `sum(weights)` picks
    /// honours the weights exactly, and turns are spread evenly within the cycle (no bursts):
    /// nginx's smooth WRR property, but O(log n) per pick instead of nginx's O(n) scan.
    /// Phases differ per member (golden-ratio spacing) so equal-weight members interleave
    /// instead of all falling due at once. The cycle is precomputed into `schedule` when it is
    /// short enough, making a pick one array read.
    Weighted {
        tree: MinTree<WeightedKey>,
        schedule: Vec<u32>,
        cursor: usize,
    },
    Rotating {
        order: Vec<u32>,
    },
    /// CLB's ranked table shared by the probe round trips: smooth weighted round robin (nginx)
    /// over the members of the latest probe round with `share[k]` inversely proportional to
    /// `ranked[k]`'s round trip relative to the round's median (members faster than
    /// [`RESPONSE_TIME_TOLERANCE`] x the median all count as the median), so a member ten times
    /// slower gets a tenth of a fast one's picks however many picks a round sees. `current` restarts at zero each round, so the
    /// round's first pick is the fastest member; ties go to the faster rank. The round trips
    /// ranked and weighed are each member's probes smoothed over rounds (`smoothed`, by member,
    /// ns): one probe is one service time, and its inverse is so noisy (a lucky 0.3 ms probe
    /// against a 7 ms mean) that raw weights would pile a round's traffic onto whoever was
    /// lucky.
    ResponseTime {
        smoothed: Vec<Option<f64>>,
        ranked: Vec<u32>,
        share: Vec<i64>,
        current: Vec<i64>,
        rr: usize,
    },
    /// CLB exactly: round robin down the ranked table, back to its top after each round.
    ResponseTimeClb {
        ranked: Vec<u32>,
        cursor: usize,
        rr: usize,
    },
    /// Fewest active per unit of weight; among equals, a weighted turn (`(picks + 1) / weight`)
    /// so that sequential traffic (everyone at zero) still follows the weights.
    LeastSessions {
        index: LeastIndex,
    },
    LeastCpu,
    MostFreeMemory,
    P2c {
        inv_decay: f64,
    },
    Adaptive {
        inv_decay: f64,
    },
    Hash {
        table: Option<Table>,
    },
}

impl AlgoState {
    pub(crate) fn new(algorithm: Algorithm) -> Self {
        let kind = match algorithm {
            Algorithm::RoundRobin => Kind::RoundRobin { cursor: 0 },
            Algorithm::Random => Kind::Random,
            Algorithm::Weighted => {
                Kind::Weighted { tree: MinTree::default(), schedule: Vec::new(), cursor: 0 }
            }
            Algorithm::Rotating => Kind::Rotating { order: Vec::new() },
            Algorithm::ResponseTime => Kind::ResponseTime {
                smoothed: Vec::new(),
                ranked: Vec::new(),
                share: Vec::new(),
                current: Vec::new(),
                rr: 0,
            },
            Algorithm::ResponseTimeClb => {
                Kind::ResponseTimeClb { ranked: Vec::new(), cursor: 0, rr: 0 }
            }
            Algorithm::LeastSessions => Kind::LeastSessions { index: LeastIndex::default() },
            Algorithm::LeastCpu => Kind::LeastCpu,
            Algorithm::MostFreeMemory => Kind::MostFreeMemory,
            Algorithm::P2cEwma => Kind::P2c { inv_decay: 0.0 },
            Algorithm::Adaptive => Kind::Adaptive { inv_decay: 0.0 },
            Algorithm::Hash => Kind::Hash { table: None },
        };
        AlgoState { built: false, kind }
    }

    pub(crate) fn is_built(&self) -> bool {
        self.built
    }

    /// Rebuilds indexes over a changed candidate set.
    pub(crate) fn rebuild(
        &mut self,
        spec: &ClusterSpec,
        cands: &Candidates,
        states: &[MemberState],
    ) {
        self.built = true;
        match &mut self.kind {
            Kind::Weighted { tree, schedule, cursor } => {
                let divisor = cands.eff_weight.iter().copied().fold(0, gcd).max(1);
                let keys = cands
                    .slots
                    .iter()
                    .zip(&cands.eff_weight)
                    .map(|(&m, &w)| WeightedKey {
                        // Golden-ratio spacing of the phases over (0, 1].
                        next: (u64::from(m) + 1).wrapping_mul(40_503) % PHASE_SCALE + 1,
                        weight: w / divisor,
                    })
                    .collect();
                *tree = MinTree::build(keys, WeightedKey::less);
                *cursor = 0;
                schedule.clear();
                let cycle = cands.total_weight / divisor;
                if cycle <= SCHEDULE_MAX {
                    schedule.reserve(cycle as usize);
                    for _ in 0..cycle {
                        let slot = tree.min().unwrap_or(0);
                        schedule.push(slot);
                        weighted_advance(tree, slot);
                    }
                }
            }
            Kind::LeastSessions { index } => *index = LeastIndex::build(cands, states),
            Kind::Hash { table } => *table = Some(Table::build(spec, cands)),
            Kind::P2c { inv_decay } | Kind::Adaptive { inv_decay } => {
                *inv_decay = inverse_nanos(spec.policy.ewma.decay);
            }
            _ => {}
        }
    }

    /// The algorithm's choice among the candidates (non-empty).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pick<R: Recency>(
        &mut self,
        cands: &Candidates,
        states: &[MemberState],
        policy: &Policy,
        total_active: u64,
        req: &PickRequest<'_>,
        context: u32,
        rng: &mut dyn Entropy,
        recency: R,
    ) -> (u32, Why) {
        let n = cands.slots.len();
        match &mut self.kind {
            Kind::RoundRobin { cursor } => round_robin(cursor, n),
            Kind::Random => (rng.below(n) as u32, Why::Random { of: n }),
            Kind::Weighted { tree, schedule, cursor } => {
                let slot = if schedule.is_empty() {
                    tree.min().unwrap_or(0)
                } else {
                    let s = schedule[*cursor];
                    *cursor = (*cursor + 1) % schedule.len();
                    s
                };
                let why = Why::Weighted {
                    weight: cands.eff_weight[slot as usize],
                    total: cands.total_weight,
                };
                (slot, why)
            }
            Kind::Rotating { order } => {
                if order.len() != states.len() {
                    complete_rotation(order, states.len(), rng);
                }
                let len = order.len();
                let start = context as usize % len;
                (0..len)
                    .find_map(|k| {
                        let slot = cands.slot_of[order[(start + k) % len] as usize];
                        (slot != NONE).then_some((slot, Why::Rotating { context, skipped: k }))
                    })
                    .unwrap_or((0, Why::Rotating { context, skipped: len }))
            }
            Kind::ResponseTime { smoothed, ranked, share, current, rr } => {
                // Smooth weighted round robin over the ranked members that are candidates now
                // (a member that left the candidates neither gains nor is charged).
                let mut total = 0i64;
                let mut best: Option<(usize, u32)> = None;
                for (pos, &m) in ranked.iter().enumerate() {
                    let slot = cands.slot_of[m as usize];
                    if slot == NONE {
                        continue;
                    }
                    current[pos] += share[pos];
                    total += share[pos];
                    if best.is_none_or(|(b, _)| current[pos] > current[b]) {
                        best = Some((pos, slot));
                    }
                }
                match best {
                    Some((pos, slot)) => {
                        current[pos] -= total;
                        let m = ranked[pos] as usize;
                        let rtt_us = smoothed.get(m).copied().flatten().map_or(0.0, |ns| ns / 1e3);
                        (slot, Why::ResponseTime { rank: pos, rtt_us: rtt_us as u64 })
                    }
                    None => (round_robin(rr, n).0, Why::ResponseTimeUnranked),
                }
            }
            Kind::ResponseTimeClb { ranked, cursor, rr } => {
                let len = ranked.len();
                let found = (0..len).find_map(|k| {
                    let pos = (*cursor + k) % len;
                    let m = ranked[pos] as usize;
                    let slot = cands.slot_of[m];
                    (slot != NONE).then_some((pos, slot, m))
                });
                match found {
                    Some((pos, slot, m)) => {
                        // Round robin down the ranked table; exhausted, back to its top.
                        *cursor = pos + 1;
                        let rtt_us = states[m].load.probe_rtt.map_or(0, |d| d.as_micros() as u64);
                        (slot, Why::ResponseTime { rank: pos, rtt_us })
                    }
                    None => (round_robin(rr, n).0, Why::ResponseTimeUnranked),
                }
            }
            Kind::LeastSessions { index } => {
                let slot = index.min().unwrap_or(0);
                let active = index.active(slot);
                (slot, Why::LeastSessions { active, weight: cands.eff_weight[slot as usize] })
            }
            Kind::LeastCpu => agent_pick(cands, states, policy, req, true, recency),
            Kind::MostFreeMemory => agent_pick(cands, states, policy, req, false, recency),
            Kind::P2c { inv_decay } => p2c(cands, states, *inv_decay, rng),
            Kind::Adaptive { inv_decay } => adaptive(cands, states, *inv_decay, req.now, rng),
            Kind::Hash { table } => {
                let Some(key) = req.hash else {
                    return (rng.below(n) as u32, Why::HashNoKey);
                };
                let Some(table) = table else { return (0, Why::HashNoKey) };
                let bound = policy.hash.bounded_load;
                let fits = |slot: u32| {
                    let Some(c) = bound else { return true };
                    let st = &states[cands.slots[slot as usize] as usize];
                    let share = cands.eff_weight[slot as usize] as f64 / cands.total_weight as f64;
                    let cap = (c * (total_active + 1) as f64 * share).ceil() as u64;
                    st.load.active() < cap.max(1)
                };
                let (slot, skipped) = table.lookup(key, fits);
                (slot, Why::Hash { key, skipped })
            }
        }
    }

    /// The member to take when the choice at `slot` cannot be used: the next eligible one that
    /// `skip` does not rule out (already tried, or at `max_requests_per_member`), in the order that fits the algorithm (down the rotated list for
    /// `rotating`, the least loaded for load-aware algorithms, the next slot otherwise).
    pub(crate) fn next_after<R: Recency>(
        &self,
        cands: &Candidates,
        states: &[MemberState],
        slot: u32,
        context: u32,
        skip: &dyn Fn(usize) -> bool,
        recency: R,
    ) -> Option<usize> {
        let chosen = cands.slots[slot as usize];
        let usable = |m: u32| cands.slot_of[m as usize] != NONE && m != chosen && !skip(m as usize);
        match &self.kind {
            Kind::Rotating { order } if !order.is_empty() => {
                let len = order.len();
                let start = context as usize % len;
                let pos = (0..len).position(|k| order[(start + k) % len] == chosen)?;
                (1..len)
                    .map(|k| order[(start + pos + k) % len])
                    .find(|&m| usable(m))
                    .map(|m| m as usize)
            }
            Kind::LeastSessions { .. }
            | Kind::LeastCpu
            | Kind::MostFreeMemory
            | Kind::P2c { .. }
            | Kind::Adaptive { .. } => least_loaded(cands, states, usable, recency)
                .map(|s| cands.slots[s as usize] as usize),
            _ => {
                let n = cands.slots.len();
                (1..n)
                    .map(|k| cands.slots[(slot as usize + k) % n])
                    .find(|&m| usable(m))
                    .map(|m| m as usize)
            }
        }
    }

    /// `member` was chosen: advance per-member order state.
    pub(crate) fn picked(&mut self, cands: &Candidates, member: usize) {
        let slot = cands.slot_of[member];
        if slot == NONE {
            return;
        }
        match &mut self.kind {
            Kind::Weighted { tree, schedule, .. } if schedule.is_empty() => {
                weighted_advance(tree, slot);
            }
            Kind::LeastSessions { index } => index.picked(slot),
            _ => {}
        }
    }

    /// `member`'s sessions or in-flight count changed.
    pub(crate) fn load_changed(
        &mut self,
        cands: &Candidates,
        states: &[MemberState],
        member: usize,
    ) {
        if let Kind::LeastSessions { index } = &mut self.kind
            && let Some(&slot) = cands.slot_of.get(member)
            && slot != NONE
            && self.built
        {
            index.set_active(slot, states[member].load.active());
        }
    }

    /// A new probe round: re-rank fastest first and start again at the top (CLB); members whose
    /// probe failed are left out of the table.
    pub(crate) fn rerank(&mut self, states: &[MemberState]) {
        let rank = || {
            let mut r: Vec<(std::time::Duration, u32)> = states
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.load.probe_rtt.map(|d| (d, i as u32)))
                .collect();
            r.sort_unstable();
            r
        };
        match &mut self.kind {
            Kind::ResponseTimeClb { ranked, cursor, .. } => {
                *ranked = rank().into_iter().map(|(_, i)| i).collect();
                *cursor = 0;
            }
            Kind::ResponseTime { smoothed, ranked, share, current, .. } => {
                smoothed.resize(states.len(), None);
                for (est, st) in smoothed.iter_mut().zip(states) {
                    // A failed probe leaves the table and forgets the estimate: a member that
                    // comes back is weighed by what it answers then.
                    *est = st.load.probe_rtt.map(|d| {
                        let rtt = d.as_nanos() as f64;
                        est.map_or(rtt, |e| e + (rtt - e) / RESPONSE_TIME_SMOOTHING)
                    });
                }
                (*ranked, *share, *current) = response_time_table(smoothed);
            }
            _ => {}
        }
    }
}

/// `response-time`'s table from the smoothed round trips: the ranked members (fastest first),
/// their shares, and credits at zero.
fn response_time_table(smoothed: &[Option<f64>]) -> (Vec<u32>, Vec<i64>, Vec<i64>) {
    let mut r: Vec<(f64, u32)> =
        smoothed.iter().enumerate().filter_map(|(i, e)| e.map(|e| (e, i as u32))).collect();
    r.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    // The lower median: with one slow member among many, a fast one.
    let median = r.get(r.len().saturating_sub(1) / 2).map_or(1.0, |&(e, _)| e);
    let share = r.iter().map(|&(e, _)| inverse_share(median, e)).collect();
    let current = vec![0; r.len()];
    (r.into_iter().map(|(_, i)| i).collect(), share, current)
}

/// `response-time`'s share of a member as fast as the probe round's median.
pub const RESPONSE_TIME_SHARE_SCALE: i64 = 1 << 16;
/// `response-time` counts members whose smoothed round trip is at most this factor above the
/// round's median, and faster ones, as equal to the median: differences that small are mostly
/// probe noise, and weighing by them would overload whoever looked fast on homogeneous members
/// (a member never weighs more than the median, so a noisy fast probe cannot pile on).
pub const RESPONSE_TIME_TOLERANCE: f64 = 1.5;
/// `response-time` smooths each member's probe round trips over rounds with weight
/// 1 / this (an EWMA over about this many rounds, 1.6 s at the default 200 ms interval).
pub const RESPONSE_TIME_SMOOTHING: f64 = 8.0;

/// A member's `response-time` share: [`RESPONSE_TIME_SHARE_SCALE`] x `median / rtt` (both in
/// ns) above [`RESPONSE_TIME_TOLERANCE`] x the median, the scale itself otherwise; at least 1
/// so that a very slow member still gets a rare pick.
fn inverse_share(median: f64, rtt: f64) -> i64 {
    let ratio = median.max(1.0) / rtt.max(1.0);
    if ratio >= 1.0 / RESPONSE_TIME_TOLERANCE {
        return RESPONSE_TIME_SHARE_SCALE;
    }
    ((RESPONSE_TIME_SHARE_SCALE as f64 * ratio) as i64).max(1)
}

fn round_robin(cursor: &mut usize, n: usize) -> (u32, Why) {
    let position = *cursor % n;
    *cursor = position + 1;
    (position as u32, Why::RoundRobin { position, of: n })
}

/// Fisher-Yates over `0..n`.
/// Makes `order` a rotation list of members `0..n`: shuffled whole when empty (GlassFish: the
/// list is randomized once per client); otherwise the members it lacks (joined since) are
/// inserted at random places, so survivors keep their order across view changes.
fn complete_rotation(order: &mut Vec<u32>, n: usize, rng: &mut dyn Entropy) {
    if order.is_empty() {
        *order = shuffled(n, rng);
        return;
    }
    let mut present = vec![false; n];
    for &m in order.iter() {
        present[m as usize] = true;
    }
    for m in 0..n as u32 {
        if !present[m as usize] {
            let at = rng.below(order.len() + 1);
            order.insert(at, m);
        }
    }
}

impl AlgoState {
    /// What of the algorithm's state outlives a process ([`crate::handoff`]), by member index:
    /// `rotating`'s list and `response-time`'s smoothed probe round trips (nanoseconds).
    pub(crate) fn exported(&self) -> (Vec<u32>, Vec<Option<f64>>) {
        match &self.kind {
            Kind::Rotating { order } => (order.clone(), Vec::new()),
            Kind::ResponseTime { smoothed, .. } => (Vec::new(), smoothed.clone()),
            _ => (Vec::new(), Vec::new()),
        }
    }

    /// The state a previous process [`AlgoState::exported`], its member indexes mapped to this
    /// cluster's by `new_index` (as [`AlgoState::carry_over`] maps a view's).
    pub(crate) fn imported(
        algorithm: Algorithm,
        (order, smoothed): (Vec<u32>, Vec<Option<f64>>),
        new_index: impl Fn(u32) -> Option<u32>,
    ) -> AlgoState {
        let mut old = AlgoState::new(algorithm);
        match &mut old.kind {
            Kind::Rotating { order: o } => *o = order,
            Kind::ResponseTime { smoothed: s, .. } => *s = smoothed,
            _ => {}
        }
        AlgoState::carry_over(algorithm, &old, new_index)
    }

    /// The state for a new version of the cluster: `rotating` keeps its list (survivors mapped
    /// to their new indexes by `new_index`, departed members dropped); every other algorithm
    /// starts afresh (its indexes are rebuilt from the new candidates anyway).
    pub(crate) fn carry_over(
        algorithm: Algorithm,
        old: &AlgoState,
        new_index: impl Fn(u32) -> Option<u32>,
    ) -> AlgoState {
        let mut st = AlgoState::new(algorithm);
        match (&mut st.kind, &old.kind) {
            (Kind::Rotating { order }, Kind::Rotating { order: old_order }) => {
                *order = old_order.iter().filter_map(|&m| new_index(m)).collect();
            }
            // The smoothed round trips survive a view change and the table is rebuilt from them
            // at once (a new member joins it at its first probe round).
            (
                Kind::ResponseTime { smoothed, ranked, share, current, .. },
                Kind::ResponseTime { smoothed: old_est, .. },
            ) => {
                for (m, &e) in old_est.iter().enumerate() {
                    if let Some(i) = new_index(m as u32) {
                        let i = i as usize;
                        if smoothed.len() <= i {
                            smoothed.resize(i + 1, None);
                        }
                        smoothed[i] = e;
                    }
                }
                (*ranked, *share, *current) = response_time_table(smoothed);
            }
            _ => {}
        }
        st
    }
}

fn shuffled(n: usize, rng: &mut dyn Entropy) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v
}

/// A member's next turn in `weighted`: virtual time `next / (weight * PHASE_SCALE)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightedKey {
    next: u64,
    weight: u64,
}

impl WeightedKey {
    fn less(a: &WeightedKey, b: &WeightedKey) -> bool {
        ratio_cmp(a.next, a.weight, b.next, b.weight) == Ordering::Less
    }
}

fn weighted_advance(tree: &mut MinTree<WeightedKey>, slot: u32) {
    let key = WeightedKey { next: tree.key(slot).next + PHASE_SCALE, ..*tree.key(slot) };
    tree.set(slot, key, WeightedKey::less);
}

/// `active / weight`, exactly, by cross-multiplication.
fn load_cmp(cands: &Candidates, states: &[MemberState], a: usize, b: usize) -> Ordering {
    let la = states[cands.slots[a] as usize].load.active();
    let lb = states[cands.slots[b] as usize].load.active();
    ratio_cmp(la, cands.eff_weight[a], lb, cands.eff_weight[b])
}

/// `na / da` against `nb / db`, exactly.
fn ratio_cmp(na: u64, da: u64, nb: u64, db: u64) -> Ordering {
    (u128::from(na) * u128::from(db)).cmp(&(u128::from(nb) * u128::from(da)))
}

fn least_loaded<R: Recency>(
    cands: &Candidates,
    states: &[MemberState],
    usable: impl Fn(u32) -> bool,
    recency: R,
) -> Option<u32> {
    (0..cands.slots.len())
        .filter(|&s| usable(cands.slots[s]))
        .min_by(|&a, &b| {
            let last = |s: usize| {
                let m = cands.slots[s] as usize;
                recency.last_pick(&states[m], m)
            };
            load_cmp(cands, states, a, b).then(last(a).cmp(&last(b)))
        })
        .map(|s| s as u32)
}

/// `least-cpu` / `most-free-memory` (SGD): by the agents' reports when every candidate has a
/// fresh one, else least-sessions for the whole pick. Reports are compared at 1 % CPU / 1 MiB
/// granularity so near-equal members share by load rather than herding onto one.
fn agent_pick<R: Recency>(
    cands: &Candidates,
    states: &[MemberState],
    policy: &Policy,
    req: &PickRequest<'_>,
    cpu: bool,
    recency: R,
) -> (u32, Why) {
    // One pass: the best by report, and whether anyone lacks a fresh one.
    let mut missing = 0usize;
    let mut best: Option<(u64, usize)> = None;
    for (s, &m) in cands.slots.iter().enumerate() {
        let st = &states[m as usize];
        let Some(r) = st.load.agent.filter(|r| r.is_fresh(req.now, policy.agent.timeout)) else {
            missing += 1;
            continue;
        };
        let score = if cpu {
            (r.cpu_used.clamp(0.0, 1.0) * 100.0).round() as u64
        } else {
            u64::MAX - (r.mem_free >> 20)
        };
        let better = match best {
            None => true,
            Some((bs, b)) => {
                score.cmp(&bs).then_with(|| load_cmp(cands, states, s, b)).then_with(|| {
                    let other = cands.slots[b] as usize;
                    let last_other = recency.last_pick(&states[other], other);
                    recency.last_pick(st, m as usize).cmp(&last_other)
                }) == Ordering::Less
            }
        };
        if better {
            best = Some((score, s));
        }
    }
    match best {
        Some((_, slot)) if missing == 0 => {
            let r = states[cands.slots[slot] as usize]
                .load
                .agent
                .map_or((0.0, 0), |r| (r.cpu_used, r.mem_free));
            let why = if cpu {
                Why::LeastCpu { cpu_percent: r.0 * 100.0 }
            } else {
                Why::MostFreeMemory { free_mib: r.1 >> 20 }
            };
            (slot as u32, why)
        }
        _ => {
            let slot = least_loaded(cands, states, |_| true, recency).unwrap_or(0);
            let active = states[cands.slots[slot as usize] as usize].load.active();
            (slot, Why::AgentFallback { missing, active })
        }
    }
}
