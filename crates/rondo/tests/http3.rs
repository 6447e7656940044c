//! HTTP/3 listeners (issue 40, feature `http3`) against a real `rondo serve`, real `rondo member`
//! processes (HTTP/1.1) and a real HTTP/3 client, aioquic's (`router/h3_client.py`; `pip
//! install aioquic`): GET and POST with bodies, many streams on one connection, failover when a
//! member is killed, junk datagrams and truncated Initials, the address-validation Retry, the
//! connection cap, `Alt-Svc` on the TCP responses (curl), certificate reloads, upgrades
//! (`http3/upgrades.rs`: under HTTP/3 load, connections held through them), headless Chromium
//! over forced QUIC, the counters (the anti-amplification stops among them), and `rondo check`.

mod common;
#[path = "http3/upgrades.rs"]
mod upgrades;

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{BIN, Proc, TempDir, free_port, start_member};
use serde_json::Value;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/router/h3_client.py");
const TOKEN: &str = "h3-token";

/// A development CA and a `localhost` certificate in `dir/certs` (`rondo tls dev-ca`).
fn certs(dir: &Path) -> PathBuf {
    let certs = dir.join("certs");
    let out = Command::new(BIN)
        .args(["tls", "dev-ca", certs.to_str().unwrap(), "--name", "localhost"])
        .output()
        .expect("run rondo tls dev-ca");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    certs
}

/// A running `rondo serve` with an HTTP/3 listener `web` over cluster `c` of `members`.
struct Router {
    _dir: TempDir,
    proc: Proc,
    web: SocketAddr,
    admin: SocketAddr,
    ca: PathBuf,
}

/// Starts the router; `extra`: more keys of listener `web`.
fn serve(members: &[(&str, SocketAddr)], extra: &str) -> Router {
    serve_tls(members, "", extra)
}

/// [`serve`] with `tls_extra` (`, key = value` pairs) in listener `web`'s `tls` table.
fn serve_tls(members: &[(&str, SocketAddr)], tls_extra: &str, extra: &str) -> Router {
    let dir = TempDir::new("http3");
    let certs = certs(&dir.0);
    let (web, admin) = (free_port(), free_port());
    let list: Vec<String> = members
        .iter()
        .map(|(name, addr)| format!("{{ name = \"{name}\", address = \"{addr}\" }}"))
        .collect();
    let text = format!(
        r#"
[admin]
listen = "127.0.0.1:{admin}"
token = "{TOKEN}"

[[listener]]
name = "web"
listen = "127.0.0.1:{web}"
http3 = true
tls = {{ certs = [{{ cert = "{c}/localhost.pem", key = "{c}/localhost.key" }}]{tls_extra} }}
{extra}

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [{list}]
"#,
        c = certs.display(),
        list = list.join(", "),
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, text).unwrap();
    let mut proc = Proc::start(&["serve", "--config", path.to_str().unwrap(), "--workers", "1"]);
    proc.line_with("admin API on", Duration::from_secs(10));
    let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    Router { ca: certs.join("ca.pem"), _dir: dir, proc, web: addr(web), admin: addr(admin) }
}

impl Router {
    /// `count` requests `method path` with a body of `body` bytes, at once on one HTTP/3
    /// connection: one JSON object per request, in order.
    fn h3(&self, method: &str, path: &str, body: usize, count: usize) -> Vec<Value> {
        self.h3_holding(method, path, body, count, 0.0)
    }

    /// [`Router::h3`], the connection then kept open and silent for `hold` seconds.
    fn h3_holding(
        &self,
        method: &str,
        path: &str,
        body: usize,
        count: usize,
        hold: f64,
    ) -> Vec<Value> {
        self.h3_with(method, path, body, count, hold, "0:0")
    }

    /// [`Router::h3_holding`] with `extra` (`COUNT:BYTES`) more header fields on each request.
    fn h3_with(
        &self,
        method: &str,
        path: &str,
        body: usize,
        count: usize,
        hold: f64,
        extra: &str,
    ) -> Vec<Value> {
        self.h3_env(method, path, body, count, hold, &[("H3_EXTRA_HEADERS", extra)])
    }

