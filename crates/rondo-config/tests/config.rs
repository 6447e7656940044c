//! End-to-end tests of `rondo-config`: a full config compiles into the expected view, defaults
//! come from `rondo-core`, and every check reports the right field at the right line and column.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rondo_config::{
    AccessLogSpec, AccessLogTarget, AdminSpec, AdminToken, Config, ConfigError, DnsSpec,
    ErrorDetail, Features, Http2Limits, ListenerProtocol, ListenerSpec, LogFormat, LogSpec,
    NamingSpec, RegistrySpec, load_file, parse_str, parse_str_with,
};
mod support;

use support::*;

use rondo_core::{
    AdminState, AgentPolicy, Algorithm, EwmaPolicy, Granularity, HashKeySource, HashPolicy,
    HashTable, HealthCheck, HealthCheckKind, Locality, OutlierDetection, Policy, RetryPolicy,
    RouteMatch, SlowStart, StickySession, UpstreamProtocol,
};

/// A small valid config other tests append to or edit.
const BASE: &str = r#"
[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "app"

[cluster.app]
members = [{ name = "a1", address = "127.0.0.1:9001" }]
"#;

fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

const FULL: &str = r#"
[router]
group = "east"

[admin]
listen = "127.0.0.1:9950"
token_file = "secrets/admin.token"

[naming]
listen = "127.0.0.1:9951"
registry = "etcd"
etcd_endpoints = ["10.0.0.1:2379", "etcd.local:2379"]
etcd_prefix = "/lb"
dns_listen = "127.0.0.1:9953"
dns_zone = "Svc.Example"
token = "naming-secret"

[[listener]]
name = "web"
listen = "127.0.0.1:8080"
protocol = "http"
max_connections = 500
backlog = 1024
header_read_timeout_ms = 2500
body_read_timeout_ms = 4000
max_header_bytes = 8192
max_body_bytes = 1048576
max_headers = 50
trust_forwarded_for = true
h2_keepalive_interval_ms = 0
h2_keepalive_timeout_ms = 3000
h2_shutdown_timeout_ms = 2000
h2_max_resets = 50
h2_max_resets_per_address = 400

[[listener]]
name = "db"
listen = "[::1]:5433"
protocol = "tcp"

[[route]]
name = "api"
listener = "web"
match = { host = "example.com", path_prefix = "/api", method = ["get", "Post"], headers = { "X-Tenant" = "a" } }
cluster = "components"
backups = ["components-dr"]
idle_timeout_ms = 1000
request_timeout_ms = 2000

[[route]]
listener = "web"
match = { method = "delete" }
cluster = "components-dr"

[[route]]
listener = "db"
cluster = "db"

[cluster.components]
algorithm = "hash"
granularity = "session"
upstream_protocol = "http2"
panic_threshold_percent = 30
members = [
  { name = "m1", address = "127.0.0.1:9001", weight = 7, group = "east", state = "draining" },
  { name = "m2", address = "backend.local:9002" },
]
health = { kind = "http", path = "/health", expect_status = "200-299", interval_ms = 250, timeout_ms = 900, rise = 3, fall = 4 }
outlier = { consecutive_failures = 6, count_5xx = false, base_ejection_ms = 1000, max_ejection_ms = 9000, max_ejected_percent = 40 }
retry = { attempts = 2, per_try_timeout_ms = 700, budget_percent = 15, budget_min_per_sec = 3 }
slow_start = { duration_ms = 5000, initial_percent = 25 }
locality = { prefer_local = false }
hash = { table = "maglev", key = "header:X-User", bounded_load = 0, ring_vnodes = 64 }
agent = { timeout_ms = 900 }
ewma = { decay_ms = 5000, default_rtt_ms = 12, failure_penalty_ms = 800 }
session = { cookie = "sid", header = "X-Session", idle_timeout_ms = 1234 }

[cluster.components-dr]
algorithm = "p2c-ewma"
members = [{ name = "dr1", address = "[::1]:9003", state = "disabled" }]
health = { path = "/ok", expect_status = "204" }
hash = { key = "cookie:Cart", bounded_load = 2.5 }

[cluster.db]
algorithm = "least-sessions"
upstream_protocol = "tcp"
members = [{ name = "d1", address = "127.0.0.1:9004" }]
health = { kind = "tcp" }
"#;

#[test]
fn full_config_compiles_into_the_expected_view() {
    let c = ok(FULL);
    assert_eq!(c.summary(), "2 listeners, 3 routes, 3 clusters, 4 members, view 7");
    assert_eq!(c.view.id, 7);
    assert_eq!(c.router.group.as_deref(), Some("east"));
    assert_eq!(
        c.admin,
        Some(AdminSpec {
            listen: "127.0.0.1:9950".parse().unwrap(),
            token: Some(AdminToken::File(Path::new("conf").join("secrets/admin.token"))),
            tls: None,
            probes: Default::default(),
        })
    );
    assert_eq!(
        c.naming,
        Some(NamingSpec {
            listen: "127.0.0.1:9951".parse().unwrap(),
            registry: RegistrySpec::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "etcd.local:2379".into()],
                prefix: "/lb".into(),
            },
            dns: Some(DnsSpec {
                listen: "127.0.0.1:9953".parse().unwrap(),
                zone: "svc.example.".into(),
            }),
            token: Some(AdminToken::Inline("naming-secret".into())),
            max_registrations_per_service: NamingSpec::DEFAULT_MAX_REGISTRATIONS_PER_SERVICE,
            max_registrations: NamingSpec::DEFAULT_MAX_REGISTRATIONS,
            allowed_hosts: vec![],
            allow_registered_clusters: false,
            tls: None,
            xds: None,
            parent: vec![],
        })
    );
    assert_eq!(
        c.listeners,
        vec![
            ListenerSpec {
                name: "web".into(),
                listen: "127.0.0.1:8080".parse().unwrap(),
                protocol: ListenerProtocol::Http,
                max_connections: 500,
                backlog: 1024,
                header_read_timeout: Duration::from_millis(2500),
                body_read_timeout: Duration::from_secs(4),
                max_header_bytes: 8192,
                max_headers: 50,
                max_body_bytes: 1_048_576,
                trust_forwarded_for: rondo_config::Trusted::Everyone,
                proxy_protocol: None,
                error_detail: ErrorDetail::Full,
                http2: Http2Limits {
                    keepalive_interval: None,
                    keepalive_timeout: Duration::from_secs(3),
                    shutdown_timeout: Duration::from_secs(2),
                    max_resets: 50,
                    max_resets_per_address: 400,
                },
                access_log: None,
                tls: None,
                connections: Default::default(),
                routing: Default::default(),
                filters: vec![],
                http3: None,
                udp: None,
                splice: rondo_config::Splice::Auto,
            },
            ListenerSpec {
                name: "db".into(),
                listen: "[::1]:5433".parse().unwrap(),
                protocol: ListenerProtocol::Tcp,
                max_connections: ListenerSpec::DEFAULT_MAX_CONNECTIONS,
                backlog: ListenerSpec::DEFAULT_BACKLOG,
                header_read_timeout: ListenerSpec::DEFAULT_HEADER_READ_TIMEOUT,
                body_read_timeout: ListenerSpec::DEFAULT_BODY_READ_TIMEOUT,
                max_header_bytes: ListenerSpec::DEFAULT_MAX_HEADER_BYTES,
                max_headers: ListenerSpec::DEFAULT_MAX_HEADERS,
                max_body_bytes: 0,
                trust_forwarded_for: rondo_config::Trusted::Nobody,
                proxy_protocol: None,
                error_detail: ErrorDetail::Full,
                http2: Http2Limits::default(),
                access_log: None,
                tls: None,
                connections: Default::default(),
                routing: Default::default(),
                filters: vec![],
                http3: None,
                udp: None,
                splice: rondo_config::Splice::Auto,
            },
        ]
    );

    let names: Vec<&str> = c.view.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["api", "route-2", "route-3"]);
    let api = &c.view.routes[0];
    assert_eq!(api.listener, "web");
    assert_eq!(api.cluster, "components");
    assert_eq!(api.backups, ["components-dr"]);
    assert_eq!(api.idle_timeout, Duration::from_millis(1000));
    assert_eq!(api.request_timeout, Duration::from_millis(2000));
    assert_eq!(
        api.matcher,
        RouteMatch {
            host: Some("example.com".into()),
            path_prefix: Some("/api".into()),
            methods: vec!["GET".into(), "POST".into()],
            headers: vec![("x-tenant".into(), "a".into())],
            ..RouteMatch::default()
        }
    );
    let r2 = &c.view.routes[1];
    assert_eq!(r2.matcher, RouteMatch { methods: vec!["DELETE".into()], ..RouteMatch::default() });
    assert_eq!(r2.idle_timeout, rondo_config::DEFAULT_ROUTE_IDLE_TIMEOUT);
    assert_eq!(r2.request_timeout, rondo_config::DEFAULT_ROUTE_REQUEST_TIMEOUT);
    assert_eq!(c.view.routes[2].matcher, RouteMatch::default());

    let keys: Vec<&str> = c.view.clusters.keys().map(String::as_str).collect();
    assert_eq!(keys, ["components", "components-dr", "db"]);

    let comp = c.view.cluster("components").unwrap();
    assert_eq!(comp.name, "components");
    assert_eq!(comp.upstream_protocol, UpstreamProtocol::Http2);
    assert_eq!(comp.members.len(), 2);
    let m1 = &comp.members[0];
    assert_eq!((m1.name.as_str(), m1.address.as_str(), m1.weight), ("m1", "127.0.0.1:9001", 7));
    assert_eq!((m1.group.as_deref(), m1.admin), (Some("east"), AdminState::Draining));
    let m2 = &comp.members[1];
    assert_eq!((m2.weight, m2.group.as_deref(), m2.admin), (100, None, AdminState::Active));
    let p = &comp.policy;
    assert_eq!(p.algorithm, Algorithm::Hash);
    assert_eq!(p.granularity, Granularity::Session);
    assert_eq!(p.panic_threshold_percent, 30);
    assert_eq!(
        p.health,
        Some(HealthCheck {
            kind: HealthCheckKind::Http {
                path: "/health".into(),
                expect_min: 200,
                expect_max: 299
            },
            interval: Duration::from_millis(250),
            timeout: Duration::from_millis(900),
            rise: 3,
            fall: 4,
            port: None,
        })
    );
    assert_eq!(
        p.outlier,
        OutlierDetection {
            consecutive_failures: 6,
            count_5xx: false,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(9),
            max_ejected_percent: 40,
        }
    );
    assert_eq!(
        p.retry,
        RetryPolicy {
            attempts: 2,
            per_try_timeout: Some(Duration::from_millis(700)),
            budget_percent: 15,
            budget_min_per_sec: 3,
            ..RetryPolicy::default()
        }
    );
    assert_eq!(p.slow_start, SlowStart { duration: Duration::from_secs(5), initial_percent: 25 });
    assert_eq!(p.locality, Locality { prefer_local: false });
    assert_eq!(
        p.hash,
        HashPolicy {
            table: HashTable::Maglev,
            key: HashKeySource::Header("x-user".into()),
            bounded_load: None,
            ring_vnodes: 64,
        }
    );
    assert_eq!(p.agent, AgentPolicy { timeout: Duration::from_millis(900) });
    assert_eq!(
        p.ewma,
        EwmaPolicy {
            decay: Duration::from_secs(5),
            default_rtt: Duration::from_millis(12),
            failure_penalty: Duration::from_millis(800),
        }
    );
    assert_eq!(
        comp.sticky,
        StickySession {
            cookie: "sid".into(),
            header: Some("x-session".into()),
            idle_timeout: Duration::from_millis(1234),
        }
    );

    let dr = c.view.cluster("components-dr").unwrap();
    assert_eq!(dr.policy.algorithm, Algorithm::P2cEwma);
    assert_eq!(dr.members[0].admin, AdminState::Disabled);
    assert_eq!(
        dr.policy.health.as_ref().map(|h| h.kind.clone()),
        Some(HealthCheckKind::Http { path: "/ok".into(), expect_min: 204, expect_max: 204 })
    );
    assert_eq!(dr.policy.hash.table, HashTable::Ring);
    assert_eq!(dr.policy.hash.key, HashKeySource::Cookie("Cart".into()));
    assert_eq!(dr.policy.hash.bounded_load, Some(2.5));

    let db = c.view.cluster("db").unwrap();
    assert_eq!(db.upstream_protocol, UpstreamProtocol::Tcp);
    assert_eq!(db.policy.health.as_ref().map(|h| h.kind.clone()), Some(HealthCheckKind::Tcp));
}

