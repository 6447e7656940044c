//! The latency-aware pickers, `p2c-ewma` and `adaptive`: each compares candidates by an
//! expected delay, a latency estimate x (in-flight + 1) / weight, and they differ in which
//! estimate and how many candidates. [`super::pickers`] dispatches to them.

use crate::explain::Why;
use crate::load::exp_neg;
use crate::member::MemberState;
use crate::rng::Entropy;

use super::candidates::Candidates;

/// One pick in this many is uniform in `p2c-ewma`: the exploration floor.
const P2C_EXPLORE_ONE_IN: usize = 100;

/// A number below `m` from the low 32 bits of `bits` (multiply-shift; clusters are far below
/// 2^32 members), so one 64-bit draw gives two.
#[inline(always)]
fn below32(bits: u64, m: usize) -> usize {
    (((bits & 0xFFFF_FFFF) * m as u64) >> 32) as usize
}

/// Power of two choices (Mitzenmacher, "The Power of Two Choices in Randomized Load
/// Balancing", 2001) over Finagle's peak-EWMA cost: two distinct candidates at random, the
/// cheaper wins. Cost = latency estimate x (in-flight + 1) / weight.
// Inlined into `AlgoState::pick` as it was while that had one instance (the balancer's and a
// shadow's are two, and the compiler then keeps this one out of line).
#[inline(always)]
pub(super) fn p2c(
    cands: &Candidates,
    states: &[MemberState],
    inv_decay: f64,
    rng: &mut dyn Entropy,
) -> (u32, Why) {
    let n = cands.slots.len();
    if n == 1 {
        return (0, Why::Only);
    }
    // Two draws of 64 bits give the exploration coin and both samples (`below32`).
    let r = rng.next_u64();
    if below32(r, P2C_EXPLORE_ONE_IN) == 0 {
        return (rng.below(n) as u32, Why::P2cExplore);
    }
    let a = below32(r >> 32, n);
    let mut b = below32(rng.next_u64(), n - 1);
    if b >= a {
        b += 1;
    }
    // Compare cost_a = ewma_a * (in_flight_a + 1) / w_a with cost_b by cross-multiplying the
    // weights: no division on the hot path.
    // Both estimates decay by the same factor from the later of their two samples to now, so
    // only the older one needs decaying (to the later sample): one exponential per pick.
    let (la, lb) = (&states[cands.slots[a] as usize].load, &states[cands.slots[b] as usize].load);
    let ((ea, sa), (eb, sb)) = (la.ewma.last(), lb.ewma.last());
    // Through i64: a signed conversion is one instruction, an unsigned one a sequence.
    let gap = exp_neg(sa.0.abs_diff(sb.0).min(i64::MAX as u64) as i64 as f64 * inv_decay);
    let (ea, eb) = if sa < sb { (ea * gap, eb) } else { (ea, eb * gap) };
    let ra = ea * f64::from(la.seen_in_flight().saturating_add(1));
    let rb = eb * f64::from(lb.seen_in_flight().saturating_add(1));
    let (wa, wb) = (cands.eff_weight[a], cands.eff_weight[b]);
    let ((win, rw, ww), (lose, rl, wl)) = if rb * (wa as i64 as f64) < ra * (wb as i64 as f64) {
        ((b, rb, wb), (a, ra, wa))
    } else {
        ((a, ra, wa), (b, rb, wb))
    };
    let why = Why::P2c {
        chosen_load: rw,
        chosen_weight: ww,
        other: cands.slots[lose] as usize,
        other_load: rl,
        other_weight: wl,
    };
    (win as u32, why)
}

/// `adaptive` compares every candidate up to this many; larger candidate sets are sampled with
/// this many draws, so a pick stays bounded in large clusters.
pub const ADAPTIVE_SCAN: usize = 16;
/// One `adaptive` pick in this many is uniform: the exploration floor that keeps every member's
/// passive estimate fresh (a member nobody picks is never measured again otherwise).
pub const ADAPTIVE_EXPLORE_ONE_IN: usize = 100;

/// A member that has gone this many times its mean latency without finishing any of the
/// balancer's requests in flight there is estimated by that quiet time instead (issue 42:
/// 2 measured best of 1, 1.5, 2, 3 and 5; below it the noise of exponential service, whose
/// elapsed time says nothing of what is left, shows through; above it a member that turned
/// slow or hangs is seen later).
pub const ADAPTIVE_STALL: f64 = 2.0;

