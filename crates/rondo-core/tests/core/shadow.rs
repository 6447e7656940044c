//! Shadow evaluation: a candidate algorithm asked at every pick beside the live one moves no
//! traffic, sees what the live one sees, and its report adds up.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rondo_core::load::AgentReport;
use rondo_core::{
    Actor, Algorithm, Balancer, FailureKind, Instant, Outcome, PickRequest, Policy, ShadowReport,
    SlowStart, SplitMix64,
};

use super::support::*;

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// One step of a balancer's life.
#[derive(Debug, Clone)]
enum Op {
    /// A pick (then begun), excluding the members in `exclude`'s bits, with a hash key.
    Pick { exclude: u8, key: Option<u8>, group: bool },
    /// The `which`-th request in flight ends.
    End { which: usize, failed: bool, cancelled: bool, latency_ms: u8 },
    /// Health checks say `member` is up or down.
    Health { member: usize, up: bool },
    /// A probe round with these round trips (ms; 0: the probe failed).
    Probe(Vec<u8>),
    /// A load agent's report.
    Agent { member: usize, cpu: u8 },
    /// A session opens on, or the oldest closes on, `member`.
    Session { member: usize, open: bool },
    /// Time passes.
    Wait(u16),
    /// A new view of the same cluster (state carried over).
    Swap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), prop::option::of(any::<u8>()), any::<bool>())
            .prop_map(|(exclude, key, group)| Op::Pick { exclude: exclude & exclude >> 3, key, group }),
        4 => (any::<usize>(), prop::bool::weighted(0.2), prop::bool::weighted(0.1), 1u8..50)
            .prop_map(|(which, failed, cancelled, latency_ms)| Op::End { which, failed, cancelled, latency_ms }),
        1 => (0usize..8, prop::bool::weighted(0.7)).prop_map(|(member, up)| Op::Health { member, up }),
        1 => prop::collection::vec(0u8..40, 8).prop_map(Op::Probe),
        1 => (0usize..8, 0u8..100).prop_map(|(member, cpu)| Op::Agent { member, cpu }),
        1 => (0usize..8, any::<bool>()).prop_map(|(member, open)| Op::Session { member, open }),
        1 => (0u16..3000).prop_map(Op::Wait),
        1 => Just(Op::Swap),
    ]
}

/// What a run of `ops` on one balancer gave: the live picks (member or error text), and the
/// shadow's members when it had one.
struct Run {
    live: Vec<Result<rondo_core::Decision, String>>,
    shadow: Vec<Option<usize>>,
    balancer: Balancer,
    picks: u64,
}