#[test]
fn defaults_come_from_the_core_model() {
    let c = ok(&with(
        "\n[cluster.checked]\nhealth = {}\noutlier = {}\nretry = {}\nslow_start = {}\nlocality = {}\nhash = {}\nagent = {}\newma = {}\nsession = {}\n",
    ));
    assert_eq!(c.summary(), "1 listener, 1 route, 2 clusters, 1 member, view 7");
    assert_eq!(c.router.group, None);
    assert_eq!((c.admin.as_ref(), c.naming.as_ref()), (None, None));
    let app = c.view.cluster("app").unwrap();
    assert_eq!(app.policy, Policy::default());
    assert_eq!(app.upstream_protocol, UpstreamProtocol::default());
    assert_eq!(app.sticky, StickySession::default());
    assert_eq!(app.members[0].weight, 100);
    // Empty sub-tables are the defaults too; an empty `health` is a default TCP check.
    let checked = c.view.cluster("checked").unwrap();
    let expected = Policy { health: Some(HealthCheck::default()), ..Policy::default() };
    assert_eq!(checked.policy, expected);
    assert_eq!(checked.sticky, StickySession::default());
    assert!(checked.members.is_empty());
    let l = &c.listeners[0];
    assert_eq!(l.protocol, ListenerProtocol::Http);
    assert_eq!((l.max_connections, l.backlog), (10_000, 4096));
    assert_eq!(l.header_read_timeout, Duration::from_secs(10));
    assert_eq!(
        (l.max_header_bytes, l.max_headers, &l.trust_forwarded_for),
        (65_536, 100, &rondo_config::Trusted::Nobody)
    );
    assert_eq!(l.error_detail, ErrorDetail::Full, "loopback listeners explain errors in full");
    let h2 = l.http2;
    assert_eq!(
        (h2.keepalive_interval, h2.keepalive_timeout, h2.shutdown_timeout),
        (Some(Duration::from_secs(30)), Duration::from_secs(10), Duration::from_secs(5))
    );
    assert_eq!((h2.max_resets, h2.max_resets_per_address), (200, 1000));
    let r = &c.view.routes[0];
    assert_eq!(r.name, "route-1");
    assert_eq!(
        (r.idle_timeout, r.request_timeout),
        (Duration::from_secs(60), Duration::from_secs(30))
    );

    let c = ok(&with("[admin]\n[naming]\n"));
    let admin = c.admin.unwrap();
    assert_eq!(admin.listen, AdminSpec::DEFAULT_LISTEN.parse::<SocketAddr>().unwrap());
    assert_eq!(admin.token, None);
    let naming = c.naming.unwrap();
    assert_eq!(naming.listen, NamingSpec::DEFAULT_LISTEN.parse::<SocketAddr>().unwrap());
    assert_eq!(naming.registry, RegistrySpec::Embedded { snapshot: None });
    assert_eq!(naming.dns, None);
    let c = ok(&with("[naming]\ndns_listen = \"127.0.0.1:0\"\n"));
    assert_eq!(c.naming.unwrap().dns.unwrap().zone, NamingSpec::DEFAULT_DNS_ZONE);

    let c = ok(&with("[naming]\nregistry = \"etcd\"\netcd_endpoints = [\"127.0.0.1:2379\"]\n"));
    assert_eq!(
        c.naming.unwrap().registry,
        RegistrySpec::Etcd { endpoints: vec!["127.0.0.1:2379".into()], prefix: "/rondo".into() }
    );
    let c = ok(&with("[naming]\nsnapshot = \"reg.snap\"\n[admin]\ntoken = \"s3cret\"\n"));
    assert_eq!(
        c.naming.unwrap().registry,
        RegistrySpec::Embedded { snapshot: Some(Path::new("conf").join("reg.snap")) }
    );
    assert_eq!(c.admin.unwrap().token, Some(AdminToken::Inline("s3cret".into())));
}

#[test]
fn health_kind_defaults_to_http_when_a_path_is_given() {
    let c = ok(&BASE.replace("}]\n", "}]\nhealth = { path = \"/h\" }\n"));
    let h = c.view.cluster("app").unwrap().policy.health.clone().unwrap();
    assert_eq!(
        h.kind,
        HealthCheckKind::Http {
            path: "/h".into(),
            expect_min: rondo_config::DEFAULT_EXPECT_STATUS.0,
            expect_max: rondo_config::DEFAULT_EXPECT_STATUS.1,
        }
    );
    let c = ok(&BASE.replace("}]\n", "}]\nhealth = { kind = \"http\" }\n"));
    let h = c.view.cluster("app").unwrap().policy.health.clone().unwrap();
    assert_eq!(
        h.kind,
        HealthCheckKind::Http { path: "/".into(), expect_min: 200, expect_max: 399 }
    );
}

#[test]
fn the_example_config_passes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rondo.toml");
    let c = load_file(&path, 1).unwrap_or_else(|e| panic!("{e}"));
    // One cluster per algorithm at least, both hash tables, and both listener kinds.
    for a in Algorithm::ALL {
        assert!(c.view.clusters.values().any(|cl| cl.policy.algorithm == a), "no {a} cluster");
    }
    let hashes: Vec<HashTable> = c
        .view
        .clusters
        .values()
        .filter(|cl| cl.policy.algorithm == Algorithm::Hash)
        .map(|cl| cl.policy.hash.table)
        .collect();
    assert!(hashes.contains(&HashTable::Ring) && hashes.contains(&HashTable::Maglev));
    assert!(c.listeners.iter().any(|l| l.protocol == ListenerProtocol::Tcp));
    assert!(c.listeners.iter().any(|l| l.protocol == ListenerProtocol::Http));
    assert!(c.view.clusters.values().any(|cl| cl.policy.granularity == Granularity::Session));
}

#[test]
fn load_file_reports_a_missing_file() {
    let path = Path::new("/nonexistent/dir/rondo.toml");
    let errs = load_file(path, 1).unwrap_err();
    assert_eq!(errs.len(), 1);
    let e = &errs.errors[0];
    // No position: the file and the OS error, not a made-up `:1:1`.
    assert_eq!((e.file.as_path(), e.line, e.column, e.field.as_str()), (path, 0, 0, ""));
    let shown = errs.to_string();
    assert!(shown.starts_with("/nonexistent/dir/rondo.toml: cannot read config file: "), "{shown}");
    assert!(shown.contains("No such file or directory"), "{shown}");
}

// ---- syntax and type errors ----

#[test]
fn a_typo_in_a_cluster_field_names_the_field_and_its_position() {
    let text = with("\n[cluster.other]\nalgoritm = \"random\"\n");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1);
    let e = &errs[0];
    assert_eq!((e.line, e.column), pos(&text, "algoritm"));
    assert_eq!(e.field, "cluster.other.algoritm");
    assert_eq!(e.message, "unknown field `algoritm`, did you mean `algorithm`?", "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "{FILE}:{}:1: field `cluster.other.algoritm`: {}",
            pos(&text, "algoritm").0,
            e.message
        )
    );
}

#[test]
fn a_typo_in_an_inline_member_is_located() {
    let text =
        BASE.replace("address = \"127.0.0.1:9001\"", "address = \"127.0.0.1:9001\", wieght = 3");
    fails_once(&text, "cluster.app.members[0].wieght", "wieght", "unknown field `wieght`");
}

#[test]
fn every_typo_of_a_file_is_reported_in_one_run_with_the_nearest_name() {
    // Three misspelt keys: a table's, an inline table's (between two good keys) and a
    // listener's; and a semantic error that only the compile stage finds stays for later.
    let text = with(
        "\n[cluster.other]\nalgoritm = \"random\"\nmembers = [{ name = \"o1\", wieght = 3, address = \"127.0.0.1:9009\" }]\n\n[[listener]]\nname = \"two\"\nlisten = \"127.0.0.1:0\"\nmax_conections = 5\n",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 3, "{}", render(&errs));
    assert_error(
        &errs[0],
        &text,
        "cluster.other.algoritm",
        "algoritm",
        "did you mean `algorithm`?",
    );
    assert_error(
        &errs[1],
        &text,
        "cluster.other.members[0].wieght",
        "wieght",
        "did you mean `weight`?",
    );
    assert_error(
        &errs[2],
        &text,
        "listener[1].max_conections",
        "max_conections",
        "did you mean `max_connections`?",
    );
    // A name nothing resembles keeps the list of what is expected.
    let text = with("\n[cluster.other]\nzzzzzz = 1\nmembers = []\n");
    fails_once(
        &text,
        "cluster.other.zzzzzz",
        "zzzzzz",
        "unknown field `zzzzzz`, expected one of `",
    );
    // A misspelt dotted key is one error, not also a syntax error the file does not have.
    let text = with("\n[cluster.other]\nmembers = []\nhealth.pathh = \"/h\"\n");
    fails_once(&text, "cluster.other.health.pathh", "pathh", "did you mean `path`?");
    // After the last unknown field, another kind of error is still reported.
    let text = with("\n[cluster.other]\nalgoritm = \"random\"\nmembers = 5\n");
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{}", render(&errs));
    assert_eq!(errs[1].field, "cluster.other.members", "{}", render(&errs));
}

#[test]
fn an_unknown_top_level_table_is_located() {
    let text = with("\n[clusters.x]\nmembers = []\n");
    fails_once(&text, "clusters", "clusters", "unknown field `clusters`, did you mean `cluster`?");
}

#[test]
fn a_missing_required_field_names_it() {
    let text = with("\n[[listener]]\nname = \"two\"\n");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "listener[1].listen");
    assert_eq!(errs[0].message, "missing field `listen`");
    assert_eq!((errs[0].line, errs[0].column), pos(&text, "[[listener]]\nname = \"two\""));
}

#[test]
fn a_wrong_type_is_located_at_the_value() {
    let text = BASE.replace("name = \"a1\"", "name = \"a1\", weight = \"heavy\"");
    fails_once(
        &text,
        "cluster.app.members[0].weight",
        "\"heavy\"",
        "invalid type: string \"heavy\"",
    );
    let text = BASE.replace("name = \"a1\"", "name = \"a1\", weight = -4");
    fails_once(&text, "cluster.app.members[0].weight", "-4", "invalid value: integer `-4`");
    let text = with(
        "[[route]]\nlistener = \"web\"\ncluster = \"app\"\nmatch = { method = [\"GET\", 3] }\n",
    );
    fails_once(&text, "route[1].match.method[1]", "3]", "invalid type: integer `3`");
}

#[test]
fn a_syntax_error_has_a_position_but_no_field() {
    let text = with("\n[cluster.x\n");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "");
    assert_eq!(errs[0].line, pos(&text, "[cluster.x").0);
    assert!(!errs[0].to_string().contains("field"), "{}", errs[0]);
    let text = with("\n[cluster.x]\nalgorithm = \"random\"\nalgorithm = \"hash\"\n");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].message, "duplicate key `algorithm`");
    assert_eq!(errs[0].line, pos(&text, "algorithm = \"hash\"").0);
}

// ---- semantic errors ----

#[test]
fn a_route_to_a_missing_cluster_points_at_the_cluster_value() {
    let text = BASE.replace("cluster = \"app\"", "cluster = \"ap\"");
    fails_once(&text, "route[0].cluster", "\"ap\"", "unknown cluster `ap`, expected one of `app`");
    let errs = errors(&text);
    let (line, column) = pos(&text, "\"ap\"");
    assert_eq!(
        errs[0].to_string(),
        format!(
            "{FILE}:{line}:{column}: field `route[0].cluster`: unknown cluster `ap`, expected one of `app`"
        )
    );
}

#[test]
fn every_semantic_error_is_reported_in_file_order() {
    let text = r#"
[[listener]]
name = "web"
listen = "nowhere"

[[route]]
listener = "wbe"
cluster = "nope"

[cluster.app]
algorithm = "fastest"
members = [
  { name = "a", address = "127.0.0.1:9001", weight = 0 },
  { name = "a", address = "127.0.0.1:9001" },
]
"#;
    let errs = errors(text);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "listener[0].listen",
            "route[0].listener",
            "route[0].cluster",
            "cluster.app.algorithm",
            "cluster.app.members[0].weight",
            "cluster.app.members[1].name",
            "cluster.app.members[1].address",
        ],
        "{}",
        render(&errs)
    );
    let shown = rondo_config::ConfigErrors { errors: errs.clone() }.to_string();
    assert_eq!(shown.lines().count(), errs.len());
}

#[test]
fn duplicate_listener_names() {
    let text = with("[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8081\"\n");
    fails_once(
        &text,
        "listener[1].name",
        "\"web\"\nlisten = \"127.0.0.1:8081\"",
        "duplicate listener name `web`",
    );
}

#[test]
fn listen_addresses_must_parse_and_differ() {
    let text = BASE.replace("127.0.0.1:8080", "localhost:8080");
    fails_once(&text, "listener[0].listen", "\"localhost:8080\"", "not a socket address");
    let text = with("[[listener]]\nname = \"two\"\nlisten = \"127.0.0.1:8080\"\n");
    // The second occurrence of the address is the duplicate.
    fails_once(
        &text,
        "listener[1].listen",
        "$\"127.0.0.1:8080\"",
        "already used by listener[0].listen",
    );
    let text = with("[admin]\nlisten = \"127.0.0.1:99999\"\n");
    fails_once(&text, "admin.listen", "\"127.0.0.1:99999\"", "not a socket address");
    let text = with("[naming]\nlisten = \"127.0.0.1:8080\"\n");
    fails_once(&text, "naming.listen", "$\"127.0.0.1:8080\"", "already used by listener[0].listen");
}

#[test]
fn routes_must_name_a_known_listener() {
    let text = BASE.replace("listener = \"web\"", "listener = \"webb\"");
    fails_once(
        &text,
        "route[0].listener",
        "\"webb\"",
        "unknown listener `webb`, expected one of `web`",
    );
}

#[test]
fn backups_must_exist_differ_from_the_primary_and_not_repeat() {
    let text = with("\n[cluster.dr]\nmembers = []\n").replace(
        "cluster = \"app\"\n",
        "cluster = \"app\"\nbackups = [\"dr\", \"gone\", \"app\", \"dr\"]\n",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 3, "{}", render(&errs));
    fails_with(
        &text,
        "route[0].backups[1]",
        "\"gone\"",
        "unknown cluster `gone`, expected one of `app` or `dr`",
    );
    fails_with(
        &text,
        "route[0].backups[2]",
        "\"app\", \"dr\"]",
        "backup `app` is the route's primary cluster",
    );
    fails_with(&text, "route[0].backups[3]", "\"dr\"]", "backup `dr` is listed twice");
}

