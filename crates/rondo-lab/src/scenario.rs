//! The scenario file (TOML): what is simulated, parsed and validated into a [`Scenario`]. Every
//! problem is a [`ScenarioError`] naming the file, line, column and field, like the router's
//! configuration errors, so a typo in a scenario reads the same as a typo in `rondo.toml`.

use rondo_core::Algorithm;
use serde::Deserialize;
use toml::Spanned;

use crate::located::Ctx;
pub use crate::located::ScenarioError;
pub use crate::service::Service;
use crate::service::{RawService, parse_service};

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

fn parse_queueing(cx: &Ctx<'_>, raw: &RawScenario) -> Result<Queueing, ScenarioError> {
    let pickers = {
        let mut p = parse_algorithms(cx, raw)?;
        if !p.contains(&Picker::Oracle) {
            p.push(Picker::Oracle);
        }
        p
    };
    let Some(duration) = &raw.duration_s else {
        return Err(cx.err(
            0,
            "duration_s",
            "missing: how many seconds of virtual time to simulate",
        ));
    };
    let d = *duration.get_ref();
    if !(d.is_finite() && d > 0.0 && d <= MAX_DURATION_S) {
        return Err(cx.err(
            duration.span().start,
            "duration_s",
            format!("must be in (0, {MAX_DURATION_S}]"),
        ));
    }
    let warmup = match &raw.warmup_s {
        Some(w) if !(w.get_ref().is_finite() && *w.get_ref() >= 0.0 && *w.get_ref() < d) => {
            return Err(cx.err(
                w.span().start,
                "warmup_s",
                "must be at least 0 and below duration_s",
            ));
        }
        Some(w) => secs(*w.get_ref()),
        None => 0,
    };
    let max_events = match &raw.max_events {
        Some(m) if *m.get_ref() == 0 || *m.get_ref() > MAX_EVENTS_CEILING => {
            return Err(cx.err(
                m.span().start,
                "max_events",
                format!("must be 1..={MAX_EVENTS_CEILING}"),
            ));
        }
        Some(m) => *m.get_ref(),
        None => 50_000_000,
    };
    // Members.
    if raw.member.is_empty() {
        return Err(cx.err(0, "member", "a scenario needs at least one [[member]]"));
    }
    let mut members: Vec<SimMember> = Vec::new();
    for (i, m) in raw.member.iter().enumerate() {
        let at = m.span().start;
        let f = format!("member[{i}]");
        let r = m.get_ref();
        let count = r.count.unwrap_or(1);
        if count == 0 || members.len() + count as usize > MAX_MEMBERS {
            return Err(cx.err(
                at,
                format!("{f}.count"),
                format!("count must be 1 and at most {MAX_MEMBERS} members in all"),
            ));
        }
        let weight = r.weight.unwrap_or(100);
        if weight == 0 || weight > 1_000_000 {
            return Err(cx.err(at, format!("{f}.weight"), "weight must be 1..=1000000"));
        }
        let concurrency = r.concurrency.unwrap_or(1);
        if concurrency == 0 || concurrency > 100_000 {
            return Err(cx.err(at, format!("{f}.concurrency"), "concurrency must be 1..=100000"));
        }
        if r.name.is_empty() {
            return Err(cx.err(at, format!("{f}.name"), "name must not be empty"));
        }
        let service = parse_service(cx, &r.service, &format!("{f}.service"))?;
        for k in 0..count {
            let name = if count == 1 { r.name.clone() } else { format!("{}-{}", r.name, k + 1) };
            if members.iter().any(|o| o.name == name) {
                return Err(cx.err(
                    at,
                    format!("{f}.name"),
                    format!("member {name:?} defined twice"),
                ));
            }
            members.push(SimMember {
                name,
                weight,
                group: r.group.clone(),
                concurrency,
                service,
                initially_present: !r.absent,
            });
        }
    }
    // Arrivals.
    let Some(arr) = &raw.arrivals else {
        return Err(cx.err(0, "arrivals", "missing [arrivals] (rate or load)"));
    };
    let at = arr.span().start;
    let a = arr.get_ref();
    let capacity: f64 = members
        .iter()
        .filter(|m| m.initially_present)
        .map(|m| f64::from(m.concurrency) * 1e9 / m.service.mean())
        .sum();
    let rate = match (a.rate, a.load) {
        (Some(r), None) if r.is_finite() && r > 0.0 && r <= 1e7 => r,
        (None, Some(l)) if l.is_finite() && l > 0.0 && l <= 10.0 => l * capacity,
        (Some(_), Some(_)) => return Err(cx.err(at, "arrivals", "give rate or load, not both")),
        (Some(_), None) => {
            return Err(cx.err(at, "arrivals.rate", "rate must be in (0, 10000000] per second"));
        }
        (None, Some(_)) => {
            return Err(cx.err(
                at,
                "arrivals.load",
                "load must be in (0, 10] (a share of the members' capacity)",
            ));
        }
        (None, None) => {
            return Err(cx.err(
                at,
                "arrivals",
                "give rate (per second) or load (share of capacity)",
            ));
        }
    };
    if rate > 1e7 {
        return Err(cx.err(
            at,
            "arrivals.load",
            "the load works out above 10000000 requests per second",
        ));
    }
    let burst = match (a.burst_size, a.burst_every_ms) {
        (None, None) => None,
        (Some(s), Some(e)) if s > 0 && s <= 100_000 && e > 0 => Some((s, e * 1_000_000)),
        _ => {
            return Err(cx.err(
                at,
                "arrivals.burst_size",
                "bursts need burst_size 1..=100000 and burst_every_ms > 0",
            ));
        }
    };
    let flash = match (a.flash_at_s, a.flash_for_s, a.flash_multiplier) {
        (None, None, None) => None,
        (Some(at_s), Some(for_s), Some(mult))
            if at_s >= 0.0
                && for_s > 0.0
                && mult.is_finite()
                && mult > 0.0
                && rate * mult <= 1e7 =>
        {
            Some((secs(at_s), secs(for_s), mult))
        }
        _ => {
            return Err(cx.err(
                at,
                "arrivals.flash_at_s",
                "a flash crowd needs flash_at_s >= 0, flash_for_s > 0 and flash_multiplier > 0 (rate x multiplier at most 10000000)",
            ));
        }
    };
    // Phases.
    let mut phases = Vec::new();
    for (i, p) in raw.phase.iter().enumerate() {
        let at = p.span().start;
        let f = format!("phase[{i}]");
        let r = p.get_ref();
        if !(r.at_s.is_finite() && r.at_s >= 0.0 && r.at_s <= d) {
            return Err(cx.err(
                at,
                format!("{f}.at_s"),
                "at_s must be within the run (0..=duration_s)",
            ));
        }
        let Some(member) = members.iter().position(|m| m.name == *r.member.get_ref()) else {
            return Err(cx.err(
                r.member.span().start,
                format!("{f}.member"),
                format!("no member named {:?}", r.member.get_ref()),
            ));
        };
        let kind = match r.kind.get_ref().as_str() {
            "slow" => match r.factor {
                Some(x) if x.is_finite() && x > 0.0 && x <= 1e4 => PhaseKind::Slow(x),
                _ => {
                    return Err(cx.err(
                        at,
                        format!("{f}.factor"),
                        "slow needs a factor in (0, 10000]",
                    ));
                }
            },
            "fail-fast" => PhaseKind::FailFast,
            "fail-slow" => match r.timeout_ms.unwrap_or(1000) {
                t @ 1..=600_000 => PhaseKind::FailSlow(t * 1_000_000),
                _ => {
                    return Err(cx.err(
                        at,
                        format!("{f}.timeout_ms"),
                        "timeout_ms must be 1..=600000",
                    ));
                }
            },
            "recover" => PhaseKind::Recover,
            "leave" => PhaseKind::Leave,
            "join" => PhaseKind::Join,
            "drain" => PhaseKind::Drain,
            other => {
                return Err(cx.err(
                    r.kind.span().start,
                    format!("{f}.kind"),
                    format!("unknown phase {other:?} (slow, fail-fast, fail-slow, recover, leave, join, drain)"),
                ));
            }
        };
        if kind == PhaseKind::Join && members[member].initially_present {
            return Err(cx.err(
                r.member.span().start,
                format!("{f}.member"),
                format!(
                    "member {:?} joins but is present from the start (set absent = true)",
                    r.member.get_ref()
                ),
            ));
        }
        phases.push(Phase { at: secs(r.at_s), member, kind });
    }
    phases.sort_by_key(|p| p.at);
    if !members.iter().any(|m| m.initially_present) {
        return Err(cx.err(0, "member", "no member is present at the start"));
    }
    let health = match &raw.health {
        Some(h) => {
            let r = h.get_ref();
            if r.interval_ms == 0 || r.rise == 0 || r.fall == 0 || r.timeout_ms == 0 {
                return Err(cx.err(
                    h.span().start,
                    "health",
                    "interval_ms, rise, fall and timeout_ms must be positive",
                ));
            }
            Some(HealthSim {
                interval: r.interval_ms * 1_000_000,
                rise: r.rise,
                fall: r.fall,
                timeout: r.timeout_ms * 1_000_000,
            })
        }
        None => None,
    };
    let agent_interval = match &raw.agent_interval_ms {
        Some(v) if *v.get_ref() == 0 => {
            return Err(cx.err(v.span().start, "agent_interval_ms", "must be positive"));
        }
        Some(v) => Some(*v.get_ref() * 1_000_000),
        None => None,
    };
    let positive_count =
        |v: &Option<Spanned<u64>>, field: &str| -> Result<Option<u64>, ScenarioError> {
            match v {
                Some(k) if *k.get_ref() == 0 || *k.get_ref() > 100_000_000 => {
                    Err(cx.err(k.span().start, field, "must be 1..=100000000"))
                }
                Some(k) => Ok(Some(*k.get_ref())),
                None => Ok(None),
            }
        };
    let keys = positive_count(&raw.keys, "keys")?;
    let sessions = positive_count(&raw.sessions, "sessions")?;
    if pickers.contains(&Picker::Core(Algorithm::Hash)) && keys.is_none() {
        return Err(cx.err(
            raw.algorithms.span().start,
            "keys",
            "algorithm hash needs keys (how many distinct hash keys)",
        ));
    }
    let routers = match &raw.routers {
        Some(r) if !(1..=MAX_ROUTERS).contains(r.get_ref()) => {
            return Err(cx.err(r.span().start, "routers", format!("must be 1..={MAX_ROUTERS}")));
        }
        Some(r) => *r.get_ref(),
        None => 1,
    };
    let shared_view = match &raw.shared_view_ms {
        Some(s) if routers < 2 => {
            return Err(cx.err(
                s.span().start,
                "shared_view_ms",
                "a shared view needs a tier: routers = 2 or more",
            ));
        }
        Some(s) if !(1..=10_000).contains(s.get_ref()) => {
            return Err(cx.err(s.span().start, "shared_view_ms", "must be 1..=10000"));
        }
        Some(s) => Some(*s.get_ref() * 1_000_000),
        None => None,
    };
    Ok(Queueing {
        duration: secs(d),
        warmup,
        max_events,
        pickers,
        arrivals: Arrivals { rate, burst, flash },
        members,
        phases,
        health,
        agent_interval,
        keys,
        sessions,
        caller_group: raw.caller_group.clone(),
        routers,
        shared_view,
    })
}
