//! Member state over time: passive ejection, view swaps that keep state, explanations.

use std::sync::Arc;
use std::time::Duration;

use rondo_core::{
    Actor, AdminState, Algorithm, Balancer, ClusterSpec, FailureKind, Instant, Outcome, Policy,
};

use super::support::*;

fn fail(b: &mut Balancer, m: usize, now: Instant) -> Option<rondo_core::Ejection> {
    b.begin_request(m);
    b.end_request(m, now, Outcome::Failure { kind: FailureKind::Connect, latency: Duration::ZERO })
}

#[test]
fn consecutive_failures_eject_for_a_growing_time() {
    let mut b = balancer(Algorithm::RoundRobin, 4);
    let mut r = rng(1);
    let t0 = Instant::from_millis(1000);
    for _ in 0..4 {
        assert!(fail(&mut b, 2, t0).is_none());
    }
    let e = fail(&mut b, 2, t0).expect("fifth failure ejects");
    assert_eq!((e.member, e.count, e.until), (2, 1, t0 + Duration::from_secs(30)));
    assert!(!picks(&mut b, 12, t0, &mut r).contains(&2));
    // Back after the ejection time...
    let back = t0 + Duration::from_secs(30);
    assert!(picks(&mut b, 12, back, &mut r).contains(&2));
    // ...and failing again right away ejects it for twice as long.
    let e = (0..5).find_map(|_| fail(&mut b, 2, back)).expect("ejected again");
    assert_eq!((e.count, e.until), (2, back + Duration::from_secs(60)));
}

#[test]
fn coming_back_up_lifts_an_ejection_but_passing_probes_alone_do_not() {
    let mut b = balancer(Algorithm::RoundRobin, 3);
    let t = Instant::from_millis(5);
    assert!((0..5).find_map(|_| fail(&mut b, 0, t)).is_some());
    // Still up by health checks: the ejection stands.
    assert!(!b.set_health(0, true, Actor::HealthCheck, t));
    assert!(!picks(&mut b, 6, t, &mut rng(1)).contains(&0));
    // Down, then back (a restart): the stale ejection is lifted at once.
    b.set_health(0, false, Actor::HealthCheck, t);
    b.set_health(0, true, Actor::HealthCheck, t);
    assert!(picks(&mut b, 6, t, &mut rng(1)).contains(&0));
    assert_eq!(b.states()[0].ejections, 0);
}

#[test]
fn ejection_respects_the_maximum_ejected_share() {
    let mut b = balancer(Algorithm::RoundRobin, 4);
    let t = Instant::from_millis(5);
    assert!((0..5).find_map(|_| fail(&mut b, 0, t)).is_some());
    assert!((0..5).find_map(|_| fail(&mut b, 1, t)).is_some());
    // A third would be 75 % of the cluster, over the 50 % cap.
    assert!((0..10).find_map(|_| fail(&mut b, 2, t)).is_none());
}

#[test]
fn a_successful_answer_resets_the_failure_count() {
    let mut b = balancer(Algorithm::RoundRobin, 2);
    for _ in 0..4 {
        fail(&mut b, 0, Instant::ZERO);
    }
    b.begin_request(0);
    b.end_request(0, Instant::ZERO, Outcome::Success { latency: Duration::from_millis(1) });
    for _ in 0..4 {
        assert!(fail(&mut b, 0, Instant::ZERO).is_none());
    }
}

#[test]
fn carry_over_keeps_surviving_members_state_and_slow_starts_newcomers() {
    let policy = Policy {
        algorithm: Algorithm::LeastSessions,
        slow_start: rondo_core::SlowStart {
            duration: Duration::from_secs(10),
            initial_percent: 10,
        },
        ..Policy::default()
    };
    let spec = cluster_with(policy.clone(), named(3));
    let mut old = Balancer::new(spec, Instant::ZERO);
    old.open_session(1);
    old.open_session(1);
    old.set_health(2, false, Actor::HealthCheck, Instant::ZERO);
    old.set_admin(0, AdminState::Draining, Actor::Operator("bob".into()));

    // New view: m0 removed, m1 and m2 kept (reordered), m3 added.
    let mut members = named(4);
    members.remove(0);
    members.reverse();
    let spec = Arc::new(ClusterSpec { members, ..(**old.spec()).clone() });
    let now = Instant::from_millis(500);
    let new = Balancer::carry_over(spec, &old, now);
    let by_name = |n: &str| &new.states()[new.member_index(n).unwrap()];
    assert_eq!(by_name("m1").load.sessions, 2);
    assert!(!by_name("m2").healthy);
    assert_eq!(by_name("m3").up_since, Some(now), "newcomers slow-start");
    assert_eq!(by_name("m1").up_since, None);
}

/// The pausing carry-over (a big cluster's view composed in stretches) calls its pause for
/// every member of both lists, in order, and carries the same state as the plain one.
#[test]
fn carry_over_pausing_pauses_at_every_member_and_carries_the_same_state() {
    let mut old = balancer(Algorithm::LeastSessions, 5);
    old.open_session(3);
    old.set_health(1, false, Actor::HealthCheck, Instant::ZERO);
    let mut members = named(7);
    members.swap(0, 6);
    let spec = Arc::new(ClusterSpec { members, ..(**old.spec()).clone() });
    let now = Instant::from_millis(20);
    let mut pauses = Vec::new();
    let paused = Balancer::carry_over_pausing(spec.clone(), &old, now, &mut |i| pauses.push(i));
    assert_eq!(pauses, [(0..5).collect::<Vec<_>>(), (0..7).collect()].concat());
    let plain = Balancer::carry_over(spec, &old, now);
    assert_eq!(paused.states(), plain.states());
}

