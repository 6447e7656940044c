//! The lab's deterministic properties: a seed reproduces a run byte for byte, the balls-into-bins
//! maxima fall in the ranges the theory gives, the oracle is the yardstick it claims to be, the
//! simulator feeds the core the signals the router would (health checks take a failing member
//! out), and scenario mistakes are reported as `file:line:column: field: message`.

use std::path::PathBuf;

use rondo_core::Algorithm;
use rondo_lab::scenario::{Kind, PhaseKind, Picker, Scenario};
use rondo_lab::sim::run_one;
use rondo_lab::stats::quantile;
use rondo_lab::{bins, run, run_file};

fn shipped(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios").join(name)
}

fn parse(text: &str) -> Scenario {
    match Scenario::parse(text, "t.toml") {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

const SMALL: &str = r#"
name = "small"
duration_s = 5
algorithms = ["random", "p2c-ewma", "least-sessions"]
[arrivals]
load = 0.7
[health]
interval_ms = 200
[[member]]
name = "m"
count = 4
service = { dist = "exponential", mean_ms = 10 }
[[member]]
name = "s"
service = { dist = "lognormal", mean_ms = 50, sigma = 1.0 }
[[phase]]
at_s = 2
member = "m-1"
kind = "slow"
factor = 5
"#;

#[test]
fn the_same_seed_gives_the_same_output_and_another_seed_another() {
    let s = parse(SMALL);
    let a = run(&s, &mut |_| {});
    let b = run(&s, &mut |_| {});
    assert_eq!(a.table, b.table);
    assert_eq!(a.plots, b.plots);
    assert!(!a.plots.is_empty());
    let mut other = s.clone();
    other.seed = 2;
    let c = run(&other, &mut |_| {});
    assert_ne!(a.table, c.table, "the seed must change the run");
}

#[test]
fn the_seed_flag_overrides_the_file_and_reproduces() {
    let path = shipped("fail-fast.toml");
    let a = run_file(&path, Some(7), &mut |_| {}).expect("runs");
    let b = run_file(&path, Some(7), &mut |_| {}).expect("runs");
    assert_eq!(a.table, b.table);
    assert!(a.table.contains("seed 7"), "{}", a.table);
}

fn bins_stats(algorithm: Algorithm, n: usize, trials: u64) -> (u32, u32, f64) {
    let loads: Vec<u32> = (0..trials).map(|t| bins::max_load(algorithm, n, 1000 + t)).collect();
    let min = *loads.iter().min().unwrap_or(&0);
    let max = *loads.iter().max().unwrap_or(&0);
    (min, max, loads.iter().map(|&v| f64::from(v)).sum::<f64>() / loads.len() as f64)
}

/// One choice: max load about ln n / ln ln n (plus lower-order terms: 6-7 at 10^4 and 7-8 at
/// 10^5 in simulation); two choices: ln ln n / ln 2 + O(1), i.e. 3-4 at both sizes.
#[test]
fn balls_into_bins_reproduces_the_max_load_ranges() {
    for (n, random_range, two_range) in [(10_000, 5..=9, 2..=4), (100_000, 6..=10, 3..=4)] {
        let (rmin, rmax, rmean) = bins_stats(Algorithm::Random, n, 3);
        let (pmin, pmax, pmean) = bins_stats(Algorithm::P2cEwma, n, 3);
        assert!(
            random_range.contains(&rmin) && random_range.contains(&rmax),
            "n={n}: random {rmin}..{rmax}"
        );
        assert!(
            two_range.contains(&pmin) && two_range.contains(&pmax),
            "n={n}: two choices {pmin}..{pmax}"
        );
        // The exponential gap: one choice is well above its leading term's two-choice sibling.
        assert!(rmean >= pmean + 2.0, "n={n}: random {rmean} vs two choices {pmean}");
        assert!(rmean > bins::one_choice_theory(n), "n={n}: {rmean}");
        assert!((pmean - bins::two_choice_theory(n)).abs() <= 1.0, "n={n}: {pmean}");
        // The full minimum places one ball per bin.
        assert_eq!(bins::max_load(Algorithm::LeastSessions, n, 1), 1);
    }
}

#[test]
fn the_shipped_balls_into_bins_scenario_parses_with_both_sizes() {
    let text = std::fs::read_to_string(shipped("balls-into-bins.toml")).expect("read");
    let s = parse(&text);
    let Kind::BallsIntoBins(b) = &s.kind else { panic!("not balls into bins") };
    assert_eq!(b.sizes, vec![10_000, 100_000]);
    assert!(
        b.algorithms.contains(&Algorithm::Random) && b.algorithms.contains(&Algorithm::P2cEwma)
    );
}

/// The slow-member scenario of issue 21: round robin keeps sending the slow member a tenth of
/// the load (above its capacity, so its queue grows without bound), p2c-ewma steers away but
/// stays above the oracle, and the oracle never sends it anything at 70 % load.
#[test]
fn the_oracle_is_the_yardstick_in_the_slow_member_scenario() {
    let text = std::fs::read_to_string(shipped("slow-member.toml")).expect("read");
    let s = parse(&text);
    let Kind::Queueing(q) = &s.kind else { panic!("not queueing") };
    let p99 = |p| {
        let r = run_one(q, p, s.seed, &mut |_| {});
        (quantile(&r.latencies, 0.99).unwrap_or(0), r)
    };
    let (oracle, o) = p99(Picker::Oracle);
    let (rr, r) = p99(Picker::Core(Algorithm::RoundRobin));
    let (p2c, p) = p99(Picker::Core(Algorithm::P2cEwma));
    let slow = q.members.iter().position(|m| m.name == "slow").expect("slow member");
    assert!(r.unfinished > 0, "round robin overloads the slow member");
    assert!(rr > 100 * oracle, "round robin {rr} vs oracle {oracle}");
    assert!(p2c > oracle && p2c < 10 * oracle, "p2c-ewma {p2c} vs oracle {oracle}");
    assert!(p.picks[slow] * 5 < r.picks[slow], "p2c-ewma avoids the slow member");
    assert_eq!(o.picks[slow], 0);
}

/// Health checks reach the core: after `fall` failed probes the member is unhealthy and the
/// core stops picking it, even for round robin. Passive ejection cannot be what does it here:
/// the member's failures are timeouts, seen only a second after each request.
#[test]
fn health_checks_take_a_failing_member_out() {
    let s = parse(
        r#"
duration_s = 6
algorithms = ["round-robin"]
[arrivals]
rate = 200
[health]
interval_ms = 100
fall = 2
[[member]]
name = "m"
count = 4
concurrency = 8
service = { dist = "constant", mean_ms = 5 }
[[phase]]
at_s = 2
member = "m-2"
kind = "fail-slow"
timeout_ms = 1000
"#,
    );
    let Kind::Queueing(q) = &s.kind else { panic!("not queueing") };
    let r = run_one(q, Picker::Core(Algorithm::RoundRobin), 1, &mut |_| {});
    let bucket = |t_ms: u64| (t_ms * 1_000_000 / rondo_lab::sim::BUCKET) as usize;
    let after: u32 = r.buckets[bucket(2_500)..bucket(6_000)].iter().map(|b| b[1]).sum();
    let before: u32 = r.buckets[bucket(0)..bucket(2_000)].iter().map(|b| b[1]).sum();
    assert!(before > 50, "before {before}");
    assert_eq!(after, 0, "m-2 still picked after its health checks failed");
    // The requests it swallowed before going down failed after the timeout.
    assert!(r.errors > 0);
}

fn error_of(text: &str) -> String {
    match Scenario::parse(text, "bad.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn scenario_errors_name_file_line_and_field() {
    let base = "duration_s = 5\nalgorithms = [\"random\"]\n[arrivals]\nload = 0.5\n";
    let cases = [
        (
            "duration_s = 5\nalgorithms = [\"random\", \"fastest\"]\n",
            "bad.toml:2:25: field `algorithms[1]`: unknown algorithm \"fastest\"",
        ),
        (
            &*format!(
                "{base}[[member]]\nname = \"a\"\nservice = {{ dist = \"gamma\", mean_ms = 1 }}\n"
            ),
            "bad.toml:7:20: field `member[0].service.dist`: unknown distribution \"gamma\"",
        ),
        (
            &*format!("{base}[[member]]\nname = \"a\"\nservice = {{ dist = \"exponential\" }}\n"),
            "bad.toml:7:11: field `member[0].service.mean_ms`: exponential needs a positive mean_ms",
        ),
        (
            &*format!(
                "{base}[[member]]\nname = \"a\"\nservice = {{ dist = \"constant\", mean_ms = 1 }}\n[[phase]]\nat_s = 1\nmember = \"b\"\nkind = \"slow\"\n"
            ),
            "bad.toml:10:10: field `phase[0].member`: no member named \"b\"",
        ),
        (
            &*format!(
                "{base}[[member]]\nname = \"a\"\nweight = 0\nservice = {{ dist = \"constant\", mean_ms = 1 }}\n"
            ),
            "bad.toml:5:1: field `member[0].weight`: weight must be 1..=1000000",
        ),
        ("duration_s = 5\nalgoritms = []\n", "bad.toml:2:1: unknown field `algoritms`"),
        ("duration_s = \"five\"\nalgorithms = [\"random\"]\n", "bad.toml:1:14: invalid type"),
        (
            "duration_s = 1e9\nalgorithms = [\"random\"]\n",
            "bad.toml:1:14: field `duration_s`: must be in (0, 86400]",
        ),
    ];
    for (text, want) in cases {
        let got = error_of(text);
        assert!(got.starts_with(want), "got:  {got}\nwant: {want}...");
        assert!(!got.ends_with('.'), "{got}");
    }
}

#[test]
fn an_unreadable_scenario_is_an_error_not_a_panic() {
    let e = run_file(&shipped("no-such-scenario.toml"), None, &mut |_| {}).expect_err("missing");
    assert!(e.to_string().contains("cannot read the scenario"), "{e}");
}

#[test]
fn every_shipped_scenario_parses() {
    for entry in std::fs::read_dir(shipped("")).expect("examples/scenarios") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        if let Err(e) = Scenario::parse(&text, &path.display().to_string()) {
            panic!("{e}");
        }
    }
}

/// The event bound ends a run that would otherwise go on, and the table says so.
#[test]
fn the_event_bound_stops_a_run_and_is_reported() {
    let s = parse(&SMALL.replace("duration_s = 5", "duration_s = 5\nmax_events = 1000"));
    let out = run(&s, &mut |_| {});
    assert!(out.table.contains("(event bound hit)"), "{}", out.table);
}

fn shipped_queueing(name: &str) -> (Scenario, rondo_lab::scenario::Queueing) {
    let text = std::fs::read_to_string(shipped(name)).expect("read");
    let s = parse(&text);
    let Kind::Queueing(q) = &s.kind else { panic!("{name}: not queueing") };
    let q = (**q).clone();
    (s, q)
}

/// Issue 21's targets for `adaptive`, on the shipped scenarios (virtual time, seed 1): p99 at
/// most 1.2x the oracle's with one slow member, Jain's index at least 0.99 on homogeneous
/// members, and a fail-fast member at most 1 % of the picks in its first second.
#[test]
fn adaptive_meets_the_issue_21_targets() {
    let adaptive = Picker::Core(Algorithm::Adaptive);

    let (s, q) = shipped_queueing("slow-member.toml");
    let a = run_one(&q, adaptive, s.seed, &mut |_| {});
    let o = run_one(&q, Picker::Oracle, s.seed, &mut |_| {});
    let (pa, po) = (
        quantile(&a.latencies, 0.99).unwrap_or(u64::MAX),
        quantile(&o.latencies, 0.99).unwrap_or(1),
    );
    assert!(pa as f64 <= 1.2 * po as f64, "slow member: adaptive p99 {pa} vs oracle {po}");

    let (s, q) = shipped_queueing("homogeneous.toml");
    let r = run_one(&q, adaptive, s.seed, &mut |_| {});
    let jain = rondo_lab::report::jain_of(&q, &r).expect("jain");
    assert!(jain >= 0.99, "homogeneous: Jain {jain}");

    let (s, q) = shipped_queueing("fail-fast.toml");
    let r = run_one(&q, adaptive, s.seed, &mut |_| {});
    let phase = q.phases.iter().position(|p| p.kind == PhaseKind::FailFast).expect("phase");
    let share = rondo_lab::report::first_second_share(&q, &r, phase).expect("share");
    assert!(share <= 0.01, "fail-fast: {share} of the picks in the first second");
}

// ---- issue 43: plots a newcomer can read, and a table that says when a run overloaded ----

fn plot<'a>(out: &'a rondo_lab::LabOutput, name: &str) -> &'a str {
    let names: Vec<&str> = out.plots.iter().map(|(n, _)| n.as_str()).collect();
    out.plots
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, svg)| svg.as_str())
        .unwrap_or_else(|| panic!("no {name} among {names:?}"))
}

