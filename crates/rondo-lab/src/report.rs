//! The report of a queueing scenario: the results table (latency percentiles, errors, the p99
//! ratio to the oracle, Jain's index, reaction to each phase, each member's share) and the
//! plots. Everything here is a function of the results alone, so the same seed gives the same
//! bytes.

use std::fmt::Write as _;

use crate::scenario::{Phase, PhaseKind, Picker, Queueing, Scenario};
use crate::sim::{BUCKET, PickerResult};
use crate::stats::{jain, quantile};
use crate::{LabOutput, svg};

fn ms(ns: Option<u64>) -> String {
    match ns {
        Some(v) => format!("{:.2}", v as f64 / 1e6),
        None => "-".to_owned(),
    }
}

/// Jain's index over the picks per unit of weight of the members no phase touches.
pub fn jain_of(q: &Queueing, r: &PickerResult) -> Option<f64> {
    let values: Vec<f64> = q
        .members
        .iter()
        .enumerate()
        .filter(|(i, m)| m.initially_present && !q.phases.iter().any(|p| p.member == *i))
        .map(|(i, m)| r.picks[i] as f64 / f64::from(m.weight))
        .collect();
    jain(&values)
}

/// Each member's share of the capacity right after phase `upto` (its servers over its mean
/// service time; zero when failing, draining or absent).
fn capacity_share(q: &Queueing, upto: usize, member: usize) -> f64 {
    let mut factor = vec![Some(1.0); q.members.len()];
    let mut present: Vec<bool> = q.members.iter().map(|m| m.initially_present).collect();
    for p in &q.phases[..=upto] {
        match p.kind {
            PhaseKind::Slow(f) => factor[p.member] = Some(f),
            PhaseKind::FailFast | PhaseKind::FailSlow(_) | PhaseKind::Drain => {
                factor[p.member] = None;
            }
            PhaseKind::Recover => factor[p.member] = Some(1.0),
            PhaseKind::Leave => present[p.member] = false,
            PhaseKind::Join => present[p.member] = true,
        }
    }
    let cap = |i: usize| match factor[i] {
        Some(f) if present[i] => {
            f64::from(q.members[i].concurrency) / (q.members[i].service.mean() * f)
        }
        _ => 0.0,
    };
    let total: f64 = (0..q.members.len()).map(cap).sum();
    if total == 0.0 { 0.0 } else { cap(member) / total }
}

/// Windows a reaction must hold for: the share is judged over this many consecutive buckets
/// (100 ms), so one lucky empty bucket does not count as a reaction.
pub const REACTION_SPAN: usize = 5;

/// Time from a phase until the picker's share for the member crossed the target and held it
/// over the next 100 ms ([`REACTION_SPAN`] buckets of [`BUCKET`]): for a member that got worse
/// (slow, failing, draining), a share of at most twice its share of capacity, and at most 1 %
/// when it has none; for a joining member, at least half its share of capacity. The time is
/// measured to the end of the first bucket of that span. `None`: never within the run (or
/// before the member's next phase); `Some(None)` for phases not measured (recover, leave, or
/// no buckets kept).
pub fn reaction(q: &Queueing, r: &PickerResult, index: usize) -> Option<Option<u64>> {
    let p: Phase = q.phases[index];
    let measured =
        !matches!(p.kind, PhaseKind::Recover | PhaseKind::Leave) && !r.buckets.is_empty();
    if !measured {
        return Some(None);
    }
    let share = capacity_share(q, index, p.member);
    let end =
        q.phases[index + 1..].iter().find(|o| o.member == p.member).map_or(q.duration, |o| o.at);
    let first = p.at.div_ceil(BUCKET) as usize;
    let last = ((end / BUCKET) as usize).min(r.buckets.len());
    for b in first..last.saturating_sub(REACTION_SPAN - 1) {
        let span = &r.buckets[b..b + REACTION_SPAN];
        let total: u64 = span.iter().flatten().map(|&v| u64::from(v)).sum();
        if total < 5 {
            continue;
        }
        let mine: u64 = span.iter().map(|w| u64::from(w[p.member])).sum();
        let s = mine as f64 / total as f64;
        let hit = match p.kind {
            PhaseKind::Join => s >= share / 2.0,
            _ => s <= (2.0 * share).max(0.01),
        };
        if hit {
            return Some(Some((b as u64 + 1) * BUCKET - p.at));
        }
    }
    None
}

