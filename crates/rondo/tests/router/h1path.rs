//! Which path serves which request: the router's own HTTP/1 path for plain HTTP/1.1, hyper's
//! for what it declines (each hand-off counted in `rondo_http1_handoffs_total` by reason), and a
//! connection handed over mid-way keeps being served.

use std::time::Duration;

use super::support::{self, RawConn, TestRouter};

/// The listener `web`'s hand-off counters, in `ListenerMetrics::HANDOFF_REASONS` order.
fn handoffs(r: &TestRouter) -> Vec<u64> {
    r.live.metrics.listener("web").handoffs.iter().map(|c| c.get()).collect()
}

async fn setup(cluster_extra: &str) -> (TestRouter, Vec<rondo::member::Member>) {
    let ms = support::members(1, Duration::ZERO).await;
    let cluster = format!("{cluster_extra}\n{}", support::member_list(&ms));
    (support::router(&support::one_cluster(&cluster)).await, ms)
}

/// Reads a response, skipping an interim `100 Continue`.
async fn final_response(conn: &mut RawConn) -> support::RawResponse {
    loop {
        let resp = support::read_response(conn).await.expect("response");
        if resp.status != 100 {
            return resp;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_and_pipelined_requests_stay_on_the_own_path() {
    let (r, _ms) = setup("").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    // Three requests in one write, one with a body: three answers, in order, on one connection.
    let one = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
    let post = "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
    let chunked =
        "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    support::raw_send(&mut conn, format!("{one}{post}{chunked}").as_bytes()).await;
    for _ in 0..3 {
        let resp = support::read_response(&mut conn).await.expect("response");
        assert_eq!(resp.status, 200, "{}", resp.text());
        let via = resp.header("via").expect("via");
        assert!(via.contains(rondo_proxy::headers::via_id()), "{via}");
    }
    // And again later on the same connection.
    let resp = support::raw_request(&mut conn, one).await;
    assert_eq!(resp.status, 200);
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_declined_request_goes_to_hyper_with_its_connection() {
    let (r, _ms) = setup("").await;
    let cases: [(&str, &str, usize); 4] = [
        ("HTTP/1.0", "GET / HTTP/1.0\r\nHost: x\r\n\r\n", 1),
        ("absolute-form", "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", 2),
        ("Upgrade", "GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: demo\r\n\r\n", 3),
        (
            "Expect",
            "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
            4,
        ),
    ];
    for (what, request, reason) in cases {
        let before = handoffs(&r);
        let mut conn = support::raw_connect(r.addr("web")).await;
        // A first request on the own path, then the declined one on the same connection.
        let first = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(first.status, 200, "{what}: first request");
        support::raw_send(&mut conn, request.as_bytes()).await;
        if what == "HTTP/1.0" {
            // Answered in HTTP/1.0, and closed (no keep-alive asked for).
            let (bytes, closed) =
                support::read_until_closed(&mut conn, Duration::from_secs(10)).await;
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.starts_with("HTTP/1.0 200"), "{what}: {text}");
            assert!(closed, "{what}: closed after the response");
        } else {
            let resp = final_response(&mut conn).await;
            assert_eq!(resp.status, 200, "{what}: {}", resp.text());
        }
        let after = handoffs(&r);
        assert_eq!(after[reason], before[reason] + 1, "{what}: counted as {reason}: {after:?}");
        if what != "HTTP/1.0" {
            // hyper now serves the rest of the connection.
            let again = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert_eq!(again.status, 200, "{what}: after the hand-off");
        }
    }
    // HTTP/2 prior knowledge (h2c) is recognised by its preface.
    let reply = support::get(&support::h2_client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, 200);
    assert_eq!(handoffs(&r)[0], 1, "h2c counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_http2_members_goes_to_hyper() {
    let (r, _ms) = setup("upstream_protocol = \"http2\"").await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(handoffs(&r)[5], 1, "counted as upstream");
}
