//! Load-aware algorithms: least-sessions, least-cpu, most-free-memory, p2c-ewma.

use std::time::Duration;

use rondo_core::load::AgentReport;
use rondo_core::{Algorithm, Balancer, Instant, Outcome, Why};

use super::support::*;

/// Throws `n` balls into `n` bins with nothing finishing, returns the fullest bin.
fn max_load(algo: Algorithm, n: usize, seed: u64) -> u32 {
    let mut b = balancer(algo, n);
    let mut r = rng(seed);
    for _ in 0..n {
        let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
        b.begin_request(d.member);
    }
    b.states().iter().map(|s| s.load.in_flight).max().unwrap_or(0)
}

/// Mitzenmacher: with one random choice the fullest of n bins holds about ln n / ln ln n balls;
/// with the better of two choices, ln ln n / ln 2 + O(1): exponentially better, and it barely
/// grows with n.
#[test]
fn two_choices_beat_one_like_mitzenmacher() {
    let mut rows = Vec::new();
    for n in [100usize, 1_000, 10_000] {
        let one: f64 =
            (0..5).map(|s| f64::from(max_load(Algorithm::Random, n, s))).sum::<f64>() / 5.0;
        let two: f64 =
            (0..5).map(|s| f64::from(max_load(Algorithm::P2cEwma, n, s))).sum::<f64>() / 5.0;
        rows.push((n, one, two));
    }
    for &(n, one, two) in &rows {
        assert!(two <= 4.0, "n={n}: two choices max load {two}");
        assert!(two < one * 0.75, "n={n}: two choices {two} vs one {one}");
    }
    // One choice grows with n; two choices stays nearly flat.
    assert!(rows[2].1 - rows[0].1 >= 1.5, "one choice should grow with n: {rows:?}");
    assert!(rows[2].2 - rows[0].2 <= 1.5, "two choices should stay flat: {rows:?}");
}

#[test]
fn p2c_avoids_a_slow_member_but_does_not_starve_it() {
    let mut b = balancer(Algorithm::P2cEwma, 2);
    let mut r = rng(4);
    let ms = Duration::from_millis;
    // Member 1 answers in 500 ms, member 0 in 5 ms.
    for (m, lat) in [(0, ms(5)), (1, ms(500))] {
        b.begin_request(m);
        b.end_request(m, Instant::ZERO, Outcome::Success { latency: lat });
    }
    let now = Instant::from_millis(1);
    let h = histogram(&picks(&mut b, 10_000, now, &mut r), 2);
    assert!(h[1] < 300, "the slow member gets little: {h:?}");
    assert!(h[1] > 0, "the exploration floor still sends it some: {h:?}");
    // Much later with no news from it, its estimate has decayed and it competes again.
    let later = Instant::from_millis(120_000);
    b.begin_request(0);
    b.end_request(0, later, Outcome::Success { latency: ms(5) });
    let h = histogram(&picks(&mut b, 1000, later, &mut r), 2);
    assert!(h[1] > 300, "decayed estimate competes again: {h:?}");
}

#[test]
fn p2c_penalises_failures() {
    let mut b = balancer(Algorithm::P2cEwma, 2);
    let ms = Duration::from_millis;
    b.begin_request(0);
    b.end_request(0, Instant::ZERO, Outcome::Success { latency: ms(20) });
    b.begin_request(1);
    b.end_request(
        1,
        Instant::ZERO,
        Outcome::Failure { kind: rondo_core::FailureKind::Reset, latency: ms(1) },
    );
    let h = histogram(&picks(&mut b, 1000, Instant::from_millis(1), &mut rng(2)), 2);
    assert!(h[1] < 50, "a member that fails fast must not win on speed: {h:?}");
}

