//! `[member.NAME]`: a member defined once and listed by name in several clusters (issue 37,
//! item 2): what it compiles to, and every error at its file, line, column and field.

mod support;

use rondo_core::AdminState;
use support::*;

const SHARED: &str = r#"
[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "api"

[[route]]
listener = "web"
match = { path_prefix = "/admin" }
cluster = "backoffice"

[member.web1]
address = "127.0.0.1:9001"
weight = 300
group = "east"

[member.web2]
address = "127.0.0.1:9002"
state = "draining"

[cluster.api]
members = ["web1", "web2", { name = "own", address = "127.0.0.1:9003" }]

[cluster.backoffice]
algorithm = "least-sessions"
members = ["web1"]
"#;

#[test]
fn a_shared_member_is_one_spec_in_every_cluster_that_lists_it() {
    let c = ok(SHARED);
    let api = &c.view.clusters["api"];
    let names: Vec<&str> = api.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["web1", "web2", "own"]);
    let web1 = &api.members[0];
    assert_eq!((web1.address.as_str(), web1.weight), ("127.0.0.1:9001", 300));
    assert_eq!(web1.group.as_deref(), Some("east"));
    assert_eq!(api.members[1].admin, AdminState::Draining);
    assert_eq!(c.view.clusters["backoffice"].members[0], *web1);
    // Listed by two clusters: shared. `web2` is listed by one: an ordinary member of it.
    assert_eq!(c.shared_members.len(), 1, "{:?}", c.shared_members);
    assert_eq!(c.shared_members["web1"], ["api", "backoffice"]);
}

#[test]
fn an_unknown_name_is_an_error_at_the_entry() {
    let text = SHARED.replace(r#"members = ["web1"]"#, r#"members = ["web1", "web3"]"#);
    fails_once(
        &text,
        "cluster.backoffice.members[1]",
        "\"web3\"",
        "unknown member `web3`, expected one of `web1` or `web2`",
    );
}

#[test]
fn a_shared_member_listed_twice_in_one_cluster_is_a_duplicate() {
    let text = SHARED.replace(r#"members = ["web1"]"#, r#"members = ["web1", "web1"]"#);
    fails_with(&text, "cluster.backoffice.members[1]", "\"web1\"]", "duplicate member name `web1`");
    // And a table with the same address as a shared member.
    let text = SHARED.replace(
        r#"{ name = "own", address = "127.0.0.1:9003" }"#,
        r#"{ name = "own", address = "127.0.0.1:9002" }"#,
    );
    fails_once(
        &text,
        "cluster.api.members[2].address",
        "\"127.0.0.1:9002\" }",
        "duplicate member address `127.0.0.1:9002`",
    );
}

#[test]
fn a_shared_member_table_is_checked_at_its_own_fields() {
    let text = SHARED.replace("weight = 300", "weight = 0");
    fails_once(&text, "member.web1.weight", "0\ngroup", "must be between 1 and 1000000");
    let text = SHARED.replace(r#"state = "draining""#, r#"state = "sleeping""#);
    fails_once(&text, "member.web2.state", "\"sleeping\"", "unknown state `sleeping`");
    let text = SHARED.replace(r#"address = "127.0.0.1:9002""#, r#"address = "http://10.0.0.1""#);
    fails_once(&text, "member.web2.address", "\"http://10.0.0.1\"", "write `10.0.0.1:80`");
    let text = SHARED.replace("address = \"127.0.0.1:9002\"\n", "");
    let errs = errors(&text);
    assert!(render(&errs).contains("address"), "{}", render(&errs));
    let text = SHARED.replace("group = \"east\"", "grup = \"east\"");
    let errs = errors(&text);
    assert!(render(&errs).contains("grup"), "{}", render(&errs));
}

#[test]
fn a_shared_member_at_the_routers_own_address_is_refused() {
    let text = SHARED.replace("127.0.0.1:9001", "127.0.0.1:8080");
    fails_once(
        &text,
        "member.web1.address",
        "\"127.0.0.1:8080\"\nweight",
        "this router's own listener",
    );
}

#[test]
fn a_member_entry_must_be_a_name_or_a_table() {
    let text = SHARED.replace(r#"members = ["web1"]"#, "members = [7]");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{}", render(&errs));
    assert!(
        errs[0].message.contains("a member table or the name of a [member.NAME]"),
        "{}",
        render(&errs)
    );
    assert_eq!(errs[0].line, pos(&text, "members = [7]").0);
}

#[test]
fn a_tier_load_view_compiles_with_defaults_and_checks_its_fields() {
    let c = ok(&format!("{SHARED}\n[tier]\nnats = \"nats://127.0.0.1:4222\"\n"));
    let t = c.tier.expect("a tier");
    assert_eq!(t.nats, "nats://127.0.0.1:4222");
    assert_eq!(t.subject, "rondo.tier.default.load");
    assert_eq!(t.interval, std::time::Duration::from_millis(100));
    let c = ok(&format!(
        "{SHARED}\n[tier]\nnats = \"nats://n:4222\"\nname = \"east-1\"\ninterval = \"250ms\"\n"
    ));
    let t = c.tier.expect("a tier");
    assert_eq!((t.subject.as_str(), t.interval.as_millis()), ("rondo.tier.east-1.load", 250));
    assert!(ok(SHARED).tier.is_none());

    let text = format!("{SHARED}\n[tier]\nnats = \"127.0.0.1:4222\"\n");
    fails_once(
        &text,
        "tier.nats",
        "\"127.0.0.1:4222\"",
        "not a NATS URL, expected nats://HOST:PORT",
    );
    let text = format!("{SHARED}\n[tier]\nnats = \"nats://n:4222\"\nname = \"a.b\"\n");
    fails_once(&text, "tier.name", "\"a.b\"", "tier name `a.b` must be letters");
    let text = format!("{SHARED}\n[tier]\nnats = \"nats://n:4222\"\ninterval_ms = 5\n");
    fails_once(&text, "tier.interval_ms", "5\n", "must be between 10 and 10000");
}

#[test]
fn a_tier_needs_the_nats_feature() {
    let text = format!("{SHARED}\n[tier]\nnats = \"nats://127.0.0.1:4222\"\n");
    let errs = rondo_config::parse_str_with(
        &text,
        std::path::Path::new(FILE),
        1,
        rondo_config::Features::NONE,
    )
    .expect_err("refused without nats");
    assert!(
        errs.iter().any(|e| e.field == "tier.nats" && e.message.contains("`nats` cargo feature")),
        "{errs:?}"
    );
}
