//! The admin API and `rondo ctl` over real sockets: an in-process router plus the admin API on
//! a free port, and `rondo ctl` against a `rondo serve` process.

mod common;
#[path = "router/support.rs"]
mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::{BIN, Proc, TempDir};
use http::{Method, StatusCode};
use rondo_config::{AdminSpec, AdminToken};
use serde_json::Value;
use support::*;

const TOKEN: &str = "s3cret-token";

/// A router over `cluster` (the body of cluster `c`, listener `web`) and its admin API.
struct Setup {
    router: TestRouter,
    admin: rondo_admin::AdminServer,
}

impl Setup {
    async fn new(cluster: &str) -> Setup {
        Setup::with_token(cluster, Some(TOKEN)).await
    }

    async fn with_token(cluster: &str, token: Option<&str>) -> Setup {
        let router = router(&one_cluster(cluster)).await;
        let spec = AdminSpec {
            listen: any_port(),
            token: token.map(|t| AdminToken::Inline(t.to_owned())),
            tls: None,
            probes: Default::default(),
        };
        let admin = rondo_admin::start(&spec, rondo_admin::AdminParts::of(&router.live))
            .await
            .expect("admin starts");
        Setup { router, admin }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin.addr, path)
    }

    /// A call with the right token.
    async fn call(&self, method: Method, path: &str, body: Option<&str>) -> (StatusCode, Value) {
        api(method, &self.url(path), Some(TOKEN), &[], body).await
    }

    fn view_id(&self) -> u64 {
        self.router.live.load().view.id
    }

    async fn served(&self, n: usize) -> Vec<String> {
        served_by(&self.router.url("web", "/"), n).await
    }
}

/// One call to the admin API: status and JSON answer.
async fn api(
    method: Method,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (StatusCode, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    if let Some(a) = &auth {
        all.push(("authorization", a));
    }
    let (status, _, v) = json_call(method, url, &all, body).await;
    (status, v)
}

fn member<'a>(status: &'a Value, cluster: &str, name: &str) -> &'a Value {
    let c = status["clusters"].as_array().unwrap().iter().find(|c| c["name"] == cluster).unwrap();
    c["members"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap()
}

