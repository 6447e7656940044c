//! Mitzenmacher's balls into bins through the real pickers: `n` balls placed one after another
//! into `n` bins (members) that never empty (`begin_request` without `end_request`), with the
//! time frozen so `p2c-ewma`'s latency estimates stay equal and its cost is in-flight alone,
//! i.e. the two-choice process (with rondo's 1-in-100 exploration pick). The maximum load is
//! compared with the theory: one choice gives about `ln n / ln ln n`, two choices
//! `ln ln n / ln 2 + O(1)` (Azar, Broder, Karlin and Upfal 1994; Mitzenmacher 2001).

use std::fmt::Write as _;
use std::sync::Arc;

use rondo_core::{
    Algorithm, Balancer, ClusterSpec, Instant, MemberSpec, PickRequest, Policy, SplitMix64,
    UpstreamProtocol,
};

use crate::scenario::{BallsIntoBins, Scenario};

/// The maximum loads seen for one algorithm and size, one per trial.
#[derive(Debug, Clone)]
pub struct BinsResult {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// n.
    pub n: usize,
    /// Maximum bin load of each trial.
    pub max_loads: Vec<u32>,
}

/// Places `n` balls into `n` bins with `algorithm` and returns the fullest bin's load.
pub fn max_load(algorithm: Algorithm, n: usize, seed: u64) -> u32 {
    let members = (0..n)
        .map(|i| MemberSpec {
            name: format!("bin{i}"),
            address: format!("bin{i}.lab:80"),
            weight: 100,
            group: None,
            admin: Default::default(),
        })
        .collect();
    let spec = Arc::new(ClusterSpec {
        name: "bins".to_owned(),
        members,
        policy: Policy { algorithm, ..Policy::default() },
        upstream_protocol: UpstreamProtocol::Http1,
        sticky: Default::default(),
        upstream_tls: None,
    });
    let mut balancer = Balancer::new(spec, Instant::ZERO);
    let mut rng = SplitMix64::new(seed);
    let req = PickRequest { now: Instant::ZERO, ..PickRequest::default() };
    for _ in 0..n {
        // Every bin is always eligible, so a pick cannot fail; a failure would be a core bug
        // and is surfaced as an impossible maximum instead of a panic.
        match balancer.pick(&req, &mut rng) {
            Ok(d) => balancer.begin_request(d.member),
            Err(_) => return u32::MAX,
        }
    }
    balancer.states().iter().map(|s| s.load.in_flight).max().unwrap_or(0)
}

/// Runs every size, algorithm and trial.
pub fn run(b: &BallsIntoBins, seed: u64, progress: &mut dyn FnMut(f64)) -> Vec<BinsResult> {
    let total = (b.sizes.len() * b.algorithms.len()) as f64;
    let mut out = Vec::new();
    for (si, &n) in b.sizes.iter().enumerate() {
        for (ai, &algorithm) in b.algorithms.iter().enumerate() {
            let max_loads = (0..b.trials)
                .map(|t| {
                    let s = seed ^ (n as u64).rotate_left(17) ^ u64::from(t).rotate_left(41);
                    max_load(algorithm, n, s)
                })
                .collect();
            out.push(BinsResult { algorithm, n, max_loads });
            progress((si * b.algorithms.len() + ai + 1) as f64 / total);
        }
    }
    out
}

/// `ln n / ln ln n`: the one-choice maximum load's leading term.
pub fn one_choice_theory(n: usize) -> f64 {
    let l = (n as f64).ln();
    l / l.ln()
}

/// `ln ln n / ln 2`: the two-choice maximum load's leading term.
pub fn two_choice_theory(n: usize) -> f64 {
    (n as f64).ln().ln() / std::f64::consts::LN_2
}

/// The text table.
pub fn table(s: &Scenario, b: &BallsIntoBins, results: &[BinsResult]) -> String {
    let mut t = String::new();
    if s.description.is_empty() {
        let _ = writeln!(t, "scenario {}", s.name);
    } else {
        let _ = writeln!(t, "scenario {}: {}", s.name, s.description);
    }
    let _ = writeln!(t, "seed {}, {} trials per cell, balls = bins = n", s.seed, b.trials);
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "| n | algorithm | max load: min | mean | max | ln n / ln ln n | ln ln n / ln 2 |"
    );
    let _ = writeln!(t, "|---:|---|---:|---:|---:|---:|---:|");
    for r in results {
        let min = r.max_loads.iter().min().copied().unwrap_or(0);
        let max = r.max_loads.iter().max().copied().unwrap_or(0);
        let mean =
            r.max_loads.iter().map(|&v| f64::from(v)).sum::<f64>() / r.max_loads.len() as f64;
        let _ = writeln!(
            t,
            "| {} | {} | {} | {:.2} | {} | {:.2} | {:.2} |",
            r.n,
            r.algorithm,
            min,
            mean,
            max,
            one_choice_theory(r.n),
            two_choice_theory(r.n)
        );
    }
    t
}