/// Drives a balancer of `n` members (`weighted`: unequal weights) through `ops`, with a shadow
/// of `shadow` when given; checks every shadow pick against the eligibility rules on the way.
fn run(
    live: Algorithm,
    shadow: Option<Algorithm>,
    n: usize,
    weighted: bool,
    slow_start: bool,
    ops: &[Op],
    seed: u64,
) -> Run {
    let members = (0..n)
        .map(|i| {
            member(
                &format!("m{i}"),
                if weighted { 50 + 50 * (i as u32 % 3) } else { 100 },
                Some(["a", "b"][i % 2]),
            )
        })
        .collect();
    let slow_start = if slow_start {
        SlowStart { duration: Duration::from_secs(5), initial_percent: 10 }
    } else {
        SlowStart::default()
    };
    let policy = Policy { algorithm: live, slow_start, ..Policy::default() };
    let mut b = Balancer::new(cluster_with(policy, members), Instant::ZERO);
    b.set_shadow(shadow, Instant::ZERO);
    let mut rng = SplitMix64::new(seed);
    let mut shadow_rng = SplitMix64::new(seed ^ 0x5eed);
    let mut now = Instant::from_millis(1);
    let mut in_flight: Vec<usize> = Vec::new();
    let mut sessions: Vec<usize> = Vec::new();
    let mut out = Run { live: Vec::new(), shadow: Vec::new(), balancer: b, picks: 0 };
    let b = &mut out.balancer;
    for op in ops {
        match op {
            Op::Pick { exclude, key, group } => {
                let exclude: Vec<usize> = (0..n).filter(|i| exclude >> (i % 8) & 1 == 1).collect();
                let req = PickRequest {
                    now,
                    group: group.then_some("a"),
                    hash: key.map(|k| rondo_core::hash::hash_key(&[k])),
                    context: None,
                    exclude: &exclude,
                };
                let d = b.pick(&req, &mut rng);
                let s = b.shadow_pick(&req, d.as_ref().ok().map(|d| d.member), &mut shadow_rng);
                match d {
                    Ok(d) => {
                        if let Some(m) = s {
                            let (elig, _) = b.eligibility(now, req.group);
                            assert!(elig[m].eligible, "shadow {shadow:?} picked ineligible {m}");
                            assert!(!exclude.contains(&m), "shadow picked excluded {m}");
                        }
                        out.shadow.push(s);
                        b.begin_request(d.member);
                        in_flight.push(d.member);
                        out.picks += 1;
                        out.live.push(Ok(d));
                    }
                    Err(e) => {
                        assert_eq!(s, None, "the shadow found a member where the live one did not");
                        out.live.push(Err(e.to_string()));
                    }
                }
            }
            Op::End { which, failed, cancelled, latency_ms } if !in_flight.is_empty() => {
                let m = in_flight.remove(which % in_flight.len());
                let latency = Duration::from_millis(u64::from(*latency_ms));
                let outcome = match (cancelled, failed) {
                    (true, _) => Outcome::Cancelled,
                    (_, true) => Outcome::Failure { kind: FailureKind::Reset, latency },
                    _ => Outcome::Success { latency },
                };
                b.end_request(m, now, outcome);
            }
            Op::End { .. } => {}
            Op::Health { member, up } => {
                b.set_health(member % n, *up, Actor::HealthCheck, now);
            }
            Op::Probe(rtts) => {
                let round: Vec<(usize, Option<Duration>)> = (0..n)
                    .map(|i| {
                        let ms = rtts[i % rtts.len()];
                        (i, (ms > 0).then(|| Duration::from_millis(u64::from(ms))))
                    })
                    .collect();
                b.record_probe_round(&round);
            }
            Op::Agent { member, cpu } => b.report_agent(
                member % n,
                AgentReport {
                    cpu_used: f32::from(*cpu) / 100.0,
                    mem_free: u64::from(*cpu) << 24,
                    sessions: 0,
                    seq: 1,
                    at: now,
                },
            ),
            Op::Session { member, open: true } => {
                b.open_session(member % n);
                sessions.push(member % n);
            }
            Op::Session { open: false, .. } => {
                if !sessions.is_empty() {
                    b.close_session(sessions.remove(0));
                }
            }
            Op::Wait(ms) => now = now + Duration::from_millis(u64::from(*ms)),
            Op::Swap => *b = Balancer::carry_over(Arc::new((**b.spec()).clone()), b, now),
        }
    }
    out
}

