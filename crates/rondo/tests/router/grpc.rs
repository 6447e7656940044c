//! gRPC awareness through the router, with real gRPC peers (Python grpcio, `grpc_peer.py`) and
//! raw h2 calls where the test must see the answer's head: a member's gRPC failure statuses
//! feed ejection and retries, `grpc-timeout` is the call's deadline, the router's own failures
//! are gRPC errors, and health checks speak HTTP/2 and `grpc.health.v1`.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};

use super::support::{self, TestRouter, member_entry, members_of, one_cluster, router};
use crate::common::ChildGuard;

const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/router/grpc_peer.py");

/// A grpcio member process, stopped when dropped.
pub(crate) struct Peer {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    _child: ChildGuard,
}

/// Starts a grpcio member `name` answering `/test.Echo/Say` as `behaviour` and its health
/// check as `health` (see `grpc_peer.py`).
pub(crate) fn peer(name: &str, behaviour: &str, health: &str) -> Peer {
    let mut child = Command::new("python3")
        .args([PEER, "serve", name, behaviour, health])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs (grpcio installed: pip install grpcio)");
    let stdout = child.stdout.take().expect("stdout");
    let child = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("the peer says its port");
    let port: u16 = line
        .strip_prefix("listening ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("grpc peer did not start: {line:?}"));
    Peer { name: name.to_owned(), addr: SocketAddr::from(([127, 0, 0, 1], port)), _child: child }
}

/// `count` calls of `/test.Echo/Say` through `addr` by grpcio's client: `OK REPLY` or
/// `ERR CODE DETAILS` each.
async fn calls(addr: SocketAddr, count: usize) -> Vec<String> {
    let args = [PEER.to_owned(), "call".into(), addr.to_string(), count.to_string()];
    // The client's calls carry their own 10 s deadline each, so the process ends.
    let run = tokio::task::spawn_blocking(move || Command::new("python3").args(args).output());
    let out = run.await.expect("the client thread").expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// A cluster `c` of `peers` over HTTP/2, with `extra` keys, behind listener `web`.
pub(crate) fn grpc_cluster(peers: &[&Peer], extra: &str) -> String {
    let members = members_of(peers.iter().map(|p| member_entry(&p.name, p.addr, "")));
    one_cluster(&format!("upstream_protocol = \"http2\"\n{members}\n{extra}"))
}

/// A raw gRPC call over h2c (the test sees the answer's head): status, `grpc-status`,
/// `grpc-message` (from the head or the trailers), content-type.
struct Answer {
    status: StatusCode,
    content_type: String,
    grpc_status: Option<String>,
    grpc_message: Option<String>,
}

async fn raw_call(url: &str, headers: &[(&str, &str)]) -> Answer {
    let client = support::client_of::<Full<Bytes>>(true);
    let mut req =
        Request::post(url).header("content-type", "application/grpc").header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = Bytes::from_static(b"\x00\x00\x00\x00\x02hi");
    let req = req.body(Full::new(body)).expect("request builds");
    let fut = async {
        let resp = client.request(req).await.expect("an answer");
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.expect("body");
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let field = |name: &str| {
            parts
                .headers
                .get(name)
                .or_else(|| trailers.get(name))
                .map(|v| v.to_str().unwrap_or("").to_owned())
        };
        Answer {
            status: parts.status,
            content_type: field("content-type").unwrap_or_default(),
            grpc_status: field("grpc-status"),
            grpc_message: field("grpc-message"),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), fut).await.expect("answer within 10 s")
}

/// Waits (at most 10 s) until member `m` of cluster `c` has health `healthy`.
async fn health_becomes(r: &TestRouter, m: usize, healthy: bool) {
    let start = Instant::now();
    loop {
        let snap = r.live.load();
        let now = snap.clusters["c"].with(|b| b.states()[m].healthy);
        if now == healthy {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "member {m} never became {healthy}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_answering_unavailable_is_ejected_and_its_status_counted() {
    let (good, bad) = (peer("good", "ok", "serving"), peer("bad", "unavailable", "serving"));
    // Round robin, one try per call: without gRPC awareness every other call is the bad one's.
    let extra = "algorithm = \"round-robin\"\nretry = { attempts = 1 }\n\
                 outlier = { consecutive_failures = 3 }";
    let r = router(&grpc_cluster(&[&good, &bad], extra)).await;
    let answers = calls(r.addr("web"), 30).await;
    let failed = answers.iter().filter(|a| a.starts_with("ERR UNAVAILABLE bad is unavailable"));
    let failed = failed.count();
    let served = answers.iter().filter(|a| *a == "OK good").count();
    assert_eq!(failed + served, 30, "{answers:?}");
    assert!(failed <= 4, "the failing member kept getting calls: {answers:?}");
    let ejected = r.live.load().clusters["c"].with(|b| b.states()[1].ejected_until.is_some());
    assert!(ejected, "the failing member was not ejected");
    let text = r.live.metrics.render(&r.live.load());
    let line = |status: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("rondo_grpc_responses_total{")
                    && l.contains(&format!("grpc_status=\"{status}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
    };
    assert_eq!(line("unavailable").as_deref(), Some(failed.to_string().as_str()), "{text}");
    assert_eq!(line("ok").as_deref(), Some(served.to_string().as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_a_member_declines_are_retried_on_another_member() {
    let (good, bad) = (peer("good", "ok", "serving"), peer("bad", "unavailable", "serving"));
    let extra = "algorithm = \"round-robin\"\noutlier = { consecutive_failures = 0 }\n\
                 retry = { attempts = 2, retry_on = [\"unavailable\"], budget_min_per_sec = 100 }";
    let r = router(&grpc_cluster(&[&good, &bad], extra)).await;
    let answers = calls(r.addr("web"), 10).await;
    assert_eq!(answers, vec!["OK good"; 10], "every call reached the good member");
    let text = r.live.metrics.render(&r.live.load());
    let retries = text
        .lines()
        .find(|l| l.starts_with("rondo_retries_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(retries.is_some_and(|n| n >= 4), "the bad member was tried and retried: {retries:?}");

    // Without the retry, the same member's answer reaches the client.
    let r = router(&grpc_cluster(
        &[&good, &bad],
        "algorithm = \"round-robin\"\n\
        outlier = { consecutive_failures = 0 }\nretry = { attempts = 2 }",
    ))
    .await;
    let answers = calls(r.addr("web"), 4).await;
    assert!(answers.iter().any(|a| a.starts_with("ERR UNAVAILABLE")), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_call_that_runs_out_of_members_gets_the_members_status() {
    let bad = peer("bad", "unavailable", "serving");
    let extra = "retry = { attempts = 2, retry_on = [\"unavailable\"], budget_min_per_sec = 100 }";
    let r = router(&grpc_cluster(&[&bad], extra)).await;
    let a = raw_call(&r.url("web", "/test.Echo/Say"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.grpc_status.as_deref(), Some("14"));
    assert_eq!(a.grpc_message.as_deref(), Some("bad is unavailable"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_is_the_calls_deadline() {
    let slow = peer("slow", "slow", "serving");
    let r = router(&grpc_cluster(&[&slow], "")).await;
    let start = Instant::now();
    let a = raw_call(&r.url("web", "/test.Echo/Say"), &[("grpc-timeout", "100m")]).await;
    let took = start.elapsed();
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type, "application/grpc");
    assert_eq!(a.grpc_status.as_deref(), Some("4"), "deadline exceeded: {:?}", a.grpc_message);
    assert!(took < Duration::from_millis(900), "the deadline was not applied: {took:?}");
}

/// An h2c member that ignores deadlines: every call is answered with a stream of ten
/// messages, one each 300 ms, then `grpc-status: 0`.
async fn dripping_member() -> SocketAddr {
    use http_body_util::{BodyExt as _, StreamBody};
    use hyper::body::Frame;
    super::protocols::accept_loop(|stream| async move {
        let svc = hyper::service::service_fn(|_req: Request<hyper::body::Incoming>| async {
            let frames = futures_util::stream::unfold(0u8, |i| async move {
                if i > 10 {
                    return None;
                }
                let frame = if i == 10 {
                    let mut t = http::HeaderMap::new();
                    t.insert("grpc-status", http::HeaderValue::from_static("0"));
                    Frame::trailers(t)
                } else {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Frame::data(Bytes::from(vec![0, 0, 0, 0, 3, b'm', b':', b'0' + i]))
                };
                Some((Ok::<_, std::convert::Infallible>(frame), i + 1))
            });
            let mut resp = http::Response::new(StreamBody::new(frames).boxed());
            resp.headers_mut()
                .insert("content-type", http::HeaderValue::from_static("application/grpc"));
            Ok::<_, std::convert::Infallible>(resp)
        });
        let io = hyper_util::rt::TokioIo::new(stream);
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(io, svc)
            .await;
    })
    .await
}

/// A stream whose answer has begun still ends by the call's deadline: the member's stream is
/// dropped and the client's trailers say DEADLINE_EXCEEDED; the member is charged a timeout.
/// Before, the deadline bounded only the wait for the answer's head, and the stream ran on
/// for as long as the member kept it (this member ignores deadlines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_cuts_a_stream_that_already_answers() {
    let m = dripping_member().await;
    let members = members_of([member_entry("m", m, "")]);
    let r = router(&one_cluster(&format!("upstream_protocol = \"http2\"\n{members}"))).await;
    let client = support::client_of::<Full<Bytes>>(true);
    let req = Request::post(r.url("web", "/test.Echo/Drip"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "700m")
        .body(Full::new(Bytes::from_static(b"\x00\x00\x00\x00\x01x")))
        .expect("request builds");
    let start = Instant::now();
    let call = async {
        let resp = client.request(req).await.expect("an answer");
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("grpc-status").is_none(), "not trailers-only: it streams");
        resp.into_body().collect().await.expect("the body ends cleanly")
    };
    let body = tokio::time::timeout(Duration::from_secs(10), call).await.expect("within 10 s");
    let took = start.elapsed();
    let trailers = body.trailers().cloned().expect("trailers");
    assert_eq!(trailers.get("grpc-status").map(|v| v.to_str().unwrap()), Some("4"));
    let messages = body.to_bytes().len() / 8; // each message: 5 bytes of frame head, `m:N`
    assert!((1..10).contains(&messages), "{messages} messages before the cut");
    // The member's stream lasts 3 s; the call ends near its 700 ms deadline.
    assert!(took < Duration::from_millis(2500), "the stream ran on: {took:?}");
    let failures = r.live.load().clusters["c"].with(|b| b.states()[0].load.consecutive_failures);
    assert_eq!(failures, 1, "the member is charged with the timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_try_tells_the_member_the_time_left() {
    let m = peer("m", "remaining", "serving");
    let cluster = format!(
        "upstream_protocol = \"http2\"\n{}",
        members_of([member_entry(&m.name, m.addr, "")])
    );
    let config = support::web_config("", "request_timeout_ms = 2000", &cluster);
    let r = router(&config).await;
    // The client allows 30 s; the route 2 s: the member hears at most 2 s.
    let client = support::client_of::<Full<Bytes>>(true);
    let req = Request::post(r.url("web", "/test.Echo/Say"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "30S")
        .body(Full::new(Bytes::from_static(b"\x00\x00\x00\x00\x02hi")))
        .expect("request");
    let resp = client.request(req).await.expect("answer");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let left: f64 = String::from_utf8_lossy(&body[5..]).parse().expect("seconds left");
    assert!(left > 0.5 && left <= 2.0, "the member heard {left} s left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_own_failures_are_grpc_errors() {
    // No member up: trailers-only UNAVAILABLE with the cause, never an HTTP 502 page.
    let r = router(&one_cluster(&format!(
        "upstream_protocol = \"http2\"\n{}",
        support::dead_members("d", 2)
    )))
    .await;
    let a = raw_call(&r.url("web", "/test.Echo/Say"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type, "application/grpc");
    assert_eq!(a.grpc_status.as_deref(), Some("14"));
    let message = a.grpc_message.unwrap_or_default();
    assert!(message.contains("bad gateway: no member answered"), "{message}");
    // grpcio's own client sees UNAVAILABLE with the router's message.
    let answers = calls(r.addr("web"), 1).await;
    assert!(answers[0].starts_with("ERR UNAVAILABLE rondo"), "{answers:?}");
    let text = r.live.metrics.render(&r.live.load());
    let counted = text.lines().any(|l| {
        l.starts_with("rondo_grpc_responses_total{")
            && l.contains("cluster=\"c\"")
            && l.contains("grpc_status=\"unavailable\"")
            && l.ends_with(" 2")
    });
    assert!(counted, "both gRPC errors counted:\n{text}");
    // A plain HTTP client still gets the HTTP error.
    let reply = support::get(&support::client(), &r.url("web", "/")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_not_serving_takes_a_member_out() {
    let (up, down) = (peer("up", "ok", "serving"), peer("down", "ok", "not-serving"));
    let extra = "health = { grpc = { service = \"my.Service\" }, interval_ms = 100, rise = 1, \
                 fall = 1 }";
    let r = router(&grpc_cluster(&[&up, &down], extra)).await;
    health_becomes(&r, 1, false).await;
    // The serving member stays up across several rounds (its service name arrived intact).
    tokio::time::sleep(Duration::from_millis(400)).await;
    health_becomes(&r, 0, true).await;
    let answers = calls(r.addr("web"), 6).await;
    assert_eq!(answers, vec!["OK up"; 6]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_health_checks_of_an_http2_cluster_speak_h2c() {
    // An HTTP/2-only member passes; an HTTP/1.1-only one cannot answer h2c and goes down.
    let h2 = super::protocols::grpc_member().await;
    let h1 = http1_only_member().await;
    let cluster = format!(
        "upstream_protocol = \"http2\"\n{}\n\
         health = {{ path = \"/healthz\", interval_ms = 100, rise = 1, fall = 1 }}",
        members_of([member_entry("h2", h2, ""), member_entry("h1", h1, "")])
    );
    let r = router(&one_cluster(&cluster)).await;
    health_becomes(&r, 1, false).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    health_becomes(&r, 0, true).await;
}

/// A member that speaks HTTP/1.1 only: every connection gets `200 OK`, then closed.
async fn http1_only_member() -> SocketAddr {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = stream.write_all(ok).await;
            });
        }
    });
    addr
}
