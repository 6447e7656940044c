//! Consistent hashing: minimal movement on join and leave, and bounded load.

use proptest::prelude::*;
use rondo_core::{
    Algorithm, Balancer, HashPolicy, HashTable, Instant, PickRequest, Policy, hash::hash_key,
};

use super::support::*;

fn hashed(table: HashTable, names: &[String], bounded: Option<f64>) -> Balancer {
    let policy = Policy {
        algorithm: Algorithm::Hash,
        hash: HashPolicy { table, bounded_load: bounded, ..HashPolicy::default() },
        ..Policy::default()
    };
    let members = names.iter().map(|n| member(n, 100, None)).collect();
    Balancer::new(cluster_with(policy, members), Instant::ZERO)
}

/// Member name for each of `keys` keys.
fn mapping(b: &mut Balancer, keys: u64) -> Vec<String> {
    let mut r = rng(1);
    (0..keys)
        .map(|k| {
            let req = PickRequest {
                hash: Some(hash_key(format!("key-{k}").as_bytes())),
                ..at(Instant::ZERO)
            };
            let m = b.pick(&req, &mut r).unwrap().member;
            b.spec().members[m].name.clone()
        })
        .collect()
}

fn moved(a: &[String], b: &[String]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 / a.len() as f64
}

fn check_join_and_leave(table: HashTable, n: usize, slack: f64) {
    let names: Vec<String> = (0..n).map(|i| format!("member-{i}")).collect();
    let keys = 20_000;
    let before = mapping(&mut hashed(table, &names, None), keys);

    // Leave: only the leaver's keys move.
    let mut fewer = names.clone();
    let gone = fewer.remove(n / 2);
    let after = mapping(&mut hashed(table, &fewer, None), keys);
    let share = moved(&before, &after);
    assert!(share <= slack / n as f64, "{table:?} leave moved {share:.4} of keys with {n} members");
    for (x, y) in before.iter().zip(&after) {
        if x != y && table == HashTable::Ring {
            assert_eq!(x, &gone, "ring: only the leaver's keys move");
        }
    }

    // Join: about 1/(N+1) move, and (on the ring) all to the newcomer.
    let mut more = names.clone();
    more.push("member-new".to_owned());
    let after = mapping(&mut hashed(table, &more, None), keys);
    let share = moved(&before, &after);
    assert!(
        share <= slack / (n + 1) as f64,
        "{table:?} join moved {share:.4} of keys with {n} members"
    );
    assert!(share > 0.3 / (n + 1) as f64, "{table:?} the newcomer must take some keys: {share:.4}");
    for (x, y) in before.iter().zip(&after) {
        if x != y && table == HashTable::Ring {
            assert_eq!(y, "member-new", "ring: moved keys go to the newcomer");
        }
    }
}

#[test]
fn ring_moves_about_one_nth_of_keys() {
    for n in [3, 10, 40] {
        check_join_and_leave(HashTable::Ring, n, 1.5);
    }
}

#[test]
fn maglev_moves_about_one_nth_of_keys() {
    for n in [3, 10, 40] {
        check_join_and_leave(HashTable::Maglev, n, 2.0);
    }
}

#[test]
fn hash_spreads_keys_evenly() {
    for table in [HashTable::Ring, HashTable::Maglev] {
        let names: Vec<String> = (0..8).map(|i| format!("member-{i}")).collect();
        let map = mapping(&mut hashed(table, &names, None), 40_000);
        for n in &names {
            let share = map.iter().filter(|m| *m == n).count() as f64 / 40_000.0;
            assert!((0.125 * 0.7..0.125 * 1.3).contains(&share), "{table:?} {n}: {share:.3}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// With bounded load `c`, no member ever holds more than `ceil(c * (total + 1) / n)` active
    /// requests when it is chosen, even when every key is the same.
    #[test]
    fn bounded_load_cap_is_never_exceeded(
        n in 2usize..12,
        c in prop_oneof![Just(1.0f64), Just(1.25), Just(2.0)],
        hot in prop::bool::ANY,
        table in prop_oneof![Just(HashTable::Ring), Just(HashTable::Maglev)],
        seed in any::<u64>(),
    ) {
        let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
        let mut b = hashed(table, &names, Some(c));
        let mut r = rng(seed);
        for k in 0..(n as u64 * 20) {
            let total = k;
            let key = if hot { 7 } else { hash_key(&k.to_le_bytes()) };
            let d = b.pick(&PickRequest { hash: Some(key), ..at(Instant::ZERO) }, &mut r).unwrap();
            let load = b.states()[d.member].load.active();
            let cap = (c * (total + 1) as f64 / n as f64).ceil() as u64;
            prop_assert!(load < cap, "member {} at {} of cap {} (total {})", d.member, load, cap, total);
            b.begin_request(d.member);
        }
    }
}

#[test]
fn same_key_same_member_until_it_leaves() {
    let names: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    let mut b = hashed(HashTable::Ring, &names, None);
    let mut r = rng(1);
    let req = PickRequest { hash: Some(hash_key(b"user-42")), ..at(Instant::ZERO) };
    let first = b.pick(&req, &mut r).unwrap().member;
    for _ in 0..20 {
        assert_eq!(b.pick(&req, &mut r).unwrap().member, first);
    }
    b.set_health(first, false, rondo_core::Actor::HealthCheck, Instant::ZERO);
    let moved_to = b.pick(&req, &mut r).unwrap().member;
    assert_ne!(moved_to, first);
    b.set_health(first, true, rondo_core::Actor::HealthCheck, Instant::ZERO);
    assert_eq!(b.pick(&req, &mut r).unwrap().member, first, "the key comes home");
}
