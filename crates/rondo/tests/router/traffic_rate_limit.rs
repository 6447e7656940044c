//! The `rate_limit` filter through real clients, on the own HTTP/1.1 path and on HTTP/2 (h2c,
//! hyper's path): a burst sent as fast as the client can over a few keep-alive connections is cut to
//! what the bucket allows, keys keep clients apart, and the 429 says when to come back.

use std::process::Command;
use std::time::{Duration, Instant};

use http::Version;

use super::recorder::Recorder;
use super::support::{get_with, h2_client, router};
use super::traffic::curl;

fn config(m: &Recorder, filter: &str) -> String {
    format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
name = "limited"
listener = "web"
cluster = "c"
filters = [ {{ rate_limit = {filter} }} ]

[cluster.c]
members = [ {{ name = "{}", address = "{}" }} ]
"#,
        m.name, m.addr
    )
}

/// `n` GETs of `url` over HTTP/1.1 with curl `--parallel`, as fast as it can over at most 8
/// keep-alive connections: each response's status, and how long the whole burst took.
fn h1_burst(url: &str, client: &str, n: usize) -> (Vec<u16>, Duration) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--no-progress-meter", "--max-time", "30", "--http1.1", "--parallel"]);
    cmd.args(["--parallel-max", "8", "-o", "/dev/null", "-w", "%{http_code}\n"]);
    cmd.args(["-H", &format!("x-client: {client}")]);
    cmd.arg(format!("{url}/burst/[1-{n}]"));
    let start = Instant::now();
    let out = cmd.output().expect("curl runs");
    let elapsed = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let statuses = text.lines().map(|l| l.trim().parse().expect("a status")).collect();
    (statuses, elapsed)
}

