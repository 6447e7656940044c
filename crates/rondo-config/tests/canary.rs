//! `rondo check`-level tests of a route's weighted `clusters` (canary splits) and of the
//! `fault` and `mirror` filters: what compiles into the view, and every refusal at its file,
//! line, column and field path.

mod support;

use rondo_core::split::WeightedCluster;
use support::{fails_once, ok, parse, pos, render};

const CLUSTERS: &str = r#"
[cluster.v1]
members = [{ name = "a1", address = "127.0.0.1:9001" }]

[cluster.v2]
members = [{ name = "b1", address = "127.0.0.1:9002" }]

[cluster.shadow]
members = [{ name = "s1", address = "127.0.0.1:9003" }]
"#;

/// A web listener, one route with `route` as its body, and the three clusters.
fn config(route: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n[[route]]\nlistener = \
         \"web\"\n{route}\n{CLUSTERS}"
    )
}

#[test]
fn a_split_compiles_with_its_weights_and_names_its_first_weighted_cluster() {
    let c = ok(&config(
        "clusters = [ { cluster = \"v1\", weight = 0 }, { cluster = \"v2\", weight = 5 }, \
         { cluster = \"shadow\", weight = 95 } ]\nbackups = []",
    ));
    let r = &c.view.routes[0];
    let w = |c: &str, weight| WeightedCluster { cluster: c.into(), weight };
    assert_eq!(r.split, vec![w("v1", 0), w("v2", 5), w("shadow", 95)]);
    assert_eq!(r.cluster, "v2", "the first cluster of positive weight names the route");
    let plain = ok(&config("cluster = \"v1\""));
    assert!(plain.view.routes[0].split.is_empty());
}

#[test]
fn clusters_reached_only_through_a_split_or_a_mirror_are_not_warned_about() {
    let c = ok(&config(
        "clusters = [ { cluster = \"v1\", weight = 1 }, { cluster = \"v2\", weight = 1 } ]\n\
         filters = [ { mirror = { cluster = \"shadow\" } } ]",
    ));
    assert!(c.warnings.is_empty(), "{}", render(&c.warnings));
}

#[test]
fn a_split_is_refused_where_it_cannot_work() {
    let both = config("cluster = \"v1\"\nclusters = [ { cluster = \"v2\", weight = 1 } ]");
    fails_once(
        &both,
        "route[0].clusters",
        "[ { cluster = \"v2\"",
        "either `cluster` or `clusters`",
    );
    let unknown =
        config("clusters = [ { cluster = \"v1\", weight = 1 }, { cluster = \"v9\", weight = 1 } ]");
    fails_once(&unknown, "route[0].clusters[1].cluster", "\"v9\"", "unknown cluster `v9`");
    let twice =
        config("clusters = [ { cluster = \"v1\", weight = 1 }, { cluster = \"v1\", weight = 2 } ]");
    fails_once(&twice, "route[0].clusters[1].cluster", "\"v1\", weight = 2", "listed twice");
    let zero =
        config("clusters = [ { cluster = \"v1\", weight = 0 }, { cluster = \"v2\", weight = 0 } ]");
    fails_once(&zero, "route[0].clusters", "[ { cluster = \"v1\"", "must not all be 0");
    let big = config("clusters = [ { cluster = \"v1\", weight = 2000000 } ]");
    fails_once(&big, "route[0].clusters[0].weight", "2000000", "at most 1000000");
    let negative = config("clusters = [ { cluster = \"v1\", weight = -1 } ]");
    let errs = parse(&negative).expect_err("a negative weight");
    assert_eq!(errs[0].field, "route[0].clusters[0].weight", "{}", render(&errs));
    assert_eq!((errs[0].line, errs[0].column), pos(&negative, "-1"));
    let missing = config("clusters = [ { cluster = \"v1\" } ]");
    fails_once(&missing, "route[0].clusters[0]", "{ cluster = \"v1\" }", "needs a `weight`");
    let empty = config("clusters = []");
    fails_once(&empty, "route[0].clusters", "[]", "at least one cluster");
    let backup = config("clusters = [ { cluster = \"v1\", weight = 1 } ]\nbackups = [\"v1\"]");
    fails_once(&backup, "route[0].clusters[0].cluster", "\"v1\", weight", "also a backup");
    let copied = config(
        "clusters = [ { cluster = \"v1\", weight = 1 } ]\nmulticast = [ { cluster = \"v1\" } ]",
    );
    fails_once(&copied, "route[0].multicast[0].cluster", "\"v1\" } ]", "already serves the route");
}

