//! Services that declare their policy (issue 20, part 4; PKUAS's deployment descriptors): with
//! `[naming] allow_registered_clusters = true` a registration creates its cluster with the
//! policy it declares, and the router, the naming service and the client library balance it by
//! that policy. Real `rondo serve` and `rondo member` processes on 127.0.0.1; the etcd test on a
//! real etcd.

mod common;
#[cfg(feature = "etcd")]
#[path = "../../rondo-naming/tests/support/mod.rs"]
mod etcd_support;
#[path = "router/support.rs"]
mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Proc, TempDir, start_member};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rondo_client::{CallOptions, Client, Failed};
use serde_json::{Value, json};
use support::*;

/// The policy the `orders` members declare: consistent hashing on a header, whose picks a test
/// can compare exactly across the three balancing points (the default, round-robin, would send
/// one key to every member in turn).
fn hash_policy() -> Value {
    json!({ "algorithm": "hash", "hash": { "key": "header:x-user" }, "retry": { "attempts": 2 } })
}

/// A config whose route `main` names cluster `orders`, which the file does not define, and a
/// configured cluster `files` (the default policy, round-robin) with member `f1` at `f1`,
/// routed for paths under `/files`.
fn config(f1: SocketAddr, naming: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"files\"\nlistener = \"web\"\nmatch = {{ path_prefix = \"/files\" }}\ncluster = \"files\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"orders\"\n\n\
         [cluster.files]\nmembers = [{{ name = \"f1\", address = \"{f1}\" }}]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nallow_registered_clusters = true\n{naming}"
    )
}

/// One `rondo serve` with its listener `web` and naming API.
struct Serve {
    _proc: Proc,
    web: SocketAddr,
    naming: SocketAddr,
}

impl Serve {
    fn start(file: &Path, backend: &str) -> Serve {
        let mut proc = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
        let web = proc.addr_after("rondo: listener web on");
        let naming = proc.addr_after(&format!("rondo: naming API (registry {backend}) on"));
        Serve { _proc: proc, web, naming }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let url = format!("http://{}{path}", self.naming);
        let body = body.map(|b| b.to_string());
        let (status, _, v) = json_call(method, &url, &[], body.as_deref()).await;
        (status, v)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    /// Registers `member` at `address` into `service` with `extra` fields (`policy`, `ttl_ms`).
    async fn register(
        &self,
        service: &str,
        member: &str,
        address: SocketAddr,
        extra: Value,
    ) -> (StatusCode, Value) {
        let mut body = json!({ "address": address.to_string(), "ttl_ms": 30_000 });
        if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
            b.extend(e);
        }
        let path = format!("/v1/services/{service}/members/{member}");
        self.call(Method::PUT, &path, Some(body)).await
    }