/// The same over h2c, as 8 streams at a time on one connection of hyper's client (curl
/// 7.88's prior knowledge cannot reuse a connection: curl issue 10634, fixed in 8.0).
async fn h2_burst(url: &str, client: &str, n: usize) -> (Vec<u16>, Duration) {
    let c = h2_client();
    let start = Instant::now();
    let lanes: Vec<_> = (0..8)
        .map(|lane| {
            let (c, url, client) = (c.clone(), url.to_owned(), client.to_owned());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for i in (lane..n).step_by(8) {
                    let target = format!("{url}/burst/{i}");
                    let reply = get_with(&c, &target, &[("x-client", &client)]).await;
                    assert_eq!(reply.version, Version::HTTP_2);
                    statuses.push(reply.status.as_u16());
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for lane in lanes {
        statuses.extend(lane.await.expect("a lane"));
    }
    (statuses, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_the_limit_is_cut_to_the_bucket_on_both_protocols() {
    let m = Recorder::spawn("m1");
    let filter = r#"{ key = "header:x-client", rate = "100/s", burst = 200 }"#;
    let r = router(&config(&m, filter)).await;
    let url = format!("http://127.0.0.1:{}", r.addr("web").port());
    let mut forwarded = 0;
    for h2 in [false, true] {
        // Each protocol's burst has a bucket of its own (its own `x-client`), full at first.
        let client = if h2 { "h2" } else { "h1" };
        let (statuses, elapsed) = if h2 {
            h2_burst(&url, client, 1000).await
        } else {
            let u = url.clone();
            tokio::task::spawn_blocking(move || h1_burst(&u, "h1", 1000)).await.unwrap()
        };
        assert_eq!(statuses.len(), 1000, "{client}: every request answered");
        let admitted = statuses.iter().filter(|s| **s == 200).count();
        let limited = statuses.iter().filter(|s| **s == 429).count();
        assert_eq!(admitted + limited, 1000, "{client}: only 200 and 429: {statuses:?}");
        eprintln!("{client}: {admitted} admitted, {limited} limited in {elapsed:?}");
        // The bucket holds 200 and gains 100 a second: over the burst's whole time (measured
        // around curl, so at least the router's window), no more than that got through, with
        // one token of slack for rounding the measured time.
        let bound = 200.0 + 100.0 * elapsed.as_secs_f64() + 1.0;
        assert!(
            (admitted as f64) <= bound,
            "{client}: {admitted} admitted in {elapsed:?}, the bucket allows {bound:.0}"
        );
        assert!(admitted >= 200, "{client}: a full bucket admits its burst, got {admitted}");
        assert!(limited > 0, "{client}: 1000 requests in {elapsed:?} were never limited");
        // The limited ones never reached the member.
        forwarded += admitted;
        let seen = m.seen();
        let mine = seen.iter().filter(|s| s.headers["x-client"] == client).count();
        assert_eq!(mine, admitted, "{client}: the member saw exactly the admitted requests");
    }
    assert_eq!(m.seen().len(), forwarded);
    let metrics = r.live.metrics.render(&r.live.load());
    let line = metrics.lines().find(|l| l.starts_with("rondo_filter_rate_limited_total")).unwrap();
    assert_eq!(
        line,
        format!(
            "rondo_filter_rate_limited_total{{listener=\"web\",route=\"limited\"}} {}",
            2000 - forwarded
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_keep_clients_apart_and_the_429_says_when_to_come_back() {
    let m = Recorder::spawn("m1");
    // Three an hour: no token comes back while the test runs.
    let filter = r#"{ key = "header:x-api-key", rate = "3/h", burst = 3 }"#;
    let r = router(&config(&m, filter)).await;
    let url = format!("http://localhost:{}/a", r.addr("web").port());
    for h2 in [false, true] {
        let (alice, bob) = if h2 {
            ("x-api-key: alice2", "x-api-key: bob2")
        } else {
            ("x-api-key: alice", "x-api-key: bob")
        };
        for left in [2, 1, 0] {
            let got = curl(h2, &url, &[alice]);
            assert_eq!(got.status, 200, "h2={h2}: {}", got.body);
            assert_eq!(
                got.header("ratelimit-policy"),
                Some("\"header:x-api-key\";q=3;w=3600;rondo-burst=3")
            );
            let state = got.header("ratelimit").expect("RateLimit on an admitted response");
            assert!(state.starts_with(&format!("\"header:x-api-key\";r={left};t=")), "{state}");
        }
        let got = curl(h2, &url, &[alice]);
        assert_eq!(got.status, 429, "h2={h2}: the fourth of three an hour");
        // The next token is 20 minutes away (one every 1200 s, the first taken just now).
        let retry: u64 = got.header("retry-after").expect("Retry-After").parse().unwrap();
        assert!((1190..=1200).contains(&retry), "Retry-After: {retry}");
        assert_eq!(
            got.header("ratelimit-policy"),
            Some("\"header:x-api-key\";q=3;w=3600;rondo-burst=3")
        );
        let state = got.header("ratelimit").expect("RateLimit on the 429");
        let t: u64 =
            state.strip_prefix("\"header:x-api-key\";r=0;t=").expect(state).parse().unwrap();
        assert_eq!(t, retry, "{state}: the next token is when to come back");
        assert!(got.body.contains("too many requests"), "{}", got.body);
        // Another key has its own, full, bucket.
        let got = curl(h2, &url, &[bob]);
        assert_eq!(got.status, 200, "h2={h2}: bob is not alice");
        assert_eq!(got.header("ratelimit"), Some("\"header:x-api-key\";r=2;t=1200"));
    }
    assert_eq!(m.seen().len(), 8, "three of alice's and one of bob's, twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_filters_buckets_and_a_changed_one_starts_afresh() {
    let m = Recorder::spawn("m1");
    let filter = r#"{ key = "header:x-api-key", rate = "3/h", burst = 2 }"#;
    let r = router(&config(&m, filter)).await;
    let url = format!("http://localhost:{}/a", r.addr("web").port());
    let key = ["x-api-key: k"];
    let statuses = |h2| (0..3).map(|_| curl(h2, &url, &key).status).collect::<Vec<_>>();
    assert_eq!(statuses(false), [200, 200, 429]);
    // A new view (another route added, so every route's chain is compiled anew) with the
    // same filter: its bucket is still empty, on either protocol.
    let reload = |text: String, id| {
        let mut c = rondo_config::parse_str(&text, std::path::Path::new("r.toml"), id).unwrap();
        c.view.id = id;
        r.live.apply(c.view);
    };
    let other = "\n[[route]]\nname = \"other\"\nlistener = \"web\"\ncluster = \"c\"\nmatch = { path_prefix = \"/other/\" }\n";
    reload(format!("{}{other}", config(&m, filter)), 2);
    assert_eq!(curl(false, &url, &key).status, 429, "the bucket outlived the reload");
    assert_eq!(curl(true, &url, &key).status, 429, "h2c: the same bucket");
    // A changed filter starts with full buckets.
    let changed = r#"{ key = "header:x-api-key", rate = "3/h", burst = 3 }"#;
    reload(config(&m, changed), 3);
    assert_eq!(statuses(true), [200, 200, 200]);
    assert_eq!(curl(false, &url, &key).status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listeners_limit_is_shared_by_its_routes_and_keeps_at_most_max_keys_buckets() {
    let m = Recorder::spawn("m1");
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"
filters = [ {{ rate_limit = {{ key = "header:x-api-key", rate = "3/h", burst = 1, max_keys = 2 }} }} ]

[[route]]
name = "a"
listener = "web"
cluster = "c"
match = {{ path_prefix = "/a/" }}

[[route]]
name = "b"
listener = "web"
cluster = "c"

[cluster.c]
members = [ {{ name = "{}", address = "{}" }} ]
"#,
        m.name, m.addr
    );
    let r = router(&config).await;
    let port = r.addr("web").port();
    let (a, b) = (format!("http://localhost:{port}/a/x"), format!("http://localhost:{port}/b"));
    assert_eq!(curl(false, &a, &["x-api-key: one"]).status, 200);
    // Route `b` shares the listener's bucket of key `one`.
    assert_eq!(curl(true, &b, &["x-api-key: one"]).status, 429);
    assert_eq!(curl(false, &b, &["x-api-key: two"]).status, 200);
    // A third key drops the least recently used bucket (`one`'s), which starts full again.
    assert_eq!(curl(false, &a, &["x-api-key: three"]).status, 200);
    assert_eq!(curl(true, &a, &["x-api-key: two"]).status, 429);
    assert_eq!(curl(false, &a, &["x-api-key: one"]).status, 200);
    let metrics = r.live.metrics.render(&r.live.load());
    let lines: Vec<_> =
        metrics.lines().filter(|l| l.starts_with("rondo_filter_rate_limit")).collect();
    assert!(
        lines.contains(&"rondo_filter_rate_limited_total{listener=\"web\",route=\"b\"} 1"),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"rondo_filter_rate_limited_total{listener=\"web\",route=\"a\"} 1"),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"rondo_filter_rate_limit_evictions_total{listener=\"web\",route=\"\"} 2"),
        "{lines:?}"
    );
}
