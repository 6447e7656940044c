//! The scenario file (TOML): what is simulated, parsed and validated into a [`Scenario`]. Every
//! problem is a [`ScenarioError`] naming the file, line, column and field, like the router's
//! configuration errors, so a typo in a scenario reads the same as a typo in `rondo.toml`.

mod queueing;

use rondo_core::Algorithm;
use serde::Deserialize;
use toml::Spanned;

use crate::located::Ctx;
pub use crate::located::ScenarioError;
use crate::service::RawService;
pub use crate::service::Service;
use queueing::parse_queueing;

/// Hard ceiling on events per algorithm, whatever the file says: a run always ends.
pub const MAX_EVENTS_CEILING: u64 = 200_000_000;
/// Hard ceiling on virtual time, seconds.
pub const MAX_DURATION_S: f64 = 86_400.0;
/// Hard ceiling on the routers of a tier (`routers`).
pub const MAX_ROUTERS: u32 = 64;
/// Hard ceiling on simulated members (and balls-into-bins bins).
pub const MAX_MEMBERS: usize = 1_000_000;

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name (defaults to the file stem).
    pub name: String,
    /// One line on what it shows.
    pub description: String,
    /// The seed (`--seed` overrides it).
    pub seed: u64,
    /// What is simulated.
    pub kind: Kind,
}

/// Queueing simulation or the balls-into-bins experiment.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Members as queues, requests arriving over virtual time.
    Queueing(Box<Queueing>),
    /// Mitzenmacher's balls into bins: n balls, n bins, no departures.
    BallsIntoBins(BallsIntoBins),
}

/// A picker the lab runs: one of the core's algorithms, or the oracle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Picker {
    /// A rondo-core algorithm through [`rondo_core::Balancer`].
    Core(Algorithm),
    /// Shortest expected delay with the true service times (the lab's yardstick).
    Oracle,
}

impl Picker {
    /// The name shown in tables.
    pub fn name(self) -> &'static str {
        match self {
            Picker::Core(a) => a.as_str(),
            Picker::Oracle => "oracle",
        }
    }
}

/// The balls-into-bins experiment.
#[derive(Debug, Clone)]
pub struct BallsIntoBins {
    /// Values of n (balls = bins = n).
    pub sizes: Vec<usize>,
    /// Independent trials per size and algorithm.
    pub trials: u32,
    /// Core algorithms placing the balls.
    pub algorithms: Vec<Algorithm>,
}

/// A queueing scenario.
#[derive(Debug, Clone)]
pub struct Queueing {
    /// Virtual time simulated, nanoseconds.
    pub duration: u64,
    /// Requests arriving before this are not counted in latency statistics, nanoseconds.
    pub warmup: u64,
    /// Events per algorithm after which the run stops (and says so).
    pub max_events: u64,
    /// The pickers, side by side; the oracle is always added.
    pub pickers: Vec<Picker>,
    /// The arrival process.
    pub arrivals: Arrivals,
    /// Members, expanded (`count` copies are separate members).
    pub members: Vec<SimMember>,
    /// Phases, in time order.
    pub phases: Vec<Phase>,
    /// Active health checks every this many ns (feeds `set_health` and `record_probe_round`).
    pub health: Option<HealthSim>,
    /// Load-agent reports every this many ns (feeds `report_agent`).
    pub agent_interval: Option<u64>,
    /// Distinct hash keys (a request's key is uniform among them); `hash` needs it.
    pub keys: Option<u64>,
    /// Distinct sticky sessions (granularity `session`): a request belongs to a uniform one of
    /// them and stays on its member while the member may keep it.
    pub sessions: Option<u64>,
    /// The callers' locality group.
    pub caller_group: Option<String>,
    /// Routers in the tier, each with its own `Balancer` fed only by the requests it placed
    /// (arrivals take them in turn); 1 is a single router.
    pub routers: u32,
    /// With a tier: the period (ns) at which its routers publish their load per member and
    /// count the others' (`shared_view_ms`); `None`: each router sees only its own.
    pub shared_view: Option<u64>,
}

