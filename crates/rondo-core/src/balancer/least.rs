//! The `least-sessions` index: which candidate has the fewest active (sessions + in-flight) per
//! unit of weight, readable in O(1) after every change.
//!
//! - **Equal weights** (the common case): buckets by active count, each a FIFO list, like an
//!   O(1) LFU cache. A pick takes the head of the lowest non-empty bucket and moves it to that
//!   bucket's tail, so members with equal load take turns; a load change moves the member to the
//!   tail of the neighbouring bucket. Every operation is O(1).
//! - **Unequal weights** (weighted clusters, slow start): a tournament tree over packed integer
//!   keys `(active * L / weight, turn * L / weight)` with `L` the weights' least common multiple,
//!   so ratios compare exactly and sequential traffic follows the weights. O(log n) updates.

use std::cmp::Ordering;

use crate::member::MemberState;
use crate::tree::MinTree;

use super::NONE;
use super::candidates::Candidates;

#[derive(Debug)]
pub(crate) enum LeastIndex {
    Buckets(Buckets),
    Tree { tree: MinTree<u128>, meta: Vec<LeastKey> },
}

impl Default for LeastIndex {
    fn default() -> Self {
        LeastIndex::Buckets(Buckets::default())
    }
}

impl LeastIndex {
    pub(crate) fn build(cands: &Candidates, states: &[MemberState]) -> Self {
        let active = |m: u32| states[m as usize].load.active();
        let equal = cands.eff_weight.windows(2).all(|w| w[0] == w[1]);
        if equal {
            let mut b = Buckets::default();
            for &m in &cands.slots {
                b.push(active(m));
            }
            return LeastIndex::Buckets(b);
        }
        let scales = load_scales(&cands.eff_weight);
        let meta: Vec<LeastKey> = cands
            .slots
            .iter()
            .zip(scales)
            .map(|(&m, scale)| LeastKey { active: active(m), turn: 1, scale })
            .collect();
        let tree = MinTree::build(meta.iter().map(LeastKey::packed).collect(), u128_less);
        LeastIndex::Tree { tree, meta }
    }

    /// The least-loaded slot.
    pub(crate) fn min(&mut self) -> Option<u32> {
        match self {
            LeastIndex::Buckets(b) => b.min(),
            LeastIndex::Tree { tree, .. } => tree.min(),
        }
    }

    /// A slot's active count as the index knows it.
    pub(crate) fn active(&self, slot: u32) -> u64 {
        match self {
            LeastIndex::Buckets(b) => u64::from(b.load[slot as usize]),
            LeastIndex::Tree { meta, .. } => meta[slot as usize].active,
        }
    }

    /// `slot` was picked: it goes behind its equals.
    pub(crate) fn picked(&mut self, slot: u32) {
        match self {
            LeastIndex::Buckets(b) => {
                let load = b.load[slot as usize];
                b.unlink(slot);
                b.append(slot, load);
            }
            LeastIndex::Tree { tree, meta } => {
                let key = &mut meta[slot as usize];
                key.turn += 1;
                tree.set(slot, key.packed(), u128_less);
            }
        }
    }

    /// `slot`'s active count is now `active`.
    pub(crate) fn set_active(&mut self, slot: u32, active: u64) {
        match self {
            LeastIndex::Buckets(b) => {
                let load = u32::try_from(active).unwrap_or(u32::MAX - 1);
                if load != b.load[slot as usize] {
                    b.unlink(slot);
                    b.append(slot, load);
                }
            }
            LeastIndex::Tree { tree, meta } => {
                let key = &mut meta[slot as usize];
                key.active = active;
                tree.set(slot, key.packed(), u128_less);
            }
        }
    }
}

/// FIFO lists of slots by load, with the lowest possibly non-empty load.
#[derive(Debug, Default)]
pub(crate) struct Buckets {
    load: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: Vec<u32>,
    tail: Vec<u32>,
    /// No bucket below this is non-empty.
    low: u32,
}

impl Buckets {
    fn push(&mut self, active: u64) {
        let slot = self.load.len() as u32;
        self.load.push(0);
        self.prev.push(NONE);
        self.next.push(NONE);
        if slot == 0 {
            self.low = u32::MAX;
        }
        self.append(slot, u32::try_from(active).unwrap_or(u32::MAX - 1));
    }

