//! The naming service over real sockets with the embedded registry: an in-process router with
//! the naming API on a free port (same code `rondo serve` runs), plus `rondo serve` processes
//! for the snapshot and the command line.

mod common;
#[path = "router/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Proc, TempDir};
use http::{HeaderMap, Method, StatusCode};
use rondo::member::Member;
use rondo_core::{Actor, AdminState};
use rondo_naming::Registry;
use rondo_naming::api::{ApiOptions, NamingServer, OwnAddress};
use serde_json::{Value, json};
use support::*;

/// A router over cluster `c` (listener `web`) with the naming API and an embedded registry.
struct Setup {
    router: TestRouter,
    api: NamingServer,
    _registry: Registry,
}

impl Setup {
    async fn new(cluster: &str) -> Setup {
        Setup::with_token(cluster, None).await
    }

    async fn with_token(cluster: &str, token: Option<&str>) -> Setup {
        let router = router(&one_cluster(cluster)).await;
        let spec = rondo_config::RegistrySpec::Embedded { snapshot: None };
        let registry =
            rondo_naming::start_registry(&spec, &rondo_naming::NamingParts::of(&router.live))
                .expect("registry");
        let token = token.map(|t| t.as_bytes().to_vec());
        let api = rondo_naming::api::start(
            any_port(),
            &rondo_naming::NamingParts::of(&router.live),
            registry.clone(),
            token,
        )
        .await
        .expect("naming API starts");
        Setup { router, api, _registry: registry }
    }

    /// With caps, an optional snapshot file, and the listener `web` as an own address.
    async fn with_registry(
        cluster: &str,
        limits: rondo_naming::Limits,
        snapshot: Option<std::path::PathBuf>,
    ) -> Setup {
        let router = router(&one_cluster(cluster)).await;
        let spec = rondo_config::RegistrySpec::Embedded { snapshot };
        let registry = rondo_naming::start_registry_with(
            &spec,
            limits,
            &rondo_naming::NamingParts::of(&router.live),
        )
        .expect("registry");
        let own = vec![OwnAddress { what: "listener web".to_owned(), addr: router.addr("web") }];
        let opts = ApiOptions { own, ..ApiOptions::default() };
        let api = rondo_naming::api::start_with(
            any_port(),
            &rondo_naming::NamingParts::of(&router.live),
            registry.clone(),
            opts,
        )
        .await
        .expect("naming API starts");
        Setup { router, api, _registry: registry }
    }

    /// `PUT` a registration of `member` at `address` into `c`.
    async fn put(&self, member: &str, address: &str) -> Call {
        let body = json!({ "address": address, "ttl_ms": 600_000 }).to_string();
        self.call(Method::PUT, &format!("/v1/services/c/members/{member}"), Some(&body)).await
    }

    async fn call(&self, method: Method, path: &str, body: Option<&str>) -> Call {
        let url = format!("http://{}{}", self.api.addr, path);
        let (status, headers, body) = json_call(method, &url, &[], body).await;
        Call { status, headers, body }
    }

    async fn get(&self, path: &str) -> Call {
        self.call(Method::GET, path, None).await
    }

