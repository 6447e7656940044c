//! Consistent hashing for `hash`: Karger et al.'s ring with virtual nodes ("Consistent hashing
//! and random trees", STOC 1997; ketama's layout) or Google's Maglev table (Eisenbud et al.,
//! "Maglev: A Fast and Reliable Software Network Load Balancer", NSDI 2016), both with
//! Mirrokni, Thorup and Zadimoghaddam's bounded loads ("Consistent Hashing with Bounded Loads",
//! SODA 2018): a key whose member is at its cap walks on to the next member that is not.
//!
//! Tables are built over the candidate set, so a member that leaves takes only its own keys with
//! it (about 1/N of them) and one that joins takes about 1/(N+1).

use crate::hash::hash_with_seed;
use crate::model::{ClusterSpec, HashTable};

use super::candidates::Candidates;

/// Maglev table sizes: the smallest prime at or above 2^16, 2^17, ... The table is kept at least
/// 100 times the member count, as the paper recommends for an even spread.
const MAGLEV_PRIMES: [u64; 9] =
    [65537, 131_101, 262_147, 524_309, 1_048_583, 2_097_169, 4_194_319, 8_388_617, 16_777_259];

#[derive(Debug, Clone)]
pub(crate) enum Table {
    /// Sorted (point, slot).
    Ring(Vec<(u64, u32)>),
    /// Entry -> slot.
    Maglev(Vec<u32>),
}

impl Table {
    pub(crate) fn build(spec: &ClusterSpec, cands: &Candidates) -> Table {
        match spec.policy.hash.table {
            HashTable::Ring => Table::Ring(build_ring(spec, cands)),
            HashTable::Maglev => Table::Maglev(build_maglev(spec, cands)),
        }
    }

    /// The slot for `key`, walking past slots that `fits` refuses; and how many were passed.
    pub(crate) fn lookup(&self, key: u64, fits: impl Fn(u32) -> bool) -> (u32, usize) {
        match self {
            Table::Ring(points) => {
                let start = points.partition_point(|p| p.0 < key);
                walk(points.len(), |i| points[(start + i) % points.len()].1, fits)
            }
            Table::Maglev(table) => {
                let start = (key % table.len() as u64) as usize;
                walk(table.len(), |i| table[(start + i) % table.len()], fits)
            }
        }
    }
}

fn walk(len: usize, at: impl Fn(usize) -> u32, fits: impl Fn(u32) -> bool) -> (u32, usize) {
    let first = at(0);
    let mut skipped = 0;
    let mut last_refused = u32::MAX;
    for i in 0..len {
        let s = at(i);
        if fits(s) {
            return (s, skipped);
        }
        if s != last_refused {
            skipped += 1;
            last_refused = s;
        }
    }
    (first, skipped)
}

fn build_ring(spec: &ClusterSpec, cands: &Candidates) -> Vec<(u64, u32)> {
    let n = cands.slots.len() as u64;
    let avg = (cands.total_weight / n.max(1)).max(1);
    let vnodes = u64::from(spec.policy.hash.ring_vnodes.max(1));
    let mut points = Vec::new();
    for (slot, (&m, &w)) in cands.slots.iter().zip(&cands.eff_weight).enumerate() {
        let name = spec.members[m as usize].name.as_bytes();
        let count = (vnodes * w).div_ceil(avg).max(1);
        for v in 0..count {
            points.push((hash_with_seed(name, v), slot as u32));
        }
    }
    points.sort_unstable();
    points
}

fn build_maglev(spec: &ClusterSpec, cands: &Candidates) -> Vec<u32> {
    let n = cands.slots.len();
    let want = (n as u64).saturating_mul(100);
    let size = MAGLEV_PRIMES
        .iter()
        .copied()
        .find(|&p| p >= want)
        .unwrap_or(MAGLEV_PRIMES[MAGLEV_PRIMES.len() - 1]);
    let max_w = cands.eff_weight.iter().copied().max().unwrap_or(1) as f64;
    let mut perm: Vec<(u64, u64, u64)> = cands
        .slots
        .iter()
        .map(|&m| {
            let name = spec.members[m as usize].name.as_bytes();
            let offset = hash_with_seed(name, 0xA5A5) % size;
            let skip = hash_with_seed(name, 0x5A5A) % (size - 1) + 1;
            (offset, skip, 0u64)
        })
        .collect();
    let mut credit = vec![0f64; n];
    let mut table = vec![u32::MAX; size as usize];
    let mut filled = 0u64;
    while filled < size {
        for slot in 0..n {
            credit[slot] += cands.eff_weight[slot] as f64 / max_w;
            if credit[slot] < 1.0 {
                continue;
            }
            credit[slot] -= 1.0;
            let (offset, skip, next) = &mut perm[slot];
            loop {
                let entry = (*offset + *next * *skip) % size;
                *next += 1;
                if table[entry as usize] == u32::MAX {
                    table[entry as usize] = slot as u32;
                    filled += 1;
                    break;
                }
            }
            if filled == size {
                break;
            }
        }
    }
    table
}