/// Every endpoint, with a body where one is needed.
const ENDPOINTS: [(&str, &str, Option<&str>); 12] = [
    ("GET", "/api/v1/status", None),
    ("POST", "/api/v1/clusters/c/members/m1/drain", None),
    ("POST", "/api/v1/clusters/c/members/m1/undrain", None),
    ("POST", "/api/v1/clusters/c/members/m1/disable", None),
    ("POST", "/api/v1/clusters/c/members/m1/enable", None),
    ("PUT", "/api/v1/clusters/c/members/m1/weight", Some(r#"{"weight": 5}"#)),
    ("PUT", "/api/v1/clusters/c/algorithm", Some(r#"{"algorithm": "random"}"#)),
    ("GET", "/api/v1/clusters/c/explain?n=5", None),
    ("PUT", "/api/v1/clusters/c/shadow", Some(r#"{"algorithm": "random"}"#)),
    ("GET", "/api/v1/clusters/c/shadow", None),
    ("DELETE", "/api/v1/clusters/c/shadow", None),
    ("POST", "/api/v1/config", Some("")),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_every_member_with_its_numbers() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&format!("algorithm = \"round-robin\"\n{}", member_list(&ms))).await;
    s.served(4).await;
    let (code, v) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["view"], 1);
    assert_eq!(v["routes"][0]["name"], "main");
    assert_eq!(v["routes"][0]["listener"], "web");
    assert_eq!(v["routes"][0]["cluster"], "c");
    assert_eq!(v["clusters"][0]["algorithm"], "round-robin");
    assert_eq!(v["clusters"][0]["granularity"], "request");
    let m1 = member(&v, "c", "m1");
    assert_eq!(m1["address"], ms[0].addr.to_string());
    assert_eq!(m1["weight"], 100);
    assert_eq!(m1["admin"], "active");
    assert_eq!(m1["admin_by"], "config");
    assert_eq!(m1["healthy"], true);
    assert_eq!(m1["in_flight"], 0);
    assert_eq!(m1["sessions"], 0);
    assert!(m1["ewma_us"].is_u64(), "{m1}");
    for key in ["group", "ejected_until_ms", "rank", "agent", "health_by"] {
        assert!(m1.get(key).is_some(), "{key} missing: {m1}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_needs_the_token() {
    let ms = members(1, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    for (method, path, body) in ENDPOINTS {
        let method: Method = method.parse().unwrap();
        for token in [None, Some("wrong"), Some("s3cret-tokeN"), Some("")] {
            let (code, v) = api(method.clone(), &s.url(path), token, &[], body).await;
            assert_eq!(code, StatusCode::UNAUTHORIZED, "{method} {path} {token:?}: {v}");
            assert!(v["error"].as_str().unwrap().contains("token"), "{v}");
        }
    }
    let (_, v) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(v["view"], 1, "nothing changed");
    assert_eq!(member(&v, "c", "m1")["admin"], "active");
    assert_eq!(member(&v, "c", "m1")["weight"], 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_configured_token_refuses_everything() {
    let ms = members(1, Duration::ZERO).await;
    let s = Setup::with_token(&member_list(&ms), None).await;
    for (method, path, body) in ENDPOINTS {
        let (code, v) = api(method.parse().unwrap(), &s.url(path), Some(TOKEN), &[], body).await;
        assert_eq!(code, StatusCode::FORBIDDEN, "{method} {path}: {v}");
        assert_eq!(v["error"], "admin API has no token configured");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_never_change_anything() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    s.served(4).await;
    let (_, before) = s.call(Method::GET, "/api/v1/status", None).await;
    for _ in 0..3 {
        s.call(Method::GET, "/api/v1/status", None).await;
        s.call(Method::GET, "/api/v1/clusters/c/explain?n=10", None).await;
        // A GET on a mutation's path is not a mutation.
        let (code, _) = s.call(Method::GET, "/api/v1/clusters/c/members/m1/drain", None).await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    }
    let (_, after) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(without_ewma(before), without_ewma(after));
    assert_eq!(s.router.live.load().clusters["c"].recent_decisions(256).len(), 4, "no picks");
}

/// A status answer without the latency estimates and their sample's age (they change with time).
fn without_ewma(mut v: Value) -> Value {
    for c in v["clusters"].as_array_mut().unwrap() {
        for m in c["members"].as_array_mut().unwrap() {
            let m = m.as_object_mut().unwrap();
            m.remove("ewma_us");
            m.remove("ewma_sample_ago_ms");
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_stops_new_requests_and_undrain_brings_them_back() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    let headers = [("x-rondo-operator", "alice")];
    let url = s.url("/api/v1/clusters/c/members/m1/drain");
    let (code, v) = api(Method::POST, &url, Some(TOKEN), &headers, None).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["admin_by"], "operator:alice");
    let names = s.served(10).await;
    assert_eq!(count(&names, "m1"), 0, "{names:?}");
    let (_, st) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(member(&st, "c", "m1")["admin"], "draining");
    assert_eq!(member(&st, "c", "m1")["admin_by"], "operator:alice");

    let (code, _) = s.call(Method::POST, "/api/v1/clusters/c/members/m1/undrain", None).await;
    assert_eq!(code, StatusCode::OK);
    let names = s.served(10).await;
    assert_eq!(count(&names, "m1"), 5, "{names:?}");
    let (_, st) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(member(&st, "c", "m1")["admin"], "active");
    assert_eq!(member(&st, "c", "m1")["admin_by"], "operator:admin-api");

    let (code, _) = s.call(Method::POST, "/api/v1/clusters/c/members/m1/disable", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(count(&s.served(6).await, "m1"), 0);
    let (code, _) = s.call(Method::POST, "/api/v1/clusters/c/members/m1/enable", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(count(&s.served(6).await, "m1"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_names_and_bad_bodies_are_explained() {
    let ms = members(1, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    let (code, v) = s.call(Method::POST, "/api/v1/clusters/nope/members/m1/drain", None).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("cluster `nope`"), "{v}");
    let (code, v) = s.call(Method::POST, "/api/v1/clusters/c/members/zz/drain", None).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("member `zz`"), "{v}");
    let weight = "/api/v1/clusters/c/members/m1/weight";
    let (code, v) = s.call(Method::PUT, weight, Some(r#"{"weight": 0}"#)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    let (code, _) = s.call(Method::PUT, weight, Some("not json")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let alg = "/api/v1/clusters/c/algorithm";
    let (code, v) = s.call(Method::PUT, alg, Some(r#"{"algorithm": "fastest"}"#)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("least-sessions"), "{v}");
    assert_eq!(s.view_id(), 1);
}

#[tokio::test]
async fn applying_a_config_while_the_shared_one_is_in_effect_is_refused() {
    let ms = members(1, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    let shared = s.router.live.configured();
    let id = s.router.live.set_shared(Some(shared)).view.id;
    let (code, v) =
        s.call(Method::POST, "/api/v1/config", Some(&one_cluster(&member_list(&ms)))).await;
    assert_eq!(code, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("shared configuration"), "{v}");
    assert_eq!(s.view_id(), id, "nothing applied");
}

/// Concurrent changes to different members all land (`Live::update_configured` makes each one
/// read-change-swap under one lock; its own test holds one change open to show the other waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_weight_changes_all_land() {
    let n = 12;
    let entries = (0..n).map(|i| member_entry(&format!("w{i}"), dead_addr(), ""));
    let s = std::sync::Arc::new(Setup::new(&members_of(entries)).await);
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let path = format!("/api/v1/clusters/c/members/w{i}/weight");
                let body = format!(r#"{{"weight": {}}}"#, 200 + i);
                s.call(Method::PUT, &path, Some(&body)).await
            })
        })
        .collect();
    for c in calls {
        let (code, v) = c.await.unwrap();
        assert_eq!(code, StatusCode::OK, "{v}");
    }
    let (_, st) = s.call(Method::GET, "/api/v1/status", None).await;
    for i in 0..n {
        assert_eq!(member(&st, "c", &format!("w{i}"))["weight"], 200 + i, "w{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_change_is_a_new_view_and_traffic_follows_it() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&format!("algorithm = \"weighted\"\n{}", member_list(&ms))).await;
    assert_eq!(count(&s.served(8).await, "m1"), 4);
    let path = "/api/v1/clusters/c/members/m2/weight";
    let (code, v) = s.call(Method::PUT, path, Some(r#"{"weight": 300}"#)).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["view"], 2);
    assert_eq!(s.view_id(), 2);
    let names = s.served(40).await;
    assert_eq!(count(&names, "m1"), 10, "{names:?}");
    assert_eq!(count(&names, "m2"), 30, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_algorithm_change_is_a_new_view_and_traffic_follows_it() {
    let ms = members(2, Duration::ZERO).await;
    let list = members_of([entry(&ms[0], "weight = 1"), entry(&ms[1], "weight = 3")]);
    let s = Setup::new(&format!("algorithm = \"round-robin\"\n{list}")).await;
    assert_eq!(count(&s.served(8).await, "m1"), 4, "round robin ignores weights");
    let path = "/api/v1/clusters/c/algorithm";
    let (code, v) = s.call(Method::PUT, path, Some(r#"{"algorithm": "weighted"}"#)).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["view"], 2);
    let names = s.served(40).await;
    assert_eq!(count(&names, "m1"), 10, "{names:?}");
    let (_, st) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(st["clusters"][0]["algorithm"], "weighted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_with_a_typo_is_refused_with_every_position() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&member_list(&ms)).await;
    let good = one_cluster(&format!("algorithm = \"weighted\"\n{}", member_list(&ms)));
    let bad = good.replace("algorithm = \"weighted\"", "algoritm = \"weighted\"");
    let (code, v) = s.call(Method::POST, "/api/v1/config", Some(&bad)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    let e = &v["errors"][0];
    assert_eq!(e["file"], "admin-api");
    assert!(e["line"].as_u64().unwrap() > 1 && e["column"].as_u64().unwrap() >= 1, "{v}");
    assert!(e["text"].as_str().unwrap().starts_with("admin-api:"), "{v}");
    assert_eq!(s.view_id(), 1, "the running view is untouched");

    let (code, v) = s.call(Method::POST, "/api/v1/config", Some(&good)).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["view"], 2);
    let (_, st) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(st["clusters"][0]["algorithm"], "weighted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_returns_the_latest_picks_and_why() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&format!("algorithm = \"round-robin\"\n{}", member_list(&ms))).await;
    let names = s.served(5).await;
    let (code, v) = s.call(Method::GET, "/api/v1/clusters/c/explain?n=3", None).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    let picks = v["picks"].as_array().unwrap();
    assert_eq!(picks.len(), 3, "{v}");
    for (p, name) in picks.iter().zip(&names[2..]) {
        assert_eq!(&p["member"], name, "{v}");
        assert_eq!(p["algorithm"], "round-robin");
        assert!(p["why"].as_str().unwrap().contains("position"), "{p}");
        assert!(p["at_unix_ms"].as_u64().unwrap() > 0);
        assert_eq!(p["candidates"].as_array().unwrap().len(), 2, "{p}");
    }
}

/// A `rondo serve` process with an admin API; killed on drop.
struct Serve {
    // Dropped in this order: the process, then its directory.
    _proc: Proc,
    _dir: TempDir,
    admin: SocketAddr,
    /// The line `rondo serve` printed about the dashboard.
    dashboard: String,
}

impl Serve {
    fn start() -> Serve {
        let dir = TempDir::new("admin");
        let config = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n{}",
            one_cluster(&member_list_of_dead())
        );
        let path = dir.0.join("rondo.toml");
        std::fs::write(&path, config).unwrap();
        let mut proc =
            Proc::start(&["serve", "--workers", "1", "--config", path.to_str().unwrap()]);
        let admin = proc.addr_after("rondo: admin API on ");
        let dashboard = proc.line_with("rondo: dashboard on ", Duration::from_secs(10));
        Serve { _proc: proc, _dir: dir, admin, dashboard }
    }
}

fn member_list_of_dead() -> String {
    members_of([member_entry("a", dead_addr(), "weight = 2"), member_entry("b", dead_addr(), "")])
}

fn ctl(admin: &str, token: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["ctl", "--admin", admin, "--token", token])
        .args(args)
        .output()
        .expect("rondo ctl runs")
}

#[test]
fn ctl_prints_status_changes_members_and_explains_failures() {
    let serve = Serve::start();
    let admin = serve.admin.to_string();
    let out = ctl(&admin, TOKEN, &["status"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "view 1", "{stdout}");
    assert!(lines[1].starts_with("CLUSTER  MEMBER  ADDRESS"), "{stdout}");
    assert!(lines[1].contains("STATE(BY)") && lines[1].contains("RANK"), "{stdout}");
    assert!(lines[2].starts_with("c        a       127.0.0.1:"), "{stdout}");
    assert!(lines[2].contains("active(config)"), "{stdout}");
    assert_eq!(lines.len(), 4, "{stdout}");

    let out = Command::new(BIN)
        .args(["ctl", "--admin", &admin, "--token", TOKEN, "--operator", "bob"])
        .args(["drain", "c", "b"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "c/b: draining (by operator:bob)\n");
    let out = ctl(&admin, TOKEN, &["weight", "c", "a", "7"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "c/a: weight 7, view 2\n");
    let stdout = String::from_utf8_lossy(&ctl(&admin, TOKEN, &["status"]).stdout).into_owned();
    assert!(stdout.contains("draining(operator:bob)"), "{stdout}");

    let out = ctl(&admin, "wrong", &["status"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "rondo ctl: the admin API refused the token (401)\n"
    );

    let dead = dead_addr().to_string();
    let out = ctl(&dead, TOKEN, &["status"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("rondo ctl: cannot reach the admin API at {dead}: connection refused\n")
    );
}

#[test]
fn serve_prints_the_dashboards_address() {
    let serve = Serve::start();
    assert_eq!(
        serve.dashboard,
        format!("rondo: dashboard on http://{}/ (it asks for the admin token)", serve.admin)
    );
}

/// `rondo ctl --admin ADMIN ARGS status` with exactly the environment `env` (plus PATH).
fn ctl_env(admin: &str, args: &[&str], env: &[(&str, &std::path::Path)]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().args(["ctl", "--admin", admin]).args(args).arg("status");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("rondo ctl runs")
}

#[test]
fn ctl_finds_the_token_in_the_environment_a_file_or_the_default_file() {
    let serve = Serve::start();
    let admin = serve.admin.to_string();
    let dir = TempDir::new("admin");
    let empty = dir.0.join("empty-home");
    std::fs::create_dir_all(&empty).unwrap();

    // None anywhere: exit 1 naming every way, the default file at its XDG location.
    let out = ctl_env(&admin, &[], &[("HOME", &empty)]);
    assert_eq!(out.status.code(), Some(1));
    let default_file = empty.join(".config/rondo/token");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "rondo ctl: no admin token: pass --token-file FILE or --token TOKEN, set RONDO_TOKEN, \
             or put it in {}\n",
            default_file.display()
        )
    );

    // RONDO_TOKEN.
    let token = std::path::Path::new(TOKEN);
    let out = ctl_env(&admin, &[], &[("HOME", &empty), ("RONDO_TOKEN", token)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("view "));

    // --token-file wins over a wrong RONDO_TOKEN.
    let file = dir.0.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let wrong = std::path::Path::new("wrong");
    let out = ctl_env(
        &admin,
        &["--token-file", file.to_str().unwrap()],
        &[("HOME", &empty), ("RONDO_TOKEN", wrong)],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The default file: ~/.config/rondo/token, or $XDG_CONFIG_HOME/rondo/token.
    std::fs::create_dir_all(default_file.parent().unwrap()).unwrap();
    std::fs::write(&default_file, format!("{TOKEN}\n")).unwrap();
    let out = ctl_env(&admin, &[], &[("HOME", &empty)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let xdg = dir.0.join("xdg");
    std::fs::create_dir_all(xdg.join("rondo")).unwrap();
    std::fs::write(xdg.join("rondo/token"), "wrong\n").unwrap();
    let out = ctl_env(&admin, &[], &[("HOME", &empty), ("XDG_CONFIG_HOME", &xdg)]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "rondo ctl: the admin API refused the token (401)\n",
        "XDG_CONFIG_HOME's file is the one read"
    );
}

#[test]
fn ctl_apply_reports_errors_at_the_files_own_name() {
    let serve = Serve::start();
    let admin = serve.admin.to_string();
    let dir = TempDir::new("admin");
    let file = dir.0.join("new.toml");
    let text = one_cluster(&member_list_of_dead()).replacen(
        "[cluster.c]\n",
        "[cluster.c]\nalgoritm = \"random\"\n",
        1,
    );
    assert!(text.contains("algoritm"), "{text}");
    std::fs::write(&file, &text).unwrap();
    let out = ctl(&admin, TOKEN, &["apply", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = text.find("algoritm").unwrap();
    let line = text[..at].matches('\n').count() + 1;
    let column = at - text[..at].rfind('\n').map_or(0, |i| i + 1) + 1;
    let want = format!(
        "\n  {}:{line}:{column}: field `cluster.c.algoritm`: unknown field `algoritm`",
        file.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!stderr.contains("admin-api"), "{stderr}");
}

/// A change with `If-Match: value`: status and JSON answer.
async fn call_if(
    s: &Setup,
    method: Method,
    path: &str,
    value: &str,
    body: Option<&str>,
) -> (StatusCode, Value) {
    api(method, &s.url(path), Some(TOKEN), &[("if-match", value)], body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_with_a_stale_if_match_are_refused_with_the_current_view() {
    let ms = members(2, Duration::ZERO).await;
    let s = Setup::new(&format!("algorithm = \"round-robin\"\n{}", member_list(&ms))).await;
    // The status's ETag is the view id.
    let auth = format!("Bearer {TOKEN}");
    let (code, headers, v) =
        json_call(Method::GET, &s.url("/api/v1/status"), &[("authorization", &auth)], None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(v["view"], 1);
    let etag = headers.get("etag").expect("an ETag").to_str().unwrap().to_owned();
    assert_eq!(etag, "\"1\"");

    // Two operators read view 1; the first change lands and makes view 2.
    let weight = "/api/v1/clusters/c/members/m1/weight";
    let (code, v) = call_if(&s, Method::PUT, weight, &etag, Some(r#"{"weight": 7}"#)).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["view"], 2);
    // The second, decided on view 1, is refused and names view 2; nothing changes.
    let stale = [
        (Method::PUT, weight, Some(r#"{"weight": 9}"#)),
        (Method::PUT, "/api/v1/clusters/c/algorithm", Some(r#"{"algorithm": "random"}"#)),
        (Method::POST, "/api/v1/clusters/c/members/m2/drain", None),
        (Method::POST, "/api/v1/clusters/c/members/m2/disable", None),
    ];
    for (method, path, body) in stale.clone() {
        let (code, v) = call_if(&s, method, path, "\"1\"", body).await;
        assert_eq!(code, StatusCode::CONFLICT, "{path}: {v}");
        assert_eq!(v["view"], 2, "{v}");
        let msg = v["error"].as_str().unwrap();
        assert!(msg.starts_with("the view is 2, not 1 (If-Match)"), "{msg}");
    }
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:1\"\n\n[[route]]\nlistener = \"web\"\n\
         cluster = \"c\"\n\n[cluster.c]\nalgorithm = \"random\"\n{}",
        member_list(&ms)
    );
    let (code, v) = call_if(&s, Method::POST, "/api/v1/config", "1", Some(&config)).await;
    assert_eq!(code, StatusCode::CONFLICT, "{v}");
    assert_eq!(s.view_id(), 2, "nothing applied");
    let (_, st) = s.call(Method::GET, "/api/v1/status", None).await;
    assert_eq!(member(&st, "c", "m1")["weight"], 7);
    assert_eq!(member(&st, "c", "m2")["admin"], "active");
    assert_eq!(st["clusters"][0]["algorithm"], "round-robin");

    // With the current view (quoted or not, weak or not) every change lands.
    let (code, v) =
        call_if(&s, Method::POST, "/api/v1/clusters/c/members/m2/drain", "W/\"2\"", None).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    let (code, v) = call_if(&s, Method::POST, "/api/v1/config", "2", Some(&config)).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["view"], 3);
    // `*` and no header at all: no condition.
    let (code, v) = call_if(&s, Method::PUT, weight, "*", Some(r#"{"weight": 3}"#)).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    // Not a view id: 400 naming the header.
    let (code, v) = call_if(&s, Method::PUT, weight, "\"abc\"", Some(r#"{"weight": 3}"#)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("If-Match must be one view id"), "{v}");
}

#[test]
fn ctl_if_match_changes_only_the_view_it_names() {
    let serve = Serve::start();
    let admin = serve.admin.to_string();
    let with_if = |view: &str, args: &[&str]| {
        Command::new(BIN)
            .args(["ctl", "--admin", &admin, "--token", TOKEN, "--if-match", view])
            .args(args)
            .output()
            .expect("rondo ctl runs")
    };
    let out = with_if("1", &["weight", "c", "a", "5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "c/a: weight 5, view 2\n");
    let out = with_if("1", &["drain", "c", "b"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("rondo ctl: the admin API answered 409 Conflict: the view is 2, not 1"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&ctl(&admin, TOKEN, &["status"]).stdout).into_owned();
    assert!(stdout.contains("active(config)") && !stdout.contains("draining"), "{stdout}");
    let out = with_if("2", &["drain", "c", "b"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_health_check_says_why_and_unchecked_members_are_not_called_up() {
    let ms = members(1, Duration::ZERO).await;
    let dir = TempDir::new("admin-health");
    // `c`: health checks that fail, one member answering 503, one refusing connections.
    // `u`: no health checks at all.
    let config = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\npanic_threshold_percent = 0\n\
         health = {{ path = \"/status/503\", interval_ms = 100, fall = 2, rise = 2 }}\n{}\n\n\
         [cluster.u]\n{}\n",
        members_of([entry(&ms[0], ""), member_entry("gone", dead_addr(), "")]),
        members_of([entry(&ms[0], "")]),
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--workers", "1", "--config", path.to_str().unwrap()])
        .env("RONDO_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let log = common::collect_lines(child.stderr.take().unwrap());
    let mut proc = Proc::from_child(child);
    let admin = proc.addr_after("rondo: admin API on ").to_string();
    let url = format!("http://{admin}/api/v1/status");
    let start = std::time::Instant::now();
    let mut st = Value::Null;
    while start.elapsed() < Duration::from_secs(10) {
        st = api(Method::GET, &url, Some(TOKEN), &[], None).await.1;
        let down = |n: &str| member(&st, "c", n)["health"] == "down";
        if down("m1") && down("gone") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m1 = member(&st, "c", "m1");
    assert_eq!(m1["health"], "down", "{st}");
    assert_eq!(m1["last_probe_failure"], "status 503", "{m1}");
    assert_eq!(
        (&m1["eligible"], &m1["reason"]),
        (&Value::Bool(false), &Value::from("health_check"))
    );
    let gone = member(&st, "c", "gone");
    assert_eq!(gone["last_probe_failure"], "refused", "{gone}");
    let u = member(&st, "u", "m1");
    assert_eq!((&u["health"], &u["eligible"]), (&Value::from("unchecked"), &Value::Bool(true)));
    assert_eq!(u["last_probe_failure"], Value::Null);

    let out = ctl(&admin, TOKEN, &["status"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = |cluster: &str, name: &str| -> String {
        table
            .lines()
            .find(|l| {
                l.starts_with(&format!("{cluster} ")) && l.split_whitespace().nth(1) == Some(name)
            })
            .unwrap_or_else(|| panic!("no row {cluster}/{name}:\n{table}"))
            .to_owned()
    };
    assert!(
        row("c", "m1").contains(" down(status 503) ")
            && row("c", "m1").contains(" no(health_check) "),
        "{table}"
    );
    assert!(row("c", "gone").contains(" down(refused) "), "{table}");
    assert!(row("u", "m1").contains(" unchecked ") && row("u", "m1").contains(" yes "), "{table}");
    assert!(!table.contains(" up "), "nothing here is checked and up:\n{table}");

    // The member-down log line says why.
    let start = std::time::Instant::now();
    let line = loop {
        let found = log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("member down") && l.contains("m1"))
            .cloned();
        if let Some(l) = found {
            break l;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no member down line");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(line.contains("status 503"), "{line}");
    proc.kill();
}

#[test]
fn ctl_drain_wait_returns_once_the_member_has_nothing_in_flight() {
    // A member that takes 3 s to answer, behind a real `rondo serve`.
    let mut member =
        Proc::start(&["member", "--name", "m1", "--listen", "127.0.0.1:0", "--delay-ms", "3000"]);
    let line = member.line_with("rondo member m1 on ", Duration::from_secs(10));
    let m1: SocketAddr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("address");
    let dir = TempDir::new("admin-drain");
    let config = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n{}",
        one_cluster(&members_of([member_entry("m1", m1, "")]))
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--workers", "1", "--config", path.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rondo serve");
    let logs = common::collect_lines(child.stderr.take().expect("stderr"));
    let mut serve = Proc::from_child(child);
    let web = serve.addr_after("rondo: listener web on ");
    let admin = serve.addr_after("rondo: admin API on ");
    let admin_s = admin.to_string();

    // One request in flight on m1.
    let (done_tx, done) = std::sync::mpsc::channel();
    let sent = std::time::Instant::now();
    std::thread::spawn(move || {
        let answer = common::request(web, "GET", "/", b"");
        let _ = done_tx.send(answer);
    });
    let in_flight = || {
        let out = ctl(&admin_s, TOKEN, &["status"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().find(|l| l.starts_with("c ")).map(|l| l.split_whitespace().nth(8) == Some("1"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while in_flight() != Some(true) {
        assert!(std::time::Instant::now() < deadline, "the request never reached m1");
        std::thread::sleep(Duration::from_millis(20));
    }

    // While it is in flight, a short wait runs out and says what remains.
    let out = ctl(&admin_s, TOKEN, &["drain", "--wait", "--timeout-ms", "300", "c", "m1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "drain --wait returned with a request in flight");
    assert!(
        stderr.contains("c/m1: not drained after")
            && stderr.contains("1 requests in flight, 0 sessions"),
        "{stderr}"
    );
    assert!(done.try_recv().is_err(), "the request had already ended: the case tested nothing");

    // A wait without a short timeout returns once the request is done, and only then.
    let out = ctl(&admin_s, TOKEN, &["drain", "--wait", "c", "m1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("c/m1: drained after ") && stdout.ends_with(" ms\n"), "{stdout}");
    // The member holds the request for 3 s from its arrival, so a wait that returned
    // earlier returned with the request still in flight. (The answer itself reaches the
    // client thread a moment after the router counts the request done, so the channel is
    // read with a bound rather than asserted empty-or-full at this instant.)
    assert!(
        sent.elapsed() >= Duration::from_millis(2900),
        "drained {:?} after the request was sent, before the member could answer",
        sent.elapsed()
    );
    let (status, body) =
        done.recv_timeout(Duration::from_secs(10)).expect("the in-flight request got no answer");
    assert_eq!((status, body.trim()), (200, "m1"));

    // The router logged the moment and counted it once.
    let logged = || {
        let lines = logs.lock().unwrap();
        lines
            .iter()
            .filter(|l| l.contains("member drained: no request in flight and no session"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while logged() == 0 {
        assert!(std::time::Instant::now() < deadline, "no `member drained` log line");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(logged(), 1);
    let metrics = std::process::Command::new("curl")
        .args([
            "-s",
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            &format!("http://{admin}/metrics"),
        ])
        .output()
        .expect("curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(metrics.contains("rondo_drains_completed_total{cluster=\"c\"} 1"), "{metrics}");
    // Without --wait, --timeout-ms is refused.
    let out = ctl(&admin_s, TOKEN, &["drain", "--timeout-ms", "5", "c", "m1"]);
    assert!(!out.status.success());
}

/// `rondo serve` (admin API, round-robin cluster `c` on listener `web`) over `rondo member`
/// processes called `names`, plus a member `dead` at an address that refuses connections when
/// `with_dead`; all killed on drop.
struct Members {
    // Dropped in this order: the router, its members, then the directory.
    _serve: Proc,
    _members: Vec<Proc>,
    _dir: TempDir,
    web: SocketAddr,
    admin: String,
}

impl Members {
    fn start(names: &[&str], with_dead: bool) -> Members {
        let mut procs = Vec::new();
        let mut entries = Vec::new();
        for name in names {
            let (p, addr) = common::start_member(name, "127.0.0.1:0");
            entries.push(member_entry(name, addr, ""));
            procs.push(p);
        }
        if with_dead {
            entries.push(member_entry("dead", dead_addr(), ""));
        }
        let dir = TempDir::new("admin-shadow");
        let config = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n{}",
            one_cluster(&format!("algorithm = \"round-robin\"\n{}", members_of(entries)))
        );
        let path = dir.0.join("rondo.toml");
        std::fs::write(&path, config).unwrap();
        let mut serve =
            Proc::start(&["serve", "--workers", "1", "--config", path.to_str().unwrap()]);
        let web = serve.addr_after("rondo: listener web on ");
        let admin = serve.addr_after("rondo: admin API on ").to_string();
        Members { _serve: serve, _members: procs, _dir: dir, web, admin }
    }

    /// `n` requests one after the other; the member that answered each.
    fn send(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let (status, body) = common::request(self.web, "GET", "/", b"");
                assert_eq!(status, 200, "{body}");
                body.trim().to_owned()
            })
            .collect()
    }

    fn ctl(&self, args: &[&str]) -> (bool, String, String) {
        let out = ctl(&self.admin, TOKEN, args);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        api(Method::GET, &format!("http://{}{path}", self.admin), Some(TOKEN), &[], None).await
    }
}

/// Whether `names` follow round-robin over `order` exactly, from wherever it starts.
fn round_robin(names: &[String], order: &[&str]) -> bool {
    let Some(start) = order.iter().position(|m| *m == names[0]) else { return false };
    names.iter().enumerate().all(|(i, n)| n == order[(start + i) % order.len()])
}

fn shadow_member<'a>(report: &'a Value, name: &str) -> &'a Value {
    let members = report["members"].as_array().expect("members");
    members.iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("no {name}: {report}"))
}

/// `rondo ctl shadow` against a real `rondo serve` and three `rondo member` processes: a random
/// shadow beside round-robin compares every request sent, the live picks stay round-robin's
/// exactly, the shadow survives a view change, shows in status and metrics, and `--off` stops
/// it without changing the traffic either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_shadow_compares_every_request_without_moving_traffic() {
    const ORDER: [&str; 3] = ["m1", "m2", "m3"];
    let s = Members::start(&ORDER, false);
    let (ok, out, err) = s.ctl(&["shadow", "c", "fastest"]);
    assert!(!ok && err.contains("unknown algorithm `fastest`; valid: round-robin"), "{out}{err}");
    let (ok, out, err) = s.ctl(&["shadow", "c"]);
    assert!(!ok && err.contains("cluster `c` has no shadow algorithm"), "{out}{err}");

    let (ok, out, err) = s.ctl(&["shadow", "c", "random"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("c: shadow random beside round-robin: asked at every pick"), "{out}");

    let names = s.send(120);
    assert!(round_robin(&names, &ORDER), "live picks are round-robin's: {names:?}");
    let (code, r) = s.get("/api/v1/clusters/c/shadow").await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert_eq!((r["shadow"].as_str(), r["live"].as_str()), (Some("random"), Some("round-robin")));
    assert_eq!(r["decisions"], 120, "{r}");
    assert_eq!(r["no_pick"], 0, "{r}");
    let agreed = r["agreed"].as_u64().unwrap();
    assert_eq!(agreed + r["differed"].as_u64().unwrap(), 120, "{r}");
    assert_eq!(r["live_total"]["picks"], 120, "{r}");
    assert_eq!(r["shadow_total"]["picks"], 120, "{r}");
    let mut agreed_sum = 0;
    for name in ORDER {
        let m = shadow_member(&r, name);
        assert_eq!(m["live"]["picks"], 40, "{m}");
        // Random over three members: 40 expected, below 15 is a chance of about 1e-6.
        assert!(m["shadow"]["picks"].as_u64().unwrap() >= 15, "{m}");
        assert_eq!(m["live"]["failed"], 0, "{m}");
        // Sequential requests: every live pick is resolved by its own answer.
        assert_eq!(m["live"]["unresolved"], 0, "{m}");
        agreed_sum += m["agreed"].as_u64().unwrap();
    }
    assert_eq!(agreed_sum, agreed);
    assert!(agreed < 80, "random agrees with round-robin about a third of the time: {r}");

    let (ok, out, err) = s.ctl(&["shadow", "c"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("cluster c: shadow random beside live round-robin for ")
            && out.contains(": 120 picks compared, "),
        "{out}"
    );
    assert!(out.contains("would have gone to failed members: shadow 0 (0.0%), live 0 (0.0%)"));
    let row = out.lines().find(|l| l.starts_with("m2 ")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(row.split_whitespace().nth(1), Some("40"), "{out}");
    assert!(out.lines().nth(3).unwrap().starts_with("MEMBER  LIVE  LIVE-%  SHADOW"), "{out}");

    // Status, ctl status and metrics say so.
    let (_, st) = s.get("/api/v1/status").await;
    assert_eq!(st["clusters"][0]["shadow"], "random", "{st}");
    let (_, out, _) = s.ctl(&["status"]);
    assert!(out.contains("shadow: c evaluates random beside round-robin"), "{out}");
    let metrics = std::process::Command::new("curl")
        .args(["-s", "-H", &format!("Authorization: Bearer {TOKEN}")])
        .arg(format!("http://{}/metrics", s.admin))
        .output()
        .expect("curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains(
            "rondo_shadow_decisions{cluster=\"c\",live=\"round-robin\",shadow=\"random\"} 120"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "rondo_shadow_picks{cluster=\"c\",shadow=\"random\",member=\"m1\",side=\"live\",kind=\"all\"} 40"
        ),
        "{metrics}"
    );

    // A view change (a new weight) keeps the shadow and its counts.
    let (ok, _, err) = s.ctl(&["weight", "c", "m1", "5"]);
    assert!(ok, "{err}");
    let more = s.send(30);
    assert!(round_robin(&more, &ORDER), "{more:?}");
    let (_, r) = s.get("/api/v1/clusters/c/shadow").await;
    assert_eq!((r["decisions"].as_u64(), r["view"].as_u64()), (Some(150), Some(2)), "{r}");
    assert_eq!(r["live_total"]["picks"], 150);

    // Off: the last report, then none; traffic as before.
    let (ok, out, err) = s.ctl(&["shadow", "--off", "c"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("c: shadow random stopped; its last report:\n"), "{out}");
    assert!(out.contains(": 150 picks compared, "), "{out}");
    let (code, r) = s.get("/api/v1/clusters/c/shadow").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{r}");
    let (ok, _, err) = s.ctl(&["shadow", "--off", "c"]);
    assert!(!ok && err.contains("has no shadow algorithm"), "{err}");
    let (_, st) = s.get("/api/v1/status").await;
    assert_eq!(st["clusters"][0]["shadow"], Value::Null, "{st}");
    let after = s.send(9);
    assert!(round_robin(&after, &ORDER), "{after:?}");
    let (ok, _, err) = s.ctl(&["shadow", "nope", "random"]);
    assert!(!ok && err.contains("unknown cluster `nope`"), "{err}");

    // `rondo ctl algorithm` then switches for real.
    let (ok, _, err) = s.ctl(&["algorithm", "c", "random"]);
    assert!(ok, "{err}");
    let (_, st) = s.get("/api/v1/status").await;
    assert_eq!(st["clusters"][0]["algorithm"], "random");
}

/// A member that refuses connections, behind a real `rondo serve`: round-robin tries it (and
/// fails over) until outlier detection ejects it; the shadow's picks of it are counted as picks
/// that would have gone to a failed member, and every try is one compared pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_member_shows_in_the_shadows_failed_picks() {
    let s = Members::start(&["m1", "m2"], true);
    let (ok, _, err) = s.ctl(&["shadow", "c", "weighted"]);
    assert!(ok, "{err}");
    let names = s.send(30);
    assert!(names.iter().all(|n| n == "m1" || n == "m2"), "{names:?}");
    let (_, r) = s.get("/api/v1/clusters/c/shadow").await;
    let dead = shadow_member(&r, "dead");
    let live_tries = dead["live"]["picks"].as_u64().unwrap();
    assert_eq!(live_tries, 5, "tried until ejected (5 consecutive failures): {r}");
    assert_eq!(dead["live"]["failed"], live_tries, "{r}");
    // Each failed try went on to another member: one more pick.
    assert_eq!(r["decisions"], 30 + live_tries, "{r}");
    let shadow_picks = dead["shadow"]["picks"].as_u64().unwrap();
    assert!(shadow_picks >= 1, "{r}");
    assert_eq!(dead["shadow"]["failed"], shadow_picks, "{r}");
    assert_eq!(r["shadow_total"]["failed"], shadow_picks, "{r}");
    let (_, out, _) = s.ctl(&["shadow", "c"]);
    assert!(
        out.contains(&format!(
            "would have gone to failed members: shadow {shadow_picks} ({:.1}%), live {live_tries}",
            shadow_picks as f64 * 100.0 / (30 + live_tries) as f64
        )),
        "{out}"
    );
    let row = out.lines().find(|l| l.starts_with("dead ")).unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains(&format!(" {live_tries}/{shadow_picks} ")), "{out}");
}

/// `rondo serve` with one member `m1` at `member`, health-checked every 100 ms, and `[admin]`
/// with `probes` (lines of the table).
fn serve_with_probes(dir: &TempDir, member: SocketAddr, probes: &str) -> Proc {
    let path = dir.0.join("rondo.toml");
    let config = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n{probes}\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nhealth = {{ kind = \"tcp\", interval = \"100ms\", fall = 1, rise = 1 }}\n\
         members = [{{ name = \"m1\", address = \"{member}\" }}]\n"
    );
    std::fs::write(&path, config).expect("write config");
    let child = Command::new(BIN)
        .args(["serve", "--workers", "1", path.to_str().expect("utf-8")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start rondo serve");
    Proc::from_child(child)
}

/// GETs `path` at `addr` until its status is `want` (10 s at most): the last body.
#[track_caller]
fn until_status(addr: SocketAddr, path: &str, want: u16) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = common::request(addr, "GET", path, b"");
        if status == want {
            return body;
        }
        assert!(std::time::Instant::now() < deadline, "{path}: {status} {body}, not {want}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn probes_on_their_own_listener_answer_without_the_token_and_follow_the_members() {
    let dir = TempDir::new("admin");
    let (mut m1, member) = common::start_member("m1", "127.0.0.1:0");
    let mut serve = serve_with_probes(
        &dir,
        member,
        "ready_path = \"/ready\"\nlive_path = \"/live\"\nprobe_listen = \"127.0.0.1:0\"",
    );
    let admin = serve.addr_after("rondo: admin API on ");
    let probes = serve.addr_after("rondo: probe listener on ");
    serve.line_with("rondo: reloading on", Duration::from_secs(10));

    assert_eq!(common::request(probes, "GET", "/ready", b""), (200, "ready\n".to_owned()));
    assert_eq!(common::request(probes, "GET", "/live", b""), (200, "live\n".to_owned()));
    // Nothing else on the probe listener; the probe paths are not on the admin listener.
    assert_eq!(common::request(probes, "GET", "/api/v1/status", b"").0, 404);
    assert_eq!(common::request(probes, "GET", "/metrics", b"").0, 404);
    assert_eq!(common::request(admin, "GET", "/ready", b"").0, 401);

    // The only member goes down: not ready, with the reason; alive all the same.
    m1.kill();
    let body = until_status(probes, "/ready", 503);
    assert_eq!(body, "not ready\ncluster c: no eligible member\n");
    assert_eq!(common::request(probes, "GET", "/live", b"").0, 200);
    // It comes back on the same address: ready again.
    let (_m1, _) = common::start_member("m1", &member.to_string());
    until_status(probes, "/ready", 200);
}

#[test]
fn probes_on_the_admin_listener_need_no_token_while_the_api_still_does() {
    let dir = TempDir::new("admin");
    let (_m1, member) = common::start_member("m1", "127.0.0.1:0");
    let (mut dead, gone) = common::start_member("m2", "127.0.0.1:0");
    dead.kill();
    let probes = format!(
        "ready_path = \"/healthz/ready\"\nready_clusters = [\"c\"]\n\n\
         [cluster.spare]\nhealth = {{ kind = \"tcp\", interval = \"100ms\", fall = 1 }}\n\
         members = [{{ name = \"m2\", address = \"{gone}\" }}]"
    );
    let mut serve = serve_with_probes(&dir, member, &probes);
    let admin = serve.addr_after("rondo: admin API on ");
    serve.line_with("rondo: reloading on", Duration::from_secs(10));
    // `spare` has no live member, but readiness only asks about `c`.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(common::request(admin, "GET", "/healthz/ready", b""), (200, "ready\n".to_owned()));
    assert_eq!(common::request(admin, "GET", "/api/v1/status", b"").0, 401);
    assert_eq!(common::request(admin, "GET", "/live", b"").0, 401);
}