#[test]
fn duplicate_route_names() {
    let text = with("[[route]]\nname = \"route-1\"\nlistener = \"web\"\ncluster = \"app\"\n");
    fails_once(
        &text,
        "route[1].name",
        "\"route-1\"",
        "route name `route-1` already used by route[0]",
    );
}

#[test]
fn member_names_and_addresses_are_unique_within_a_cluster() {
    let text = BASE.replace(
        "members = [{ name = \"a1\", address = \"127.0.0.1:9001\" }]",
        "members = [{ name = \"a1\", address = \"127.0.0.1:9001\" }, { name = \"a1\", address = \"127.0.0.1:9002\" }, { name = \"a3\", address = \"127.0.0.1:9001\" }]",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{}", render(&errs));
    fails_with(
        &text,
        "cluster.app.members[1].name",
        "\"a1\", address = \"127.0.0.1:9002\"",
        "duplicate member name `a1`",
    );
    fails_with(
        &text,
        "cluster.app.members[2].address",
        "\"127.0.0.1:9001\" }]",
        "duplicate member address `127.0.0.1:9001`, first used by members[0]",
    );
    // The same address in two clusters is fine.
    ok(&with("[cluster.b]\nmembers = [{ name = \"a1\", address = \"127.0.0.1:9001\" }]\n"));
}

#[test]
fn member_addresses_must_be_host_and_port() {
    for (bad, msg) in [
        ("127.0.0.1", "is not host:port"),
        (":80", "has no host"),
        ("host:0", "is not a port"),
        ("host:65536", "is not a port"),
        ("host:http", "is not a port"),
        ("::1:80", "must be in brackets"),
        ("[::zz]:80", "not a bracketed IPv6 address"),
        ("bad host:80", "not a host name or IP address"),
        ("http://127.0.0.1:9101", "host:port without a scheme: write `127.0.0.1:9101`"),
        ("https://app.example/v1", "host:port without a scheme: write `app.example:443`"),
    ] {
        let text = BASE.replace("127.0.0.1:9001", bad);
        fails_once(&text, "cluster.app.members[0].address", &format!("\"{bad}\""), msg);
    }
    ok(&BASE.replace("127.0.0.1:9001", "[::1]:9001"));
    ok(&BASE.replace("127.0.0.1:9001", "app-1.internal.example:65535"));
}

#[test]
fn weights_are_between_one_and_a_million() {
    for (w, ok_) in [(0, false), (1, true), (1_000_000, true), (1_000_001, false)] {
        let text = BASE.replace("name = \"a1\"", &format!("name = \"a1\", weight = {w}"));
        if ok_ {
            ok(&text);
        } else {
            fails_once(
                &text,
                "cluster.app.members[0].weight",
                &format!("{w}, address"),
                &format!("must be between 1 and 1000000, got {w}"),
            );
        }
    }
}

/// Inserts `line` into `[cluster.app]`.
fn cluster_line(line: &str) -> String {
    BASE.replace("[cluster.app]\n", &format!("[cluster.app]\n{line}\n"))
}

#[test]
fn unknown_spellings_list_the_valid_ones() {
    let cases = [
        (
            "algorithm = \"round_robin\"",
            "cluster.app.algorithm",
            "\"round_robin\"",
            "unknown algorithm `round_robin`, expected `round-robin`, `random`, `weighted`, `rotating`, `response-time`, `response-time-clb`, `least-sessions`, `least-cpu`, `most-free-memory`, `p2c-ewma`, `adaptive` or `hash`",
        ),
        (
            "granularity = \"call\"",
            "cluster.app.granularity",
            "\"call\"",
            "unknown granularity `call`, expected `request`, `session` or `lookup`",
        ),
        (
            "upstream_protocol = \"h2\"",
            "cluster.app.upstream_protocol",
            "\"h2\"",
            "unknown upstream_protocol `h2`, expected `http1`, `http2`, `tcp` or `udp`",
        ),
        (
            "hash = { table = \"jump\" }",
            "cluster.app.hash.table",
            "\"jump\"",
            "unknown hash table `jump`, expected `ring` or `maglev`",
        ),
        (
            "hash = { key = \"ip\" }",
            "cluster.app.hash.key",
            "\"ip\"",
            "unknown hash key `ip`, expected `client-address`, `header:NAME` or `cookie:NAME`",
        ),
        (
            "hash = { key = \"header:\" }",
            "cluster.app.hash.key",
            "\"header:\"",
            "is not a header name",
        ),
        (
            "hash = { key = \"cookie:a b\" }",
            "cluster.app.hash.key",
            "\"cookie:a b\"",
            "is not a cookie name",
        ),
        (
            "health = { kind = \"icmp\" }",
            "cluster.app.health.kind",
            "\"icmp\"",
            "unknown health check kind `icmp`, expected `grpc`, `http`, `tcp` or `udp`",
        ),
    ];
    for (line, field, needle, msg) in cases {
        fails_once(&cluster_line(line), field, needle, msg);
    }
    let text = BASE.replace("\"127.0.0.1:9001\" }", "\"127.0.0.1:9001\", state = \"off\" }");
    fails_once(
        &text,
        "cluster.app.members[0].state",
        "\"off\"",
        "unknown state `off`, expected `active`, `draining` or `disabled`",
    );
    let text = BASE
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nprotocol = \"sctp\"");
    fails_once(
        &text,
        "listener[0].protocol",
        "\"sctp\"",
        "unknown protocol `sctp`, expected `http`, `tcp`, `queue` or `udp`",
    );
    let text = with("[naming]\nregistry = \"zookeeper\"\n");
    fails_once(
        &text,
        "naming.registry",
        "\"zookeeper\"",
        "unknown registry `zookeeper`, expected `embedded` or `etcd`",
    );
}

#[test]
fn percents_are_at_most_100() {
    for (line, field) in [
        ("panic_threshold_percent = 101", "cluster.app.panic_threshold_percent"),
        ("outlier = { max_ejected_percent = 200 }", "cluster.app.outlier.max_ejected_percent"),
        ("retry = { budget_percent = 101 }", "cluster.app.retry.budget_percent"),
        ("slow_start = { initial_percent = 101 }", "cluster.app.slow_start.initial_percent"),
    ] {
        let needle = line.rsplit(" = ").next().unwrap().trim_end_matches(" }");
        fails_once(&cluster_line(line), field, needle, "got");
    }
    fails_once(
        &cluster_line("panic_threshold_percent = 101"),
        "cluster.app.panic_threshold_percent",
        "101",
        "must be at most 100, got 101",
    );
    fails_once(
        &cluster_line("slow_start = { initial_percent = 0 }"),
        "cluster.app.slow_start.initial_percent",
        "0 }",
        "must be between 1 and 100, got 0",
    );
    ok(&cluster_line("panic_threshold_percent = 0\noutlier = { max_ejected_percent = 100 }"));
}

#[test]
fn health_counts_and_durations_must_be_positive() {
    for field in ["interval_ms", "timeout_ms", "rise", "fall"] {
        let text = cluster_line(&format!("health = {{ {field} = 0 }}"));
        fails_once(&text, &format!("cluster.app.health.{field}"), "0 }", "must be greater than 0");
    }
    for (line, field) in [
        ("retry = { attempts = 0 }", "cluster.app.retry.attempts"),
        ("retry = { per_try_timeout_ms = 0 }", "cluster.app.retry.per_try_timeout_ms"),
        ("agent = { timeout_ms = 0 }", "cluster.app.agent.timeout_ms"),
        ("ewma = { decay_ms = 0 }", "cluster.app.ewma.decay_ms"),
        ("session = { idle_timeout_ms = 0 }", "cluster.app.session.idle_timeout_ms"),
        ("hash = { ring_vnodes = 0 }", "cluster.app.hash.ring_vnodes"),
    ] {
        fails_once(&cluster_line(line), field, "0 }", "");
    }
    let text = BASE.replace("cluster = \"app\"", "cluster = \"app\"\nrequest_timeout_ms = 0");
    fails_once(&text, "route[0].request_timeout_ms", "0\n", "must be greater than 0");
    let text = BASE
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nmax_connections = 0");
    fails_once(&text, "listener[0].max_connections", "0\n", "must be greater than 0");
    let listener_line = |line: &str| {
        BASE.replace("listen = \"127.0.0.1:8080\"", &format!("listen = \"127.0.0.1:8080\"\n{line}"))
    };
    for (v, at) in [("0", "0\n"), ("65536", "65536")] {
        let text = listener_line(&format!("backlog = {v}"));
        let msg = format!("must be between 1 and 65535, got {v}");
        fails_once(&text, "listener[0].backlog", at, &msg);
    }
    assert_eq!(ok(&listener_line("backlog = 65535")).listeners[0].backlog, 65_535);
    for field in [
        "h2_keepalive_timeout_ms",
        "h2_shutdown_timeout_ms",
        "h2_max_resets",
        "body_read_timeout_ms",
    ] {
        let text = listener_line(&format!("{field} = 0"));
        fails_once(&text, &format!("listener[0].{field}"), "0\n", "must be greater than 0");
    }
    // A keepalive interval of 0 turns the PINGs off; a per-address budget under the
    // per-connection one is a mistake.
    let c = ok(&listener_line("h2_keepalive_interval_ms = 0\nh2_max_resets = 5000"));
    assert_eq!(c.listeners[0].http2.keepalive_interval, None);
    assert_eq!(c.listeners[0].http2.max_resets_per_address, 5000);
    let text = listener_line("h2_max_resets = 100\nh2_max_resets_per_address = 50");
    fails_once(
        &text,
        "listener[0].h2_max_resets_per_address",
        "50\n",
        "must be at least h2_max_resets (100), got 50",
    );
    let text = cluster_line("outlier = { base_ejection_ms = 5000, max_ejection_ms = 1000 }");
    fails_once(
        &text,
        "cluster.app.outlier.max_ejection_ms",
        "1000 }",
        "must be at least base_ejection_ms",
    );
}

#[test]
fn bounded_load_is_zero_or_at_least_one() {
    for bad in ["0.5", "0.99", "-1.0", "nan", "inf"] {
        let text = cluster_line(&format!("hash = {{ bounded_load = {bad} }}"));
        fails_once(
            &text,
            "cluster.app.hash.bounded_load",
            &format!("{bad} }}"),
            "must be 0 (off) or at least 1.0",
        );
    }
    for (good, want) in
        [("0", None), ("0.0", None), ("1", Some(1.0)), ("1.0", Some(1.0)), ("3.5", Some(3.5))]
    {
        let c = ok(&cluster_line(&format!("hash = {{ bounded_load = {good} }}")));
        assert_eq!(c.view.cluster("app").unwrap().policy.hash.bounded_load, want, "{good}");
    }
}

#[test]
fn expect_status_must_be_a_status_or_range() {
    for bad in ["2xx", "99", "600", "200-", "-200", "200-600", "300-200", ""] {
        let text = cluster_line(&format!("health = {{ path = \"/\", expect_status = \"{bad}\" }}"));
        fails_once(
            &text,
            "cluster.app.health.expect_status",
            &format!("\"{bad}\" }}"),
            &format!("`{bad}`"),
        );
    }
    let text = cluster_line("health = { path = \"/\", expect_status = \"300-200\" }");
    fails_once(
        &text,
        "cluster.app.health.expect_status",
        "\"300-200\"",
        "empty range: 300 is greater than 200",
    );
    let c = ok(&cluster_line("health = { path = \"/\", expect_status = \"100-599\" }"));
    let kind = c.view.cluster("app").unwrap().policy.health.clone().unwrap().kind;
    assert_eq!(kind, HealthCheckKind::Http { path: "/".into(), expect_min: 100, expect_max: 599 });
    let text = cluster_line("health = { kind = \"tcp\", path = \"/x\" }");
    fails_once(
        &text,
        "cluster.app.health.path",
        "\"/x\"",
        "only applies to health checks of kind `http`",
    );
    let text = cluster_line("health = { path = \"health\" }");
    fails_once(&text, "cluster.app.health.path", "\"health\"", "must start with `/`");
}

#[test]
fn admin_token_and_token_file_are_exclusive() {
    let text = with("[admin]\ntoken = \"a\"\ntoken_file = \"b\"\n");
    fails_once(&text, "admin.token_file", "\"b\"", "set `token` or `token_file`, not both");
    let text = with("[admin]\ntoken = \"\"\n");
    fails_once(&text, "admin.token", "\"\"", "token must not be empty");
}

#[test]
fn dns_settings_are_checked() {
    let text = with("[naming]\ndns_listen = \"127.0.0.1:0\"\ndns_zone = \"bad_zone.\"\n");
    fails_once(&text, "naming.dns_zone", "\"bad_zone.\"", "is not a DNS zone name");
    let text = with("[naming]\ndns_zone = \"rondo.\"\n");
    fails_once(&text, "naming.dns_zone", "\"rondo.\"", "only applies with `dns_listen`");
    let text = with("[naming]\ntoken = \"\"\n");
    fails_once(&text, "naming.token", "\"\"", "token must not be empty");
    let text = with("[naming]\ndns_listen = \"127.0.0.1:8080\"\n");
    fails_once(&text, "naming.dns_listen", "$\"127.0.0.1:8080\"", "already used by listener[0]");
}