/// The member's share of all picks in the first second after phase `index` (`None` without
/// buckets). The fail-fast target of issue 21 is at most 1 % within 1 s.
pub fn first_second_share(q: &Queueing, r: &PickerResult, index: usize) -> Option<f64> {
    let p = q.phases[index];
    if r.buckets.is_empty() {
        return None;
    }
    let first = (p.at / BUCKET) as usize;
    let last = (((p.at + 1_000_000_000) / BUCKET) as usize).min(r.buckets.len());
    let span = r.buckets.get(first..last)?;
    let total: u64 = span.iter().flatten().map(|&v| u64::from(v)).sum();
    let mine: u64 = span.iter().map(|w| u64::from(w[p.member])).sum();
    (total > 0).then(|| mine as f64 / total as f64)
}

fn reaction_text(x: Option<Option<u64>>) -> String {
    match x {
        Some(Some(ns)) => format!("{} ms", ns / 1_000_000),
        Some(None) => "-".to_owned(),
        None => "never".to_owned(),
    }
}

/// The main table, one row per picker, and a note under it for each run that overloaded a
/// member: such a run's tail is the age of a queue that only grew, which reads like a bug in
/// the lab unless the table says what happened.
fn results_table(t: &mut String, q: &Queueing, results: &[PickerResult]) {
    let oracle_p99 = results
        .iter()
        .find(|r| r.picker == Picker::Oracle)
        .and_then(|r| quantile(&r.latencies, 0.99));
    let _ = writeln!(
        t,
        "| algorithm | requests | p50 ms | p99 ms | p99.9 ms | errors | unfinished | p99 / oracle | Jain |"
    );
    let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        let p99 = quantile(&r.latencies, 0.99);
        let ratio = match (p99, oracle_p99) {
            (Some(a), Some(o)) if o > 0 => format!("{:.2}", a as f64 / o as f64),
            _ => "-".to_owned(),
        };
        let mark = if r.stopped_early {
            " (event bound hit)"
        } else if overloaded(r) {
            " (overloaded, see note)"
        } else {
            ""
        };
        let _ = writeln!(
            t,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.picker.name(),
            mark,
            r.requests,
            ms(quantile(&r.latencies, 0.5)),
            ms(p99),
            ms(quantile(&r.latencies, 0.999)),
            r.errors,
            r.unfinished,
            ratio,
            jain_of(q, r).map_or("-".to_owned(), |j| format!("{j:.4}")),
        );
    }
    for r in results.iter().filter(|r| overloaded(r)) {
        let _ = writeln!(t);
        let _ = writeln!(t, "{}", overload_note(q, r));
    }
}

/// A run overloaded a member when work it was sent was still queued at the end: arrivals stop
/// at `duration_s` and the run then follows the work in flight for another `duration_s`, so a
/// member that had kept up would have emptied its queue. A run the event bound stopped ended
/// early for another reason and says so instead.
pub fn overloaded(r: &PickerResult) -> bool {
    !r.stopped_early && r.unfinished > 0
}

/// The note under the table for an overloaded run: which members were left with work, how
/// much, and, for a member no phase changes, the rate it was sent against what it can serve.
pub fn overload_note(q: &Queueing, r: &PickerResult) -> String {
    let seconds = q.duration as f64 / 1e9;
    let mut members = Vec::new();
    for (i, m) in q.members.iter().enumerate() {
        let left = r.unfinished_by_member.get(i).copied().unwrap_or(0);
        if left == 0 {
            continue;
        }
        let mut text = format!("{} (", m.name);
        if !q.phases.iter().any(|p| p.member == i) {
            let sent = r.picks[i] as f64 / seconds;
            let capacity = f64::from(m.concurrency) / (m.service.mean() / 1e9);
            let _ = write!(text, "sent {sent:.1}/s, serves {capacity:.1}/s; ");
        }
        let _ = write!(text, "{left} requests left)");
        members.push(text);
    }
    format!(
        "note: {} overloaded {}: its queue only grew, and {} requests were still queued {seconds} s \
         after the arrivals stopped; they count with their age as latency, so this row's tail is \
         that queue's age, not a fault in the simulation",
        r.picker.name(),
        members.join(", "),
        r.unfinished,
    )
}

/// Renders the tables and plots.
pub fn render(s: &Scenario, q: &Queueing, results: &[PickerResult]) -> LabOutput {
    let mut t = String::new();
    header(&mut t, s, q);
    let _ = writeln!(t);
    results_table(&mut t, q, results);
    if !q.phases.is_empty() {
        phase_tables(&mut t, q, results);
    }
    if q.members.len() <= 32 {
        share_table(&mut t, q, results);
    }
    LabOutput { table: t, plots: plots(s, q, results) }
}