    /// [`Router::h3_holding`] with the client's environment `env`.
    fn h3_env(
        &self,
        method: &str,
        path: &str,
        body: usize,
        count: usize,
        hold: f64,
        env: &[(&str, &str)],
    ) -> Vec<Value> {
        let out = Command::new("python3")
            .envs(env.iter().copied())
            .args([CLIENT, &self.web.to_string(), self.ca.to_str().unwrap(), "localhost"])
            .args([method, path, &body.to_string(), &count.to_string(), &hold.to_string()])
            .output()
            .expect("python3 runs (aioquic installed: pip install aioquic)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    }

    /// `rondo_http3_events_total` of listener `web` for `event`.
    fn event(&self, event: &str) -> u64 {
        let out = Command::new("curl")
            .args(["-s", "-H", &format!("Authorization: Bearer {TOKEN}")])
            .arg(format!("http://{}/metrics", self.admin))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let prefix = format!("rondo_http3_events_total{{listener=\"web\",event=\"{event}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix}in:\n{text}"))
    }

    /// The response head of `GET /` over TCP TLS, by curl with `version` (`--http1.1`,
    /// `--http2`).
    fn tcp_head(&self, version: &str) -> String {
        let port = self.web.port();
        let out = Command::new("curl")
            .args(["-sk", version, "-o", "/dev/null", "-D", "-", "--max-time", "10"])
            .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
            .arg(format!("https://localhost:{port}/"))
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&out.stdout).to_lowercase()
    }
}

fn status(v: &Value) -> u64 {
    v["status"].as_u64().unwrap_or_else(|| panic!("no response: {v}"))
}

/// The body `h3_client.py` sends for `n` bytes.
fn pattern(n: usize) -> Vec<u8> {
    b"abcdefghijklmnopqrstuvwxyz0123456789".iter().copied().cycle().take(n).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn get_post_and_many_streams_on_one_connection_reach_an_http1_member() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "");

    let got = r.h3("GET", "/", 0, 3);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0]["server_max_streams_bidi"], 100, "{}", got[0]);
    for g in &got {
        assert_eq!((status(g), g["body"].as_str()), (200, Some("m1\n")), "{g}");
    }
    // The member gets the request in HTTP/1.1 with the forwarding fields, and no body.
    let seen = r.h3("GET", "/headers", 0, 1);
    let seen = seen[0]["body"].as_str().unwrap();
    assert!(seen.contains("via: 3 rondo-"), "{seen}");
    assert!(seen.contains("x-forwarded-proto: https"), "{seen}");
    assert!(!seen.contains("transfer-encoding"), "{seen}");

    // Bodies both ways.
    for g in r.h3("POST", "/collect", 100_000, 2) {
        assert_eq!((status(&g), g["body"].as_str()), (200, Some("m1 got 100000 bytes\n")));
    }
    // More streams than a connection may have open at once (100): the rest wait their turn.
    let want = sha256_hex(&pattern(5000));
    let echoed = r.h3("POST", "/echo", 5000, 150);
    assert_eq!(echoed.len(), 150);
    for g in &echoed {
        assert_eq!(status(g), 200, "{g}");
        assert_eq!(g["body_sha256"].as_str(), Some(want.as_str()), "{g}");
    }

    // Slow answers: the connection's 100 streams are all open at once, the rest wait.
    let slow = r.h3("GET", "/slow/300", 0, 120);
    assert!(slow.iter().all(|g| status(g) == 200), "{slow:?}");
    assert!(r.event("streams_at_limit") >= 1);

    // The TCP responses point at HTTP/3 on the same port.
    let alt = format!("alt-svc: h3=\":{}\"", r.web.port());
    for version in ["--http1.1", "--http2"] {
        let head = r.tcp_head(version);
        assert!(head.contains(&alt), "{version}: {head}");
    }
    assert!(r.event("requests") >= 276, "{}", r.event("requests"));
    assert!(r.event("handshakes") >= 5);
}