fn svg_doc(svg: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not well-formed: {e}"))
}

fn has_class(n: &roxmltree::Node<'_, '_>, class: &str) -> bool {
    n.attribute("class") == Some(class)
}

fn num(n: &roxmltree::Node<'_, '_>, attr: &str) -> f64 {
    n.attribute(attr)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{n:?} has no numeric {attr}"))
}

fn points(n: &roxmltree::Node<'_, '_>) -> Vec<(f64, f64)> {
    n.attribute("points")
        .unwrap_or("")
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').expect("x,y");
            (x.parse().expect("x"), y.parse().expect("y"))
        })
        .collect()
}

/// Per algorithm row of the main table: (name, p99 ms, p99.9 ms).
fn table_rows(table: &str) -> Vec<(String, f64, f64)> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("| algorithm |"))
        .skip(2)
        .take_while(|l| l.starts_with("| "))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells[1].split(' ').next().unwrap_or("").to_owned();
            (name, cells[4].parse().expect("p99"), cells[5].parse().expect("p99.9"))
        })
        .collect()
}

const OKABE_ITO: [&str; 8] =
    ["#000000", "#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#d55e00", "#cc79a7"];

/// The tail plot puts the percentiles where algorithms differ on equal footing: p50, p90, p99,
/// p99.9, p99.99 evenly spaced in −log10(1 − p), latency on a log axis, Okabe–Ito colours each
/// with its own dash, the oracle solid black and drawn last, the best p99 just before it.
#[test]
fn issue_43_the_tail_plot_spreads_the_nines_and_draws_the_oracle_and_the_best_on_top() {
    let out = run_file(&shipped("slow-member.toml"), None, &mut |_| {}).expect("runs");
    let doc = svg_doc(plot(&out, "latency-tail.svg"));
    let rows = table_rows(&out.table);
    assert_eq!(rows.len(), 8, "{}", out.table);

    // x: the five percentiles, in order, each further nine as wide as the one before.
    let xt: Vec<_> = doc.descendants().filter(|n| has_class(n, "x-tick")).collect();
    let labels: Vec<&str> = xt.iter().map(|n| n.text().unwrap_or("")).collect();
    assert_eq!(labels, ["p50", "p90", "p99", "p99.9", "p99.99"]);
    let xs: Vec<f64> = xt.iter().map(|n| num(n, "x")).collect();
    let nine = xs[2] - xs[1];
    assert!(nine > 50.0, "{xs:?}");
    for w in xs[1..].windows(2) {
        assert!((w[1] - w[0] - nine).abs() < 0.2, "nines not evenly spaced: {xs:?}");
    }
    // p50 to p90 is log10(5) of a nine on that scale.
    assert!((xs[1] - xs[0] - nine * 5f64.log10()).abs() < 0.2, "{xs:?}");

    // y: decades, evenly spaced, latency growing upwards.
    let yt: Vec<_> = doc.descendants().filter(|n| has_class(n, "y-grid")).collect();
    assert!(yt.len() >= 3, "{} y ticks", yt.len());
    let decades: Vec<(f64, f64)> = yt.iter().map(|n| (num(n, "data-ms"), num(n, "y1"))).collect();
    let step = decades[0].1 - decades[1].1;
    for w in decades.windows(2) {
        assert!((w[1].0 / w[0].0 - 10.0).abs() < 1e-9, "not decades: {decades:?}");
        assert!((w[0].1 - w[1].1 - step).abs() < 0.2, "decades not evenly spaced: {decades:?}");
    }
    let (ms0, y0) = decades[0];
    let y_of = |ms: f64| y0 - (ms / ms0).log10() * step;

    // Series: one per algorithm, drawn in order with the best then the oracle last.
    let series: Vec<_> = doc.descendants().filter(|n| has_class(n, "series")).collect();
    let names: Vec<&str> = series.iter().map(|n| n.attribute("data-name").unwrap_or("")).collect();
    let mut want: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let mut got = names.clone();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want);
    let best = rows
        .iter()
        .filter(|r| r.0 != "oracle")
        .min_by(|a, b| (a.1, a.2).partial_cmp(&(b.1, b.2)).expect("numbers"))
        .expect("an algorithm");
    assert_eq!(names.last(), Some(&"oracle"), "{names:?}");
    assert_eq!(names[names.len() - 2], best.0, "{names:?}");
    let role = |n: &roxmltree::Node<'_, '_>| n.attribute("data-role").unwrap_or("").to_owned();
    assert_eq!(role(&series[series.len() - 1]), "oracle");
    assert_eq!(role(&series[series.len() - 2]), "best");
    assert!(series[..series.len() - 2].iter().all(|n| role(n) == "algorithm"));

    // Styles: Okabe–Ito only; the oracle solid black; every algorithm its own dash.
    let style = |n: &roxmltree::Node<'_, '_>| {
        (
            n.attribute("stroke").unwrap_or("").to_owned(),
            n.attribute("stroke-dasharray").map(str::to_owned),
        )
    };
    for n in &series {
        let (colour, _) = style(n);
        assert!(OKABE_ITO.contains(&colour.as_str()), "{colour} is not Okabe–Ito");
    }
    let oracle = &series[series.len() - 1];
    assert_eq!(style(oracle), ("#000000".to_owned(), None));
    let mut dashes: Vec<&str> = series
        .iter()
        .filter(|n| role(n) != "oracle")
        .map(|n| n.attribute("stroke-dasharray").expect("dashed"))
        .collect();
    dashes.sort_unstable();
    dashes.dedup();
    assert_eq!(dashes.len(), series.len() - 1, "dash patterns repeat");
    assert!(num(&series[series.len() - 2], "stroke-width") > num(&series[0], "stroke-width"));
    // The legend draws each entry as its line is drawn.
    for n in &series {
        let name = n.attribute("data-name");
        let entry = doc
            .descendants()
            .find(|l| has_class(l, "legend") && l.attribute("data-name") == name)
            .unwrap_or_else(|| panic!("no legend entry for {name:?}"));
        assert_eq!(style(&entry), style(n), "{name:?}");
    }

    // Each line climbs, and the oracle's crosses p99 at the table's p99.
    for n in &series {
        let pts = points(n);
        assert!(pts.len() > 100, "{} points", pts.len());
        assert!(pts.windows(2).all(|w| w[1].0 > w[0].0 && w[1].1 <= w[0].1 + 0.05), "{n:?}");
    }
    let oracle_p99 = rows.iter().find(|r| r.0 == "oracle").expect("oracle row").1;
    let at_p99 = points(oracle)
        .into_iter()
        .min_by(|a, b| (a.0 - xs[2]).abs().total_cmp(&(b.0 - xs[2]).abs()))
        .expect("points");
    assert!((at_p99.0 - xs[2]).abs() < 0.5, "no point at p99: {at_p99:?}");
    assert!((at_p99.1 - y_of(oracle_p99)).abs() < 1.0, "{at_p99:?} vs p99 {oracle_p99} ms");
}

