//! UDP balancing (issue 37, item 1): real `rondo serve` processes with a `udp` listener, real
//! `dig` queries to real dnsmasq members on loopback ports (each answering its own address for
//! the same name), UDP echo members in the test, a member killed mid-run, per-datagram
//! placement, a flood of source ports against a bounded flow table, and `rondo check`'s errors.

mod common;

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{ChildGuard, Proc, TempDir};

/// Whether `tool --version`-like `args` run; outside CI a missing tool skips the test.
fn have(tool: &str, args: &[&str]) -> bool {
    let ok = Command::new(tool).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status();
    if ok.is_err() {
        assert!(std::env::var_os("CI").is_none(), "{tool} is not installed (.ci/run installs it)");
        eprintln!("{tool} is not installed: skipped");
    }
    ok.is_ok()
}

/// dnsmasq answering `svc.test` with `ip` (TTL 0, so nothing is cached by anyone).
fn dnsmasq(dir: &Path, ip: &str) -> (ChildGuard, SocketAddr) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("hosts"), format!("{ip} svc.test\n")).unwrap();
    common::dnsmasq(dir, 0, &[])
}

/// `dig @listener svc.test` with one try of one second: the answer, `None` when there was none.
fn dig(listener: SocketAddr) -> Option<String> {
    let out = Command::new("dig")
        .arg(format!("@{}", listener.ip()))
        .args(["-p", &listener.port().to_string(), "svc.test", "A", "+short", "+tries=1"])
        .arg("+time=1")
        .output()
        .expect("run dig");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty() && !text.contains(";;")).then_some(text)
}

/// A DNS query for `svc.test` A with id 0x5244, as hex: the members' UDP health probe.
fn query_hex() -> String {
    let mut q = vec![0x52, 0x44, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["svc", "test"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q.iter().map(|b| format!("{b:02x}")).collect()
}

const TOKEN: &str = "udp-test-token-0123456789";

/// `rondo serve` with `config`: the process, its `dns` listener and its admin API.
fn serve(dir: &Path, config: &str) -> (Proc, SocketAddr, SocketAddr) {
    let path = dir.join("rondo.toml");
    let config = format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n{config}");
    std::fs::write(&path, config).expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    let udp = p.addr_after("rondo: listener dns on ");
    let admin = p.addr_after("rondo: admin API on ");
    (p, udp, admin)
}

/// The sum of the metric lines starting with `series` (0 when there are none).
fn metric(admin: SocketAddr, series: &str) -> f64 {
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, body) = common::request_with(admin, "GET", "/metrics", &auth, b"");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter_map(|l| l.strip_prefix(series)?.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A UDP echo member on loopback: answers every datagram with `NAME:` and the datagram, until
/// the returned flag is cleared (its thread checks it every 100 ms).
fn echo(name: &'static str) -> (SocketAddr, Arc<AtomicBool>) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let addr = s.local_addr().unwrap();
    let run = Arc::new(AtomicBool::new(true));
    let running = run.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while running.load(Ordering::Relaxed) {
            if let Ok((n, from)) = s.recv_from(&mut buf) {
                let mut answer = format!("{name}:").into_bytes();
                answer.extend_from_slice(&buf[..n]);
                let _ = s.send_to(&answer, from);
            }
        }
    });
    (addr, run)
}

/// A client socket of the test, answers waited for `wait` at most.
fn client(wait: Duration) -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(wait)).unwrap();
    c
}