/// The router's own answers on the own HTTP/1 path point at HTTP/3 too: an error (502, its
/// only member gone) and a filter's answer. Before, only members' responses carried `Alt-Svc`.
#[test]
fn the_routers_own_answers_carry_alt_svc() {
    let gone = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let r = serve(&[("gone", gone)], "");
    let alt = format!("alt-svc: h3=\":{}\"", r.web.port());
    let head = r.tcp_head("--http1.1");
    assert!(head.starts_with("http/1.1 502"), "{head}");
    assert!(head.contains(&alt), "{head}");
    let r = serve(&[("gone", gone)], "filters = [ { respond = { status = 204 } } ]");
    let alt = format!("alt-svc: h3=\":{}\"", r.web.port());
    let head = r.tcp_head("--http1.1");
    assert!(head.starts_with("http/1.1 204") && head.contains(&alt), "{head}");
}

#[test]
fn the_stream_cap_and_the_idle_timeout_are_the_listeners() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "http3_max_streams = 7\nhttp3_idle_timeout_ms = 1000");
    // 20 slow requests at once, 7 open at a time; then 3 s of silence on the connection.
    let got = r.h3_holding("GET", "/slow/200", 0, 20, 3.0);
    assert!(got.iter().all(|g| status(g) == 200), "{got:?}");
    assert_eq!(got[0]["server_max_streams_bidi"], 7, "{}", got[0]);
    assert_eq!(got[0]["server_idle_timeout_ms"], 1000, "{}", got[0]);
    assert!(r.event("streams_at_limit") >= 1);
    assert_eq!(r.event("idle_timeouts"), 1);
}

#[test]
fn heads_over_the_listeners_limits_are_answered_431() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "max_headers = 20\nmax_header_bytes = 8192");
    assert_eq!(status(&r.h3_with("GET", "/", 0, 1, 0.0, "10:10")[0]), 200);
    // More fields than max_headers: the router's 431.
    assert_eq!(status(&r.h3_with("GET", "/", 0, 1, 0.0, "30:10")[0]), 431);
    // A head over max_header_bytes: h3's 431.
    assert_eq!(status(&r.h3_with("GET", "/", 0, 1, 0.0, "1:9000")[0]), 431);
    // The listener serves on.
    assert_eq!(status(&r.h3("GET", "/", 0, 1)[0]), 200);
}

#[test]
fn early_data_serves_safe_methods_and_answers_others_425() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let zero_rtt = [("H3_ZERO_RTT", "1")];
    // Off (the default): no early data; a resumed client's POST waits for the handshake.
    let r = serve(&[("m1", a1)], "");
    let got = r.h3_env("POST", "/collect", 10, 1, 0.0, &zero_rtt);
    assert_eq!((status(&got[0]), got[0]["early_data"].as_bool()), (200, Some(false)), "{got:?}");
    drop(r);
    // On: a GET in early data is served, a POST answered 425 Too Early.
    let r = serve(&[("m1", a1)], "http3_0rtt = true");
    let got = r.h3_env("GET", "/", 0, 1, 0.0, &zero_rtt);
    assert_eq!((status(&got[0]), got[0]["early_data"].as_bool()), (200, Some(true)), "{got:?}");
    assert_eq!(got[0]["body"], "m1\n");
    let got = r.h3_env("POST", "/collect", 10, 1, 0.0, &zero_rtt);
    assert_eq!((status(&got[0]), got[0]["early_data"].as_bool()), (425, Some(true)), "{got:?}");
    assert!(r.event("too_early") >= 1);
}

#[test]
fn a_connection_takes_no_more_than_max_requests_per_connection() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "max_requests_per_connection = 2");
    // Three at once on one connection: two served, the third refused (GOAWAY, then
    // H3_REQUEST_REJECTED, which a client may send again on a new connection).
    let got = r.h3("GET", "/slow/200", 0, 3);
    let served = got.iter().filter(|g| g["status"] == 200).count();
    let refused = got.iter().filter(|g| g.get("error").is_some()).count();
    assert_eq!((served, refused), (2, 1), "{got:?}");
    // A new connection is served again.
    assert_eq!(status(&r.h3("GET", "/", 0, 1)[0]), 200);
}

