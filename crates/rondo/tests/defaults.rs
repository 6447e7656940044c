//! `[defaults]` in a real `rondo serve`: the admin API changes a default at runtime for every
//! cluster that did not set the field, in one view, across file reloads until removed; and
//! `rondo check --effective` prints each field in force with where it comes from.

mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::{BIN, Proc, TempDir};

const TOKEN: &str = "defaults-test-token-0123456789";

fn config(extra: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
         [defaults]\nalgorithm = \"random\"\nconnect_timeout = \"2s\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/a/\" }}\ncluster = \"a\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"b\"\n\n\
         [cluster.a]\nmembers = [{{ name = \"a1\", address = \"127.0.0.1:1\" }}]\n\n\
         [cluster.b]\nalgorithm = \"round-robin\"\n\
         members = [{{ name = \"b1\", address = \"127.0.0.1:1\" }}]\n{extra}"
    )
}

fn call(admin: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, text) = common::request_with(admin, method, path, &auth, body.as_bytes());
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, v)
}

/// The view id and each cluster's algorithm.
fn algorithms(admin: SocketAddr) -> (u64, Vec<(String, String)>) {
    let (status, v) = call(admin, "GET", "/api/v1/status", "");
    assert_eq!(status, 200, "{v}");
    let clusters = v["clusters"].as_array().unwrap().iter();
    let algs = clusters
        .map(|c| {
            (c["name"].as_str().unwrap().to_owned(), c["algorithm"].as_str().unwrap().to_owned())
        })
        .collect();
    (v["view"].as_u64().unwrap(), algs)
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

#[test]
fn the_admin_api_changes_a_default_for_every_cluster_that_did_not_set_it() {
    let dir = TempDir::new("defaults");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config("")).unwrap();
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    let admin = p.addr_after("rondo: admin API on ");

    let (view, algs) = algorithms(admin);
    assert_eq!(algs, pairs(&[("a", "random"), ("b", "round-robin")]));

    // One PUT, one new view: a follows, b set its own algorithm.
    let (status, v) = call(admin, "PUT", "/api/v1/defaults", "algorithm = \"least-sessions\"\n");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["view"].as_u64(), Some(view + 1), "{v}");
    let (_, algs) = algorithms(admin);
    assert_eq!(algs, pairs(&[("a", "least-sessions"), ("b", "round-robin")]));
    let (_, v) = call(admin, "GET", "/api/v1/defaults", "");
    assert!(v["defaults"].as_str().unwrap().contains("least-sessions"), "{v}");

    // Invalid: refused with the line, nothing changes.
    let (status, v) =
        call(admin, "PUT", "/api/v1/defaults", "algorithm = \"least-sessions\"\nalgoritm = 1\n");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["errors"][0]["line"], 2, "{v}");
    let (status, v) = call(admin, "PUT", "/api/v1/defaults", "algorithm = \"fastest\"\n");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["errors"][0]["field"], "cluster.a.algorithm", "{v}");
    let (after, algs) = algorithms(admin);
    assert_eq!(
        (after, &algs),
        (view + 1, &pairs(&[("a", "least-sessions"), ("b", "round-robin")]))
    );

    // A reload of the file keeps the runtime default over the file's.
    std::fs::write(&path, config("# touched\n")).unwrap();
    let out =
        Command::new("sh").args(["-c", &format!("kill -HUP {}", p.child.id())]).status().unwrap();
    assert!(out.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while algorithms(admin).0 == view + 1 {
        assert!(std::time::Instant::now() < deadline, "the reload did not happen");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(algorithms(admin).1, pairs(&[("a", "least-sessions"), ("b", "round-robin")]));

    // DELETE: the file's default again.
    let (status, v) = call(admin, "DELETE", "/api/v1/defaults", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(algorithms(admin).1, pairs(&[("a", "random"), ("b", "round-robin")]));
}

#[test]
fn check_effective_prints_each_field_and_where_it_comes_from() {
    let dir = TempDir::new("defaults-check");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config("connect_timeout_ms = 300\n")).unwrap();
    let out = Command::new(BIN)
        .args(["check", "--effective", "b", path.to_str().unwrap()])
        .output()
        .expect("run rondo check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = |field: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{field} ")))
            .unwrap_or_else(|| panic!("no {field} in\n{stdout}"))
            .to_owned()
    };
    let file = path.display().to_string();
    assert!(line("algorithm").contains(&format!("\"round-robin\"  (cluster {file}:")), "{stdout}");
    assert!(line("connect_timeout_ms").contains("300  (cluster"), "{stdout}");
    // a's own view: the default's line (the 6th of the file).
    let out = Command::new(BIN)
        .args(["check", "--effective", "a", path.to_str().unwrap()])
        .output()
        .expect("run rondo check");
    let a = String::from_utf8_lossy(&out.stdout);
    assert!(a.contains(&format!("\"random\"  (defaults {file}:6)")), "{a}");
    // A field set nowhere shows the reference's default.
    assert!(
        a.lines().any(|l| l.contains("panic_threshold_percent") && l.contains("(built-in)")),
        "{a}"
    );
    let out = Command::new(BIN)
        .args(["check", "--effective", "nope", path.to_str().unwrap()])
        .output()
        .expect("run rondo check");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown cluster `nope`"));
}