#[test]
fn xds_settings_are_checked() {
    let c =
        parse_str(&with("[naming]\nxds = { listen = \"127.0.0.1:18000\" }\n"), Path::new(FILE), 1)
            .expect("valid");
    let xds = c.naming.and_then(|n| n.xds).expect("xds");
    assert_eq!(xds.listen, "127.0.0.1:18000".parse::<SocketAddr>().unwrap());
    assert_eq!(xds.max_clients, rondo_config::XdsSpec::DEFAULT_MAX_CLIENTS);
    let text = with("[naming]\nxds = { listen = \"nowhere\" }\n");
    fails_once(&text, "naming.xds.listen", "\"nowhere\"", "IP:PORT");
    let text = with("[naming]\nxds = { listen = \"127.0.0.1:0\", max_clients = 0 }\n");
    fails_once(&text, "naming.xds.max_clients", "0 }", "must be between 1 and 1000000");
    let text = with("[naming]\nxds = { listen = \"127.0.0.1:8080\" }\n");
    fails_once(&text, "naming.xds.listen", "\"127.0.0.1:8080\" }", "already used by listener[0]");
    let text = with("[naming]\nxds = { listen = \"127.0.0.1:0\", port = 1 }\n");
    fails_once(&text, "naming.xds.port", "port", "unknown field");
    // A build without the `xds` feature names it at the table.
    let text = with("[naming]\nxds = { listen = \"127.0.0.1:0\" }\n");
    let none = Features { dns: true, etcd: true, nats: true, xds: false, otel: true };
    let errs = parse_str_with(&text, Path::new(FILE), 1, none).unwrap_err().errors;
    assert_eq!(errs.len(), 1, "{}", render(&errs));
    assert_eq!(errs[0].field, "naming.xds");
    assert!(errs[0].message.contains("`xds` cargo feature"), "{}", errs[0]);
}

#[test]
fn etcd_needs_endpoints() {
    let text = with("[naming]\nregistry = \"etcd\"\n");
    fails_once(&text, "naming.registry", "\"etcd\"", "registry `etcd` needs `etcd_endpoints`");
    let text = with("[naming]\nregistry = \"etcd\"\netcd_endpoints = []\n");
    fails_once(&text, "naming.registry", "\"etcd\"", "needs `etcd_endpoints`");
    let text = with("[naming]\nregistry = \"etcd\"\netcd_endpoints = [\"etcd\"]\n");
    fails_once(&text, "naming.etcd_endpoints[0]", "\"etcd\"]", "is not host:port");
    let text = with("[naming]\netcd_endpoints = [\"etcd:2379\"]\n");
    fails_once(
        &text,
        "naming.etcd_endpoints",
        "[\"etcd:2379\"]",
        "only applies to registry `etcd`",
    );
    let text =
        with("[naming]\nregistry = \"etcd\"\netcd_endpoints = [\"e:1\"]\nsnapshot = \"s\"\n");
    fails_once(&text, "naming.snapshot", "\"s\"", "only applies to registry `embedded`");
}

/// BASE plus a tcp listener `db`, a tcp cluster `db` and `route_extra` on the tcp route.
fn tcp_config(route_extra: &str) -> String {
    with(&format!(
        "[[listener]]\nname = \"db\"\nlisten = \"127.0.0.1:5433\"\nprotocol = \"tcp\"\n\
         [[route]]\nlistener = \"db\"\ncluster = \"db\"\n{route_extra}\n\
         [cluster.db]\nupstream_protocol = \"tcp\"\nmembers = [{{ name = \"d\", address = \"127.0.0.1:9100\" }}]\n"
    ))
}

#[test]
fn tcp_routes_cannot_match_on_http_facts() {
    ok(&tcp_config(""));
    ok(&tcp_config("match = {}"));
    let text = tcp_config("match = { host = \"a.example\", headers = { x = \"1\" } }");
    fails_once(&text, "route[1].match", "{ host", "cannot match on `host` or `headers`");
    let text = tcp_config("match = { method = \"GET\" }");
    fails_once(
        &text,
        "route[1].match",
        "{ method",
        "route on tcp listener `db` cannot match on `method`",
    );
}

#[test]
fn tcp_listeners_have_no_body_read_timeout() {
    let text = tcp_config("").replace("5433\"\n", "5433\"\nbody_read_timeout_ms = 5000\n");
    fails_once(
        &text,
        "listener[1].body_read_timeout_ms",
        "5000",
        "tcp listeners read no request bodies",
    );
}

#[test]
fn listener_and_upstream_protocols_must_agree() {
    let text = tcp_config("").replace("cluster = \"db\"\n", "cluster = \"app\"\n");
    fails_once(
        &text,
        "route[1].cluster",
        "$\"app\"\n\n[cluster.db]",
        "tcp listener `db` cannot route to cluster `app` with upstream_protocol `http1`, it needs `tcp`",
    );
    let text = tcp_config("backups = [\"app\"]");
    fails_once(&text, "route[1].backups[0]", "\"app\"]", "it needs `tcp`");
    let text = tcp_config("").replacen("cluster = \"app\"\n", "cluster = \"db\"\n", 1);
    fails_once(
        &text,
        "route[0].cluster",
        "\"db\"",
        "http listener `web` cannot route to cluster `db` with upstream_protocol `tcp`, it needs `http1` or `http2`",
    );
}

#[test]
fn a_tcp_listener_takes_one_route_without_sni() {
    let text =
        tcp_config("") + "[[route]]\nname = \"second\"\nlistener = \"db\"\ncluster = \"db\"\n";
    fails_once(
        &text,
        "route[2].listener",
        "$\"db\"\ncluster = \"db\"",
        "tcp listener `db` already has route `route-2` without `match.sni`; a tcp listener takes one route without `sni`",
    );
    // Routes with `sni` come on top, before or after it.
    let text = tcp_config("")
        + "[[route]]\nname = \"a\"\nlistener = \"db\"\nmatch = { sni = \"A.db.test\" }\ncluster = \"db\"\n\
           [[route]]\nname = \"w\"\nlistener = \"db\"\nmatch = { sni = \"*.db.test\" }\ncluster = \"db\"\n";
    let c = rondo_config::parse_str(&text, Path::new("t.toml"), 1).unwrap();
    assert_eq!(c.view.routes[2].matcher.sni.as_deref(), Some("a.db.test"));
    assert!(c.view.routes[2].matcher.matches_sni(Some("A.DB.test")));
    assert!(!c.view.routes[2].matcher.matches_sni(None));
    assert!(c.view.routes[3].matcher.matches_sni(Some("b.db.test")));
    assert!(!c.view.routes[3].matcher.matches_sni(Some("db.test")));
    assert!(c.view.routes[1].matcher.matches_sni(None), "the catch-all takes clients without sni");
    // An sni route after the same sni is never used (a warning); sni on http is an error.
    let dup = text.clone()
        + "[[route]]\nname = \"a2\"\nlistener = \"db\"\nmatch = { sni = \"b.db.test\" }\ncluster = \"db\"\n";
    let c = rondo_config::parse_str(&dup, Path::new("t.toml"), 1).unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].message.contains("route `a2` is never used"), "{}", c.warnings[0]);
    let text = tcp_config("").replacen(
        "cluster = \"app\"\n",
        "match = { sni = \"x.test\" }\ncluster = \"app\"\n",
        1,
    );
    fails_once(&text, "route[0].match.sni", "\"x.test\"", "cannot match on `sni`");
    let text = tcp_config("")
        + "[[route]]\nname = \"bad\"\nlistener = \"db\"\nmatch = { sni = \"a b\" }\ncluster = \"db\"\n";
    fails_once(&text, "route[2].match.sni", "\"a b\"", "is not a DNS name");
}

#[test]
fn a_tcp_cluster_hashes_only_on_the_client_address() {
    let text = tcp_config("").replace(
        "upstream_protocol = \"tcp\"\n",
        "upstream_protocol = \"tcp\"\nalgorithm = \"hash\"\nhash = { key = \"header:x\" }\n",
    );
    fails_once(&text, "cluster.db.hash.key", "\"header:x\"", "can only hash on `client-address`");
}

#[test]
fn route_match_values_are_checked() {
    let m = |m: &str| BASE.replace("cluster = \"app\"", &format!("cluster = \"app\"\nmatch = {m}"));
    fails_once(
        &m("{ path_prefix = \"api\" }"),
        "route[0].match.path_prefix",
        "\"api\"",
        "must start with `/`",
    );
    fails_once(&m("{ method = [] }"), "route[0].match.method", "[]", "at least one method");
    fails_once(
        &m("{ method = \"GE T\" }"),
        "route[0].match.method",
        "\"GE T\"",
        "not an HTTP method",
    );
    fails_once(
        &m("{ method = [\"GET\", \"P UT\"] }"),
        "route[0].match.method[1]",
        "\"P UT\"",
        "not an HTTP method",
    );
    fails_once(
        &m("{ host = \"a.example:80\" }"),
        "route[0].match.host",
        "\"a.example:80\"",
        "must not include a port",
    );
    fails_once(
        &m("{ host = \"*\" }"),
        "route[0].match.host",
        "\"*\"",
        "not a host name or `*.` wildcard",
    );
    fails_once(
        &m("{ headers = { \"bad name\" = \"v\" } }"),
        "route[0].match.headers.\"bad name\"",
        "\"v\"",
        "not a header name",
    );
    let errs = errors(&m("{ headers = { \"X-A\" = \"1\", \"x-a\" = \"2\" } }"));
    assert_eq!(errs.len(), 1, "{}", render(&errs));
    assert!(errs[0].message.contains("listed twice"), "{}", errs[0]);
}

#[test]
fn names_must_be_non_empty() {
    let text = BASE.replace("name = \"a1\"", "name = \"\"");
    fails_once(&text, "cluster.app.members[0].name", "\"\"", "member name must not be empty");
    let text = BASE.replace("name = \"web\"", "name = \"my web\"");
    let errs = errors(&text);
    assert!(
        errs.iter().any(|e| e.field == "listener[0].name" && e.message.contains("white space")),
        "{}",
        render(&errs)
    );
    let text = with("[router]\ngroup = \"\"\n");
    fails_once(&text, "router.group", "\"\"", "group must not be empty");
}

#[test]
fn revocations_file_is_relative_to_the_config_file_and_not_empty() {
    let c = ok(&with("[router]\nrevocations_file = \"state/revoked\"\n"));
    assert_eq!(c.router.revocations_file, Some(Path::new("conf/state/revoked").to_path_buf()));
    assert_eq!(ok(BASE).router.revocations_file, None, "default: none (the snapshot's, if any)");
    let text = with("[router]\nrevocations_file = \"\"\n");
    fails_once(&text, "router.revocations_file", "\"\"", "path must not be empty");
}

#[test]
fn errors_display_one_per_line() {
    let text = BASE
        .replace("cluster = \"app\"", "cluster = \"x\"")
        .replace("weight", "w")
        .replace("address = \"127.0.0.1:9001\"", "address = \"127.0.0.1:9001\", weight = 0");
    let errs = parse_str(&text, Path::new(FILE), 1).unwrap_err();
    assert_eq!(errs.len(), 2);
    let shown = errs.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with("conf/rondo.toml:8:11: field `route[0].cluster`: unknown cluster `x`"),
        "{shown}"
    );
    assert!(lines[1].starts_with("conf/rondo.toml:11:"), "{shown}");
    let as_error: &dyn std::error::Error = &errs;
    assert_eq!(as_error.to_string(), shown);
}

#[test]
fn agent_receiver_and_misses() {
    use rondo_config::{AgentKey, AgentSpec};
    let timeout = |c: &Config| c.view.cluster("app").unwrap().policy.agent.timeout;
    // No [agent]: the core's default, three 200 ms heartbeats.
    let c = ok(BASE);
    assert_eq!(c.agent, None);
    assert_eq!(timeout(&c), AgentPolicy::default().timeout);

    let c = ok(&with("[agent]\nkey = \"k\"\n"));
    assert_eq!(
        c.agent,
        Some(AgentSpec {
            listen: AgentSpec::DEFAULT_LISTEN.parse().unwrap(),
            key: AgentKey::Inline("k".into()),
            interval: Duration::from_millis(200),
            tls: None,
        })
    );
    assert_eq!(timeout(&c), Duration::from_millis(600));

    // timeout = interval x misses; misses defaults to 3; timeout_ms still works.
    let text = cluster_line("agent = { misses = 5 }")
        + "[agent]\nlisten = \"127.0.0.1:9990\"\nkey_file = \"agent.key\"\ninterval_ms = 100\n";
    let c = ok(&text);
    let a = c.agent.as_ref().unwrap();
    assert_eq!(a.key, AgentKey::File(Path::new("conf").join("agent.key")));
    assert_eq!(a.interval, Duration::from_millis(100));
    assert_eq!(timeout(&c), Duration::from_millis(500));
    let c = ok(&(cluster_line("agent = {}") + "[agent]\nkey = \"k\"\ninterval_ms = 100\n"));
    assert_eq!(timeout(&c), Duration::from_millis(300));
    let c = ok(&(cluster_line("agent = { timeout_ms = 900 }") + "[agent]\nkey = \"k\"\n"));
    assert_eq!(timeout(&c), Duration::from_millis(900));

    fails_once(
        &cluster_line("agent = { misses = 0 }"),
        "cluster.app.agent.misses",
        "0 }",
        "must be between 1 and 1000, got 0",
    );
    fails_once(
        &cluster_line("agent = { misses = 2, timeout_ms = 500 }"),
        "cluster.app.agent.misses",
        "2,",
        "set `misses` or `timeout_ms`, not both",
    );
    fails_once(&with("[agent]\n"), "agent", "[agent]", "needs `key` or `key_file`");
    fails_once(
        &with("[agent]\nkey = \"k\"\nkey_file = \"f\"\n"),
        "agent.key_file",
        "\"f\"",
        "set `key` or `key_file`, not both",
    );
    fails_once(&with("[agent]\nkey = \"\"\n"), "agent.key", "\"\"", "must not be empty");
    fails_once(
        &with("[agent]\nkey = \"k\"\ninterval_ms = 0\n"),
        "agent.interval_ms",
        "0\n",
        "must be between 1 and 60000, got 0",
    );
    fails_once(
        &with("[agent]\nkey = \"k\"\ninterval_ms = 9223372036854775807\n"),
        "agent.interval_ms",
        "9223372036854775807",
        "must be between 1 and 60000",
    );
    let c = ok(&(cluster_line("agent = { misses = 1000 }")
        + "[agent]\nkey = \"k\"\ninterval_ms = 60000\n"));
    assert_eq!(timeout(&c), Duration::from_secs(60_000));
    fails_once(
        &with("[agent]\nkey = \"k\"\nlisten = \"nowhere\"\n"),
        "agent.listen",
        "\"nowhere\"",
        "is not a socket address",
    );
    fails_once(
        &with("[agent]\nkey = \"k\"\nlisten = \"127.0.0.1:8080\"\n"),
        "agent.listen",
        "$\"127.0.0.1:8080\"",
        "already used by listener[0].listen",
    );
    // The key never shows in debug output.
    let c = ok(&with("[agent]\nkey = \"s3cret\"\n"));
    assert!(!format!("{c:?}").contains("s3cret"));
}