/// Sends `payload` from `c` to `to` and returns the answer, if one came in time.
fn ask(c: &UdpSocket, to: SocketAddr, payload: &str) -> Option<String> {
    c.send_to(payload.as_bytes(), to).unwrap();
    let mut buf = [0u8; 2048];
    let (n, _) = c.recv_from(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn echo_config(members: &[(&str, SocketAddr)], udp: &str, cluster: &str) -> String {
    let members: Vec<String> =
        members.iter().map(|(n, a)| format!("{{ name = \"{n}\", address = \"{a}\" }}")).collect();
    format!(
        "[[listener]]\nname = \"dns\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"udp\"\nudp = {{ {udp} }}\n\n\
         [[route]]\nlistener = \"dns\"\ncluster = \"echo\"\n\n\
         [cluster.echo]\nupstream_protocol = \"udp\"\nalgorithm = \"round-robin\"\n{cluster}\nmembers = [{}]\n",
        members.join(", ")
    )
}

#[test]
fn dig_through_rondo_reaches_both_dns_members_and_then_the_survivor() {
    if !have("dnsmasq", &["--version"]) || !have("dig", &["-v"]) {
        return;
    }
    let dir = TempDir::new("udp-dig");
    let (mut one, a1) = dnsmasq(&dir.0.join("one"), "10.0.0.1");
    let (_two, a2) = dnsmasq(&dir.0.join("two"), "10.0.0.2");
    let config = format!(
        "[[listener]]\nname = \"dns\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"udp\"\n\
         udp = {{ idle_timeout = \"2s\" }}\n\n\
         [[route]]\nlistener = \"dns\"\ncluster = \"dns\"\n\n\
         [cluster.dns]\nupstream_protocol = \"udp\"\nalgorithm = \"round-robin\"\n\
         health = {{ udp = {{ send_hex = \"{}\", expect_hex = \"5244\" }}, interval = \"100ms\", fall = 1, rise = 1 }}\n\
         members = [{{ name = \"one\", address = \"{a1}\" }}, {{ name = \"two\", address = \"{a2}\" }}]\n",
        query_hex()
    );
    let (_rondo, listener, admin) = serve(&dir.0, &config);
    // Each dig is a new client port, so a new flow: round robin alternates the members.
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        if let Some(a) = dig(listener) {
            seen.insert(a);
        }
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, BTreeSet::from(["10.0.0.1".to_owned(), "10.0.0.2".to_owned()]));
    assert!(
        metric(admin, "rondo_udp_datagrams_out_total{listener=\"dns\",cluster=\"dns\"}") >= 2.0
    );

    // The UDP probe (a DNS query, its answer carrying the query's id) passes on both.
    let healthy = |m: &str| format!("rondo_member_healthy{{cluster=\"dns\",member=\"{m}\"}}");
    assert_eq!(metric(admin, &healthy("one")) + metric(admin, &healthy("two")), 2.0);

    // Member one dies: within a bounded number of queries, every answer is the survivor's.
    drop(std::mem::replace(&mut one, ChildGuard(Command::new("true").spawn().unwrap())));
    // Its probe fails (ICMP port unreachable: refused) and takes it down (bounded: 5 s).
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(admin, &healthy("one")) != 0.0 {
        assert!(Instant::now() < deadline, "the udp probe never took the killed member down");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(admin, &healthy("two")), 1.0);
    let mut in_a_row = 0;
    for _ in 0..40 {
        match dig(listener).as_deref() {
            Some("10.0.0.2") => in_a_row += 1,
            Some(other) => panic!("answer {other} from the killed member"),
            None => in_a_row = 0,
        }
        if in_a_row == 10 {
            break;
        }
    }
    assert_eq!(in_a_row, 10, "ten queries in a row answered by the survivor");
}

#[test]
fn a_member_that_refuses_is_charged_and_the_datagram_goes_to_another() {
    let (live, stop) = echo("live");
    // A port nobody listens on: datagrams to it draw ICMP port unreachable.
    let closed = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = TempDir::new("udp-refused");
    let config = echo_config(&[("closed", closed), ("live", live)], "", "");
    let (_rondo, listener, admin) = serve(&dir.0, &config);
    // New clients alternate between the members; every one is answered in the end by `live`
    // (its first datagram, or one sent again after a refusal), within bounded tries.
    for i in 0..6 {
        let c = client(Duration::from_millis(300));
        let payload = format!("q{i}");
        let answer = (0..5).find_map(|_| ask(&c, listener, &payload));
        assert_eq!(answer.as_deref(), Some(format!("live:q{i}").as_str()));
    }
    assert!(
        metric(admin, "rondo_udp_member_errors_total{listener=\"dns\",cluster=\"echo\"}") >= 1.0
    );
    stop.store(false, Ordering::Relaxed);
}

#[test]
fn flows_keep_a_client_on_its_member_and_requests_spread() {
    let ((a, stop_a), (b, stop_b)) = (echo("a"), echo("b"));
    let dir = TempDir::new("udp-granularity");
    // Per flow: one client's datagrams all go to one member, answers only to that client.
    let (rondo, listener, _) = serve(&dir.0, &echo_config(&[("a", a), ("b", b)], "", ""));
    let (c1, c2) = (client(Duration::from_secs(2)), client(Duration::from_secs(2)));
    let mut by = [BTreeSet::new(), BTreeSet::new()];
    for i in 0..6 {
        for (j, c) in [&c1, &c2].into_iter().enumerate() {
            let payload = format!("c{j}-{i}");
            let answer = ask(c, listener, &payload).expect("answer");
            let (member, echoed) = answer.split_once(':').expect("member:payload");
            assert_eq!(echoed, payload, "an answer to another client's datagram");
            by[j].insert(member.to_owned());
        }
    }
    assert_eq!(by[0].len(), 1, "{by:?}");
    assert_eq!(by[1].len(), 1, "{by:?}");
    assert_ne!(by[0], by[1], "round robin puts the second flow on the other member");
    drop(rondo);

    // Per request: one client's datagrams alternate members, answers still only its own.
    let dir = TempDir::new("udp-granularity-request");
    let config = echo_config(&[("a", a), ("b", b)], "granularity = \"request\"", "");
    let (_rondo, listener, admin) = serve(&dir.0, &config);
    let c = client(Duration::from_secs(2));
    let mut members = Vec::new();
    for i in 0..8 {
        let payload = format!("r{i}");
        let answer = ask(&c, listener, &payload).expect("answer");
        let (member, echoed) = answer.split_once(':').expect("member:payload");
        assert_eq!(echoed, payload);
        members.push(member.to_owned());
    }
    assert_eq!(members.iter().filter(|m| *m == "a").count(), 4, "{members:?}");
    assert_eq!(members.iter().filter(|m| *m == "b").count(), 4, "{members:?}");
    // One flow per member the client reached.
    assert_eq!(metric(admin, "rondo_udp_flows{listener=\"dns\",cluster=\"echo\"}"), 2.0);
    stop_a.store(false, Ordering::Relaxed);
    stop_b.store(false, Ordering::Relaxed);
}

#[test]
fn open_flows_are_in_flight_on_their_members_until_idle() {
    let ((a, stop_a), (b, stop_b)) = (echo("a"), echo("b"));
    let dir = TempDir::new("udp-idle");
    let config = echo_config(&[("a", a), ("b", b)], "idle_timeout = \"1s\"", "");
    let (_rondo, listener, admin) = serve(&dir.0, &config);
    let clients: Vec<UdpSocket> = (0..3).map(|_| client(Duration::from_secs(2))).collect();
    for (i, c) in clients.iter().enumerate() {
        assert!(ask(c, listener, &format!("hello {i}")).is_some());
    }
    let in_flight = "rondo_member_in_flight{cluster=\"echo\"";
    let flows = "rondo_udp_flows{listener=\"dns\",cluster=\"echo\"}";
    // Each open flow is one in flight on its member (what least-sessions balances).
    assert_eq!(metric(admin, flows), 3.0);
    assert_eq!(metric(admin, in_flight), 3.0);
    // Quiet for longer than idle_timeout: every flow ends and gives its count back (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(admin, flows) > 0.0 || metric(admin, in_flight) > 0.0 {
        assert!(Instant::now() < deadline, "flows still open after 10 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A client heard from again opens a new flow.
    assert!(ask(&clients[0], listener, "again").is_some());
    assert_eq!(
        metric(admin, "rondo_udp_flows_started_total{listener=\"dns\",cluster=\"echo\"}"),
        4.0
    );
    stop_a.store(false, Ordering::Relaxed);
    stop_b.store(false, Ordering::Relaxed);
}

#[test]
fn an_upgrade_hands_the_udp_socket_over_and_the_old_flows_end_with_the_drain() {
    let (member, stop) = echo("m");
    let dir = TempDir::new("udp-upgrade");
    let sock = dir.0.join("upgrade.sock");
    let path = dir.0.join("rondo.toml");
    let config = format!(
        "[router]\nupgrade_socket = \"{}\"\ndrain_timeout_ms = 8000\n\n{}",
        sock.display(),
        echo_config(&[("m", member)], "", "")
    );
    std::fs::write(&path, config).unwrap();
    let path = path.to_str().unwrap();
    let mut old = Proc::start(&["serve", "--config", path]);
    let listener = old.addr_after("rondo: listener dns on ");
    old.line_with("rondo: reloading on changes", Duration::from_secs(20));
    let before = client(Duration::from_secs(2));
    assert_eq!(ask(&before, listener, "one").as_deref(), Some("m:one"));

    let mut new = Proc::start(&["serve", "--upgrade", "--config", path]);
    // The same socket (port 0 was kept): the new process serves the old one's address.
    assert_eq!(new.addr_after("rondo: listener dns on "), listener);
    old.line_with("rondo: handed over to pid", Duration::from_secs(20));
    // A new client and the old one are both answered (by whichever process reads the socket).
    let after = client(Duration::from_secs(2));
    assert_eq!(ask(&after, listener, "two").as_deref(), Some("m:two"));
    assert_eq!(ask(&before, listener, "three").as_deref(), Some("m:three"));
    // The old process's flows end once quiet, and it exits well within its drain timeout.
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = old.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the old process did not exit");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    assert_eq!(ask(&after, listener, "four").as_deref(), Some("m:four"));
    stop.store(false, Ordering::Relaxed);
}

/// Resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_flood_of_source_ports_stays_within_max_flows() {
    const MAX_FLOWS: usize = 500;
    const SOURCES: usize = 20_000;
    const BATCH: usize = 250;
    let (member, stop) = echo("m");
    let dir = TempDir::new("udp-flood");
    let config = echo_config(&[("m", member)], &format!("max_flows = {MAX_FLOWS}"), "");
    let (rondo, listener, admin) = serve(&dir.0, &config);
    let pid = rondo.child.id();
    let flows = "rondo_udp_flows{listener=\"dns\",cluster=\"echo\"}";
    let mut answered = 0;
    let mut rss_warm = 0;
    // Batches of sockets, each bound to its own ephemeral port, each sending once: every
    // datagram is a new flow (as spoofed source ports are); answers are waited for briefly.
    for batch in 0..SOURCES / BATCH {
        let sockets: Vec<UdpSocket> =
            (0..BATCH).map(|_| client(Duration::from_millis(200))).collect();
        for (i, s) in sockets.iter().enumerate() {
            s.send_to(format!("{batch}-{i}").as_bytes(), listener).unwrap();
        }
        let mut buf = [0u8; 64];
        for s in &sockets {
            if s.recv_from(&mut buf).is_ok() {
                answered += 1;
            }
        }
        if batch == 3 {
            // The table is full by now: memory from here on must stay flat.
            rss_warm = rss_kib(pid);
        }
        if batch % 20 == 0 {
            assert!(metric(admin, flows) <= MAX_FLOWS as f64, "batch {batch}");
        }
    }
    let open = metric(admin, flows);
    assert!(open <= MAX_FLOWS as f64, "{open} flows open, max_flows {MAX_FLOWS}");
    let evicted = metric(admin, "rondo_udp_flows_evicted_total{listener=\"dns\",cluster=\"echo\"}");
    let started = metric(admin, "rondo_udp_flows_started_total{listener=\"dns\",cluster=\"echo\"}");
    assert!(started >= (SOURCES / 2) as f64, "{started} flows started");
    assert!(evicted >= started - MAX_FLOWS as f64, "{evicted} evicted of {started}");
    assert!(answered >= SOURCES / 2, "{answered} of {SOURCES} datagrams answered");
    // 20,000 flows kept would hold 20,000 sockets and tasks; 500 hold a few MiB.
    let rss = rss_kib(pid);
    assert!(rss < rss_warm + 16 * 1024, "RSS grew from {rss_warm} KiB to {rss} KiB");
    // And the listener still serves.
    let c = client(Duration::from_secs(2));
    assert_eq!(ask(&c, listener, "after").as_deref(), Some("m:after"));
    stop.store(false, Ordering::Relaxed);
}

/// `rondo check` on `config`: its stderr (the check must fail).
fn check_fails(config: &str) -> String {
    let dir = TempDir::new("udp-check");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rondo"))
        .args(["check", path.to_str().unwrap()])
        .output()
        .expect("run rondo check");
    assert!(!out.status.success(), "check passed:\n{config}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// 1-based line and column of `needle` in `text`.
fn pos(text: &str, needle: &str) -> (usize, usize) {
    let at = text.find(needle).expect("needle in text");
    let before = &text[..at];
    (before.matches('\n').count() + 1, at - before.rfind('\n').map_or(0, |i| i + 1) + 1)
}

#[test]
fn check_names_each_udp_mistake_at_its_field() {
    let config = "[[listener]]\nname = \"dns\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"udp\"\n\
         max_connections = 10\nudp = { max_flows = 0, granularity = \"packet\", idle_timeout = \"0s\" }\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nudp = { max_flows = 5 }\n\n\
         [[route]]\nlistener = \"dns\"\ncluster = \"web\"\nmatch = { host = \"x\" }\n\n\
         [[route]]\nlistener = \"dns\"\ncluster = \"dns\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"dns\"\n\n\
         [cluster.web]\nmembers = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n\n\
         [cluster.dns]\nupstream_protocol = \"udp\"\nmembers = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n\
         health = { kind = \"tcp\" }\n\n\
         [cluster.probe]\nupstream_protocol = \"udp\"\nmembers = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n\
         health = { udp = { send = \"ping\", send_hex = \"00\", expect_hex = \"zz\" } }\n";
    let stderr = check_fails(config);
    let at = |needle: &str| {
        let (l, c) = pos(config, needle);
        format!("rondo.toml:{l}:{c}: field ")
    };
    for want in [
        format!("{}`listener[0].max_connections`: does not apply to a udp listener", at("10\n")),
        format!("{}`listener[0].udp.max_flows`: must be between 1 and 1048576, got 0", at("0, gran")),
        format!("{}`listener[0].udp.granularity`: unknown granularity `packet`, expected `flow` or `request`", at("\"packet")),
        format!("{}`listener[0].udp.idle_timeout_ms`: must be greater than 0", at("\"0s")),
        format!("{}`listener[1].udp`: only applies to listeners with protocol `udp`", at("{ max_flows = 5")),
        format!("{}`route[0].cluster`: udp listener `dns` cannot route to cluster `web` with upstream_protocol `http1`, it needs `udp`", at("\"web\"\nmatch")),
        format!("{}`route[0].match`: route on udp listener `dns` cannot have `match`", at("{ host")),
        "field `route[1].listener`: udp listener `dns` already has route `route-1`; a udp listener takes one route".to_owned(),
        "field `route[2].cluster`: http listener `web` cannot route to cluster `dns` with upstream_protocol `udp`, it needs `http1` or `http2`".to_owned(),
        format!("{}`cluster.dns.health.kind`: a udp cluster's members answer UDP on their address", at("\"tcp\"")),
        format!("{}`cluster.probe.health.udp.send_hex`: set `send` or `send_hex`, not both", at("\"00\"")),
        format!("{}`cluster.probe.health.udp.expect_hex`: `zz` is not hex", at("\"zz\"")),
    ] {
        assert!(stderr.contains(&want), "missing {want:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("needs `send` or `send_hex`"), "{stderr}");
    // The same clusters with a side port for the TCP check, and one payload: accepted.
    let dir = TempDir::new("udp-check-ok");
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        "[[listener]]\nname = \"dns\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"udp\"\n\
         udp = { max_flows = 100, granularity = \"request\", idle_timeout = \"5s\" }\n\n\
         [[route]]\nlistener = \"dns\"\ncluster = \"dns\"\nbackups = [\"probe\"]\n\n\
         [cluster.dns]\nupstream_protocol = \"udp\"\nalgorithm = \"least-sessions\"\n\
         members = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n\
         health = { kind = \"http\", path = \"/health\", port = 8080 }\n\n\
         [cluster.probe]\nupstream_protocol = \"udp\"\nmembers = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n\
         health = { udp = { send = \"ping\", expect = \"pong\" } }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rondo"))
        .args(["check", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
