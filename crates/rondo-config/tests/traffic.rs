//! `filters` of routes and listeners: every mistake is reported at its line and column with the
//! field path, a route without a cluster needs a filter that always answers, redirect loops
//! are warned about, and the worked example (`examples/policy.toml`) passes.

use std::path::Path;

use rondo_config::{load_file, parse_str};

mod support;

use rondo_core::traffic::TrafficFilter;
use support::{FILE, fails_with as fails_at};

fn base(route_extra: &str) -> String {
    format!(
        r#"
[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "app"
{route_extra}

[cluster.app]
members = [{{ name = "a1", address = "127.0.0.1:9001" }}]
"#
    )
}

#[test]
fn each_filter_mistake_is_located_with_its_field_path() {
    let t = base(r#"filters = [ { headers = { request = { set = { "x-a" = "${nope}" } } } } ]"#);
    fails_at(&t, "route[0].filters[0].headers.request.set.x-a", "\"${nope}\"", "unknown variable");
    let t = base(r#"filters = [ { headers = { request = { set = { "x-a" = "${member}" } } } } ]"#);
    fails_at(&t, "route[0].filters[0].headers.request.set.x-a", "\"${member}\"", "response");
    let t = base(r#"filters = [ { headers = { request = { remove = ["transfer-encoding"] } } } ]"#);
    fails_at(&t, "route[0].filters[0].headers.request.remove[0]", "\"transfer", "frames");
    let t = base(r#"filters = [ { headers = { response = { add = { "bad name" = "v" } } } } ]"#);
    let field = "route[0].filters[0].headers.response.add.\"bad name\"";
    fails_at(&t, field, "\"v\"", "valid header");
    let t = base(r#"filters = [ { rewrite = { path_regex = "([a-z", to = "/$1" } } ]"#);
    fails_at(&t, "route[0].filters[0].rewrite.path_regex", "\"([a-z\"", "regular expression");
    let t = base(r#"filters = [ { rewrite = { path_regex = "^/a$", to = "/$2" } } ]"#);
    fails_at(&t, "route[0].filters[0].rewrite.to", "\"/$2\"", "capture");
    let t = base(r#"filters = [ { rewrite = { path_prefix = "v2" } } ]"#);
    fails_at(&t, "route[0].filters[0].rewrite.path_prefix", "\"v2\"", "absolute path");
    let t = base(r#"filters = [ { redirect = { status = 200 } } ]"#);
    fails_at(&t, "route[0].filters[0].redirect.status", "200", "301, 302, 303, 307 or 308");
    let t = base(r#"filters = [ { redirect = { scheme = "ftp" } } ]"#);
    fails_at(&t, "route[0].filters[0].redirect.scheme", "\"ftp\"", "`http` or `https`");
    let t = base(r#"filters = [ { redirect_to_member = { status = 301 } } ]"#);
    fails_at(&t, "route[0].filters[0].redirect_to_member.status", "301", "302, 303, 307 or 308");
    let t = base(r#"filters = [ { redirect_to_member = { keep = true } } ]"#);
    fails_at(&t, "route[0].filters[0].redirect_to_member.keep", "keep", "keep_query");
    let t = base(r#"filters = [ { respond = { status = 42 } } ]"#);
    fails_at(&t, "route[0].filters[0].respond.status", "42", "between 200 and 599");
    let t = base(r#"filters = [ { soap = { to = "2.0" } } ]"#);
    fails_at(&t, "route[0].filters[0].soap.to", "\"2.0\"", "not a SOAP version");
    let t = base(r#"filters = [ { grpc_web = { max_body_bytes = 0 } } ]"#);
    fails_at(&t, "route[0].filters[0].grpc_web.max_body_bytes", "0 } } ]", "between 1 and");
    let t = base(r#"filters = [ { grpc_web = { max_bytes = 10 } } ]"#);
    fails_at(&t, "route[0].filters[0].grpc_web.max_bytes", "max_bytes", "max_body_bytes");
    let t = base(r#"filters = [ { respond = { body_file = "missing.txt" } } ]"#);
    fails_at(&t, "route[0].filters[0].respond.body_file", "\"missing.txt\"", "cannot read");
    // Two names in one entry, and a typo with a suggestion.
    let t = base(r#"filters = [ { request_id = {}, respond = {} } ]"#);
    fails_at(&t, "route[0].filters[0]", "{ request_id", "exactly one key");
    let t = base(r#"filters = [ { request_idd = {} } ]"#);
    fails_at(&t, "route[0].filters[0].request_idd", "request_idd", "did you mean `request_id`");
}

#[test]
fn only_a_route_whose_filters_always_answer_may_go_without_a_cluster() {
    let t = base("").replace("cluster = \"app\"\n", "filters = [ { request_id = {} } ]\n");
    fails_at(&t, "route[0].cluster", "[[route]]", "needs a `cluster`");
    let t =
        base("").replace("cluster = \"app\"\n", "filters = [ { respond = { status = 204 } } ]\n");
    let c = parse_str(&t, Path::new(FILE), 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.view.routes[0].cluster, "");
    assert!(matches!(c.view.routes[0].filters[0], TrafficFilter::Respond(_)));
}

#[test]
fn a_redirect_back_to_the_same_route_is_warned_about() {
    let warned = |extra: &str| {
        let t = base(extra);
        let c = parse_str(&t, Path::new(FILE), 1).unwrap_or_else(|e| panic!("{e}"));
        c.warnings.iter().any(|w| w.message.contains("a loop"))
    };
    assert!(warned(r#"filters = [ { redirect = {} } ]"#), "a redirect to itself");
    assert!(warned(r#"filters = [ { redirect = { scheme = "http" } } ]"#), "own scheme");
    assert!(warned(r#"filters = [ { redirect = { path = "/x" } } ]"#), "a path it matches");
    assert!(!warned(r#"filters = [ { redirect = { scheme = "https" } } ]"#));
    assert!(!warned(r#"filters = [ { redirect = { host = "example.org" } } ]"#));
    let exact = r#"match = { path = "/old" }
filters = [ { redirect = { path = "/new" } } ]"#;
    assert!(!warned(exact), "a path its match does not take");
}

#[test]
fn the_policy_example_passes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/policy.toml");
    let c = load_file(&path, 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let listeners = c.listeners.iter().flat_map(|l| &l.filters);
    let routes = c.view.routes.iter().flat_map(|r| &r.filters);
    let names: Vec<&str> = listeners.chain(routes).map(TrafficFilter::name).collect();
    for want in [
        "request_id",
        "headers",
        "rewrite",
        "redirect",
        "respond",
        "rate_limit",
        "cors",
        "compress",
        "fault",
        "mirror",
        "soap",
    ] {
        assert!(names.contains(&want), "examples/policy.toml has no `{want}` filter");
    }
    assert!(c.view.routes.iter().any(|r| !r.split.is_empty()), "no weighted clusters");
}
