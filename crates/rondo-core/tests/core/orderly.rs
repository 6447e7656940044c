//! The order-based algorithms: round-robin, random, weighted, rotating, response-time,
//! response-time-clb.

use std::time::Duration;

use proptest::prelude::*;
use rondo_core::{Algorithm, Balancer, Instant, PickRequest, Why};

use super::support::*;

#[test]
fn round_robin_walks_members_in_order() {
    let mut b = balancer(Algorithm::RoundRobin, 3);
    let p = picks(&mut b, 7, Instant::ZERO, &mut rng(1));
    assert_eq!(p, vec![0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn random_is_uniform_and_replayable() {
    let mut a = balancer(Algorithm::Random, 4);
    let mut b = balancer(Algorithm::Random, 4);
    let pa = picks(&mut a, 4000, Instant::ZERO, &mut rng(7));
    let pb = picks(&mut b, 4000, Instant::ZERO, &mut rng(7));
    assert_eq!(pa, pb, "same seed, same decisions");
    for c in histogram(&pa, 4) {
        assert!((850..1150).contains(&c), "uniform share, got {c}");
    }
}

fn weighted(weights: &[u32]) -> Balancer {
    let members =
        weights.iter().enumerate().map(|(i, &w)| member(&format!("m{i}"), w, None)).collect();
    Balancer::new(cluster(Algorithm::Weighted, members), Instant::ZERO)
}

proptest! {
    /// Every cycle of sum(weights) picks gives each member exactly its weight, and within a cycle
    /// no member runs ahead of or behind its ideal share by two picks or more (no bursts).
    #[test]
    fn weighted_is_exact_per_cycle_and_smooth(weights in proptest::collection::vec(1u32..=12, 1..10)) {
        let mut b = weighted(&weights);
        let total: u32 = weights.iter().sum();
        let mut r = rng(3);
        for _cycle in 0..3 {
            let p = picks(&mut b, total as usize, Instant::ZERO, &mut r);
            prop_assert_eq!(histogram(&p, weights.len()), weights.iter().map(|&w| w as usize).collect::<Vec<_>>());
            let mut counts = vec![0f64; weights.len()];
            for (t, &m) in p.iter().enumerate() {
                counts[m] += 1.0;
                for (i, &w) in weights.iter().enumerate() {
                    let ideal = (t + 1) as f64 * f64::from(w) / f64::from(total);
                    prop_assert!((counts[i] - ideal).abs() < 2.0,
                        "member {} at pick {}: {} picks, ideal {:.2}", i, t, counts[i], ideal);
                }
            }
        }
    }
}

#[test]
fn weighted_without_a_precomputed_schedule_is_still_exact() {
    // The gcd-reduced cycle (2,000,007 picks) is too long to precompute: picks walk the tree.
    let weights = [1_000_000, 999_983, 24];
    let mut b = weighted(&weights);
    let total: u32 = weights.iter().sum();
    let p = picks(&mut b, total as usize, Instant::ZERO, &mut rng(1));
    assert_eq!(histogram(&p, 3), weights.iter().map(|&w| w as usize).collect::<Vec<_>>());
    // The light member's 24 turns are spread across the cycle, not bunched.
    let turns: Vec<usize> =
        p.iter().enumerate().filter(|(_, m)| **m == 2).map(|(i, _)| i).collect();
    let gap = total as usize / 24;
    for w in turns.windows(2) {
        assert!((w[1] - w[0]).abs_diff(gap) <= 2, "gap {} vs ideal {gap}", w[1] - w[0]);
    }
}

#[test]
fn weighted_glassfish_example_100_200_300() {
    let mut b = weighted(&[100, 200, 300]);
    let p = picks(&mut b, 600, Instant::ZERO, &mut rng(1));
    assert_eq!(histogram(&p, 3), vec![100, 200, 300]);
    // Smooth: the heaviest member never takes more than two turns in a row.
    let longest = p.chunk_by(|a, b| a == b).map(<[usize]>::len).max();
    assert!(longest <= Some(2), "longest run {longest:?}");
}

#[test]
fn rotating_randomizes_once_then_rotates_per_context() {
    let n = 5;
    let mut b = balancer(Algorithm::Rotating, n);
    let mut r = rng(11);
    // Each new context starts one further down the same randomized list: over n contexts every
    // member is first exactly once.
    let firsts: Vec<usize> = (0..n)
        .map(|_| {
            let c = b.new_context();
            b.pick(&PickRequest { context: Some(c), ..at(Instant::ZERO) }, &mut r).unwrap().member
        })
        .collect();
    let mut sorted = firsts.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    // The next n contexts repeat the same rotation: the list was randomized once.
    let again: Vec<usize> = (0..n)
        .map(|_| {
            let c = b.new_context();
            b.pick(&PickRequest { context: Some(c), ..at(Instant::ZERO) }, &mut r).unwrap().member
        })
        .collect();
    assert_eq!(firsts, again);
    // A context sticks to its first live member...
    let ctx = 2;
    let req = PickRequest { context: Some(ctx), ..at(Instant::ZERO) };
    let first = b.pick(&req, &mut r).unwrap().member;
    assert_eq!(b.pick(&req, &mut r).unwrap().member, first);
    // ...and when it goes down, fails over down the list: to the member the next context starts at.
    b.set_health(first, false, rondo_core::Actor::HealthCheck, Instant::ZERO);
    let d = b.pick(&req, &mut r).unwrap();
    assert_eq!(d.member, firsts[(ctx as usize + 1) % n]);
    assert!(matches!(d.why, Why::Rotating { skipped: 1, .. }), "{:?}", d.why);
}

/// The rotation list as a sequence of member names: the first member of contexts 0..n.
fn rotation(b: &mut Balancer, r: &mut rondo_core::SplitMix64) -> Vec<String> {
    let n = b.spec().members.len();
    (0..n as u32)
        .map(|c| {
            let m = b.pick(&PickRequest { context: Some(c), ..at(Instant::ZERO) }, r).unwrap();
            b.spec().members[m.member].name.clone()
        })
        .collect()
}

/// `a` and `b` are the same cyclic order.
fn same_cycle(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && (0..a.len()).any(|k| a.iter().cycle().skip(k).take(a.len()).eq(b.iter()))
}

#[test]
fn rotating_keeps_its_list_across_view_changes() {
    let mut b = balancer(Algorithm::Rotating, 6);
    let mut r = rng(5);
    let before = rotation(&mut b, &mut r);
    // A member joins and another leaves: survivors keep their cyclic order (GlassFish randomizes
    // the list once per client), the newcomer is inserted somewhere.
    let mut spec = (**b.spec()).clone();
    spec.members.remove(2);
    spec.members.push(member("new", 100, None));
    let gone = b.spec().members[2].name.clone();
    let mut b = Balancer::carry_over(std::sync::Arc::new(spec), &b, Instant::ZERO);
    let after = rotation(&mut b, &mut r);
    assert!(after.contains(&"new".to_owned()), "{after:?}");
    let survivors: Vec<String> = after.into_iter().filter(|n| n != "new").collect();
    let expected: Vec<String> = before.into_iter().filter(|n| *n != gone).collect();
    assert!(same_cycle(&survivors, &expected), "{survivors:?} vs {expected:?}");
}

#[test]
fn rotating_clients_randomize_differently() {
    let order = |seed| {
        let mut b = balancer(Algorithm::Rotating, 8);
        let mut r = rng(seed);
        (0..8)
            .map(|_| {
                let c = b.new_context();
                b.pick(&PickRequest { context: Some(c), ..at(Instant::ZERO) }, &mut r)
                    .unwrap()
                    .member
            })
            .collect::<Vec<_>>()
    };
    let orders: std::collections::HashSet<Vec<usize>> = (0..5).map(order).collect();
    assert!(orders.len() >= 4, "five clients should not share one order: {orders:?}");
}

#[test]
fn response_time_clb_ranks_fastest_first_and_restarts_after_refresh() {
    let mut b = balancer(Algorithm::ResponseTimeClb, 4);
    let mut r = rng(1);
    // Before any probe round: plain round robin.
    assert_eq!(picks(&mut b, 4, Instant::ZERO, &mut r), vec![0, 1, 2, 3]);
    let ms = Duration::from_millis;
    b.record_probe_round(&[(0, Some(ms(30))), (1, Some(ms(10))), (2, None), (3, Some(ms(20)))]);
    // Fastest first, round robin down the table, back to the top when exhausted; member 2's
    // probe failed, so it has no place in the table.
    assert_eq!(picks(&mut b, 7, Instant::ZERO, &mut r), vec![1, 3, 0, 1, 3, 0, 1]);
    // A new round re-ranks and activation restarts at the top, wherever the cursor was.
    b.record_probe_round(&[
        (0, Some(ms(5))),
        (1, Some(ms(50))),
        (2, Some(ms(7))),
        (3, Some(ms(6))),
    ]);
    assert_eq!(picks(&mut b, 5, Instant::ZERO, &mut r), vec![0, 3, 2, 1, 0]);
    let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
    assert_eq!(d.why, Why::ResponseTime { rank: 1, rtt_us: 6000 });
}

#[test]
fn response_time_clb_skips_members_that_are_not_eligible() {
    let mut b = balancer(Algorithm::ResponseTimeClb, 3);
    let ms = Duration::from_millis;
    b.record_probe_round(&[(0, Some(ms(1))), (1, Some(ms(2))), (2, Some(ms(3)))]);
    b.set_admin(0, rondo_core::AdminState::Draining, rondo_core::Actor::Operator("ops".into()));
    assert_eq!(picks(&mut b, 4, Instant::ZERO, &mut rng(1)), vec![1, 2, 1, 2]);
}

/// CLB's weakness that issue 21 names: with many picks per probe round every ranked member gets
/// an equal share, a ten-times-slower one included. `response-time` must not.
#[test]
fn response_time_clb_gives_a_ten_times_slower_member_an_equal_share() {
    let (clb, _) = ten_times_slower_shares(Algorithm::ResponseTimeClb);
    assert!(clb.iter().all(|&c| c == 100), "CLB walks the table evenly: {clb:?}");
}

/// Shares of 1000 picks in one probe round over ten members, member 9 ten times slower.
fn ten_times_slower_shares(algorithm: Algorithm) -> (Vec<usize>, Vec<usize>) {
    let mut b = balancer(algorithm, 10);
    let mut r = rng(3);
    let ms = Duration::from_millis;
    let round: Vec<(usize, Option<Duration>)> =
        (0..10).map(|m| (m, Some(ms(if m == 9 { 100 } else { 10 })))).collect();
    b.record_probe_round(&round);
    let p = picks(&mut b, 1000, Instant::ZERO, &mut r);
    (histogram(&p, 10), p)
}

#[test]
fn response_time_gives_a_ten_times_slower_member_a_tenth_of_a_fast_share() {
    let (shares, p) = ten_times_slower_shares(Algorithm::ResponseTime);
    // Ideal: 1000 x (1/10) / (9 + 1/10) = 10.99 for the slow member, 109.89 for each fast one.
    assert!((10..=12).contains(&shares[9]), "slow member's share: {shares:?}");
    for &c in &shares[..9] {
        assert!((109..=111).contains(&c), "fast members' shares: {shares:?}");
    }
    // Smooth: the slow member's turns are spread out, not bunched.
    let turns: Vec<usize> = (0..p.len()).filter(|&i| p[i] == 9).collect();
    assert!(turns.windows(2).all(|w| w[1] - w[0] >= 80), "slow member's turns: {turns:?}");
}

/// A view change (a weight, a drain, a member joining) keeps the smoothed round trips and the
/// table: the slow member does not get an equal share until the next probe round.
#[test]
fn response_time_keeps_its_table_across_view_changes() {
    let mut b = balancer(Algorithm::ResponseTime, 10);
    let ms = Duration::from_millis;
    let round: Vec<(usize, Option<Duration>)> =
        (0..10).map(|m| (m, Some(ms(if m == 9 { 100 } else { 10 })))).collect();
    b.record_probe_round(&round);
    // The slow member leaves index 9: a newcomer joins at the front, shifting every index.
    let mut spec = (**b.spec()).clone();
    spec.members.insert(0, member("new", 100, None));
    let mut b = Balancer::carry_over(std::sync::Arc::new(spec), &b, Instant::ZERO);
    let h = histogram(&picks(&mut b, 910, Instant::ZERO, &mut rng(1)), 11);
    // The newcomer has no place in the table before its first probe; the slow member (now
    // index 10) keeps a tenth of a fast share.
    assert_eq!(h[0], 0, "{h:?}");
    assert!((9..=11).contains(&h[10]), "{h:?}");
    assert!(h[1..10].iter().all(|&c| (99..=101).contains(&c)), "{h:?}");
}

#[test]
fn response_time_ranks_fastest_first_and_restarts_after_refresh() {
    let mut b = balancer(Algorithm::ResponseTime, 4);
    let mut r = rng(1);
    // Before any probe round: plain round robin.
    assert_eq!(picks(&mut b, 4, Instant::ZERO, &mut r), vec![0, 1, 2, 3]);
    let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
    assert_eq!(d.why, Why::ResponseTimeUnranked);
    let ms = Duration::from_millis;
    b.record_probe_round(&[(0, Some(ms(40))), (1, Some(ms(10))), (2, None), (3, Some(ms(20)))]);
    // Ranked 1, 3, 0 (fastest first); the median is member 3's 20 ms. Member 1 is faster but
    // shares are never raised above the median's, and member 0, twice the median, gets half a
    // share: one cycle of 5 picks gives 2, 2 and 1. Member 2's probe failed, so it has no place
    // in the table.
    let p = picks(&mut b, 10, Instant::ZERO, &mut r);
    assert_eq!(p[0], 1, "a round starts with the fastest member: {p:?}");
    assert_eq!(histogram(&p, 4), vec![2, 4, 0, 4], "{p:?}");
    // A new round re-ranks by the round trips smoothed over rounds (1/8 of the new probe):
    // member 2 comes back at 7 ms, member 1 is at 10 + (50 - 10) / 8 = 15 ms, member 3 at
    // 20 - 14 / 8 = 18.25 ms, member 0 at 40 + 10 / 8 = 41.25 ms. The next pick is the fastest,
    // whatever came before.
    b.record_probe_round(&[
        (0, Some(ms(50))),
        (1, Some(ms(50))),
        (2, Some(ms(7))),
        (3, Some(ms(6))),
    ]);
    let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
    assert_eq!((d.member, d.why), (2, Why::ResponseTime { rank: 0, rtt_us: 7000 }));
    let d = b.pick(&at(Instant::ZERO), &mut r).unwrap();
    assert_eq!((d.member, d.why), (1, Why::ResponseTime { rank: 1, rtt_us: 15000 }));
}

/// One probe is one service time, so one lucky probe must not hand its member the round: the
/// round trips are smoothed over rounds before they are weighed.
#[test]
fn response_time_one_lucky_probe_does_not_take_the_round() {
    let mut b = balancer(Algorithm::ResponseTime, 2);
    let ms = Duration::from_millis;
    for _ in 0..20 {
        b.record_probe_round(&[(0, Some(ms(8))), (1, Some(ms(8)))]);
    }
    b.record_probe_round(&[(0, Some(ms(8))), (1, Some(Duration::from_micros(300)))]);
    let h = histogram(&picks(&mut b, 1000, Instant::ZERO, &mut rng(1)), 2);
    // Raw weights would give member 1 about 26 picks in 27; smoothed (7.04 ms against 8 ms) it
    // is within the tolerance of the median and shares equally.
    assert_eq!(h, vec![500, 500], "after one lucky probe");
    // A member that really slows down loses its share within a round or two.
    b.record_probe_round(&[(0, Some(ms(8))), (1, Some(ms(80)))]);
    b.record_probe_round(&[(0, Some(ms(8))), (1, Some(ms(80)))]);
    let h = histogram(&picks(&mut b, 1000, Instant::ZERO, &mut rng(1)), 2);
    // Smoothed: 24.1 ms after two rounds, a third of member 0's share (249 picks in 1000).
    assert!(h[1] < 300, "member 1 slowed down tenfold: {h:?}");
}

#[test]
fn response_time_skips_members_that_are_not_eligible() {
    let mut b = balancer(Algorithm::ResponseTime, 3);
    let ms = Duration::from_millis;
    b.record_probe_round(&[(0, Some(ms(1))), (1, Some(ms(2))), (2, Some(ms(4)))]);
    b.set_admin(0, rondo_core::AdminState::Draining, rondo_core::Actor::Operator("ops".into()));
    // Members 1 and 2 share 2 : 1; the drained fastest member is neither picked nor charged.
    let p = picks(&mut b, 300, Instant::ZERO, &mut rng(1));
    assert_eq!(histogram(&p, 3), vec![0, 200, 100]);
}

proptest! {
    /// Within a probe round each ranked member's share of the picks follows the inverse of its
    /// round trip relative to the round's (lower) median, members within 1.5x of the median
    /// and faster ones counting as equal: after any number of picks, no member is a pick per
    /// ranked member away from its ideal share (smooth weighted round robin).
    #[test]
    fn response_time_shares_fall_with_the_round_trip(
        rtts in proptest::collection::vec(proptest::option::weighted(0.9, 1u64..=2000), 1..10),
        count in 1usize..600,
    ) {
        let n = rtts.len();
        let mut b = balancer(Algorithm::ResponseTime, n);
        let round: Vec<(usize, Option<Duration>)> =
            rtts.iter().enumerate().map(|(m, r)| (m, r.map(Duration::from_micros))).collect();
        b.record_probe_round(&round);
        let p = picks(&mut b, count, Instant::ZERO, &mut rng(5));
        let h = histogram(&p, n);
        let ranked: Vec<usize> = (0..n).filter(|&m| rtts[m].is_some()).collect();
        if ranked.is_empty() {
            // No member answered: plain round robin, as before the first round.
            for &c in &h {
                prop_assert!(c.abs_diff(count / n) <= 1, "{h:?}");
            }
            return Ok(());
        }
        let mut sorted: Vec<u64> = ranked.iter().map(|&m| rtts[m].unwrap()).collect();
        sorted.sort_unstable();
        let median = sorted[(sorted.len() - 1) / 2] as f64;
        let inv = |m: usize| {
            let ratio = median / rtts[m].unwrap() as f64;
            if ratio >= 1.0 / 1.5 { 1.0 } else { ratio }
        };
        let total: f64 = ranked.iter().map(|&m| inv(m)).sum();
        for m in 0..n {
            match rtts[m] {
                None => prop_assert_eq!(h[m], 0, "member {} failed its probe: {:?}", m, h),
                Some(_) => {
                    let ideal = count as f64 * inv(m) / total;
                    // The shares are rounded to 1/65536 of the median's (at least 1).
                    let slack = ranked.len() as f64 + count as f64 * 2.0 * ranked.len() as f64 / 65536.0;
                    prop_assert!((h[m] as f64 - ideal).abs() <= slack,
                        "member {}: {} picks, ideal {:.2}: {:?} over {:?}", m, h[m], ideal, h, rtts);
                }
            }
        }
    }
}
