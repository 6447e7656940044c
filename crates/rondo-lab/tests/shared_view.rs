//! The tier's shared load view in the lab (issue 37, item 9): `shared_view_ms` makes each
//! router count the others' requests in flight, one period late; the scenario file refuses it
//! without a tier. What it measures is in docs/benchmarks.md.

use std::path::PathBuf;

use rondo_core::Algorithm;
use rondo_lab::scenario::{Kind, Picker, Queueing, Scenario};
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

/// With a view shared every millisecond (fresh next to 10 ms requests), least-sessions over
/// four routers sends the slow member what one router alone would: its p99 drops well below
/// the own-views tier's (which herds onto the slow member, 5x the oracle).
#[test]
fn a_fresh_shared_view_ends_least_sessions_herding() {
    let (s, shared) = shipped("tier-shared-view.toml");
    assert_eq!((shared.routers, shared.shared_view), (4, Some(100_000_000)));
    let fresh = Queueing { shared_view: Some(1_000_000), ..shared.clone() };
    let own = Queueing { shared_view: None, ..shared };
    let least = Picker::Core(Algorithm::LeastSessions);
    let p99 = |q: &Queueing| {
        let r = run_one(q, least, s.seed, &mut |_| {});
        quantile(&r.latencies, 0.99).expect("latencies")
    };
    let (fresh, own) = (p99(&fresh), p99(&own));
    assert!(fresh * 2 < own, "shared every 1 ms {fresh} vs own views {own}");
}

#[test]
fn a_shared_view_needs_a_tier_and_a_sane_period() {
    let base = "name = \"t\"\nduration_s = 5\nalgorithms = [\"least-sessions\"]\n[arrivals]\nload = 0.5\n[[member]]\nname = \"a\"\nservice = { dist = \"constant\", mean_ms = 10 }\n";
    let err =
        Scenario::parse(&format!("shared_view_ms = 100\n{base}"), "t.toml").expect_err("no tier");
    assert!(err.to_string().contains("a shared view needs a tier"), "{err}");
    let err = Scenario::parse(&format!("routers = 2\nshared_view_ms = 0\n{base}"), "t.toml")
        .expect_err("zero");
    assert!(err.to_string().contains("must be 1..=10000"), "{err}");
    assert!(
        Scenario::parse(&format!("routers = 2\nshared_view_ms = 100\n{base}"), "t.toml").is_ok()
    );
}