#[test]
fn least_sessions_sends_to_the_least_loaded_and_honours_weights() {
    let members = vec![member("a", 100, None), member("b", 200, None), member("c", 100, None)];
    let mut b = Balancer::new(cluster(Algorithm::LeastSessions, members), Instant::ZERO);
    let mut r = rng(1);
    // Sessions held open: they accumulate in proportion to weight.
    for _ in 0..400 {
        let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
        b.open_session(d.member);
    }
    let s: Vec<u32> = b.states().iter().map(|s| s.load.sessions).collect();
    assert_eq!(s, vec![100, 200, 100]);
    // Close many on one member: the next picks go there until it catches up.
    for _ in 0..50 {
        b.close_session(0);
    }
    let p = picks(&mut b, 1, Instant::ZERO, &mut r);
    assert_eq!(p, vec![0]);
    // Sequential traffic (nothing held) follows the weights.
    let mut b = Balancer::new(
        cluster(Algorithm::LeastSessions, vec![member("a", 100, None), member("b", 300, None)]),
        Instant::ZERO,
    );
    let h = histogram(&picks(&mut b, 400, Instant::ZERO, &mut r), 2);
    assert_eq!(h, vec![100, 300]);
}

#[test]
fn least_sessions_with_equal_weights_fills_the_emptiest_member_first() {
    let mut b = balancer(Algorithm::LeastSessions, 4);
    let mut r = rng(1);
    for _ in 0..40 {
        let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
        b.open_session(d.member);
    }
    let s: Vec<u32> = b.states().iter().map(|s| s.load.sessions).collect();
    assert_eq!(s, vec![10, 10, 10, 10]);
    for _ in 0..3 {
        b.close_session(2);
    }
    b.close_session(0);
    // Member 2 (7 sessions) fills up to 9 before anyone else gets one; then 0 and 2 tie at 9 and
    // take turns.
    let mut p = Vec::new();
    for _ in 0..4 {
        let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
        b.open_session(d.member);
        p.push(d.member);
    }
    assert_eq!(&p[..2], &[2, 2]);
    assert_eq!(histogram(&p[2..], 4), vec![1, 0, 1, 0]);
    // Sequential requests (begun and ended at once) go round the members in turn.
    let mut b = balancer(Algorithm::LeastSessions, 3);
    let mut seq = Vec::new();
    for _ in 0..6 {
        let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
        b.begin_request(d.member);
        b.end_request(
            d.member,
            Instant::ZERO,
            Outcome::Success { latency: Duration::from_millis(1) },
        );
        seq.push(d.member);
    }
    assert_eq!(seq, vec![0, 1, 2, 0, 1, 2]);
}

fn report(cpu: f32, free_mib: u64, at: Instant) -> AgentReport {
    AgentReport { cpu_used: cpu, mem_free: free_mib << 20, sessions: 0, seq: 1, at }
}

#[test]
fn least_cpu_and_most_free_memory_follow_agent_reports() {
    let now = Instant::from_millis(1000);
    let mut b = balancer(Algorithm::LeastCpu, 3);
    let mut r = rng(1);
    b.report_agent(0, report(0.70, 100, now));
    b.report_agent(1, report(0.20, 50, now));
    b.report_agent(2, report(0.90, 900, now));
    let d = b.pick(&at(now), &mut r).unwrap();
    assert_eq!(d.member, 1);
    assert!(matches!(d.why, Why::LeastCpu { .. }));

    let mut b = balancer(Algorithm::MostFreeMemory, 3);
    b.report_agent(0, report(0.70, 100, now));
    b.report_agent(1, report(0.20, 50, now));
    b.report_agent(2, report(0.90, 900, now));
    assert_eq!(b.pick(&at(now), &mut r).unwrap().member, 2);
}

