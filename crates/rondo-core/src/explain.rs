//! Why a pick went the way it did: each [`Decision`] carries the deciding numbers in a small
//! fixed-size [`Why`] (no allocation on the hot path), and [`crate::Balancer::explain`] expands it
//! with the whole candidate table for the admin API.

use std::fmt;

use crate::model::Algorithm;

/// Which members a pick chose among.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Scope {
    /// Healthy active members of the caller's locality group.
    Local,
    /// Healthy active members of every group (no group given, none preferred, or the local group
    /// has no healthy member: spill).
    #[default]
    All,
    /// Panic mode: too few healthy members, so every active member regardless of health.
    Panic {
        /// Healthy active members.
        healthy: usize,
        /// Active members.
        active: usize,
    },
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Local => f.write_str("the local group"),
            Scope::All => f.write_str("all groups"),
            Scope::Panic { healthy, active } => {
                write!(f, "panic: {healthy} of {active} active members healthy, balancing over all")
            }
        }
    }
}

/// The deciding numbers of one pick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Why {
    /// `round-robin`: position in the candidate list.
    RoundRobin {
        /// Slot chosen.
        position: usize,
        /// Candidates.
        of: usize,
    },
    /// `random`: uniform among `of`.
    Random {
        /// Candidates.
        of: usize,
    },
    /// `weighted`: the member's effective weight and how many picks it has had this cycle.
    Weighted {
        /// Effective weight (after slow start).
        weight: u64,
        /// Total effective weight.
        total: u64,
    },
    /// `rotating`: the context's start in the randomized list and how far down it went.
    Rotating {
        /// Context (rotation) number.
        context: u32,
        /// Entries skipped because they were not eligible.
        skipped: usize,
    },
    /// `response-time` / `response-time-clb`: rank in the latest probe round.
    ResponseTime {
        /// 0 = fastest.
        rank: usize,
        /// Probe round trip, microseconds.
        rtt_us: u64,
    },
    /// `response-time` / `response-time-clb` before the first probe round: round robin.
    ResponseTimeUnranked,
    /// `least-sessions`: fewest active per weight.
    LeastSessions {
        /// Sessions + in-flight of the winner.
        active: u64,
        /// Its effective weight.
        weight: u64,
    },
    /// `least-cpu`: lowest reported CPU use.
    LeastCpu {
        /// Reported CPU use, percent.
        cpu_percent: f32,
    },
    /// `most-free-memory`: most reported free memory.
    MostFreeMemory {
        /// Reported free memory, MiB.
        free_mib: u64,
    },
    /// `least-cpu` / `most-free-memory` without fresh reports from every candidate.
    AgentFallback {
        /// Candidates lacking a fresh report.
        missing: usize,
        /// Sessions + in-flight of the winner.
        active: u64,
    },
    /// `p2c-ewma`: the two sampled members' loads (EWMA ns x (in-flight + 1)) and weights; the
    /// cost compared is load / weight. Both EWMAs are decayed to the later of the two members'
    /// last samples (the same factor to now applies to both, so it does not change the comparison
    /// and is not computed on the hot path).
    P2c {
        /// The winner's load.
        chosen_load: f64,
        /// The winner's effective weight.
        chosen_weight: u64,
        /// The loser's member index.
        other: usize,
        /// The loser's load.
        other_load: f64,
        /// The loser's effective weight.
        other_weight: u64,
    },
    /// `p2c-ewma` exploration pick (uniform), so no member is starved forever.
    P2cExplore,
    /// `adaptive`: the winner's expected delay (ns per unit of weight) and, when another
    /// candidate was compared, the best loser and its cost; `probe` says the winner's estimate
    /// came from its probe round trip (higher than its passive EWMA).
    Adaptive {
        /// The winner's cost: estimate ns x (in-flight + 1) / weight.
        cost: f64,
        /// Whether the probe round trip set the winner's estimate.
        probe: bool,
        /// The runner-up's member index and cost.
        runner_up: Option<(usize, f64)>,
    },
    /// `adaptive` exploration pick (uniform, one in [`crate::balancer::ADAPTIVE_EXPLORE_ONE_IN`]).
    AdaptiveExplore,
    /// `p2c-ewma` or `adaptive` with a single candidate.
    Only,
    /// `hash`: the key, and how many members the bounded-load walk passed over.
    Hash {
        /// The request's key hash.
        key: u64,
        /// Members skipped for being at their load cap.
        skipped: usize,
    },
    /// `hash` without a key: random.
    HashNoKey,
    /// The algorithm's choice was excluded (already tried) or held back by slow start, so the
    /// next eligible member after it was taken.
    Failover {
        /// The member first chosen.
        from: usize,
        /// Whether slow start (rather than exclusion) moved the pick.
        slow_start: bool,
    },
}