#[test]
fn requests_fail_over_when_a_member_is_killed() {
    let (mut m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let r = serve(&[("m1", a1), ("m2", a2)], "");
    let names = |got: &[Value]| -> Vec<String> {
        got.iter()
            .map(|g| {
                assert_eq!(status(g), 200, "{g}");
                g["headers"]["x-member"].as_str().unwrap_or("").to_owned()
            })
            .collect()
    };
    let before = names(&r.h3("GET", "/", 0, 20));
    assert!(before.iter().any(|n| n == "m1") && before.iter().any(|n| n == "m2"), "{before:?}");
    m1.kill();
    // Every request still gets an answer, from the member left.
    let after = names(&r.h3("GET", "/", 0, 20));
    assert!(after.iter().all(|n| n == "m2"), "{after:?}");
}

/// Datagrams no QUIC server should take: empty, tiny, random, and Initials cut short, with
/// lengths past their end, impossible connection id lengths or an unknown version.
fn junk() -> Vec<Vec<u8>> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let mut out = vec![Vec::new(), vec![0xc3], vec![0x40; 3]];
    for n in [20, 200, 1200, 1500] {
        out.push(random(n));
    }
    // Long header, Initial, version 1, 8-byte ids, no token, a length of 1232: cut at each
    // point of the header, then padded to 1200 bytes with garbage that cannot decrypt.
    let mut initial = vec![0xc3, 0, 0, 0, 1, 8];
    initial.extend(random(8));
    initial.push(8);
    initial.extend(random(8));
    initial.extend([0x00, 0x44, 0xd0]);
    for cut in 1..initial.len() {
        out.push(initial[..cut].to_vec());
    }
    let mut padded = initial.clone();
    padded.extend(random(1200 - padded.len()));
    out.push(padded);
    // Connection id lengths over QUIC's 20, a token length past the end, an unknown version.
    let mut long_ids = vec![0xc3, 0, 0, 0, 1, 255];
    long_ids.extend(random(1194));
    out.push(long_ids);
    let mut token = initial[..23].to_vec();
    token.extend([0x7f, 0xff, 0xff, 0xff]);
    token.extend(random(1200 - token.len()));
    out.push(token);
    let mut version = initial.clone();
    version[1..5].copy_from_slice(&[0x1a, 0x2a, 0x3a, 0x4a]);
    version.extend(random(1200 - version.len()));
    out.push(version);
    out
}

#[test]
fn junk_datagrams_and_truncated_initials_leave_the_listener_serving() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let mut r = serve(&[("m1", a1)], "");
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _round in 0..20 {
        for d in junk() {
            let _ = socket.send_to(&d, r.web);
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(r.proc.child.try_wait().unwrap().is_none(), "rondo exited");
    for g in r.h3("GET", "/", 0, 2) {
        assert_eq!((status(&g), g["body"].as_str()), (200, Some("m1\n")));
    }
}

/// VmRSS of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_flood_of_initials_from_many_addresses_holds_bounded_state() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "");
    assert_eq!(status(&r.h3("GET", "/", 0, 1)[0]), 200);
    let before = rss_kib(r.proc.child.id());
    // 3,000 handshakes begun from 250 addresses and never finished: past 64 in progress
    // (`http3_retry_above`), each gets a stateless Retry instead of a connection's state.
    let out = Command::new("python3")
        .args([CLIENT, "flood", &r.web.to_string(), "3000"])
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("sent 3000"), "{said}{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_kib(r.proc.child.id()).saturating_sub(before);
    let retried = r.event("retried");
    eprintln!("3000 Initials: {retried} retried, the router grew by {grown} KiB");
    assert!(retried >= 2000, "{retried} retries");
    // 64 half-open handshakes and 3,000 Retries: a few MiB at most (the 3,000 handshakes each
    // kept would take tens of MiB).
    assert!(grown < 16 * 1024, "the router grew by {grown} KiB");
    // Real clients are still served (their first try may meet the Retry too).
    assert_eq!(status(&r.h3("GET", "/", 0, 1)[0]), 200);
}

