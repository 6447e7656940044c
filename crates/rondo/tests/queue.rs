//! Queued routing end to end: real `rondo serve` processes with `queue` listeners and embedded
//! stores, and members in this test process that log every message id they are sent
//! (`Idempotency-Key`). What the tests show: nothing accepted is lost across `kill -9`
//! (duplicates are counted and reported), messages wait while every member is down and then go
//! in order per session key, a poison message reaches the dead-letter queue with its tries and
//! is delivered once requeued, and the limits answer 413 and 503 with `Retry-After`, and a
//! damaged store file stops the start naming the file.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{BIN, Proc, TempDir, free_port};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

const TOKEN: &str = "queue-test-token-0123456789";

/// One request a test member received.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    attempt: u32,
    session: Option<String>,
    body: String,
    answered: u16,
    /// Every header field, lower-case names.
    headers: Vec<(String, String)>,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// What a test member saw, and how it answers.
#[derive(Debug, Default)]
struct SinkState {
    got: Mutex<Vec<Got>>,
    /// Requests that arrived (before their answer).
    arrived: AtomicU64,
    /// The status it answers.
    status: AtomicU16,
    /// How long it waits before answering.
    delay_ms: AtomicU64,
    /// Requests per session key in progress; `overlap` when one key ever had two.
    in_progress: Mutex<HashMap<String, u32>>,
    overlap: AtomicBool,
}

