//! The real binary: `rondo serve` as a child process in front of two `rondo member` processes;
//! `rondo serve` on an invalid config; `rondo --help`.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::support::{self, count};
use crate::common::{self, BIN, Proc, TempDir};

/// Starts `rondo member --name NAME` on a port of its choosing and returns it with its address.
fn start_member(name: &str) -> (Proc, SocketAddr) {
    common::start_member(name, "127.0.0.1:0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_balances_over_member_processes() {
    let dir = TempDir::new("serve");
    let (_m1, a1) = start_member("m1");
    let (_m2, a2) = start_member("m2");
    // A port free right now (bound, then released).
    let port = support::dead_addr().port();
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[listener]]
name = "web"
listen = "127.0.0.1:{port}"

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
algorithm = "round-robin"
members = [{{ name = "m1", address = "{a1}" }}, {{ name = "m2", address = "{a2}" }}]
"#
        ),
    )
    .expect("write config");
    let mut router =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    let line = router.line_with("listener web on", Duration::from_secs(10));
    assert!(line.ends_with(&format!("127.0.0.1:{port}")), "{line}");

    let names = support::served_by(&format!("http://127.0.0.1:{port}/"), 20).await;
    assert_eq!(count(&names, "m1"), 10, "{names:?}");
    assert_eq!(count(&names, "m2"), 10, "{names:?}");
}

