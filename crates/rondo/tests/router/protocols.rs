//! Protocols through the router: HTTP/2 on either side, gRPC with its trailers, request bodies
//! streamed (not buffered), TCP proxying, WebSocket upgrades, and header hygiene in both
//! directions.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rondo::member::Member;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::support::{self, RawConn};

/// Upper bound for any single step of a test.
const GUARD: Duration = Duration::from_secs(10);

/// Accepts connections on a free port and runs `on_conn` for each until the test ends.
pub(crate) async fn accept_loop<F, Fut>(on_conn: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(on_conn(stream));
        }
    });
    addr
}

/// `{ name = "NAME", address = "ADDR" }`.
fn member(name: &str, addr: SocketAddr) -> String {
    support::member_entry(name, addr, "")
}

fn text_body(s: impl Into<Bytes>) -> Full<Bytes> {
    Full::new(s.into())
}

// ---------------------------------------------------------------------------------------------
// HTTP/2
// ---------------------------------------------------------------------------------------------

/// A member that answers the HTTP version its request arrived with (h1 and h2 on one port).
async fn version_member() -> SocketAddr {
    accept_loop(|stream| async move {
        let svc = service_fn(|req: Request<Incoming>| async move {
            Ok::<_, Infallible>(Response::new(text_body(format!("{:?}", req.version()))))
        });
        let _ = auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    })
    .await
}

/// An HTTP/2-only member that answers how many `Host` fields its request carried beside its
/// `:authority` (RFC 9113 8.3.1: a `Host` naming another authority is malformed; nginx answers
/// it 400), the authority, and the `X-Forwarded-Host` it got.
async fn authority_member() -> SocketAddr {
    accept_loop(|stream| async move {
        let svc = service_fn(|req: Request<Incoming>| async move {
            let hosts = req.headers().get_all(http::header::HOST).iter().count();
            let authority = req.uri().authority().map(|a| a.to_string()).unwrap_or_default();
            let forwarded = req.headers().get("x-forwarded-host").cloned();
            let forwarded = forwarded.map(|v| v.to_str().unwrap_or("?").to_owned());
            let text = format!("{hosts} {authority} {}", forwarded.unwrap_or_default());
            Ok::<_, Infallible>(Response::new(text_body(text)))
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    })
    .await
}

// An HTTP/2 member got the member's address as `:authority` where an HTTP/1.1 member gets the
// client's `Host` (HAProxy and Envoy send the client's authority too): a member serving by
// name (nginx `server_name`) could not tell the sites apart. One authority, the client's, and
// no `Host` beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_member_gets_the_clients_authority_and_no_host() {
    let a = authority_member().await;
    let config = support::web_config(
        "",
        "",
        &format!("upstream_protocol = \"http2\"\nmembers = [{}]", member("a", a)),
    );
    let r = support::router(&config).await;
    let port = r.addr("web").port();
    let url = format!("http://127.0.0.1:{port}/");
    // HTTP/1.1 with a named Host, and HTTP/2 whose `:authority` is the router's address.
    let reply = support::get_with(&support::client(), &url, &[("host", "app.example:8443")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body, "0 app.example:8443 app.example");
    let reply = support::get(&support::h2_client(), &url).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body, format!("0 127.0.0.1:{port} 127.0.0.1"));
    // Requests at once, on the member's one connection.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let url = url.clone();
        set.spawn(async move { support::get(&support::h2_client(), &url).await.body });
    }
    while let Some(body) = set.join_next().await {
        assert_eq!(body.expect("joined"), format!("0 127.0.0.1:{port} 127.0.0.1"));
    }
}