    async fn register(&self, member: &Member, ttl_ms: u64) -> String {
        let body = json!({ "address": member.addr.to_string(), "ttl_ms": ttl_ms }).to_string();
        let path = format!("/v1/services/c/members/{}", member.name);
        let r = self.call(Method::PUT, &path, Some(&body)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        r.body["lease"].as_str().expect("lease id").to_owned()
    }

    /// Member names in the full answer for `c`.
    async fn listed(&self) -> Vec<String> {
        let r = self.get("/v1/services/c").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        r.body["members"].as_array().unwrap().iter().map(|m| name(m).to_owned()).collect()
    }

    /// Polls (every 20 ms, at most `wait`) until `c`'s answer lists `want`.
    async fn until_listed(&self, want: &[&str], wait: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let got = self.listed().await;
            if got == want {
                return start.elapsed();
            }
            assert!(start.elapsed() < wait, "still {got:?} after {wait:?}, want {want:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[derive(Debug)]
struct Call {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Call {
    fn view_header(&self) -> u64 {
        let h = self.headers.get("rondo-view-id").expect("rondo-view-id header");
        h.to_str().unwrap().parse().unwrap()
    }

    fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or_else(|| panic!("no error in {}", self.body))
    }
}

fn name(v: &Value) -> &str {
    v["name"].as_str().expect("member name")
}

#[tokio::test]
async fn per_lookup_round_robin_gives_each_member_a_third() {
    let ms = members(3, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..300 {
        let r = s.get("/v1/lookup/c").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body["view_id"].as_u64(), Some(r.view_header()));
        assert!(r.body["why"].as_str().unwrap().starts_with("round-robin: "), "{}", r.body);
        *counts.entry(name(&r.body["member"]).to_owned()).or_default() += 1;
    }
    let want: HashMap<String, usize> = ["m1", "m2", "m3"].map(|n| (n.to_owned(), 100)).into();
    assert_eq!(counts, want);
}

#[tokio::test]
async fn weighted_lookups_follow_the_weights_and_hash_keys_stick() {
    let ms = members(2, Duration::ZERO).await;
    let list = members_of([entry(&ms[0], "weight = 300"), entry(&ms[1], "weight = 100")]);
    let s = Setup::new(&format!("algorithm = \"weighted\"\n{list}")).await;
    let mut m1 = 0;
    for _ in 0..400 {
        if name(&s.get("/v1/lookup/c").await.body["member"]) == "m1" {
            m1 += 1;
        }
    }
    assert_eq!(m1, 300, "smooth weighted round robin is exact per cycle");

    let hashed = Setup::new(&format!("algorithm = \"hash\"\n{}", member_list(&ms))).await;
    let first = name(&hashed.get("/v1/lookup/c?key=user-7").await.body["member"]).to_owned();
    for _ in 0..20 {
        let r = hashed.get("/v1/lookup/c?key=user-7").await;
        assert_eq!(name(&r.body["member"]), first);
    }
}

#[tokio::test]
async fn a_retry_lookup_excludes_the_members_already_tried() {
    let ms = members(3, Duration::ZERO).await;
    let hashed = Setup::new(&format!("algorithm = \"hash\"\n{}", member_list(&ms))).await;
    // A hash key always lands on one member; a retry that excludes it lands elsewhere, and one
    // that excludes every member is told so.
    let home = name(&hashed.get("/v1/lookup/c?key=user-7").await.body["member"]).to_owned();
    for _ in 0..10 {
        let r = hashed.get(&format!("/v1/lookup/c?key=user-7&exclude={home}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_ne!(name(&r.body["member"]), home);
    }
    let both = hashed.get(&format!("/v1/lookup/c?key=user-7&exclude={home}")).await;
    let second = name(&both.body["member"]).to_owned();
    let r = hashed.get(&format!("/v1/lookup/c?key=user-7&exclude={home},{second}")).await;
    let third = name(&r.body["member"]).to_owned();
    assert!(third != home && third != second, "{home} {second} {third}");
    let r = hashed.get("/v1/lookup/c?key=user-7&exclude=m1,m2,m3,unknown").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert!(r.error().contains("already tried"), "{}", r.body);
}

#[tokio::test]
async fn the_full_answer_lists_eligible_members_with_policy_and_view_id() {
    let ms = members(3, Duration::ZERO).await;
    let s = Setup::new(&format!("algorithm = \"p2c-ewma\"\n{}", member_list(&ms))).await;
    let r = s.get("/v1/services/c").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["service"], "c");
    assert_eq!(r.body["policy"]["algorithm"], "p2c-ewma");
    assert_eq!(r.body["policy"]["granularity"], "request");
    assert_eq!(r.body["view_id"].as_u64(), Some(r.view_header()));
    let m = &r.body["members"][0];
    assert_eq!((m["weight"].as_u64(), m["state"].as_str()), (Some(100), Some("active")));
    assert_eq!(m["source"], "config");
    assert_eq!(m["address"], ms[0].addr.to_string());

    // Draining members stay listed (their sessions may continue) as draining; disabled and
    // down members are left out.
    let rt = s.router.live.load().clusters["c"].clone();
    rt.with(|b| {
        b.set_admin(0, AdminState::Draining, Actor::Operator("t".into()));
        b.set_admin(1, AdminState::Disabled, Actor::Operator("t".into()));
    });
    let r = s.get("/v1/services/c").await;
    let states: Vec<(&str, &str)> = r.body["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (name(m), m["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("m1", "draining"), ("m3", "active")]);
    // A lookup never returns the draining or the disabled member.
    for _ in 0..10 {
        assert_eq!(name(&s.get("/v1/lookup/c").await.body["member"]), "m3");
    }
    rt.with(|b| b.set_health(2, false, Actor::HealthCheck, rondo_runtime::clock::now()));
    assert_eq!(s.listed().await, ["m1"]);
    rt.with(|b| b.set_admin(2, AdminState::Disabled, Actor::Operator("t".into())));
    let r = s.get("/v1/lookup/c").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert!(r.error().contains("no eligible member"), "{}", r.body);
}

#[tokio::test]
async fn registered_members_are_routable_and_leave_on_deregistration_or_lease_expiry() {
    let ms = members(3, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms[..1])).await;
    let url = s.router.url("web", "/");
    let before = s.get("/v1/services/c").await.view_header();

    let lease2 = s.register(&ms[1], 60_000).await;
    assert!(!lease2.is_empty());
    s.register(&ms[2], 1_000).await;
    assert_eq!(s.listed().await, ["m1", "m2", "m3"]);
    let r = s.get("/v1/services/c").await;
    assert!(r.view_header() >= before + 2, "each registration is a new view");
    assert_eq!(r.body["members"][1]["source"], "registry");
    let mut served = served_by(&url, 30).await;
    served.sort();
    served.dedup();
    assert_eq!(served, ["m1", "m2", "m3"], "registered members take requests through the router");

    // m3's lease (1 s) lapses without keepalives (bounded wait: 3 s); m2's is kept alive.
    s.until_listed(&["m1", "m2"], Duration::from_secs(3)).await;
    let r = s.call(Method::POST, &format!("/v1/leases/{lease2}/keepalive"), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["ttl_ms"], 60_000);

    let r = s.call(Method::DELETE, "/v1/services/c/members/m2", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(s.listed().await, ["m1"]);
    let r = s.call(Method::POST, &format!("/v1/leases/{lease2}/keepalive"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert!(r.error().contains(&lease2), "{}", r.body);
    assert_eq!(served_by(&url, 5).await, ["m1"; 5]);
}

#[tokio::test]
async fn a_lease_kept_alive_outlives_its_ttl() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms[..1])).await;
    let lease = s.register(&ms[1], 1_000).await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = s.call(Method::POST, &format!("/v1/leases/{lease}/keepalive"), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    assert_eq!(s.listed().await, ["m1", "m2"], "alive after 2 s on a 1 s lease");
}

#[tokio::test]
async fn a_watch_returns_on_change_and_times_out_cleanly_otherwise() {
    let ms = members(2, Duration::ZERO).await;
    let s = Arc::new(Setup::new(&member_list(&ms[..1])).await);
    let now = s.get("/v1/services/c").await.view_header();

    let started = Instant::now();
    let r = s.get(&format!("/v1/watch?after={now}&timeout_ms=300")).await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, json!({ "view_id": now, "changed": false }));
    assert!(took >= Duration::from_millis(300), "returned early: {took:?}");

    // A past view id answers at once.
    let r = s.get(&format!("/v1/watch?after={}&timeout_ms=5000", now - 1)).await;
    assert_eq!(r.body["changed"], true);

    let watcher = {
        let s = s.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = s.get(&format!("/v1/watch?after={now}&timeout_ms=10000")).await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.register(&ms[1], 60_000).await;
    let (r, took) = watcher.await.unwrap();
    assert_eq!(r.body["changed"], true);
    assert!(r.body["view_id"].as_u64().unwrap() > now);
    assert!(took < Duration::from_secs(5), "watch returned after {took:?}");
    // The id grows with each change.
    let after_register = r.body["view_id"].as_u64().unwrap();
    s.call(Method::DELETE, "/v1/services/c/members/m2", None).await;
    assert!(s.get("/v1/services/c").await.view_header() > after_register);
}

// Regression: a drain (or a health or agent change) changed the answer but not the view id, so
// watchers never learned of it.
#[tokio::test]
async fn a_drain_is_a_new_view_id_and_wakes_watchers() {
    let ms = members(2, Duration::ZERO).await;
    let s = Arc::new(Setup::new(&member_list(&ms)).await);
    let now = s.get("/v1/services/c").await.view_header();
    let watcher = {
        let s = s.clone();
        tokio::spawn(async move { s.get(&format!("/v1/watch?after={now}&timeout_ms=5000")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rt = s.router.live.load().clusters["c"].clone();
    rt.with(|b| b.set_admin(0, AdminState::Draining, Actor::Operator("t".into())));
    rt.state_changed();
    let r = watcher.await.unwrap();
    assert_eq!(r.body["changed"], true, "{}", r.body);
    let answer = s.get("/v1/services/c").await;
    assert!(answer.view_header() > now);
    assert_eq!(answer.body["members"][0]["state"], "draining");
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let ms = members(1, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    let view = s.get("/v1/services/c").await.view_header();
    let put = |path: &'static str, body: &'static str| {
        let s = &s;
        async move { s.call(Method::PUT, path, Some(body)).await }
    };
    let cases = [
        (
            put("/v1/services/nope/members/x", r#"{"address":"127.0.0.1:1"}"#).await,
            404,
            "unknown service `nope`",
        ),
        (
            put("/v1/services/c/members/m1", r#"{"address":"127.0.0.1:1"}"#).await,
            409,
            "is configured",
        ),
        (put("/v1/services/c/members/x", "{not json").await, 400, "invalid registration body"),
        (put("/v1/services/c/members/x", r#"{"weight":3}"#).await, 400, "missing field `address`"),
        (put("/v1/services/c/members/x", r#"{"address":"nohost"}"#).await, 400, "field `address`"),
        (
            put("/v1/services/c/members/x", r#"{"address":"h:1","weight":0}"#).await,
            400,
            "field `weight`",
        ),
        (
            put("/v1/services/c/members/x", r#"{"address":"h:1","ttl_ms":5}"#).await,
            400,
            "field `ttl_ms`",
        ),
        (put("/v1/services/c/members/a%20b", r#"{"address":"h:1"}"#).await, 400, "member `a b`"),
        (
            put("/v1/config", "[cluster.x]").await,
            501,
            "embedded registry has no shared configuration",
        ),
        (s.get("/v1/services/nope").await, 404, "unknown service `nope`"),
        (s.get("/v1/lookup/nope").await, 404, "unknown service `nope`"),
        (s.get("/v1/watch?after=x").await, 400, "`after`: `x` is not a whole number"),
        (s.get("/v1/watch?timeout_ms=999999999").await, 400, "above the maximum"),
        (s.call(Method::POST, "/v1/leases/12/keepalive", None).await, 404, "no lease `12`"),
        (s.call(Method::POST, "/v1/leases/abc/keepalive", None).await, 400, "not a decimal"),
        (
            s.call(Method::DELETE, "/v1/services/c/members/ghost", None).await,
            404,
            "no registered member `ghost`",
        ),
        (s.call(Method::POST, "/v1/services/c", None).await, 405, "method not allowed"),
        (s.get("/v2/anything").await, 404, "no such endpoint"),
        (s.get("/v1/services/%FF").await, 400, "UTF-8"),
    ];
    for (r, status, needle) in &cases {
        assert_eq!(r.status.as_u16(), *status, "{needle}: {}", r.body);
        assert!(r.error().contains(needle), "want {needle:?} in {}", r.body);
        r.view_header();
    }
    // A body over axum's 2 MiB limit: JSON too.
    let big = format!(r#"{{"address":"h:1","group":"{}"}}"#, "g".repeat(3 << 20));
    let r = s.call(Method::PUT, "/v1/services/c/members/x", Some(&big)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert!(!r.error().is_empty());
    assert_eq!(s.get("/v1/services/c").await.view_header(), view, "nothing changed");
    assert_eq!(s.listed().await, ["m1"]);
}

#[tokio::test]
async fn with_a_token_changes_need_it_and_lookups_do_not() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::with_token(&member_list(&ms[..1]), Some("n-secret")).await;
    let url = format!("http://{}/v1/services/c/members/m2", s.api.addr);
    let body = json!({ "address": ms[1].addr.to_string() }).to_string();
    for auth in [None, Some("Bearer wrong"), Some("n-secret")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let (status, headers, v) = json_call(Method::PUT, &url, &headers, Some(&body)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}: {v}");
        assert_eq!(headers["www-authenticate"], "Bearer");
        assert!(v["error"].as_str().unwrap().contains("naming token"), "{v}");
    }
    let r = s.call(Method::DELETE, "/v1/services/c/members/m1", None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(s.get("/v1/lookup/c").await.status, StatusCode::OK, "lookups stay open");
    assert_eq!(s.call(Method::HEAD, "/v1/services/c", None).await.status, StatusCode::OK);
    assert_eq!(s.listed().await, ["m1"]);
    let auth = [("authorization", "Bearer n-secret")];
    let (status, _, v) = json_call(Method::PUT, &url, &auth, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(s.listed().await, ["m1", "m2"]);
}

#[test]
fn rondo_serve_runs_the_naming_service_and_its_snapshot_brings_registrations_back() {
    let dir = TempDir::new("naming");
    let member = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let member_addr = member.local_addr().unwrap();
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nsnapshot = \"registry.json\"\n",
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let serve = || {
        let mut p = Proc::start(&["serve", "--config", config.to_str().unwrap()]);
        let addr = p.addr_after("rondo: naming API (registry embedded) on").to_string();
        (p, addr)
    };
    let listed = |addr: &str| {
        let url = format!("http://{addr}/v1/services/c");
        rt.block_on(async {
            let (status, _, v) = json_call(Method::GET, &url, &[], None).await;
            assert_eq!(status, StatusCode::OK, "{v}");
            v["members"].as_array().unwrap().iter().map(|m| name(m).to_owned()).collect::<Vec<_>>()
        })
    };
    let (mut first, addr) = serve();
    let url = format!("http://{addr}/v1/services/c/members/late");
    let body = json!({ "address": member_addr.to_string(), "ttl_ms": 30_000 }).to_string();
    let (status, _, v) = rt.block_on(json_call(Method::PUT, &url, &[], Some(&body)));
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(listed(&addr), ["m1", "late"]);
    assert!(dir.0.join("registry.json").exists(), "snapshot written");
    first.kill();

    let (_second, addr) = serve();
    assert_eq!(listed(&addr), ["m1", "late"], "the registration came back from the snapshot");
}

/// Regression: `rondo serve` held the stderr lock on its main thread for its whole life, so the
/// first log line written by a worker thread (here "member registered", at info) blocked that
/// worker forever, holding the registry's lock; the next call never answered.
#[test]
fn log_lines_from_worker_threads_do_not_stall_rondo_serve() {
    let dir = TempDir::new("naming-log");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let child = std::process::Command::new(common::BIN)
        .args(["serve", "--workers", "2", "--config", config.to_str().unwrap()])
        .env("RONDO_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rondo serve");
    let mut p = Proc::from_child(child);
    let log = common::collect_lines(p.child.stderr.take().unwrap());
    let api = p.addr_after("rondo: naming API (registry embedded) on");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for name in ["r1", "r2", "r3", "r4"] {
        let url = format!("http://{api}/v1/services/c/members/{name}");
        let body = json!({ "address": "127.0.0.1:2" }).to_string();
        let (status, _, v) = rt.block_on(json_call(Method::PUT, &url, &[], Some(&body)));
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (status, _, v) =
        rt.block_on(json_call(Method::GET, &format!("http://{api}/v1/status"), &[], None));
    assert_eq!((status, &v["registry"]["registrations"]), (StatusCode::OK, &json!(4)), "{v}");
    let lines = log.lock().unwrap().clone();
    assert!(lines.iter().any(|l| l.contains("member registered")), "{lines:?}");
}

#[cfg(feature = "dns")]
#[test]
fn rondo_serve_answers_dns_for_configured_and_registered_members() {
    let dir = TempDir::new("naming-dns");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.11:8001\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\ndns_listen = \"127.0.0.1:0\"\ndns_zone = \"svc.test\"\n",
    )
    .unwrap();
    let mut p = Proc::start(&["serve", "--config", config.to_str().unwrap()]);
    let api = p.addr_after("rondo: naming API (registry embedded) on");
    let dns = p.addr_after("rondo: naming DNS (udp and tcp, zone svc.test.) on");
    let dig = |qtype: &str| {
        let out = std::process::Command::new("dig")
            .args([&format!("@{}", dns.ip()), "-p", &dns.port().to_string()])
            .args(["c.svc.test.", qtype, "+short", "+tries=1", "+time=2"])
            .output()
            .expect("run dig");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut lines: Vec<String> =
            String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    assert_eq!(dig("A"), ["127.0.0.11"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = format!("http://{api}/v1/services/c/members/late");
    let body = json!({ "address": "127.0.0.12:8002", "weight": 300 }).to_string();
    let (status, _, v) = rt.block_on(json_call(Method::PUT, &url, &[], Some(&body)));
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(dig("A"), ["127.0.0.11", "127.0.0.12"]);
    assert_eq!(dig("SRV"), ["0 100 8001 m1.c.svc.test.", "0 300 8002 late.c.svc.test."]);
}

fn limits(per_service: usize, total: usize) -> rondo_naming::Limits {
    rondo_naming::Limits { per_service, total }
}

#[tokio::test]
async fn registrations_past_a_cap_get_507_naming_the_cap() {
    let s = Setup::with_registry(
        "members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]",
        limits(3, 100),
        None,
    )
    .await;
    for n in ["r1", "r2", "r3"] {
        assert_eq!(s.put(n, "127.0.0.2:80").await.status, StatusCode::OK);
    }
    let r = s.put("r4", "127.0.0.2:80").await;
    assert_eq!(r.status, StatusCode::INSUFFICIENT_STORAGE, "{}", r.body);
    assert!(r.error().contains("service `c` has 3 registered members"), "{}", r.body);
    assert!(r.error().contains("`[naming] max_registrations_per_service` = 3"), "{}", r.body);
    // Registering a member again is no new one; a deregistration makes room.
    assert_eq!(s.put("r2", "127.0.0.2:81").await.status, StatusCode::OK);
    let r = s.call(Method::DELETE, "/v1/services/c/members/r1", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(s.put("r4", "127.0.0.2:80").await.status, StatusCode::OK);
    assert_eq!(s.listed().await, ["m1", "r2", "r3", "r4"]);

    let s = Setup::with_registry(
        "members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]",
        limits(100, 2),
        None,
    )
    .await;
    assert_eq!(s.put("r1", "127.0.0.2:80").await.status, StatusCode::OK);
    assert_eq!(s.put("r2", "127.0.0.2:80").await.status, StatusCode::OK);
    let r = s.put("r3", "127.0.0.2:80").await;
    assert_eq!(r.status, StatusCode::INSUFFICIENT_STORAGE, "{}", r.body);
    assert!(
        r.error().contains("2 registered members in all, `[naming] max_registrations` = 2"),
        "{}",
        r.body
    );
    assert_eq!(s.listed().await, ["m1", "r1", "r2"]);
}

/// The group commit's contract: registrations arriving together are batched by the writer, and
/// each 200 comes only once its batch is in the view and on disk (checked by every caller the
/// moment it is answered, without polling).
#[tokio::test]
async fn a_concurrent_burst_of_registrations_is_all_acknowledged_visible_and_written() {
    let dir = common::TempDir::new("naming-burst");
    let file = dir.0.join("registry.json");
    let s = Arc::new(
        Setup::with_registry(
            "members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]",
            limits(1000, 1000),
            Some(file.clone()),
        )
        .await,
    );
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (s, file) = (s.clone(), file.clone());
        tasks.spawn(async move {
            let name = format!("b{i}");
            let r = s.put(&name, &format!("127.0.0.2:{}", 1000 + i)).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            // Acknowledged means visible and durable already: no polling.
            assert!(s.router.live.load().is_registered("c", &name), "{name} not in the view");
            let text = on_disk(&file);
            assert!(text.contains(&format!("\"name\":\"{name}\"")), "{name} not on disk");
        });
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(done) = tokio::time::timeout_at(deadline.into(), tasks.join_next())
        .await
        .expect("the burst is answered within 120 s")
    {
        done.expect("registration task");
    }
    assert_eq!(s.listed().await.len(), 201);
    let status = s.get("/v1/status").await;
    assert_eq!(status.body["registry"]["registrations"], 200, "{}", status.body);
}

#[tokio::test]
async fn registrations_at_the_routers_own_addresses_are_refused() {
    let s = Setup::with_registry(
        "members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]",
        limits(10, 10),
        None,
    )
    .await;
    let web = s.router.addr("web");
    let naming = s.api.addr;
    let cases = [
        (web.to_string(), "own listener web"),
        (format!("localhost:{}", web.port()), "own listener web"),
        (format!("0.0.0.0:{}", web.port()), "own listener web"),
        (naming.to_string(), "own naming API"),
    ];
    for (address, needle) in cases {
        let r = s.put("loop", &address).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{address}: {}", r.body);
        assert!(r.error().contains(needle), "{address}: {}", r.body);
        assert!(r.error().contains(&format!("`{address}`")), "{}", r.body);
    }
    assert_eq!(s.listed().await, ["m1"]);
    // Another port of the same host is another server.
    assert_eq!(s.put("ok", &format!("127.0.0.1:{}", web.port() ^ 1)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::with_token(&member_list(&ms[..1]), Some("n-secret")).await;
    let url = format!("http://{}/v1/services/c/members/m2", s.api.addr);
    let body = json!({ "address": ms[1].addr.to_string() }).to_string();
    let auth = [("authorization", "bearer n-secret")];
    let (status, _, v) = json_call(Method::PUT, &url, &auth, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// The snapshot and its log, as one text (a registration is in one or the other).
fn on_disk(snapshot: &std::path::Path) -> String {
    let mut text = std::fs::read_to_string(snapshot).expect("snapshot");
    let log = format!("{}.log", snapshot.display());
    text.push_str(&std::fs::read_to_string(log).unwrap_or_default());
    text
}

/// Writes fail: the log is `/dev/full` (every write: no space left) and the snapshot's
/// temporary file cannot be created (a directory has its name; the tests run as root, so
/// permissions would not stop the write). A failed append makes the next batch go to a new
/// snapshot, so both are needed for the deregistration to fail too.
#[tokio::test]
async fn a_failed_write_answers_503_and_keeps_nothing() {
    let dir = common::TempDir::new("naming-fail");
    let file = dir.0.join("registry.json");
    let log = dir.0.join("registry.json.log");
    let s = Setup::with_registry(
        "members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]",
        limits(10, 10),
        Some(file.clone()),
    )
    .await;
    assert_eq!(s.put("kept", "127.0.0.2:80").await.status, StatusCode::OK);
    let tmp = dir.0.join(format!("registry.tmp.{}", std::process::id()));
    std::fs::create_dir(&tmp).unwrap();
    let _ = std::fs::remove_file(&log);
    std::os::unix::fs::symlink("/dev/full", &log).unwrap();
    let r = s.put("lost", "127.0.0.2:81").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert!(r.error().contains("cannot write"), "{}", r.body);
    assert!(r.error().contains("registry.json"), "{}", r.body);
    assert_eq!(s.listed().await, ["m1", "kept"], "not kept in memory either");
    let r = s.call(Method::DELETE, "/v1/services/c/members/kept", None).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(s.listed().await, ["m1", "kept"], "a deregistration not written is undone");
    let status = s.get("/v1/status").await;
    assert!(status.body["registry"]["last_error"].as_str().unwrap().contains("cannot write"));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"kept\"") && !text.contains("\"lost\""), "{text}");

    std::fs::remove_dir(&tmp).unwrap();
    std::fs::remove_file(&log).unwrap();
    assert_eq!(s.put("lost", "127.0.0.2:81").await.status, StatusCode::OK);
    assert_eq!(s.listed().await, ["m1", "kept", "lost"]);
    let status = s.get("/v1/status").await;
    assert_eq!(status.body["registry"]["last_error"], Value::Null, "{}", status.body);
    let text = on_disk(&file);
    assert!(text.contains("\"kept\"") && text.contains("\"lost\""), "{text}");
}

fn snapshot_entry(name: &str, address: &str, weight: u64, ttl_ms: u64) -> Value {
    json!({ "cluster": "c", "name": name, "address": address, "weight": weight,
            "group": null, "ttl_ms": ttl_ms, "lease": "7" })
}

#[tokio::test]
async fn a_snapshot_entry_failing_the_apis_checks_is_refused_at_start() {
    let dir = common::TempDir::new("naming-bad-snap");
    let file = dir.0.join("registry.json");
    let good = json!({ "cluster": "c", "name": "ok", "address": "127.0.0.2:80", "weight": 100,
                       "group": null, "ttl_ms": 10_000, "lease": "1" });
    let cases = [
        (snapshot_entry("w0", "127.0.0.2:80", 0, 10_000), "field `weight`: 0 is out of range"),
        (
            snapshot_entry("wmax", "127.0.0.2:80", 4_294_967_295, 10_000),
            "field `weight`: 4294967295",
        ),
        (snapshot_entry("t", "127.0.0.2:80", 100, u64::MAX), "field `ttl_ms`"),
        (snapshot_entry("a b", "127.0.0.2:80", 100, 10_000), "member `a b`"),
        (snapshot_entry("addr", "no port", 100, 10_000), "field `address`"),
        (snapshot_entry("ok", "127.0.0.2:81", 100, 10_000), "registered twice"),
    ];
    let router =
        router(&one_cluster("members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]")).await;
    for (entry, needle) in cases {
        let text = json!({ "registrations": [good, entry] }).to_string();
        std::fs::write(&file, &text).unwrap();
        let spec = rondo_config::RegistrySpec::Embedded { snapshot: Some(file.clone()) };
        let e = rondo_naming::start_registry(&spec, &rondo_naming::NamingParts::of(&router.live))
            .expect_err(&format!("{needle}: refused"));
        assert!(
            matches!(&e, rondo_naming::StartError::Snapshot { path, .. } if *path == file),
            "{e}"
        );
        let e = e.to_string();
        assert!(e.contains(&format!("naming snapshot {}", file.display())), "{e}");
        assert!(e.contains("registrations[1]"), "{e}");
        assert!(e.contains(needle), "want {needle:?} in {e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text, "the file is left alone");
    }
    assert!(!router.live.load().is_registered("c", "ok"), "nothing was published");
}

#[tokio::test]
async fn stale_snapshot_temporaries_are_removed_at_start() {
    let dir = common::TempDir::new("naming-stale");
    let file = dir.0.join("registry.json");
    for stale in ["registry.tmp.4242", "registry.tmp.1"] {
        std::fs::write(dir.0.join(stale), "{\"regis").unwrap();
    }
    std::fs::create_dir(dir.0.join("registry.tmp.77")).unwrap();
    std::fs::write(dir.0.join("registry.tmp.notes"), "mine").unwrap();
    let s = Setup::with_registry(
        "members = [{ name = \"m1\", address = \"127.0.0.1:1\" }]",
        limits(10, 10),
        Some(file.clone()),
    )
    .await;
    let mut left: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["registry.tmp.notes"]);
    assert_eq!(s.put("r", "127.0.0.2:80").await.status, StatusCode::OK);
}

/// `Host` names other than the listener's are refused (DNS rebinding), with a real request.
#[test]
fn rondo_serve_refuses_other_hosts_and_registrations_at_its_own_addresses() {
    let dir = TempDir::new("naming-host");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [agent]\nlisten = \"127.0.0.1:0\"\nkey = \"the agents' key\"\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nallowed_hosts = [\"naming.test\"]\n",
    )
    .unwrap();
    let mut p = Proc::start(&["serve", "--config", config.to_str().unwrap()]);
    let web = p.addr_after("rondo: listener web on");
    // `rondo: agent receiver on ADDR (tcp and udp)`, printed before the admin API's line.
    let line = p.line_with("rondo: agent receiver on", Duration::from_secs(10));
    let agent: std::net::SocketAddr =
        line.split(' ').nth(4).and_then(|a| a.parse().ok()).expect("the agent's address");
    let admin = p.addr_after("rondo: admin API on");
    let api = p.addr_after("rondo: naming API (registry embedded) on");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = format!("http://{api}/v1/services/c");
    for host in ["evil.example", "evil.example:80", "127.0.0.1.evil.example"] {
        let (status, _, v) = rt.block_on(json_call(Method::GET, &url, &[("host", host)], None));
        assert_eq!(status, StatusCode::FORBIDDEN, "{host}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(&format!("host `{host}` is not a name of this API")), "{e}");
    }
    for host in ["localhost", &format!("localhost:{}", api.port()), "naming.test:9", "[::1]:1"] {
        let (status, _, v) = rt.block_on(json_call(Method::GET, &url, &[("host", host)], None));
        assert_eq!(status, StatusCode::OK, "{host}: {v}");
    }
    // serve passes its own addresses to the naming API.
    let own = [
        (web, "listener web"),
        (admin, "admin API"),
        (agent, "agent receiver"),
        (api, "naming API"),
    ];
    for (address, what) in own {
        let url = format!("http://{api}/v1/services/c/members/loop");
        let body = json!({ "address": address.to_string() }).to_string();
        let (status, _, v) = rt.block_on(json_call(Method::PUT, &url, &[], Some(&body)));
        assert_eq!(status, StatusCode::CONFLICT, "{address}: {v}");
        assert!(v["error"].as_str().unwrap().contains(&format!("own {what}")), "{v}");
    }
}

#[test]
fn rondo_serve_refuses_a_snapshot_with_an_invalid_entry() {
    let dir = TempDir::new("naming-bad-serve");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nsnapshot = \"registry.json\"\n",
    )
    .unwrap();
    let entry = snapshot_entry("w0", "127.0.0.2:80", 0, 10_000);
    std::fs::write(dir.0.join("registry.json"), json!({ "registrations": [entry] }).to_string())
        .unwrap();
    let child = std::process::Command::new(common::BIN)
        .args(["serve", "--config", config.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rondo serve");
    let mut guard = common::ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "rondo serve did not refuse to start");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(guard.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("registry.json: registrations[0] (`w0` in `c`): field `weight`"), "{err}");
}

/// 10,000 registrations, 64 at a time, through `rondo serve` with a snapshot: all answered,
/// all in the answer soon after (a big service's view follows the answers), all back after a
/// restart.
#[test]
fn ten_thousand_registrations_are_all_visible_and_survive_a_restart() {
    const N: usize = 10_000;
    let dir = TempDir::new("naming-10k");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nsnapshot = \"registry.json\"\n",
    )
    .unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let serve = || {
        let mut p = Proc::start(&["serve", "--config", config.to_str().unwrap()]);
        let addr = p.addr_after("rondo: naming API (registry embedded) on");
        (p, addr)
    };
    let count = |api: std::net::SocketAddr| {
        rt.block_on(async {
            let (status, _, v) =
                json_call(Method::GET, &format!("http://{api}/v1/services/c"), &[], None).await;
            assert_eq!(status, StatusCode::OK);
            let names: std::collections::HashSet<String> =
                v["members"].as_array().unwrap().iter().map(|m| name(m).to_owned()).collect();
            names
        })
    };
    let (mut first, api) = serve();
    let start = Instant::now();
    rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let (client, next) = (client.clone(), next.clone());
            workers.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= N {
                        return;
                    }
                    let body = json!({
                        "address": format!("127.0.{}.{}:8080", 1 + i / 250, 1 + i % 250),
                        "ttl_ms": 3_600_000
                    });
                    let req =
                        http::Request::put(format!("http://{api}/v1/services/c/members/r{i}"))
                            .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
                            .unwrap();
                    let resp = client.request(req).await.expect("the API answers");
                    assert_eq!(resp.status(), StatusCode::OK, "registration {i}");
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        while let Some(done) = tokio::time::timeout_at(deadline.into(), workers.join_next())
            .await
            .expect("10,000 registrations within 600 s")
        {
            done.expect("registration worker");
        }
    });
    eprintln!("10,000 registrations in {:?}", start.elapsed());
    // A service this big has its view composed after the answers (docs/naming.md, "Embedded
    // registry"): every registration is in the answer within a few compositions.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut names = count(api);
    while names.len() < N + 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        names = count(api);
    }
    assert_eq!(names.len(), N + 1);
    assert!((0..N).all(|i| names.contains(&format!("r{i}"))));
    first.kill();

    let (_second, api) = serve();
    let names = count(api);
    assert_eq!(names.len(), N + 1, "all came back from the snapshot");
    assert!((0..N).all(|i| names.contains(&format!("r{i}"))));
}

/// `kill -9` in the middle of a stream of registrations: every registration answered 200 before
/// the kill is back after a restart (replayed from the log: the kill comes long before the log
/// is folded into a snapshot), and the registry starts (a record torn by the kill is ignored).
#[test]
fn kill_9_during_registrations_loses_nothing_acknowledged() {
    const MAX: usize = 5_000;
    let dir = TempDir::new("naming-kill");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nsnapshot = \"registry.json\"\n",
    )
    .unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let serve = || {
        let mut p = Proc::start(&["serve", "--config", config.to_str().unwrap()]);
        let addr = p.addr_after("rondo: naming API (registry embedded) on");
        (p, addr)
    };
    let (mut first, api) = serve();
    let acked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (client, next, acked) = (client.clone(), next.clone(), acked.clone());
            workers.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= MAX {
                        return;
                    }
                    let body = json!({
                        "address": format!("127.0.{}.{}:8080", 1 + i / 250, 1 + i % 250),
                        "ttl_ms": 3_600_000
                    });
                    let req =
                        http::Request::put(format!("http://{api}/v1/services/c/members/k{i}"))
                            .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
                            .unwrap();
                    let answer =
                        tokio::time::timeout(Duration::from_secs(10), client.request(req)).await;
                    match answer {
                        Ok(Ok(resp)) if resp.status() == StatusCode::OK => {
                            acked.lock().unwrap().push(format!("k{i}"));
                        }
                        // The kill: connection refused or reset, or no answer.
                        _ => return,
                    }
                }
            });
        }
        workers
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 300 {
        assert!(Instant::now() < deadline, "300 registrations within 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill();
    rt.block_on(async {
        let mut workers = workers;
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(done) = tokio::time::timeout_at(deadline.into(), workers.join_next())
            .await
            .expect("the workers stop within 30 s of the kill")
        {
            done.expect("registration worker");
        }
    });
    let acked = acked.lock().unwrap().clone();
    let log = std::fs::metadata(dir.0.join("registry.json.log")).map_or(0, |m| m.len());
    assert!(log > 0, "the registrations were in the log when the process was killed");

    let (_second, api) = serve();
    let names: std::collections::HashSet<String> = rt.block_on(async {
        let (status, _, v) =
            json_call(Method::GET, &format!("http://{api}/v1/services/c"), &[], None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["members"].as_array().unwrap().iter().map(|m| name(m).to_owned()).collect()
    });
    let lost: Vec<&String> = acked.iter().filter(|n| !names.contains(*n)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged lost: {lost:?}", lost.len(), acked.len());
    // Nothing that was never asked for.
    assert!(names.iter().all(|n| n == "m1" || n.starts_with('k')), "{names:?}");
}

/// A log line `CRC JSON` as the embedded registry writes it (CRC-32, IEEE).
fn log_line(json: &str) -> String {
    let mut c = !0u32;
    for &b in json.as_bytes() {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    format!("{:08x} {json}\n", !c)
}

/// `rondo serve` and the log: a damaged record before the last stops the start, naming the log
/// and the offset; a torn last record is ignored, reported on stderr, and the records before
/// it come back.
#[test]
fn rondo_serve_refuses_a_corrupt_log_and_reports_a_torn_one() {
    let dir = TempDir::new("naming-log-serve");
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        "[cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:1\" }]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nsnapshot = \"registry.json\"\n",
    )
    .unwrap();
    let log = dir.0.join("registry.json.log");
    let put = |seq: u64, name: &str| {
        log_line(&format!(
            r#"{{"seq":{seq},"changes":[{{"put":{{"cluster":"c","name":"{name}","address":"127.0.0.2:80","weight":100,"group":null,"ttl_ms":60000,"lease":"{seq}"}}}}]}}"#
        ))
    };
    let (one, two) = (put(1, "l1"), put(2, "l2"));
    let start = || {
        std::process::Command::new(common::BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start rondo serve")
    };

    // The first record damaged (one byte of its JSON), the second whole: refused.
    let mut bad = one.clone().into_bytes();
    bad[30] ^= 0x01;
    bad.extend_from_slice(two.as_bytes());
    std::fs::write(&log, &bad).unwrap();
    let mut guard = common::ChildGuard(start());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "rondo serve did not refuse to start");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(guard.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    let want = format!("naming log {}: record at byte offset 0: checksum mismatch", log.display());
    assert!(err.contains(&want), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), bad, "the log is left alone");

    // The first record whole, the second cut short: started, reported, `l1` back.
    let mut torn = one.clone().into_bytes();
    torn.extend_from_slice(&two.as_bytes()[..two.len() / 2]);
    std::fs::write(&log, &torn).unwrap();
    let mut child = start();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut serve = Proc::from_child(child);
    let api = serve.addr_after("rondo: naming API (registry embedded) on");
    let want = format!(
        "naming log {}: torn last record at byte offset {} ({} bytes) ignored",
        log.display(),
        one.len(),
        two.len() / 2
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("the torn record is reported on stderr");
        if line.contains(&want) {
            break;
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (status, _, v) =
        rt.block_on(json_call(Method::GET, &format!("http://{api}/v1/services/c"), &[], None));
    assert_eq!(status, StatusCode::OK, "{v}");
    let names: Vec<&str> = v["members"].as_array().unwrap().iter().map(name).collect();
    assert_eq!(names, ["m1", "l1"]);
}