impl SinkState {
    fn new(status: u16, delay_ms: u64) -> Arc<SinkState> {
        let s = SinkState::default();
        s.status.store(status, Ordering::Relaxed);
        s.delay_ms.store(delay_ms, Ordering::Relaxed);
        Arc::new(s)
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// The ids answered 2xx.
    fn delivered(&self) -> Vec<String> {
        self.got().into_iter().filter(|g| g.answered < 300).map(|g| g.id).collect()
    }
}

/// A member on `addr` answering from `state`, until dropped (its connections close with it).
struct Sink(tokio::task::JoinHandle<()>);

impl Drop for Sink {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Ports of members that come up later in a test, bound at once without listening (a
/// connection to them is refused, as to a member that is down) and listened on by [`sink`].
/// Without the reservation another process could take the port meanwhile (the routers' own
/// connections draw from the same range), and the member could not come up.
static RESERVED: Mutex<Vec<(SocketAddr, tokio::net::TcpSocket)>> = Mutex::new(Vec::new());

/// A free loopback address for a member, reserved until [`sink`] listens on it.
fn member_addr() -> SocketAddr {
    loop {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        if socket.bind(addr).is_ok() {
            RESERVED.lock().unwrap().push((addr, socket));
            return addr;
        }
    }
}

/// A listener on `addr`: on its reserved socket ([`member_addr`]), or bound anew.
async fn listen_on(addr: SocketAddr) -> tokio::net::TcpListener {
    let reserved = {
        let mut r = RESERVED.lock().unwrap();
        r.iter().position(|(a, _)| *a == addr).map(|i| r.swap_remove(i).1)
    };
    match reserved {
        Some(socket) => socket.listen(1024).expect("listen on the reserved port"),
        None => tokio::net::TcpListener::bind(addr).await.expect("bind the test member"),
    }
}

async fn sink(addr: SocketAddr, state: Arc<SinkState>) -> Sink {
    let listener = listen_on(addr).await;
    Sink(tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let state = state.clone();
            conns.spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(req, state.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<SinkState>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    state.arrived.fetch_add(1, Ordering::Relaxed);
    let h = req.headers();
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let id = text("idempotency-key").unwrap_or_default();
    let attempt = text("x-rondo-attempt").and_then(|a| a.parse().ok()).unwrap_or(0);
    let session = text("x-session");
    let headers = h
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    if let Some(s) = &session {
        let mut m = state.in_progress.lock().unwrap();
        let n = m.entry(s.clone()).or_default();
        *n += 1;
        if *n > 1 {
            state.overlap.store(true, Ordering::Relaxed);
        }
    }
    let delay = state.delay_ms.load(Ordering::Relaxed);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if let Some(s) = &session {
        *state.in_progress.lock().unwrap().get_mut(s).unwrap() -= 1;
    }
    let status = state.status.load(Ordering::Relaxed);
    state.got.lock().unwrap().push(Got {
        id,
        attempt,
        session,
        body: String::from_utf8_lossy(&body).into_owned(),
        answered: status,
        headers,
    });
    let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    Ok(r)
}

/// A `rondo serve` of `config` (written to `dir`), its stderr kept in `dir/stderr`.
fn serve(dir: &TempDir, config: &str) -> Proc {
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config).expect("write config");
    let stderr = std::fs::File::create(dir.0.join("stderr")).expect("stderr file");
    let child = Command::new(BIN)
        .arg("serve")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start rondo serve");
    Proc::from_child(child)
}

/// The config: queue listener `in`, route to cluster `c` (one member at `member`), queue
/// `orders` in `dir/store` with `queue` extra keys, and an admin API.
fn config(dir: &TempDir, member: SocketAddr, queue: &str) -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"
token = "{TOKEN}"

[[listener]]
name = "in"
listen = "127.0.0.1:0"
protocol = "queue"

[[route]]
listener = "in"
cluster = "c"

[cluster.c]
members = [{{ name = "m1", address = "{member}" }}]
outlier = {{ count_5xx = false }}

[[queue]]
name = "orders"
directory = "{}"
{queue}
"#,
        dir.0.join("store").display()
    )
}

struct Router {
    proc: Proc,
    intake: SocketAddr,
    admin: SocketAddr,
}

fn start_router(dir: &TempDir, config: &str) -> Router {
    let mut proc = serve(dir, config);
    // In the order `rondo serve` prints them: the admin API before the queues.
    let admin = proc.addr_after("rondo: admin API on ");
    let intake = proc.addr_after("rondo: queue listener in on ");
    Router { proc, intake, admin }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// `POST /queues/orders` with `body` and header fields: status, header fields and body.
async fn post(
    c: &Client<HttpConnector, Full<Bytes>>,
    at: SocketAddr,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, String) {
    let mut req = Request::post(format!("http://{at}/queues/orders"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = c.request(req.body(Full::new(body.into())).unwrap()).await.expect("post");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("answer").to_bytes();
    (parts.status, parts.headers, String::from_utf8_lossy(&body).into_owned())
}

/// The id of a 202's JSON answer.
fn id_of(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("JSON answer");
    v["id"].as_str().expect("id").to_owned()
}

/// One admin API call: status and JSON.
async fn admin(
    c: &Client<HttpConnector, Full<Bytes>>,
    at: SocketAddr,
    method: &str,
    path: &str,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{at}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = c.request(req).await.expect("admin call");
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("answer").to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Runs `rondo serve` on `config` (written to `dir`), which must fail (`why`): its stderr.
#[track_caller]
fn refused_start(dir: &TempDir, config: &str, why: &str) -> String {
    std::fs::write(dir.0.join("rondo.toml"), config).unwrap();
    let out = Command::new(BIN)
        .arg("serve")
        .arg(dir.0.join("rondo.toml"))
        .stdin(Stdio::null())
        .output()
        .expect("rondo serve");
    assert!(!out.status.success(), "{why}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Waits up to `wait` for `done`, polling every 50 ms.
async fn until(wait: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

/// Asserts the member got each session's messages (bodies: their numbers) in the order they
/// were `sent`, and never two of one session at once.
#[track_caller]
fn assert_in_order_per_session(state: &SinkState, sent: &HashMap<String, Vec<u32>>) {
    let mut by_session: HashMap<String, Vec<u32>> = HashMap::new();
    for g in state.got().into_iter().filter(|g| g.answered < 300) {
        by_session.entry(g.session.unwrap()).or_default().push(g.body.parse().unwrap());
    }
    assert_eq!(&by_session, sent, "each session's messages in the order they were accepted");
    assert!(!state.overlap.load(Ordering::Relaxed), "one message of a session at a time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_1000_accepted_undelivered_messages_loses_none() {
    let dir = TempDir::new("queue-kill");
    let member = member_addr();
    let cfg = config(
        &dir,
        member,
        "max_attempts = 1000\nbackoff_initial_ms = 20\nbackoff_max_ms = 200\nconcurrency = 32",
    );
    let mut router = start_router(&dir, &cfg);
    let c = client();
    // The member is down: every message is accepted and none can be delivered.
    let mut tasks = tokio::task::JoinSet::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    for i in 0..1000 {
        let (c, at, gate) = (c.clone(), router.intake, gate.clone());
        tasks.spawn(async move {
            let _p = gate.acquire_owned().await.unwrap();
            let (status, _, body) =
                post(&c, at, format!("message {i} {}", "x".repeat(1000)), &[]).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{body}");
            id_of(&body)
        });
    }
    let mut accepted = HashSet::new();
    while let Some(id) = tasks.join_next().await {
        accepted.insert(id.expect("post task"));
    }
    assert_eq!(accepted.len(), 1000, "1000 distinct ids");
    let (_, q) = admin(&c, router.admin, "GET", "/api/v1/queues").await;
    assert_eq!(q["queues"][0]["depth"], 1000, "{q}");
    assert_eq!(q["queues"][0]["delivered"], 0, "{q}");

    // The member comes up, slow: some messages reach it and are answered, some are in
    // delivery, and then the router dies with them.
    let state = SinkState::new(200, 300);
    let _sink = sink(member, state.clone()).await;
    let arrived =
        until(Duration::from_secs(30), || state.arrived.load(Ordering::Relaxed) >= 100).await;
    assert!(arrived, "deliveries began");
    router.proc.kill();
    let before_kill = state.delivered().len();

    let router = start_router(&dir, &cfg);
    let all = until(Duration::from_secs(90), || {
        let got: HashSet<String> = state.delivered().into_iter().collect();
        accepted.iter().all(|id| got.contains(id))
    })
    .await;
    let delivered = state.delivered();
    let unique: HashSet<&String> = delivered.iter().collect();
    let lost: Vec<&String> = accepted.iter().filter(|id| !unique.contains(id)).collect();
    let duplicates = delivered.len() - unique.len();
    eprintln!(
        "kill -9 with 1000 accepted: {} answered 2xx before the kill, {} lost, {duplicates} \
         duplicates (delivered again after the restart)",
        before_kill,
        lost.len()
    );
    assert!(
        all && lost.is_empty(),
        "lost {} accepted messages: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(unique.iter().all(|id| accepted.contains(*id)), "only accepted ids are delivered");
    // The queue is empty once every message is delivered and recorded.
    let empty = async {
        for _ in 0..100 {
            let (_, q) = admin(&c, router.admin, "GET", "/api/v1/queues").await;
            if q["queues"][0]["depth"] == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(empty.await, "the queue drains");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_down_10s_then_every_message_in_order_per_session_key() {
    let dir = TempDir::new("queue-down");
    let member = member_addr();
    let cfg = config(
        &dir,
        member,
        "session_header = \"x-session\"\nbackoff_initial_ms = 100\nbackoff_max_ms = 1000\n\
         max_attempts = 100\nconcurrency = 8",
    );
    let router = start_router(&dir, &cfg);
    let c = client();
    let mut sent: HashMap<String, Vec<u32>> = HashMap::new();
    for i in 0..60u32 {
        let session = format!("s{}", i % 3);
        let (status, _, body) =
            post(&c, router.intake, i.to_string(), &[("x-session", &session)]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        sent.entry(session).or_default().push(i);
    }
    // Every member down for 10 s: the messages wait.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_, q) = admin(&c, router.admin, "GET", "/api/v1/queues").await;
    assert_eq!(q["queues"][0]["depth"], 60, "{q}");
    assert_eq!(q["queues"][0]["dead_letters"], 0, "{q}");
    assert!(q["queues"][0]["oldest_age_ms"].as_u64().unwrap() >= 10_000, "{q}");

    let state = SinkState::new(200, 10);
    let _sink = sink(member, state.clone()).await;
    let all = until(Duration::from_secs(30), || state.delivered().len() >= 60).await;
    assert!(all, "delivered {} of 60", state.delivered().len());
    assert_in_order_per_session(&state, &sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_with_its_tries_and_requeue_delivers_it() {
    let dir = TempDir::new("queue-poison");
    let member = member_addr();
    let state = SinkState::new(500, 0);
    let _sink = sink(member, state.clone()).await;
    let cfg = config(&dir, member, "max_attempts = 3\nbackoff_initial_ms = 50");
    let router = start_router(&dir, &cfg);
    let c = client();
    let (status, headers, body) = post(&c, router.intake, "poison", &[("x-kind", "bad")]).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = id_of(&body);
    assert_eq!(headers["x-rondo-message-id"], id.as_str());

    let path = "/api/v1/queues/orders/dead";
    let mut dead = Value::Null;
    for _ in 0..100 {
        let (s, v) = admin(&c, router.admin, "GET", path).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if !v["dead_letters"].as_array().unwrap().is_empty() {
            dead = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead["dead_letters"][0]["id"], id.as_str(), "{dead}");
    assert_eq!(dead["dead_letters"][0]["attempts"], 3, "{dead}");
    let tried: Vec<u32> = state.got().iter().map(|g| g.attempt).collect();
    assert_eq!(tried, [1, 2, 3], "three attempts, numbered");

    let (s, one) = admin(&c, router.admin, "GET", &format!("{path}/{id}")).await;
    assert_eq!(s, StatusCode::OK);
    let tries = one["tries"].as_array().unwrap();
    assert_eq!(tries.len(), 3, "{one}");
    for (i, t) in tries.iter().enumerate() {
        assert_eq!(t["attempt"], i as u64 + 1);
        assert!(t["reason"].as_str().unwrap().contains("c/m1: answered 500"), "{t}");
    }
    assert_eq!(one["body"], "poison");
    assert!(one["headers"].as_array().unwrap().iter().any(|h| h[0] == "x-kind" && h[1] == "bad"));

    // `rondo ctl` shows the same, and requeues it once the member is fixed.
    let ctl = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["ctl", "--admin", &router.admin.to_string(), "--token", TOKEN, "queue"])
            .args(args)
            .output()
            .expect("rondo ctl");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = ctl(&["show", "orders", &id]);
    assert!(shown.contains("3 attempt(s)") && shown.contains("3. c/m1: answered 500"), "{shown}");
    let status = ctl(&["status"]);
    assert!(status.contains("orders") && status.contains("DEAD"), "{status}");
    assert!(ctl(&["dead", "orders"]).contains(&id));
    state.status.store(200, Ordering::Relaxed);
    let requeued = ctl(&["requeue", "orders", &id]);
    assert!(requeued.contains("1 dead letter(s) requeued"), "{requeued}");
    let delivered = until(Duration::from_secs(10), || state.delivered() == [id.clone()]).await;
    assert!(delivered, "requeue delivers: {:?}", state.got());
    let (_, v) = admin(&c, router.admin, "GET", path).await;
    assert!(v["dead_letters"].as_array().unwrap().is_empty(), "{v}");
    // The metrics count it.
    let req = Request::get(format!("http://{}/metrics", router.admin))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let text = c.request(req).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    for line in [
        "rondo_queue_messages_dead_lettered_total{queue=\"orders\"} 1",
        "rondo_queue_messages_accepted_total{queue=\"orders\"} 1",
        "rondo_queue_delivery_retries_total{queue=\"orders\"} 2",
        "rondo_queue_dead_letters{queue=\"orders\"} 0",
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
    let purged = ctl(&["purge", "orders", "--all"]);
    assert!(purged.contains("0 dead letter(s) purged"), "{purged}");
}

/// A member that answers each delivery 200, then, while the connection sits idle, sends an
/// unsolicited `500`: the attempt number of every delivery it got (issue 41: a member's extra
/// bytes must not answer the next delivery).
async fn out_of_turn_member(addr: SocketAddr) -> Arc<Mutex<Vec<u32>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = listen_on(addr).await;
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // At most 16 deliveries per connection, each under 64 KiB.
                for _ in 0..16 {
                    let head = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                buf.drain(..end + 4 + len);
                                break head;
                            }
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) if buf.len() + n < 65536 => buf.extend_from_slice(&chunk[..n]),
                            Ok(_) => return,
                        }
                    };
                    let attempt = head
                        .lines()
                        .find_map(|l| l.strip_prefix("x-rondo-attempt:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    seen.lock().unwrap().push(attempt);
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err()
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let stale =
                        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\n\r\nSTALE";
                    if s.write_all(stale).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_unsolicited_response_answers_no_later_delivery() {
    let dir = TempDir::new("queue-out-of-turn");
    let member = member_addr();
    let attempts = out_of_turn_member(member).await;
    // One attempt each: a stale 500 taken as a delivery's answer would dead-letter it.
    let cfg = config(&dir, member, "max_attempts = 1");
    let router = start_router(&dir, &cfg);
    let c = client();
    for i in 0..3 {
        let (status, _, _) = post(&c, router.intake, format!("m{i}"), &[]).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let delivered = until(Duration::from_secs(10), || attempts.lock().unwrap().len() > i).await;
        assert!(delivered, "message {i} delivered");
        // The member's stale answer arrives while the connection is idle.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(*attempts.lock().unwrap(), [1, 1, 1], "each message delivered once, first try");
    let (s, v) = admin(&c, router.admin, "GET", "/api/v1/queues/orders/dead").await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["dead_letters"].as_array().unwrap().is_empty(), "a stale 500 was taken: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_answer_413_and_503_with_retry_after_and_a_damaged_store_stops_the_start() {
    let dir = TempDir::new("queue-limits");
    let member = member_addr();
    let cfg = config(&dir, member, "max_messages = 5\nmax_message_bytes = 1024");
    let mut router = start_router(&dir, &cfg);
    let c = client();
    let (status, _, body) = post(&c, router.intake, vec![b'x'; 2000], &[]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(body.contains("max_message_bytes (1024)"), "{body}");
    for _ in 0..5 {
        let (status, _, _) = post(&c, router.intake, vec![b'x'; 1024], &[]).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let (status, headers, body) = post(&c, router.intake, "one more", &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(body.contains("max_messages 5"), "{body}");
    // No queue of the name, another method.
    let req = Request::get(format!("http://{}/queues/orders", router.intake))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.request(req).await.unwrap().status(), StatusCode::METHOD_NOT_ALLOWED);
    let req = Request::post(format!("http://{}/queues/other", router.intake))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.request(req).await.unwrap().status(), StatusCode::NOT_FOUND);
    router.proc.kill();

    // A damaged store file: the start stops, naming the file; the file is left as it was.
    let file = dir.0.join("store").join("orders.redb");
    let junk = b"not a queue store, whatever it was before\n".repeat(200);
    std::fs::write(&file, &junk).unwrap();
    let err = refused_start(&dir, &cfg, "a damaged store must not start");
    assert!(err.contains(&file.display().to_string()), "the error names the file: {err}");
    assert_eq!(std::fs::read(&file).unwrap(), junk, "no silent reset");
}

/// `nats-server -js` on a free loopback port with its store in `dir`; killed by PID on drop.
#[cfg(feature = "nats")]
fn nats_server(dir: &TempDir) -> (common::ChildGuard, SocketAddr) {
    let port = free_port();
    // Debian installs it in /usr/sbin, which not every PATH holds.
    let bin = ["nats-server", "/usr/sbin/nats-server"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("nats-server (Debian's nats-server package; .ci/run installs it)");
    let child = Command::new(bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.0.join("nats"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server");
    let guard = common::ChildGuard(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not start on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (guard, addr)
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_two_routers_consume_one_queue_and_one_killed_mid_delivery_loses_none() {
    let dir = TempDir::new("queue-nats");
    let (_nats, nats) = nats_server(&dir);
    let member = member_addr();
    let state = SinkState::new(200, 300);
    let _sink = sink(member, state.clone()).await;
    let cfg = config(&dir, member, "").replace(
        &format!("directory = \"{}\"", dir.0.join("store").display()),
        &format!(
            "backend = \"nats\"\nnats_url = \"{nats}\"\nlease_ms = 2000\nconcurrency = 4\n\
             backoff_initial_ms = 100"
        ),
    );
    let (dir_a, dir_b) = (TempDir::new("queue-nats-a"), TempDir::new("queue-nats-b"));
    let mut a = start_router(&dir_a, &cfg);
    let b = start_router(&dir_b, &cfg);
    let c = client();
    let mut accepted = HashSet::new();
    for i in 0..300 {
        let at = if i % 2 == 0 { a.intake } else { b.intake };
        let (status, _, body) = post(&c, at, format!("message {i}"), &[]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        accepted.insert(id_of(&body));
    }
    assert_eq!(accepted.len(), 300, "ids are unique across both routers");
    let started = until(Duration::from_secs(20), || state.delivered().len() >= 40).await;
    assert!(started, "deliveries began");
    // Both routers take messages from the one work queue.
    let (_, qa) = admin(&c, a.admin, "GET", "/api/v1/queues").await;
    let (_, qb) = admin(&c, b.admin, "GET", "/api/v1/queues").await;
    assert!(qa["queues"][0]["delivered"].as_u64().unwrap() > 0, "{qa}");
    assert!(qb["queues"][0]["delivered"].as_u64().unwrap() > 0, "{qb}");
    assert_eq!(qa["queues"][0]["backend"], "nats");
    a.proc.kill();
    let before_kill = state.delivered().len();
    assert!(before_kill < 300, "the kill came mid-delivery");
    let all = until(Duration::from_secs(60), || {
        let got: HashSet<String> = state.delivered().into_iter().collect();
        accepted.iter().all(|id| got.contains(id))
    })
    .await;
    let delivered = state.delivered();
    let unique: HashSet<&String> = delivered.iter().collect();
    let lost = accepted.iter().filter(|id| !unique.contains(id)).count();
    eprintln!(
        "nats, two routers, one killed after {before_kill} deliveries: {lost} lost, {} \
         duplicates",
        delivered.len() - unique.len()
    );
    assert!(all && lost == 0, "lost {lost} accepted messages");
    drop(b);
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_poison_message_is_dead_lettered_and_requeued() {
    let dir = TempDir::new("queue-nats-dlq");
    let (_nats, nats) = nats_server(&dir);
    let member = member_addr();
    let state = SinkState::new(500, 0);
    let _sink = sink(member, state.clone()).await;
    let cfg = config(&dir, member, "").replace(
        &format!("directory = \"{}\"", dir.0.join("store").display()),
        &format!(
            "backend = \"nats\"\nnats_url = \"{nats}\"\nmax_attempts = 3\nbackoff_initial_ms = 50"
        ),
    );
    let router = start_router(&dir, &cfg);
    let c = client();
    let (status, _, body) = post(&c, router.intake, "poison", &[]).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = id_of(&body);
    let path = "/api/v1/queues/orders/dead";
    let mut found = false;
    for _ in 0..100 {
        let (_, v) = admin(&c, router.admin, "GET", path).await;
        if v["dead_letters"].as_array().is_some_and(|l| !l.is_empty()) {
            assert_eq!(v["dead_letters"][0]["id"], id.as_str(), "{v}");
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(found, "the message reached the dead-letter stream");
    let (_, one) = admin(&c, router.admin, "GET", &format!("{path}/{id}")).await;
    let tries = one["tries"].as_array().unwrap();
    assert_eq!(tries.len(), 3, "{one}");
    assert!(tries.iter().all(|t| t["reason"].as_str().unwrap().contains("answered 500")), "{one}");
    state.status.store(200, Ordering::Relaxed);
    let (s, v) = admin(&c, router.admin, "POST", &format!("{path}/{id}/requeue")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let delivered = until(Duration::from_secs(10), || state.delivered() == [id.clone()]).await;
    assert!(delivered, "requeue delivers it with its id: {:?}", state.got());
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_two_routers_deliver_each_session_in_order_one_at_a_time() {
    let dir = TempDir::new("queue-nats-order");
    let (_nats, nats) = nats_server(&dir);
    let member = member_addr();
    let cfg = config(&dir, member, "").replace(
        &format!("directory = \"{}\"", dir.0.join("store").display()),
        &format!(
            "backend = \"nats\"\nnats_url = \"{nats}\"\nsession_header = \"x-session\"\n\
             backoff_initial_ms = 100\nbackoff_max_ms = 800\nmax_attempts = 100\nconcurrency = 4"
        ),
    );
    let (dir_a, dir_b) = (TempDir::new("queue-nats-order-a"), TempDir::new("queue-nats-order-b"));
    let a = start_router(&dir_a, &cfg);
    let b = start_router(&dir_b, &cfg);
    let c = client();
    let mut sent: HashMap<String, Vec<u32>> = HashMap::new();
    for i in 0..60u32 {
        let session = format!("s{}", i % 3);
        let at = if i % 2 == 0 { a.intake } else { b.intake };
        let (status, _, body) = post(&c, at, i.to_string(), &[("x-session", &session)]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        sent.entry(session).or_default().push(i);
    }
    // The member is down for 3 s: both routers retry, each message with its own backoff.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let state = SinkState::new(200, 10);
    let _sink = sink(member, state.clone()).await;
    let all = until(Duration::from_secs(60), || state.delivered().len() >= 60).await;
    assert!(all, "delivered {} of 60", state.delivered().len());
    assert_in_order_per_session(&state, &sent);

    // A router that would hash the keys over another number of subjects must not join.
    let other = TempDir::new("queue-nats-order-c");
    let cfg = cfg.replace("concurrency = 4", "concurrency = 4\nsession_partitions = 8");
    let err =
        refused_start(&other, &cfg, "a router with another session_partitions must not start");
    assert!(
        err.contains("RONDO_Q_orders")
            && err.contains("session_partitions = 16")
            && err.contains("session_partitions = 8"),
        "the error names the stream and both numbers: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_route_with_auth_takes_only_messages_whose_token_holds() {
    use base64::Engine as _;
    let dir = TempDir::new("queue-auth");
    let member = member_addr();
    let state = SinkState::new(200, 0);
    let _sink = sink(member, state.clone()).await;
    let secret = b"a queue test secret of at least 32 bytes";
    let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    std::fs::write(
        dir.0.join("keys.json"),
        format!(r#"{{"keys": [{{"kty": "oct", "kid": "q1", "k": "{k}"}}]}}"#),
    )
    .unwrap();
    let cfg = config(&dir, member, "").replace(
        "cluster = \"c\"\n",
        &format!(
            "cluster = \"c\"\nauth = {{ issuer = \"https://issuer.test\", audience = \"orders\", \
             keys = \"{}\", claims = [\"email\"] }}\n",
            dir.0.join("keys.json").display()
        ),
    );
    let router = start_router(&dir, &cfg);
    let c = client();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let sign = |sub: &str, exp: u64| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        h.kid = Some("q1".to_owned());
        let claims = serde_json::json!({
            "iss": "https://issuer.test", "aud": "orders", "sub": sub, "exp": exp,
            "email": format!("{sub}@example.test"),
        });
        jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_secret(secret)).unwrap()
    };
    let good = format!("Bearer {}", sign("alice", now.as_secs() + 600));
    let expired = format!("Bearer {}", sign("mallory", now.as_secs() - 3600));

    // No token, an expired one, a forged signature: 401 with the challenge, nothing stored.
    let (status, headers, body) = post(&c, router.intake, "no token", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"rondo\"");
    let (status, headers, body) =
        post(&c, router.intake, "expired", &[("authorization", &expired)]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(headers["www-authenticate"].to_str().unwrap().contains("invalid_token"), "{headers:?}");
    let forged = format!("{}x", &good[..good.len() - 1]);
    let (status, _, body) = post(&c, router.intake, "forged", &[("authorization", &forged)]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

    // Two Authorization fields (issue 41 item 4), a good token first, or tier sessions that
    // differ: 400 with `invalid_request`, nothing stored (only the signed message below is
    // ever accepted and delivered).
    for (what, headers) in [
        ("two tokens", [("authorization", good.as_str()), ("authorization", expired.as_str())]),
        ("one token twice", [("authorization", good.as_str()), ("authorization", good.as_str())]),
        ("two sessions", [("cookie", "rondo-session=a.b"), ("cookie", "rondo-session=c.d")]),
    ] {
        let (status, headers, body) = post(&c, router.intake, what, &headers).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert!(body.contains("more than one"), "{what}: {body}");
        let www = headers["www-authenticate"].to_str().unwrap();
        assert!(www.contains("error=\"invalid_request\""), "{what}: {www}");
    }

    // A good token: accepted, and delivered with the identity the router verified, never the
    // one the client claimed.
    let (status, _, body) = post(
        &c,
        router.intake,
        "signed",
        &[
            ("authorization", &good),
            ("x-rondo-subject", "root"),
            ("x_rondo_subject", "root"),
            ("cookie", "rondo-session=stolen; theme=dark"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = id_of(&body);
    let delivered = until(Duration::from_secs(10), || state.delivered() == [id.clone()]).await;
    assert!(delivered, "only the signed message is delivered: {:?}", state.got());
    let got = state.got().pop().unwrap();
    assert_eq!(got.body, "signed");
    assert_eq!(got.header("x-rondo-subject"), Some("alice"), "{:?}", got.headers);
    assert_eq!(got.header("x-rondo-claim-email"), Some("alice@example.test"));
    assert_eq!(got.header("x_rondo_subject"), None, "{:?}", got.headers);
    assert_eq!(got.header("cookie"), Some("theme=dark"), "the tier session cookie is not kept");
    let (_, q) = admin(&c, router.admin, "GET", "/api/v1/queues").await;
    assert_eq!(q["queues"][0]["accepted"], 1, "{q}");
    let metrics = {
        let req = Request::get(format!("http://{}/metrics", router.admin))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let body = c.request(req).await.unwrap().into_body().collect().await.unwrap();
        String::from_utf8_lossy(&body.to_bytes()).into_owned()
    };
    let refusals: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("rondo_auth_refusals_total{")).collect();
    assert!(
        refusals.iter().any(|l| l.contains("reason=\"missing\"") && l.ends_with(" 1"))
            && refusals.iter().any(|l| l.contains("reason=\"expired\"") && l.ends_with(" 1"))
            && refusals.iter().any(|l| l.contains("reason=\"bad_signature\"") && l.ends_with(" 1"))
            && refusals.iter().any(|l| l.contains("reason=\"ambiguous\"") && l.ends_with(" 3")),
        "the refusals are counted by reason: {refusals:?}"
    );
}

/// Everything a raw connection reads until the router closes it (at most `wait`).
async fn read_until_closed(s: &mut tokio::net::TcpStream, wait: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(wait, s.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "no close within {wait:?}; got so far: {:?}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

// Issue 41: a queue listener at `max_connections` answered nothing for as long as its
// connections stayed open, and connections whose body stalled stayed open for ever. Now one
// over the limit gets 503 with `Retry-After` at once, a stalled body gets 408 after
// `body_read_timeout_ms` and its connection closes, and the freed slots take messages again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_503_at_once_and_a_stalled_body_gets_408_and_frees_its_slot() {
    use tokio::io::AsyncWriteExt;
    let dir = TempDir::new("queue-stall");
    let member = member_addr();
    let cfg = config(&dir, member, "").replace(
        "protocol = \"queue\"\n",
        "protocol = \"queue\"\nmax_connections = 4\nbody_read_timeout_ms = 2000\n",
    );
    let router = start_router(&dir, &cfg);
    let head = "POST /queues/orders HTTP/1.1\r\nhost: q\r\ncontent-length: 1000\r\n\r\n";
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(router.intake).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&[b'x'; 10]).await.unwrap();
        stalled.push(s);
    }
    // Accepted after the four (the backlog is first in, first out): over the limit. It sends
    // nothing, so the router's close cannot turn into a reset that would destroy the answer.
    let mut over = tokio::net::TcpStream::connect(router.intake).await.unwrap();
    let answer = read_until_closed(&mut over, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1\r\n"), "{answer}");
    assert!(answer.contains("limit of 4 client connections"), "{answer}");
    for s in &mut stalled {
        let answer = read_until_closed(s, Duration::from_secs(20)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_read_timeout_ms"), "{answer}");
    }
    // The slots are free again: a message is accepted.
    let c = client();
    let (status, _, body) = post(&c, router.intake, "after the stall", &[]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

/// A tmpfs of `size` mounted on `dir` (which it creates); unmounted when dropped, also when the
/// test fails. `None` when it cannot be mounted (not root); under `CI` that fails the test.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
        assert!(mounted || !ci, "cannot mount a tmpfs (CI runs as root, so this test must run)");
        mounted.then(|| Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the file system is full: the bytes written.
fn fill(path: &std::path::Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("filler file");
    let chunk = vec![0u8; 16 * 1024];
    let mut written = 0;
    // At most 1 GiB, though the tmpfs is far smaller.
    for _ in 0..65_536 {
        match f.write(&chunk) {
            Ok(n) if n > 0 => written += n as u64,
            _ => break,
        }
    }
    let _ = f.sync_all();
    written
}

// Issue 41: after one write failed on a full disk, redb refused every later write ("Previous
// I/O error occurred") and the queue answered 503 until a restart. Now the store is opened
// again with backoff, and once space is freed messages are accepted again; every message
// answered 202 is delivered exactly once, and none answered 503 is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_full_disk_is_freed_messages_are_accepted_again_and_none_is_lost() {
    let dir = TempDir::new("queue-enospc");
    let store = dir.0.join("store");
    let Some(_tmpfs) = Tmpfs::mount(&store, "4m") else {
        eprintln!("skipped: cannot mount a tmpfs (not root)");
        return;
    };
    let member = member_addr();
    let extra = "max_attempts = 1000\nbackoff_initial_ms = 20\nbackoff_max_ms = 200";
    let router = start_router(&dir, &config(&dir, member, extra));
    let c = client();
    let mut accepted: Vec<(u32, String)> = Vec::new();
    let mut refused: Vec<u32> = Vec::new();
    let mut n = 0u32;
    let send = async |n: u32, accepted: &mut Vec<(u32, String)>, refused: &mut Vec<u32>| {
        let (status, headers, body) =
            post(&c, router.intake, format!("{n} {}", "x".repeat(4000)), &[]).await;
        match status {
            StatusCode::ACCEPTED => accepted.push((n, id_of(&body))),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(headers["retry-after"], "1", "{body}");
                refused.push(n);
            }
            other => panic!("message {n}: {other} {body}"),
        }
        status
    };
    // A few messages while there is room; then the disk is full (the member is down: they
    // all wait in the store).
    for _ in 0..5 {
        n += 1;
        assert_eq!(send(n, &mut accepted, &mut refused).await, StatusCode::ACCEPTED);
    }
    let filler = store.join("filler");
    assert!(fill(&filler) > 0, "the filler took the tmpfs's room");
    // Messages until the store fails (each takes pages the full disk does not have).
    for _ in 0..500 {
        n += 1;
        if send(n, &mut accepted, &mut refused).await != StatusCode::ACCEPTED {
            break;
        }
    }
    assert!(!refused.is_empty(), "the full disk refused a message");
    // Still full: a few more, whatever they get.
    for _ in 0..5 {
        n += 1;
        send(n, &mut accepted, &mut refused).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Room again: within a bounded time the queue takes messages again.
    std::fs::remove_file(&filler).unwrap();
    let mut again = false;
    for _ in 0..150 {
        n += 1;
        if send(n, &mut accepted, &mut refused).await == StatusCode::ACCEPTED {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read_to_string(dir.0.join("stderr")).unwrap_or_default();
    assert!(again, "no message accepted within 30 s of the space being freed; log:\n{log}");
    for _ in 0..5 {
        n += 1;
        assert_eq!(send(n, &mut accepted, &mut refused).await, StatusCode::ACCEPTED);
    }
    // Every 202 is one message of its own.
    let ids: HashSet<&String> = accepted.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), accepted.len(), "no id acknowledged twice");

    // The member comes up: every accepted message arrives once, no refused one at all.
    let state = SinkState::new(200, 0);
    let _sink = sink(member, state.clone()).await;
    let all = until(Duration::from_secs(60), || {
        let got: HashSet<String> = state.delivered().into_iter().collect();
        ids.iter().all(|id| got.contains(*id))
    })
    .await;
    // Anything delivered twice or out of thin air would have arrived by now too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered = state.got();
    let mut got_ids: Vec<&str> = delivered.iter().map(|g| g.id.as_str()).collect();
    got_ids.sort_unstable();
    let mut want: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
    want.sort_unstable();
    eprintln!(
        "full disk: {} accepted, {} refused (503), {} delivered",
        accepted.len(),
        refused.len(),
        delivered.len()
    );
    assert!(all, "not every accepted message was delivered");
    assert_eq!(got_ids, want, "each accepted message delivered exactly once, nothing else");
    let refused: HashSet<u32> = refused.into_iter().collect();
    for g in &delivered {
        let number: u32 = g.body.split(' ').next().unwrap().parse().unwrap();
        assert!(!refused.contains(&number), "message {number} was refused but delivered");
    }
}

/// The config of [`config`] with a `multicast` branch to cluster `audit` (one member at `audit`).
fn multicast_config(dir: &TempDir, member: SocketAddr, audit: SocketAddr, queue: &str) -> String {
    config(dir, member, queue)
        .replace("cluster = \"c\"\n", "cluster = \"c\"\nmulticast = [{ cluster = \"audit\" }]\n")
        .replace(
            "[[queue]]",
            &format!(
                "[cluster.audit]\nmembers = [{{ name = \"a1\", address = \"{audit}\" }}]\n\
                 outlier = {{ count_5xx = false }}\n\n[[queue]]"
            ),
        )
}

fn bodies(state: &SinkState) -> Vec<String> {
    state.got().into_iter().filter(|g| g.answered < 300).map(|g| g.body).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multicast_route_keeps_a_copy_per_branch_all_or_none_and_delivers_each_on_its_own() {
    let dir = TempDir::new("queue-multicast");
    let (member, audit) = (member_addr(), member_addr());
    let main = SinkState::new(200, 0);
    let _main = sink(member, main.clone()).await;
    // The audit member is down for now: its copies wait, the service's do not.
    let cfg = multicast_config(
        &dir,
        member,
        audit,
        "max_messages = 2\nmax_attempts = 1000\nbackoff_initial_ms = 50\nbackoff_max_ms = 200",
    );
    let mut r = start_router(&dir, &cfg);
    let c = client();
    let (status, _, body) = post(&c, r.intake, "one", &[]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["branches"]["audit"].is_string(), "the copy's id is answered: {body}");
    assert!(until(Duration::from_secs(10), || bodies(&main) == ["one"]).await, "{:?}", main.got());
    // Its delivery recorded (else a kill -9 makes it due again: at least once).
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin(&c, r.admin, "GET", "/api/v1/queues").await.1["queues"][0]["delivered"] != 1 {
        assert!(Instant::now() < deadline, "the delivery was not recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One copy (audit's) is held; a second message needs two places and the queue has one:
    // neither copy is kept.
    let (status, _, body) = post(&c, r.intake, "two", &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // The held copy survives kill -9.
    r.proc.kill();
    let r = start_router(&dir, &cfg);
    let audited = SinkState::new(200, 0);
    let _audit = sink(audit, audited.clone()).await;
    assert!(
        until(Duration::from_secs(20), || bodies(&audited) == ["one"]).await,
        "{:?}",
        audited.got()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(bodies(&main), ["one"], "the refused message reached no branch");
    assert_eq!(bodies(&audited), ["one"]);
    drop(r);
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_multicast_route_delivers_every_message_to_every_branch_once() {
    let dir = TempDir::new("queue-nats-multicast");
    let (_nats, nats) = nats_server(&dir);
    let (member, audit) = (member_addr(), member_addr());
    let (main, audited) = (SinkState::new(200, 0), SinkState::new(200, 0));
    let _main = sink(member, main.clone()).await;
    let _audit = sink(audit, audited.clone()).await;
    let cfg = multicast_config(&dir, member, audit, "").replace(
        &format!("directory = \"{}\"", dir.0.join("store").display()),
        &format!("backend = \"nats\"\nnats_url = \"{nats}\"\nbackoff_initial_ms = 100"),
    );
    let r = start_router(&dir, &cfg);
    let c = client();
    let mut sent: Vec<String> = Vec::new();
    for i in 0..20 {
        let (status, _, body) = post(&c, r.intake, format!("m{i}"), &[]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        sent.push(format!("m{i}"));
    }
    let done = until(Duration::from_secs(30), || {
        bodies(&main).len() >= 20 && bodies(&audited).len() >= 20
    })
    .await;
    assert!(done, "main {:?}, audit {:?}", bodies(&main), bodies(&audited));
    tokio::time::sleep(Duration::from_millis(300)).await;
    for state in [&main, &audited] {
        let mut got = bodies(state);
        got.sort();
        let mut want = sent.clone();
        want.sort();
        assert_eq!(got, want, "each message once on each branch");
    }
    drop(r);
}
