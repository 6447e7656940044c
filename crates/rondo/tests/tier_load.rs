//! One load view for the tier (issue 37, item 9): two real `rondo serve` processes and a real
//! `nats-server` (started here on a free loopback port), with `rondo member` processes. One
//! router's long requests make the other route new ones elsewhere; a router killed is
//! forgotten by the other after 3 silent intervals.
#![cfg(feature = "nats")]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ChildGuard, Proc, TempDir, free_port, request_with, start_member};
use serde_json::Value;

const TOKEN: &str = "tier-load-token-0123456789";

/// A core `nats-server` on a free loopback port; killed on drop.
fn nats_server() -> (ChildGuard, SocketAddr) {
    let port = free_port();
    // Debian installs it in /usr/sbin, which not every PATH holds.
    let bin = ["nats-server", "/usr/sbin/nats-server"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("nats-server (Debian's nats-server package; .ci/run installs it)");
    let child = Command::new(bin)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server");
    let guard = ChildGuard(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not start on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (guard, addr)
}

/// A router of the tier: the process, its `web` listener and its admin API.
fn router(dir: &Path, name: &str, config: &str) -> (Proc, SocketAddr, SocketAddr) {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "2"]);
    let web = p.addr_after("rondo: listener web on ");
    let admin = p.addr_after("rondo: admin API on ");
    (p, web, admin)
}

fn auth() -> String {
    format!("Authorization: Bearer {TOKEN}\r\n")
}

/// What cluster `c` of the router at `admin` adds to m1's own count (the tier's and the other
/// clusters').
fn others_at_m1(admin: SocketAddr) -> u64 {
    let (status, body) = request_with(admin, "GET", "/api/v1/members/m1", &auth(), b"");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    let c = v["clusters"].as_array().unwrap().iter().find(|c| c["cluster"] == "c").cloned();
    c.and_then(|c| c["others_active"].as_u64()).expect("cluster c holds m1")
}

/// `rondo_tier_load_routers` at `admin`.
fn load_routers(admin: SocketAddr) -> Option<u64> {
    let (_, text) = request_with(admin, "GET", "/metrics", &auth(), b"");
    text.lines().find_map(|l| l.strip_prefix("rondo_tier_load_routers ")?.trim().parse().ok())
}

/// Waits (bounded: 10 s) until `ok` holds, else fails with `what`.
fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn one_routers_long_requests_steer_the_others_picks_and_a_killed_router_is_forgotten() {
    let dir = TempDir::new("tier-load");
    let (_nats, nats) = nats_server();
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    // `pin` sends everything to m1; `c` balances m1 and m2 by least-sessions.
    let config = format!(
        r#"
[admin]
listen = "127.0.0.1:0"
token = "{TOKEN}"

[tier]
nats = "nats://{nats}"
name = "test"
interval_ms = 100

[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
match = {{ headers = {{ x-pin = "1" }} }}
cluster = "pin"

[[route]]
listener = "web"
cluster = "c"

[member.m1]
address = "{a1}"

[cluster.pin]
members = ["m1"]

[cluster.c]
algorithm = "least-sessions"
members = ["m1", {{ name = "m2", address = "{a2}" }}]
"#
    );
    let (mut r1, web1, admin1) = router(&dir.0, "r1", &config);
    let (_r2, web2, admin2) = router(&dir.0, "r2", &config);
    until("each router hears the other", || {
        load_routers(admin1) == Some(1) && load_routers(admin2) == Some(1)
    });

    // Three long requests through router 1, all at m1.
    let long: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || request_with(web1, "GET", "/slow/4000", "x-pin: 1\r\n", b""))
        })
        .collect();
    until("router 2 counts router 1's three requests at m1", || others_at_m1(admin2) == 3);
    // Router 2, with nothing of its own in flight, sends its new requests to m2.
    for _ in 0..6 {
        let (status, body) = request_with(web2, "GET", "/", "", b"");
        assert_eq!((status, body.trim()), (200, "m2"), "router 2's pick while m1 is busy");
    }

    // Router 1 killed: after 3 silent intervals router 2 no longer counts it.
    r1.kill();
    until("router 2 forgets router 1", || {
        load_routers(admin2) == Some(0) && others_at_m1(admin2) == 0
    });
    // And balances over both members again.
    let served: Vec<String> =
        (0..4).map(|_| request_with(web2, "GET", "/", "", b"").1.trim().to_owned()).collect();
    assert!(served.iter().any(|m| m == "m1") && served.iter().any(|m| m == "m2"), "{served:?}");
    for t in long {
        // Cut off with their router: answered or not, nothing to check.
        let _ = t.join();
    }
}
