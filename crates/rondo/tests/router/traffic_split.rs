//! Weighted clusters (`clusters`, docs/router.md "Weighted clusters"): a 95/5 canary split
//! over 2,000 requests on HTTP/1.1 (curl, the own path) and h2c (hyper's path), and a
//! sticky session that stays on the cluster it was first sent to.

use std::process::Command;

use super::recorder::Recorder;
use super::support::{TestRouter, get_with, h2_client, router};
use super::traffic::curl;

/// `n` GETs of `url` one after the other on one connection, each with `headers`: the bodies,
/// one line each (the recorders answer `<member> <id>\n`). HTTP/1.1 from one curl; h2c from
/// hyper's client, because curl 7.88 fails every request after the first on an h2c
/// prior-knowledge connection it reuses ("Error in the HTTP2 framing layer", against any
/// server).
pub(crate) async fn send_many(h2: bool, url: &str, n: usize, headers: &[&str]) -> Vec<String> {
    if h2 {
        let client = h2_client();
        let pairs: Vec<(&str, &str)> = headers.iter().filter_map(|h| h.split_once(": ")).collect();
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let reply = get_with(&client, url, &pairs).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            out.push(reply.body.trim_end().to_owned());
        }
        return out;
    }
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "--http1.1"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    cmd.args(std::iter::repeat_n(url, n));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().expect("curl runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "curl failed: {}", err.lines().next().unwrap_or(""));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.to_owned()).collect()
}

/// The member of each answer line.
fn members(lines: &[String]) -> Vec<&str> {
    lines.iter().map(|l| l.split(' ').next().unwrap_or("")).collect()
}

fn split_config(v1: &Recorder, v2: &Recorder, weights: (u32, u32), cluster_keys: &str) -> String {
    format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
name = "shop"
listener = "web"
match = {{ path_prefix = "/shop/" }}
clusters = [ {{ cluster = "shop-v1", weight = {} }}, {{ cluster = "shop-v2", weight = {} }} ]

[cluster.shop-v1]
{cluster_keys}
members = [ {} ]

[cluster.shop-v2]
{cluster_keys}
members = [ {} ]
"#,
        weights.0,
        weights.1,
        v1.entry(),
        v2.entry()
    )
}

async fn start(config: &str) -> (TestRouter, u16) {
    let r = router(config).await;
    let port = r.addr("web").port();
    (r, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_95_5_split_sends_about_5_percent_to_the_canary_on_both_protocols() {
    let (v1, v2) = (Recorder::spawn("v1"), Recorder::spawn("v2"));
    let (_r, port) = start(&split_config(&v1, &v2, (95, 5), "")).await;
    const N: usize = 2_000;
    for h2 in [false, true] {
        let before = (v1.seen().len(), v2.seen().len());
        let url = format!("http://127.0.0.1:{port}/shop/item");
        let lines = send_many(h2, &url, N, &[]).await;
        assert_eq!(lines.len(), N, "h2={h2}: every request answered");
        let who = members(&lines);
        assert!(who.iter().all(|m| *m == "v1" || *m == "v2"), "h2={h2}: {:?}", &who[..10]);
        let canary = who.iter().filter(|m| **m == "v2").count();
        // Binomial(2000, 0.05): mean 100, sd 9.75. The bound 70..=130 (3.5 % to 6.5 %) fails
        // with probability P(X <= 69) + P(X >= 131) = 0.00051 + 0.00131 = 0.0018 per protocol
        // (exact binomial sums), 0.0036 for the test's two runs.
        assert!((70..=130).contains(&canary), "h2={h2}: v2 got {canary} of {N}");
        // The members agree with the client.
        assert_eq!(v2.seen().len() - before.1, canary, "h2={h2}");
        assert_eq!(v1.seen().len() - before.0, N - canary, "h2={h2}");
    }
    // No split cookie without sessions: nothing to keep.
    let url = format!("http://127.0.0.1:{port}/shop/item");
    let got = tokio::task::spawn_blocking(move || curl(false, &url, &[])).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.header("set-cookie"), None, "{:?}", got.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_status_shows_the_split() {
    let (v1, v2) = (Recorder::spawn("v1"), Recorder::spawn("v2"));
    let (r, _) = start(&split_config(&v1, &v2, (95, 5), "")).await;
    let spec = rondo_config::AdminSpec {
        listen: super::support::any_port(),
        token: Some(rondo_config::AdminToken::Inline("t".into())),
        tls: None,
        probes: Default::default(),
    };
    let admin = rondo_admin::start(&spec, rondo_admin::AdminParts::of(&r.live))
        .await
        .expect("admin starts");
    let url = format!("http://{}/api/v1/status", admin.addr);
    let got = tokio::task::spawn_blocking(move || curl(false, &url, &["authorization: Bearer t"]))
        .await
        .unwrap();
    assert_eq!(got.status, 200, "{}", got.body);
    let v: serde_json::Value = serde_json::from_str(&got.body).expect("json");
    let route = &v["routes"][0];
    assert_eq!(route["cluster"], "shop-v1", "{route}");
    let want = serde_json::json!([
        { "cluster": "shop-v1", "weight": 95 },
        { "cluster": "shop-v2", "weight": 5 }
    ]);
    assert_eq!(route["clusters"], want, "{route}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_on_the_cluster_it_was_first_sent_to() {
    let (v1, v2) = (Recorder::spawn("v1"), Recorder::spawn("v2"));
    let config = split_config(&v1, &v2, (50, 50), "granularity = \"session\"");
    let (_r, port) = start(&config).await;
    let url = format!("http://127.0.0.1:{port}/shop/cart");
    for h2 in [false, true] {
        // Each new session is drawn; with 50/50, ten sessions reach both clusters (but for a
        // chance of 2 in 1,024), and each stays where it began.
        let mut began = Vec::new();
        for _ in 0..10 {
            let u = url.clone();
            let first = tokio::task::spawn_blocking(move || curl(h2, &u, &[])).await.unwrap();
            assert_eq!(first.status, 200, "h2={h2}");
            let cluster = first.body.split(' ').next().unwrap().to_owned();
            let cookies: Vec<String> = first
                .headers
                .iter()
                .filter(|(n, _)| n == "set-cookie")
                .map(|(_, v)| v.split(';').next().unwrap().to_owned())
                .collect();
            let split = format!("rondo-split-shop=shop-{cluster}");
            assert!(cookies.contains(&split), "h2={h2}: {cookies:?}");
            let cookie = format!("cookie: {}", cookies.join("; "));
            let later = send_many(h2, &url, 20, &[cookie.as_str()]).await;
            assert_eq!(members(&later), vec![cluster.as_str(); 20], "h2={h2}: the session moved");
            began.push(cluster);
        }
        began.sort();
        began.dedup();
        assert_eq!(began, ["v1", "v2"], "h2={h2}: new sessions are drawn by weight");
    }
    // A cookie naming a cluster outside the split is drawn anew (and told the new one).
    let u = url.clone();
    let got =
        tokio::task::spawn_blocking(move || curl(false, &u, &["cookie: rondo-split-shop=nope"]))
            .await
            .unwrap();
    let told = got
        .headers
        .iter()
        .any(|(n, v)| n == "set-cookie" && v.starts_with("rondo-split-shop=shop-v"));
    assert!(told, "{:?}", got.headers);
}
