//! Members discovered through DNS (issue 38): a real `rondo serve` process resolving names on a
//! real dnsmasq started on a free loopback port, with `rondo member` processes on 127.0.0.x.
//! A records become members that serve; a record added or removed is followed after the TTL
//! with survivors keeping their state; the server killed leaves the last answer in place and
//! counts the failures; SRV records give ports and weights.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ChildGuard, Proc, TempDir, free_port, request, start_member};

/// dnsmasq answering from `dir/hosts` (re-read on SIGHUP) with a TTL of 1 s and the given
/// `--srv-host` records, on a free loopback port; `None` (the test is skipped with a message)
/// when dnsmasq is not installed outside CI.
fn dnsmasq(dir: &Path, srv: &[String]) -> Option<(ChildGuard, SocketAddr)> {
    if Command::new("dnsmasq").arg("--version").stdout(Stdio::null()).status().is_err() {
        assert!(std::env::var_os("CI").is_none(), "dnsmasq is not installed (.ci/run installs it)");
        eprintln!("dnsmasq is not installed: skipped");
        return None;
    }
    let srv: Vec<String> = srv.iter().map(|s| format!("--srv-host={s}")).collect();
    Some(common::dnsmasq(dir, 1, &srv))
}

/// `rondo serve` with `config`, and its `web` listener and admin API addresses.
fn serve(dir: &Path, config: &str) -> (Proc, SocketAddr, SocketAddr) {
    let path = dir.join("rondo.toml");
    std::fs::write(&path, config).expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    let web = p.addr_after("rondo: listener web on ");
    let admin = p.addr_after("rondo: admin API on ");
    (p, web, admin)
}

const TOKEN: &str = "dns-test-token-0123456789";

/// One admin API call with the token: status and body.
fn admin_call(admin: SocketAddr, method: &str, path: &str) -> (u16, String) {
    common::request_with(admin, method, path, &format!("Authorization: Bearer {TOKEN}\r\n"), b"")
}

fn config(cluster: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"api\"\n\n\
         [cluster.api]\nalgorithm = \"round-robin\"\n{cluster}\n"
    )
}

/// The members of cluster `api` by name, with their `admin` state and weight.
fn members(admin: SocketAddr) -> Vec<(String, String, u64)> {
    let (status, body) = admin_call(admin, "GET", "/api/v1/status");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("status json");
    let cluster = v["clusters"].as_array().unwrap().iter().find(|c| c["name"] == "api").unwrap();
    cluster["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap().to_owned();
            (name, m["admin"].as_str().unwrap().to_owned(), m["weight"].as_u64().unwrap())
        })
        .collect()
}

fn names(admin: SocketAddr) -> BTreeSet<String> {
    members(admin).into_iter().map(|(n, _, _)| n).collect()
}

