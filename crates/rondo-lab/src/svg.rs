//! The plots, written as SVG by hand: the latency tail per picker (percentile on a log scale of
//! 1 − p), the latency CDF, and each picker's load per member over time as small multiples.
//! Hand-written rather than through `plotters` so that the lab needs no font or system library
//! (text is left to the viewer's fonts) and the bytes are identical for identical results.
//!
//! Series carry `class` and `data-*` attributes (name, role, tick values) so tests read a
//! plot's structure from the SVG rather than from pixels.

use std::fmt::Write as _;

use crate::scenario::{PhaseKind, Picker, Queueing};
use crate::sim::{BUCKET, PickerResult};
use crate::stats::quantile;

const W: f64 = 800.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 215.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// The Okabe–Ito palette, safe for the common colour-vision deficiencies, without its yellow
/// (unreadable on white) and its black (the oracle's).
pub const PALETTE: [&str; 6] = ["#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9"];
/// The oracle's colour: black and solid, the reference every line is read against.
pub const ORACLE_COLOUR: &str = "#000000";
/// Dash patterns for the algorithms, all different and none solid (solid is the oracle's).
/// Eleven patterns against six colours: the two counts share no factor, so colour and dash
/// together stay distinct for 66 series, and the dash alone for the first eleven.
pub const DASHES: [&str; 11] = [
    "9 3",
    "3 3",
    "12 3 3 3",
    "1.5 3",
    "6 2 1.5 2",
    "14 4",
    "5 5",
    "9 2 1.5 2 1.5 2",
    "2 6",
    "18 3 3 3",
    "4 2",
];

/// How one picker's line is drawn.
#[derive(Debug, Clone, Copy)]
struct Style {
    colour: &'static str,
    dash: &'static str,
    width: f64,
    role: &'static str,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn frame_sized(title: &str, x_label: &str, y_label: &str, h: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{h}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"##,
        W / 2.0,
        escape(title),
        LEFT + (W - LEFT - RIGHT) / 2.0,
        h - 12.0,
        escape(x_label),
        TOP + (h - TOP - BOTTOM) / 2.0,
        TOP + (h - TOP - BOTTOM) / 2.0,
        escape(y_label),
    );
    s
}

fn frame(title: &str, x_label: &str, y_label: &str) -> String {
    let mut s = frame_sized(title, x_label, y_label, H);
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        W - LEFT - RIGHT,
        H - TOP - BOTTOM,
    );
    s
}

fn points_attr(points: &[(f64, f64)]) -> String {
    let mut p = String::new();
    for (x, y) in points {
        let _ = write!(p, "{x:.1},{y:.1} ");
    }
    p.trim_end().to_owned()
}

fn dash_attr(dash: &str) -> String {
    if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) }
}

/// The picker that did best by the numbers the table leads with: lowest p99, then lowest
/// p99.9, then the first in the scenario's order. The oracle is the yardstick, not a contender.
pub fn best_picker(results: &[PickerResult]) -> Option<Picker> {
    results
        .iter()
        .filter(|r| r.picker != Picker::Oracle && !r.latencies.is_empty())
        .min_by_key(|r| (quantile(&r.latencies, 0.99), quantile(&r.latencies, 0.999)))
        .map(|r| r.picker)
}

/// Each picker's style, and the order to draw them in: the others in the scenario's order,
/// then the best algorithm, then the oracle, so the two lines a reader compares are on top.
fn styles(results: &[PickerResult]) -> (Vec<Style>, Vec<usize>) {
    let best = best_picker(results);
    let mut k = 0;
    let styles: Vec<Style> = results
        .iter()
        .map(|r| {
            if r.picker == Picker::Oracle {
                return Style { colour: ORACLE_COLOUR, dash: "", width: 2.6, role: "oracle" };
            }
            let (colour, dash) = (PALETTE[k % PALETTE.len()], DASHES[k % DASHES.len()]);
            k += 1;
            if Some(r.picker) == best {
                Style { colour, dash, width: 2.6, role: "best" }
            } else {
                Style { colour, dash, width: 1.6, role: "algorithm" }
            }
        })
        .collect();
    let rank = |s: &Style| match s.role {
        "oracle" => 2,
        "best" => 1,
        _ => 0,
    };
    let mut order: Vec<usize> = (0..results.len()).collect();
    order.sort_by_key(|&i| rank(&styles[i]));
    (styles, order)
}

fn series_line(s: &mut String, name: &str, style: Style, points: &[(f64, f64)]) {
    let _ = writeln!(
        s,
        r#"<polyline class="series" data-name="{}" data-role="{}" fill="none" stroke="{}" stroke-width="{}"{} points="{}"/>"#,
        escape(name),
        style.role,
        style.colour,
        style.width,
        dash_attr(style.dash),
        points_attr(points)
    );
}