#[test]
fn a_silent_client_meets_the_amplification_limit_and_it_is_counted() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "");
    // A client that answers: its address is validated before the limit.
    for g in r.h3("GET", "/", 0, 2) {
        assert_eq!(status(&g), 200, "{g}");
    }
    assert_eq!(r.event("amplification_limited"), 0);
    // One Initial, then silence: the router's first flight and its retransmissions stop at
    // three times the Initial's bytes.
    let out = Command::new("python3")
        .args([CLIENT, "flood", &r.web.to_string(), "1"])
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("sent 1"), "{said}{}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(15);
    while r.event("amplification_limited") == 0 {
        assert!(Instant::now() < deadline, "the limit was never counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(r.event("amplification_limited"), 1, "one address, one stop");
}

#[test]
fn under_load_a_client_proves_its_address_with_a_retry_first() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    // 0: every client is asked for a Retry.
    let r = serve(&[("m1", a1)], "http3_retry_above = 0");
    for g in r.h3("GET", "/", 0, 2) {
        assert_eq!(status(&g), 200, "{g}");
    }
    assert!(r.event("retried") >= 1);
    assert_eq!(r.event("handshakes"), 1);
}

#[test]
fn a_connection_over_max_connections_is_refused_and_the_next_served() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "max_connections = 1\nheader_read_timeout_ms = 10000");
    // A TCP connection that never says anything holds the only slot.
    let held = std::net::TcpStream::connect(r.web).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let refused = r.h3("GET", "/", 0, 1);
    assert!(refused[0].get("error").is_some(), "{refused:?}");
    assert!(r.event("refused") >= 1);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = r.h3("GET", "/", 0, 1);
        if got[0].get("status").is_some() {
            assert_eq!(status(&got[0]), 200);
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never freed: {got:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn rondo_check_refuses_a_udp_port_another_process_holds() {
    let dir = TempDir::new("http3-check-udp");
    let certs = certs(&dir.0);
    let port = free_port();
    let _holder = std::net::UdpSocket::bind(("127.0.0.1", port)).expect("bind udp");
    let path = dir.0.join("rondo.toml");
    let text = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:{port}\"\nhttp3 = true\n\
         tls = {{ certs = [{{ cert = \"{c}/localhost.pem\", key = \"{c}/localhost.key\" }}] }}\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9\" }}]\n",
        c = certs.display()
    );
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN).args(["check", path.to_str().unwrap()]).output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("rondo.toml:3:10: field `listener[0].listen`"), "{said}");
    assert!(said.contains("is taken by another process"), "{said}");
    // Once the port is free, the same file passes.
    drop(_holder);
    let out = Command::new(BIN).args(["check", path.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn rondo_check_refuses_http3_without_tls_at_the_field() {
    let dir = TempDir::new("http3-check");
    let path = dir.0.join("rondo.toml");
    let text = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nhttp3 = true\n\n\
                [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
                [cluster.c]\nmembers = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n";
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN).args(["check", path.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("rondo.toml:4:9"), "{said}");
    assert!(said.contains("listener[0].http3"), "{said}");
    assert!(said.contains("http3 needs `tls`"), "{said}");
}

/// `count` GETs of `path` at once on one HTTP/3 connection to `web` (checked against `ca`): the
/// statuses (0 for a request that got no answer).
fn statuses(web: SocketAddr, ca: &Path, path: &str, count: usize) -> Vec<u64> {
    let out = Command::new("python3")
        .args([CLIENT, &web.to_string(), ca.to_str().unwrap(), "localhost"])
        .args(["GET", path, "0", &count.to_string()])
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = said
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("a JSON line")["status"].as_u64().unwrap_or(0)
        })
        .collect();
    v
}

#[test]
fn new_certificates_reach_new_quic_handshakes() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "");
    assert_eq!(statuses(r.web, &r.ca, "/", 1), vec![200]);
    // Another CA's certificate for the same name, put in place by rename.
    let other = certs(&r._dir.0.join("other"));
    let live = r.ca.parent().unwrap();
    for name in ["localhost.key", "localhost.pem"] {
        let tmp = live.join(format!(".{name}.new"));
        std::fs::copy(other.join(name), &tmp).unwrap();
        std::fs::rename(&tmp, live.join(name)).unwrap();
    }
    let new_ca = other.join("ca.pem");
    let deadline = Instant::now() + Duration::from_secs(10);
    while statuses(r.web, &new_ca, "/", 1) != vec![200] {
        assert!(Instant::now() < deadline, "the new certificate never reached HTTP/3");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The old one is gone: a client that trusts only the old CA cannot connect.
    assert_eq!(statuses(r.web, &r.ca, "/", 1), vec![0]);
}