/// Waits (10 s at most) until `api`'s member names are `want`.
fn wait_for_members(admin: SocketAddr, want: &[String]) {
    let want: BTreeSet<String> = want.iter().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = names(admin);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "members {got:?}, expected {want:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of the metric line starting with `series` (0 when absent).
fn metric(admin: SocketAddr, series: &str) -> f64 {
    let (status, body) = admin_call(admin, "GET", "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

/// Which members serve `n` requests through `web`.
fn served_by(web: SocketAddr, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|_| {
            let (status, body) = request(web, "GET", "/", b"");
            assert_eq!(status, 200, "{body}");
            body.trim().to_owned()
        })
        .collect()
}

/// A port free on 127.0.0.2, .3 and .4 (members behind one name share the port).
fn port_free_on_all() -> u16 {
    for _ in 0..50 {
        let port = free_port();
        let free = (2..=4).all(|i| {
            std::net::TcpListener::bind(("127.0.0.".to_owned() + &i.to_string(), port)).is_ok()
        });
        if free {
            return port;
        }
    }
    panic!("no port free on 127.0.0.2-4");
}

fn hup(child: &ChildGuard) {
    child.signal("-HUP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_records_become_members_that_follow_the_answer_and_survive_a_dead_server() {
    let dir = TempDir::new("dnsd");
    let port = port_free_on_all();
    let hosts = dir.0.join("hosts");
    std::fs::write(&hosts, "127.0.0.2 api.test\n127.0.0.3 api.test\n").unwrap();
    let Some((dns, dns_addr)) = dnsmasq(&dir.0, &[]) else { return };
    let (_m2, _) = start_member("m2", &format!("127.0.0.2:{port}"));
    let (_m3, _) = start_member("m3", &format!("127.0.0.3:{port}"));
    let (_m4, _) = start_member("m4", &format!("127.0.0.4:{port}"));
    let (_serve, web, admin) = serve(
        &dir.0,
        &config(&format!(
            "members_dns = {{ name = \"api.test\", port = {port}, refresh = \"2s\", \
             resolver = \"{dns_addr}\" }}"
        )),
    );
    let m = |i: u8| format!("127.0.0.{i}:{port}");

    // Two A records: two members, both serving.
    wait_for_members(admin, &[m(2), m(3)]);
    assert_eq!(served_by(web, 8), BTreeSet::from(["m2".to_owned(), "m3".to_owned()]));
    assert_eq!(metric(admin, "rondo_dns_members{cluster=\"api\"}"), 2.0);

    // A survivor keeps its state: drained, it stays drained when the answer changes.
    let (status, body) =
        admin_call(admin, "POST", &format!("/api/v1/clusters/api/members/{}/drain", m(2)));
    assert_eq!(status, 200, "{body}");
    std::fs::write(&hosts, "127.0.0.2 api.test\n127.0.0.4 api.test\n").unwrap();
    hup(&dns);
    wait_for_members(admin, &[m(2), m(4)]);
    let state: Vec<_> = members(admin).into_iter().map(|(n, a, _)| (n, a)).collect();
    assert_eq!(state, [(m(2), "draining".to_owned()), (m(4), "active".to_owned())]);
    assert_eq!(served_by(web, 6), BTreeSet::from(["m4".to_owned()]));

    // The server gone: the last answer stays, the failures are counted.
    let errors = "rondo_dns_resolutions_total{cluster=\"api\",result=\"error\"}";
    assert_eq!(metric(admin, errors), 0.0);
    drop(dns);
    let deadline = Instant::now() + Duration::from_secs(15);
    while metric(admin, errors) < 1.0 {
        assert!(Instant::now() < deadline, "no failed resolution counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(names(admin), BTreeSet::from([m(2), m(4)]));
    assert_eq!(served_by(web, 4), BTreeSet::from(["m4".to_owned()]));
    assert!(metric(admin, "rondo_dns_resolutions_total{cluster=\"api\",result=\"ok\"}") >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_give_ports_and_weights_beside_static_members() {
    let dir = TempDir::new("dnsd");
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    std::fs::write(
        dir.0.join("hosts"),
        "127.0.0.2 a.api.test\n127.0.0.3 b.api.test\n127.0.0.4 c.api.test\n",
    )
    .unwrap();
    let srv = [
        format!("_http._tcp.api.test,a.api.test,{pa},0,10"),
        format!("_http._tcp.api.test,b.api.test,{pb},0,30"),
        // A target without addresses (not among the answer's additional records, looked up
        // on its own: NXDOMAIN): no member.
        format!("_http._tcp.api.test,gone.api.test,{pc},0,5"),
        // A higher priority number: a fallback, left out while the lowest has records.
        format!("_http._tcp.api.test,c.api.test,{pc},1,50"),
    ];
    let Some((_dns, dns_addr)) = dnsmasq(&dir.0, &srv) else { return };
    let (_a, _) = start_member("a", &format!("127.0.0.2:{pa}"));
    let (_b, _) = start_member("b", &format!("127.0.0.3:{pb}"));
    let (_s, s_addr) = start_member("s", "127.0.0.1:0");
    let statics = format!("members = [{{ name = \"s\", address = \"{s_addr}\", weight = 5 }}]");
    let (serve, web, admin) = serve(
        &dir.0,
        &config(&format!(
            "{statics}\n\
             members_dns = {{ srv = \"_http._tcp.api.test\", refresh = \"1s\", \
             resolver = \"{dns_addr}\" }}"
        )),
    );
    let (a, b) = (format!("127.0.0.2:{pa}"), format!("127.0.0.3:{pb}"));
    wait_for_members(admin, &["s".to_owned(), a.clone(), b.clone()]);
    let weights: Vec<_> = members(admin).into_iter().map(|(n, _, w)| (n, w)).collect();
    assert_eq!(weights, [("s".to_owned(), 5), (a, 10), (b, 30)]);
    assert_eq!(served_by(web, 9), BTreeSet::from(["a".to_owned(), "b".to_owned(), "s".to_owned()]));

    // A reload without `members_dns` drops its members and their series.
    assert_eq!(metric(admin, "rondo_dns_members{cluster=\"api\"}"), 2.0);
    std::fs::write(dir.0.join("rondo.toml"), config(&statics)).unwrap();
    let ok = Command::new("kill")
        .args(["-HUP", &serve.child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -HUP rondo serve");
    wait_for_members(admin, &["s".to_owned()]);
    let (_, body) = admin_call(admin, "GET", "/metrics");
    assert!(!body.contains("rondo_dns_members{"), "{body}");
}

/// One answer gives at most `max_members` members, the first by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_gives_at_most_max_members() {
    let dir = TempDir::new("dnsd");
    let hosts: String = (2..=6).map(|i| format!("127.0.0.{i} many.test\n")).collect();
    std::fs::write(dir.0.join("hosts"), hosts).unwrap();
    let Some((_dns, dns_addr)) = dnsmasq(&dir.0, &[]) else { return };
    let port = free_port();
    let (_serve, _web, admin) = serve(
        &dir.0,
        &config(&format!(
            "members_dns = {{ name = \"many.test\", port = {port}, max_members = 3, \
             resolver = \"{dns_addr}\" }}"
        )),
    );
    let want: Vec<String> = (2..=4).map(|i| format!("127.0.0.{i}:{port}")).collect();
    wait_for_members(admin, &want);
    assert_eq!(metric(admin, "rondo_dns_members{cluster=\"api\"}"), 3.0);
}

/// AAAA records are members too, named `[IP]:PORT`, and serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aaaa_records_become_bracketed_members() {
    let dir = TempDir::new("dnsd");
    std::fs::write(dir.0.join("hosts"), "127.0.0.2 both.test\n::1 both.test\n").unwrap();
    let Some((_dns, dns_addr)) = dnsmasq(&dir.0, &[]) else { return };
    let port = port_free_on_all();
    let (_v4, _) = start_member("v4", &format!("127.0.0.2:{port}"));
    let (_v6, _) = start_member("v6", &format!("[::1]:{port}"));
    let (_serve, web, admin) = serve(
        &dir.0,
        &config(&format!(
            "members_dns = {{ name = \"both.test\", port = {port}, resolver = \"{dns_addr}\" }}"
        )),
    );
    wait_for_members(admin, &[format!("127.0.0.2:{port}"), format!("[::1]:{port}")]);
    assert_eq!(served_by(web, 6), BTreeSet::from(["v4".to_owned(), "v6".to_owned()]));
}
