//! The algorithms. Each chooses a slot among the candidates (see [`super::candidates`]); none
//! looks at eligibility itself, so "no picker returns an ineligible member" holds by
//! construction and is checked by property tests for every algorithm.

use std::cmp::Ordering;

use crate::explain::Why;
use crate::member::MemberState;
use crate::model::{Algorithm, ClusterSpec, Policy};
use crate::rng::Entropy;
use crate::tree::MinTree;

use super::candidates::Candidates;
use super::hashing::Table;
use super::{NONE, PickRequest};

/// Fixed-point scale of the smooth-weighted phases.
const PHASE_SCALE: u64 = 1 << 16;
/// One pick in this many is uniform in `p2c-ewma`: the exploration floor.
const P2C_EXPLORE_ONE_IN: usize = 100;

#[derive(Debug)]
pub(crate) struct AlgoState {
    built: bool,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    RoundRobin { cursor: usize },
    Random,
    /// Smooth weighted round robin as a priority order: slot `s`'s next turn falls at virtual
    /// time `(picks_s + phase_s) / weight_s` with `phase_s` in `(0, 1]`. In every unit of virtual
    /// time each member gets exactly `weight_s` turns, so each cycle of `sum(weights)` picks
    /// honours the weights exactly, and turns are spread evenly within the cycle (no bursts):
    /// nginx's smooth WRR property, but O(log n) per pick instead of nginx's O(n) scan.
    /// Phases differ per member (golden-ratio spacing) so equal-weight members interleave
    /// instead of all falling due at once.
    Weighted { tree: MinTree, picks: Vec<u64>, phase: Vec<u64> },
    Rotating { order: Vec<u32> },
    ResponseTime { ranked: Vec<u32>, cursor: usize, rr: usize },
    /// Fewest active per unit of weight; among equals, a weighted turn (`(picks + 1) / weight`)
    /// so that sequential traffic (everyone at zero) still follows the weights.
    LeastSessions { tree: MinTree, picks: Vec<u64> },
    LeastCpu,
    MostFreeMemory,
    P2c,
    Hash { table: Option<Table> },
}

impl AlgoState {
    pub(crate) fn new(algorithm: Algorithm) -> Self {
        let kind = match algorithm {
            Algorithm::RoundRobin => Kind::RoundRobin { cursor: 0 },
            Algorithm::Random => Kind::Random,
            Algorithm::Weighted => {
                Kind::Weighted { tree: MinTree::default(), picks: Vec::new(), phase: Vec::new() }
            }
            Algorithm::Rotating => Kind::Rotating { order: Vec::new() },
            Algorithm::ResponseTime => {
                Kind::ResponseTime { ranked: Vec::new(), cursor: 0, rr: 0 }
            }
            Algorithm::LeastSessions => {
                Kind::LeastSessions { tree: MinTree::default(), picks: Vec::new() }
            }
            Algorithm::LeastCpu => Kind::LeastCpu,
            Algorithm::MostFreeMemory => Kind::MostFreeMemory,
            Algorithm::P2cEwma => Kind::P2c,
            Algorithm::Hash => Kind::Hash { table: None },
        };
        AlgoState { built: false, kind }
    }

    pub(crate) fn is_built(&self) -> bool {
        self.built
    }

    /// Rebuilds indexes over a changed candidate set.
    pub(crate) fn rebuild(&mut self, spec: &ClusterSpec, cands: &Candidates, states: &[MemberState]) {
        self.built = true;
        let n = cands.slots.len();
        match &mut self.kind {
            Kind::Weighted { tree, picks, phase } => {
                *picks = vec![0; n];
                *phase = cands
                    .slots
                    .iter()
                    .map(|&m| (u64::from(m) + 1).wrapping_mul(40_503) % PHASE_SCALE + 1)
                    .collect();
                *tree = MinTree::build(n, |a, b| weighted_less(cands, picks, phase, a, b));
            }
            Kind::LeastSessions { tree, picks } => {
                *picks = vec![0; n];
                *tree = MinTree::build(n, |a, b| least_less(cands, states, picks, a, b));
            }
            Kind::Hash { table } => *table = Some(Table::build(spec, cands)),
            _ => {}
        }
    }

