//! The client library (`rondo-client`) against real processes: `rondo serve` as the naming
//! service and `rondo member` processes (or in-process gRPC members) as the service's members.
//! A member killed under load costs no call; a dead bootstrap endpoint is skipped; a member
//! registered later gets calls once the watch fires; gRPC goes through the tower layer.

mod common;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use common::{Proc, TempDir, free_port, start_member};
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rondo_client::wire::Register;
use rondo_client::{Client, Failed, NamingClient, SlotBody};
use tower::{Layer, Service};

/// `rondo serve` with `[naming]` over cluster `c` of `members` (`(name, address)`), with
/// `cluster_extra` added to the cluster table; returns it with the naming API's address.
fn start_naming(
    dir: &TempDir,
    members: &[(&str, String)],
    cluster_extra: &str,
) -> (Proc, SocketAddr) {
    let list = members
        .iter()
        .map(|(n, a)| format!("{{ name = \"{n}\", address = \"{a}\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let path = dir.0.join(format!("rondo-{}.toml", free_port()));
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
             [cluster.c]\nmembers = [{list}]\n{cluster_extra}\n\n\
             [naming]\nlisten = \"127.0.0.1:0\"\n"
        ),
    )
    .expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    // `rondo: naming API (registry embedded) on 127.0.0.1:PORT`: the first address on the line.
    let line = p.line_with("naming API", Duration::from_secs(10));
    let addr = line
        .split_whitespace()
        .find_map(|w| w.trim_matches(|c| c == '(' || c == ')' || c == ',').parse().ok())
        .unwrap_or_else(|| panic!("no naming address in {line:?}"));
    (p, addr)
}

/// An HTTP/1.1 client for the tower layer.
fn http1() -> HttpClient<HttpConnector, SlotBody<Empty<Bytes>>> {
    HttpClient::builder(TokioExecutor::new()).build_http()
}

/// `GET /` through the balanced service: the member's name.
async fn get_name<S>(svc: &mut S) -> Result<String, rondo_client::BoxError>
where
    S: Service<
            Request<Empty<Bytes>>,
            Response = Response<rondo_client::Tracked<Incoming>>,
            Error = rondo_client::BoxError,
        >,
{
    let req = Request::get("http://c/").body(Empty::new())?;
    let resp = svc.call(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&body).trim().to_owned();
    if !status.is_success() {
        return Err(format!("status {status}: {text}").into());
    }
    Ok(text)
}

/// `GET /` with a plain hyper client inside [`Client::call`].
async fn call_name(
    client: &Client,
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
) -> Result<String, String> {
    client
        .call(|member| {
            let http = http.clone();
            async move {
                let uri = format!("http://{}/", member.addr());
                let resp = http
                    .get(uri.parse().expect("uri"))
                    .await
                    .map_err(|e| Failed::classify(e).map(|e| e.to_string()))?;
                let body =
                    resp.into_body().collect().await.map_err(|e| Failed::Member(e.to_string()))?;
                let body = body.to_bytes();
                Ok(String::from_utf8_lossy(&body).trim().to_owned())
            }
        })
        .await
        .map_err(|e| e.to_string())
}

fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_killed_under_load_costs_no_call() {
    let dir = TempDir::new("client");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (mut m2, a2) = start_member("m2", "127.0.0.1:0");
    let (_m3, a3) = start_member("m3", "127.0.0.1:0");
    let members = [("m1", a1.to_string()), ("m2", a2.to_string()), ("m3", a3.to_string())];
    let (_naming, naming) =
        start_naming(&dir, &members, "retry = { attempts = 3, per_try_timeout_ms = 2000 }");
    let client =
        Client::builder("c").endpoint(naming.to_string()).seed(1).connect().await.expect("connect");
    assert_eq!(client.members().len(), 3);

    const TASKS: usize = 4;
    const CALLS: usize = 150;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut svc = client.layer().layer(http1());
            let plain: HttpClient<HttpConnector, Empty<Bytes>> =
                HttpClient::builder(TokioExecutor::new()).build_http();
            let mut names = Vec::new();
            let mut failures = Vec::new();
            for _ in 0..CALLS {
                // Half the tasks use the tower layer, half the closure API.
                let r = if t % 2 == 0 {
                    get_name(&mut svc).await.map_err(|e| e.to_string())
                } else {
                    call_name(&client, &plain).await
                };
                match r {
                    Ok(n) => names.push(n),
                    Err(e) => failures.push(e),
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (names, failures)
        }));
    }
    // Kill m2 a quarter of the way through.
    while done.load(std::sync::atomic::Ordering::Relaxed) < TASKS * CALLS / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    m2.kill();
    let killed_at = done.load(std::sync::atomic::Ordering::Relaxed);

    let mut names = Vec::new();
    let mut failures = Vec::new();
    for t in tasks {
        let (n, f) = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("load finished in time")
            .expect("task");
        names.extend(n);
        failures.extend(f);
    }
    assert!(failures.is_empty(), "{} failed calls: {failures:?}", failures.len());
    assert_eq!(names.len(), TASKS * CALLS);
    assert!(count(&names, "m2") > 0, "m2 served before it was killed");
    assert!(count(&names, "m2") <= killed_at + TASKS, "m2 served after it was killed");
    assert_eq!(count(&names, "m1") + count(&names, "m2") + count(&names, "m3"), names.len());
    assert!(count(&names, "m1") > TASKS * CALLS / 4, "{}", count(&names, "m1"));
    assert!(count(&names, "m3") > TASKS * CALLS / 4, "{}", count(&names, "m3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_bootstrap_endpoint_is_skipped() {
    let dir = TempDir::new("client");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_naming, naming) = start_naming(&dir, &[("m1", a1.to_string())], "");
    let dead = format!("127.0.0.1:{}", free_port());
    let client = Client::builder("c")
        .endpoint(dead.clone())
        .endpoint(format!("http://{naming}"))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .connect()
        .await
        .expect("the live endpoint answers");
    assert_eq!(client.endpoint(), format!("http://{naming}"));
    assert_eq!(client.members()[0].name, "m1");
    let http = HttpClient::builder(TokioExecutor::new()).build_http();
    for _ in 0..5 {
        assert_eq!(call_name(&client, &http).await.as_deref(), Ok("m1"));
    }

    // With every endpoint dead, bootstrap fails naming each one.
    let err = Client::builder("c")
        .endpoint(dead.clone())
        .endpoint(dead.clone())
        .connect()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(text.matches(&dead).count(), 2, "{text}");
    // An unknown service is an error too.
    let err = Client::builder("nope").endpoint(naming.to_string()).connect().await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_registered_later_gets_calls_once_the_watch_fires() {
    let dir = TempDir::new("client");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let (_naming, naming) = start_naming(&dir, &[("m1", a1.to_string())], "");
    // A long watch: the change must end it early, not a poll interval.
    let client = Client::builder("c")
        .endpoint(naming.to_string())
        .watch_wait(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect");
    let before = client.view_id();
    let mut svc = client.layer().layer(http1());
    for _ in 0..4 {
        assert_eq!(get_name(&mut svc).await.expect("call"), "m1");
    }

    let api = NamingClient::new(&naming.to_string(), Duration::from_secs(2)).expect("endpoint");
    let register =
        Register { address: a2.to_string(), weight: None, group: None, ttl_ms: Some(30_000) };
    let lease = api.register("c", "m2", &register).await.expect("register");
    assert!(!lease.lease.is_empty());
    tokio::time::timeout(Duration::from_secs(5), client.wait_for_view(before + 1))
        .await
        .expect("the watch brought the new view");
    assert!(client.members().iter().any(|m| m.name == "m2"), "{:?}", client.members());

    let mut names = Vec::new();
    for _ in 0..10 {
        names.push(get_name(&mut svc).await.expect("call"));
    }
    assert_eq!(count(&names, "m2"), 5, "round robin over m1 and m2: {names:?}");
    assert_eq!(count(&names, "m1"), 5, "{names:?}");

    // Deregistered: gone from the client's answer again, and no call reaches it.
    let view = client.view_id();
    api.deregister("c", "m2").await.expect("deregister");
    tokio::time::timeout(Duration::from_secs(5), client.wait_for_view(view + 1))
        .await
        .expect("the watch brought the removal");
    for _ in 0..4 {
        assert_eq!(get_name(&mut svc).await.expect("call"), "m1");
    }
}

/// Polls (every 50 ms, at most `limit`) until the client's member list is `want`.
async fn until_members(client: &Client, want: &[&str], limit: Duration) {
    let start = std::time::Instant::now();
    loop {
        let mut got: Vec<String> = client.members().into_iter().map(|m| m.name).collect();
        got.sort();
        if got == want {
            return;
        }
        assert!(start.elapsed() < limit, "client lists {got:?} after {limit:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// Regression: health, drain and agent changes did not move the view id, so a client never
// learned that a member went down, nor that it came back (it stayed out of the client's list
// until some unrelated change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_by_health_checks_leaves_the_client_and_comes_back() {
    let dir = TempDir::new("client");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (mut m2, a2) = start_member("m2", "127.0.0.1:0");
    let health =
        "health = { kind = \"tcp\", interval_ms = 100, timeout_ms = 200, rise = 1, fall = 1 }";
    let (_naming, naming) =
        start_naming(&dir, &[("m1", a1.to_string()), ("m2", a2.to_string())], health);
    let client = Client::builder("c")
        .endpoint(naming.to_string())
        .watch_wait(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect");
    until_members(&client, &["m1", "m2"], Duration::from_secs(5)).await;
    m2.kill();
    until_members(&client, &["m1"], Duration::from_secs(5)).await;
    let mut svc = client.layer().layer(http1());
    for _ in 0..4 {
        assert_eq!(get_name(&mut svc).await.expect("call"), "m1");
    }
    // Back on the same address: the health check brings it up, the client learns it.
    let (_m2, _) = start_member("m2", &a2.to_string());
    until_members(&client, &["m1", "m2"], Duration::from_secs(5)).await;
    let mut names = Vec::new();
    for _ in 0..6 {
        names.push(get_name(&mut svc).await.expect("call"));
    }
    assert_eq!(count(&names, "m2"), 3, "{names:?}");
}

// ---- gRPC -----------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
struct HelloRequest {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HelloReply {
    #[prost(string, tag = "1")]
    message: String,
}

/// A fixed list of frames (data, then trailers).
struct Frames(VecDeque<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A gRPC member over HTTP/2 (prior knowledge) answering `/test.Greeter/Hello` with
/// `hello NAME from MEMBER` and `grpc-status: 0` in the trailers.
async fn grpc_member(
    member: &'static str,
    served: Arc<Mutex<HashMap<&'static str, usize>>>,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let served = served.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let served = served.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/test.Greeter/Hello");
                        let mut body =
                            req.into_body().collect().await.expect("request body").to_bytes();
                        // The length-prefixed message: 1 byte flag, 4 bytes length.
                        assert_eq!(body.get_u8(), 0, "uncompressed");
                        let len = body.get_u32() as usize;
                        let hello =
                            <HelloRequest as prost::Message>::decode(&body[..len]).expect("decode");
                        *served.lock().unwrap().entry(member).or_default() += 1;
                        let reply =
                            HelloReply { message: format!("hello {} from {member}", hello.name) };
                        let encoded = prost::Message::encode_to_vec(&reply);
                        let mut frame = BytesMut::with_capacity(5 + encoded.len());
                        frame.put_u8(0);
                        frame.put_u32(encoded.len() as u32);
                        frame.put_slice(&encoded);
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let frames = Frames(VecDeque::from([
                            Frame::data(frame.freeze()),
                            Frame::trailers(trailers),
                        ]));
                        let resp = Response::builder()
                            .header("content-type", "application/grpc")
                            .body(frames)
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_goes_through_the_tower_layer_and_skips_a_dead_member() {
    let dir = TempDir::new("client");
    let served = Arc::new(Mutex::new(HashMap::new()));
    let g1 = grpc_member("g1", served.clone()).await;
    let g2 = grpc_member("g2", served.clone()).await;
    let dead = format!("127.0.0.1:{}", free_port());
    let members = [("dead", dead), ("g1", g1.to_string()), ("g2", g2.to_string())];
    let (_naming, naming) = start_naming(&dir, &members, "");
    let client =
        Client::builder("c").endpoint(naming.to_string()).connect().await.expect("connect");

    let transport: HttpClient<HttpConnector, SlotBody<tonic::body::Body>> =
        HttpClient::builder(TokioExecutor::new()).http2_only(true).build_http();
    let mut grpc = tonic::client::Grpc::new(client.layer().layer(transport));
    let path = http::uri::PathAndQuery::from_static("/test.Greeter/Hello");
    let mut from = Vec::new();
    for i in 0..12 {
        grpc.ready().await.expect("ready");
        let request = tonic::Request::new(HelloRequest { name: format!("caller{i}") });
        let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
        let reply = grpc.unary(request, path.clone(), codec).await.expect("gRPC call");
        let message = reply.into_inner().message;
        assert!(message.starts_with(&format!("hello caller{i} from g")), "{message}");
        from.push(message.rsplit(' ').next().unwrap().to_owned());
    }
    // Every call answered, by the two live members only (a POST whose body the dead member
    // never read goes to the next one).
    let served = served.lock().unwrap().clone();
    assert_eq!(served.values().sum::<usize>(), 12, "{served:?}");
    assert!(served.get("g1").copied().unwrap_or(0) >= 4, "{served:?}");
    assert!(served.get("g2").copied().unwrap_or(0) >= 4, "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_moves_to_the_next_endpoint_when_one_dies() {
    let dir = TempDir::new("client");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let (mut first, naming1) = start_naming(&dir, &[("m1", a1.to_string())], "");
    let (_second, naming2) = start_naming(&dir, &[("m1", a1.to_string())], "");
    let client = Client::builder("c")
        .endpoint(naming1.to_string())
        .endpoint(naming2.to_string())
        .watch_wait(Duration::from_secs(60))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    assert_eq!(client.endpoint(), format!("http://{naming1}"));

    // The endpoint in use dies in the middle of a watch; the second one gets a registration.
    first.kill();
    let api = NamingClient::new(&naming2.to_string(), Duration::from_secs(2)).expect("endpoint");
    let register =
        Register { address: a2.to_string(), weight: None, group: None, ttl_ms: Some(30_000) };
    api.register("c", "m2", &register).await.expect("register");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !client.members().iter().any(|m| m.name == "m2") {
        assert!(tokio::time::Instant::now() < deadline, "no m2 after 5 s: {:?}", client.members());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.endpoint(), format!("http://{naming2}"));
    let mut svc = client.layer().layer(http1());
    let mut names = Vec::new();
    for _ in 0..6 {
        names.push(get_name(&mut svc).await.expect("call"));
    }
    assert_eq!(count(&names, "m2"), 3, "{names:?}");
}

/// `rondo member` processes by name.
fn members(names: &[&'static str]) -> (HashMap<&'static str, Proc>, Vec<(&'static str, String)>) {
    let mut procs = HashMap::new();
    let mut list = Vec::new();
    for name in names {
        let (p, a) = start_member(name, "127.0.0.1:0");
        procs.insert(*name, p);
        list.push((*name, a.to_string()));
    }
    (procs, list)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_the_body_was_sent_retries_a_get_but_not_a_post() {
    let dir = TempDir::new("client");
    let (mut procs, list) = members(&["m1", "m2", "m3"]);
    let (_naming, naming) = start_naming(&dir, &list, "");
    let client =
        Client::builder("c").endpoint(naming.to_string()).connect().await.expect("connect");
    type Body = http_body_util::Full<Bytes>;
    let http = || -> HttpClient<HttpConnector, SlotBody<Body>> {
        HttpClient::builder(TokioExecutor::new()).build_http()
    };
    let send = |svc: &mut rondo_client::Balanced<HttpClient<HttpConnector, SlotBody<Body>>>,
                method: http::Method,
                path: &str| {
        // Only the POST has a body (a GET's body would be consumed and stop the retry).
        let body = if method == http::Method::POST { &b"order"[..] } else { &b""[..] };
        let req = Request::builder()
            .method(method)
            .uri(format!("http://c{path}"))
            .body(Body::new(Bytes::from_static(body)))
            .expect("request");
        svc.call(req)
    };
    let text = |resp: Response<rondo_client::Tracked<Incoming>>| async move {
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8_lossy(&body).trim().to_owned()
    };

    // A session pins its member; a slow POST there dies with the member after it was sent.
    let session = client.session();
    let mut svc = session.layer().layer(http());
    let pinned = text(send(&mut svc, http::Method::GET, "/").await.expect("first call")).await;
    let post = tokio::spawn(send(&mut svc, http::Method::POST, "/slow/5000"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    procs.get_mut(pinned.as_str()).expect("pinned member").kill();
    let err = post.await.expect("task").expect_err("the POST is not sent twice");
    let err = err.downcast::<rondo_client::BalancedError>().expect("a call error");
    assert!(err.is_not_retryable(), "{err}");
    assert_eq!(err.attempts().len(), 1, "{err}");
    let attempt = err.attempts().next().expect("one attempt");
    assert_eq!(attempt.member(), Some(pinned.as_str()), "{err}");

    // The same with a GET: it goes to another member and the caller never sees the reset.
    let session = client.session();
    let mut svc = session.layer().layer(http());
    let pinned2 = text(send(&mut svc, http::Method::GET, "/").await.expect("first call")).await;
    assert_ne!(pinned2, pinned, "a dead member keeps no session");
    let get = tokio::spawn(send(&mut svc, http::Method::GET, "/slow/1000"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    procs.get_mut(pinned2.as_str()).expect("pinned member").kill();
    let resp = get.await.expect("task").expect("the GET went to the last member");
    let survivor = text(resp).await;
    assert!(survivor != pinned && survivor != pinned2, "{survivor}");
    assert_eq!(session.member().as_deref(), Some(survivor.as_str()), "the session moved");
}

/// `rondo serve` on `config`; the address its line `rondo: listener NAME on` names.
fn serve_listener(config: &std::path::Path, listener: &str) -> (Proc, SocketAddr) {
    let mut p = Proc::start(&["serve", "--config", config.to_str().unwrap(), "--workers", "1"]);
    let addr = p.addr_after(&format!("rondo: listener {listener} on"));
    p.line_with("rondo: reloading on changes", Duration::from_secs(10));
    (p, addr)
}

/// A gRPC channel held on one HTTP/2 connection calls through a front router whose cluster's
/// one member is a back router's `tcp` listener (a connection-level balancer over gRPC
/// members, least sessions first); `g2` joins the back router's members a third of the way in.
/// Who answered the calls of the last third.
async fn grpc_answers_after_a_member_joins(dir: &TempDir, cluster_extra: &str) -> Vec<String> {
    let served = Arc::new(Mutex::new(HashMap::new()));
    let (g1, g2) = (grpc_member("g1", served.clone()).await, grpc_member("g2", served).await);
    let back_config = |members: &str| {
        format!(
            "[[listener]]\nname = \"svc\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
             [[route]]\nlistener = \"svc\"\ncluster = \"pods\"\n\n\
             [cluster.pods]\nalgorithm = \"least-sessions\"\nupstream_protocol = \"tcp\"\n\
             members = [{members}]\n"
        )
    };
    let back_path = dir.0.join(format!("back-{}.toml", free_port()));
    std::fs::write(&back_path, back_config(&format!("{{ name = \"g1\", address = \"{g1}\" }}")))
        .unwrap();
    let (_back, svc) = serve_listener(&back_path, "svc");
    let front_path = dir.0.join(format!("front-{}.toml", free_port()));
    std::fs::write(
        &front_path,
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"api\"\n\n\
             [cluster.api]\nupstream_protocol = \"http2\"\n{cluster_extra}\n\
             members = [{{ name = \"svc\", address = \"{svc}\" }}]\n"
        ),
    )
    .unwrap();
    let (_front, web) = serve_listener(&front_path, "web");

    let transport: HttpClient<HttpConnector, tonic::body::Body> =
        HttpClient::builder(TokioExecutor::new()).http2_only(true).build_http();
    let origin: http::Uri = format!("http://{web}").parse().unwrap();
    let mut grpc = tonic::client::Grpc::with_origin(transport, origin);
    let path = http::uri::PathAndQuery::from_static("/test.Greeter/Hello");
    let (run, started) = (Duration::from_millis(3600), std::time::Instant::now());
    let (mut joined, mut late) = (false, Vec::new());
    while started.elapsed() < run {
        if !joined && started.elapsed() >= run / 3 {
            let both = format!(
                "{{ name = \"g1\", address = \"{g1}\" }}, {{ name = \"g2\", address = \"{g2}\" }}"
            );
            std::fs::write(&back_path, back_config(&both)).unwrap();
            joined = true;
        }
        grpc.ready().await.expect("ready");
        let request = tonic::Request::new(HelloRequest { name: "caller".to_owned() });
        let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
        let reply = grpc.unary(request, path.clone(), codec).await.expect("gRPC call");
        if started.elapsed() >= run * 2 / 3 {
            late.push(reply.into_inner().message.rsplit(' ').next().unwrap().to_owned());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    late
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_member_that_joins_behind_a_connection_balancer_gets_calls_within_the_age() {
    let dir = TempDir::new("client");
    // Without a limit, the front router's one HTTP/2 connection stays on g1.
    let late = grpc_answers_after_a_member_joins(&dir, "").await;
    assert!(!late.is_empty() && late.iter().all(|m| m == "g1"), "{late:?}");
    // With max_connection_age_ms = 300 the front router opens a new connection within the age;
    // the back router puts it on g2, which has none.
    let late = grpc_answers_after_a_member_joins(&dir, "max_connection_age_ms = 300").await;
    assert!(late.iter().any(|m| m == "g2"), "g2 got no call: {late:?}");
}