/// One GET over HTTP/3 with the client certificate `client-alice` of the development CA in
/// `certs`: its status, or none when the handshake was refused.
fn status_as_client(r: &Router, certs: &Path) -> Vec<u64> {
    let (cert, key) = (certs.join("client-alice.pem"), certs.join("client-alice.key"));
    let out = Command::new("python3")
        .env("H3_CLIENT_CERT", &cert)
        .env("H3_CLIENT_KEY", &key)
        .args([CLIENT, &r.web.to_string(), r.ca.to_str().unwrap(), "localhost"])
        .args(["GET", "/", "0", "1"])
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout);
    said.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line")["status"].as_u64())
        .map(|s| s.unwrap_or(0))
        .collect()
}

/// A reload of the listener's `client_ca` reaches new QUIC handshakes, as it does TCP ones: a
/// client certificate of the new CA is taken, and one of the old refused. Before, the QUIC
/// configuration kept the client certificate checks it was started with.
#[test]
fn a_reloaded_client_ca_reaches_new_quic_handshakes() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let dir = TempDir::new("http3-clients");
    let client_ca = |name: &str| {
        let certs = dir.0.join(name);
        let out = Command::new(BIN)
            .args(["tls", "dev-ca", certs.to_str().unwrap(), "--name", "x", "--client", "alice"])
            .output()
            .expect("run rondo tls dev-ca");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        certs
    };
    let (one, two) = (client_ca("one"), client_ca("two"));
    let trusted = dir.0.join("clients.pem");
    std::fs::copy(one.join("ca.pem"), &trusted).unwrap();
    let tls = format!(", client_ca = \"{}\", client_auth = \"required\"", trusted.display());
    let r = serve_tls(&[("m1", a1)], &tls, "");
    assert_eq!(status_as_client(&r, &one), vec![200]);
    assert_ne!(status_as_client(&r, &two), vec![200], "another CA's client was taken");
    let tmp = dir.0.join(".clients.pem.new");
    std::fs::copy(two.join("ca.pem"), &tmp).unwrap();
    std::fs::rename(&tmp, &trusted).unwrap();
    // The files are looked at every 250 ms and reloaded once a change has stood for one more
    // look; a refused handshake costs the client its 10 s deadline, so the first try waits.
    std::thread::sleep(Duration::from_millis(1500));
    let deadline = Instant::now() + Duration::from_secs(40);
    while status_as_client(&r, &two) != vec![200] {
        assert!(Instant::now() < deadline, "the new client CA never reached HTTP/3");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_ne!(status_as_client(&r, &one), vec![200], "the old CA's client is still taken");
}