/// Shortest expected delay from what the balancer can observe, revised by measurement in the
/// lab for issue 42 (heavy tails, drift, a tier of routers). Each candidate's estimate is its
/// mean latency over its last ~128 requests ([`crate::load::LatencyMean`]: robust to one long
/// request, where the peak EWMA is not), decayed toward zero while it gets no traffic as the
/// peak EWMA is (so an idle member is tried again); raised to the time the member has gone
/// without finishing a request in flight when that passes [`ADAPTIVE_STALL`] x its mean (a
/// member that turns slow or hangs is seen before any of its requests ends, in the spirit of
/// Prequal, NSDI 2024, which weighs requests in flight rather than waiting for latencies);
/// with the probe round trip as a floor that counts for more as the member's own samples go
/// stale (one probe is one noisy service time: a floor under a member busy with traffic made
/// equal members look unequal). A member whose latest request failed, or without any success
/// yet, is estimated by its peak EWMA (which holds the failure penalty) with the probe as a
/// floor. The cost is estimate x (in-flight + 1) / weight, and the cheapest candidate wins.
/// Ties go to the first from a random start, so equal members share evenly.
#[inline(always)]
pub(super) fn adaptive(
    cands: &Candidates,
    states: &[MemberState],
    inv_decay: f64,
    now: crate::time::Instant,
    rng: &mut dyn Entropy,
) -> (u32, Why) {
    let n = cands.slots.len();
    if n == 1 {
        return (0, Why::Only);
    }
    let r = rng.next_u64();
    if below32(r, ADAPTIVE_EXPLORE_ONE_IN) == 0 {
        return (below32(r >> 32, n) as u32, Why::AdaptiveExplore);
    }
    // The candidates compared: all of them from a random start, or a sample in large clusters.
    let start = below32(r >> 32, n);
    let draws = n.min(ADAPTIVE_SCAN);
    let mut slots = [0usize; ADAPTIVE_SCAN];
    for (k, s) in slots.iter_mut().enumerate().take(draws) {
        *s = if n <= ADAPTIVE_SCAN { (start + k) % n } else { rng.below(n) };
    }
    let slots = &slots[..draws];
    // Passive estimates are decayed to the later of `now` and the newest sample among them, so
    // a caller whose clock reads earlier than a recorded outcome (a replay, a clock from another
    // process) compares exactly what a caller with a later clock would.
    let newest = slots
        .iter()
        .map(|&s| states[cands.slots[s] as usize].load.ewma.last().1)
        .max()
        .unwrap_or(now)
        .max(now);
    let cost = |slot: usize| -> (f64, bool) {
        let load = &states[cands.slots[slot] as usize].load;
        let probe = load.probe_rtt.map_or(0.0, |d| d.as_nanos() as f64);
        let (estimate, probe_set) = match load.latency.mean() {
            Some((mean, at)) if load.consecutive_failures == 0 => {
                let fade = exp_neg(newest.0.saturating_sub(at.0) as f64 * inv_decay);
                let mut passive = mean * fade;
                if load.in_flight > 0 {
                    let quiet = load.latency.quiet_for(newest) as f64;
                    if quiet > ADAPTIVE_STALL * mean {
                        passive = passive.max(quiet);
                    }
                }
                // The staler the member's own samples, the more its probe counts.
                let floor = probe * (1.0 - fade);
                (passive.max(floor), floor > passive)
            }
            // No success yet, or its latest request failed: the peak EWMA, which holds the
            // failure penalty, and the probe as a floor under it.
            _ => {
                let (estimate, stamp) = load.ewma.last();
                let passive =
                    estimate * exp_neg(newest.0.saturating_sub(stamp.0) as f64 * inv_decay);
                (passive.max(probe), probe > passive)
            }
        };
        let weight = cands.eff_weight[slot].max(1) as f64;
        (estimate * f64::from(load.seen_in_flight().saturating_add(1)) / weight, probe_set)
    };
    let mut best: Option<(usize, f64, bool)> = None;
    let mut second: Option<(usize, f64)> = None;
    for &slot in slots {
        let (c, probe) = cost(slot);
        match best {
            Some((_, bc, _)) if c >= bc => {
                if second.is_none_or(|(_, sc)| c < sc) {
                    second = Some((slot, c));
                }
            }
            _ => {
                if let Some((bs, bc, _)) = best {
                    second = Some((bs, bc));
                }
                best = Some((slot, c, probe));
            }
        }
    }
    let (slot, c, probe) = best.unwrap_or((0, 0.0, false));
    let runner_up = second.map(|(s, sc)| (cands.slots[s] as usize, sc));
    (slot as u32, Why::Adaptive { cost: c, probe, runner_up })
}
