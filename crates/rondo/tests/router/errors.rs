//! Every error the router answers itself, its status and its body; and the failures it hides
//! by trying another member.

use std::time::{Duration, Instant};

use http::StatusCode;
use http::header::RETRY_AFTER;

use super::support::{
    self, count, dead_members, entry, get, member_list, members, members_of, router, served_by,
    spawn_member, web_config,
};

/// One listener `web`, one route `main` (with `route` extra keys) to cluster `c`.
fn config(route: &str, cluster: &str) -> String {
    web_config("", route, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_is_404_naming_the_listener() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&config("match = { path_prefix = \"/api\" }", &member_list(&ms))).await;
    let c = support::client();
    let ok = get(&c, &r.url("web", "/api/x")).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    let reply = get(&c, &r.url("web", "/elsewhere")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert!(reply.body.contains("listener web"), "{}", reply.body);
    assert!(reply.body.contains("no route"), "{}", reply.body);
    assert!(reply.body.contains("/elsewhere"), "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_refusing_is_502_without_addresses() {
    let r = router(&config("", &dead_members("d", 2))).await;
    let reply = get(&support::client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.body);
    for word in ["route main", "cluster c", "attempts", "d1", "d2"] {
        assert!(reply.body.contains(word), "no {word:?} in {}", reply.body);
    }
    assert!(!reply.body.contains("127.0.0.1"), "address leaked: {}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_members_disabled_is_503_with_retry_after() {
    let ms = members(2, Duration::ZERO).await;
    let r = router(&config("", &support::member_list_with(&ms, "state = \"disabled\""))).await;
    let reply = get(&support::client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
    assert!(reply.headers.contains_key(RETRY_AFTER), "{:?}", reply.headers);
    assert!(reply.body.contains("route main, cluster c"), "{}", reply.body);
    assert!(reply.body.contains("no eligible member"), "{}", reply.body);
    assert!(!reply.body.contains("127.0.0.1"), "address leaked: {}", reply.body);
    assert_eq!(
        ms.iter().map(|m| m.served.load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_members_down_by_health_check_is_503_with_retry_after() {
    // Panic mode off, or a cluster with no healthy member would be tried anyway (502).
    let cluster = format!(
        "panic_threshold_percent = 0\nhealth = {{ interval_ms = 50, fall = 1 }}\n{}",
        dead_members("d", 2)
    );
    let r = router(&config("", &cluster)).await;
    let c = support::client();
    let url = r.url("web", "/");
    // Members start healthy: until the first probe round they are tried (and refuse).
    let reply =
        support::get_until(&c, &url, |reply| reply.status != StatusCode::BAD_GATEWAY, "still 502")
            .await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
    assert_eq!(reply.headers.get(RETRY_AFTER).map(|v| v.as_bytes()), Some(&b"1"[..]));
    assert!(reply.body.contains("route main"), "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_member_is_504_at_the_route_timeout() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&config("request_timeout_ms = 200", &member_list(&ms))).await;
    let started = Instant::now();
    let reply = get(&support::client(), &r.url("web", "/slow/2000")).await;
    let took = started.elapsed();
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{}", reply.body);
    assert!(reply.body.contains("route main, cluster c"), "{}", reply.body);
    assert!(reply.body.contains("too slow"), "{}", reply.body);
    // The member answers after 2 s; the router must not have waited for it.
    assert!(took < Duration::from_millis(1500), "504 after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_try_timeout_retries_on_the_next_member() {
    let slow = spawn_member("m1", 1000).await;
    let fast = spawn_member("m2", 0).await;
    let ms = [slow, fast];
    let cluster = format!(
        "algorithm = \"round-robin\"\nretry = {{ attempts = 2, per_try_timeout_ms = 150 }}\n{}",
        member_list(&ms)
    );
    let r = router(&config("", &cluster)).await;
    // Round robin tries m1 first; it times out after 150 ms and m2 answers (m1 would answer
    // only after 1 s, and then with its own name).
    let reply = get(&support::client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body.trim(), "m2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_5xx_is_passed_through_unchanged() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&config("", &member_list(&ms))).await;
    let reply = get(&support::client(), &r.url("web", "/status/500")).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.body, "m1\n", "the member's body, not rondo's");
    assert_eq!(reply.headers.get("x-member").map(|v| v.as_bytes()), Some(&b"m1"[..]));
    assert_eq!(ms[0].served.load(std::sync::atomic::Ordering::Relaxed), 1, "not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_is_400_and_closes_the_connection() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&config("", &member_list(&ms))).await;
    let (answer, closed) =
        support::raw_until_closed(r.addr("web"), b"GARBAGE\r\n\r\n", Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(closed, "connection left open after {answer:?}");
    let names = served_by(&r.url("web", "/"), 3).await;
    assert_eq!(count(&names, "m1"), 3);
    assert_eq!(ms[0].served.load(std::sync::atomic::Ordering::Relaxed), 3, "garbage reached m1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failure_is_retried_on_another_member() {
    let m1 = spawn_member("m1", 0).await;
    let m3 = spawn_member("m3", 0).await;
    let list = members_of([
        entry(&m1, ""),
        support::member_entry("m2", support::dead_addr(), ""),
        entry(&m3, ""),
    ]);
    let r = router(&config("", &format!("algorithm = \"round-robin\"\n{list}"))).await;
    // `served_by` fails on any status but 200.
    let names = served_by(&r.url("web", "/"), 30).await;
    assert_eq!(count(&names, "m1") + count(&names, "m3"), 30, "{names:?}");
    assert!(count(&names, "m1") > 0 && count(&names, "m3") > 0, "{names:?}");
}

/// Members that accept a connection and close it at once: every try fails after sending.
async fn closing_members(
    n: usize,
) -> (Vec<std::net::SocketAddr>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let accepted = Arc::new(AtomicUsize::new(0));
    let mut addrs = Vec::new();
    for _ in 0..n {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        addrs.push(l.local_addr().expect("addr"));
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                drop(s);
            }
        });
    }
    (addrs, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_on_a_failing_cluster_stay_within_the_retry_budget() {
    let (addrs, accepted) = closing_members(3).await;
    let entries =
        addrs.iter().enumerate().map(|(i, a)| support::member_entry(&format!("x{i}"), a, ""));
    // Up to 3 tries per request, but retries may add only 20 % plus 1 per second.
    let cluster = format!(
        "{}\nretry = {{ attempts = 3, budget_percent = 20, budget_min_per_sec = 1 }}\noutlier = {{ consecutive_failures = 0 }}",
        members_of(entries)
    );
    let r = router(&config("", &cluster)).await;
    let c = support::client();
    let requests = 200;
    let started = Instant::now();
    for _ in 0..requests {
        let reply = get(&c, &r.url("web", "/")).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.body);
    }
    let seconds = started.elapsed().as_secs_f64().ceil() as usize;
    let tries = accepted.load(std::sync::atomic::Ordering::SeqCst);
    // Without a budget this would be 600 tries.
    let allowed = requests + requests / 5 + seconds + 1;
    assert!(tries <= allowed, "{tries} tries for {requests} requests (allowed {allowed})");
    assert!(tries > requests, "some retries are allowed: {tries}");
    let reply = get(&c, &r.url("web", "/")).await;
    assert!(reply.body.contains("retry budget exhausted"), "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_member_refuses_the_connection_goes_to_another_member() {
    use http_body_util::{BodyExt, Full};
    let m1 = spawn_member("m1", 0).await;
    let list = members_of([support::member_entry("m0", support::dead_addr(), ""), entry(&m1, "")]);
    // Round robin: every other POST first meets the dead member; nothing was sent, so its body
    // (still untouched) goes to m1 instead, whatever the method. Outlier ejection off, so the
    // dead member keeps being tried.
    let cluster =
        format!("algorithm = \"round-robin\"\n{list}\noutlier = {{ consecutive_failures = 0 }}");
    let r = router(&config("", &cluster)).await;
    let c = support::client_of::<Full<bytes::Bytes>>(false);
    for i in 0..10 {
        let body = format!("order-{i}");
        let req = http::Request::post(r.url("web", "/echo"))
            .body(Full::new(bytes::Bytes::from(body.clone())))
            .expect("request");
        let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
            .await
            .expect("in time")
            .expect("response");
        assert_eq!(resp.status(), StatusCode::OK, "post {i}");
        let got = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(got, body.as_bytes(), "post {i} echoed by m1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_does_not_leave_a_request_counted_in_flight() {
    let m1 = spawn_member("m1", 0).await;
    let r = router(&config("", &member_list(std::slice::from_ref(&m1)))).await;
    let in_flight = || r.live.load().clusters["c"].with(|b| b.states()[0].load.in_flight);
    let c = support::client();
    // The member takes 10 s; the client gives up after 200 ms and drops its connection.
    let url = r.url("web", "/slow/10000");
    let gave_up = tokio::time::timeout(Duration::from_millis(200), get(&c, &url)).await;
    assert!(gave_up.is_err(), "the client should have given up");
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(3);
    while in_flight() != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(in_flight(), 0, "the abandoned request must not stay counted");
}
