//! `/metrics` on the admin API: an in-process router and admin API, some requests (answered,
//! answered 500, retried after a member that refuses connections), then a scrape parsed line by
//! line.

#[path = "router/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rondo_config::{AdminSpec, AdminToken};
use rondo_core::Actor;
use rondo_runtime::{Reloader, clock};
use support::*;

const TOKEN: &str = "metrics-token";

/// GET `url` with `token`: status, content type and body.
async fn scrape(url: &str, token: Option<&str>) -> (StatusCode, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .expect("admin API answers");
    let status = resp.status();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, ctype, String::from_utf8_lossy(&body).into_owned())
}

/// One sample line: name, labels, value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// The samples of a text exposition (label values here contain no `,`, `"` or spaces).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("`series value`");
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {l}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect("closing brace");
                    let labels = inner
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').expect("label=value");
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name, labels)
                }
            };
            Sample { name: name.to_owned(), labels, value }
        })
        .collect()
}

/// The sum of the samples called `name` that carry every label of `labels`.
fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    matching(samples, name, labels).map(|s| s.value).sum()
}

/// How many samples called `name` carry every label of `labels`.
fn count(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> usize {
    matching(samples, name, labels).count()
}

fn matching<'a>(
    samples: &'a [Sample],
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = &'a Sample> {
    samples.iter().filter(move |s| {
        s.name == name
            && labels.iter().all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_responses_retries_and_state() {
    let ms = members(2, Duration::ZERO).await;
    let dead = member_entry("dead", dead_addr(), "");
    let cluster = format!(
        "algorithm = \"round-robin\"\nretry = {{ attempts = 3 }}\n\
         outlier = {{ consecutive_failures = 0 }}\n{}",
        members_of([entry(&ms[0], ""), entry(&ms[1], ""), dead])
    );
    let config_text = one_cluster(&cluster);
    let dir = std::env::temp_dir().join(format!("rondo-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rondo.toml");
    std::fs::write(&path, &config_text).unwrap();
    let config = rondo_config::load_file(&path, 1).expect("valid config");

    let r = router(&config_text).await;
    let spec = AdminSpec { listen: any_port(), token: Some(AdminToken::Inline(TOKEN.into())) };
    let admin = rondo_admin::start(&spec, r.live.clone()).await.expect("admin starts");
    let url = format!("http://{}/metrics", admin.addr);

    // Without the token: 401, like every other call.
    let (status, _, _) = scrape(&url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = scrape(&url, Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // 9 answered requests and 3 answered 500; round robin sends about a third of the tries to
    // the dead member, whose refusal is retried on the next member.
    let client = support::client();
    for _ in 0..9 {
        let reply = get(&client, &r.url("web", "/")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }
    for _ in 0..3 {
        let reply = get(&client, &r.url("web", "/status/500")).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", reply.body);
    }

    // A rejected and an accepted reload of the config file.
    let reloader = Arc::new(Reloader::new(&path, r.live.clone(), &config));
    std::fs::write(&path, "[cluster.c]\nalgoritm = \"x\"\n").unwrap();
    assert!(reloader.reload("test").is_err());
    std::fs::write(&path, &config_text).unwrap();
    assert_eq!(reloader.reload("test").expect("valid"), 2);
    let _ = std::fs::remove_dir_all(&dir);

    // The dead member found down (as a health check would).
    let rt = r.live.load().clusters["c"].clone();
    let dead_idx = rt.spec.members.iter().position(|m| m.name == "dead").unwrap();
    rt.with(|b| b.set_health(dead_idx, false, Actor::HealthCheck, clock::now()));

    // In-flight counts end when the last body frame passes: wait for them to settle.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (ctype, text) = loop {
        let (status, ctype, text) = scrape(&url, Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let s = parse(&text);
        if sum(&s, "rondo_member_in_flight", &[]) == 0.0 || Instant::now() > deadline {
            break (ctype, text);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let s = parse(&text);
    let main = ("route", "main");
    let c = ("cluster", "c");

    // Responses by status class and member.
    let req = "rondo_requests_total";
    assert_eq!(sum(&s, req, &[main, c, ("class", "2xx")]), 9.0, "{text}");
    assert_eq!(sum(&s, req, &[main, c, ("class", "5xx")]), 3.0, "{text}");
    assert_eq!(sum(&s, req, &[main, c]), 12.0, "{text}");
    let m1 = sum(&s, req, &[("member", "m1")]);
    let m2 = sum(&s, req, &[("member", "m2")]);
    assert_eq!(m1 + m2, 12.0, "{text}");
    assert!(m1 >= 4.0 && m2 >= 4.0, "both members answered: {text}");
    assert_eq!(count(&s, req, &[("member", "dead")]), 0, "the dead member answered nothing");

    // Latency histograms: one observation per response, per member.
    let hist = "rondo_request_duration_seconds";
    assert_eq!(sum(&s, &format!("{hist}_count"), &[main, c]), 12.0, "{text}");
    assert_eq!(sum(&s, &format!("{hist}_count"), &[("member", "m1")]), m1, "{text}");
    assert_eq!(sum(&s, &format!("{hist}_bucket"), &[("member", "m2"), ("le", "+Inf")]), m2);
    assert!(sum(&s, &format!("{hist}_sum"), &[main]) > 0.0, "{text}");

    // Retries after the dead member's refusals; no budget was exhausted.
    assert!(sum(&s, "rondo_retries_total", &[main, c]) >= 3.0, "{text}");
    assert_eq!(sum(&s, "rondo_retry_budget_exhausted_total", &[]), 0.0, "{text}");

    // State at rest: nothing in flight, not ejected; the dead member is down.
    for (m, healthy) in [("m1", 1.0), ("m2", 1.0), ("dead", 0.0)] {
        let l = [c, ("member", m)];
        assert_eq!(count(&s, "rondo_member_in_flight", &l), 1, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_in_flight", &l), 0.0, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_sessions", &l), 0.0, "{m}: {text}");
        assert_eq!(count(&s, "rondo_member_healthy", &l), 1, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_healthy", &l), healthy, "{m}: {text}");
        assert_eq!(sum(&s, "rondo_member_ejected", &l), 0.0, "{m}: {text}");
    }
    assert_eq!(count(&s, "rondo_member_agent_heartbeat_age_seconds", &[]), 0, "no agent");

    // The view and the reloads.
    assert_eq!(sum(&s, "rondo_view_id", &[]), 2.0, "{text}");
    let reloads = "rondo_config_reloads_total";
    assert_eq!(sum(&s, reloads, &[("result", "accepted")]), 1.0, "{text}");
    assert_eq!(sum(&s, reloads, &[("result", "rejected")]), 1.0, "{text}");
    assert_eq!(sum(&s, "rondo_ejections_total", &[c]), 0.0, "{text}");
    assert_eq!(count(&s, "rondo_ejections_total", &[c]), 1, "{text}");
    assert_eq!(count(&s, "rondo_ejection_returns_total", &[c]), 1, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_router_exposes_view_and_reload_counters_at_zero() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&one_cluster(&member_list(&ms))).await;
    let spec = AdminSpec { listen: any_port(), token: Some(AdminToken::Inline(TOKEN.into())) };
    let admin = rondo_admin::start(&spec, r.live.clone()).await.expect("admin starts");
    let (status, _, text) = scrape(&format!("http://{}/metrics", admin.addr), Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let s = parse(&text);
    assert_eq!(sum(&s, "rondo_view_id", &[]), 1.0, "{text}");
    assert_eq!(count(&s, "rondo_config_reloads_total", &[]), 2, "{text}");
    assert_eq!(sum(&s, "rondo_config_reloads_total", &[]), 0.0, "{text}");
    assert_eq!(count(&s, "rondo_requests_total", &[]), 0, "{text}");
    assert_eq!(sum(&s, "rondo_member_healthy", &[("member", "m1")]), 1.0, "{text}");
}
