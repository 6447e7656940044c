//! The cost of one pick, for every algorithm, at 10, 1,000 and 10,000 members.
//!
//! `cargo bench -p rondo-core --bench pick` — results in docs/benchmarks.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rondo_core::load::AgentReport;
use rondo_core::{
    Algorithm, Balancer, ClusterSpec, Instant, MemberSpec, Outcome, PickRequest, Policy,
    SplitMix64, UpstreamProtocol,
};

/// Members weighted 100/200/300 in turn when `weighted`, else all 100.
fn balancer_with(algorithm: Algorithm, n: usize, weighted: bool) -> Balancer {
    let members = (0..n)
        .map(|i| MemberSpec {
            name: format!("member-{i}"),
            address: format!("127.0.0.1:{}", 10_000 + i),
            weight: if weighted { 100 + (i as u32 % 3) * 100 } else { 100 },
            group: None,
            admin: Default::default(),
        })
        .collect();
    let spec = Arc::new(ClusterSpec {
        name: "bench".into(),
        members,
        policy: Policy { algorithm, ..Policy::default() },
        upstream_protocol: UpstreamProtocol::Http1,
        sticky: Default::default(),
        upstream_tls: None,
    });
    let mut b = Balancer::new(spec, Instant::ZERO);
    let now = Instant::from_millis(10);
    // Some realistic state: latencies, a few requests in flight, agent reports, a probe round.
    let mut probes = Vec::with_capacity(n);
    for i in 0..n {
        let latency = Duration::from_micros(500 + (i as u64 * 37) % 2000);
        b.begin_request(i);
        b.end_request(i, now, Outcome::Success { latency });
        if i % 4 == 0 {
            b.begin_request(i);
        }
        b.report_agent(
            i,
            AgentReport {
                cpu_used: (i % 100) as f32 / 100.0,
                mem_free: (i as u64 % 64) << 26,
                sessions: 0,
                seq: 1,
                at: now,
            },
        );
        probes.push((i, Some(latency)));
    }
    b.record_probe_round(&probes);
    b
}

/// Weights 100/200/300 for `weighted` (which needs them to mean anything), equal otherwise.
fn balancer(algorithm: Algorithm, n: usize) -> Balancer {
    balancer_with(algorithm, n, algorithm == Algorithm::Weighted)
}

fn picks(c: &mut Criterion) {
    let now = Instant::from_millis(20);
    let keys: Vec<u64> =
        (0..1024u64).map(|k| rondo_core::hash::hash_key(&k.to_le_bytes())).collect();
    for algorithm in Algorithm::ALL {
        let mut group = c.benchmark_group(format!("pick/{algorithm}"));
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_millis(800));
        for n in [10usize, 1_000, 10_000] {
            let mut b = balancer(algorithm, n);
            let mut rng = SplitMix64::new(42);
            let mut k = 0usize;
            // Warm the candidate cache and indexes outside the measurement.
            let _ = b.pick(&PickRequest { now, ..PickRequest::default() }, &mut rng);
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
                bench.iter(|| {
                    k = (k + 1) & 1023;
                    let req = PickRequest { now, hash: Some(keys[k]), ..PickRequest::default() };
                    black_box(b.pick(black_box(&req), &mut rng).map(|d| d.member))
                })
            });
        }
        group.finish();
    }
    // least-sessions over unequal weights uses the tournament tree instead of the buckets.
    let mut group = c.benchmark_group("pick/least-sessions-weighted");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_millis(800));
    for n in [10usize, 1_000, 10_000] {
        let mut b = balancer_with(Algorithm::LeastSessions, n, true);
        let mut rng = SplitMix64::new(42);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                let req = PickRequest { now, ..PickRequest::default() };
                black_box(b.pick(black_box(&req), &mut rng).map(|d| d.member))
            })
        });
    }
    group.finish();
    // A whole request's bookkeeping for least-sessions: pick, begin, end (index updates).
    let mut group = c.benchmark_group("cycle/least-sessions");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_millis(800));
    for n in [10usize, 1_000, 10_000] {
        let mut b = balancer(Algorithm::LeastSessions, n);
        let mut rng = SplitMix64::new(42);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                let req = PickRequest { now, ..PickRequest::default() };
                if let Ok(d) = b.pick(&req, &mut rng) {
                    b.begin_request(d.member);
                    b.end_request(
                        d.member,
                        now,
                        Outcome::Success { latency: Duration::from_micros(700) },
                    );
                }
            })
        });
    }
    group.finish();
}

/// A request's bookkeeping as the router's cluster runtime does it (pick, the shadow's turn,
/// begin, end), without a shadow (the cost a shadow adds when none is set: one branch per call)
/// and with a `p2c-ewma` shadow beside round-robin.
fn shadow(c: &mut Criterion) {
    let now = Instant::from_millis(20);
    let mut group = c.benchmark_group("cycle/round-robin");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_millis(800));
    for (label, shadow) in [("no-shadow", None), ("shadow-p2c-ewma", Some(Algorithm::P2cEwma))] {
        for n in [10usize, 1_000] {
            let mut b = balancer(Algorithm::RoundRobin, n);
            b.set_shadow(shadow, now);
            let (mut rng, mut srng) = (SplitMix64::new(42), SplitMix64::new(43));
            group.bench_with_input(BenchmarkId::new(label, n), &n, |bench, _| {
                bench.iter(|| {
                    let req = PickRequest { now, ..PickRequest::default() };
                    let d = b.pick(black_box(&req), &mut rng);
                    let live = d.as_ref().ok().map(|d| d.member);
                    black_box(b.shadow_pick(&req, live, &mut srng));
                    if let Some(m) = live {
                        b.begin_request(m);
                        b.end_request(
                            m,
                            now,
                            Outcome::Success { latency: Duration::from_micros(700) },
                        );
                    }
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, picks, shadow);
criterion_main!(benches);
