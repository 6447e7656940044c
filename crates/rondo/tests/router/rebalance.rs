//! Long-lived connections rebalance: a listener's `max_connection_age_ms` and
//! `max_requests_per_connection` end client connections (HTTP/1 `Connection: close`, HTTP/2
//! GOAWAY), and a cluster's end the router's connections to its members, so that an HTTP/2
//! (gRPC) client held on one connection reaches a member that joined behind a connection-level
//! balancer.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::support::*;

/// One HTTP/1.1 request on `conn`: the status, whether the response closes the connection, the
/// body.
async fn get(conn: &mut BufReader<TcpStream>) -> (u16, bool, String) {
    conn.get_mut().write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut len, mut close) = (0, false);
    loop {
        line.clear();
        conn.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        close |= lower.starts_with("connection:") && lower.contains("close");
    }
    let mut body = vec![0; len];
    conn.read_exact(&mut body).await.unwrap();
    (status, close, String::from_utf8(body).unwrap())
}

/// Whether the peer closes `conn` within `wait` (a read of 0).
async fn closed_within(conn: &mut BufReader<TcpStream>, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(wait, conn.read(&mut byte)).await, Ok(Ok(0)))
}

#[tokio::test]
async fn a_listener_closes_http1_connections_after_their_requests_or_their_age() {
    let ms = members(1, Duration::ZERO).await;
    let listener = "max_requests_per_connection = 3";
    let r = router(&web_config(listener, "", &member_list(&ms))).await;
    let mut conn = BufReader::new(TcpStream::connect(r.addr("web")).await.unwrap());
    assert_eq!(get(&mut conn).await, (200, false, "m1\n".to_owned()));
    assert_eq!(get(&mut conn).await, (200, false, "m1\n".to_owned()));
    // The third says so, and the connection ends after it.
    assert_eq!(get(&mut conn).await, (200, true, "m1\n".to_owned()));
    assert!(closed_within(&mut conn, Duration::from_secs(2)).await);

    // By age: a request within it is served; past it, an idle connection is closed (the
    // listener's idle timeout is 30 s, so only the age closes it).
    let listener = "max_connection_age_ms = 400\nheader_read_timeout_ms = 30000";
    let r = router(&web_config(listener, "", &member_list(&ms))).await;
    let started = Instant::now();
    let mut conn = BufReader::new(TcpStream::connect(r.addr("web")).await.unwrap());
    assert_eq!(get(&mut conn).await, (200, false, "m1\n".to_owned()));
    assert!(closed_within(&mut conn, Duration::from_secs(3)).await, "the aged connection stays");
    assert!(started.elapsed() >= Duration::from_millis(400), "closed before its age");
    // A request that starts past the age is answered, with `Connection: close`.
    let mut conn = BufReader::new(TcpStream::connect(r.addr("web")).await.unwrap());
    assert!(!get(&mut conn).await.1, "a request within the age keeps the connection");
    tokio::time::sleep(Duration::from_millis(300)).await;
    conn.get_mut().write_all(b"GET /slow/200 HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let mut head = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    assert!(head.contains("connection: close"), "{head}");
}

/// An h2c connection to `addr`: its sender, and whether the connection has ended.
async fn h2c(
    addr: SocketAddr,
) -> (hyper::client::conn::http2::SendRequest<Empty<Bytes>>, tokio::task::JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    (
        sender,
        tokio::spawn(async move {
            let _ = conn.await;
        }),
    )
}

/// Sends requests on `sender` until it will take no more (GOAWAY); returns how many were
/// answered 200, or `None` if it still takes them after `limit` requests or `wait`.
async fn answered_until_goaway(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    addr: SocketAddr,
    limit: usize,
    wait: Duration,
) -> Option<usize> {
    let started = Instant::now();
    let mut ok = 0;
    while ok < limit && started.elapsed() < wait {
        if sender.ready().await.is_err() {
            return Some(ok);
        }
        let req = http::Request::get(format!("http://{addr}/")).body(Empty::new()).unwrap();
        match sender.send_request(req).await {
            Ok(resp) => {
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.unwrap();
                ok += 1;
            }
            Err(_) => return Some(ok),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn a_listener_sends_http2_clients_goaway_after_their_requests_or_their_age() {
    let ms = members(1, Duration::ZERO).await;
    let r = router(&web_config("max_requests_per_connection = 5", "", &member_list(&ms))).await;
    let (mut sender, conn) = h2c(r.addr("web")).await;
    let answered = answered_until_goaway(&mut sender, r.addr("web"), 50, Duration::from_secs(10));
    assert_eq!(answered.await, Some(5), "GOAWAY after the fifth request");
    tokio::time::timeout(Duration::from_secs(5), conn).await.expect("the connection ends").unwrap();

    let r = router(&web_config("max_connection_age_ms = 500", "", &member_list(&ms))).await;
    let started = Instant::now();
    let (mut sender, conn) = h2c(r.addr("web")).await;
    let answered =
        answered_until_goaway(&mut sender, r.addr("web"), 10_000, Duration::from_secs(10));
    let n = answered.await.expect("GOAWAY once the connection is 500 ms old");
    assert!(n > 0 && started.elapsed() >= Duration::from_millis(500), "{n} answered");
    tokio::time::timeout(Duration::from_secs(5), conn).await.expect("the connection ends").unwrap();
}

/// A back router `B`: a `tcp` listener balancing connections over `pods` by least sessions (a
/// connection-level balancer, as a Kubernetes service address is).
fn back_config(pods: &[rondo::member::Member]) -> String {
    pipeline(
        "svc",
        "protocol = \"tcp\"",
        "",
        &format!(
            "algorithm = \"least-sessions\"\nupstream_protocol = \"tcp\"\n{}",
            member_list(pods)
        ),
    )
}

/// Through a front router whose HTTP/2 cluster has one member, the back router's `tcp`
/// listener, an h2c client on one connection sends requests for `for_`; `b2` joins the back
/// router's pods after a third of it. Returns who answered the requests in the last third.
async fn answers_after_a_pod_joins(cluster_extra: &str, for_: Duration) -> Vec<String> {
    let pods = members(2, Duration::ZERO).await;
    let back = router(&back_config(&pods[..1])).await;
    let front_cluster = format!(
        "upstream_protocol = \"http2\"\n{cluster_extra}\nmembers = [{{ name = \"svc\", address = \"{}\" }}]",
        back.addr("svc")
    );
    let front = router(&web_config("", "", &front_cluster)).await;
    let addr = front.addr("web");
    let (mut sender, _conn) = h2c(addr).await;
    let started = Instant::now();
    let mut joined = false;
    let mut late = Vec::new();
    while started.elapsed() < for_ {
        if !joined && started.elapsed() >= for_ / 3 {
            let c = rondo_config::parse_str(&back_config(&pods), std::path::Path::new("b.toml"), 2)
                .unwrap();
            back.live.apply(c.view);
            joined = true;
        }
        sender.ready().await.expect("the client's one connection to the front router lasts");
        let req = http::Request::get(format!("http://{addr}/")).body(Empty::new()).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        if started.elapsed() >= for_ * 2 / 3 {
            late.push(String::from_utf8_lossy(&body).trim().to_owned());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    late
}

#[tokio::test]
async fn a_pod_that_joins_behind_a_connection_balancer_gets_calls_within_the_age() {
    // Without a limit the front router's one HTTP/2 connection to the back router stays on m1.
    let late = answers_after_a_pod_joins("", Duration::from_millis(2400)).await;
    assert!(!late.is_empty() && late.iter().all(|n| n == "m1"), "{late:?}");
    // With max_connection_age_ms, a new connection is opened within the age, and the back
    // router puts it on the pod that has none.
    let late =
        answers_after_a_pod_joins("max_connection_age_ms = 300", Duration::from_millis(2400)).await;
    assert!(late.iter().any(|n| n == "m2"), "the new pod got no call: {late:?}");
}

/// Through a front router whose HTTP/1.1 cluster has one member, the back router's `tcp`
/// listener over two pods: who answered `n` requests sent one after another.
async fn http1_answers_through_a_connection_balancer(cluster_extra: &str, n: usize) -> Vec<String> {
    let pods = members(2, Duration::ZERO).await;
    let back = router(&back_config(&pods)).await;
    let front_cluster = format!(
        "{cluster_extra}\nmembers = [{{ name = \"svc\", address = \"{}\" }}]",
        back.addr("svc")
    );
    let front = router(&web_config("", "", &front_cluster)).await;
    let mut conn = BufReader::new(TcpStream::connect(front.addr("web")).await.unwrap());
    let mut names = Vec::new();
    for _ in 0..n {
        let (status, _, body) = get(&mut conn).await;
        assert_eq!(status, 200);
        names.push(body.trim().to_owned());
        // The back router sees a closed connection's session end before the next one opens.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    names
}

#[tokio::test]
async fn a_cluster_limit_on_requests_per_connection_opens_new_member_connections() {
    // The own HTTP/1 path reuses its one pooled connection: every request on the same pod.
    let names = http1_answers_through_a_connection_balancer("", 6).await;
    assert!(names.iter().all(|n| n == &names[0]), "{names:?}");
    // One request per connection: a new connection each time, spread by the back router.
    let names =
        http1_answers_through_a_connection_balancer("max_requests_per_connection = 1", 6).await;
    assert!(names.iter().any(|n| n == "m1") && names.iter().any(|n| n == "m2"), "{names:?}");
}