/// Health checking as the router's prober would do it.
#[derive(Debug, Clone, Copy)]
pub struct HealthSim {
    /// Between rounds, ns.
    pub interval: u64,
    /// Consecutive passes that bring a member up.
    pub rise: u32,
    /// Consecutive failures that take it down.
    pub fall: u32,
    /// A probe slower than this fails, ns.
    pub timeout: u64,
}

/// How requests arrive.
#[derive(Debug, Clone, Copy)]
pub struct Arrivals {
    /// Base rate, requests per second.
    pub rate: f64,
    /// Extra bursts: `size` requests at once every `every` ns.
    pub burst: Option<(u32, u64)>,
    /// A flash crowd: from `at` for `length` ns the rate is multiplied by `multiplier`.
    pub flash: Option<(u64, u64, f64)>,
}

/// One simulated member.
#[derive(Debug, Clone)]
pub struct SimMember {
    /// Unique name.
    pub name: String,
    /// Weight given to the core.
    pub weight: u32,
    /// Locality group.
    pub group: Option<String>,
    /// Requests served at once; the rest wait in its FIFO queue.
    pub concurrency: u32,
    /// Its service time.
    pub service: Service,
    /// Present from the start (false when a `join` phase brings it in).
    pub initially_present: bool,
}

/// What happens to a member at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PhaseKind {
    /// Service times multiplied by `factor`.
    Slow(f64),
    /// Every request and probe is refused at once.
    FailFast,
    /// Requests hang until `timeout` ns, then fail; probes time out.
    FailSlow(u64),
    /// Back to normal.
    Recover,
    /// Leaves the cluster (as a registry removal would): its queued requests fail.
    Leave,
    /// Joins the cluster.
    Join,
    /// The operator drains it.
    Drain,
}

impl PhaseKind {
    /// Spelling in tables.
    pub fn name(self) -> &'static str {
        match self {
            PhaseKind::Slow(_) => "slow",
            PhaseKind::FailFast => "fail-fast",
            PhaseKind::FailSlow(_) => "fail-slow",
            PhaseKind::Recover => "recover",
            PhaseKind::Leave => "leave",
            PhaseKind::Join => "join",
            PhaseKind::Drain => "drain",
        }
    }
}

/// A phase: at `at` ns, `member` does `kind`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// ns.
    pub at: u64,
    /// Index into [`Queueing::members`].
    pub member: usize,
    /// What happens.
    pub kind: PhaseKind,
}

// ---- the file as written ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Option<String>,
    description: Option<String>,
    seed: Option<u64>,
    duration_s: Option<Spanned<f64>>,
    warmup_s: Option<Spanned<f64>>,
    max_events: Option<Spanned<u64>>,
    algorithms: Spanned<Vec<Spanned<String>>>,
    arrivals: Option<Spanned<RawArrivals>>,
    health: Option<Spanned<RawHealth>>,
    agent_interval_ms: Option<Spanned<u64>>,
    keys: Option<Spanned<u64>>,
    sessions: Option<Spanned<u64>>,
    caller_group: Option<String>,
    routers: Option<Spanned<u32>>,
    shared_view_ms: Option<Spanned<u64>>,
    #[serde(default)]
    member: Vec<Spanned<RawMember>>,
    #[serde(default)]
    phase: Vec<Spanned<RawPhase>>,
    balls_into_bins: Option<Spanned<RawBins>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArrivals {
    rate: Option<f64>,
    load: Option<f64>,
    burst_size: Option<u32>,
    burst_every_ms: Option<u64>,
    flash_at_s: Option<f64>,
    flash_for_s: Option<f64>,
    flash_multiplier: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval_ms: u64,
    #[serde(default = "two")]
    rise: u32,
    #[serde(default = "two")]
    fall: u32,
    #[serde(default = "thousand")]
    timeout_ms: u64,
}

fn two() -> u32 {
    2
}

