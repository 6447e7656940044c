//! The `rate_limit` filter's buckets without a socket: keys, eviction, the fields and the 429,
//! and buckets kept across compiles (a reload) while the filter is unchanged.

use std::collections::HashSet;
use std::time::Duration;

use http::HeaderMap;
use rondo_core::bucket::Rate;
use rondo_runtime::metrics::Metrics;

use super::*;

fn spec(key: LimitKey, burst: u64, max_keys: u64) -> RateLimit {
    RateLimit { key, rate: Rate { count: 100, per_secs: 1 }, burst, max_keys, tier: false }
}

fn info(client_ip: &str) -> Info<'_> {
    Info {
        client_ip: client_ip.as_bytes(),
        method: "GET",
        tls: false,
        host: Some("example.com"),
        authority: "example.com",
        path: "/",
        query: None,
    }
}

fn counted(m: &Metrics, name: &str) -> String {
    let view = rondo_core::View { id: 1, routes: vec![], clusters: Default::default() };
    let text = m.render(&rondo_runtime::Live::new(view, None).load());
    text.lines().filter(|l| l.starts_with(name)).collect::<Vec<_>>().join("\n")
}

#[test]
fn at_most_max_keys_buckets_the_least_recently_used_dropped_and_counted() {
    let metrics = Metrics::new();
    let b = Buckets::new(2, metrics.rate_limit_evictions("web", "r"));
    let s = spec(LimitKey::ClientIp, 1, 2);
    let t0 = Instant::from_millis(1);
    assert!(b.take(s.share(1), Some(b"a"), t0).admitted);
    assert!(b.take(s.share(1), Some(b"b"), t0).admitted);
    assert!(!b.take(s.share(1), Some(b"a"), t0).admitted, "a's bucket is empty");
    // `c` drops the least recently used, `b`.
    assert!(b.take(s.share(1), Some(b"c"), t0).admitted);
    assert_eq!(b.len(), 2);
    assert!(!b.take(s.share(1), Some(b"a"), t0).admitted, "a's bucket was kept");
    // `b` starts full again, dropping `c`.
    assert!(b.take(s.share(1), Some(b"b"), t0).admitted);
    assert!(!b.take(s.share(1), Some(b"a"), t0).admitted);
    assert_eq!(b.len(), 2);
    let line = counted(&metrics, "rondo_filter_rate_limit_evictions_total");
    assert_eq!(line, "rondo_filter_rate_limit_evictions_total{listener=\"web\",route=\"r\"} 2");
}

#[test]
fn keys_long_or_absent_each_have_their_bucket() {
    let b = Buckets::new(100, Counter::default());
    let s = spec(LimitKey::Header("x-key".into()), 1, 100);
    let t0 = Instant::from_millis(1);
    let long_a = vec![b'a'; 1000];
    let mut long_b = long_a.clone();
    long_b[999] = b'b';
    for key in [&long_a[..], &long_b[..], b"", b"\x02"] {
        assert!(b.take(s.share(1), Some(key), t0).admitted, "{key:?} has its own bucket");
    }
    assert!(b.take(s.share(1), None, t0).admitted, "absent: its own bucket");
    assert!(!b.take(s.share(1), None, t0).admitted, "absent: one shared bucket");
    assert!(!b.take(s.share(1), Some(&long_b), t0).admitted);
    assert_eq!(b.len(), 5);
}

#[test]
fn a_step_admits_the_burst_with_fields_then_answers_429_with_retry_after() {
    let (limits, metrics) = (Limits::default(), Metrics::new());
    let binder = Binder::detached(&limits, &metrics, "r");
    // One an hour: no token comes back while the test runs, however slow.
    let hourly = Rate { count: 1, per_secs: 3600 };
    let step = binder
        .step(0, &RateLimit { rate: hourly, ..spec(LimitKey::Header("x-key".into()), 2, 10) });
    let mut one = HeaderMap::new();
    one.insert("x-key", "one".parse().unwrap());
    let mut two = HeaderMap::new();
    two.insert("x-key", "two".parse().unwrap());
    // The step's fields, as its chain's table has them.
    let table = super::super::table::Table::of([step.edits(&mut 0)].iter());
    let mut applied = Applied::default();
    assert!(step.request(&info("10.0.0.1"), None, &one, &mut applied).is_none());
    let ops = table.response_ops(&applied.record, "");
    let field = |name: &str| -> Vec<String> {
        let named = ops.append.iter().filter(|(n, _)| n == name);
        named.map(|(_, v)| v.to_str().unwrap().to_owned()).collect()
    };
    assert_eq!(field("ratelimit-policy"), ["\"header:x-key\";q=1;w=3600;rondo-burst=2"]);
    assert_eq!(field("ratelimit"), ["\"header:x-key\";r=1;t=3600"]);
    assert!(step.request(&info("10.0.0.1"), None, &one, &mut Applied::default()).is_none());
    let mut applied = Applied::default();
    let answer = step.request(&info("10.0.0.1"), None, &one, &mut applied).expect("limited");
    assert_eq!(answer.status, 429);
    let retry = answer.headers.iter().find(|(n, _)| n == header::RETRY_AFTER).unwrap();
    assert_eq!(retry.1, "3600");
    let ops = table.response_ops(&applied.record, "");
    let rl = ops.append.iter().find(|(n, _)| n == "ratelimit").unwrap();
    assert!(rl.1.to_str().unwrap().ends_with("\"header:x-key\";r=0;t=3600"), "{:?}", rl.1);
    // Another key's bucket is full.
    assert!(step.request(&info("10.0.0.1"), None, &two, &mut Applied::default()).is_none());
    let line = counted(&metrics, "rondo_filter_rate_limited_total");
    assert_eq!(line, "rondo_filter_rate_limited_total{listener=\"web\",route=\"r\"} 1");
}