    fn append(&mut self, slot: u32, load: u32) {
        let l = load as usize;
        if self.head.len() <= l {
            self.head.resize(l + 1, NONE);
            self.tail.resize(l + 1, NONE);
        }
        self.load[slot as usize] = load;
        self.next[slot as usize] = NONE;
        self.prev[slot as usize] = self.tail[l];
        match self.tail[l] {
            NONE => self.head[l] = slot,
            t => self.next[t as usize] = slot,
        }
        self.tail[l] = slot;
        self.low = self.low.min(load);
    }

    fn unlink(&mut self, slot: u32) {
        let (s, l) = (slot as usize, self.load[slot as usize] as usize);
        let (p, n) = (self.prev[s], self.next[s]);
        match p {
            NONE => self.head[l] = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NONE => self.tail[l] = p,
            n => self.prev[n as usize] = p,
        }
    }

    fn min(&mut self) -> Option<u32> {
        // Loads move by one at a time, so this walk is amortised O(1).
        while (self.low as usize) < self.head.len() {
            let h = self.head[self.low as usize];
            if h != NONE {
                return Some(h);
            }
            self.low += 1;
        }
        None
    }
}

/// Integer form of `(active / weight, turn / weight)`, packed into one `u128`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeastKey {
    active: u64,
    turn: u64,
    scale: u64,
}

impl LeastKey {
    fn packed(&self) -> u128 {
        let load = self.active.saturating_mul(self.scale);
        let turn = self.turn.saturating_mul(self.scale);
        (u128::from(load) << 64) | u128::from(turn)
    }
}

fn u128_less(a: &u128, b: &u128) -> bool {
    a.cmp(b) == Ordering::Less
}

/// Per-slot multipliers that turn `x / weight` into an integer `x * scale` with the same order.
/// With `L` the least common multiple of the weights (when it stays under 2^24, as it does for
/// any sane weighting such as 100/200/300), `scale = L / weight` is exact, ties included; past
/// that, `scale = round(2^24 * max_weight / weight)` orders loads to one part in 2^24.
fn load_scales(weights: &[u64]) -> Vec<u64> {
    const LIMIT: u64 = 1 << 24;
    let mut lcm = 1u64;
    for &w in weights {
        lcm = lcm / gcd(lcm, w) * w;
        if lcm > LIMIT {
            let max = weights.iter().copied().max().unwrap_or(1) as f64;
            return weights
                .iter()
                .map(|&w| (LIMIT as f64 * max / w as f64).round() as u64)
                .collect();
        }
    }
    weights.iter().map(|&w| lcm / w).collect()
}

/// Greatest common divisor (Euclid), for reducing weights.
pub(super) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the sequence of load changes and picks, the bucket index's minimum has the
        /// least load, and equal loads take turns.
        #[test]
        fn buckets_always_yield_a_least_loaded_slot(
            loads in proptest::collection::vec(0u64..6, 1..30),
            ops in proptest::collection::vec((0usize..30, -1i64..=1), 0..200),
        ) {
            let mut b = Buckets::default();
            for &l in &loads {
                b.push(l);
            }
            let mut shadow = loads.clone();
            for (slot, delta) in ops {
                let slot = slot % shadow.len();
                if delta == 0 {
                    let m = b.min().unwrap();
                    prop_assert_eq!(shadow[m as usize], *shadow.iter().min().unwrap());
                    let load = b.load[m as usize];
                    b.unlink(m);
                    b.append(m, load);
                } else {
                    let new = (shadow[slot] as i64 + delta).max(0) as u64;
                    shadow[slot] = new;
                    if b.load[slot] as u64 != new {
                        b.unlink(slot as u32);
                        b.append(slot as u32, new as u32);
                    }
                }
                let m = b.min().unwrap();
                prop_assert_eq!(shadow[m as usize], *shadow.iter().min().unwrap());
            }
        }
    }

    #[test]
    fn equal_loads_take_turns() {
        let mut b = Buckets::default();
        for _ in 0..3 {
            b.push(0);
        }
        let mut order = Vec::new();
        for _ in 0..6 {
            let m = b.min().unwrap();
            order.push(m);
            b.unlink(m);
            b.append(m, 0);
        }
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);
    }
}