/// The legend in the scenario's order, each entry drawn as its line is.
fn legend(s: &mut String, results: &[PickerResult], styles: &[Style]) {
    let entries = results.iter().zip(styles).filter(|(r, _)| !r.latencies.is_empty());
    for (i, (r, style)) in entries.enumerate() {
        let name = r.picker.name();
        let y = TOP + 10.0 + i as f64 * 18.0;
        let x = W - RIGHT + 15.0;
        let _ = writeln!(
            s,
            r#"<line class="legend" data-name="{}" x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="{}"{}/><text x="{}" y="{}">{}</text>"#,
            escape(name),
            x + 26.0,
            style.colour,
            style.width,
            dash_attr(style.dash),
            x + 32.0,
            y + 4.0,
            escape(&match style.role {
                "best" => format!("{name} (best)"),
                _ => name.to_owned(),
            })
        );
    }
}

fn nice_ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 {
        return vec![0.0];
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(raw);
    (0..=((max / step).floor() as usize)).map(|i| i as f64 * step).collect()
}

/// A latency in ms as a tick label: ms below a second, seconds above.
fn latency_label(ms: f64) -> String {
    let short = |v: f64| {
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    if ms >= 1000.0 { format!("{} s", short(ms / 1000.0)) } else { format!("{} ms", short(ms)) }
}

/// The percentiles the tail plot marks, as (p, label).
pub const TAIL_TICKS: [(f64, &str); 5] =
    [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9"), (0.9999, "p99.99")];

/// The latency tail, one line per picker: percentile across (p50 … p99.99, evenly spaced in
/// −log10(1 − p), so each further nine gets as much room as the last), latency up (log). The
/// body where every algorithm looks alike takes a fifth of the width; the tail, where they
/// differ, the rest.
pub fn latency_tail(scenario: &str, results: &[PickerResult]) -> String {
    let mut s = frame(
        &format!("{scenario}: latency tail per algorithm"),
        "percentile (log scale of 1 − p)",
        "latency (log scale)",
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let (t_lo, t_hi) = (2f64.log10(), 4.0);
    let t_of = |p: f64| -(1.0 - p).log10();
    let x_of = |p: f64| LEFT + (t_of(p) - t_lo) / (t_hi - t_lo) * pw;
    // Each line runs from p50 to the last percentile its samples resolve (at least one sample
    // beyond it), in steps of 0.02 in −log10(1 − p).
    let curves: Vec<Vec<(f64, f64)>> = results
        .iter()
        .map(|r| {
            let n = r.latencies.len() as f64;
            (0..=((t_hi - t_lo) / 0.02).round() as u32)
                .map(|k| 1.0 - 10f64.powf(-(t_lo + f64::from(k) * 0.02).min(t_hi)))
                .filter(|p| (1.0 - p) * n >= 1.0)
                .filter_map(|p| quantile(&r.latencies, p).map(|v| (p, (v.max(1) as f64) / 1e6)))
                .collect()
        })
        .collect();
    let values = curves.iter().flatten().map(|&(_, ms)| ms);
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (1.0, 10.0) };
    let (dlo, dhi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let y_of = |ms: f64| TOP + ph - (ms.log10() - dlo) / (dhi - dlo) * ph;
    for &(p, label) in &TAIL_TICKS {
        let x = x_of(p);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text class="x-tick" data-p="{p}" x="{x:.1}" y="{}" text-anchor="middle">{label}</text>"##,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    // Decades always; 2 and 5 too when the plot spans two decades or fewer.
    let steps: &[f64] = if dhi - dlo <= 2.0 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    for d in (dlo as i32)..=(dhi as i32) {
        for &m in steps {
            let ms = m * 10f64.powi(d);
            if ms.log10() > dhi + 1e-9 {
                continue;
            }
            let y = y_of(ms);
            let _ = writeln!(
                s,
                r##"<line class="y-grid" data-ms="{ms}" x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text class="y-tick" x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                latency_label(ms)
            );
        }
    }
    let (styles, order) = styles(results);
    for i in order {
        if curves[i].is_empty() {
            continue;
        }
        let pts: Vec<(f64, f64)> = curves[i].iter().map(|&(p, ms)| (x_of(p), y_of(ms))).collect();
        series_line(&mut s, results[i].picker.name(), styles[i], &pts);
    }
    legend(&mut s, results, &styles);
    s.push_str("</svg>\n");
    s
}

/// A latency CDF, one line per picker, latency on a log axis: the body of the distribution
/// (the tail is [`latency_tail`]'s).
pub fn latency_cdf(scenario: &str, results: &[PickerResult]) -> String {
    let mut s = frame(
        &format!("{scenario}: latency CDF per algorithm"),
        "latency (ms, log scale)",
        "fraction of requests",
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let all =
        results.iter().flat_map(|r| r.latencies.first().into_iter().chain(r.latencies.last()));
    let lo = all.clone().copied().min().unwrap_or(1).max(1000) as f64 / 1e6;
    let hi = all.copied().max().unwrap_or(1).max(2000) as f64 / 1e6;
    let (llo, lhi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let x_of = |ms: f64| LEFT + (ms.max(lo).log10() - llo) / (lhi - llo) * pw;
    let y_of = |f: f64| TOP + ph - f * ph;
    for d in (llo as i32)..=(lhi as i32) {
        let x = x_of(10f64.powi(d));
        let label = if d >= 0 {
            format!("{}", 10f64.powi(d))
        } else {
            format!("{:.*}", (-d) as usize, 10f64.powi(d))
        };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{label}</text>"##,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    for k in 0..=10 {
        let f = f64::from(k) / 10.0;
        let y = y_of(f);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{f:.1}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let (styles, order) = styles(results);
    for i in order {
        let r = &results[i];
        if r.latencies.is_empty() {
            continue;
        }
        // Evenly spaced quantiles plus the tail, so p99 and beyond are visible.
        let mut qs: Vec<f64> = (0..=200).map(|k| f64::from(k) / 200.0).collect();
        qs.extend([0.995, 0.999, 0.9995, 0.9999, 1.0]);
        qs.sort_by(f64::total_cmp);
        let pts: Vec<(f64, f64)> = qs
            .iter()
            .filter_map(|&q| quantile(&r.latencies, q).map(|v| (x_of(v as f64 / 1e6), y_of(q))))
            .collect();
        series_line(&mut s, r.picker.name(), styles[i], &pts);
    }
    legend(&mut s, results, &styles);
    s.push_str("</svg>\n");
    s
}

/// Members that should take the same load, drawn as one panel: the same service, servers,
/// weight, group and presence, and no phase of their own. A member a phase changes is a panel
/// alone, as it is the one a reader watches.
pub fn load_panels(q: &Queueing) -> Vec<Vec<usize>> {
    let mut panels: Vec<Vec<usize>> = Vec::new();
    let alone = |i: usize| q.phases.iter().any(|p| p.member == i);
    for (i, m) in q.members.iter().enumerate() {
        let same = |j: usize| {
            let o = &q.members[j];
            !alone(i)
                && !alone(j)
                && (o.service, o.concurrency, o.weight, &o.group, o.initially_present)
                    == (m.service, m.concurrency, m.weight, &m.group, m.initially_present)
        };
        match panels.iter_mut().find(|p| same(p[0])) {
            Some(p) => p.push(i),
            None => panels.push(vec![i]),
        }
    }
    panels
}

/// Height of a small multiple: the plot area shared out, within these bounds.
const PANEL_H: (f64, f64) = (64.0, 150.0);
/// The gap above each panel, which holds its label.
const PANEL_GAP: f64 = 22.0;
/// Windows per line, about: coarse enough that a band of alike members shows their spread
/// rather than the noise of a 20 ms bucket, fine enough to show a reaction within a second or so.
const LOAD_WINDOWS: usize = 150;

/// The horizontal and vertical scales every panel of a load plot shares.
struct Scales {
    pw: f64,
    ph: f64,
    duration: f64,
    window: f64,
    ytop: f64,
}

impl Scales {
    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.duration.max(1e-9) * self.pw
    }
}

/// One picker's requests per second to each member over time, as small multiples sharing one
/// scale: a panel per [`load_panels`] group; a group of several members is a band from the
/// least to the most loaded member in each window with their mean as the line, so ten alike
/// members read as one shape and an outlier as its own panel. Phases are dotted verticals.
pub fn load_over_time(scenario: &str, picker: &str, q: &Queueing, buckets: &[Vec<u32>]) -> String {
    let panels = load_panels(q);
    let n = panels.len().max(1) as f64;
    let ph = ((H - TOP - BOTTOM) / n - PANEL_GAP).clamp(PANEL_H.0, PANEL_H.1);
    let h = TOP + n * (ph + PANEL_GAP) + BOTTOM;
    let mut s = frame_sized(
        &format!("{scenario}: load per member over time ({picker})"),
        "virtual time (s)",
        "requests per second",
        h,
    );
    // Buckets past the arrivals' end hold no picks; a last short window is divided by its own
    // length, so neither reads as a drop in load.
    let buckets = &buckets[..buckets.len().min(q.duration.div_ceil(BUCKET) as usize)];
    let group = buckets.len().div_ceil(LOAD_WINDOWS).max(1);
    let window = group as f64 * BUCKET as f64 / 1e9;
    let series: Vec<Vec<f64>> = (0..q.members.len())
        .map(|m| {
            buckets
                .chunks(group)
                .map(|c| {
                    let sum: f64 = c.iter().map(|b| f64::from(b[m])).sum();
                    sum / (c.len() as f64 * BUCKET as f64 / 1e9)
                })
                .collect()
        })
        .collect();
    let ymax = series.iter().flatten().copied().fold(0.0, f64::max).max(1.0);
    // The scale's top: the first multiple of the nice step at or above the highest rate.
    let ticks = nice_ticks(ymax);
    let step = ticks.get(1).copied().unwrap_or(ymax);
    let ytop = (ymax / step).ceil() * step;
    let duration = buckets.len() as f64 * BUCKET as f64 / 1e9;
    let sc = Scales { pw: W - LEFT - 30.0, ph, duration, window, ytop };
    for (k, members) in panels.iter().enumerate() {
        let top = TOP + PANEL_GAP + k as f64 * (ph + PANEL_GAP);
        let rows: Vec<&[f64]> = members.iter().map(|&m| series[m].as_slice()).collect();
        panel(&mut s, q, members, &rows, top, PALETTE[k % PALETTE.len()], &sc);
    }
    let bottom = TOP + n * (ph + PANEL_GAP);
    for t in nice_ticks(duration) {
        let _ = writeln!(
            s,
            r##"<text class="x-tick" x="{:.1}" y="{}" text-anchor="middle">{t}</text>"##,
            sc.x(t),
            bottom + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One small multiple: its frame and scale, the band (several members) and the mean line,
/// its label and the phases.
fn panel(
    s: &mut String,
    q: &Queueing,
    members: &[usize],
    rows: &[&[f64]],
    top: f64,
    colour: &str,
    sc: &Scales,
) {
    let y_of = |v: f64| top + sc.ph - v / sc.ytop * sc.ph;
    let names: Vec<&str> = members.iter().map(|&m| q.members[m].name.as_str()).collect();
    let _ = writeln!(
        s,
        r##"<g class="panel" data-members="{}" data-ymax="{}"><rect x="{LEFT}" y="{top}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        escape(&names.join(" ")),
        sc.ytop,
        sc.pw,
        sc.ph
    );
    for v in [0.0, sc.ytop / 2.0, sc.ytop] {
        let y = y_of(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text class="y-tick" x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            LEFT + sc.pw,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let windows = rows.first().map_or(0, |r| r.len());
    let x_at = |w: usize| sc.x(((w as f64 + 0.5) * sc.window).min(sc.duration));
    let column = |w: usize| rows.iter().map(move |r| r[w]);
    if rows.len() > 1 {
        let upper = (0..windows).map(|w| (x_at(w), y_of(column(w).fold(0.0, f64::max))));
        let lower =
            (0..windows).rev().map(|w| (x_at(w), y_of(column(w).fold(f64::INFINITY, f64::min))));
        let outline: Vec<(f64, f64)> = upper.chain(lower).collect();
        let _ = writeln!(
            s,
            r#"<polygon class="band" fill="{colour}" fill-opacity="0.3" stroke="none" points="{}"/>"#,
            points_attr(&outline)
        );
    }
    let mean: Vec<(f64, f64)> =
        (0..windows).map(|w| (x_at(w), y_of(column(w).sum::<f64>() / rows.len() as f64))).collect();
    let _ = writeln!(
        s,
        r#"<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.6" points="{}"/>"#,
        points_attr(&mean)
    );
    let label = match names.as_slice() {
        [first, .., last] => format!(
            "{first} … {last}: {} members (band: least to most loaded; line: mean)",
            names.len()
        ),
        _ => names.join(""),
    };
    let _ = writeln!(
        s,
        r#"<text class="panel-label" x="{}" y="{}">{}</text>"#,
        LEFT,
        top - 6.0,
        escape(&label)
    );
    phase_marks(s, q, members, top, sc);
    s.push_str("</g>\n");
}

/// Every phase as a dotted vertical in a panel, named in the panel of its member.
fn phase_marks(s: &mut String, q: &Queueing, members: &[usize], top: f64, sc: &Scales) {
    for p in &q.phases {
        let x = sc.x(p.at as f64 / 1e9);
        let _ = writeln!(
            s,
            r##"<line class="phase" x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{}" stroke="#555" stroke-dasharray="2 3"/>"##,
            top + sc.ph
        );
        if members.contains(&p.member) {
            let what = match p.kind {
                PhaseKind::Slow(f) => format!("slow x{f}"),
                k => k.name().to_owned(),
            };
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" font-size="10">{}</text>"#,
                x + 3.0,
                top + sc.ph - 4.0,
                escape(&what)
            );
        }
    }
}