/// GET `url`: the response's version, status, Via header and body.
async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
) -> (Version, StatusCode, String, String) {
    let reply = support::get(client, url).await;
    let via = reply
        .headers
        .get(http::header::VIA)
        .map(|v| v.to_str().unwrap_or("?").to_owned())
        .unwrap_or_default();
    (reply.version, reply.status, via, reply.body.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_end_to_end_and_across_versions() {
    let ms = support::members(1, Duration::ZERO).await;
    let v = version_member().await;
    let m1 = member("m1", ms[0].addr);
    let vm = member("v", v);
    // Listener `to-h2` speaks HTTP/2 to its members, `to-h1` HTTP/1.1; `/version` on either
    // reaches a member that says which version it was spoken to in.
    let version = "match = { path_prefix = \"/version\" }";
    let mut config = String::new();
    for (v, protocol) in [("2", "http2"), ("1", "http1")] {
        let listener = format!("to-h{v}");
        let upstream = format!("upstream_protocol = \"{protocol}\"");
        config += &support::listener_table(&listener, "");
        config +=
            &support::route_table(&format!("h{v}-version"), &listener, &format!("v{v}"), version);
        config += &support::route_table(&format!("h{v}"), &listener, &format!("m{v}"), "");
        config +=
            &support::cluster_table(&format!("m{v}"), &format!("{upstream}\nmembers = [{m1}]"));
        config +=
            &support::cluster_table(&format!("v{v}"), &format!("{upstream}\nmembers = [{vm}]"));
    }
    let r = support::router(&config).await;
    let (h1, h2) = (support::client(), support::h2_client());

    // h2c client → router → h2 member.
    let (version, status, via, body) = fetch(&h2, &r.url("to-h2", "/")).await;
    assert_eq!((version, status, body.as_str()), (Version::HTTP_2, StatusCode::OK, "m1"));
    assert!(via.contains("rondo"), "response Via: {via:?}");
    let (_, status, _, body) = fetch(&h2, &r.url("to-h2", "/version")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "HTTP/2.0"), "member side of h2 → h2");

    // HTTP/1.1 client → router → h2 member.
    let (version, status, _, body) = fetch(&h1, &r.url("to-h2", "/")).await;
    assert_eq!((version, status, body.as_str()), (Version::HTTP_11, StatusCode::OK, "m1"));
    let (_, status, _, body) = fetch(&h1, &r.url("to-h2", "/version")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "HTTP/2.0"), "member side of h1 → h2");

    // h2c client → router → HTTP/1.1 member.
    let (version, status, _, body) = fetch(&h2, &r.url("to-h1", "/")).await;
    assert_eq!((version, status, body.as_str()), (Version::HTTP_2, StatusCode::OK, "m1"));
    let (_, status, _, body) = fetch(&h2, &r.url("to-h1", "/version")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "HTTP/1.1"), "member side of h2 → h1");

    // Several requests multiplexed on one h2c client connection.
    let url = r.url("to-h2", "/");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (h2, url) = (h2.clone(), url.clone());
            tokio::spawn(async move { fetch(&h2, &url).await })
        })
        .collect();
    for task in tasks {
        let (version, status, _, body) = task.await.expect("task");
        assert_eq!((version, status, body.as_str()), (Version::HTTP_2, StatusCode::OK, "m1"));
    }
}

// ---------------------------------------------------------------------------------------------
// gRPC
// ---------------------------------------------------------------------------------------------

/// A gRPC message: compressed flag 0, big-endian length, bytes.
fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(5 + msg.len());
    v.push(0);
    v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    v.extend_from_slice(msg);
    Bytes::from(v)
}

/// The message inside one gRPC frame, if `b` is exactly one uncompressed frame.
fn grpc_unframe(b: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(b.get(1..5)?.try_into().ok()?) as usize;
    (b[0] == 0 && b.len() == 5 + len).then(|| &b[5..])
}

type GrpcBody = BoxBody<Bytes, Infallible>;

/// A gRPC-shaped method: `hello, MSG` with grpc-status 0, or status 5 for the message
/// `missing`, or status 3 naming what was wrong with the request as the router forwarded it.
async fn grpc_method(req: Request<Incoming>) -> Result<Response<GrpcBody>, Infallible> {
    let h = req.headers();
    let problem = if req.version() != Version::HTTP_2 {
        Some("not http/2")
    } else if h.get("content-type").is_none_or(|v| v != "application/grpc") {
        Some("content-type is not application/grpc")
    } else if h.get("te").is_none_or(|v| v != "trailers") {
        Some("te: trailers did not arrive")
    } else {
        None
    };
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::new();
    let mut trailers = HeaderMap::new();
    let (status, message) = match (problem, grpc_unframe(&body)) {
        (Some(p), _) => ("3", p.to_owned()),
        (None, None) => ("3", "request is not one length-prefixed message".to_owned()),
        (None, Some(b"missing")) => ("5", "no such thing".to_owned()),
        (None, Some(msg)) => {
            let mut reply = b"hello, ".to_vec();
            reply.extend_from_slice(msg);
            frames.push(Ok(Frame::data(grpc_frame(&reply))));
            ("0", "ok".to_owned())
        }
    };
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    trailers.insert("grpc-message", HeaderValue::from_str(&message).expect("ascii message"));
    trailers.insert("x-trailer-custom", HeaderValue::from_static("kept"));
    frames.push(Ok(Frame::trailers(trailers)));
    let mut resp = Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
    resp.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
    Ok(resp)
}