#[test]
fn an_unchanged_filter_keeps_its_buckets_across_compiles_a_changed_one_starts_afresh() {
    let (limits, metrics) = (Limits::default(), Metrics::new());
    let s = spec(LimitKey::Route, 3, 10);
    let t0 = Instant::from_millis(1);
    let first = Binder::detached(&limits, &metrics, "r").step(1, &s);
    for _ in 0..3 {
        assert!(first.buckets.take(s.share(1), Some(b""), t0).admitted);
    }
    // The next view's chain: the same filter finds the same, empty, bucket.
    let again = Binder::detached(&limits, &metrics, "r").step(1, &s);
    assert!(Arc::ptr_eq(&first.buckets, &again.buckets));
    assert!(!again.buckets.take(s.share(1), Some(b""), t0).admitted);
    // Another route, another position or another spec: other buckets.
    let other_route = Binder::detached(&limits, &metrics, "q").step(1, &s);
    let other_position = Binder::detached(&limits, &metrics, "r").step(2, &s);
    let changed = spec(LimitKey::Route, 4, 10);
    let other_spec = Binder::detached(&limits, &metrics, "r").step(1, &changed);
    for b in [&other_route, &other_position, &other_spec] {
        assert!(!Arc::ptr_eq(&first.buckets, &b.buckets));
        assert!(b.buckets.take(b.spec.share(1), Some(b""), t0).admitted);
    }
    assert_eq!(limits.len(), 4);
    // A view without them: only the filters it still has keep their buckets.
    let binder = Binder::detached(&limits, &metrics, "r");
    limits.keep(&HashSet::from([binder.slot("r", 1, &s)]));
    assert_eq!(limits.len(), 1);
    let kept = binder.step(1, &s);
    assert!(Arc::ptr_eq(&first.buckets, &kept.buckets));
    // Time refills it.
    assert!(kept.buckets.take(s.share(1), Some(b""), t0 + Duration::from_millis(10)).admitted);
}

#[test]
fn identity_and_route_keys_pick_the_bucket_from_the_request() {
    let (limits, metrics) = (Limits::default(), Metrics::new());
    let binder = Binder::detached(&limits, &metrics, "r");
    let hourly = Rate { count: 1, per_secs: 3600 };
    let by_identity =
        binder.step(0, &RateLimit { rate: hourly, ..spec(LimitKey::Identity, 1, 10) });
    let by_route = binder.step(1, &RateLimit { rate: hourly, ..spec(LimitKey::Route, 1, 10) });
    let none = HeaderMap::new();
    let admitted = |step: &LimitStep, ip: &str, subject: Option<&str>| {
        step.request(&info(ip), subject, &none, &mut Applied::default()).is_none()
    };
    assert!(admitted(&by_identity, "10.0.0.1", Some("alice")));
    assert!(!admitted(&by_identity, "10.0.0.1", Some("alice")));
    assert!(admitted(&by_identity, "10.0.0.1", Some("bob")));
    // Without a verified identity: one bucket for all, even apart from a subject so named.
    assert!(admitted(&by_identity, "10.0.0.1", None));
    assert!(!admitted(&by_identity, "10.9.9.9", None));
    assert!(admitted(&by_identity, "10.0.0.1", Some("anonymous")));
    // `route`: every client shares the one bucket.
    assert!(admitted(&by_route, "10.0.0.1", None));
    assert!(!admitted(&by_route, "10.0.0.2", None));
}