#[test]
fn serve_with_an_invalid_config_exits_1_naming_the_place() {
    let dir = TempDir::new("serve");
    let path = dir.0.join("bad.toml");
    let text = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n[[route]]\n\
                listener = \"web\"\ncluster = \"c\"\n\n[cluster.c]\nalgorithm = \"fastest\"\n\
                members = [{ name = \"m1\", address = \"127.0.0.1:9\" }]\n";
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(BIN)
        .args(["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"])
        .stdin(Stdio::null())
        .output()
        .expect("run rondo serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // `algorithm = "fastest"` is line 10; the value starts at column 13.
    let place = format!("{}:10:13:", path.display());
    assert!(stderr.contains(&place), "no {place} in {stderr}");
    assert!(stderr.contains("cluster.c.algorithm"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listener"), "it started serving");
}

/// A listener's `backlog` is the kernel's accept queue: while the router is stopped
/// (SIGSTOP), `backlog + 1` connections complete and wait, the next one's SYN is dropped; once
/// it continues, the queued ones are served. Before `backlog` existed every router listener
/// queued 128 (tokio's `bind`), whatever the config said.
#[test]
fn a_stopped_router_queues_its_backlog_and_serves_it_after() {
    use std::io::{Read, Write};
    let dir = TempDir::new("serve");
    let (_m1, a1) = start_member("m1");
    let path = dir.0.join("rondo.toml");
    let text = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nbacklog = 2\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{a1}\" }}]\n"
    );
    std::fs::write(&path, text).expect("write config");
    let mut router =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    let addr = router.addr_after("listener web on");
    let pid = router.child.id().to_string();
    let kill = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().expect("run kill").success();
        assert!(ok, "kill {sig} {pid} failed");
    };
    kill("-STOP");
    let mut queued = Vec::new();
    while queued.len() < 10 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(s) => queued.push(s),
            Err(_) => break,
        }
    }
    let n = queued.len();
    for s in &mut queued {
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").expect("send");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    }
    kill("-CONT");
    assert_eq!(n, 3, "backlog 2: three connections queue, the fourth waits for its SYN");
    for mut s in queued {
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read the answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

#[test]
fn help_lists_serve_check_and_member() {
    let out = Command::new(BIN).arg("--help").output().expect("run rondo --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for c in ["serve", "check", "member"] {
        assert!(commands.contains(&c), "{c} missing from {commands:?} in {help}");
    }
}

/// Every filter type and a multicast branch through the real binary: `rondo serve` in front of
/// `rondo member` processes (each answers its name), one route per filter type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_and_multicast_through_rondo_serve() {
    let dir = TempDir::new("serve-filters");
    let kinds = ["present", "absent", "hregex", "pregex", "query", "json", "xml", "urgent"];
    let mut procs = Vec::new();
    let mut clusters = String::new();
    for name in kinds.iter().chain(&["other"]) {
        let (p, addr) = start_member(name);
        procs.push(p);
        clusters.push_str(&format!(
            "[cluster.{name}]\nmembers = [{{ name = \"{name}\", address = \"{addr}\" }}]\n\n"
        ));
    }
    let audit = super::recorder::Recorder::spawn("audit");
    clusters.push_str(&format!("[cluster.audit]\nmembers = [{}]\n\n", audit.entry()));
    let soap = super::filters::SOAP_MATCH;
    let routes = [
        ("present", "match = { headers_present = [\"x-present\"] }".to_owned()),
        ("absent", "match = { path_prefix = \"/absent\", headers_absent = [\"x-no\"] }".to_owned()),
        ("hregex", "match = { headers_regex = { \"x-tenant\" = \"^t-[0-9]+$\" } }".to_owned()),
        ("pregex", "match = { path_regex = \"^/orders/[0-9]+$\" }".to_owned()),
        ("query", "match = { query = { region = \"eu\" } }".to_owned()),
        ("json", "match = { body_json = { \"$.order.region\" = \"eu\" } }\nmulticast = [ { cluster = \"audit\" } ]".to_owned()),
        ("xml", format!("match = {soap}")),
        ("urgent", "priority = 5\nmatch = { headers_present = [\"x-urgent\"] }".to_owned()),
    ];
    let port = support::dead_addr().port();
    let mut config = format!("[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:{port}\"\n\n");
    for (name, m) in &routes {
        config.push_str(&format!(
            "[[route]]\nname = \"{name}\"\nlistener = \"web\"\ncluster = \"{name}\"\n{m}\n\n"
        ));
    }
    config.push_str("[[route]]\nname = \"rest\"\nlistener = \"web\"\ncluster = \"other\"\n\n");
    config.push_str(&clusters);
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, &config).expect("write config");
    let mut router =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    router.line_with("listener web on", Duration::from_secs(10));
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let name = |s: super::filters::Sent| String::from_utf8_lossy(&s.body).trim().to_owned();
    let send = super::filters::send;
    assert_eq!(name(send("GET", &url("/"), &[("x-present", "")], b"").await), "present");
    assert_eq!(name(send("GET", &url("/absent"), &[], b"").await), "absent");
    assert_eq!(name(send("GET", &url("/absent"), &[("x-no", "1")], b"").await), "other");
    assert_eq!(name(send("GET", &url("/"), &[("x-tenant", "t-42")], b"").await), "hregex");
    assert_eq!(name(send("GET", &url("/orders/7"), &[], b"").await), "pregex");
    assert_eq!(name(send("GET", &url("/x?a=1&region=eu"), &[], b"").await), "query");
    let order = br#"{"order": {"region": "eu"}}"#;
    let ided = [("x-request-id", "order-1")];
    assert_eq!(name(send("POST", &url("/x"), &ided, order).await), "json");
    assert_eq!(name(send("POST", &url("/x"), &[], b"{not json").await), "other");
    let soap_body = super::filters::SOAP.as_bytes();
    assert_eq!(name(send("POST", &url("/x"), &[], soap_body).await), "xml");
    assert_eq!(name(send("POST", &url("/x"), &[], b"<broken").await), "other");
    // `urgent` is last in the file but first by priority.
    let both = [("x-present", ""), ("x-urgent", "1")];
    assert_eq!(name(send("GET", &url("/"), &both, b"").await), "urgent");
    // The JSON route's copy reached its branch, with the body as sent.
    audit.wait_for(1).await;
    let seen = audit.seen();
    assert_eq!((seen[0].id.as_str(), &seen[0].body[..]), ("order-1", &order[..]));
}