#[test]
fn ewma_and_ejection_survive_an_unrelated_change() {
    let mut old = balancer(Algorithm::P2cEwma, 3);
    let t = Instant::from_millis(10);
    old.begin_request(0);
    old.end_request(0, t, Outcome::Success { latency: Duration::from_millis(250) });
    let ejection = (0..5).find_map(|_| fail(&mut old, 1, t)).expect("ejected");
    // Unrelated change: m2 reweighted, m3 added.
    let mut members = named(4);
    members[2].weight = 300;
    let spec = Arc::new(ClusterSpec { members, ..(**old.spec()).clone() });
    let new = Balancer::carry_over(spec, &old, t);
    let decay = new.spec().policy.ewma.decay;
    assert_eq!(
        new.states()[0].load.ewma.get_at(t, decay),
        old.states()[0].load.ewma.get_at(t, decay)
    );
    assert_eq!(new.states()[1].ejected_until, Some(ejection.until));
    assert_eq!(new.states()[1].ejections, 1);
}

#[test]
fn explain_lists_candidates_and_the_deciding_numbers() {
    let mut b = balancer(Algorithm::LeastSessions, 3);
    b.open_session(0);
    b.open_session(2);
    let d = b.pick(&at(Instant::ZERO), &mut rng(1)).unwrap();
    let e = b.explain(&d, Instant::ZERO, None);
    assert_eq!(e.chosen, "m1");
    assert_eq!(e.candidates.len(), 3);
    assert_eq!(e.candidates[0].sessions, 1);
    assert_eq!(
        e.summary,
        "least-sessions chose m1 among all groups: fewest active per weight: 0 active, weight 100"
    );
}

#[test]
fn no_member_is_a_clear_error() {
    let spec = cluster(Algorithm::Random, vec![]);
    let mut b = Balancer::new(spec, Instant::ZERO);
    let e = b.pick(&at(Instant::ZERO), &mut rng(1)).unwrap_err();
    assert_eq!(e.to_string(), "cluster c: no eligible member (0 members: 0 active, 0 healthy)");
}

#[test]
fn a_handoff_moves_state_by_name_onto_another_clock() {
    // The old process at 100 s on its clock; the new one at 2 s on its own.
    let (old_now, new_now) = (Instant::from_millis(100_000), Instant::from_millis(2_000));
    let mut old = balancer(Algorithm::RoundRobin, 3);
    old.set_admin(0, AdminState::Draining, Actor::Operator("alice".into()));
    old.set_health(1, false, Actor::HealthCheck, Instant::from_millis(99_000));
    old.count_probe(1, false);
    old.count_probe(1, false);
    let ejection = (0..5).find_map(|_| fail(&mut old, 2, old_now)).expect("m2 ejected");
    old.report_agent(
        2,
        rondo_core::load::AgentReport {
            cpu_used: 0.5,
            mem_free: 7,
            sessions: 3,
            seq: 42,
            at: Instant::from_millis(99_500),
        },
    );
    let doc = old.export(old_now);

    // The new configuration lists the members in another order, one of them new.
    let policy = Policy { panic_threshold_percent: 0, ..Policy::default() };
    let spec = cluster_with(
        policy,
        vec![
            member("m2", 1, None),
            member("new", 1, None),
            member("m0", 1, None),
            member("m1", 1, None),
        ],
    );
    let mut new = Balancer::new(spec, new_now);
    new.import(&doc, new_now);
    let st = new.states();
    assert_eq!(
        (st[2].admin, &st[2].admin_by),
        (AdminState::Draining, &Actor::Operator("alice".into()))
    );
    assert!(!st[3].healthy);
    assert_eq!(st[3].health_by, Actor::HealthCheck);
    // Changed 1 s before the hand-off: 1 s before the new process's now.
    assert_eq!(st[3].health_changed, Instant::from_millis(1_000));
    assert_eq!(st[3].probe_streak, (0, 2));
    // The ejection keeps the time it had left.
    let left = ejection.until.since(old_now);
    assert_eq!(st[0].ejected_until, Some(new_now + left));
    assert_eq!(st[0].ejections, 1);
    let report = st[0].load.agent.expect("the agent report");
    assert_eq!((report.seq, report.sessions, report.at), (42, 3, Instant::from_millis(1_500)));
    // A member the old process did not know keeps its own state; nothing in flight moves.
    assert!(st[1].healthy && st[1].admin == AdminState::Active);
    assert!(st.iter().all(|s| s.load.in_flight == 0));
    // The drained member, the down one and the ejected one get nothing.
    let mut r = rng(3);
    let picked = picks(&mut new, 8, new_now, &mut r);
    assert!(picked.iter().all(|&m| m == 1), "{picked:?}");
}

#[test]
fn a_handoff_yields_to_an_admin_state_the_new_configuration_changed() {
    let now = Instant::from_millis(10);
    let mut old = balancer(Algorithm::RoundRobin, 2);
    old.set_admin(0, AdminState::Draining, Actor::Operator("bob".into()));
    let doc = old.export(now);
    let mut members = named(2);
    members[0].admin = AdminState::Disabled;
    let mut new = Balancer::new(cluster(Algorithm::RoundRobin, members), now);
    new.import(&doc, now);
    assert_eq!(new.states()[0].admin, AdminState::Disabled);
    assert_eq!(new.states()[0].admin_by, Actor::Config);
}
