//! DNS answers end to end: `dig` and hickory's resolver against `rondo_naming::dns::start` on
//! loopback, answering from a live view built from a config.
#![cfg(feature = "dns")]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use rondo_core::{Actor, AdminState};
use rondo_naming::dns::{self, DnsServer};
use rondo_runtime::{Live, clock};

const CONFIG: &str = r#"
[cluster.web]
algorithm = "round-robin"
members = [
  { name = "w1", address = "127.0.0.1:8001" },
  { name = "w2", address = "127.0.0.2:8002" },
  { name = "w3", address = "127.0.0.3:8003" },
  { name = "w4", address = "127.0.0.4:8004" },
  { name = "w5", address = "127.0.0.5:8005" },
]

[cluster.api]
algorithm = "weighted"
members = [
  { name = "a1", address = "127.0.0.11:9001", weight = 100 },
  { name = "a2", address = "127.0.0.12:9002", weight = 300 },
  { name = "a3", address = "127.0.0.13:9003", weight = 70000 },
  { name = "a4", address = "db.internal:9004", weight = 5 },
  { name = "a6", address = "[::1]:9006", weight = 7 },
]

[cluster.pair]
algorithm = "weighted"
members = [
  { name = "p1", address = "127.0.0.31:9201", weight = 1 },
  { name = "p2", address = "127.0.0.32:9202", weight = 3 },
]

[cluster.idle]
members = [{ name = "i1", address = "127.0.0.21:9101", state = "disabled" }]
"#;

fn live() -> Arc<Live> {
    live_with(CONFIG)
}

fn live_with(text: &str) -> Arc<Live> {
    let config = match rondo_config::parse_str(text, Path::new("test.toml"), 1) {
        Ok(c) => c,
        Err(e) => panic!("test config rejected: {e:?}"),
    };
    Arc::new(Live::new(config.view, None))
}

async fn serve(zone: &str) -> (Arc<Live>, DnsServer) {
    serve_with(zone, live()).await
}

async fn serve_with(zone: &str, live: Arc<Live>) -> (Arc<Live>, DnsServer) {
    let server =
        dns::start("127.0.0.1:0".parse().unwrap(), zone, &rondo_naming::NamingParts::of(&live))
            .await
            .expect("dns server starts");
    (live, server)
}

/// `dig @server -p port <args> +tries=1 +time=2`, its standard output (run off the runtime's
/// threads).
async fn dig(server: &DnsServer, args: &[&str]) -> String {
    let mut cmd = Command::new("dig");
    cmd.arg(format!("@{}", server.addr.ip()))
        .arg("-p")
        .arg(server.addr.port().to_string())
        .args(args)
        .args(["+tries=1", "+time=2"]);
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().expect("run dig");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `+short` lines of a query.
async fn short(server: &DnsServer, name: &str, rtype: &str) -> Vec<String> {
    let out = dig(server, &[name, rtype, "+short"]).await;
    out.lines().map(str::to_owned).filter(|l| !l.is_empty()).collect()
}

/// The `status:` of a query's response header (`NOERROR`, `NXDOMAIN`, ...).
async fn status(server: &DnsServer, name: &str, rtype: &str) -> (String, String) {
    let out = dig(server, &[name, rtype]).await;
    let status = out
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no status in dig output:\n{out}"))
        .to_owned();
    (status, out)
}

/// The number of answers dig reports (`ANSWER: n`).
fn answer_count(out: &str) -> usize {
    out.split("ANSWER: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no answer count in dig output:\n{out}"))
}

fn set(lines: &[String]) -> BTreeSet<&str> {
    lines.iter().map(String::as_str).collect()
}

