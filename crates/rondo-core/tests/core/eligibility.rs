//! Eligibility shared by every picker: health, admin state, locality spill, panic threshold,
//! exclusion of members already tried, slow start.

use std::time::Duration;

use proptest::prelude::*;
use rondo_core::load::AgentReport;
use rondo_core::{
    Actor, AdminState, Algorithm, Balancer, Eligibility, Ineligible, Instant, Outcome, PickError,
    PickRequest, Policy, Scope, SlowStart, hash::hash_key,
};

use super::support::*;

#[derive(Debug, Clone)]
struct MemberCase {
    group: u8,
    weight: u32,
    admin: AdminState,
    healthy: bool,
    ejected: bool,
    agent: Option<bool>, // Some(fresh?)
}

fn member_case() -> impl Strategy<Value = MemberCase> {
    (
        0u8..3,
        1u32..50,
        prop_oneof![
            6 => Just(AdminState::Active),
            1 => Just(AdminState::Draining),
            1 => Just(AdminState::Disabled)
        ],
        prop::bool::weighted(0.7),
        prop::bool::weighted(0.1),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(group, weight, admin, healthy, ejected, agent)| MemberCase {
            group,
            weight,
            admin,
            healthy,
            ejected,
            agent,
        })
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// An independent statement of the eligibility rules, to check the balancer against.
fn reference_eligible(cases: &[MemberCase], group: Option<u8>, panic_pct: u8) -> Vec<usize> {
    let healthy = |c: &MemberCase| c.healthy && !c.ejected && c.agent != Some(false);
    let active: Vec<usize> =
        (0..cases.len()).filter(|&i| cases[i].admin == AdminState::Active).collect();
    let healthy_active: Vec<usize> =
        active.iter().copied().filter(|&i| healthy(&cases[i])).collect();
    if panic_pct > 0
        && !active.is_empty()
        && healthy_active.len() * 100 < usize::from(panic_pct) * active.len()
    {
        return active;
    }
    let local: Vec<usize> =
        healthy_active.iter().copied().filter(|&i| Some(cases[i].group) == group).collect();
    if !local.is_empty() { local } else { healthy_active }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No algorithm ever returns a member outside the eligible set, whatever the mix of admin
    /// states, health, ejections, stale agents, locality and panic; and when the eligible set is
    /// empty, the pick fails with a reason rather than returning anyone.
    #[test]
    fn no_picker_returns_an_ineligible_member(
        cases in proptest::collection::vec(member_case(), 1..12),
        algo in algorithm(),
        group in prop::option::of(0u8..3),
        panic_pct in prop_oneof![Just(0u8), Just(50u8), Just(80u8)],
        seed in any::<u64>(),
        load in proptest::collection::vec(0usize..12, 0..20),
        equal_weights in any::<bool>(),
    ) {
        let members = cases.iter().enumerate()
            .map(|(i, c)| {
                let weight = if equal_weights { 100 } else { c.weight };
                member(&format!("m{i}"), weight, Some(["a", "b", "c"][c.group as usize]))
            })
            .collect();
        let policy = Policy { algorithm: algo, panic_threshold_percent: panic_pct, ..Policy::default() };
        let timeout = policy.agent.timeout;
        let spec = cluster_with(policy, members);
        let now = Instant::from_millis(10_000);
        let mut b = Balancer::new(spec, Instant::ZERO);
        for (i, c) in cases.iter().enumerate() {
            b.set_admin(i, c.admin, Actor::Config);
            b.set_health(i, c.healthy, Actor::HealthCheck, Instant::ZERO);
            if let Some(fresh) = c.agent {
                let at = if fresh { now } else { now - timeout - Duration::from_millis(1) };
                b.report_agent(i, AgentReport { cpu_used: 0.1 * i as f32, mem_free: 1 << 30, sessions: 0, seq: 1, at });
            }
            if c.ejected {
                for _ in 0..5 {
                    b.begin_request(i);
                    b.end_request(i, Instant::ZERO, Outcome::Failure { kind: rondo_core::FailureKind::Connect, latency: Duration::ZERO });
                }
            }
        }
        // The outlier cap may have refused some ejections: read back who really is ejected.
        let cases: Vec<MemberCase> = cases.iter().enumerate().map(|(i, c)| MemberCase {
            ejected: b.states()[i].ejected_until.is_some_and(|u| now < u), ..c.clone()
        }).collect();
        for &i in &load { if i < cases.len() { b.begin_request(i); } }
        let eligible = reference_eligible(&cases, group, panic_pct);
        let group_name = group.map(|g| ["a", "b", "c"][g as usize]);
        // What status pages show is the same set, each other member with the rule that keeps
        // it out (and, in panic, the health reason of the unhealthy ones let in).
        let (shown, _) = b.eligibility(now, group_name);
        let shown_eligible: Vec<usize> = (0..cases.len()).filter(|&i| shown[i].eligible).collect();
        prop_assert_eq!(&shown_eligible, &eligible);
        for (i, c) in cases.iter().enumerate() {
            let want = match c.admin {
                AdminState::Disabled => Some(Ineligible::Disabled),
                AdminState::Draining => Some(Ineligible::Draining),
                AdminState::Active if !c.healthy => Some(Ineligible::HealthCheck),
                AdminState::Active if c.agent == Some(false) => Some(Ineligible::AgentSilent),
                AdminState::Active if c.ejected => Some(Ineligible::Ejected),
                AdminState::Active if !eligible.contains(&i) => Some(Ineligible::OtherGroup),
                AdminState::Active => None,
            };
            prop_assert_eq!(shown[i].reason, want, "member {}: {:?}", i, c);
        }
        let mut r = rng(seed);
        for k in 0..40u64 {
            let req = PickRequest { now, group: group_name, hash: Some(hash_key(&k.to_le_bytes())), ..PickRequest::default() };
            match b.pick(&req, &mut r) {
                Ok(d) => {
                    prop_assert!(eligible.contains(&d.member), "{algo}: picked {} outside {eligible:?} ({:?})", d.member, d.why);
                    b.begin_request(d.member);
                }
                Err(e) => {
                    prop_assert!(eligible.is_empty(), "{algo}: {e} while {eligible:?} eligible");
                    let is_no_eligible = matches!(e, PickError::NoEligible { .. });
                    prop_assert!(is_no_eligible);
                }
            }
        }
    }
}

fn grouped(groups: &[&str]) -> Balancer {
    let members =
        groups.iter().enumerate().map(|(i, g)| member(&format!("m{i}"), 100, Some(g))).collect();
    Balancer::new(cluster(Algorithm::RoundRobin, members), Instant::ZERO)
}

#[test]
fn locality_prefers_the_local_group_until_its_last_healthy_member_goes() {
    let mut b = grouped(&["east", "east", "west", "west"]);
    let mut r = rng(1);
    let req = PickRequest { group: Some("east"), ..at(Instant::ZERO) };
    let picked: Vec<usize> = (0..4).map(|_| b.pick(&req, &mut r).unwrap().member).collect();
    assert_eq!(picked, vec![0, 1, 0, 1]);
    // One healthy member left in the group: it still takes everything (the edge).
    b.set_health(0, false, Actor::HealthCheck, Instant::ZERO);
    let d = b.pick(&req, &mut r).unwrap();
    assert_eq!((d.member, d.scope), (1, Scope::Local));
    // None left: spill to every group.
    b.set_health(1, false, Actor::HealthCheck, Instant::ZERO);
    let d = b.pick(&req, &mut r).unwrap();
    assert!(d.member >= 2);
    assert_eq!(d.scope, Scope::All);
    // Back: local again.
    b.set_health(1, true, Actor::HealthCheck, Instant::ZERO);
    assert_eq!(b.pick(&req, &mut r).unwrap().member, 1);
    // A caller without a group, or in a group with no members, uses everyone.
    let d = b.pick(&PickRequest { group: Some("north"), ..at(Instant::ZERO) }, &mut r).unwrap();
    assert_eq!(d.scope, Scope::All);
}

#[test]
fn panic_threshold_edges() {
    // 4 active members, threshold 50 %: 2 healthy is exactly 50 %, not panic.
    let mut b = balancer(Algorithm::RoundRobin, 4);
    let mut r = rng(1);
    b.set_health(0, false, Actor::HealthCheck, Instant::ZERO);
    b.set_health(1, false, Actor::HealthCheck, Instant::ZERO);
    let p = picks(&mut b, 8, Instant::ZERO, &mut r);
    assert!(p.iter().all(|&m| m >= 2), "{p:?}");
    assert_eq!(b.scope(Instant::ZERO, None), Scope::All);
    // 1 of 4 healthy: below 50 %, balance over all active members to spare the survivor.
    b.set_health(2, false, Actor::HealthCheck, Instant::ZERO);
    let p = picks(&mut b, 8, Instant::ZERO, &mut r);
    assert_eq!(histogram(&p, 4), vec![2, 2, 2, 2]);
    assert_eq!(b.scope(Instant::ZERO, None), Scope::Panic { healthy: 1, active: 4 });
    // Disabled members stay out even in panic.
    b.set_admin(0, AdminState::Disabled, Actor::Operator("ops".into()));
    let p = picks(&mut b, 6, Instant::ZERO, &mut r);
    assert!(!p.contains(&0), "{p:?}");
}

#[test]
fn eligibility_names_the_rule_and_panic_lets_unhealthy_members_in() {
    let mut b = balancer(Algorithm::RoundRobin, 4);
    let now = Instant::ZERO;
    b.set_admin(0, AdminState::Disabled, Actor::Operator("ops".into()));
    b.set_admin(1, AdminState::Draining, Actor::Operator("ops".into()));
    b.set_health(2, false, Actor::HealthCheck, now);
    let (e, panic) = b.eligibility(now, None);
    let yes = Eligibility { eligible: true, reason: None };
    let no = |r| Eligibility { eligible: false, reason: Some(r) };
    assert_eq!(
        e,
        vec![no(Ineligible::Disabled), no(Ineligible::Draining), no(Ineligible::HealthCheck), yes]
    );
    assert!(!panic, "1 of 2 active members healthy is 50 %");
    // The last healthy one goes: panic, and the unhealthy active member is let in, its reason
    // still shown; the operator's word still holds.
    b.set_health(3, false, Actor::HealthCheck, now);
    let (e, panic) = b.eligibility(now, None);
    assert!(panic);
    let panicked = Eligibility { eligible: true, reason: Some(Ineligible::HealthCheck) };
    assert_eq!(e, vec![no(Ineligible::Disabled), no(Ineligible::Draining), panicked, panicked]);
    assert_eq!(Ineligible::AgentSilent.to_string(), "agent_silent");
}

#[test]
fn panic_threshold_zero_never_panics() {
    let policy = Policy { panic_threshold_percent: 0, ..Policy::default() };
    let mut b = Balancer::new(cluster_with(policy, named(3)), Instant::ZERO);
    for i in 0..3 {
        b.set_health(i, false, Actor::HealthCheck, Instant::ZERO);
    }
    let e = b.pick(&at(Instant::ZERO), &mut rng(1)).unwrap_err();
    assert_eq!(e.to_string(), "cluster c: no eligible member (3 members: 3 active, 0 healthy)");
}

#[test]
fn draining_members_keep_sessions_but_get_nothing_new() {
    let mut b = balancer(Algorithm::LeastSessions, 3);
    b.set_admin(1, AdminState::Draining, Actor::Operator("alice".into()));
    let p = picks(&mut b, 10, Instant::ZERO, &mut rng(1));
    assert!(!p.contains(&1));
    assert!(b.can_keep_session(1, Instant::ZERO), "draining keeps its sessions");
    assert_eq!(b.states()[1].admin_by, Actor::Operator("alice".into()));
    b.set_admin(1, AdminState::Disabled, Actor::Operator("alice".into()));
    assert!(!b.can_keep_session(1, Instant::ZERO), "disabled loses them");
}

#[test]
fn excluded_members_are_skipped_and_all_excluded_is_an_error() {
    for algo in Algorithm::ALL {
        let mut b = balancer(algo, 3);
        let mut r = rng(5);
        for _ in 0..10 {
            let d = b
                .pick(
                    &PickRequest { exclude: &[0, 2], hash: Some(42), ..at(Instant::ZERO) },
                    &mut r,
                )
                .unwrap();
            assert_eq!(d.member, 1, "{algo}");
        }
        let e =
            b.pick(&PickRequest { exclude: &[0, 1, 2], ..at(Instant::ZERO) }, &mut r).unwrap_err();
        assert!(matches!(e, PickError::AllTried { tried: 3, .. }), "{algo}: {e}");
    }
}

#[test]
fn slow_start_ramps_a_recovered_member() {
    let secs = Duration::from_secs;
    for algo in
        [Algorithm::Weighted, Algorithm::RoundRobin, Algorithm::LeastSessions, Algorithm::Random]
    {
        let policy = Policy {
            algorithm: algo,
            slow_start: SlowStart { duration: secs(10), initial_percent: 10 },
            ..Policy::default()
        };
        let mut b = Balancer::new(cluster_with(policy, named(2)), Instant::ZERO);
        let mut r = rng(9);
        b.set_health(1, false, Actor::HealthCheck, Instant::ZERO);
        b.set_health(1, true, Actor::HealthCheck, Instant::from_millis(1000));
        // Just recovered: about 10 % of the other's share (sequential picks, nothing in flight).
        let early = histogram(&picks(&mut b, 2200, Instant::from_millis(1000), &mut r), 2);
        assert!(early[1] > 50 && early[1] < 400, "{algo} early {early:?}");
        // Half way: about 50 %.
        let mid = histogram(&picks(&mut b, 2000, Instant::from_millis(6000), &mut r), 2);
        assert!(mid[1] > 450 && mid[1] < 900, "{algo} mid {mid:?}");
        // After the ramp: an equal share.
        let late = histogram(&picks(&mut b, 2000, Instant::from_millis(11_001), &mut r), 2);
        assert!(late[1] > 900 && late[1] < 1100, "{algo} late {late:?}");
    }
}
