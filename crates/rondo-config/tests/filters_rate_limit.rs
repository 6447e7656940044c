//! The `rate_limit` filter's options as `rondo check` sees them: defaults, keys, and every
//! refusal at its file, line, column and field path.

mod support;

use rondo_core::bucket::Rate;
use rondo_core::traffic::{LimitKey, RateLimit, TrafficFilter};
use support::parse;

fn config(filters: &str) -> String {
    format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "app"
filters = [
  {filters}
]

[cluster.app]
members = [{{ name = "a1", address = "127.0.0.1:9001" }}]
"#
    )
}

fn limit(filters: &str) -> RateLimit {
    let c = parse(&config(filters)).unwrap_or_else(|e| panic!("refused: {e:?}"));
    match &c.view.routes[0].filters[..] {
        [TrafficFilter::RateLimit(r)] => r.clone(),
        other => panic!("not one rate_limit: {other:?}"),
    }
}

/// Asserts the filter is refused with exactly one error, on `field`, at `needle`, whose
/// message contains `message`.
#[track_caller]
fn fails_once(filters: &str, field: &str, needle: &str, message: &str) {
    support::fails_once(&config(filters), field, needle, message);
}

#[test]
fn defaults_burst_from_the_rate_and_keys_by_client_address() {
    let r = limit(r#"{ rate_limit = { rate = "100/s" } }"#);
    assert_eq!(
        r,
        RateLimit {
            key: LimitKey::ClientIp,
            rate: Rate { count: 100, per_secs: 1 },
            burst: 100,
            max_keys: 100_000,
            tier: false,
        }
    );
    assert!(limit(r#"{ rate_limit = { rate = "1/s", scope = "tier" } }"#).tier);
    // A per-minute rate below one a second still gets a burst of one.
    assert_eq!(limit(r#"{ rate_limit = { rate = "30/m" } }"#).burst, 1);
    assert_eq!(limit(r#"{ rate_limit = { rate = "7200/h" } }"#).burst, 2);
    let r = limit(
        r#"{ rate_limit = { key = "header:X-Api-Key", rate = "5/m", burst = 9, max_keys = 2 } }"#,
    );
    assert_eq!(r.key, LimitKey::Header("x-api-key".into()));
    assert_eq!((r.rate, r.burst, r.max_keys), (Rate { count: 5, per_secs: 60 }, 9, 2));
    assert_eq!(
        limit(r#"{ rate_limit = { key = "identity", rate = "1/s" } }"#).key,
        LimitKey::Identity
    );
    let r = limit(r#"{ rate_limit = { key = "route", rate = "1/s", scope = "router" } }"#);
    assert_eq!(r.key, LimitKey::Route);
}

#[test]
fn bad_rates_are_refused_at_the_field() {
    let field = "route[0].filters[0].rate_limit.rate";
    fails_once(r#"{ rate_limit = { rate = "0/s" } }"#, field, r#""0/s""#, "at least 1");
    fails_once(r#"{ rate_limit = { rate = "100" } }"#, field, r#""100""#, "not a rate");
    fails_once(
        r#"{ rate_limit = { rate = "fast" } }"#,
        field,
        r#""fast""#,
        "`N/s`, `N/m` or `N/h`",
    );
    fails_once(r#"{ rate_limit = { rate = "10/d" } }"#, field, r#""10/d""#, "not a rate");
    fails_once(
        r#"{ rate_limit = { burst = 5 } }"#,
        "route[0].filters[0].rate_limit",
        "{ burst",
        "needs `rate`",
    );
}

#[test]
fn bad_keys_bursts_and_scopes_are_refused_at_the_field() {
    let p = "route[0].filters[0].rate_limit";
    fails_once(
        r#"{ rate_limit = { key = "cookie", rate = "1/s" } }"#,
        &format!("{p}.key"),
        r#""cookie""#,
        "expected `client_ip`, `header:NAME`, `identity` or `route`",
    );
    fails_once(
        r#"{ rate_limit = { key = "header:a b", rate = "1/s" } }"#,
        &format!("{p}.key"),
        r#""header:a b""#,
        "not a valid header name",
    );
    fails_once(
        r#"{ rate_limit = { rate = "1/s", burst = 0 } }"#,
        &format!("{p}.burst"),
        "0 }",
        "between 1 and",
    );
    fails_once(
        r#"{ rate_limit = { rate = "1/s", max_keys = 0 } }"#,
        &format!("{p}.max_keys"),
        "0 }",
        "between 1 and 10000000",
    );
    fails_once(
        r#"{ rate_limit = { rate = "1/s", scope = "galaxy" } }"#,
        &format!("{p}.scope"),
        r#""galaxy""#,
        "expected `router` or `tier`",
    );
    fails_once(
        r#"{ rate_limit = { rate = "1/s", scope = "world" } }"#,
        &format!("{p}.scope"),
        r#""world""#,
        "unknown scope",
    );
    fails_once(
        r#"{ rate_limit = { rate = "1/s" }, respond = {} }"#,
        "route[0].filters[0]",
        "{ rate_limit",
        "exactly one key",
    );
}