/// A gRPC-shaped member: HTTP/2 only (an HTTP/1.1 request fails at the connection preface).
pub(crate) async fn grpc_member() -> SocketAddr {
    accept_loop(|stream| async move {
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service_fn(grpc_method))
            .await;
    })
    .await
}

/// One unary call: the status, the content-type, the reply message and the trailers.
async fn grpc_call(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    msg: &[u8],
) -> (StatusCode, Option<HeaderValue>, Bytes, Option<HeaderMap>) {
    let fut = async {
        let req = Request::post(format!("http://{addr}/test.Greeter/SayHello"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(grpc_frame(msg)))
            .expect("request builds");
        let resp = sender.send_request(req).await.expect("call answered");
        let status = resp.status();
        let content_type = resp.headers().get("content-type").cloned();
        let collected = resp.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (status, content_type, collected.to_bytes(), trailers)
    };
    tokio::time::timeout(GUARD, fut).await.expect("call within 10 s")
}

/// Trailer `name` of a gRPC response, as bytes.
fn trailer<'a>(trailers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    trailers.get(name).map(|v| v.as_bytes())
}

/// An h2c prior-knowledge connection whose requests carry `B` bodies.
async fn h2_conn<B>(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_trailers_pass_through_intact() {
    let g = grpc_member().await;
    let grpc_only = "match = { headers = { \"content-type\" = \"application/grpc\" } }";
    let cluster = format!("upstream_protocol = \"http2\"\nmembers = [{}]", member("g1", g));
    let r = support::router(&support::pipeline("grpc", "", grpc_only, &cluster)).await;
    let addr = r.addr("grpc");
    let mut sender = h2_conn(addr).await;

    let (status, content_type, data, trailers) = grpc_call(&mut sender, addr, b"rondo").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type.as_ref().map(|v| v.as_bytes()), Some(&b"application/grpc"[..]));
    let trailers = trailers.expect("the response has trailers");
    assert_eq!(trailer(&trailers, "grpc-status"), Some(&b"0"[..]), "{trailers:?}");
    assert_eq!(trailer(&trailers, "grpc-message"), Some(&b"ok"[..]));
    assert_eq!(trailer(&trailers, "x-trailer-custom"), Some(&b"kept"[..]));
    assert_eq!(grpc_unframe(&data), Some(&b"hello, rondo"[..]), "reply frame {data:?}");

    // An error status travels in the trailers unchanged (and with no message at all).
    let (status, _, data, trailers) = grpc_call(&mut sender, addr, b"missing").await;
    assert_eq!(status, StatusCode::OK);
    assert!(data.is_empty(), "{data:?}");
    let trailers = trailers.expect("the error response has trailers");
    assert_eq!(trailer(&trailers, "grpc-status"), Some(&b"5"[..]), "{trailers:?}");
    assert_eq!(trailer(&trailers, "grpc-message"), Some(&b"no such thing"[..]));
    assert_eq!(trailer(&trailers, "x-trailer-custom"), Some(&b"kept"[..]));

    // Concurrent calls on one connection each keep their own message and trailers.
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut s = sender.clone();
            tokio::spawn(
                async move { grpc_call(&mut s, addr, format!("call {i}").as_bytes()).await },
            )
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let (status, _, data, trailers) = call.await.expect("task");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(grpc_unframe(&data), Some(format!("hello, call {i}").as_bytes()));
        let trailers = trailers.expect("trailers");
        assert_eq!(trailer(&trailers, "grpc-status"), Some(&b"0"[..]));
    }
}

// ---------------------------------------------------------------------------------------------
// Streaming bodies
// ---------------------------------------------------------------------------------------------

