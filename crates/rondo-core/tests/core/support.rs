//! Builders shared by the core tests.

use std::sync::Arc;

use rondo_core::{
    Algorithm, Balancer, ClusterSpec, Entropy, Instant, MemberSpec, PickRequest, Policy,
    SplitMix64, UpstreamProtocol,
};

pub(crate) fn member(name: &str, weight: u32, group: Option<&str>) -> MemberSpec {
    MemberSpec {
        name: name.to_owned(),
        address: format!("127.0.0.1:{}", 9000 + name.len()),
        weight,
        group: group.map(str::to_owned),
        admin: Default::default(),
    }
}

pub(crate) fn cluster(algorithm: Algorithm, members: Vec<MemberSpec>) -> Arc<ClusterSpec> {
    let policy = Policy { algorithm, ..Policy::default() };
    cluster_with(policy, members)
}

pub(crate) fn cluster_with(policy: Policy, members: Vec<MemberSpec>) -> Arc<ClusterSpec> {
    Arc::new(ClusterSpec {
        name: "c".to_owned(),
        members,
        policy,
        upstream_protocol: UpstreamProtocol::Http1,
        sticky: Default::default(),
        upstream_tls: None,
    })
}

pub(crate) fn named(n: usize) -> Vec<MemberSpec> {
    (0..n).map(|i| member(&format!("m{i}"), 100, None)).collect()
}

pub(crate) fn balancer(algorithm: Algorithm, n: usize) -> Balancer {
    Balancer::new(cluster(algorithm, named(n)), Instant::ZERO)
}

pub(crate) fn at(now: Instant) -> PickRequest<'static> {
    PickRequest { now, ..PickRequest::default() }
}

/// Picks `count` times at `now`, returning member indexes.
pub(crate) fn picks(
    b: &mut Balancer,
    count: usize,
    now: Instant,
    rng: &mut dyn Entropy,
) -> Vec<usize> {
    (0..count).map(|_| b.pick(&at(now), rng).expect("a member").member).collect()
}

pub(crate) fn rng(seed: u64) -> SplitMix64 {
    SplitMix64::new(seed)
}

pub(crate) fn histogram(picks: &[usize], n: usize) -> Vec<usize> {
    let mut h = vec![0; n];
    for &p in picks {
        h[p] += 1;
    }
    h
}