#[test]
fn error_detail_is_brief_beyond_loopback_unless_set() {
    let listener = |listen: &str, extra: &str| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"{listen}\"\n{extra}\n[[route]]\nlistener = \"web\"\ncluster = \"app\"\n[cluster.app]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9001\" }}]\n"
        )
    };
    let detail = |text: &str| ok(text).listeners[0].error_detail;
    assert_eq!(detail(&listener("0.0.0.0:8080", "")), ErrorDetail::Brief);
    assert_eq!(detail(&listener("[::]:8080", "")), ErrorDetail::Brief);
    assert_eq!(detail(&listener("[::1]:8080", "")), ErrorDetail::Full);
    assert_eq!(detail(&listener("0.0.0.0:8080", "error_detail = \"full\"")), ErrorDetail::Full);
    assert_eq!(detail(&listener("127.0.0.1:8080", "error_detail = \"brief\"")), ErrorDetail::Brief);
    let text = render(&errors(&listener("127.0.0.1:8080", "error_detail = \"loud\"")));
    assert!(text.contains("listener[0].error_detail") && text.contains("`brief`"), "{text}");
}

// ---- warnings ----

/// A valid config with one listener `web`, one route to cluster `c` and nothing to warn about.
const QUIET: &str = r#"
[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [{ name = "a", address = "127.0.0.1:9101" }]
"#;

/// The warnings of `text` (which must be valid).
fn warnings(text: &str) -> Vec<ConfigError> {
    ok(text).warnings
}

/// Asserts `text` has exactly one warning, on `field`, at `needle`, containing `message`.
#[track_caller]
fn warns_once(text: &str, field: &str, needle: &str, message: &str) {
    let w = warnings(text);
    assert_eq!(w.len(), 1, "expected one warning:\n{}", render(&w));
    let w = &w[0];
    assert_eq!(w.file, PathBuf::from(FILE));
    assert_eq!(w.field, field, "{w}");
    assert_eq!((w.line, w.column), pos(text, needle), "{w}");
    assert!(w.message.contains(message), "{w}");
    assert!(
        w.as_warning()
            .starts_with(&format!("{FILE}:{}:{}: warning: field `{field}`: ", w.line, w.column)),
        "{}",
        w.as_warning()
    );
}

#[test]
fn a_plain_config_has_no_warnings() {
    assert_eq!(warnings(QUIET), vec![]);
    // The example is warning-free too.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rondo.toml");
    let c = load_file(&example, 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.warnings, vec![], "{}", render(&c.warnings));
}

#[test]
fn an_admin_api_without_a_token_warns() {
    let text = format!("{QUIET}\n[admin]\nlisten = \"127.0.0.1:9900\"\n");
    warns_once(&text, "admin", "[admin]", "refuses every call with 403");
    assert_eq!(warnings(&format!("{QUIET}\n[admin]\ntoken = \"t\"\n")), vec![]);
}

#[test]
fn an_agent_fed_algorithm_without_an_agent_table_warns() {
    for algorithm in ["least-cpu", "most-free-memory"] {
        let text =
            QUIET.replace("[cluster.c]\n", &format!("[cluster.c]\nalgorithm = \"{algorithm}\"\n"));
        warns_once(&text, "cluster.c.algorithm", &format!("\"{algorithm}\""), "no [agent] table");
        assert_eq!(warnings(&format!("{text}\n[agent]\nkey = \"k\"\n")), vec![]);
    }
    let text = QUIET.replace("[cluster.c]\n", "[cluster.c]\nalgorithm = \"least-sessions\"\n");
    assert_eq!(warnings(&text), vec![]);
}

#[test]
fn a_route_after_a_catch_all_on_the_same_listener_warns() {
    let text = format!(
        "{QUIET}\n[[route]]\nname = \"late\"\nlistener = \"web\"\nmatch = {{ path_prefix = \"/api\" }}\ncluster = \"c\"\n"
    );
    warns_once(
        &text,
        "route[1]",
        "$[[route]]",
        "route `late` is never used: route `route-1` (route[0])",
    );
    // The same route first, or on another listener, is fine.
    let first = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n[[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/api\" }}\ncluster = \"c\"\n{}",
        QUIET.split_once("listen = \"127.0.0.1:8080\"\n").unwrap().1
    );
    assert_eq!(warnings(&first), vec![], "{first}");
    let other = format!(
        "{QUIET}\n[[listener]]\nname = \"api\"\nlisten = \"127.0.0.1:8081\"\n\n[[route]]\nlistener = \"api\"\nmatch = {{ path_prefix = \"/api\" }}\ncluster = \"c\"\n"
    );
    assert_eq!(warnings(&other), vec![]);
    // Not only catch-alls: a narrower route after a broader one that covers it.
    let narrower = format!(
        "{QUIET}\n[[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/a\" }}\ncluster = \"c\"\n\n[[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/ab\", method = \"GET\" }}\ncluster = \"c\"\n"
    )
    .replacen("[[route]]\nlistener = \"web\"\ncluster = \"c\"\n", "", 1);
    warns_once(&narrower, "route[1]", "$[[route]]", "matches every request this one matches");
}

#[test]
fn a_cluster_no_route_refers_to_warns_unless_naming_serves_it() {
    let text = format!(
        "{QUIET}\n[cluster.spare]\nmembers = [{{ name = \"s\", address = \"127.0.0.1:9102\" }}]\n"
    );
    warns_once(
        &text,
        "cluster.spare",
        "[cluster.spare]",
        "no route or backup refers to cluster `spare`",
    );
    // A backup counts.
    let backup = text.replace("cluster = \"c\"\n", "cluster = \"c\"\nbackups = [\"spare\"]\n");
    assert_eq!(warnings(&backup), vec![]);
    // With a naming service, clients look it up by name.
    assert_eq!(warnings(&format!("{text}\n[naming]\nlisten = \"127.0.0.1:9901\"\n")), vec![]);
}

// ---- features this build lacks ----

#[test]
fn settings_a_build_lacks_the_feature_for_are_errors_naming_the_feature() {
    let dns = format!("{QUIET}\n[naming]\ndns_listen = \"127.0.0.1:5353\"\n");
    let etcd =
        format!("{QUIET}\n[naming]\nregistry = \"etcd\"\netcd_endpoints = [\"127.0.0.1:2379\"]\n");
    let both = format!(
        "{QUIET}\n[naming]\nregistry = \"etcd\"\netcd_endpoints = [\"127.0.0.1:2379\"]\ndns_listen = \"127.0.0.1:5353\"\n"
    );
    let with = |text: &str, features| {
        parse_str_with(text, Path::new(FILE), 1, features).map_err(|e| e.errors)
    };
    for text in [&dns, &etcd, &both] {
        assert!(with(text, Features::ALL).is_ok());
    }
    let errs = with(&dns, Features { dns: false, etcd: true, nats: true, xds: true, otel: true })
        .unwrap_err();
    assert_eq!(errs.len(), 1, "{}", render(&errs));
    assert_eq!(errs[0].field, "naming.dns_listen");
    assert_eq!((errs[0].line, errs[0].column), pos(&dns, "\"127.0.0.1:5353\""));
    assert!(errs[0].message.contains("`dns` cargo feature"), "{}", errs[0]);
    assert!(errs[0].message.contains("--features dns"), "{}", errs[0]);

    let errs = with(&etcd, Features { dns: true, etcd: false, nats: true, xds: true, otel: true })
        .unwrap_err();
    assert_eq!(errs.len(), 1, "{}", render(&errs));
    assert_eq!(errs[0].field, "naming.registry");
    assert_eq!((errs[0].line, errs[0].column), pos(&etcd, "\"etcd\""));
    assert!(errs[0].message.contains("`etcd` cargo feature"), "{}", errs[0]);

    let errs = with(&both, Features::NONE).unwrap_err();
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["naming.registry", "naming.dns_listen"], "{}", render(&errs));
    // Reported with the file's other errors, not instead of them.
    let broken = both.replace("address = \"127.0.0.1:9101\"", "address = \"nowhere\"");
    let errs = with(&broken, Features::NONE).unwrap_err();
    assert_eq!(errs.len(), 3, "{}", render(&errs));
    assert_eq!(
        Features { dns: true, etcd: false, nats: false, xds: false, otel: false }.names(),
        ["dns"]
    );
    assert_eq!(Features::ALL.names(), ["dns", "etcd", "nats", "otel", "xds"]);
}

// ---- the reference (docs/config.md) ----

/// The reference's rows: the first cell's code span of every table row, e.g. `cluster.NAME.algorithm`.
fn reference_rows() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md");
    let text = std::fs::read_to_string(&doc).expect("docs/config.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(f, _)| f.to_owned()))
        .collect()
}

#[test]
fn the_reference_documents_every_field_of_the_schema() {
    let rows = reference_rows();
    let fields = rondo_config::schema_fields();
    assert!(fields.len() > 80, "the schema walk found only {fields:?}");
    // A listener's filters are a route's: documented once, under `route.filters`.
    // `[defaults]`'s fields are a cluster's or a route's: documented there.
    let documented =
        |f: &String| match (f.strip_prefix("listener.filters."), f.strip_prefix("defaults.")) {
            (Some(rest), _) => rows.contains(&format!("route.filters.{rest}")),
            (_, Some(rest)) => {
                rows.contains(&format!("cluster.NAME.{rest}"))
                    || rows.contains(&format!("route.{rest}"))
            }
            _ => rows.contains(f),
        };
    let missing: Vec<&String> = fields.iter().filter(|f| !documented(f)).collect();
    assert!(
        missing.is_empty(),
        "docs/config.md has no row (`| `FIELD` | type | default | meaning |`) for: {missing:?}"
    );
    let unknown: Vec<&String> = rows.iter().filter(|r| !fields.contains(r)).collect();
    assert!(unknown.is_empty(), "docs/config.md documents fields the schema lacks: {unknown:?}");
}

#[test]
fn the_example_writes_no_registry_snapshot_into_the_checkout() {
    // Running `rondo serve examples/rondo.toml` from a checkout must not create files in it.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rondo.toml");
    let c = load_file(&example, 1).unwrap_or_else(|e| panic!("{e}"));
    let naming = c.naming.expect("the example has a naming service");
    assert_eq!(naming.registry, RegistrySpec::Embedded { snapshot: None });
}

#[test]
fn control_characters_in_echoed_values_and_keys_are_escaped() {
    // A value with an escape sequence and a newline, echoed by the compiler's message.
    let text = with("[cluster.other]\nalgorithm = \"rr\\u001b[2J\\nforged: line\"\nmembers = []\n");
    let errs = errors(&text);
    let e = errs.iter().find(|e| e.field == "cluster.other.algorithm").expect("algorithm error");
    assert!(
        e.message.starts_with("unknown algorithm `rr\\u{1b}[2J\\nforged: line`, expected"),
        "{e}"
    );
    // A key with a control character, echoed in the field path and in the parser's message.
    let text = with("[cluster.\"x\\u0007y\"]\nalgorithm = \"random\"\nmembers = []\nbogus = 1\n");
    let errs = errors(&text);
    assert!(errs.iter().any(|e| e.field.contains("x\\u{7}y")), "{}", render(&errs));
    // The file name too (a path can hold anything).
    let errs = parse_str("[router]\nbogus = 1\n", Path::new("a\nb.toml"), 1).unwrap_err();
    for e in errs.iter().chain(&errs.errors) {
        let shown = e.to_string();
        assert!(!shown.chars().any(char::is_control), "raw control character in {shown:?}");
        assert!(!e.message.chars().any(char::is_control), "{:?}", e.message);
        assert!(!e.field.chars().any(char::is_control), "{:?}", e.field);
    }
    for e in &errs {
        assert!(e.to_string().starts_with("a\\nb.toml:"), "{e}");
    }
}

#[test]
fn log_and_access_log_settings_compile() {
    let c = ok(BASE);
    assert_eq!(c.log, LogSpec { format: LogFormat::Text, level: None }, "defaults");
    assert_eq!(c.listeners[0].access_log, None, "no access log by default");

    let text = BASE.replace(
        "listen = \"127.0.0.1:8080\"\n",
        "listen = \"127.0.0.1:8080\"\naccess_log = { path = \"logs/access.log\", format = \"json\" }\n",
    ) + "\n[log]\nformat = \"json\"\nlevel = \"debug\"\n";
    let c = ok(&text);
    assert_eq!(c.log, LogSpec { format: LogFormat::Json, level: Some("debug".into()) });
    assert_eq!(
        c.listeners[0].access_log,
        Some(AccessLogSpec {
            // Relative to the config file's directory.
            target: AccessLogTarget::File(PathBuf::from("conf/logs/access.log")),
            format: LogFormat::Json,
            fields: None,
            template: None,
        })
    );
    let stdout = BASE.replace(
        "listen = \"127.0.0.1:8080\"\n",
        "listen = \"127.0.0.1:8080\"\naccess_log = { path = \"-\" }\n",
    );
    assert_eq!(
        ok(&stdout).listeners[0].access_log,
        Some(AccessLogSpec {
            target: AccessLogTarget::Stdout,
            format: LogFormat::Text,
            fields: None,
            template: None,
        })
    );
}

#[test]
fn bad_log_settings_are_located() {
    let text = with("\n[log]\nformat = \"xml\"\n");
    fails_once(&text, "log.format", "\"xml\"", "unknown log format `xml`, expected");
    let text = with("\n[log]\nlevel = \"loud\"\n");
    fails_once(&text, "log.level", "\"loud\"", "unknown log level `loud`, expected");
    let text = BASE.replace(
        "listen = \"127.0.0.1:8080\"\n",
        "listen = \"127.0.0.1:8080\"\naccess_log = { path = \"a.log\", format = \"csv\" }\n",
    );
    fails_once(&text, "listener[0].access_log.format", "\"csv\"", "unknown log format `csv`");
    let text = BASE.replace(
        "listen = \"127.0.0.1:8080\"\n",
        "listen = \"127.0.0.1:8080\"\naccess_log = { path = \"\" }\n",
    );
    fails_once(&text, "listener[0].access_log.path", "\"\" }", "path must not be empty");
}

#[test]
fn naming_caps_and_allowed_hosts() {
    let c = ok(&with(
        "[naming]\nmax_registrations_per_service = 5\nmax_registrations = 7\n\
         allowed_hosts = [\"Naming.Example\", \"10.0.0.5\", \"[fd00::1]\"]\n",
    ));
    let n = c.naming.unwrap();
    assert_eq!((n.max_registrations_per_service, n.max_registrations), (5, 7));
    assert_eq!(n.allowed_hosts, ["naming.example", "10.0.0.5", "[fd00::1]"]);
    let text = with("[naming]\nmax_registrations = 0\n");
    fails_once(&text, "naming.max_registrations", "0\n", "must be between 1 and 1000000, got 0");
    let text = with("[naming]\nmax_registrations_per_service = 2000000\n");
    fails_once(&text, "naming.max_registrations_per_service", "2000000", "got 2000000");
    let text = with("[naming]\nallowed_hosts = [\"ok.example\", \"evil.example:80\"]\n");
    fails_once(&text, "naming.allowed_hosts[1]", "\"evil.example:80\"", "is not a host name");
}

#[test]
fn a_naming_api_beyond_loopback_needs_a_token() {
    let text = with("[naming]\nlisten = \"0.0.0.0:9901\"\n");
    fails_once(
        &text,
        "naming.listen",
        "\"0.0.0.0:9901\"",
        "the naming API on `0.0.0.0:9901` is reachable beyond loopback: set `token` or `token_file`",
    );
    ok(&with("[naming]\nlisten = \"0.0.0.0:9901\"\ntoken = \"s3\"\n"));
    ok(&with("[naming]\nlisten = \"[::1]:9901\"\n"));
}

#[test]
fn a_member_at_one_of_the_configs_own_addresses_is_refused() {
    let member = "members = [{ name = \"a1\", address = \"127.0.0.1:9001\" }]";
    for (address, own, field) in [
        ("127.0.0.1:8080", "", "listener[0].listen"),
        ("localhost:8080", "", "listener[0].listen"),
        ("127.0.0.1:9900", "[admin]\n", "admin.listen"),
        ("127.0.0.1:9901", "[naming]\n", "naming.listen"),
        ("0.0.0.0:9902", "[agent]\nkey = \"k\"\n", "agent.listen"),
    ] {
        let text = format!(
            "{}{own}",
            BASE.replace(
                member,
                &format!("members = [{{ name = \"a1\", address = \"{address}\" }}]")
            )
        );
        fails_once(
            &text,
            "cluster.app.members[0].address",
            &format!("$\"{address}\""),
            &format!("member address `{address}` is this router's own {field}"),
        );
    }
    // A listener on every address: any loopback address with its port is this router.
    let text = BASE
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"0.0.0.0:8080\"")
        .replace(member, "members = [{ name = \"a1\", address = \"127.0.0.3:8080\" }]");
    fails_once(
        &text,
        "cluster.app.members[0].address",
        "\"127.0.0.3:8080\"",
        "own listener[0].listen",
    );
    // Another port, or another host with the same port, is another server.
    ok(&BASE.replace(member, "members = [{ name = \"a1\", address = \"127.0.0.1:8081\" }]"));
    ok(&BASE.replace(member, "members = [{ name = \"a1\", address = \"10.0.0.1:8080\" }]"));
}