/// Every count of a report adds up: each compared pick is one live pick of one member and one
/// shadow pick (or none); failed, slow and unresolved picks are picks.
fn check_sums(r: &ShadowReport, picks: u64) {
    assert_eq!(r.decisions, picks);
    let (live, shadow) = (r.live_total(), r.shadow_total());
    assert_eq!(live.picks, picks, "{r:?}");
    assert_eq!(shadow.picks + r.no_pick, picks, "{r:?}");
    assert_eq!(r.members.iter().map(|m| m.agreed).sum::<u64>(), r.agreed);
    assert!(r.agreed <= picks - r.no_pick);
    for m in &r.members {
        assert!(m.agreed <= m.live.picks.min(m.shadow.picks), "{m:?}");
        for side in [m.live, m.shadow] {
            assert!(side.failed + side.unresolved <= side.picks, "{m:?}");
            assert!(side.slow <= side.picks, "{m:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// A shadow moves no traffic: the live picks, their explanations and every member's state
    /// are exactly those of the same balancer without a shadow, for every live and shadow
    /// algorithm, through exclusions, slow start, health changes, probe rounds, agent reports,
    /// sessions and failures. The shadow never picks an ineligible or excluded member (checked
    /// in `run`), and its report adds up to the picks made.
    #[test]
    fn a_shadow_moves_no_traffic_and_its_report_adds_up(
        live in algorithm(),
        shadow in algorithm(),
        n in 1usize..8,
        weighted in any::<bool>(),
        slow_start in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
        seed in any::<u64>(),
    ) {
        let plain = run(live, None, n, weighted, slow_start, &ops, seed);
        let mut shadowed = run(live, Some(shadow), n, weighted, slow_start, &ops, seed);
        prop_assert_eq!(&plain.live, &shadowed.live);
        prop_assert_eq!(plain.balancer.states(), shadowed.balancer.states());
        prop_assert!(plain.shadow.iter().all(Option::is_none));
        prop_assert_eq!(shadowed.balancer.shadow(), Some(shadow));
        let now = Instant::from_millis(1_000_000);
        let r = shadowed.balancer.shadow_report(now).expect("a report");
        prop_assert_eq!((r.algorithm, r.live), (shadow, live));
        check_sums(&r, shadowed.picks);
        let shadow_picks: Vec<usize> = shadowed.shadow.iter().flatten().copied().collect();
        for (i, m) in r.members.iter().enumerate() {
            let count = shadow_picks.iter().filter(|&&s| s == i).count() as u64;
            prop_assert_eq!(m.shadow.picks, count);
        }
    }

    /// A shadow of the live algorithm itself, for the algorithms that draw no random numbers,
    /// agrees on every pick: it sees the same candidates, load and state the live picks see.
    #[test]
    fn a_shadow_of_the_live_algorithm_agrees_on_every_pick(
        algo in prop::sample::select(vec![
            Algorithm::RoundRobin, Algorithm::Weighted, Algorithm::LeastSessions,
            Algorithm::LeastCpu, Algorithm::MostFreeMemory, Algorithm::ResponseTime,
            Algorithm::ResponseTimeClb, Algorithm::Hash,
        ]),
        n in 1usize..8,
        weighted in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
        seed in any::<u64>(),
    ) {
        // Hash keys on every pick (without one `hash` is random).
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|o| match o {
                Op::Pick { exclude, key, group } => Op::Pick { exclude, key: Some(key.unwrap_or(7)), group },
                o => o,
            })
            .collect();
        let mut r = run(algo, Some(algo), n, weighted, false, &ops, seed);
        for (live, shadow) in r.live.iter().filter_map(|d| d.as_ref().ok()).zip(&r.shadow) {
            prop_assert_eq!(Some(live.member), *shadow);
        }
        let report = r.balancer.shadow_report(Instant::from_millis(1)).unwrap();
        prop_assert_eq!(report.agreed, r.picks);
    }
}

/// Sequential traffic over five members, one of them ten times slower: round-robin (live) gives
/// it a fifth of the picks, a p2c-ewma shadow would have given it almost none, and the report
/// says both, and that the live picks of it went to a slow member.
#[test]
fn a_p2c_shadow_beside_round_robin_avoids_a_slow_member() {
    let mut b = balancer(Algorithm::RoundRobin, 5);
    b.set_shadow(Some(Algorithm::P2cEwma), Instant::ZERO);
    let (mut rng, mut srng) = (rng(1), rng(2));
    // One arrival per millisecond; a request ends after its member's service time.
    let service = |m: usize| Duration::from_millis(if m == 4 { 20 } else { 2 });
    let mut ends: Vec<(Instant, usize)> = Vec::new();
    let total = 30_000u64;
    for t in 0..total {
        let now = Instant::from_millis(t);
        ends.sort_by_key(|e| e.0);
        while ends.first().is_some_and(|e| e.0 <= now) {
            let (_, m) = ends.remove(0);
            b.end_request(m, now, Outcome::Success { latency: service(m) });
        }
        let req = at(now);
        let d = b.pick(&req, &mut rng).unwrap();
        b.shadow_pick(&req, Some(d.member), &mut srng);
        b.begin_request(d.member);
        ends.push((now + service(d.member), d.member));
    }
    let r = b.shadow_report(Instant::from_millis(total)).unwrap();
    check_sums(&r, total);
    let slow = &r.members[4];
    assert_eq!(slow.live.picks, total / 5, "round-robin: a fifth");
    assert!(slow.shadow.picks < total / 50, "p2c-ewma would have sent it {}", slow.shadow.picks);
    assert!(slow.slow && slow.slow_windows >= 2, "{slow:?}");
    // After the first window judged it, every live pick of it counts as slow.
    assert!(slow.live.slow >= slow.live.picks * 2 / 3, "{slow:?}");
    assert!(r.live_total().slow > 10 * r.shadow_total().slow, "{r:?}");
    assert!(r.members[..4].iter().all(|m| !m.slow && m.live.slow == 0), "{r:?}");
    assert!(r.differed() > total / 2, "{r:?}");
}

/// A member that fails: round-robin (live) keeps picking it until outlier detection ejects it;
/// the shadow's picks of it are resolved by those failures.
#[test]
fn shadow_picks_of_a_failing_member_count_as_failed() {
    let mut b = balancer(Algorithm::RoundRobin, 3);
    b.set_shadow(Some(Algorithm::Weighted), Instant::ZERO);
    let (mut rng, mut srng) = (rng(1), rng(2));
    for t in 0..60 {
        let now = Instant::from_millis(t);
        let d = b.pick(&at(now), &mut rng).unwrap();
        b.shadow_pick(&at(now), Some(d.member), &mut srng);
        b.begin_request(d.member);
        let outcome = if d.member == 2 {
            Outcome::Failure { kind: FailureKind::Connect, latency: Duration::ZERO }
        } else {
            Outcome::Success { latency: Duration::from_millis(1) }
        };
        b.end_request(d.member, now, outcome);
    }
    let r = b.shadow_report(Instant::from_millis(60)).unwrap();
    check_sums(&r, 60);
    let failing = &r.members[2];
    // Five consecutive failures eject it (the default), so both sides picked it five times.
    assert_eq!(
        failing.live,
        rondo_core::shadow::SideCounts { picks: 5, failed: 5, ..Default::default() }
    );
    assert_eq!(failing.shadow.picks, failing.shadow.failed, "{failing:?}");
    assert!(failing.shadow.failed >= 4, "{failing:?}");
    assert_eq!(r.members[0].live.failed + r.members[1].shadow.failed, 0);
}

/// A shadow survives a view change (a member joins, one leaves): its counts carry over by
/// member name and the departed member's are kept, folded; a change of the live algorithm
/// restarts the tally; a balancer built afresh has none.
#[test]
fn a_shadow_survives_view_changes() {
    let mut b = balancer(Algorithm::RoundRobin, 3);
    b.set_shadow(Some(Algorithm::LeastSessions), Instant::ZERO);
    let mut r = rng(1);
    for _ in 0..9 {
        let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
        b.shadow_pick(&at(Instant::ZERO), Some(d.member), &mut rng(2));
    }
    let before = b.shadow_report(Instant::ZERO).unwrap();
    // m1 leaves, m9 joins.
    let spec = cluster(
        Algorithm::RoundRobin,
        vec![member("m0", 100, None), member("m2", 100, None), member("m9", 100, None)],
    );
    let mut next = Balancer::carry_over(spec.clone(), &b, Instant::ZERO);
    assert_eq!(next.shadow(), Some(Algorithm::LeastSessions));
    let after = next.shadow_report(Instant::ZERO).unwrap();
    assert_eq!(after.decisions, 9);
    assert_eq!(after.members.len(), 4);
    assert_eq!(after.members[0], before.members[0]);
    assert_eq!(
        (after.members[1].name.as_str(), after.members[1].live),
        ("m2", before.members[2].live)
    );
    assert_eq!(after.members[2].live.picks, 0);
    assert_eq!(
        (after.members[3].name.as_str(), after.members[3].live),
        ("", before.members[1].live)
    );
    check_sums(&after, 9);
    // It keeps picking in the new view.
    let d = next.pick(&at(Instant::ZERO), &mut r).unwrap();
    assert!(next.shadow_pick(&at(Instant::ZERO), Some(d.member), &mut rng(3)).is_some());

    let mut policy = spec.policy.clone();
    policy.algorithm = Algorithm::Random;
    let switched = Arc::new(rondo_core::ClusterSpec { policy, ..(*spec).clone() });
    let mut again = Balancer::carry_over(switched, &next, Instant::from_millis(5));
    let r = again.shadow_report(Instant::from_millis(5)).unwrap();
    assert_eq!((r.decisions, r.live, r.since), (0, Algorithm::Random, Instant::from_millis(5)));
    assert!(Balancer::new(spec, Instant::ZERO).shadow().is_none());
    again.set_shadow(None, Instant::ZERO);
    assert!(again.shadow_report(Instant::ZERO).is_none());
}
