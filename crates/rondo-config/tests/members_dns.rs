//! A cluster's `members_dns` (issue 38): what compiles into a `MembersDnsSpec`, and every
//! refusal located at its file, line, column and field path, as `rondo check` prints it.

mod support;

use std::time::Duration;

use rondo_config::{DnsQuery, MembersDnsSpec};
use support::{errors, fails_once, ok, render};

fn cluster(dns: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"api\"\n\n\
         [cluster.api]\nmembers_dns = {{ {dns} }}\n"
    )
}

#[test]
fn a_name_and_an_srv_name_compile_with_their_defaults() {
    let c = ok(&cluster(r#"name = "api.internal", port = 8080"#));
    let want = MembersDnsSpec {
        query: DnsQuery::Address { name: "api.internal".into(), port: 8080 },
        refresh: Duration::from_secs(30),
        resolver: None,
        max_members: 1_000,
    };
    assert_eq!(c.members_dns["api"], want);
    assert!(c.view.clusters["api"].members.is_empty());

    let c = ok(&cluster(
        r#"srv = "_http._tcp.api.internal.", refresh = "5s", resolver = "127.0.0.1:5353", max_members = 20"#,
    ));
    let want = MembersDnsSpec {
        query: DnsQuery::Srv { name: "_http._tcp.api.internal.".into() },
        refresh: Duration::from_secs(5),
        resolver: Some("127.0.0.1:5353".parse().unwrap()),
        max_members: 20,
    };
    assert_eq!(c.members_dns["api"], want);
    // An address alone is asked on port 53; static members may sit beside.
    let text = cluster(r#"name = "api", port = 1, resolver = "::1""#).replace(
        "[cluster.api]\n",
        "[cluster.api]\nmembers = [{ name = \"s\", address = \"127.0.0.1:9\" }]\n",
    );
    let c = ok(&text);
    assert_eq!(c.members_dns["api"].resolver, Some("[::1]:53".parse().unwrap()));
    assert_eq!(c.view.clusters["api"].members.len(), 1);
    assert!(
        ok(&cluster(r#"name = "a", port = 1"#)
            .replace("members_dns = { name = \"a\", port = 1 }\n", ""))
        .members_dns
        .is_empty()
    );
}

#[test]
fn each_mistake_is_located_at_its_field() {
    let f = "cluster.api.members_dns";
    for (dns, field, needle, message) in [
        (r#"name = "a.b""#, "port", "{ name", "needs the members' `port`"),
        (r#"name = "a.b", port = 0"#, "port", "0 }", "between 1 and 65535"),
        (r#"name = "a.b", port = 70000"#, "port", "70000", "between 1 and 65535"),
        (r#"srv = "_x._tcp.a", port = 80"#, "port", "80 }", "the records give"),
        (r#"name = "a", srv = "_x._tcp.a", port = 1"#, "srv", "\"_x", "not both"),
        (r#"port = 1"#, "", "{ port", "needs `name`"),
        (r#"name = "bad name", port = 1"#, "name", "\"bad name", "not a DNS name"),
        (r#"name = "a..b", port = 1"#, "name", "\"a..b", "bad label"),
        (r#"name = "-a.b", port = 1"#, "name", "\"-a", "bad label"),
        (r#"name = "10.0.0.1", port = 1"#, "name", "\"10.0", "is an IP address"),
        (r#"name = "", port = 1"#, "name", "\"\"", "must not be empty"),
        (r#"name = "a", port = 1, refresh = "500ms""#, "refresh_ms", "\"500ms", "between 1000"),
        (r#"name = "a", port = 1, refresh = "2d""#, "refresh_ms", "\"2d", "between 1000"),
        (r#"name = "a", port = 1, resolver = "x.y""#, "resolver", "\"x.y", "not a socket address"),
        (r#"name = "a", port = 1, max_members = 0"#, "max_members", "0 }", "between 1 and 10000"),
        (r#"name = "a", port = 1, max_members = 10001"#, "max_members", "10001", "between 1 and"),
    ] {
        let text = cluster(dns);
        let path = if field.is_empty() { f.to_owned() } else { format!("{f}.{field}") };
        fails_once(&text, &path, needle, message);
    }
    let long = format!("{}.b", "a".repeat(64));
    let text = cluster(&format!(r#"name = "{long}", port = 1"#));
    fails_once(&text, &format!("{f}.name"), "\"aaa", "bad label");
    // An unknown key gets the nearest name.
    let errs = errors(&cluster(r#"name = "a", port = 1, refresh_s = 3"#));
    assert!(render(&errs).contains("did you mean `refresh_ms`"), "{}", render(&errs));
}

#[test]
fn a_declared_policy_cannot_name_a_dns_name() {
    let policy = serde_json::json!({"members_dns": {"name": "a.b", "port": 80}});
    let e = rondo_config::compile_declared_policy("api", &policy).unwrap_err();
    assert!(e.to_string().contains("policy.members_dns:"), "{e}");
}