/// Load plots are small multiples on one scale: members that should take the same load are one
/// panel drawn as a band (least to most loaded) around their mean; a member a phase changes has
/// a panel of its own, with the phase marked.
#[test]
fn issue_43_load_plots_are_small_multiples_with_alike_members_as_a_band() {
    let out = run(&parse(SMALL), &mut |_| {});
    for picker in ["random", "p2c-ewma", "least-sessions", "oracle"] {
        let name = format!("load-{picker}.svg");
        let doc = svg_doc(plot(&out, &name));
        let panels: Vec<_> = doc.descendants().filter(|n| has_class(n, "panel")).collect();
        let members: Vec<&str> =
            panels.iter().map(|p| p.attribute("data-members").unwrap_or("")).collect();
        assert_eq!(members, ["m-1", "m-2 m-3 m-4", "s"], "{name}");
        // One scale for all: the same top and the same tick labels in every panel.
        let ymax: Vec<f64> = panels.iter().map(|p| num(p, "data-ymax")).collect();
        assert!(ymax.iter().all(|&v| v == ymax[0] && v > 0.0), "{name}: {ymax:?}");
        let ticks = |p: &roxmltree::Node<'_, '_>| -> Vec<String> {
            p.descendants()
                .filter(|n| has_class(n, "y-tick"))
                .map(|n| n.text().unwrap_or("").to_owned())
                .collect()
        };
        assert!(panels.iter().all(|p| ticks(p) == ticks(&panels[0])), "{name}");
        // Stacked, not overlapping.
        let frames: Vec<(f64, f64)> = panels
            .iter()
            .map(|p| {
                let r = p.children().find(|n| n.has_tag_name("rect")).expect("frame");
                (num(&r, "y"), num(&r, "y") + num(&r, "height"))
            })
            .collect();
        assert!(frames.windows(2).all(|w| w[1].0 > w[0].1), "{name}: {frames:?}");
        for (p, (top, bottom)) in panels.iter().zip(&frames) {
            let bands: Vec<_> = p.descendants().filter(|n| has_class(n, "band")).collect();
            let lines: Vec<_> = p.descendants().filter(|n| has_class(n, "series")).collect();
            assert_eq!(lines.len(), 1, "{name}: one line per panel");
            let line = points(&lines[0]);
            assert!(line.iter().all(|&(_, y)| y >= top - 0.05 && y <= bottom + 0.05), "{name}");
            let several = p.attribute("data-members").unwrap_or("").contains(' ');
            assert_eq!(bands.len(), usize::from(several), "{name}: a band only for a group");
            if several {
                // The band's outline runs along the top, then back along the bottom; the mean
                // lies between them in every window.
                let outline = points(&bands[0]);
                assert_eq!(outline.len(), 2 * line.len(), "{name}");
                for (k, &(x, y)) in line.iter().enumerate() {
                    let (ux, uy) = outline[k];
                    let (lx, ly) = outline[outline.len() - 1 - k];
                    assert!(ux == x && lx == x, "{name}: window {k}");
                    assert!(uy <= y + 0.05 && y <= ly + 0.05, "{name}: window {k}: {uy} {y} {ly}");
                }
            }
            // The phase at 2 s is marked in every panel, and named in m-1's only.
            let phases = p.descendants().filter(|n| has_class(n, "phase")).count();
            assert_eq!(phases, 1, "{name}");
            let named = p.descendants().any(|n| n.text() == Some("slow x5"));
            assert_eq!(named, p.attribute("data-members") == Some("m-1"), "{name}");
        }
    }
}

