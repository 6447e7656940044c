//! Hostile or careless traffic that the HTTP parser lets through and the request path must
//! refuse (issue 12): Host rules of RFC 9112 section 3.2, forwarding loops, members that frame or
//! label their responses wrongly, and how much an error tells a client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::support;

const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A member that answers every request head on a connection with `response`, as given (bytes
/// on the wire, right or wrong), and counts the request heads it read.
struct RawMember {
    addr: SocketAddr,
    heads: Arc<AtomicUsize>,
}

async fn raw_member(response: &'static [u8]) -> RawMember {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let heads = Arc::new(AtomicUsize::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                // At most 64 requests per connection and 64 KiB of head each.
                for _ in 0..64 {
                    if support::next_head(&mut s, &mut buf).await.is_none() {
                        return;
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    if s.write_all(response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    RawMember { addr, heads }
}

#[tokio::test]
async fn a_request_without_host_or_with_two_is_refused_before_any_member() {
    let ms = [support::spawn_member("m1", 0).await];
    let r = support::router(&support::one_cluster(&support::member_list(&ms))).await;
    for (request, why) in [
        ("GET / HTTP/1.1\r\n\r\n", "no Host header"),
        ("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", "2 Host headers"),
    ] {
        let (out, closed) =
            support::raw_until_closed(r.addr("web"), request.as_bytes(), CLOSE_WAIT).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{request:?}: {out}");
        assert!(out.contains(why), "{request:?}: {out}");
        assert!(closed, "{request:?}: connection kept open after a 400");
    }
    // HTTP/1.0 has no Host requirement: served, and the member (spoken to in HTTP/1.1) gets an
    // empty Host, not its own address.
    let (out, _) =
        support::raw_until_closed(r.addr("web"), b"GET /headers HTTP/1.0\r\n\r\n", CLOSE_WAIT)
            .await;
    assert!(out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\nhost: \n"), "a Host was invented: {out}");
}

#[tokio::test]
async fn an_absolute_form_target_is_routed_by_its_authority_and_replaces_host() {
    let (a, b) = ([support::spawn_member("a", 0).await], [support::spawn_member("b", 0).await]);
    let config = support::listener_table("web", "")
        + &support::route_table("api", "web", "ca", "match = { host = \"api.test\" }")
        + &support::route_table("rest", "web", "cb", "")
        + &support::cluster_table("ca", &support::member_list(&a))
        + &support::cluster_table("cb", &support::member_list(&b));
    let r = support::router(&config).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp = support::raw_request(
        &mut conn,
        "GET http://api.test:8080/headers HTTP/1.1\r\nHost: other.test\r\n\r\n",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-member"), Some("a"), "routed by Host instead of the target");
    let seen = resp.text();
    assert!(seen.contains("host: api.test:8080\n"), "member saw: {seen}");
    assert!(!seen.contains("other.test"), "member saw the client's Host: {seen}");
}

#[tokio::test]
async fn connection_naming_host_does_not_strip_it() {
    let ms = [support::spawn_member("m1", 0).await];
    let r = support::router(&support::one_cluster(&support::member_list(&ms))).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp = support::raw_request(
        &mut conn,
        "GET /headers HTTP/1.1\r\nHost: keep.test\r\nConnection: host, x-drop\r\nX-Drop: 1\r\n\r\n",
    )
    .await;
    assert_eq!(resp.status, 200);
    let seen = resp.text();
    assert!(seen.contains("host: keep.test\n"), "member saw: {seen}");
    assert!(!seen.contains("x-drop"), "member saw: {seen}");
}

#[tokio::test]
async fn a_request_that_comes_back_through_the_router_is_answered_508() {
    // Two routers (in one process: one Via id) whose clusters point at each other: without
    // the loop check a request nests until descriptors or header limits run out.
    let (a_addr, b_addr) = (support::dead_addr(), support::dead_addr());
    let config = |own: SocketAddr, other: SocketAddr| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"{own}\"\n\n{}{}",
            support::route_table("main", "web", "c", ""),
            support::cluster_table(
                "c",
                &format!("members = [{}]", support::member_entry("next", other, ""))
            )
        )
    };
    let ra = support::router(&config(a_addr, b_addr)).await;
    let _rb = support::router(&config(b_addr, a_addr)).await;
    let mut conn = support::raw_connect(ra.addr("web")).await;
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    // Both routers run in this process, so they share one Via pseudonym: the second router
    // sees it on the request's first arrival and answers 508, which the first passes back.
    assert_eq!(resp.status, 508, "{}", resp.text());
    assert!(resp.text().contains("request loop"), "{}", resp.text());
    drop(conn);

    // A Via naming other hops (another rondo's, a look-alike) is no loop.
    let ms = [support::spawn_member("m1", 0).await];
    let r = support::router(&support::one_cluster(&support::member_list(&ms))).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let via = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nVia: 1.1 rondo, 1.1 rondo-0000000g, 1.0 {}x\r\n\r\n",
        rondo_proxy::headers::via_id()
    );
    let resp = support::raw_request(&mut conn, via).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[tokio::test]
async fn a_response_framed_by_both_chunked_and_length_reaches_the_client_whole() {
    let m = raw_member(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    let cluster = format!("members = [{}]", support::member_entry("raw", m.addr, ""));
    let r = support::router(&support::one_cluster(&cluster)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    for _ in 0..2 {
        let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.text(), "hello", "truncated by the member's Content-Length");
        assert_ne!(resp.header("content-length"), Some("3"), "{:?}", resp.headers);
    }
}

#[tokio::test]
async fn a_member_status_outside_100_to_599_is_a_member_failure() {
    let m = raw_member(b"HTTP/1.1 700 Odd\r\nContent-Length: 2\r\n\r\nok").await;
    let cluster = format!(
        "retry = {{ attempts = 1 }}\nmembers = [{}]",
        support::member_entry("odd", m.addr, "")
    );
    let r = support::router(&support::one_cluster(&cluster)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert!(
        resp.text().contains("c/odd: answered with a status outside 100-599"),
        "{}",
        resp.text()
    );
    assert_eq!(m.heads.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn brief_errors_name_no_route_cluster_or_member_and_full_ones_end_cleanly() {
    let dead = support::dead_members("gone", 2);
    for (detail, names_shown) in [("brief", false), ("full", true)] {
        let r = support::router(&support::web_config(
            &format!("error_detail = \"{detail}\""),
            "",
            &dead,
        ))
        .await;
        let mut conn = support::raw_connect(r.addr("web")).await;
        let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(resp.status, 502);
        let text = resp.text();
        assert_eq!(
            text.contains("gone1") || text.contains("cluster c"),
            names_shown,
            "{detail}: {text}"
        );
        assert!(!text.trim_end().ends_with(';'), "{detail}: stray separator: {text}");
    }
}

#[tokio::test]
async fn a_member_whose_host_name_does_not_resolve_is_not_called_refused() {
    let cluster = format!(
        "retry = {{ attempts = 1 }}\nmembers = [{}]",
        support::member_entry("nowhere", "no-such-host.invalid:80", "")
    );
    let r = support::router(&support::one_cluster(&cluster)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert!(resp.text().contains("c/nowhere: host name did not resolve"), "{}", resp.text());
}

#[tokio::test]
async fn an_http2_host_that_differs_from_the_authority_is_refused() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let ms = [support::spawn_member("m1", 0).await];
    let r = support::router(&support::one_cluster(&support::member_list(&ms))).await;
    let stream = tokio::net::TcpStream::connect(r.addr("web")).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    for (host, status, seen) in [
        (Some("b.test"), 400, ""),
        (Some("a.test"), 200, "host: a.test\n"),
        (None, 200, "host: a.test\n"),
    ] {
        let mut req = http::Request::get("http://a.test/headers");
        if let Some(h) = host {
            req = req.header("host", h);
        }
        let resp = sender.send_request(req.body(Empty::<bytes::Bytes>::new()).unwrap()).await;
        let resp = resp.expect("answered");
        assert_eq!(resp.status().as_u16(), status, "Host {host:?}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(seen), "Host {host:?}: member saw {text}");
    }
}

/// Two clusters of one member each: `m1` behind the route for `/headers` (and for host
/// `api.test`), `m2` behind the catch-all.
async fn two_routes() -> (support::TestRouter, Vec<rondo::member::Member>) {
    let a = support::members(1, Duration::ZERO).await;
    let b = vec![support::spawn_member("m2", 0).await];
    let config = support::listener_table("web", "")
        + &support::route_table("api", "web", "a", "match = { host = \"api.test\" }")
        + &support::route_table("headers", "web", "a", "match = { path_prefix = \"/headers\" }")
        + &support::route_table("rest", "web", "b", "")
        + &support::cluster_table("a", &support::member_list(&a))
        + &support::cluster_table("b", &support::member_list(&b));
    let r = support::router(&config).await;
    (r, a.into_iter().chain(b).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_match_the_normalized_path_and_members_get_it() {
    let (r, _ms) = two_routes().await;
    // Each spelling of `/headers` is routed as `/headers` and the member gets `/headers` (it
    // answers that path with the headers it got); on the own path and on hyper's (an
    // absolute-form target is hyper's).
    for target in ["/x/../headers", "/%68eaders", "//headers", "/./headers", "/%2E%2E/headers"] {
        for form in ["", "http://x"] {
            let mut conn = support::raw_connect(r.addr("web")).await;
            let request = format!("GET {form}{target} HTTP/1.1\r\nHost: x\r\n\r\n");
            let resp = support::raw_request(&mut conn, &request).await;
            assert_eq!(resp.status, 200, "{form}{target}: {}", resp.text());
            assert_eq!(resp.header("x-member"), Some("m1"), "{form}{target} missed its route");
            assert!(resp.text().contains("host: "), "{form}{target}: the member saw another path");
        }
    }
    // A query stays as it came; a path that only looks alike goes elsewhere.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp =
        support::raw_request(&mut conn, "GET /head%65rs?a=%2F HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.header("x-member"), Some("m1"));
    let resp = support::raw_request(&mut conn, "GET /x/headers HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(resp.header("x-member"), Some("m2"));
    // A host with the root's empty label is the host.
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nHost: api.test.\r\n\r\n").await;
    assert_eq!(resp.header("x-member"), Some("m1"), "api.test. missed the api route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscore_spellings_and_the_tier_session_never_reach_a_member() {
    let (r, _ms) = two_routes().await;
    for form in ["", "http://x"] {
        let mut conn = support::raw_connect(r.addr("web")).await;
        let request = format!(
            "GET {form}/headers HTTP/1.1\r\nHost: x\r\nX_Rondo_Subject: root\r\n\
             X_Forwarded_For: 10.9.9.9\r\nX_Client_Cert_Subject: CN=root\r\n\
             Cookie: a=1; rondo-session=forged.mac; b=2\r\nX_Other: kept\r\n\r\n"
        );
        let resp = support::raw_request(&mut conn, &request).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let seen = resp.text().to_ascii_lowercase();
        for gone in
            ["x_rondo_subject", "x_forwarded_for", "x_client_cert", "rondo-session", "10.9.9.9"]
        {
            assert!(!seen.contains(gone), "{form}: the member got {gone}:\n{seen}");
        }
        assert!(seen.contains("cookie: a=1; b=2"), "{form}: {seen}");
        assert!(seen.contains("x_other: kept"), "{form}: {seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_the_router_owns_are_refused_on_the_own_path() {
    let (r, _ms) = two_routes().await;
    for name in ["x-rondo-subject", "X_Rondo_Claim_Role", "x-forwarded-for", "x-client-cert-san"] {
        let mut conn = support::raw_connect(r.addr("web")).await;
        let request = format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n{name}: root\r\n\r\nGET /canary HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        support::raw_send(&mut conn, request.as_bytes()).await;
        let resp = support::read_response(&mut conn).await.expect("response");
        assert_eq!(resp.status, 400, "{name}: {}", resp.text());
        assert!(resp.text().contains("reserved for the router"), "{name}: {}", resp.text());
        let (rest, closed) = support::read_until_closed(&mut conn, CLOSE_WAIT).await;
        assert!(closed && rest.is_empty(), "{name}: the connection went on");
    }
}