#[test]
fn address_reaches_matches_ports_and_local_addresses() {
    let at = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert!(rondo_config::address_reaches("127.0.0.1:80", at("127.0.0.1:80")));
    assert!(rondo_config::address_reaches("LOCALHOST:80", at("[::]:80")));
    assert!(rondo_config::address_reaches("[::1]:80", at("[::]:80")));
    assert!(rondo_config::address_reaches("[::ffff:127.0.0.1]:80", at("127.0.0.1:80")));
    assert!(rondo_config::address_reaches("0.0.0.0:80", at("10.0.0.1:80")));
    assert!(!rondo_config::address_reaches("127.0.0.1:81", at("127.0.0.1:80")));
    assert!(!rondo_config::address_reaches("10.0.0.2:80", at("10.0.0.1:80")));
    assert!(!rondo_config::address_reaches("example.com:80", at("0.0.0.0:80")));
    assert!(!rondo_config::address_reaches("127.0.0.1:80", at("10.0.0.1:80")));
}

#[test]
fn a_route_auth_compiles_and_its_faults_are_named() {
    // The keys file is read when the config compiles: one HMAC key, and files without one.
    let dir = std::env::temp_dir().join(format!("rondo-config-jwks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        r#"{"keys": [{"kty": "oct", "kid": "k1", "k": "YSBzZWNyZXQgb2YgZXhhY3RseSB0aGlydHktdHdvIGI"}]}"#,
    )
    .unwrap();
    let route = |keys: &std::path::Path| {
        BASE.replace(
            "cluster = \"app\"\n",
            &format!(
                "cluster = \"app\"\nauth = {{ issuer = \"https://id.test\", audience = \"orders\", \
                 keys = \"{}\", require = {{ scope = \"orders\" }}, claims = [\"Email\"] }}\n",
                keys.display()
            ),
        )
    };
    let c = ok(&route(&jwks));
    let auth = c.view.routes[0].auth.as_ref().expect("auth");
    assert_eq!(auth.issuer, "https://id.test");
    assert_eq!(auth.require, vec![("scope".to_owned(), "orders".to_owned())]);
    assert_eq!(auth.claims, vec!["Email".to_owned()], "claims keep their case for the lookup");
    assert_eq!(auth.keys, jwks);
    // A missing file, a file that is not a JWKS, and one with only unusable keys (P-384) are
    // each an error at `auth.keys` naming the file.
    let not_jwks = dir.join("not.json");
    std::fs::write(&not_jwks, "[1, 2]").unwrap();
    let short = dir.join("short.json");
    std::fs::write(&short, r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"}]}"#)
        .unwrap();
    let p384 = dir.join("p384.json");
    std::fs::write(&p384, r#"{"keys": [{"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"}]}"#)
        .unwrap();
    for (file, says) in [
        (dir.join("missing.json"), "cannot read auth keys"),
        (not_jwks, "are not a JWKS document"),
        (p384, "hold no usable key"),
        // An HMAC key of 20 bytes is under the 32 RFC 7518 asks for HS256.
        (short, "hold no usable key"),
    ] {
        let errs = errors(&route(&file));
        let e = errs
            .iter()
            .find(|e| e.field == "route[0].auth.keys")
            .unwrap_or_else(|| panic!("{}", render(&errs)));
        assert!(e.message.contains(says) && e.message.contains(&*file.to_string_lossy()), "{e}");
        assert!(e.line > 1, "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();

    let text = BASE.replace(
        "cluster = \"app\"\n",
        "cluster = \"app\"\nauth = { issuer = \"\", audience = \"a\", keys = \"k.json\", \
         claims = [\"no good\"] }\n",
    );
    let errs = errors(&text);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert!(fields.contains(&"route[0].auth.issuer"), "{}", render(&errs));
    assert!(fields.contains(&"route[0].auth.claims[0]"), "{}", render(&errs));

    let text = with("[router]\ntier_key = \"short\"\n");
    let errs = errors(&text);
    assert!(errs.iter().any(|e| e.field == "router.tier_key" && e.message.contains("16 bytes")));
}

// ---- declared clusters (`[naming] allow_registered_clusters`) ----

const DECLARED_ROUTE: &str = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
    [[route]]\nlistener = \"web\"\ncluster = \"orders\"\nbackups = [\"spare\"]\n\n";

#[test]
fn a_route_may_name_a_declared_cluster_only_with_allow_registered_clusters() {
    let off = format!("{DECLARED_ROUTE}[naming]\nlisten = \"127.0.0.1:0\"\n");
    let errs = errors(&off);
    assert_eq!(errs.len(), 2, "{}", render(&errs));
    assert_eq!(errs[0].field, "route[0].cluster");
    assert!(errs[0].message.starts_with("unknown cluster `orders`"), "{}", errs[0]);
    assert_eq!(errs[1].field, "route[0].backups[0]");

    let on = format!("{off}allow_registered_clusters = true\n");
    let c = ok(&on);
    assert!(c.naming.as_ref().unwrap().allow_registered_clusters);
    assert_eq!(c.view.routes[0].cluster, "orders");
    assert!(c.view.clusters.is_empty());
    let warned: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(warned, ["route[0].cluster", "route[0].backups[0]"], "{:?}", c.warnings);
    assert!(c.warnings[0].message.contains("not in the file"), "{}", c.warnings[0]);
}

#[test]
fn a_declared_policy_compiles_like_a_cluster_table_with_its_fields_under_policy() {
    use rondo_config::compile_declared_policy;
    let policy = serde_json::json!({
        "algorithm": "hash",
        "hash": { "key": "header:x-user", "table": "maglev" },
        "retry": { "attempts": 3 },
        "locality": { "prefer_local": false },
        "session": { "cookie": "orders-session" },
        "health": { "path": "/health", "interval_ms": 500 },
    });
    let spec = compile_declared_policy("orders", &policy).expect("compiles");
    assert_eq!(spec.name, "orders");
    assert!(spec.members.is_empty());
    assert_eq!(spec.policy.algorithm, rondo_core::Algorithm::Hash);
    assert_eq!(spec.policy.hash.key, rondo_core::HashKeySource::Header("x-user".into()));
    assert_eq!(spec.policy.retry.attempts, 3);
    assert!(!spec.policy.locality.prefer_local);
    assert_eq!(spec.sticky.cookie, "orders-session");
    assert_eq!(spec.policy.health.as_ref().unwrap().interval, Duration::from_millis(500));
    // The empty policy is the default one, as an empty `[cluster.NAME]` table is.
    let empty = compile_declared_policy("orders", &serde_json::json!({})).unwrap();
    assert_eq!(empty.policy, rondo_core::Policy::default());

    let fails = |v: serde_json::Value| compile_declared_policy("orders", &v).unwrap_err().0;
    let e = fails(serde_json::json!({ "algorithm": "fastest" }));
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("policy.algorithm: unknown algorithm `fastest`, expected "), "{e:?}");
    let e = fails(serde_json::json!({ "retry": { "attempts": 0 } }));
    assert_eq!(e, ["policy.retry.attempts: must be greater than 0"]);
    let e = fails(serde_json::json!({ "hash": { "keys": "header:x" } }));
    assert!(e[0].starts_with("policy.hash") && e[0].contains("unknown field `keys`"), "{e:?}");
    let e = fails(serde_json::json!({ "retry": { "attempts": "three" } }));
    assert!(e[0].starts_with("policy.retry.attempts: invalid type"), "{e:?}");
    let e = fails(serde_json::json!({ "members": [{ "name": "a", "address": "127.0.0.1:1" }] }));
    assert!(e[0].starts_with("policy.members: "), "{e:?}");
    let e = fails(serde_json::json!({ "upstream_tls": { "ca": "ca.pem" } }));
    assert!(e[0].starts_with("policy.upstream_tls: "), "{e:?}");
    let e = fails(serde_json::json!("hash"));
    assert!(e[0].starts_with("policy: invalid type"), "{e:?}");
}

#[test]
fn connection_limits_compile_and_tcp_refuses_them() {
    let text = BASE
        .replace(
            "listen = \"127.0.0.1:8080\"",
            "listen = \"127.0.0.1:8080\"\nmax_connection_age_ms = 5000",
        )
        .replace("[cluster.app]", "[cluster.app]\nmax_requests_per_connection = 100");
    let c = ok(&text);
    assert_eq!(c.listeners[0].connections.max_age, Some(Duration::from_secs(5)));
    assert_eq!(c.listeners[0].connections.max_requests, None);
    let app = &c.view.clusters["app"].policy.connections;
    assert_eq!((app.max_age, app.max_requests), (None, Some(100)));
    fails_once(
        &with("\n[router]\n").replace(
            "listen = \"127.0.0.1:8080\"",
            "listen = \"127.0.0.1:8080\"\nmax_requests_per_connection = 0",
        ),
        "listener[0].max_requests_per_connection",
        "0\n",
        "must be greater than 0",
    );
    let tcp = "\n[[listener]]\nname = \"db\"\nlisten = \"127.0.0.1:5432\"\nprotocol = \"tcp\"\n\
               max_connection_age_ms = 1000\n\n[[route]]\nlistener = \"db\"\ncluster = \"db\"\n\n\
               [cluster.db]\nupstream_protocol = \"tcp\"\nmax_connection_age_ms = 1000\n\
               members = [{ name = \"d1\", address = \"127.0.0.1:5433\" }]\n";
    let text = with(tcp);
    fails_with(&text, "listener[1].max_connection_age_ms", "1000\n\n", "tunnels");
    let errs = errors(&text);
    assert!(
        errs.iter().any(|e| e.field == "cluster.db.max_connection_age_ms"),
        "{}",
        render(&errs)
    );
}

// ---- issue 18: filters, multicast, session replay ----

#[test]
fn the_wcf_example_passes_without_warnings() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/wcf.toml");
    let c = load_file(&path, 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // Evaluated by priority, then file order: `submit-order` first on `soap`.
    let soap: Vec<&str> =
        c.view.routes.iter().filter(|r| r.listener == "soap").map(|r| r.name.as_str()).collect();
    assert_eq!(soap, ["submit-order", "canary", "soap-rest"]);
    let submit = &c.view.routes[0];
    assert_eq!((submit.priority, submit.position), (10, 0));
    assert_eq!(submit.matcher.max_peek_bytes, 16384);
    assert_eq!(submit.multicast[0].cluster, "audit");
    assert_eq!(submit.multicast[0].queue, 512);
    let carts = c.view.routes.iter().find(|r| r.name == "carts").unwrap();
    assert_eq!(carts.session_replay.unwrap().max_messages, 64);
    assert_eq!(c.listeners[1].routing, rondo_config::Routing::AllMatches);
}

#[test]
fn priorities_sort_routes_and_warnings_point_at_the_file() {
    let text = with(
        "\n[[route]]\nname = \"late\"\nlistener = \"web\"\ncluster = \"app\"\npriority = 3\nmatch = { path_prefix = \"/x\" }\n",
    );
    let c = ok(&text);
    assert_eq!(c.view.routes[0].name, "late");
    assert_eq!(c.view.routes[0].position, 1);
    // The catch-all (route[0]) now comes after `late`: it is not shadowed, nor is `late`.
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn new_route_fields_are_checked_where_they_are_written() {
    let route = |extra: &str| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n[[route]]\nlistener = \"web\"\ncluster = \"app\"\n{extra}\n\n[cluster.app]\nmembers = [{{ name = \"a1\", address = \"127.0.0.1:9001\" }}]\n\n[cluster.audit]\nmembers = [{{ name = \"b1\", address = \"127.0.0.1:9002\" }}]\n"
        )
    };
    let t = route("match = { path_regex = \"(\" }");
    fails_once(&t, "route[0].match.path_regex", "\"(\"", "is not a regular expression");
    let t = route("match = { headers_regex = { x-a = \"[\" } }");
    fails_once(&t, "route[0].match.headers_regex.x-a", "\"[\"", "is not a regular expression");
    let t = route("match = { body_json = { \"order.region\" = \"eu\" } }");
    fails_once(&t, "route[0].match.body_json.\"order.region\"", "\"eu\"", "must start with `$`");
    let t = route("match = { body_xml = { path = \"/s:Envelope\" } }");
    fails_once(&t, "route[0].match.body_xml.path", "\"/s:Envelope\"", "prefix `s` is not bound");
    let t = route("match = { max_peek_bytes = 10 }");
    fails_once(&t, "route[0].match.max_peek_bytes", "10", "only body filters read the body");
    let t = route("match = { headers_present = [\"x-a\"], headers_absent = [\"X-A\"] }");
    fails_once(&t, "route[0].match.headers_absent[0]", "\"X-A\"", "both required and absent");
    let t = route("multicast = [ { cluster = \"app\" } ]");
    fails_once(&t, "route[0].multicast[0].cluster", "\"app\" }", "already serves the route");
    let t = route("multicast = [ { cluster = \"nope\" } ]");
    fails_once(&t, "route[0].multicast[0].cluster", "\"nope\"", "unknown cluster `nope`");
    let t = route("multicast = [ { cluster = \"audit\", queue = 0 } ]");
    fails_once(&t, "route[0].multicast[0].queue", "0 }", "must be greater than 0");
    let t = route("session_replay = { max_messages = 8 }");
    fails_once(&t, "route[0].session_replay", "{ max_messages", "granularity `request`");
    let t = route("priority = 99999999999");
    fails_once(&t, "route[0].priority", "99999999999", "must be between");
    let t = BASE
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nrouting = \"all\"");
    fails_once(&t, "listener[0].routing", "\"all\"", "unknown routing `all`");
}

const QUEUED: &str = r#"
[[listener]]
name = "in"
listen = "127.0.0.1:8081"
protocol = "queue"

[[route]]
listener = "in"
cluster = "app"
"#;

#[test]
fn queue_routes_take_multicast_and_refuse_what_a_queue_cannot_do() {
    let base = format!(
        "{QUEUED}\n[cluster.audit]\nmembers = []\n\n[[queue]]\nname = \"o\"\ndirectory = \"q\"\n"
    );
    let multicast = base.replace(
        "cluster = \"app\"\n",
        "cluster = \"app\"\nmulticast = [{ cluster = \"audit\" }]\n",
    );
    let c = ok(&with(&multicast));
    assert_eq!(c.view.routes[1].multicast[0].cluster, "audit");
    let replay = base.replace(
        "cluster = \"app\"\n",
        "cluster = \"app\"\nsession_replay = { max_messages = 4 }\n",
    );
    let errs = errors(&with(&replay));
    assert!(
        errs.iter().any(|e| e.field == "route[1].session_replay"
            && e.message.contains("route on queue listener `in` cannot replay sessions")),
        "{}",
        render(&errs)
    );
    let bound =
        base.replace("cluster = \"app\"\n", "cluster = \"app\"\nmulticast_max_body_bytes = 10\n");
    fails_with(
        &with(&bound),
        "route[1].multicast_max_body_bytes",
        "10",
        "the queue's `max_message_bytes` bounds it",
    );
    let all =
        base.replace("protocol = \"queue\"\n", "protocol = \"queue\"\nrouting = \"all-matches\"\n");
    fails_with(
        &with(&all),
        "listener[1].routing",
        "\"all-matches\"",
        "queue listener `in` cannot use `all-matches`",
    );
    // A branch is delivered over HTTP like the route's own cluster.
    let tcp =
        multicast.replace("[cluster.audit]\n", "[cluster.audit]\nupstream_protocol = \"tcp\"\n");
    fails_with(
        &with(&tcp),
        "route[1].multicast[0].cluster",
        "\"audit\" }",
        "cannot deliver to cluster `audit` with upstream_protocol `tcp`",
    );
}

#[test]
fn queues_compile_with_their_defaults_and_limits() {
    let c = ok(&with(&format!(
        "{QUEUED}\n[[queue]]\nname = \"orders\"\ndirectory = \"q\"\nmax_attempts = 3\n\
         backoff_initial_ms = 100\nbackoff_max_ms = 1000\nsession_header = \"X-Session\"\n"
    )));
    let q = &c.queues[0];
    assert_eq!(q.name, "orders");
    assert_eq!(
        q.backend,
        rondo_config::QueueBackend::Embedded { directory: Path::new("conf/q").to_path_buf() }
    );
    assert_eq!(q.max_attempts, 3);
    assert_eq!(q.session_header.as_deref(), Some("x-session"));
    assert_eq!(q.max_message_bytes, rondo_config::QueueSpec::DEFAULT_MAX_MESSAGE_BYTES);
    assert_eq!(q.backoff(1), std::time::Duration::from_millis(100));
    assert_eq!(q.backoff(3), std::time::Duration::from_millis(400));
    assert_eq!(q.backoff(30), std::time::Duration::from_millis(1000));
    assert!(c.listeners.iter().any(|l| l.protocol == ListenerProtocol::Queue));
}

#[test]
fn queue_mistakes_are_reported_at_their_fields() {
    let q = |body: &str| with(&format!("{QUEUED}\n[[queue]]\n{body}\n"));
    fails_once(
        &q("name = \"orders\""),
        "queue[0].directory",
        "[[queue]]",
        "an embedded queue needs `directory`",
    );
    fails_once(
        &q("name = \"a/b\"\ndirectory = \"q\""),
        "queue[0].name",
        "\"a/b\"",
        "queue name `a/b` may hold only letters, digits",
    );
    fails_once(
        &q("name = \"o\"\nbackend = \"kafka\"\ndirectory = \"q\""),
        "queue[0].backend",
        "\"kafka\"",
        "unknown queue backend `kafka`, expected `embedded` or `nats`",
    );
    fails_once(
        &q("name = \"o\"\nbackend = \"nats\""),
        "queue[0].nats_url",
        "[[queue]]",
        "a nats queue needs `nats_url`",
    );
    fails_once(
        &q("name = \"o\"\ndirectory = \"q\"\nmax_message_bytes = 10\nmax_bytes = 5"),
        "queue[0].max_message_bytes",
        "10",
        "must be at most max_bytes (5), got 10",
    );
    fails_once(
        &q("name = \"o\"\ndirectory = \"q\"\nbackoff_initial_ms = 10\nbackoff_max_ms = 5"),
        "queue[0].backoff_max_ms",
        "5",
        "must be at least backoff_initial_ms (10), got 5",
    );
    // A queue listener without a queue.
    fails_once(
        &with(QUEUED),
        "listener[1].protocol",
        "\"queue\"",
        "queue listener `in` has no queue to accept messages into",
    );
    // Its routes: no tcp clusters.
    let tcp = with(&format!(
        "{}\n[cluster.raw]\nupstream_protocol = \"tcp\"\nmembers = []\n\n[[queue]]\nname = \"o\"\n\
         directory = \"q\"\n",
        QUEUED.replace("cluster = \"app\"", "cluster = \"raw\"")
    ));
    let errs = errors(&tcp);
    assert!(
        errs.iter().any(|e| e.field == "route[1].cluster"
            && e.message.contains("cannot deliver to cluster `raw` with upstream_protocol `tcp`")),
        "{}",
        render(&errs)
    );
    // NATS needs the feature.
    let nats = q("name = \"o\"\nbackend = \"nats\"\nnats_url = \"127.0.0.1:4222\"");
    assert!(parse_str(&nats, Path::new(FILE), 1).is_ok());
    let errs = parse_str_with(&nats, Path::new(FILE), 1, Features::NONE).unwrap_err();
    assert!(errs.iter().any(|e| e.field == "queue[0].backend" && e.message.contains("`nats`")));
    // Session partitions: NATS only, 1 to 1024, 16 by default.
    let partitions = |c: &Config| match &c.queues[0].backend {
        rondo_config::QueueBackend::Nats { session_partitions, .. } => *session_partitions,
        other => panic!("{other:?}"),
    };
    assert_eq!(partitions(&parse_str(&nats, Path::new(FILE), 1).unwrap()), 16);
    let nats64 = q("name = \"o\"\nbackend = \"nats\"\nnats_url = \"127.0.0.1:4222\"\n\
                    session_partitions = 64");
    assert_eq!(partitions(&parse_str(&nats64, Path::new(FILE), 1).unwrap()), 64);
    fails_once(
        &nats64.replace("= 64", "= 2000"),
        "queue[0].session_partitions",
        "2000",
        "must be between 1 and 1024, got 2000",
    );
    fails_once(
        &q("name = \"o\"\ndirectory = \"q\"\nsession_partitions = 4"),
        "queue[0].session_partitions",
        "$4",
        "`session_partitions` is for `backend = \"nats\"`",
    );
}

#[test]
fn grpc_codes_and_the_grpc_health_check_compile_and_unknown_codes_are_refused() {
    use rondo_core::grpc::{Code, Codes, GrpcPolicy};
    let c = ok(BASE);
    assert_eq!(c.view.cluster("app").unwrap().policy.grpc, GrpcPolicy::default());
    let text = cluster_line(
        "grpc_failure_codes = [\"internal\"]\nretry = { retry_on = [\"unavailable\", \
         \"RESOURCE_EXHAUSTED\"] }\nhealth = { grpc = { service = \"my.Service\" } }",
    );
    let c = ok(&text);
    let p = &c.view.cluster("app").unwrap().policy;
    assert_eq!(p.grpc.failure_codes, Codes::of(&[Code::INTERNAL]));
    assert_eq!(p.grpc.retry_on, Codes::of(&[Code::UNAVAILABLE, Code::RESOURCE_EXHAUSTED]));
    let kind = p.health.clone().unwrap().kind;
    assert_eq!(kind, HealthCheckKind::Grpc { service: "my.Service".into() });
    fails_once(
        &cluster_line("grpc_failure_codes = [\"internal\", \"unavailible\"]"),
        "cluster.app.grpc_failure_codes[1]",
        "\"unavailible\"",
        "unknown grpc status `unavailible`, expected `ok`,",
    );
    fails_once(
        &cluster_line("retry = { retry_on = [\"busy\"] }"),
        "cluster.app.retry.retry_on[0]",
        "\"busy\"",
        "unknown retry_on `busy`",
    );
    fails_once(
        &cluster_line("health = { kind = \"tcp\", grpc = { service = \"s\" } }"),
        "cluster.app.health.grpc",
        "{ service",
        "only applies to health checks of kind `grpc`",
    );
}

#[test]
fn probe_paths_and_their_listener_are_checked() {
    let admin = |lines: &str| with(&format!("\n[admin]\nlisten = \"127.0.0.1:9950\"\n{lines}\n"));
    let ok_text = admin(
        "ready_path = \"/ready\"\nlive_path = \"/live\"\nprobe_listen = \"127.0.0.1:9951\"\n\
         ready_clusters = [\"app\"]",
    );
    let probes = ok(&ok_text).admin.expect("admin").probes;
    assert_eq!(
        probes,
        rondo_config::ProbeSpec {
            ready_path: Some("/ready".into()),
            live_path: Some("/live".into()),
            listen: Some("127.0.0.1:9951".parse().unwrap()),
            ready_clusters: Some(vec!["app".into()]),
        }
    );
    let text = admin("ready_path = \"ready\"");
    fails_once(&text, "admin.ready_path", "\"ready\"", "must start with `/`");
    let text = admin("live_path = \"/api/v1/live\"");
    fails_once(&text, "admin.live_path", "\"/api/v1/live\"", "a path of the admin API");
    let text = admin("ready_path = \"/r\"\nlive_path = \"/r\"");
    fails_once(&text, "admin.live_path", "$\"/r\"", "must differ from ready_path");
    let text = admin("probe_listen = \"127.0.0.1:9951\"");
    fails_once(&text, "admin.probe_listen", "\"127.0.0.1:9951\"", "needs ready_path or live_path");
    let text = admin("live_path = \"/l\"\nprobe_listen = \"127.0.0.1:9950\"");
    fails_once(&text, "admin.probe_listen", "$\"127.0.0.1:9950\"", "already used by admin.listen");
    let text = admin("ready_path = \"/r\"\nready_clusters = [\"app\", \"nope\"]");
    fails_once(&text, "admin.ready_clusters[1]", "\"nope\"", "no cluster named `nope`");
    let text = admin("ready_clusters = [\"app\"]");
    fails_once(&text, "admin.ready_clusters", "[\"app\"]", "needs ready_path");
}

#[test]
fn proxy_protocol_and_trusted_networks_are_checked() {
    let listener = |lines: &str| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n{lines}\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"app\"\n\n\
             [cluster.app]\nmembers = [{{ name = \"a1\", address = \"127.0.0.1:9001\" }}]\n"
        )
    };
    let c = ok(&listener(
        "proxy_protocol = \"v2\"\ntrusted_sources = [\"10.0.0.0/8\", \"192.0.2.7\"]\n\
         trust_forwarded_for = \"172.16.0.0/12\"",
    ));
    let l = &c.listeners[0];
    let pp = l.proxy_protocol.as_ref().expect("proxy_protocol");
    assert_eq!(pp.mode, rondo_config::ProxyProtocolMode::V2);
    assert_eq!(pp.trusted.len(), 2);
    assert!(l.trust_forwarded_for.trusts("172.20.1.1".parse().unwrap()));
    assert!(l.trust_forwarded_for.trusts("::ffff:172.20.1.1".parse().unwrap()));
    assert!(!l.trust_forwarded_for.trusts("10.0.0.1".parse().unwrap()));
    assert!(
        ok(&listener("trust_forwarded_for = true")).listeners[0]
            .trust_forwarded_for
            .trusts("203.0.113.1".parse().unwrap())
    );

    let text = listener("proxy_protocol = \"v2\"");
    fails_once(&text, "listener[0].proxy_protocol", "\"v2\"", "needs trusted_sources");
    let text = listener("proxy_protocol = \"v3\"\ntrusted_sources = [\"10.0.0.0/8\"]");
    fails_once(&text, "listener[0].proxy_protocol", "\"v3\"", "unknown proxy_protocol `v3`");
    let text = listener("proxy_protocol = \"v1\"\ntrusted_sources = [\"10.0.0.0/33\"]");
    fails_once(&text, "listener[0].trusted_sources[0]", "\"10.0.0.0/33\"", "is not a network");
    let text = listener("trusted_sources = [\"10.0.0.0/8\"]");
    fails_once(&text, "listener[0].trusted_sources", "[\"10.0.0.0/8\"]", "needs proxy_protocol");
    let text = listener("trust_forwarded_for = [\"10.0.0.1\", \"nope\"]");
    fails_once(&text, "listener[0].trust_forwarded_for[1]", "\"nope\"", "is not a network");
    let text = listener("trust_forwarded_for = []");
    fails_once(&text, "listener[0].trust_forwarded_for", "[]", "trusts nobody");
}