const OVERLOAD: &str = r#"
name = "overload"
duration_s = 5
algorithms = ["round-robin", "adaptive"]
[arrivals]
load = 0.7
[[member]]
name = "fast"
count = 3
service = { dist = "exponential", mean_ms = 10 }
[[member]]
name = "slow"
service = { dist = "exponential", mean_ms = 100 }
"#;

/// A run that left work queued at the end overloaded a member: its row says so and a note under
/// the table names the member, the requests left and the rate it was sent against what it
/// serves, so a p99 of minutes does not read as a bug. Runs that kept up get no note.
#[test]
fn issue_43_the_table_notes_a_run_that_overloaded_a_member() {
    let out = run(&parse(OVERLOAD), &mut |_| {});
    let t = &out.table;
    assert!(t.contains("| round-robin (overloaded, see note) |"), "{t}");
    let note = t
        .lines()
        .find(|l| l.starts_with("note: round-robin overloaded slow ("))
        .unwrap_or_else(|| panic!("no note for round-robin in\n{t}"));
    assert!(note.contains("serves 10.0/s"), "{note}");
    let unfinished = t
        .lines()
        .find(|l| l.starts_with("| round-robin "))
        .and_then(|l| l.split('|').nth(7))
        .map(str::trim)
        .expect("unfinished cell");
    assert_ne!(unfinished, "0", "{t}");
    assert!(note.contains(&format!("{unfinished} requests left")), "{note}");
    for kept_up in ["adaptive", "oracle"] {
        assert!(t.contains(&format!("| {kept_up} |")), "{kept_up}: {t}");
        assert!(!t.contains(&format!("note: {kept_up} ")), "{kept_up}: {t}");
    }
    // A run the event bound stopped says that instead: it did not run long enough to tell.
    let stopped = run(
        &parse(&OVERLOAD.replace("duration_s = 5", "duration_s = 5\nmax_events = 1000")),
        &mut |_| {},
    );
    assert!(stopped.table.contains("(event bound hit)"), "{}", stopped.table);
    assert!(!stopped.table.contains("overloaded"), "{}", stopped.table);
}