fn thousand() -> u64 {
    1000
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMember {
    name: String,
    count: Option<u32>,
    weight: Option<u32>,
    group: Option<String>,
    concurrency: Option<u32>,
    service: Spanned<RawService>,
    #[serde(default)]
    absent: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    at_s: f64,
    member: Spanned<String>,
    kind: Spanned<String>,
    factor: Option<f64>,
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBins {
    sizes: Vec<u64>,
    trials: u32,
}

fn secs(v: f64) -> u64 {
    (v * 1e9).round() as u64
}

impl Scenario {
    /// Parses and validates a scenario; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let cx = Ctx { file, text };
        let raw: RawScenario = toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            let message = e.message().trim().trim_end_matches('.').to_owned();
            cx.err(offset, "", message)
        })?;
        let name = raw.name.clone().unwrap_or_else(|| {
            std::path::Path::new(file)
                .file_stem()
                .map_or_else(|| "scenario".to_owned(), |s| s.to_string_lossy().into_owned())
        });
        let description = raw.description.clone().unwrap_or_default();
        let seed = raw.seed.unwrap_or(1);
        let kind = match &raw.balls_into_bins {
            Some(b) => Kind::BallsIntoBins(parse_bins(&cx, &raw, b)?),
            None => Kind::Queueing(Box::new(parse_queueing(&cx, &raw)?)),
        };
        Ok(Scenario { name, description, seed, kind })
    }
}

fn parse_algorithms(cx: &Ctx<'_>, raw: &RawScenario) -> Result<Vec<Picker>, ScenarioError> {
    let mut out = Vec::new();
    if raw.algorithms.get_ref().is_empty() {
        return Err(cx.err(
            raw.algorithms.span().start,
            "algorithms",
            "name at least one algorithm",
        ));
    }
    for (i, a) in raw.algorithms.get_ref().iter().enumerate() {
        let picker = match a.get_ref().as_str() {
            "oracle" => Picker::Oracle,
            s => match Algorithm::parse(s) {
                Some(alg) => Picker::Core(alg),
                None => {
                    let known: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
                    return Err(cx.err(
                        a.span().start,
                        format!("algorithms[{i}]"),
                        format!("unknown algorithm {s:?} (known: {}, oracle)", known.join(", ")),
                    ));
                }
            },
        };
        if out.contains(&picker) {
            return Err(cx.err(a.span().start, format!("algorithms[{i}]"), "listed twice"));
        }
        out.push(picker);
    }
    Ok(out)
}

fn parse_bins(
    cx: &Ctx<'_>,
    raw: &RawScenario,
    b: &Spanned<RawBins>,
) -> Result<BallsIntoBins, ScenarioError> {
    let at = b.span().start;
    if !raw.member.is_empty()
        || raw.arrivals.is_some()
        || !raw.phase.is_empty()
        || raw.routers.is_some()
        || raw.shared_view_ms.is_some()
    {
        return Err(cx.err(
            at,
            "balls_into_bins",
            "a balls-into-bins scenario has no members, arrivals, phases or routers",
        ));
    }
    let mut algorithms = Vec::new();
    for (i, p) in parse_algorithms(cx, raw)?.into_iter().enumerate() {
        match p {
            Picker::Core(
                a @ (Algorithm::Random
                | Algorithm::P2cEwma
                | Algorithm::LeastSessions
                | Algorithm::RoundRobin),
            ) => algorithms.push(a),
            _ => {
                return Err(cx.err(
                    raw.algorithms.get_ref()[i].span().start,
                    format!("algorithms[{i}]"),
                    "balls into bins takes random, p2c-ewma, least-sessions or round-robin",
                ));
            }
        }
    }
    let b = b.get_ref();
    if b.sizes.is_empty() || b.sizes.iter().any(|&n| n < 2 || n as usize > MAX_MEMBERS) {
        return Err(cx.err(
            at,
            "balls_into_bins.sizes",
            format!("sizes must be 2..={MAX_MEMBERS}"),
        ));
    }
    if b.trials == 0 || b.trials > 1000 {
        return Err(cx.err(at, "balls_into_bins.trials", "trials must be 1..=1000"));
    }
    Ok(BallsIntoBins {
        sizes: b.sizes.iter().map(|&n| n as usize).collect(),
        trials: b.trials,
        algorithms,
    })
}
