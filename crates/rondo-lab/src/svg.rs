//! The plots, written as SVG by hand: a latency CDF per picker and each member's load over time.
//! Hand-written rather than through `plotters` so that the lab needs no font or system library
//! (text is left to the viewer's fonts) and the bytes are identical for identical results.

use std::fmt::Write as _;

use crate::sim::{BUCKET, PickerResult};
use crate::stats::quantile;

const W: f64 = 800.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Distinct colours (Okabe-Ito, then a few more), cycled.
const COLOURS: [&str; 12] = [
    "#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
    "#999999", "#8c564b", "#7f7f00", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn frame(title: &str, x_label: &str, y_label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>
<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        W / 2.0,
        escape(title),
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 12.0,
        escape(x_label),
        TOP + (H - TOP - BOTTOM) / 2.0,
        TOP + (H - TOP - BOTTOM) / 2.0,
        escape(y_label),
        W - LEFT - RIGHT,
        H - TOP - BOTTOM,
    );
    s
}

fn legend(s: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 18.0;
        let x = W - RIGHT + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="2.5"/><text x="{}" y="{}">{}</text>"#,
            x + 22.0,
            COLOURS[i % COLOURS.len()],
            x + 28.0,
            y + 4.0,
            escape(name)
        );
    }
}

fn polyline(s: &mut String, points: &[(f64, f64)], colour: &str) {
    let mut p = String::new();
    for (x, y) in points {
        let _ = write!(p, "{x:.1},{y:.1} ");
    }
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{}"/>"#,
        p.trim_end()
    );
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

/// A latency CDF, one line per picker, latency on a log axis.
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
    let mut names = Vec::new();
    for (i, r) in results.iter().enumerate() {
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
        polyline(&mut s, &pts, COLOURS[i % COLOURS.len()]);
        names.push(r.picker.name());
    }
    legend(&mut s, &names);
    s.push_str("</svg>\n");
    s
}

/// Picks per second per member over time for one picker.
pub fn load_over_time(
    scenario: &str,
    picker: &str,
    members: &[&str],
    buckets: &[Vec<u32>],
) -> String {
    let mut s = frame(
        &format!("{scenario}: load per member over time ({picker})"),
        "virtual time (s)",
        "requests per second",
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    // At most about 300 points per line.
    let group = buckets.len().div_ceil(300).max(1);
    let window = group as f64 * BUCKET as f64 / 1e9;
    let series: Vec<Vec<f64>> = (0..members.len())
        .map(|m| {
            buckets
                .chunks(group)
                .map(|c| c.iter().map(|b| f64::from(b[m])).sum::<f64>() / window)
                .collect()
        })
        .collect();
    let ymax = series.iter().flatten().copied().fold(0.0, f64::max).max(1.0);
    let ticks = nice_ticks(ymax);
    let ytop = ticks.last().copied().unwrap_or(ymax).max(ymax);
    let duration = buckets.len() as f64 * BUCKET as f64 / 1e9;
    let x_of = |t: f64| LEFT + t / duration.max(1e-9) * pw;
    let y_of = |v: f64| TOP + ph - v / ytop * ph;
    for v in &ticks {
        let y = y_of(*v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0
        );
    }
    for t in nice_ticks(duration) {
        let x = x_of(t);
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{}" text-anchor="middle">{t}</text>"##,
            TOP + ph + 16.0
        );
    }
    for (m, line) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = line
            .iter()
            .enumerate()
            .map(|(k, v)| (x_of((k as f64 + 0.5) * window), y_of(*v)))
            .collect();
        polyline(&mut s, &pts, COLOURS[m % COLOURS.len()]);
    }
    let shown: Vec<&str> = members.iter().take(20).copied().collect();
    legend(&mut s, &shown);
    s.push_str("</svg>\n");
    s
}