/// `n` bytes that do not repeat with any short period (so a dropped, duplicated or reordered
/// chunk shows).
fn pattern(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

type ReqBody = UnsyncBoxBody<Bytes, Infallible>;

fn chunked_body(data: &[u8], chunk: usize) -> ReqBody {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        data.chunks(chunk).map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
    StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
}

/// A router over one member `m1`: listener `h1` reaches it over HTTP/1.1, listener `h2` over
/// HTTP/2.
async fn echo_router() -> (support::TestRouter, Vec<Member>) {
    let ms = support::members(1, Duration::ZERO).await;
    let m1 = member("m1", ms[0].addr);
    let h1 = format!("members = [{m1}]");
    let h2 = format!("upstream_protocol = \"http2\"\n{h1}");
    let config = support::pipeline("h1", "", "", &h1) + &support::pipeline("h2", "", "", &h2);
    (support::router(&config).await, ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_streamed_body_round_trips_through_echo() {
    let (r, _ms) = echo_router().await;
    // 1.5 MiB and 7 bytes, in 64 KiB chunks with no Content-Length (chunked on HTTP/1.1).
    let data = pattern(3 * 512 * 1024 + 7);
    let (h1, h2) = (support::client_of::<ReqBody>(false), support::client_of::<ReqBody>(true));
    for (what, client, listener) in [("h1 → h1", &h1, "h1"), ("h2 → h2", &h2, "h2")] {
        let req = Request::post(r.url(listener, "/echo"))
            .body(chunked_body(&data, 64 * 1024))
            .expect("request builds");
        let fut = async {
            let resp = client.request(req).await.expect("request succeeds");
            let status = resp.status();
            (status, resp.into_body().collect().await.expect("body").to_bytes())
        };
        let (status, echoed) =
            tokio::time::timeout(Duration::from_secs(30), fut).await.expect("echo within 30 s");
        assert_eq!(status, StatusCode::OK, "{what}");
        assert_eq!(echoed.len(), data.len(), "{what}: echoed length");
        assert!(echoed[..] == data[..], "{what}: echoed bytes differ");
    }
}

/// A request body fed by the test, one chunk at a time.
fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, ReqBody) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed_unsync())
}

