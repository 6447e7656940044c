//! Issue 42's harder scenarios: heavy-tailed service times (lognormal, Pareto), a member that
//! drifts or hangs, and a tier of routers each with its own view (`routers = N`). The lab's
//! side: the new distributions have the means they claim, a tier's balancers hear only their
//! own requests, a tier of one is the single router, and mistakes are located errors.

use std::path::PathBuf;

use rondo_core::Algorithm;
use rondo_lab::run;
use rondo_lab::scenario::{Kind, PhaseKind, Picker, Queueing, Scenario, Service};
use rondo_lab::sim::run_one;
use rondo_lab::stats::quantile;

fn shipped(name: &str) -> (Scenario, Queueing) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios").join(name);
    let text = std::fs::read_to_string(&path).expect("read");
    let s = Scenario::parse(&text, &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
    let Kind::Queueing(q) = &s.kind else { panic!("{name}: not queueing") };
    let q = (**q).clone();
    (s, q)
}

fn p99(q: &Queueing, picker: Picker, seed: u64) -> u64 {
    let r = run_one(q, picker, seed, &mut |_| {});
    quantile(&r.latencies, 0.99).expect("latencies")
}

/// The mean of `service` over a grid of the two uniforms (midpoints), which integrates the
/// inverse transform without sampling noise (the Pareto tail past the grid is all it misses).
fn grid_mean(service: Service) -> f64 {
    const N: usize = 2000;
    let mut sum = 0.0;
    for i in 0..N {
        for j in 0..N {
            let (u1, u2) = ((i as f64 + 0.5) / N as f64, (j as f64 + 0.5) / N as f64);
            sum += service.sample(u1, u2);
        }
    }
    sum / (N * N) as f64
}

#[test]
fn heavy_tailed_services_have_the_mean_they_claim() {
    for service in [
        Service::Lognormal { mean: 10e6, sigma: 1.5 },
        Service::Pareto { mean: 10e6, alpha: 3.0 },
        Service::Pareto { mean: 30e6, alpha: 5.0 },
    ] {
        let mean = grid_mean(service);
        assert!((mean / service.mean() - 1.0).abs() < 0.02, "{service:?}: mean {mean}");
    }
    // Heavy: a Pareto's p99.9 with alpha 2.2 is about 13x its mean.
    let pareto = Service::Pareto { mean: 1.0, alpha: 2.2 };
    let tail = pareto.sample(0.999, 0.5);
    assert!((12.0..14.0).contains(&tail), "p99.9 {tail}");
}

const TWO: &str = r#"
name = "two"
duration_s = 5
algorithms = ["least-sessions", "adaptive"]
[arrivals]
load = 0.7
[[member]]
name = "m"
count = 4
service = { dist = "pareto", mean_ms = 10, alpha = 2.5 }
"#;

