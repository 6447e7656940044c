//! `[defaults]`: what every cluster and route inherits field by field, the admin API's defaults
//! over the file's, and where each field in force comes from.

mod support;

use std::path::Path;
use std::time::Duration;

use rondo_config::{DefaultsOverride, Origin};
use rondo_core::Algorithm;
use support::{errors, fails_once, ok, pos, render};

const FILE: &str = r#"
[defaults]
algorithm = "p2c-ewma"
connect_timeout = "2s"
request_timeout = "7s"
[defaults.health]
kind = "http"
path = "/healthz"
interval = "3s"

[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
match = { path_prefix = "/a/" }
cluster = "a"

[[route]]
listener = "web"
cluster = "b"
request_timeout_ms = 1000

[cluster.a]
members = [{ name = "a1", address = "127.0.0.1:9001" }]

[cluster.b]
algorithm = "round-robin"
connect_timeout_ms = 250
health = { interval = "1s" }
members = [{ name = "b1", address = "127.0.0.1:9002" }]
"#;

#[test]
fn clusters_and_routes_inherit_what_they_do_not_set_field_by_field() {
    let c = ok(FILE);
    let a = &c.view.clusters["a"].policy;
    let b = &c.view.clusters["b"].policy;
    assert_eq!(a.algorithm, Algorithm::P2cEwma);
    assert_eq!(a.connect_timeout, Duration::from_secs(2));
    let ha = a.health.as_ref().expect("a inherits the health check");
    assert_eq!(ha.interval, Duration::from_secs(3));
    // b sets its algorithm and timeout (under the other unit spelling) and one health field.
    assert_eq!(b.algorithm, Algorithm::RoundRobin);
    assert_eq!(b.connect_timeout, Duration::from_millis(250));
    let hb = b.health.as_ref().expect("b's health check");
    assert_eq!(hb.interval, Duration::from_secs(1));
    assert_eq!(hb.kind, ha.kind, "b's health inherits the kind and path it did not set");
    // Routes: the first inherits the request timeout, the second sets its own.
    assert_eq!(c.view.routes[0].request_timeout, Duration::from_secs(7));
    assert_eq!(c.view.routes[1].request_timeout, Duration::from_secs(1));
}

#[test]
fn without_defaults_nothing_changes() {
    let text = FILE.split("\n[[listener]]").nth(1).map(|t| format!("[[listener]]{t}")).unwrap();
    let c = ok(&text);
    assert_eq!(c.view.clusters["a"].policy.algorithm, Algorithm::default());
    assert!(c.view.clusters["a"].policy.health.is_none());
}

#[test]
fn a_bad_default_is_reported_at_its_line_in_defaults() {
    let text = FILE.replace("algorithm = \"p2c-ewma\"", "algorithm = \"fastest\"");
    // Cluster b sets its own algorithm, so only a inherits the bad one: one error, shown at
    // the default, naming the cluster it broke.
    fails_once(&text, "cluster.a.algorithm", "\"fastest\"", "inherited from `defaults.algorithm`");
    let text = FILE.replace("interval = \"3s\"", "interval = 3");
    let errs = errors(&text);
    assert!(!errs.is_empty());
    assert_eq!(errs[0].field, "defaults.health.interval", "{}", render(&errs));
    assert_eq!(errs[0].line, pos(&text, "interval = 3").0, "{}", render(&errs));
    let text = FILE.replace("[defaults.health]", "[defaults.helth]");
    let errs = errors(&text);
    assert!(errs[0].message.contains("did you mean `health`"), "{}", render(&errs));
    let text = FILE.replace("request_timeout = \"7s\"", "members = []");
    let errs = errors(&text);
    assert!(errs[0].message.contains("unknown field `members`"), "{}", render(&errs));
}

/// `text` written to a file of its own (a test's name in the path keeps tests apart).
#[track_caller]
fn file(text: &str) -> std::path::PathBuf {
    let line = std::panic::Location::caller().line();
    let dir = std::env::temp_dir().join(format!("rondo-defaults-{}-{line}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rondo.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_admin_defaults_go_over_the_files_and_under_every_cluster() {
    let path = file(FILE);
    let over = DefaultsOverride::parse(
        "algorithm = \"least-sessions\"\n[health]\ninterval = \"9s\"\n",
        Path::new("admin"),
    )
    .unwrap();
    let c = rondo_config::load_file_over(&path, 1, rondo_config::Features::ALL, Some(&over))
        .unwrap_or_else(|e| panic!("{e}"));
    let a = &c.view.clusters["a"].policy;
    assert_eq!(a.algorithm, Algorithm::LeastSessions);
    assert_eq!(a.health.as_ref().unwrap().interval, Duration::from_secs(9));
    // The file's other defaults stay under the admin's.
    assert_eq!(a.connect_timeout, Duration::from_secs(2));
    // A cluster's own fields win over both.
    assert_eq!(c.view.clusters["b"].policy.algorithm, Algorithm::RoundRobin);
    assert_eq!(
        c.view.clusters["b"].policy.health.as_ref().unwrap().interval,
        Duration::from_secs(1)
    );

    let bad = DefaultsOverride::parse("algorithm = \"p2c-ewma\"\nbogus = 1\n", Path::new("admin"));
    let e = bad.unwrap_err();
    assert_eq!((e.errors[0].line, e.errors[0].column), (2, 1), "{e}");
    assert!(e.errors[0].message.contains("unknown field `bogus`"), "{e}");
    // A value the compiler refuses fails the load, so the running view stays.
    let wrong = DefaultsOverride::parse("algorithm = \"fastest\"\n", Path::new("admin")).unwrap();
    let errs = rondo_config::load_file_over(&path, 1, rondo_config::Features::ALL, Some(&wrong))
        .unwrap_err();
    assert_eq!(errs.errors[0].field, "cluster.a.algorithm", "{errs}");
}

#[test]
fn effective_fields_say_where_each_comes_from() {
    let path = file(FILE);
    let over = DefaultsOverride::parse("[health]\ntimeout = \"4s\"\n", Path::new("admin")).unwrap();
    let fields = rondo_config::effective(&path, "b", Some(&over)).unwrap_or_else(|e| panic!("{e}"));
    let of = |name: &str| {
        fields
            .iter()
            .find(|f| f.field == name)
            .unwrap_or_else(|| panic!("no {name} in {fields:#?}"))
    };
    let line = |needle: &str| pos(FILE, needle).0;
    assert_eq!(of("algorithm").origin, Origin::Cluster(path.clone(), line("\"round-robin\"")));
    assert_eq!(of("algorithm").value, "\"round-robin\"");
    assert_eq!(of("health.path").origin, Origin::Defaults(path.clone(), line("\"/healthz\"")));
    assert_eq!(of("health.timeout").origin, Origin::Admin);
    assert_eq!(of("outlier.consecutive_failures").origin, Origin::BuiltIn);
    // Route fields are not a cluster's.
    assert!(fields.iter().all(|f| !f.field.starts_with("request_timeout")), "{fields:#?}");
    let unknown = rondo_config::effective(&path, "nope", None).unwrap_err();
    assert!(unknown.to_string().contains("unknown cluster `nope`"), "{unknown}");
}
