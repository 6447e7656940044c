//! A tier of `rondo serve` processes sharing one real etcd (started by the tests on free
//! loopback ports): registrations through any router reach all of them, leases lapse
//! everywhere, the shared config changes every router, and routers keep serving their last view
//! while etcd is killed, stopped or cut off, then converge.

#![cfg(feature = "etcd")]

mod common;
#[path = "../../rondo-naming/tests/support/mod.rs"]
mod etcd_support;
#[path = "router/support.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Proc, TempDir};
use etcd_support::{Etcd, Proxy};
use http::{Method, StatusCode};
use rondo::member::Member;
use serde_json::{Value, json};
use support::*;

/// One `rondo serve` of the tier.
struct Router {
    proc: Proc,
    web: SocketAddr,
    naming: SocketAddr,
    _dir: TempDir,
}

/// The cluster every router configures locally: `c` with member `m1`.
fn config(etcd: &str, m1: &Member) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{}\" }}]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nregistry = \"etcd\"\n\
         etcd_endpoints = [\"{etcd}\"]\netcd_prefix = \"/tier\"\n",
        m1.addr
    )
}

impl Router {
    /// Starts `rondo serve` against etcd at `etcd` (an endpoint, or a proxy in front of it).
    fn start(etcd: &str, m1: &Member) -> Router {
        let dir = TempDir::new("etcd-tier");
        let file = dir.0.join("rondo.toml");
        std::fs::write(&file, config(etcd, m1)).unwrap();
        let mut proc = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
        let web = proc.addr_after("rondo: listener web on");
        let naming = proc.addr_after("rondo: naming API (registry etcd) on");
        Router { proc, web, naming, _dir: dir }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.naming)
    }

    async fn call(&self, method: Method, path: &str, body: Option<&str>) -> (StatusCode, Value) {
        let (status, _, v) = json_call(method, &self.url(path), &[], body).await;
        (status, v)
    }

    /// Member names of `c` in this router's full answer.
    async fn listed(&self) -> Vec<String> {
        let (status, v) = self.call(Method::GET, "/v1/services/c", None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let mut names: Vec<String> = v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    async fn registry(&self) -> Value {
        let (status, v) = self.call(Method::GET, "/v1/status", None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["registry"].clone()
    }

    async fn register(&self, m: &Member, ttl_ms: u64) -> (StatusCode, Value) {
        let body = json!({ "address": m.addr.to_string(), "ttl_ms": ttl_ms }).to_string();
        self.call(Method::PUT, &format!("/v1/services/c/members/{}", m.name), Some(&body)).await
    }
}

/// Polls every router (every 20 ms, at most `limit`) until each lists exactly `want`; returns
/// how long it took.
async fn until_all_list(routers: &[&Router], want: &[&str], limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let mut all = true;
        for r in routers {
            if r.listed().await != want {
                all = false;
                break;
            }
        }
        if all {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            let mut got = Vec::new();
            for r in routers {
                got.push(r.listed().await);
            }
            panic!("after {limit:?} the routers list {got:?}, want {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `cond` holds on the router's registry status (at most `limit`).
async fn until_status(r: &Router, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = r.registry().await;
        if cond(&s) {
            return s;
        }
        assert!(start.elapsed() < limit, "registry status still {s} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GETs through every router's web listener from 2 tasks per router, one every 10 ms each,
/// until `stop` (bounded: at most 10 minutes' worth); counts successes and failures.
struct Load {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(routers: &[&Router]) -> Load {
        let (ok, failed, stop) = (Arc::default(), Arc::default(), Arc::default());
        let mut tasks = Vec::new();
        for r in routers {
            for _ in 0..2 {
                let url = format!("http://{}/", r.web);
                let (ok, failed, stop): (Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicBool>) =
                    (Arc::clone(&ok), Arc::clone(&failed), Arc::clone(&stop));
                tasks.push(tokio::spawn(async move {
                    let c = client();
                    for _ in 0..60_000 {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let req = http::Request::get(&url).body(Default::default()).unwrap();
                        let fut = tokio::time::timeout(Duration::from_secs(5), c.request(req));
                        match fut.await {
                            Ok(Ok(resp)) if resp.status() == StatusCode::OK => {
                                let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }));
            }
        }
        Load { ok, failed, stop, tasks }
    }

    /// Stops the load; (succeeded, failed).
    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_leases_and_the_shared_config_reach_every_router_of_the_tier() {
    let etcd = Etcd::start();
    let ms = members(4, Duration::ZERO).await;
    let routers: Vec<Router> = (0..3).map(|_| Router::start(&etcd.endpoint(), &ms[0])).collect();
    let [a, b, c] = [&routers[0], &routers[1], &routers[2]];
    let tier = [a, b, c];
    until_all_list(&tier, &["m1"], Duration::from_secs(5)).await;
    for r in tier {
        let s = until_status(r, Duration::from_secs(5), |s| s["connected"] == true).await;
        assert_eq!(s["backend"], "etcd");
    }

    // Registered through one router: listed by all three within one second, and routable.
    let (status, lease) = a.register(&ms[1], 3_000).await;
    assert_eq!(status, StatusCode::OK, "{lease}");
    let lease = lease["lease"].as_str().unwrap().to_owned();
    let took = until_all_list(&tier, &["m1", "m2"], Duration::from_secs(1)).await;
    println!("registration seen by all three routers after {took:?}");
    for r in tier {
        let served = served_by(&format!("http://{}/", r.web), 4).await;
        assert!(served.contains(&"m2".to_owned()), "{served:?}");
    }

    // Kept alive through the other routers past its 3 s TTL.
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = if i % 2 == 0 { b } else { c };
        let (status, v) =
            r.call(Method::POST, &format!("/v1/leases/{lease}/keepalive"), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    assert_eq!(a.listed().await, ["m1", "m2"], "alive after 5 s on a 3 s lease");

    // Deregistered through a third router: gone everywhere.
    let (status, v) = c.call(Method::DELETE, "/v1/services/c/members/m2", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    until_all_list(&tier, &["m1"], Duration::from_secs(1)).await;

    // A lease that is not kept alive lapses and the member leaves every router.
    let (status, v) = b.register(&ms[2], 1_000).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    until_all_list(&tier, &["m1", "m3"], Duration::from_secs(1)).await;
    let took = until_all_list(&tier, &["m1"], Duration::from_secs(5)).await;
    println!("1 s lease lapsed everywhere {took:?} after all routers listed it");

    // The shared configuration, put through one router, replaces every router's clusters.
    let shared = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"weighted\"\nmembers = [\n\
         {{ name = \"m1\", address = \"{}\" }},\n{{ name = \"m4\", address = \"{}\" }},\n]\n",
        ms[0].addr, ms[3].addr
    );
    let (status, v) = b.call(Method::PUT, "/v1/config", Some(&shared)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    until_all_list(&tier, &["m1", "m4"], Duration::from_secs(1)).await;
    let (_, answer) = c.call(Method::GET, "/v1/services/c", None).await;
    assert_eq!(answer["policy"]["algorithm"], "weighted");
    // An invalid shared config is refused with the field and changes nothing.
    let bad = shared.replace("weighted", "fastest");
    let (status, v) = a.call(Method::PUT, "/v1/config", Some(&bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("cluster.c.algorithm"), "{v}");
    assert_eq!(c.listed().await, ["m1", "m4"]);
}

/// Kills (`stop = false`) or stops (`stop = true`) etcd for 20 s under load through two
/// routers: no request fails, the routers report the disconnection, refuse registrations
/// clearly, and converge when etcd is back.
async fn etcd_outage(stop: bool) {
    let mut etcd = Etcd::start();
    let ms = members(3, Duration::ZERO).await;
    let routers: Vec<Router> = (0..2).map(|_| Router::start(&etcd.endpoint(), &ms[0])).collect();
    let tier = [&routers[0], &routers[1]];
    let (status, v) = tier[0].register(&ms[1], 120_000).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    until_all_list(&tier, &["m1", "m2"], Duration::from_secs(2)).await;

    let load = Load::start(&tier);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let outage = Instant::now();
    if stop {
        etcd.pause()
    } else {
        etcd.kill()
    }
    for r in tier {
        let s = until_status(r, Duration::from_secs(10), |s| s["connected"] == false).await;
        assert!(s["last_error"].is_string(), "{s}");
    }
    println!("disconnection reported after {:?}", outage.elapsed());
    let (status, v) = tier[1].register(&ms[2], 60_000).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(v["error"].as_str().unwrap().contains("etcd"), "{v}");
    for r in tier {
        assert_eq!(r.listed().await, ["m1", "m2"], "the last view is kept");
    }
    let left = Duration::from_secs(20).saturating_sub(outage.elapsed());
    tokio::time::sleep(left).await;
    let back = Instant::now();
    if stop {
        etcd.resume()
    } else {
        etcd.restart()
    }
    for r in tier {
        until_status(r, Duration::from_secs(15), |s| s["connected"] == true).await;
    }
    println!("reconnected {:?} after etcd came back", back.elapsed());
    let (status, v) = tier[1].register(&ms[2], 60_000).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    until_all_list(&tier, &["m1", "m2", "m3"], Duration::from_secs(2)).await;
    let (ok, failed) = load.finish().await;
    println!("{ok} requests succeeded, {failed} failed");
    assert!(ok > 1_000, "the load ran: {ok}");
    assert_eq!(failed, 0, "requests failed while etcd was away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_serve_through_an_etcd_kill_and_converge_when_it_is_back() {
    etcd_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_serve_through_a_stopped_etcd_and_converge_when_it_continues() {
    etcd_outage(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_cut_off_from_etcd_converges_to_the_changes_made_meanwhile() {
    let etcd = Etcd::start();
    let ms = members(4, Duration::ZERO).await;
    let proxy = Proxy::start(&etcd.endpoint());
    let a = Router::start(&etcd.endpoint(), &ms[0]);
    let mut b = Router::start(&proxy.endpoint(), &ms[0]);
    let (status, v) = a.register(&ms[1], 120_000).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    until_all_list(&[&a, &b], &["m1", "m2"], Duration::from_secs(2)).await;

    // Its etcd connection silently blocked: b keeps its view and says it is cut off.
    proxy.pause();
    until_status(&b, Duration::from_secs(10), |s| s["connected"] == false).await;
    a.register(&ms[2], 120_000).await;
    let (status, _) = a.call(Method::DELETE, "/v1/services/c/members/m2", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(a.listed().await, ["m1", "m3"]);
    assert_eq!(b.listed().await, ["m1", "m2"], "cut off: the last view");
    assert_eq!(served_by(&format!("http://{}/", b.web), 4).await.len(), 4, "still serving");
    proxy.resume();
    let took = until_all_list(&[&b], &["m1", "m3"], Duration::from_secs(10)).await;
    println!("cut-off router converged {took:?} after its connection came back");

    // The router process itself paused while members change.
    let pid = b.proc.child.id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig}");
    };
    signal("-STOP");
    a.register(&ms[3], 120_000).await;
    a.call(Method::DELETE, "/v1/services/c/members/m3", None).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    signal("-CONT");
    let took = until_all_list(&[&a, &b], &["m1", "m4"], Duration::from_secs(10)).await;
    println!("paused router converged {took:?} after SIGCONT");
    b.proc.kill();
}

/// A router of the tier with an admin API and a tier-wide `rate_limit` (one request an hour per
/// `x-k`, burst 4: no refill while the test runs): its web and admin addresses.
fn limited_router(etcd: &str, m1: &Member) -> (Proc, SocketAddr, SocketAddr, TempDir) {
    let dir = TempDir::new("etcd-tier-limit");
    let text = config(etcd, m1).replace(
        "cluster = \"c\"\n\n",
        "cluster = \"c\"\nfilters = [ { rate_limit = { key = \"header:x-k\", rate = \"1/h\", \
         burst = 4, scope = \"tier\" } } ]\n\n",
    ) + "\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"tier-admin\"\n";
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, text).unwrap();
    let mut proc = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
    let web = proc.addr_after("rondo: listener web on");
    let admin = proc.addr_after("rondo: admin API on");
    (proc, web, admin, dir)
}

/// `rondo_tier_routers` on the admin API at `admin`.
fn tier_routers(admin: SocketAddr) -> Option<u64> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-H", "Authorization: Bearer tier-admin"])
        .arg(format!("http://{admin}/metrics"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find_map(|l| l.strip_prefix("rondo_tier_routers ")?.trim().parse().ok())
}

/// Waits (at most `limit`) until the router at `admin` counts `want` routers in its tier.
async fn until_tier(admin: SocketAddr, want: u64, limit: Duration) {
    let start = Instant::now();
    loop {
        let now = tier_routers(admin);
        if now == Some(want) {
            return;
        }
        assert!(start.elapsed() < limit, "tier still counts {now:?} routers, want {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Of 10 requests with `x-k: key` to `web`, how many were admitted (the rest got 429).
async fn admitted(web: SocketAddr, key: &str) -> usize {
    let c = client();
    let mut n = 0;
    for _ in 0..10 {
        let r = get_with(&c, &format!("http://{web}/"), &[("x-k", key)]).await;
        assert!(matches!(r.status.as_u16(), 200 | 429), "{r:?}");
        n += usize::from(r.status == StatusCode::OK);
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_rate_limit_is_shared_by_the_routers_present_in_etcd() {
    let etcd = Etcd::start();
    let ms = members(1, Duration::ZERO).await;
    let (_a, a_web, a_admin, _da) = limited_router(&etcd.endpoint(), &ms[0]);
    until_tier(a_admin, 1, Duration::from_secs(10)).await;
    assert_eq!(admitted(a_web, "alone").await, 4, "one router takes the whole burst");

    // A second router joins: each takes half.
    let (mut b, b_web, b_admin, _db) = limited_router(&etcd.endpoint(), &ms[0]);
    until_tier(a_admin, 2, Duration::from_secs(10)).await;
    until_tier(b_admin, 2, Duration::from_secs(10)).await;
    assert_eq!(admitted(a_web, "pair").await, 2, "router a's share");
    assert_eq!(admitted(b_web, "pair").await, 2, "router b's share");

    // It dies without a word: its lease runs out and the other takes the whole rate again.
    b.kill();
    let ttl = rondo_naming::presence::TTL_SECS as u64;
    until_tier(a_admin, 1, Duration::from_secs(ttl + 10)).await;
    assert_eq!(admitted(a_web, "alone-again").await, 4);
}