/// Reads data frames until `want` bytes arrived (at most 10,000 frames, 10 s each).
async fn read_exactly(body: &mut Incoming, want: usize) -> Vec<u8> {
    let mut got = Vec::with_capacity(want);
    for _ in 0..10_000 {
        if got.len() >= want {
            break;
        }
        let frame = tokio::time::timeout(GUARD, body.frame())
            .await
            .expect("echoed bytes within 10 s")
            .expect("response body ended early")
            .expect("response body frame");
        if let Ok(data) = frame.into_data() {
            got.extend_from_slice(&data);
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_streams_each_chunk_before_the_request_ends() {
    let (r, _ms) = echo_router().await;
    let data = pattern(20 * 64 * 1024);
    for h2 in [false, true] {
        let what = if h2 { "h2 → h2" } else { "h1 → h1" };
        let (tx, body) = channel_body();
        let send = if h2 {
            let mut s = h2_conn(r.addr("h2")).await;
            let req = Request::post(format!("http://{}/echo", r.addr("h2"))).body(body).unwrap();
            tokio::spawn(async move { s.send_request(req).await })
        } else {
            let stream = TcpStream::connect(r.addr("h1")).await.expect("connect");
            let (mut s, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("h1");
            tokio::spawn(conn);
            let req = Request::post("/echo").header("host", "echo.test").body(body).unwrap();
            tokio::spawn(async move { s.send_request(req).await })
        };
        // The first chunk goes out; its echo must come back while the request is still open.
        let mut chunks = data.chunks(64 * 1024);
        tx.send(Bytes::copy_from_slice(chunks.next().unwrap())).await.expect("first chunk");
        let resp = tokio::time::timeout(GUARD, send)
            .await
            .expect("response head while the request body is still open")
            .expect("task")
            .expect("response");
        assert_eq!(resp.status(), StatusCode::OK, "{what}");
        let mut body = resp.into_body();
        let first = read_exactly(&mut body, 64 * 1024).await;
        assert!(first[..] == data[..64 * 1024], "{what}: first chunk");
        // Then chunk by chunk, each echoed before the next is sent.
        let mut echoed = first;
        for chunk in chunks {
            tx.send(Bytes::copy_from_slice(chunk)).await.expect("chunk");
            echoed.extend(read_exactly(&mut body, chunk.len()).await);
        }
        drop(tx);
        let rest = tokio::time::timeout(GUARD, body.collect()).await.expect("end").expect("body");
        assert!(rest.to_bytes().is_empty(), "{what}: nothing after the last chunk");
        assert_eq!(echoed.len(), data.len(), "{what}");
        assert!(echoed == data, "{what}: echoed bytes differ");
    }
}

// ---------------------------------------------------------------------------------------------
// TCP
// ---------------------------------------------------------------------------------------------

/// A TCP echo member: answers each line with `NAME: line`.
async fn tcp_echo(name: &'static str) -> SocketAddr {
    accept_loop(move |stream| async move {
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let mut reply = format!("{name}: ").into_bytes();
            reply.extend_from_slice(&line);
            if w.write_all(&reply).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// Sends `line` (newline added) and reads the member's answer line.
async fn tcp_exchange(conn: &mut RawConn, line: &str) -> String {
    let fut = async {
        conn.get_mut().write_all(format!("{line}\n").as_bytes()).await.expect("write");
        let mut reply = String::new();
        conn.read_line(&mut reply).await.expect("read");
        reply
    };
    tokio::time::timeout(GUARD, fut).await.expect("reply within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_proxying_round_robin_and_skips_a_refusing_member() {
    let (t1, t2) = (tcp_echo("t1").await, tcp_echo("t2").await);
    let dead = support::dead_addr();
    // Cluster `tcp`: two echo members; cluster `tcp-dead`: one that refuses, one echo member.
    let tcp = |name: &str, a: String, b: String| {
        let cluster = format!(
            "algorithm = \"round-robin\"\nupstream_protocol = \"tcp\"\nmembers = [{a}, {b}]"
        );
        support::pipeline(name, "protocol = \"tcp\"", "", &cluster)
    };
    let config = tcp("tcp", member("t1", t1), member("t2", t2))
        + &tcp("tcp-dead", member("dead", dead), member("t1", t1));
    let r = support::router(&config).await;

    // Two connections open at once land on different members; bytes round-trip on each,
    // several times, including a line far larger than a socket buffer.
    let mut a = support::raw_connect(r.addr("tcp")).await;
    let first = tcp_exchange(&mut a, "hello a").await;
    let mut b = support::raw_connect(r.addr("tcp")).await;
    let second = tcp_exchange(&mut b, "hello b").await;
    let (name_a, rest_a) = first.split_once(": ").expect("named reply");
    let (name_b, rest_b) = second.split_once(": ").expect("named reply");
    assert_eq!((rest_a, rest_b), ("hello a\n", "hello b\n"));
    let mut names = [name_a.to_owned(), name_b.to_owned()];
    names.sort();
    assert_eq!(names, ["t1", "t2"], "round-robin spreads two connections");
    let big: String = pattern(300 * 1024).iter().map(|b| char::from(b'a' + b % 26)).collect();
    for i in 0..5 {
        assert_eq!(tcp_exchange(&mut a, &format!("a{i}")).await, format!("{name_a}: a{i}\n"));
        assert_eq!(tcp_exchange(&mut b, &format!("b{i}")).await, format!("{name_b}: b{i}\n"));
    }
    assert_eq!(tcp_exchange(&mut a, &big).await, format!("{name_a}: {big}\n"));

    // A member that refuses is skipped: every connection still reaches the live one.
    for i in 0..4 {
        let mut c = support::raw_connect(r.addr("tcp-dead")).await;
        assert_eq!(tcp_exchange(&mut c, &format!("try {i}")).await, format!("t1: try {i}\n"));
    }
}

// ---------------------------------------------------------------------------------------------
// WebSocket
// ---------------------------------------------------------------------------------------------

/// SHA-1 (FIPS 180-4), for the WebSocket handshake.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes(word.try_into().expect("4 bytes"));
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t =
                a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(*wi);
            (e, d, c, b, a) = (d, c, b.rotate_left(30), a, t);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (o, x) in out.chunks_mut(4).zip(h) {
        o.copy_from_slice(&x.to_be_bytes());
    }
    out
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for group in data.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 section 4.2.2).
fn ws_accept(key: &str) -> String {
    base64(&sha1(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes()))
}

#[test]
fn websocket_accept_matches_rfc_6455_example() {
    assert_eq!(base64(b"hello"), "aGVsbG8=");
    assert_eq!(base64(b"hi!"), "aGkh");
    assert_eq!(base64(b"h"), "aA==");
    assert_eq!(ws_accept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

/// Writes one final frame (masked when `mask` is given, as a client must).
async fn ws_write<W: AsyncWrite + Unpin>(
    w: &mut W,
    opcode: u8,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) -> std::io::Result<()> {
    let mut frame = vec![0x80 | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => frame.push(m | n as u8),
        n if n <= 0xffff => {
            frame.push(m | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(m | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            frame.extend_from_slice(&key);
            frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => frame.extend_from_slice(payload),
    }
    w.write_all(&frame).await?;
    w.flush().await
}

/// Reads one frame (unfragmented): its opcode and unmasked payload.
async fn ws_read<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await?;
    let len = match head[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).await?;
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            r.read_exact(&mut b).await?;
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    if len > 16 * 1024 * 1024 {
        return Err(std::io::Error::other("frame too large for a test"));
    }
    let mut key = [0u8; 4];
    if head[1] & 0x80 != 0 {
        r.read_exact(&mut key).await?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await?;
    for (i, b) in payload.iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
    Ok((head[0] & 0x0f, payload))
}

/// A WebSocket echo member (HTTP/1.1 with upgrades): checks the handshake it receives, answers
/// 101, then echoes text and binary frames until a close frame, which it returns.
async fn websocket_member() -> SocketAddr {
    accept_loop(|stream| async move {
        let svc = service_fn(|mut req: Request<Incoming>| async move {
            let h = req.headers();
            let has = |name: &str, token: &str| {
                h.get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            };
            let key = h.get("sec-websocket-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let ok = has("upgrade", "websocket")
                && has("connection", "upgrade")
                && has("sec-websocket-version", "13");
            let Some(key) = key.filter(|_| ok) else {
                let mut resp =
                    Response::new(text_body(format!("not a websocket handshake: {h:?}")));
                *resp.status_mut() = StatusCode::BAD_REQUEST;
                return Ok::<_, Infallible>(resp);
            };
            let upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let Ok(upgraded) = upgrade.await else { return };
                let mut io = TokioIo::new(upgraded);
                for _ in 0..10_000 {
                    let Ok((opcode, payload)) = ws_read(&mut io).await else { return };
                    let reply = match opcode {
                        0x9 => 0xA,
                        0x1 | 0x2 | 0x8 => opcode,
                        _ => continue,
                    };
                    if ws_write(&mut io, reply, &payload, None).await.is_err() || opcode == 0x8 {
                        return;
                    }
                }
            });
            let mut resp = Response::new(text_body(Bytes::new()));
            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let hs = resp.headers_mut();
            hs.insert("upgrade", HeaderValue::from_static("websocket"));
            hs.insert("connection", HeaderValue::from_static("Upgrade"));
            hs.insert("sec-websocket-accept", HeaderValue::from_str(&ws_accept(&key)).unwrap());
            Ok(resp)
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), svc)
            .with_upgrades()
            .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_and_echo_through_the_router() {
    let ws = websocket_member().await;
    // A short route idle timeout: the upgraded connection must not be subject to it.
    let (listener, route) = ("header_read_timeout_ms = 300", "idle_timeout_ms = 300");
    let members = support::members_of([member("ws1", ws)]);
    let r = support::router(&support::web_config(listener, route, &members)).await;
    let mut conn = support::raw_connect(r.addr("web")).await;
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    support::raw_send(
        &mut conn,
        format!(
            "GET /chat HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let (status, headers) = support::read_head(&mut conn).await.expect("handshake answer");
    let header =
        |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.as_str());
    assert_eq!(status, 101, "{headers:?}");
    assert_eq!(header("sec-websocket-accept"), Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
    assert!(header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")), "{headers:?}");
    assert!(header("connection").is_some_and(|v| v.eq_ignore_ascii_case("upgrade")), "{headers:?}");

    let mask = Some([0x37, 0xfa, 0x21, 0x3d]);
    let mut exchange = async |opcode: u8, payload: &[u8]| {
        let fut = async {
            ws_write(conn.get_mut(), opcode, payload, mask).await.expect("send frame");
            ws_read(&mut conn).await.expect("echoed frame")
        };
        tokio::time::timeout(GUARD, fut).await.expect("echo within 10 s")
    };
    for i in 0..5 {
        let text = format!("message {i}");
        assert_eq!(exchange(0x1, text.as_bytes()).await, (0x1, text.into_bytes()));
    }
    // Idle for longer than the route's idle and header timeouts: the tunnel stays open.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(exchange(0x1, b"still there").await, (0x1, b"still there".to_vec()));
    let big = pattern(70_000);
    assert_eq!(exchange(0x2, &big).await, (0x2, big.clone()));
    assert_eq!(exchange(0x9, b"ping").await, (0xA, b"ping".to_vec()));
    assert_eq!(exchange(0x8, &[0x03, 0xe8]).await, (0x8, vec![0x03, 0xe8]));
    let (rest, closed) = support::read_until_closed(&mut conn, GUARD).await;
    assert!(closed && rest.is_empty(), "after the close handshake: {rest:?}, closed {closed}");
}

// ---------------------------------------------------------------------------------------------
// Header hygiene
// ---------------------------------------------------------------------------------------------

/// A member that leaks hop-by-hop headers in every response (raw HTTP/1.1, keep-alive).
async fn leaky_member() -> SocketAddr {
    accept_loop(|stream| async move {
        let mut conn = BufReader::new(stream);
        for _ in 0..1000 {
            // Read one request head (the router sends GETs without bodies here).
            for _ in 0..1000 {
                let mut line = String::new();
                match conn.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let resp = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: x-secret\r\n\
                        x-secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n\
                        x-end-to-end: kept\r\n\r\nleaky\n";
            if conn.get_mut().write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// The member's `/headers` answer as (name, value) pairs.
fn header_lines(body: &str) -> Vec<(String, String)> {
    body.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_hygiene_in_both_directions() {
    let ms = support::members(1, Duration::ZERO).await;
    let leaky = leaky_member().await;
    let config = [
        support::listener_table("web", ""),
        support::listener_table("trusted", "trust_forwarded_for = true"),
        support::route_table("leaky", "web", "leaky", "match = { path_prefix = \"/leaky\" }"),
        support::route_table("web", "web", "m", ""),
        support::route_table("trusted", "trusted", "m", ""),
        support::cluster_table("m", &support::members_of([member("m1", ms[0].addr)])),
        support::cluster_table("leaky", &support::members_of([member("leaky", leaky)])),
    ]
    .concat();
    let r = support::router(&config).await;
    let mut conn = support::raw_connect(r.addr("web")).await;

    // Request direction: hop-by-hop headers and those named in Connection go; Host stays;
    // a client's X-Forwarded-For is replaced; the forwarding headers and Via are added.
    let resp = support::raw_request(
        &mut conn,
        "GET /headers HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, x-private\r\n\
         Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: deflate\r\n\
         x-private: 1\r\nX-Forwarded-For: 6.6.6.6\r\nx-end-to-end: kept\r\n\r\n",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = header_lines(&resp.text());
    for gone in ["connection", "keep-alive", "proxy-connection", "te", "x-private", "upgrade"] {
        assert!(values(&seen, gone).is_empty(), "{gone} reached the member: {seen:?}");
    }
    assert_eq!(values(&seen, "host"), ["app.test"], "{seen:?}");
    assert_eq!(values(&seen, "x-end-to-end"), ["kept"], "{seen:?}");
    assert_eq!(values(&seen, "x-forwarded-for"), ["127.0.0.1"], "{seen:?}");
    assert_eq!(values(&seen, "x-forwarded-proto"), ["http"], "{seen:?}");
    assert_eq!(values(&seen, "x-forwarded-host"), ["app.test"], "{seen:?}");
    let via = values(&seen, "via");
    assert!(via.len() == 1 && via[0].contains("rondo"), "request Via: {via:?}");
    assert!(resp.header("via").is_some_and(|v| v.contains("rondo")), "{:?}", resp.headers);

    // TE: only `trailers` survives; an Upgrade without `Connection: upgrade` is dropped (and
    // the connection stays plain HTTP).
    let resp = support::raw_request(
        &mut conn,
        "GET /headers HTTP/1.1\r\nHost: app.test\r\nTE: trailers, deflate\r\n\r\n",
    )
    .await;
    assert_eq!(values(&header_lines(&resp.text()), "te"), ["trailers"], "{}", resp.text());
    let resp = support::raw_request(
        &mut conn,
        "GET /headers HTTP/1.1\r\nHost: app.test\r\nUpgrade: websocket\r\n\r\n",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = header_lines(&resp.text());
    assert!(values(&seen, "upgrade").is_empty(), "upgrade reached the member: {seen:?}");
    assert!(values(&seen, "connection").is_empty(), "connection reached the member: {seen:?}");

    // Response direction: what the member marked hop-by-hop does not reach the client.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let resp =
        support::raw_request(&mut conn, "GET /leaky HTTP/1.1\r\nHost: app.test\r\n\r\n").await;
    assert_eq!((resp.status, resp.text().as_str()), (200, "leaky\n"));
    for gone in ["x-secret", "keep-alive", "proxy-connection"] {
        assert!(resp.header(gone).is_none(), "{gone} reached the client: {:?}", resp.headers);
    }
    let connection = values(&resp.headers, "connection");
    assert!(
        connection.iter().all(|v| !v.to_ascii_lowercase().contains("x-secret")),
        "{:?}",
        resp.headers
    );
    assert_eq!(resp.header("x-end-to-end"), Some("kept"), "{:?}", resp.headers);
    assert!(resp.header("via").is_some_and(|v| v.contains("rondo")), "{:?}", resp.headers);

    // A listener that trusts X-Forwarded-For appends the client to it.
    let mut conn = support::raw_connect(r.addr("trusted")).await;
    let resp = support::raw_request(
        &mut conn,
        "GET /headers HTTP/1.1\r\nHost: app.test\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n",
    )
    .await;
    let seen = header_lines(&resp.text());
    assert_eq!(values(&seen, "x-forwarded-for"), ["6.6.6.6, 127.0.0.1"], "{seen:?}");
    // And without one, it is just the client.
    let resp =
        support::raw_request(&mut conn, "GET /headers HTTP/1.1\r\nHost: app.test\r\n\r\n").await;
    assert_eq!(values(&header_lines(&resp.text()), "x-forwarded-for"), ["127.0.0.1"]);
}

/// A member whose accept queue is full: connects to it hang (SYNs dropped) until they time out.
/// Returns its address, its listener (never accepted from) and the connections that fill it.
async fn hanging_member() -> (SocketAddr, TcpListener, Vec<TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let addr = socket.local_addr().expect("addr");
    let listener = socket.listen(1).expect("listen");
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => fillers.push(s),
            _ => break,
        }
    }
    (addr, listener, fillers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_retries_after_connect_timeouts_are_bounded_by_the_retry_budget() {
    let mut keep = Vec::new();
    let mut entries = Vec::new();
    for i in 1..=3 {
        let (addr, listener, fillers) = hanging_member().await;
        keep.push((listener, fillers));
        entries.push(member(&format!("h{i}"), addr));
    }
    // No ratio and a floor of one retry per second: across four connections placed within a
    // second, at most one retry; without the budget each would make all three tries.
    let cluster = format!(
        "algorithm = \"round-robin\"\nupstream_protocol = \"tcp\"\n\
         retry = {{ attempts = 3, per_try_timeout_ms = 100, budget_percent = 0, budget_min_per_sec = 1 }}\n\
         outlier = {{ consecutive_failures = 1000 }}\nmembers = [{}]",
        entries.join(", ")
    );
    let r = support::router(&support::pipeline("tcp", "protocol = \"tcp\"", "", &cluster)).await;
    for _ in 0..4 {
        let mut conn = support::raw_connect(r.addr("tcp")).await;
        // The router closes the connection when no member takes it.
        let (_, closed) = support::read_until_closed(&mut conn, GUARD).await;
        assert!(closed, "the router kept a connection no member took");
    }
    let rt = r.live.load().clusters["tcp"].clone();
    let tries: u32 = rt.with(|b| b.states().iter().map(|s| s.load.consecutive_failures).sum());
    assert!(
        (4..=5).contains(&tries),
        "{tries} connect tries for 4 connections (12 without the budget)"
    );
    drop(keep);
}