    /// The service's full answer, which must be there.
    async fn answer(&self, service: &str) -> Value {
        let (status, v) = self.get(&format!("/v1/services/{service}")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }

    async fn services(&self) -> Vec<String> {
        let (status, v) = self.get("/v1/services").await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["services"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect()
    }
}

fn names(answer: &Value) -> Vec<String> {
    let members = answer["members"].as_array().expect("members");
    members.iter().map(|m| m["name"].as_str().unwrap().to_owned()).collect()
}

/// The member `client` calls for `key` (a real GET to it).
async fn client_pick(
    client: &Client,
    http: &HttpClient<HttpConnector, Empty<bytes::Bytes>>,
    key: &str,
) -> String {
    let options = CallOptions::default().hash_key(key);
    client
        .call_with(options, |member| {
            let http = http.clone();
            async move {
                let uri = format!("http://{}/", member.addr()).parse().expect("uri");
                let resp =
                    http.get(uri).await.map_err(|e| Failed::classify(e).map(|e| e.to_string()))?;
                let body =
                    resp.into_body().collect().await.map_err(|e| Failed::Member(e.to_string()))?;
                Ok(String::from_utf8_lossy(&body.to_bytes()).trim().to_owned())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("client call for key {key}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_declares_its_policy_is_balanced_by_it_at_all_three_points() {
    let dir = TempDir::new("declared");
    let (_f1, f1) = start_member("f1", "127.0.0.1:0");
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config(f1, "")).unwrap();
    let serve = Serve::start(&file, "embedded");
    let http = client();
    let orders = format!("http://{}/", serve.web);

    // Until a member declares it, the route finds no member and naming knows no `orders`.
    let r = get_with(&http, &orders, &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(serve.get("/v1/services/orders").await.0, StatusCode::NOT_FOUND);

    let members: Vec<_> =
        ["o1", "o2", "o3"].iter().map(|n| start_member(n, "127.0.0.1:0")).collect();
    let (status, v) =
        serve.register("orders", "o1", members[0].1, json!({ "policy": hash_policy() })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["policy"], "declared", "{v}");
    assert!(v["lease"].is_string(), "{v}");
    // The second declares the same policy through the client library's naming client.
    let naming = rondo_client::NamingClient::new(&serve.naming.to_string(), Duration::from_secs(5))
        .expect("naming endpoint");
    let reg = rondo_client::wire::Register {
        address: members[1].1.to_string(),
        weight: None,
        group: None,
        ttl_ms: Some(30_000),
    };
    let lease = naming.register_declaring("orders", "o2", &reg, &hash_policy()).await;
    assert!(!lease.expect("registered through the client library").lease.is_empty());
    // The third registers without a policy: it joins the declared one.
    let (status, v) = serve.register("orders", "o3", members[2].1, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["policy"], "declared", "{v}");

    // Naming: listed, and the full answer carries the declared policy.
    assert_eq!(serve.services().await, ["files", "orders"]);
    let answer = serve.answer("orders").await;
    assert_eq!(names(&answer), ["o1", "o2", "o3"]);
    assert_eq!(answer["policy"]["algorithm"], "hash", "{answer}");
    assert_eq!(answer["policy"]["hash"]["key"], json!({ "header": "x-user" }), "{answer}");
    assert_eq!(answer["policy"]["retry"]["attempts"], 2, "{answer}");
    assert!(answer["members"].as_array().unwrap().iter().all(|m| m["source"] == "registry"));

    // The client library balances per request from that answer.
    let naming = serve.naming.to_string();
    let lib = Client::builder("orders").endpoint(naming).seed(7).connect().await.expect("connect");
    assert_eq!(lib.policy().algorithm, rondo_core::Algorithm::Hash);
    let plain: HttpClient<HttpConnector, Empty<bytes::Bytes>> =
        HttpClient::builder(TokioExecutor::new()).build_http();

    // For every key the router, a naming lookup and the client library pick the same member,
    // every time; the keys spread over the members.
    let mut used = BTreeSet::new();
    for k in 0..24 {
        let key = format!("user-{k}");
        let routed = served_name_with(&http, &orders, &[("x-user", &key)]).await;
        for _ in 0..2 {
            assert_eq!(served_name_with(&http, &orders, &[("x-user", &key)]).await, routed);
        }
        let (status, lookup) = serve.get(&format!("/v1/lookup/orders?key={key}")).await;
        assert_eq!(status, StatusCode::OK, "{lookup}");
        assert_eq!(lookup["member"]["name"], routed.as_str(), "lookup of {key}: {lookup}");
        assert!(lookup["why"].as_str().unwrap().starts_with("hash"), "{lookup}");
        for _ in 0..2 {
            assert_eq!(client_pick(&lib, &plain, &key).await, routed, "client pick of {key}");
        }
        used.insert(routed);
    }
    assert!(used.len() >= 2, "24 keys all went to {used:?}");

    // The configured cluster keeps its file's policy whatever a registration declares.
    let (_g2, g2) = start_member("f2", "127.0.0.1:0");
    let (status, v) = serve.register("files", "f2", g2, json!({ "policy": hash_policy() })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["policy"], "configured", "{v}");
    let files = serve.answer("files").await;
    assert_eq!(files["policy"]["algorithm"], "round-robin", "{files}");
    assert_eq!(names(&files), ["f1", "f2"]);
    let url = format!("http://{}/files", serve.web);
    let served: BTreeSet<String> = served_by(&url, 4).await.into_iter().collect();
    assert_eq!(served.into_iter().collect::<Vec<_>>(), ["f1", "f2"], "round robin over both");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_policies_must_agree_must_compile_and_leave_with_their_last_lease() {
    let dir = TempDir::new("declared");
    let (_f1, f1) = start_member("f1", "127.0.0.1:0");
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config(f1, "")).unwrap();
    let serve = Serve::start(&file, "embedded");
    let (_o1, a1) = start_member("o1", "127.0.0.1:0");
    let (_o2, a2) = start_member("o2", "127.0.0.1:0");

    let (status, v) = serve.register("orders", "o1", a1, json!({ "policy": hash_policy() })).await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // A different policy is 409 naming the first differing field and both values.
    let rr = json!({ "policy": { "algorithm": "round-robin" } });
    let (status, v) = serve.register("orders", "o2", a2, rr).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.starts_with("policy.algorithm: service `orders` is declared with \"hash\""), "{e}");
    assert!(e.contains("this registration declares \"round-robin\""), "{e}");
    let other_key =
        json!({ "policy": { "algorithm": "hash", "hash": { "key": "header:x-tenant" } } });
    let (status, v) = serve.register("orders", "o2", a2, other_key).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("policy.hash.key: "), "{v}");
    // The same policy with a default spelled out agrees.
    let mut same = hash_policy();
    same["granularity"] = json!("request");
    let (status, v) = serve.register("orders", "o2", a2, json!({ "policy": same })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(names(&serve.answer("orders").await), ["o1", "o2"]);

    // A bad policy is 400 naming the field, with the config file's own message.
    let bad = json!({ "policy": { "algorithm": "fastest" } });
    let (status, v) = serve.register("orders", "o3", a2, bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.starts_with("policy.algorithm: unknown algorithm `fastest`, expected "), "{e}");
    let bad = json!({ "policy": { "retry": { "attempts": 0 } } });
    let (status, v) = serve.register("orders", "o3", a2, bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "policy.retry.attempts: must be greater than 0");
    let bad = json!({ "policy": { "members": [] , "upstream_tls": { "ca": "/etc/ca.pem" } } });
    let (status, v) = serve.register("orders", "o3", a2, bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("policy.upstream_tls: "), "{v}");

    // A declared cluster leaves the view when its last lease lapses.
    let brief = json!({ "policy": { "algorithm": "random" }, "ttl_ms": 1_000 });
    let (status, v) = serve.register("brief", "b1", a1, brief).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(serve.answer("brief").await["policy"]["algorithm"], "random");
    assert!(serve.services().await.contains(&"brief".to_owned()));
    let start = Instant::now();
    while serve.get("/v1/services/brief").await.0 != StatusCode::NOT_FOUND {
        assert!(start.elapsed() < Duration::from_secs(5), "brief still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(start.elapsed() > Duration::from_millis(500), "it left before its lease lapsed");
    assert_eq!(serve.services().await, ["files", "orders"]);
    // Gone, its name is free for another policy.
    let again = json!({ "policy": { "algorithm": "least-sessions" } });
    let (status, v) = serve.register("brief", "b1", a1, again).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(serve.answer("brief").await["policy"]["algorithm"], "least-sessions");

    // Deregistering the last member takes the cluster out too.
    let (status, _) = serve.call(Method::DELETE, "/v1/services/brief/members/b1", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(serve.get("/v1/services/brief").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_brings_declared_clusters_back_from_the_snapshot() {
    let dir = TempDir::new("declared");
    let (_f1, f1) = start_member("f1", "127.0.0.1:0");
    let (_o1, a1) = start_member("o1", "127.0.0.1:0");
    let (_o2, a2) = start_member("o2", "127.0.0.1:0");
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config(f1, "snapshot = \"registry.json\"\n")).unwrap();

    let first = Serve::start(&file, "embedded");
    let (status, v) = first.register("orders", "o1", a1, json!({ "policy": hash_policy() })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = first.register("orders", "o2", a2, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let http = client();
    let url = format!("http://{}/", first.web);
    let before: Vec<String> = {
        let mut v = Vec::new();
        for k in 0..8 {
            v.push(served_name_with(&http, &url, &[("x-user", &format!("u{k}"))]).await);
        }
        v
    };
    drop(first);

    let second = Serve::start(&file, "embedded");
    let answer = second.answer("orders").await;
    assert_eq!(names(&answer), ["o1", "o2"]);
    assert_eq!(answer["policy"]["algorithm"], "hash", "{answer}");
    assert_eq!(answer["policy"]["hash"]["key"], json!({ "header": "x-user" }), "{answer}");
    // The route balances by it again: every key goes where it went before the restart.
    let url = format!("http://{}/", second.web);
    for (k, was) in before.iter().enumerate() {
        let now = served_name_with(&http, &url, &[("x-user", &format!("u{k}"))]).await;
        assert_eq!(&now, was, "key u{k}");
    }
    // A conflicting registration is still refused after the restart.
    let rr = json!({ "policy": { "algorithm": "round-robin" } });
    let (status, v) = second.register("orders", "o3", a2, rr).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_on_one_etcd_compose_the_same_declared_cluster() {
    let etcd = etcd_support::Etcd::start();
    let (_f1, f1) = start_member("f1", "127.0.0.1:0");
    let (_o1, a1) = start_member("o1", "127.0.0.1:0");
    let (_o2, a2) = start_member("o2", "127.0.0.1:0");
    let naming = format!(
        "registry = \"etcd\"\netcd_endpoints = [\"{}\"]\netcd_prefix = \"/declared\"\n",
        etcd.endpoint()
    );
    let dirs = [TempDir::new("declared-etcd"), TempDir::new("declared-etcd")];
    let routers: Vec<Serve> = dirs
        .iter()
        .map(|d| {
            let file = d.0.join("rondo.toml");
            std::fs::write(&file, config(f1, &naming)).unwrap();
            Serve::start(&file, "etcd")
        })
        .collect();

    // Registered through the first router, declared on both.
    let (status, v) =
        routers[0].register("orders", "o1", a1, json!({ "policy": hash_policy() })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["policy"], "declared");
    let start = Instant::now();
    for r in &routers {
        loop {
            let (status, v) = r.get("/v1/services/orders").await;
            if status == StatusCode::OK && names(&v) == ["o1"] {
                assert_eq!(v["policy"]["algorithm"], "hash", "{v}");
                assert_eq!(v["policy"]["hash"]["key"], json!({ "header": "x-user" }), "{v}");
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "not declared everywhere: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The second router knows the declared policy: a conflict is refused there too, and a
    // registration without a policy joins it.
    let rr = json!({ "policy": { "algorithm": "round-robin" } });
    let (status, v) = routers[1].register("orders", "o2", a2, rr).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let (status, v) = routers[1].register("orders", "o2", a2, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let http = client();
    for r in &routers {
        let start = Instant::now();
        while names(&r.answer("orders").await) != ["o1", "o2"] {
            assert!(start.elapsed() < Duration::from_secs(5), "o2 not listed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(r.answer("orders").await["policy"]["algorithm"], "hash");
    }
    // Both routers send each key to the same member.
    for k in 0..8 {
        let key = format!("u{k}");
        let (a, b) = (format!("http://{}/", routers[0].web), format!("http://{}/", routers[1].web));
        let a = served_name_with(&http, &a, &[("x-user", &key)]).await;
        let b = served_name_with(&http, &b, &[("x-user", &key)]).await;
        assert_eq!(a, b, "key {key}");
    }
}

#[test]
fn rondo_check_warns_at_a_route_to_a_cluster_the_file_lacks() {
    let dir = TempDir::new("declared-check");
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config("127.0.0.1:9".parse().unwrap(), "")).unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .expect("run rondo check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: field `route[1].cluster`: cluster `orders` is not in the file"),
        "{err}"
    );
    // Without allow_registered_clusters the same route is an error.
    let text = config("127.0.0.1:9".parse().unwrap(), "")
        .replace("allow_registered_clusters = true\n", "");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .expect("run rondo check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("unknown cluster `orders`"), "{err}");
}

/// DNS answers a declared cluster like a configured one (the view carries it).
#[cfg(feature = "dns")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answers_a_declared_cluster() {
    let dir = TempDir::new("declared-dns");
    let (_f1, f1) = start_member("f1", "127.0.0.1:0");
    let file = dir.0.join("rondo.toml");
    let dns = "dns_listen = \"127.0.0.1:0\"\ndns_zone = \"svc.test\"\n";
    std::fs::write(&file, config(f1, dns)).unwrap();
    let mut proc = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
    let naming = proc.addr_after("rondo: naming API (registry embedded) on");
    let dns = proc.addr_after("rondo: naming DNS (udp and tcp, zone svc.test.) on");
    let serve = Serve { _proc: proc, web: naming, naming };
    let policy = json!({ "policy": { "algorithm": "weighted" }, "weight": 300 });
    let (status, v) =
        serve.register("orders", "o1", "127.0.0.21:8001".parse().unwrap(), policy).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let out = std::process::Command::new("dig")
        .args([&format!("@{}", dns.ip()), "-p", &dns.port().to_string()])
        .args(["orders.svc.test.", "SRV", "+short", "+tries=1", "+time=2"])
        .output()
        .expect("run dig");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0 300 8001 o1.orders.svc.test.");
}

/// The admin API's status (what `rondo ctl status` and the dashboard show) lists a declared
/// cluster with its declared algorithm, and drops it when it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_status_shows_a_declared_cluster() {
    let dir = TempDir::new("declared-admin");
    let (_f1, f1) = start_member("f1", "127.0.0.1:0");
    let (_o1, a1) = start_member("o1", "127.0.0.1:0");
    let file = dir.0.join("rondo.toml");
    let admin = "\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"admin-secret\"\n";
    std::fs::write(&file, config(f1, admin)).unwrap();
    let mut proc = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
    let web = proc.addr_after("rondo: listener web on");
    let admin = proc.addr_after("rondo: admin API on");
    let naming = proc.addr_after("rondo: naming API (registry embedded) on");
    let serve = Serve { _proc: proc, web, naming };
    let status = || async {
        let url = format!("http://{admin}/api/v1/status");
        let auth = [("authorization", "Bearer admin-secret")];
        let (status, _, v) = json_call(Method::GET, &url, &auth, None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["clusters"].as_array().unwrap().clone()
    };
    let (code, v) = serve.register("orders", "o1", a1, json!({ "policy": hash_policy() })).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    let clusters = status().await;
    let orders = clusters.iter().find(|c| c["name"] == "orders").expect("orders in status");
    assert_eq!(orders["algorithm"], "hash", "{orders}");
    assert_eq!(orders["members"][0]["name"], "o1", "{orders}");

    let (code, _) = serve.call(Method::DELETE, "/v1/services/orders/members/o1", None).await;
    assert_eq!(code, StatusCode::NO_CONTENT);
    let clusters = status().await;
    assert!(clusters.iter().all(|c| c["name"] != "orders"), "{clusters:?}");
}