#[test]
fn headless_chromium_reaches_a_page_over_http3() {
    // Only chromium is needed here (no playwright): `--dump-dom` prints the page.
    let chromium = std::env::var_os("RONDO_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.is_file() {
        assert!(!common::browser::in_ci(), "CI is set but {} is missing", chromium.display());
        eprintln!("SKIPPED: no chromium at {}", chromium.display());
        return;
    }
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let r = serve(&[("m1", a1)], "");
    // Chromium takes QUIC to a certificate of no public root only with its key named (the
    // SPKI's SHA-256), and to localhost only when forced.
    let cert = std::fs::read(r.ca.with_file_name("localhost.pem")).unwrap();
    let cert = {
        use rustls_pki_types::pem::PemObject as _;
        rustls_pki_types::CertificateDer::from_pem_slice(&cert).unwrap()
    };
    let spki = spki_sha256(&cert);
    let port = r.web.port();
    let profile = TempDir::new("http3-chromium");
    let out = Command::new(&chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-quic"])
        .arg(format!("--origin-to-force-quic-on=localhost:{port}"))
        .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
        .arg("--host-resolver-rules=MAP localhost 127.0.0.1")
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .args(["--timeout=15000", "--dump-dom"])
        .arg(format!("https://localhost:{port}/headers"))
        .output()
        .expect("chromium runs");
    let page = String::from_utf8_lossy(&out.stdout);
    // The member saw the request come in over HTTP/3.
    assert!(page.contains("via: 3 rondo-"), "{page}");
    assert!(page.contains("HeadlessChrome"), "{page}");
}

/// base64 of the SHA-256 of `cert`'s SubjectPublicKeyInfo, as Chromium's
/// `--ignore-certificate-errors-spki-list` takes it.
fn spki_sha256(cert: &rustls_pki_types::CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let spki = spki_of(cert.as_ref()).expect("a certificate's SubjectPublicKeyInfo");
    let digest = ring::digest::digest(&ring::digest::SHA256, spki);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// The SubjectPublicKeyInfo's DER inside a certificate's: Certificate → TBSCertificate →
/// [version], serial, signature, issuer, validity, subject, subjectPublicKeyInfo.
fn spki_of(der: &[u8]) -> Option<&[u8]> {
    /// The element at the start of `b`: (its whole encoding, its contents, what follows).
    fn element(b: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
        let (_tag, rest) = b.split_first()?;
        let (&len, rest) = rest.split_first()?;
        let (len, rest) = if len < 0x80 {
            (usize::from(len), rest)
        } else {
            let n = usize::from(len & 0x7f);
            let (bytes, rest) = (rest.get(..n)?, rest.get(n..)?);
            (bytes.iter().fold(0usize, |a, b| a << 8 | usize::from(*b)), rest)
        };
        let header = b.len() - rest.len();
        Some((b.get(..header + len)?, rest.get(..len)?, rest.get(len..)?))
    }
    let (_, cert, _) = element(der)?;
    let (_, mut tbs, _) = element(cert)?;
    // An explicit version ([0]) first, when there is one.
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs)?.2;
    }
    for _ in 0..5 {
        tbs = element(tbs)?.2;
    }
    Some(element(tbs)?.0)
}

#[test]
fn a_udp_port_taken_stops_rondo_serve_with_a_clear_error() {
    let dir = TempDir::new("http3-taken");
    let certs = certs(&dir.0);
    // The TCP side of the port must be free for the UDP error to be the one reported; another
    // process (a parallel test's connection) can take it between the check and rondo's bind,
    // and then the scenario is tried again on another port (at most five times).
    for _ in 0..5 {
        // Someone else's UDP socket on the port; the TCP side is free.
        let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        let text = format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:{port}\"\nhttp3 = true\n\
             tls = {{ certs = [{{ cert = \"{c}/localhost.pem\", key = \"{c}/localhost.key\" }}] }}\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
             [cluster.c]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9\" }}]\n",
            c = certs.display()
        );
        let path = dir.0.join("rondo.toml");
        std::fs::write(&path, text).unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--config", path.to_str().unwrap(), "--workers", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("rondo serve kept running with its UDP port taken");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut said = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
        assert!(!status.success());
        if said.contains(&format!("cannot bind listener web to 127.0.0.1:{port}")) {
            // The TCP port went to someone else meanwhile: not this test's question.
            continue;
        }
        let want = format!("cannot bind listener web quic to udp 127.0.0.1:{port}");
        assert!(said.contains(&want), "{said}");
        drop(taken);
        return;
    }
    panic!("no port with a free TCP side in five tries");
}