    /// The algorithm's choice among the candidates (non-empty).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pick(
        &mut self,
        cands: &Candidates,
        states: &[MemberState],
        policy: &Policy,
        total_active: u64,
        req: &PickRequest<'_>,
        context: u32,
        rng: &mut dyn Entropy,
    ) -> (u32, Why) {
        let n = cands.slots.len();
        match &mut self.kind {
            Kind::RoundRobin { cursor } => round_robin(cursor, n),
            Kind::Random => (rng.below(n) as u32, Why::Random { of: n }),
            Kind::Weighted { tree, .. } => {
                let slot = tree.min().unwrap_or(0);
                let why = Why::Weighted {
                    weight: cands.eff_weight[slot as usize],
                    total: cands.total_weight,
                };
                (slot, why)
            }
            Kind::Rotating { order } => {
                if order.len() != states.len() {
                    *order = shuffled(states.len(), rng);
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
            Kind::ResponseTime { ranked, cursor, rr } => {
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
            Kind::LeastSessions { tree, .. } => {
                let slot = tree.min().unwrap_or(0);
                let st = &states[cands.slots[slot as usize] as usize];
                let why = Why::LeastSessions {
                    active: st.load.active(),
                    weight: cands.eff_weight[slot as usize],
                };
                (slot, why)
            }
            Kind::LeastCpu => agent_pick(cands, states, policy, req, true),
            Kind::MostFreeMemory => agent_pick(cands, states, policy, req, false),
            Kind::P2c => p2c(cands, states, policy, req, rng),
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
    /// is not excluded, in the order that fits the algorithm (down the rotated list for
    /// `rotating`, the least loaded for load-aware algorithms, the next slot otherwise).
    pub(crate) fn next_after(
        &self,
        cands: &Candidates,
        states: &[MemberState],
        slot: u32,
        context: u32,
        exclude: &[usize],
    ) -> Option<usize> {
        let chosen = cands.slots[slot as usize];
        let usable = |m: u32| cands.slot_of[m as usize] != NONE && m != chosen && !exclude.contains(&(m as usize));
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
            Kind::LeastSessions { .. } | Kind::LeastCpu | Kind::MostFreeMemory | Kind::P2c => {
                least_loaded(cands, states, |m| usable(m)).map(|s| cands.slots[s as usize] as usize)
            }
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
    pub(crate) fn picked(&mut self, cands: &Candidates, states: &[MemberState], member: usize) {
        let slot = cands.slot_of[member];
        if slot == NONE {
            return;
        }
        match &mut self.kind {
            Kind::Weighted { tree, picks, phase } => {
                picks[slot as usize] += 1;
                let (picks, phase) = (&*picks, &*phase);
                tree.update(slot, |a, b| weighted_less(cands, picks, phase, a, b));
            }
            Kind::LeastSessions { tree, picks } => {
                picks[slot as usize] += 1;
                let picks = &*picks;
                tree.update(slot, |a, b| least_less(cands, states, picks, a, b));
            }
            _ => {}
        }
    }

    /// `member`'s sessions or in-flight count changed.
    pub(crate) fn load_changed(&mut self, cands: &Candidates, states: &[MemberState], member: usize) {
        if let Kind::LeastSessions { tree, picks } = &mut self.kind
            && let Some(&slot) = cands.slot_of.get(member)
            && slot != NONE
            && self.built
        {
            tree.update(slot, |a, b| least_less(cands, states, picks, a, b));
        }
    }

    /// A new probe round: re-rank fastest first and start again at the top (CLB).
    pub(crate) fn rerank(&mut self, states: &[MemberState]) {
        if let Kind::ResponseTime { ranked, cursor, .. } = &mut self.kind {
            let mut r: Vec<(std::time::Duration, u32)> = states
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.load.probe_rtt.map(|d| (d, i as u32)))
                .collect();
            r.sort_unstable();
            *ranked = r.into_iter().map(|(_, i)| i).collect();
            *cursor = 0;
        }
    }
}

fn round_robin(cursor: &mut usize, n: usize) -> (u32, Why) {
    let position = *cursor % n;
    *cursor = position + 1;
    (position as u32, Why::RoundRobin { position, of: n })
}

/// Fisher-Yates over `0..n`.
fn shuffled(n: usize, rng: &mut dyn Entropy) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v
}

fn weighted_less(cands: &Candidates, picks: &[u64], phase: &[u64], a: u32, b: u32) -> bool {
    let (a, b) = (a as usize, b as usize);
    let na = u128::from(picks[a] * PHASE_SCALE + phase[a]);
    let nb = u128::from(picks[b] * PHASE_SCALE + phase[b]);
    let lhs = na * u128::from(cands.eff_weight[b]);
    let rhs = nb * u128::from(cands.eff_weight[a]);
    lhs < rhs || (lhs == rhs && a < b)
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

/// Least loaded first; among equals the one whose weighted turn comes first.
fn least_less(cands: &Candidates, states: &[MemberState], picks: &[u64], a: u32, b: u32) -> bool {
    let (a, b) = (a as usize, b as usize);
    let turn = ratio_cmp(picks[a] + 1, cands.eff_weight[a], picks[b] + 1, cands.eff_weight[b]);
    load_cmp(cands, states, a, b).then(turn).then(a.cmp(&b)) == Ordering::Less
}

fn least_loaded(cands: &Candidates, states: &[MemberState], usable: impl Fn(u32) -> bool) -> Option<u32> {
    (0..cands.slots.len())
        .filter(|&s| usable(cands.slots[s]))
        .min_by(|&a, &b| {
            let last = |s: usize| states[cands.slots[s] as usize].last_pick;
            load_cmp(cands, states, a, b).then(last(a).cmp(&last(b)))
        })
        .map(|s| s as u32)
}

/// `least-cpu` / `most-free-memory` (SGD): by the agents' reports when every candidate has a
/// fresh one, else least-sessions for the whole pick. Reports are compared at 1 % CPU / 1 MiB
/// granularity so near-equal members share by load rather than herding onto one.
fn agent_pick(
    cands: &Candidates,
    states: &[MemberState],
    policy: &Policy,
    req: &PickRequest<'_>,
    cpu: bool,
) -> (u32, Why) {
    let report = |s: usize| {
        states[cands.slots[s] as usize]
            .load
            .agent
            .filter(|r| r.is_fresh(req.now, policy.agent.timeout))
    };
    let missing = (0..cands.slots.len()).filter(|&s| report(s).is_none()).count();
    if missing > 0 {
        let slot = least_loaded(cands, states, |_| true).unwrap_or(0);
        let active = states[cands.slots[slot as usize] as usize].load.active();
        return (slot, Why::AgentFallback { missing, active });
    }
    let score = |s: usize| {
        let r = report(s).map_or((0.0, 0), |r| (r.cpu_used, r.mem_free));
        if cpu { (r.0.clamp(0.0, 1.0) * 100.0).round() as u64 } else { u64::MAX - (r.1 >> 20) }
    };
    let last = |s: usize| states[cands.slots[s] as usize].last_pick;
    let slot = (0..cands.slots.len())
        .min_by(|&a, &b| {
            score(a)
                .cmp(&score(b))
                .then(load_cmp(cands, states, a, b))
                .then(last(a).cmp(&last(b)))
        })
        .unwrap_or(0);
    let r = report(slot).map_or((0.0, 0), |r| (r.cpu_used, r.mem_free));
    let why = if cpu {
        Why::LeastCpu { cpu_percent: r.0 * 100.0 }
    } else {
        Why::MostFreeMemory { free_mib: r.1 >> 20 }
    };
    (slot as u32, why)
}

/// Power of two choices (Mitzenmacher, "The Power of Two Choices in Randomized Load
/// Balancing", 2001) over Finagle's peak-EWMA cost: two distinct candidates at random, the
/// cheaper wins. Cost = latency estimate x (in-flight + 1) / weight.
fn p2c(
    cands: &Candidates,
    states: &[MemberState],
    policy: &Policy,
    req: &PickRequest<'_>,
    rng: &mut dyn Entropy,
) -> (u32, Why) {
    let n = cands.slots.len();
    if n == 1 {
        return (0, Why::Only);
    }
    if rng.below(P2C_EXPLORE_ONE_IN) == 0 {
        return (rng.below(n) as u32, Why::P2cExplore);
    }
    let a = rng.below(n);
    let mut b = rng.below(n - 1);
    if b >= a {
        b += 1;
    }
    let cost = |s: usize| {
        let load = &states[cands.slots[s] as usize].load;
        load.ewma.get_at(req.now, policy.ewma.decay) * f64::from(load.in_flight + 1)
            / cands.eff_weight[s] as f64
    };
    let (ca, cb) = (cost(a), cost(b));
    let (win, lose, cw, cl) = if cb < ca { (b, a, cb, ca) } else { (a, b, ca, cb) };
    let why = Why::P2c { chosen_cost: cw, other: cands.slots[lose] as usize, other_cost: cl };
    (win as u32, why)
}