#[test]
fn tcp_and_queue_routes_have_no_split() {
    let tcp = "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:8081\"\nprotocol = \"tcp\"\n\n\
               [[route]]\nlistener = \"t\"\nclusters = [ { cluster = \"raw\", weight = 1 } ]\n\n\
               [cluster.raw]\nupstream_protocol = \"tcp\"\n\
               members = [{ name = \"r1\", address = \"127.0.0.1:9009\" }]\n";
    fails_once(tcp, "route[0].clusters", "[ { cluster = \"raw\"", "cannot split");
    let queue = "[[listener]]\nname = \"in\"\nlisten = \"127.0.0.1:8081\"\nprotocol = \"queue\"\n\n\
                 [[route]]\nlistener = \"in\"\nclusters = [ { cluster = \"v1\", weight = 1 } ]\n\n\
                 [[queue]]\nname = \"orders\"\ndirectory = \"q\"\n"
        .to_owned() + CLUSTERS;
    fails_once(&queue, "route[0].clusters", "[ { cluster = \"v1\"", "not a weighted split");
}

#[test]
fn fault_compiles_percentages_into_parts_per_million() {
    use rondo_core::traffic::{Fault, TrafficFilter};
    use std::time::Duration;
    let c = ok(&config(
        "cluster = \"v1\"\nfilters = [ { fault = { delay_ms = 50, delay_percent = 1.5, \
         abort_status = 503, abort_percent = 0.1, header = \"X-Rondo-Fault\" } }, \
         { fault = { abort_status = 500 } } ]",
    ));
    let f = &c.view.routes[0].filters;
    assert_eq!(
        f[0],
        TrafficFilter::Fault(Fault {
            delay: Some(Duration::from_millis(50)),
            delay_ppm: 15_000,
            abort_status: Some(503),
            abort_ppm: 1_000,
            header: Some("x-rondo-fault".into()),
        })
    );
    let TrafficFilter::Fault(second) = &f[1] else { panic!("{f:?}") };
    assert_eq!((second.abort_ppm, second.delay), (1_000_000, None), "100 % unless given");
}

#[test]
fn a_bad_fault_is_refused_at_its_field() {
    let route =
        |fault: &str| config(&format!("cluster = \"v1\"\nfilters = [ {{ fault = {fault} }} ]"));
    let t = route("{ delay_percent = 5 }");
    fails_once(
        &t,
        "route[0].filters[0].fault",
        "{ delay_percent",
        "needs `delay_ms`, `abort_status` or `header`",
    );
    let t = route("{ abort_status = 503, abort_percent = 120.0 }");
    fails_once(&t, "route[0].filters[0].fault.abort_percent", "120.0", "percentage from 0 to 100");
    let t = route("{ abort_status = 503, delay_percent = 1 }");
    fails_once(&t, "route[0].filters[0].fault.delay_percent", "1 }", "needs `delay_ms`");
    let t = route("{ abort_status = 999 }");
    fails_once(&t, "route[0].filters[0].fault.abort_status", "999", "between 200 and 599");
    let t = route("{ delay_ms = 0 }");
    fails_once(&t, "route[0].filters[0].fault.delay_ms", "0 }", "between 1 and 3600000");
    let t = route("{ header = \"bad header\" }");
    fails_once(&t, "route[0].filters[0].fault.header", "\"bad header\"", "not a valid header name");
    let t = route("{ abort = 503 }");
    let errs = parse(&t).expect_err("unknown option");
    assert!(errs[0].field.contains("fault"), "{}", render(&errs));
}

#[test]
fn mirror_compiles_and_names_a_cluster_that_does_not_serve_the_route() {
    use rondo_core::traffic::{Mirror, TrafficFilter};
    let c = ok(&config(
        "cluster = \"v1\"\nfilters = [ { mirror = { cluster = \"shadow\", percent = 5.0 } } ]",
    ));
    let want = Mirror { cluster: "shadow".into(), ppm: 50_000, queue: 1024 };
    assert_eq!(c.view.routes[0].filters, vec![TrafficFilter::Mirror(want)]);
    let route = |m: &str| config(&format!("cluster = \"v1\"\nfilters = [ {{ mirror = {m} }} ]"));
    let t = route("{ cluster = \"nope\" }");
    fails_once(&t, "route[0].filters[0].mirror.cluster", "\"nope\"", "unknown cluster `nope`");
    let t = route("{ cluster = \"v1\" }");
    fails_once(&t, "route[0].filters[0].mirror.cluster", "\"v1\" }", "already serves the route");
    let t = route("{ cluster = \"shadow\", percent = -1.0 }");
    fails_once(&t, "route[0].filters[0].mirror.percent", "-1.0", "percentage from 0 to 100");
    let t = route("{ cluster = \"shadow\", queue = 0 }");
    fails_once(&t, "route[0].filters[0].mirror.queue", "0 }", "greater than 0");
    let listener = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\
         filters = [ {{ mirror = {{ cluster = \"shadow\" }} }} ]\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"v1\"\n{CLUSTERS}"
    );
    fails_once(
        &listener,
        "listener[0].filters[0].mirror",
        "{ cluster = \"shadow\" }",
        "a route's filter",
    );
}