/// One pick's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Member index in the cluster's member list.
    pub member: usize,
    /// The algorithm that chose.
    pub algorithm: Algorithm,
    /// Among whom.
    pub scope: Scope,
    /// The deciding numbers.
    pub why: Why,
}

/// A decision expanded with every candidate's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// The decision.
    pub decision: Decision,
    /// The chosen member's name.
    pub chosen: String,
    /// Every candidate at the time of the explanation.
    pub candidates: Vec<CandidateInfo>,
    /// A sentence a person can read.
    pub summary: String,
}

/// One candidate's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateInfo {
    /// Member name.
    pub name: String,
    /// Configured weight.
    pub weight: u32,
    /// Effective weight after slow start.
    pub effective_weight: u64,
    /// In-flight requests.
    pub in_flight: u32,
    /// Sessions.
    pub sessions: u32,
    /// Peak-EWMA latency, microseconds.
    pub ewma_us: u64,
    /// Latest probe round trip, microseconds.
    pub probe_rtt_us: Option<u64>,
    /// Reported CPU use, percent, if fresh.
    pub cpu_percent: Option<f32>,
    /// Reported free memory, MiB, if fresh.
    pub free_mib: Option<u64>,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Why::RoundRobin { position, of } => {
                write!(f, "next in order: position {position} of {of}")
            }
            Why::Random { of } => write!(f, "uniform random among {of}"),
            Why::Weighted { weight, total } => {
                write!(f, "smooth weighted turn: weight {weight} of {total}")
            }
            Why::Rotating { context, skipped } => {
                write!(
                    f,
                    "context {context}: first live member of the rotated list ({skipped} skipped)"
                )
            }
            Why::ResponseTime { rank, rtt_us } => {
                write!(f, "rank {rank} in the response-time table (probe {rtt_us} us)")
            }
            Why::ResponseTimeUnranked => f.write_str("no probe round yet: round robin"),
            Why::LeastSessions { active, weight } => {
                write!(f, "fewest active per weight: {active} active, weight {weight}")
            }
            Why::LeastCpu { cpu_percent } => write!(f, "lowest reported cpu: {cpu_percent:.1}%"),
            Why::MostFreeMemory { free_mib } => {
                write!(f, "most reported free memory: {free_mib} MiB")
            }
            Why::AgentFallback { missing, active } => write!(
                f,
                "{missing} candidate(s) without a fresh agent report: fell back to least-sessions ({active} active)"
            ),
            Why::P2c { chosen_load, chosen_weight, other, other_load, other_weight } => write!(
                f,
                "two choices: cost {:.0} beat member {other} at {:.0}",
                chosen_load / chosen_weight.max(1) as f64,
                other_load / other_weight.max(1) as f64
            ),
            Why::P2cExplore => f.write_str("exploration pick (uniform) so no member starves"),
            Why::Adaptive { cost, probe, runner_up } => {
                let source = if probe { "probe round trip" } else { "passive latency" };
                write!(f, "lowest expected delay: cost {cost:.0} ({source})")?;
                match runner_up {
                    Some((m, c)) => write!(f, ", next best member {m} at {c:.0}"),
                    None => Ok(()),
                }
            }
            Why::AdaptiveExplore => {
                f.write_str("exploration pick (uniform) so every member keeps being measured")
            }
            Why::Only => f.write_str("only candidate"),
            Why::Hash { key, skipped } => {
                write!(
                    f,
                    "consistent hash of key {key:#018x}, {skipped} member(s) at load cap skipped"
                )
            }
            Why::HashNoKey => f.write_str("no hash key in the request: random"),
            Why::Failover { from, slow_start: true } => {
                write!(f, "member {from} held back by slow start: next eligible member")
            }
            Why::Failover { from, slow_start: false } => {
                write!(f, "member {from} already tried: next eligible member")
            }
        }
    }
}