fn error_of(text: &str) -> String {
    match Scenario::parse(text, "bad.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn routers_and_pareto_mistakes_are_located_errors() {
    let cases = [
        (
            TWO.replace("duration_s = 5", "duration_s = 5\nrouters = 0"),
            "bad.toml:4:11: field `routers`: must be 1..=64",
        ),
        (
            TWO.replace("duration_s = 5", "duration_s = 5\nrouters = 65"),
            "bad.toml:4:11: field `routers`: must be 1..=64",
        ),
        (
            TWO.replace("alpha = 2.5", "alpha = 1.0"),
            "bad.toml:10:11: field `member[0].service.alpha`: alpha must be in (1, 10]",
        ),
        (
            TWO.replace("mean_ms = 10, ", ""),
            "bad.toml:10:11: field `member[0].service.mean_ms`: pareto needs a positive mean_ms",
        ),
        (
            "algorithms = [\"random\"]\nrouters = 2\n[balls_into_bins]\nsizes = [10]\ntrials = 1\n"
                .to_owned(),
            "bad.toml:3:1: field `balls_into_bins`: a balls-into-bins scenario has no members, arrivals, phases or routers",
        ),
    ];
    for (text, want) in cases {
        let got = error_of(&text);
        assert!(got.starts_with(want), "got:  {got}\nwant: {want}");
    }
}

/// `routers = 1` is the single router, byte for byte: router 0 draws from the single router's
/// generator, so adding the tier changed no earlier result.
#[test]
fn a_tier_of_one_router_is_the_single_router() {
    let parse = |t: &str| Scenario::parse(t, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let one =
        run(&parse(&TWO.replace("duration_s = 5", "duration_s = 5\nrouters = 1")), &mut |_| {});
    let plain = run(&parse(TWO), &mut |_| {});
    assert_eq!(one.table, plain.table);
    let four =
        run(&parse(&TWO.replace("duration_s = 5", "duration_s = 5\nrouters = 4")), &mut |_| {});
    assert!(four.table.contains("4 routers each with its own view"), "{}", four.table);
    assert_ne!(four.table, plain.table);
}

/// Each router's balancer hears only the requests it placed. `least-sessions` shows it: with
/// one view it sends the slow member only what its queue allows; four routers each see a
/// quarter of every member's requests (often none at the slow one) and break ties alike, so
/// they herd onto it together. Were the views shared, the two p99s would be alike.
#[test]
fn routers_with_their_own_views_herd_where_one_router_does_not() {
    let (s, tier) = shipped("tier-slow-member.toml");
    assert_eq!(tier.routers, 4);
    let single = Queueing { routers: 1, ..tier.clone() };
    let least = Picker::Core(Algorithm::LeastSessions);
    let (alone, herd) = (p99(&single, least, s.seed), p99(&tier, least, s.seed));
    assert!(herd > 2 * alone, "4 routers {herd} vs 1 router {alone}");
}

/// `adaptive`'s p99 over the oracle's in a shipped scenario (seed from the file).
fn adaptive_ratio(name: &str) -> f64 {
    let (s, q) = shipped(name);
    let adaptive = p99(&q, Picker::Core(Algorithm::Adaptive), s.seed);
    adaptive as f64 / p99(&q, Picker::Oracle, s.seed) as f64
}

/// Issue 42's targets, met by `adaptive` (docs/algorithms.md has the table): p99 at most 1.1x
/// the oracle's in every single-router scenario, at most 1.2x with four routers that share no
/// view, and still at most 1.05x in issue 21's slow-member scenario.
#[test]
fn issue_42_adaptive_is_within_the_targets_of_the_oracle() {
    for (name, target) in [
        ("drift.toml", 1.1),
        ("lognormal-mixed.toml", 1.1),
        ("lognormal-slow.toml", 1.1),
        ("pareto-mixed.toml", 1.1),
        ("hanging.toml", 1.1),
        ("tier-slow-member.toml", 1.2),
        ("slow-member.toml", 1.05),
    ] {
        let ratio = adaptive_ratio(name);
        assert!(ratio <= target, "{name}: adaptive p99 {ratio:.3}x the oracle's (target {target})");
    }
}

/// The hanging member: with no health checks, `adaptive` sees it stop finishing requests and
/// sends it almost nothing from its first second on (a handful of requests are lost to it,
/// where round robin loses a tenth of every second's until outlier detection ejects it).
#[test]
fn issue_42_a_hanging_member_gets_almost_nothing_from_adaptive() {
    let (s, q) = shipped("hanging.toml");
    let phase =
        q.phases.iter().position(|p| matches!(p.kind, PhaseKind::FailSlow(_))).expect("hang");
    let r = run_one(&q, Picker::Core(Algorithm::Adaptive), s.seed, &mut |_| {});
    let share = rondo_lab::report::first_second_share(&q, &r, phase).expect("buckets");
    assert!(share <= 0.005, "the hanging member took {:.2} % of the first second", share * 100.0);
    let rr = run_one(&q, Picker::Core(Algorithm::RoundRobin), s.seed, &mut |_| {});
    assert!(
        r.errors * 5 < rr.errors,
        "adaptive lost {} requests, round robin {}",
        r.errors,
        rr.errors
    );
}
