//! A queueing scenario's validation, one step per part of the file (run length, members,
//! arrivals, phases, health, counts, the router tier), each naming its own fields in errors.
//! The steps run in the file's order of checks, so the first problem reported stays the same.

use rondo_core::Algorithm;
use toml::Spanned;

use super::{
    Arrivals, HealthSim, MAX_DURATION_S, MAX_EVENTS_CEILING, MAX_MEMBERS, MAX_ROUTERS, Phase,
    PhaseKind, Picker, Queueing, RawArrivals, RawPhase, RawScenario, SimMember, parse_algorithms,
    secs,
};
use crate::located::{Ctx, ScenarioError};
use crate::service::parse_service;

/// A queueing scenario (one without `balls_into_bins`), validated.
pub(super) fn parse_queueing(cx: &Ctx<'_>, raw: &RawScenario) -> Result<Queueing, ScenarioError> {
    let mut pickers = parse_algorithms(cx, raw)?;
    if !pickers.contains(&Picker::Oracle) {
        pickers.push(Picker::Oracle);
    }
    let (d, warmup, max_events) = run_length(cx, raw)?;
    let members = members(cx, raw)?;
    let arrivals = arrivals(cx, raw, &members)?;
    let phases = phases(cx, raw, &members, d)?;
    if !members.iter().any(|m| m.initially_present) {
        return Err(cx.err(0, "member", "no member is present at the start"));
    }
    let health = health(cx, raw)?;
    let agent_interval = match &raw.agent_interval_ms {
        Some(v) if *v.get_ref() == 0 => {
            return Err(cx.err(v.span().start, "agent_interval_ms", "must be positive"));
        }
        Some(v) => Some(*v.get_ref() * 1_000_000),
        None => None,
    };
    let keys = positive_count(cx, &raw.keys, "keys")?;
    let sessions = positive_count(cx, &raw.sessions, "sessions")?;
    if pickers.contains(&Picker::Core(Algorithm::Hash)) && keys.is_none() {
        return Err(cx.err(
            raw.algorithms.span().start,
            "keys",
            "algorithm hash needs keys (how many distinct hash keys)",
        ));
    }
    let (routers, shared_view) = tier(cx, raw)?;
    Ok(Queueing {
        duration: secs(d),
        warmup,
        max_events,
        pickers,
        arrivals,
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

/// `duration_s` (seconds, as written), `warmup_s` (ns) and `max_events`.
fn run_length(cx: &Ctx<'_>, raw: &RawScenario) -> Result<(f64, u64, u64), ScenarioError> {
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
    Ok((d, warmup, max_events))
}

/// The `[[member]]` tables, each expanded into its `count` members.
fn members(cx: &Ctx<'_>, raw: &RawScenario) -> Result<Vec<SimMember>, ScenarioError> {
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
    Ok(members)
}

/// `[arrivals]`: the base rate (given, or a share of the present members' capacity), bursts
/// and a flash crowd.
fn arrivals(
    cx: &Ctx<'_>,
    raw: &RawScenario,
    members: &[SimMember],
) -> Result<Arrivals, ScenarioError> {
    let Some(arr) = &raw.arrivals else {
        return Err(cx.err(0, "arrivals", "missing [arrivals] (rate or load)"));
    };
    let at = arr.span().start;
    let a = arr.get_ref();
    let rate = rate(cx, at, a, members)?;
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
    Ok(Arrivals { rate, burst, flash })
}

/// The base rate, requests per second: `rate`, or `load` times the capacity of the members
/// present at the start.
fn rate(
    cx: &Ctx<'_>,
    at: usize,
    a: &RawArrivals,
    members: &[SimMember],
) -> Result<f64, ScenarioError> {
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
    Ok(rate)
}

/// The `[[phase]]` tables, in time order; `d` is the run's length in seconds.
fn phases(
    cx: &Ctx<'_>,
    raw: &RawScenario,
    members: &[SimMember],
    d: f64,
) -> Result<Vec<Phase>, ScenarioError> {
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
        let kind = phase_kind(cx, at, &f, r)?;
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
    Ok(phases)
}

/// What a phase does (`kind`, with its `factor` or `timeout_ms`); `f` names the phase.
fn phase_kind(cx: &Ctx<'_>, at: usize, f: &str, r: &RawPhase) -> Result<PhaseKind, ScenarioError> {
    Ok(match r.kind.get_ref().as_str() {
        "slow" => match r.factor {
            Some(x) if x.is_finite() && x > 0.0 && x <= 1e4 => PhaseKind::Slow(x),
            _ => {
                return Err(cx.err(at, format!("{f}.factor"), "slow needs a factor in (0, 10000]"));
            }
        },
        "fail-fast" => PhaseKind::FailFast,
        "fail-slow" => match r.timeout_ms.unwrap_or(1000) {
            t @ 1..=600_000 => PhaseKind::FailSlow(t * 1_000_000),
            _ => {
                return Err(cx.err(at, format!("{f}.timeout_ms"), "timeout_ms must be 1..=600000"));
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
    })
}

/// `[health]`, when given.
fn health(cx: &Ctx<'_>, raw: &RawScenario) -> Result<Option<HealthSim>, ScenarioError> {
    let Some(h) = &raw.health else { return Ok(None) };
    let r = h.get_ref();
    if r.interval_ms == 0 || r.rise == 0 || r.fall == 0 || r.timeout_ms == 0 {
        return Err(cx.err(
            h.span().start,
            "health",
            "interval_ms, rise, fall and timeout_ms must be positive",
        ));
    }
    Ok(Some(HealthSim {
        interval: r.interval_ms * 1_000_000,
        rise: r.rise,
        fall: r.fall,
        timeout: r.timeout_ms * 1_000_000,
    }))
}

/// A count such as `keys` or `sessions`, when given: 1..=100000000.
fn positive_count(
    cx: &Ctx<'_>,
    v: &Option<Spanned<u64>>,
    field: &str,
) -> Result<Option<u64>, ScenarioError> {
    match v {
        Some(k) if *k.get_ref() == 0 || *k.get_ref() > 100_000_000 => {
            Err(cx.err(k.span().start, field, "must be 1..=100000000"))
        }
        Some(k) => Ok(Some(*k.get_ref())),
        None => Ok(None),
    }
}

/// The router tier: `routers`, and `shared_view_ms` (ns) when they share their view.
fn tier(cx: &Ctx<'_>, raw: &RawScenario) -> Result<(u32, Option<u64>), ScenarioError> {
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
    Ok((routers, shared_view))
}