fn index_of(live: &Live, cluster: &str, member: &str) -> usize {
    let snapshot = live.load();
    snapshot.clusters[cluster].spec.members.iter().position(|m| m.name == member).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_a_lists_members_that_take_new_work() {
    let (live, server) = serve("rondo.").await;
    let all = short(&server, "web.rondo.", "A").await;
    assert_eq!(
        set(&all),
        BTreeSet::from(["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"])
    );

    // Drain w2 and take w4 down: both leave the A answer (and the SRV answer).
    let snapshot = live.load();
    let rt = &snapshot.clusters["web"];
    let (w2, w4) = (index_of(&live, "web", "w2"), index_of(&live, "web", "w4"));
    rt.with(|b| b.set_admin(w2, AdminState::Draining, Actor::Operator("t".into())));
    rt.with(|b| b.set_health(w4, false, Actor::HealthCheck, clock::now()));
    let a = short(&server, "web.rondo.", "A").await;
    assert_eq!(set(&a), BTreeSet::from(["127.0.0.1", "127.0.0.3", "127.0.0.5"]));
    let srv = short(&server, "web.rondo.", "SRV").await;
    assert_eq!(
        set(&srv),
        BTreeSet::from([
            "0 100 8001 w1.web.rondo.",
            "0 100 8003 w3.web.rondo.",
            "0 100 8005 w5.web.rondo.",
        ])
    );

    // Names are case-insensitive; TCP answers too.
    let upper = short(&server, "WeB.RONDO.", "A").await;
    assert_eq!(set(&upper), set(&a));
    let tcp = dig(&server, &["web.rondo.", "A", "+short", "+tcp"]).await;
    let tcp: Vec<String> = tcp.lines().map(str::to_owned).collect();
    assert_eq!(set(&tcp), set(&a));

    // A drained member's own name still resolves (sessions may still go there).
    assert_eq!(short(&server, "w2.web.rondo.", "A").await, ["127.0.0.2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_srv_carries_weights_ports_and_targets() {
    let (_live, server) = serve("svc.example").await;
    let srv = short(&server, "api.svc.example.", "SRV").await;
    assert_eq!(
        set(&srv),
        BTreeSet::from([
            "0 100 9001 a1.api.svc.example.",
            "0 300 9002 a2.api.svc.example.",
            // Weights above 65535 are clamped.
            "0 65535 9003 a3.api.svc.example.",
            // A member at a host name is its own target.
            "0 5 9004 db.internal.",
            "0 7 9006 a6.api.svc.example.",
        ])
    );
    // `_<anything>._tcp.<service>` is the same set.
    let named = short(&server, "_http._tcp.api.svc.example.", "SRV").await;
    assert_eq!(set(&named), set(&srv));

    // Targets resolve, and their addresses come along in the additional section.
    let out = dig(&server, &["api.svc.example.", "SRV"]).await;
    assert!(out.contains("ADDITIONAL: 5"), "{out}"); // four addresses and the OPT record
    let lines: Vec<String> =
        out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    assert!(lines.iter().any(|l| l == "a1.api.svc.example. 0 IN A 127.0.0.11"), "{out}");
    assert!(lines.iter().any(|l| l == "a6.api.svc.example. 0 IN AAAA ::1"), "{out}");
    assert!(out.contains("flags: qr aa"), "authoritative: {out}");
    assert_eq!(short(&server, "a3.api.svc.example.", "A").await, ["127.0.0.13"]);

    // A lists IPv4 members only, AAAA IPv6 members only.
    let a = short(&server, "api.svc.example.", "A").await;
    assert_eq!(set(&a), BTreeSet::from(["127.0.0.11", "127.0.0.12", "127.0.0.13"]));
    assert_eq!(short(&server, "api.svc.example.", "AAAA").await, ["::1"]);

    // TTL 0: answers change with every view.
    let out = dig(&server, &["api.svc.example.", "A", "+noall", "+answer"]).await;
    assert!(out.lines().all(|l| l.split_whitespace().nth(1) == Some("0")), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_rotates_the_first_answer() {
    let (_live, server) = serve("rondo.").await;
    let mut firsts = Vec::new();
    for _ in 0..3 {
        let a = short(&server, "web.rondo.", "A").await;
        assert_eq!(a.len(), 5, "{a:?}");
        // The pick first, the others in configuration order.
        let rest: Vec<&String> = a.iter().skip(1).collect();
        let mut sorted = rest.clone();
        sorted.sort();
        assert_eq!(rest, sorted, "{a:?}");
        firsts.push(a[0].clone());
    }
    assert_eq!(set(&firsts).len(), 3, "first answers {firsts:?} do not rotate");
    // Consecutive picks of round robin are consecutive members.
    let last_octet = |s: &str| s.rsplit('.').next().unwrap().parse::<u32>().unwrap();
    for pair in firsts.windows(2) {
        assert_eq!(last_octet(&pair[1]), last_octet(&pair[0]) % 5 + 1, "{firsts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_first_answers_follow_the_weights() {
    let (_live, server) = serve("rondo.").await;
    // `weighted` gives each member exactly its weight in every cycle of sum(weights) picks.
    let mut led = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..20 {
        let a = short(&server, "pair.rondo.", "A").await;
        assert_eq!(a.len(), 2, "{a:?}");
        *led.entry(a[0].clone()).or_default() += 1;
    }
    let want = std::collections::BTreeMap::from([
        ("127.0.0.31".to_owned(), 5),
        ("127.0.0.32".to_owned(), 15),
    ]);
    assert_eq!(led, want);
}

fn resolver(server: &DnsServer) -> TokioResolver {
    let mut udp = ConnectionConfig::udp();
    udp.port = server.addr.port();
    let ns = NameServerConfig::new(server.addr.ip(), true, vec![udp]);
    let mut opts = ResolverOpts::default();
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 1;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.cache_size = 0;
    TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .expect("resolver")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hickory_resolver_reads_a_and_srv() {
    let (live, server) = serve("rondo.").await;
    let snapshot = live.load();
    let w3 = index_of(&live, "web", "w3");
    snapshot.clusters["web"].with(|b| b.set_health(w3, false, Actor::HealthCheck, clock::now()));
    let resolver = resolver(&server);

    let a = resolver.ipv4_lookup("web.rondo.").await.expect("A lookup");
    let ips: BTreeSet<Ipv4Addr> = a
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    let want: BTreeSet<Ipv4Addr> =
        [1, 2, 4, 5].into_iter().map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    assert_eq!(ips, want);

    let srv = resolver.srv_lookup("_grpc._tcp.api.rondo.").await.expect("SRV lookup");
    let mut got: Vec<(u16, u16, u16, String)> = srv
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((s.priority, s.weight, s.port, s.target.to_string())),
            _ => None,
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (0, 5, 9004, "db.internal.".to_owned()),
            (0, 7, 9006, "a6.api.rondo.".to_owned()),
            (0, 100, 9001, "a1.api.rondo.".to_owned()),
            (0, 300, 9002, "a2.api.rondo.".to_owned()),
            (0, 65535, 9003, "a3.api.rondo.".to_owned()),
        ]
    );
    let extra: BTreeSet<IpAddr> = srv
        .additionals()
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    assert_eq!(extra.len(), 4, "{extra:?}");

    // The resolver sees NXDOMAIN for an unknown service.
    let err = resolver.ipv4_lookup("nope.rondo.").await.expect_err("unknown service");
    assert!(err.is_nx_domain(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_codes() {
    let (_live, server) = serve("rondo.").await;
    // Unknown service or member: NXDOMAIN.
    assert_eq!(status(&server, "nope.rondo.", "A").await.0, "NXDOMAIN");
    assert_eq!(status(&server, "w9.web.rondo.", "A").await.0, "NXDOMAIN");
    assert_eq!(status(&server, "a.b.c.web.rondo.", "A").await.0, "NXDOMAIN");
    // Outside the zone: REFUSED.
    assert_eq!(status(&server, "web.example.com.", "A").await.0, "REFUSED");
    assert_eq!(status(&server, ".", "NS").await.0, "REFUSED");
    // Another class: REFUSED.
    let out = dig(&server, &["-c", "CH", "web.rondo.", "TXT"]).await;
    assert!(out.contains("status: REFUSED"), "{out}");
    // Known name, other type; service with no member that may take work; the apex's other
    // types: NODATA.
    for (name, rtype) in [("web.rondo.", "TXT"), ("idle.rondo.", "A"), ("rondo.", "NS")] {
        let (code, out) = status(&server, name, rtype).await;
        assert_eq!(code, "NOERROR", "{name} {rtype}");
        assert_eq!(answer_count(&out), 0, "{name} {rtype}: {out}");
    }
}

/// The records of a dig output's authority section.
fn authority(out: &str) -> Vec<String> {
    out.split(";; AUTHORITY SECTION:")
        .nth(1)
        .map(|s| s.lines().skip(1).take_while(|l| !l.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apex_has_an_soa_that_negative_answers_carry_with_no_caching() {
    let (live, server) = serve("rondo.").await;
    let view = live.load().view.id as u32;
    // The apex's SOA: serial the view id, TTL and minimum 0.
    let soa = short(&server, "rondo.", "SOA").await;
    assert_eq!(soa, [format!("rondo. hostmaster.rondo. {view} 60 60 3600 0")], "{soa:?}");
    // NXDOMAIN and NODATA carry it in the authority section (RFC 2308), TTL 0; positive
    // answers do not.
    for (name, rtype, code) in [
        ("nope.rondo.", "A", "NXDOMAIN"),
        ("idle.rondo.", "A", "NOERROR"),
        ("web.rondo.", "TXT", "NOERROR"),
        ("rondo.", "A", "NOERROR"),
    ] {
        let (got, out) = status(&server, name, rtype).await;
        assert_eq!(got, code, "{name} {rtype}");
        let auth = authority(&out);
        assert_eq!(auth.len(), 1, "{name} {rtype}: {out}");
        let fields: Vec<&str> = auth[0].split_whitespace().collect();
        assert_eq!(fields[..4], ["rondo.", "0", "IN", "SOA"], "{name} {rtype}: {out}");
        assert_eq!(fields.last(), Some(&"0"), "minimum 0: {out}");
    }
    let (_, out) = status(&server, "web.rondo.", "A").await;
    assert!(answer_count(&out) > 0 && authority(&out).is_empty(), "{out}");
    // No zone transfer: the zone is made per query.
    let out = dig(&server, &["rondo.", "AXFR"]).await;
    assert!(out.contains("Transfer failed"), "{out}");
    assert!(!out.contains("hostmaster"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_does_not_kill_the_server() {
    let (_live, server) = serve("rondo.").await;
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut junk: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff],
        vec![0; 5],
        vec![0xff; 12],
        vec![0xff; 512],
        // A header claiming 60000 questions, then nothing.
        vec![0x12, 0x34, 0x01, 0x00, 0xea, 0x60, 0, 0, 0, 0, 0, 0],
        // A question whose name points to itself.
        vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1],
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in [13, 40, 100, 300, 1000] {
        junk.push(
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect(),
        );
    }
    for j in &junk {
        sock.send_to(j, server.addr).await.unwrap();
    }
    // Garbage over TCP too.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tcp, &[0, 20, 0xff, 0xfe, 1, 2, 3]).await.unwrap();
    drop(tcp);

    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = short(&server, "web.rondo.", "A").await;
    assert_eq!(a.len(), 5, "{a:?}");
    let tcp = dig(&server, &["web.rondo.", "A", "+short", "+tcp"]).await;
    assert_eq!(tcp.lines().count(), 5, "{tcp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_closes_the_sockets() {
    let (_live, server) = serve("rondo.").await;
    let addr: SocketAddr = server.addr;
    assert_eq!(short(&server, "web.rondo.", "A").await.len(), 5);
    server.stop();
    let mut freed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if std::net::UdpSocket::bind(addr).is_ok() && std::net::TcpListener::bind(addr).is_ok() {
            freed = true;
            break;
        }
    }
    assert!(freed, "{addr} still bound after stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_truncate_over_udp_and_complete_over_tcp() {
    let members: Vec<String> = (1..=120)
        .map(|i| format!("  {{ name = \"m{i}\", address = \"127.0.1.{i}:80\" }},"))
        .collect();
    let text = format!("[cluster.big]\nmembers = [\n{}\n]\n", members.join("\n"));
    let (_live, server) = serve_with("rondo.", live_with(&text)).await;
    // Without EDNS a UDP answer is at most 512 bytes: truncated, flagged TC.
    let out = dig(&server, &["big.rondo.", "A", "+noedns", "+ignore"]).await;
    assert!(out.contains("flags: qr aa tc"), "{out}");
    // dig retries over TCP on TC and gets all of them.
    let all = short(&server, "big.rondo.", "A").await;
    assert_eq!(all.len(), 120, "{all:?}");
    let srv = dig(&server, &["big.rondo.", "SRV", "+short", "+noedns"]).await;
    assert_eq!(srv.lines().count(), 120, "{srv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edns_and_any() {
    let (_live, server) = serve("rondo.").await;
    // EDNS versions above 0 are BADVERS.
    let out = dig(&server, &["web.rondo.", "A", "+edns=1", "+noednsnegotiation"]).await;
    assert!(out.contains("status: BADVERS"), "{out}");
    // ANY on a service gives its addresses.
    let any = short(&server, "api.rondo.", "ANY").await;
    assert_eq!(set(&any), BTreeSet::from(["127.0.0.11", "127.0.0.12", "127.0.0.13", "::1"]));
}

#[tokio::test]
async fn bad_zone_is_an_error() {
    let err =
        dns::start("127.0.0.1:0".parse().unwrap(), ".", &rondo_naming::NamingParts::of(&live()))
            .await
            .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