/// The scenario's name and description, and what it runs: members, routers, arrivals.
fn header(t: &mut String, s: &Scenario, q: &Queueing) {
    if s.description.is_empty() {
        let _ = writeln!(t, "scenario {}", s.name);
    } else {
        let _ = writeln!(t, "scenario {}: {}", s.name, s.description);
    }
    let _ = writeln!(
        t,
        "{} members{}, {} s of arrivals (warm-up {} s), seed {}, arrival rate {:.1}/s{}{}",
        q.members.len(),
        if q.routers > 1 {
            format!(", {} routers each with its own view", q.routers)
        } else {
            String::new()
        },
        q.duration as f64 / 1e9,
        q.warmup as f64 / 1e9,
        s.seed,
        q.arrivals.rate,
        q.arrivals
            .burst
            .map_or(String::new(), |(n, e)| format!(", bursts of {n} every {} ms", e / 1_000_000)),
        q.arrivals.flash.map_or(String::new(), |(at, len, m)| format!(
            ", flash crowd x{m} from {} s for {} s",
            at as f64 / 1e9,
            len as f64 / 1e9
        )),
    );
}

/// A table's head row (`first`, then a column per picker) and its rule, on two lines.
fn picker_columns(first: &str, results: &[PickerResult]) -> String {
    let mut head = format!("| {first} |");
    let mut rule = "|---|".to_owned();
    for r in results {
        let _ = write!(head, " {} |", r.picker.name());
        rule.push_str("---:|");
    }
    format!("{head}\n{rule}")
}

/// How fast each picker reacted to each phase, and the member's share of picks in the
/// second after it.
fn phase_tables(t: &mut String, q: &Queueing, results: &[PickerResult]) {
    let _ = writeln!(t);
    let _ = writeln!(t, "time to react to each phase (share judged over 100 ms, in 20 ms steps):");
    let _ = writeln!(t);
    let columns = picker_columns("phase", results);
    let _ = writeln!(t, "{columns}");
    for (i, p) in q.phases.iter().enumerate() {
        let factor = match p.kind {
            PhaseKind::Slow(f) => format!(" x{f}"),
            _ => String::new(),
        };
        let _ = write!(
            t,
            "| {} {}{} at {} s |",
            q.members[p.member].name,
            p.kind.name(),
            factor,
            p.at as f64 / 1e9
        );
        for r in results {
            let _ = write!(t, " {} |", reaction_text(reaction(q, r, i)));
        }
        let _ = writeln!(t);
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "the member's share of picks in the first second after each phase (%):");
    let _ = writeln!(t);
    let _ = writeln!(t, "{columns}");
    for (i, p) in q.phases.iter().enumerate() {
        let _ = write!(
            t,
            "| {} {} at {} s |",
            q.members[p.member].name,
            p.kind.name(),
            p.at as f64 / 1e9
        );
        for r in results {
            match first_second_share(q, r, i) {
                Some(s) => {
                    let _ = write!(t, " {:.2} |", s * 100.0);
                }
                None => t.push_str(" - |"),
            }
        }
        let _ = writeln!(t);
    }
}

/// Each member's share of each picker's picks.
fn share_table(t: &mut String, q: &Queueing, results: &[PickerResult]) {
    let _ = writeln!(t);
    let _ = writeln!(t, "share of picks per member (%):");
    let _ = writeln!(t);
    let _ = writeln!(t, "{}", picker_columns("member", results));
    for (i, m) in q.members.iter().enumerate() {
        let _ = write!(t, "| {} |", m.name);
        for r in results {
            let total: u64 = r.picks.iter().sum();
            let share = if total == 0 { 0.0 } else { r.picks[i] as f64 * 100.0 / total as f64 };
            let _ = write!(t, " {share:.2} |");
        }
        let _ = writeln!(t);
    }
}

/// The latency plots, and each picker's load over time when it was kept.
fn plots(s: &Scenario, q: &Queueing, results: &[PickerResult]) -> Vec<(String, String)> {
    let mut plots = vec![
        ("latency-tail.svg".to_owned(), svg::latency_tail(&s.name, results)),
        ("latency-cdf.svg".to_owned(), svg::latency_cdf(&s.name, results)),
    ];
    for r in results.iter().filter(|r| !r.buckets.is_empty()) {
        plots.push((
            format!("load-{}.svg", r.picker.name()),
            svg::load_over_time(&s.name, r.picker.name(), q, &r.buckets),
        ));
    }
    plots
}