#[test]
fn a_clusters_proxy_protocol_is_for_tcp_and_http_clusters() {
    let cluster = |lines: &str| {
        format!(
            "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:8080\"\nprotocol = \"tcp\"\n\n\
             [[route]]\nlistener = \"t\"\ncluster = \"db\"\n\n\
             [cluster.db]\n{lines}\nmembers = [{{ name = \"d1\", address = \"127.0.0.1:9004\" }}]\n"
        )
    };
    let c = ok(&cluster("upstream_protocol = \"tcp\"\nproxy_protocol = \"v1\""));
    assert_eq!(c.view.clusters["db"].policy.send_proxy, Some(rondo_core::ProxyHeader::V1));
    let text = cluster("upstream_protocol = \"tcp\"\nproxy_protocol = \"v9\"");
    fails_once(&text, "cluster.db.proxy_protocol", "\"v9\"", "unknown proxy_protocol `v9`");
    // HTTP clusters too (issue 38 item 1): their member connections are kept per client.
    let http =
        cluster("proxy_protocol = \"v2\"").replace("protocol = \"tcp\"", "protocol = \"http\"");
    let c = ok(&http);
    assert_eq!(c.view.clusters["db"].policy.send_proxy, Some(rondo_core::ProxyHeader::V2));
}

#[test]
fn retry_conditions_backoff_and_buffer_are_checked() {
    let cluster = |retry: &str| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
             [cluster.c]\nretry = {{ {retry} }}\n\
             members = [{{ name = \"a1\", address = \"127.0.0.1:9001\" }}]\n"
        )
    };
    let c = ok(&cluster(
        "retry_on = [\"gateway-error\", \"retriable-status:429\", \"unavailable\"], \
         backoff = { base = \"20ms\", max = \"1s\" }, retry_buffer_bytes = \"1MiB\"",
    ));
    let r = &c.view.clusters["c"].policy.retry;
    assert!(r.statuses.contains(503) && r.statuses.contains(429) && !r.statuses.contains(500));
    assert_eq!(
        r.backoff,
        Some(rondo_core::Backoff {
            base: std::time::Duration::from_millis(20),
            max: std::time::Duration::from_secs(1)
        })
    );
    assert_eq!(r.buffer_bytes, 1 << 20);
    assert_ne!(c.view.clusters["c"].policy.grpc.retry_on, rondo_core::grpc::Codes::NONE, "grpc");

    let text = cluster("retry_on = [\"5xx\", \"connect-failure\"]");
    fails_once(&text, "cluster.c.retry.retry_on[1]", "\"connect-failure\"", "always retried");
    let text = cluster("retry_on = [\"retriable-status:700\"]");
    fails_once(
        &text,
        "cluster.c.retry.retry_on[0]",
        "\"retriable-status:700\"",
        "not an HTTP status",
    );
    let text = cluster("retry_on = [\"6xx\"]");
    fails_once(&text, "cluster.c.retry.retry_on[0]", "\"6xx\"", "unknown retry_on `6xx`");
    let text = cluster("backoff = { base = \"1s\", max = \"10ms\" }");
    fails_once(&text, "cluster.c.retry.backoff.max_ms", "\"10ms\"", "at least its base");
}

#[test]
fn access_log_templates_and_fields_compile_once_and_bad_ones_are_located() {
    use rondo_config::access_format::{AccessField, Piece};
    let log = |value: &str| {
        BASE.replace(
            "listen = \"127.0.0.1:8080\"\n",
            &format!("listen = \"127.0.0.1:8080\"\naccess_log = {value}\n"),
        )
    };
    let c = ok(&log(r#"{ path = "-", format = "{host} {status}" }"#));
    let spec = c.listeners[0].access_log.as_ref().expect("access log");
    assert_eq!(
        spec.template.as_deref(),
        Some(
            &[
                Piece::Field(AccessField::Host),
                Piece::Text(" ".into()),
                Piece::Field(AccessField::Status)
            ][..]
        )
    );
    let c = ok(&log(r#"{ path = "-", format = "json", fields = ["sni", "try_ms"] }"#));
    let spec = c.listeners[0].access_log.as_ref().expect("access log");
    assert_eq!(spec.fields, Some(vec![AccessField::Sni, AccessField::TryMs]));
    assert_eq!(spec.format, LogFormat::Json);
    let text = log(r#"{ path = "-", format = "{hots}" }"#);
    fails_once(&text, "listener[0].access_log.format", "\"{hots}\"", "did you mean `host`?");
    let text = log(r#"{ path = "-", fields = ["host", "useragent"] }"#);
    fails_once(
        &text,
        "listener[0].access_log.fields[1]",
        "\"useragent\"",
        "did you mean `user_agent`?",
    );
    let text = log(r#"{ path = "-", fields = ["host", "host"] }"#);
    fails_once(&text, "listener[0].access_log.fields[1]", "\"host\"]", "`host` is listed twice");
    let text = log(r#"{ path = "-", format = "{host}", fields = ["host"] }"#);
    fails_once(
        &text,
        "listener[0].access_log.fields",
        "[\"host\"]",
        "a template names its own fields",
    );
    let c = ok(&with("\n[metrics]\ndeparted_grace = \"30s\"\n"));
    assert_eq!(c.metrics.departed_grace, std::time::Duration::from_secs(30));
    let text = with("\n[metrics]\ndeparted_grace_ms = 90000000\n");
    fails_once(&text, "metrics.departed_grace_ms", "90000000", "departed_grace must be 0 to 24h");
}

#[test]
fn connection_breakers_are_checked() {
    let cluster = |lines: &str| {
        format!(
            "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:8080\"\n\n\
             [[route]]\nlistener = \"t\"\ncluster = \"c\"\n\n\
             [cluster.c]\n{lines}\nmembers = [{{ name = \"m\", address = \"127.0.0.1:9004\" }}]\n"
        )
    };
    let c = ok(&cluster("max_connections = 8\nmax_pending = 0"));
    let cap = c.view.clusters["c"].policy.limits.max_connections;
    assert_eq!(cap, Some(rondo_core::ConnectionCap { connections: 8, pending: 0 }));
    let c = ok(&cluster("max_connections = 8"));
    let pending = c.view.clusters["c"].policy.limits.max_connections.map(|c| c.pending);
    assert_eq!(pending, Some(rondo_core::ConnectionCap::DEFAULT_PENDING));
    assert_eq!(ok(&cluster("")).view.clusters["c"].policy.limits.max_connections, None);
    let text = cluster("max_pending = 4");
    fails_once(&text, "cluster.c.max_pending", "4", "max_pending needs max_connections");
    let text = cluster("max_connections = 0");
    fails_once(&text, "cluster.c.max_connections", "0\nmembers", "greater than 0");
    let tcp = cluster("upstream_protocol = \"tcp\"\nmax_connections = 2")
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nprotocol = \"tcp\"");
    fails_once(&tcp, "cluster.c.max_connections", "2\nmembers", "tcp clusters open one member");
}

#[test]
fn a_clusters_hedge_is_checked() {
    let cluster = |retry: &str| {
        format!(
            "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:8080\"\n\n\
             [[route]]\nlistener = \"t\"\ncluster = \"c\"\n\n\
             [cluster.c]\nretry = {retry}\nmembers = [{{ name = \"m\", address = \"127.0.0.1:9004\" }}]\n"
        )
    };
    let c = ok(&cluster("{ hedge = { after = \"50ms\", max = 2 } }"));
    let hedge = c.view.clusters["c"].policy.retry.hedge.expect("hedge");
    assert_eq!((hedge.after, hedge.max), (std::time::Duration::from_millis(50), 2));
    let c = ok(&cluster("{ hedge = { after_ms = 20 } }"));
    assert_eq!(c.view.clusters["c"].policy.retry.hedge.map(|h| h.max), Some(1));
    let text = cluster("{ hedge = { max = 1 } }");
    fails_once(&text, "cluster.c.retry.hedge.after_ms", "{ max = 1 }", "hedge needs after");
    let text = cluster("{ hedge = { after = \"50ms\", max = 9 } }");
    fails_once(&text, "cluster.c.retry.hedge.max", "9", "between 1 and 3");
    let text = cluster("{ attempts = 1, hedge = { after = \"50ms\" } }");
    fails_once(&text, "cluster.c.retry.hedge.max", "{ after", "retry.attempts of at least 2");
}
