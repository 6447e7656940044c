//! A member in several clusters (issue 37, item 2): real `rondo serve` processes with real
//! `rondo member` processes, a `[member.NAME]` listed by two clusters. A failed health check in
//! the cluster that probes it takes it out of both; a drain applies everywhere unless scoped;
//! a least-sessions cluster avoids a member the other cluster keeps busy.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Proc, TempDir, request_with, start_member};
use serde_json::Value;

const TOKEN: &str = "shared-members-token-0123456789";

/// `rondo serve` with `config`: the process, its `web` listener and its admin API.
fn serve(dir: &Path, config: &str) -> (Proc, SocketAddr, SocketAddr) {
    let path = dir.join("rondo.toml");
    std::fs::write(&path, config).expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "2"]);
    let web = p.addr_after("rondo: listener web on ");
    let admin = p.addr_after("rondo: admin API on ");
    (p, web, admin)
}

/// The admin API's view of member `name` (`GET /api/v1/members/NAME`).
fn member(admin: SocketAddr, name: &str) -> Value {
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, body) = request_with(admin, "GET", &format!("/api/v1/members/{name}"), &auth, b"");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("json")
}

/// `field` of member `name` in each cluster, by cluster name.
fn per_cluster(admin: SocketAddr, name: &str, field: &str) -> Vec<(String, Value)> {
    let v = member(admin, name);
    v["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| (c["cluster"].as_str().unwrap_or_default().to_owned(), c[field].clone()))
        .collect()
}

fn ctl(admin: SocketAddr, args: &[&str]) -> std::process::Output {
    Command::new(common::BIN)
        .args(["ctl", "--admin", &admin.to_string(), "--token", TOKEN])
        .args(args)
        .output()
        .expect("run rondo ctl")
}

fn config(m1: SocketAddr, m2: SocketAddr, a_members: &str, a_health: &str) -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"
token = "{TOKEN}"

[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
match = {{ headers = {{ x-cluster = "a" }} }}
cluster = "a"

[[route]]
listener = "web"
cluster = "b"

[member.m1]
address = "{m1}"

[member.m2]
address = "{m2}"

[cluster.a]
algorithm = "least-sessions"
members = {a_members}
{a_health}

[cluster.b]
algorithm = "least-sessions"
members = ["m1", "m2"]
"#
    )
}

/// Cluster `a` probes the shared members; `b` has no health check of its own. Killing m1 takes
/// it out of both (without the shared state, `b` would still count it up), and the members'
/// page lists both clusters.
#[test]
fn a_failed_health_check_takes_a_shared_member_out_of_every_cluster() {
    let dir = TempDir::new("shared-health");
    let (mut m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let health =
        r#"health = { kind = "http", path = "/health", interval_ms = 100, fall = 1, rise = 1 }"#;
    let (_router, web, admin) = serve(&dir.0, &config(a1, a2, r#"["m1", "m2"]"#, health));
    let v = member(admin, "m1");
    assert_eq!(v["shared"], true, "{v}");
    assert_eq!(v["shared_clusters"], serde_json::json!(["a", "b"]), "{v}");
    assert_eq!(per_cluster(admin, "m1", "healthy").len(), 2);

    m1.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let healthy = per_cluster(admin, "m1", "healthy");
        if healthy.iter().all(|(_, h)| h == false) {
            break;
        }
        assert!(Instant::now() < deadline, "m1 still up somewhere: {healthy:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Cluster b, which checks nothing itself, sends nothing to the dead member.
    for _ in 0..6 {
        let (status, body) = request_with(web, "GET", "/", "", b"");
        assert_eq!((status, body.trim()), (200, "m2"));
    }
    // The status page (the dashboard's source) names both clusters at the shared member.
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let (_, status) = request_with(admin, "GET", "/api/v1/status", &auth, b"");
    let status: Value = serde_json::from_str(&status).expect("json");
    let b = status["clusters"].as_array().unwrap().iter().find(|c| c["name"] == "b").unwrap();
    assert_eq!(b["members"][0]["clusters"], serde_json::json!(["a", "b"]), "{b}");
}

/// `rondo ctl drain MEMBER` drains a shared member in both clusters; `drain CLUSTER MEMBER`
/// (and `--cluster`) in one; the admin API the same.
#[test]
fn a_drain_applies_everywhere_unless_scoped() {
    let dir = TempDir::new("shared-drain");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let (_router, _web, admin) = serve(&dir.0, &config(a1, a2, r#"["m1", "m2"]"#, ""));
    let admin_of = |m: &str| {
        per_cluster(admin, m, "admin")
            .into_iter()
            .map(|(c, a)| format!("{c}:{}", a.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
    };

    let out = ctl(admin, &["drain", "m1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "m1: draining in a, b (by operator:admin-api)\n"
    );
    assert_eq!(admin_of("m1"), ["a:draining", "b:draining"]);
    assert_eq!(admin_of("m2"), ["a:active", "b:active"]);

    let out = ctl(admin, &["undrain", "m1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(admin_of("m1"), ["a:active", "b:active"]);

    // Scoped: one cluster only, both spellings.
    let out = ctl(admin, &["drain", "b", "m1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(admin_of("m1"), ["a:active", "b:draining"]);
    let out = ctl(admin, &["drain", "m2", "--cluster", "a"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(admin_of("m2"), ["a:draining", "b:active"]);
    let out = ctl(admin, &["drain", "a", "m2", "--cluster", "a"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name the cluster once"));

    // The admin API: everywhere at once, and an unknown member is a 404.
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, body) = request_with(admin, "POST", "/api/v1/members/m2/drain", &auth, b"");
    assert_eq!(status, 200, "{body}");
    assert_eq!(admin_of("m2"), ["a:draining", "b:draining"]);
    let (status, body) = request_with(admin, "POST", "/api/v1/members/m9/drain", &auth, b"");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown member `m9`"), "{body}");
}

/// Cluster a (m1 alone) holds three long requests on m1; cluster b's least-sessions, which
/// has nothing of its own in flight, sends every new request to m2. Without the shared count
/// it would alternate (both idle as far as b knows).
#[test]
fn least_sessions_avoids_a_member_busy_through_another_cluster() {
    let dir = TempDir::new("shared-load");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let (_router, web, admin) = serve(&dir.0, &config(a1, a2, r#"["m1"]"#, ""));
    let long: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                request_with(web, "GET", "/slow/3000", "x-cluster: a\r\n", b"")
            })
        })
        .collect();
    // The three are in flight at m1 (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(5);
    while member(admin, "m1")["active_in_process"] != 3 {
        assert!(Instant::now() < deadline, "{}", member(admin, "m1"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut served = Vec::new();
    for _ in 0..6 {
        let (status, body) = request_with(web, "GET", "/", "", b"");
        assert_eq!(status, 200, "{body}");
        served.push(body.trim().to_owned());
    }
    assert_eq!(served, ["m2"; 6], "b's picks while a keeps m1 busy");
    // Its view of m1: nothing of its own, three of a's.
    let b = per_cluster(admin, "m1", "others_active");
    assert!(b.contains(&("b".to_owned(), Value::from(3))), "{b:?}");
    for t in long {
        let (status, body) = t.join().expect("long request");
        assert_eq!((status, body.trim()), (200, "m1"));
    }
    assert_eq!(member(admin, "m1")["active_in_process"], 0);
}