#[test]
fn agent_algorithms_fall_back_to_least_sessions_without_reports() {
    let now = Instant::from_millis(1000);
    for algo in [Algorithm::LeastCpu, Algorithm::MostFreeMemory] {
        let mut b = balancer(algo, 3);
        let mut r = rng(1);
        b.report_agent(0, report(0.10, 900, now));
        b.report_agent(1, report(0.10, 900, now));
        // Member 2 never reported: the pick falls back to least-sessions and says so.
        b.open_session(0);
        b.open_session(1);
        let d = b.pick(&at(now), &mut r).unwrap();
        assert_eq!(d.member, 2, "{algo}");
        assert_eq!(d.why, Why::AgentFallback { missing: 1, active: 0 });
    }
}

#[test]
fn a_silent_agent_marks_its_member_unavailable_until_it_reports_again() {
    let mut b = balancer(Algorithm::LeastCpu, 2);
    let mut r = rng(1);
    b.report_agent(0, report(0.1, 1, Instant::ZERO));
    b.report_agent(1, report(0.5, 1, Instant::ZERO));
    assert_eq!(b.pick(&at(Instant::from_millis(100)), &mut r).unwrap().member, 0);
    // Member 1 keeps reporting; member 0 goes silent past the 600 ms timeout.
    b.report_agent(1, report(0.5, 1, Instant::from_millis(700)));
    let p = picks(&mut b, 5, Instant::from_millis(700), &mut r);
    assert_eq!(p, vec![1; 5]);
    // Its heartbeats resume: available again.
    b.report_agent(0, report(0.1, 1, Instant::from_millis(800)));
    assert_eq!(b.pick(&at(Instant::from_millis(800)), &mut r).unwrap().member, 0);
}

/// Circuit breakers (issue 38): a member at `max_requests_per_member` is passed over, every
/// member at it refuses the pick, and `max_requests` refuses any pick while the cluster has that
/// many in flight; each refusal names its breaker, and ends lift it.
#[test]
fn circuit_breakers_cap_requests_in_flight() {
    use rondo_core::{PickError, Policy, RequestLimits};
    for algorithm in [Algorithm::RoundRobin, Algorithm::LeastSessions, Algorithm::P2cEwma] {
        let limits = RequestLimits { max_requests_per_member: Some(1), ..Default::default() };
        let policy = Policy { algorithm, limits, ..Policy::default() };
        let mut b = Balancer::new(cluster_with(policy, named(3)), Instant::ZERO);
        let mut r = rng(7);
        let mut taken = Vec::new();
        for _ in 0..3 {
            let d = b.pick(&at(Instant::ZERO), &mut r).expect("a member under its cap");
            b.begin_request(d.member);
            taken.push(d.member);
        }
        taken.sort_unstable();
        assert_eq!(taken, vec![0, 1, 2], "{algorithm:?}: one each");
        let refused = b.pick(&at(Instant::ZERO), &mut r).unwrap_err();
        assert_eq!(refused.breaker(), Some("max_requests_per_member"), "{algorithm:?}: {refused}");
        b.end_request(1, Instant::ZERO, rondo_core::Outcome::Success { latency: Duration::ZERO });
        assert_eq!(b.pick(&at(Instant::ZERO), &mut r).expect("m1 is free").member, 1);
    }

    let limits = RequestLimits { max_requests: Some(2), ..Default::default() };
    let policy = Policy { limits, ..Policy::default() };
    let mut b = Balancer::new(cluster_with(policy, named(3)), Instant::ZERO);
    let mut r = rng(7);
    for _ in 0..2 {
        let d = b.pick(&at(Instant::ZERO), &mut r).expect("under max_requests");
        b.begin_request(d.member);
    }
    let refused = b.pick(&at(Instant::ZERO), &mut r).unwrap_err();
    assert!(matches!(refused, PickError::AtMaxRequests { limit: 2, .. }), "{refused}");
    assert_eq!(b.under_max_requests().unwrap_err(), refused);
    b.end_request(0, Instant::ZERO, rondo_core::Outcome::Cancelled);
    b.end_request(1, Instant::ZERO, rondo_core::Outcome::Cancelled);
    b.pick(&at(Instant::ZERO), &mut r).expect("under max_requests again");
}
