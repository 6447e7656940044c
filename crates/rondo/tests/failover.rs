//! Failover with real processes on 127.0.0.1 (docs/router.md, "Failover"): `rondo serve` runs as
//! a child process in front of members that are either `rondo member` processes (killed with
//! SIGKILL) or small servers inside this test process that record every request they receive
//! (killed by dropping their own runtime, which closes the listener and every open connection at
//! once, like a process dying).
//!
//! Every load is bounded (a few clients, a few seconds, a 2 s timeout per request) and nothing
//! asserts speed. The tests run one at a time: they measure detection windows (health checks
//! every 100 ms, `fall = rise = 2`) and the machine may have only two cores.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{COOKIE, HeaderValue, SET_COOKIE};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::task::{JoinHandle, JoinSet};

use common::{Proc, TempDir, free_port, start_member};

/// Probes every 100 ms; two results in a row take a member down or bring it back.
const HEALTH: &str =
    r#"health = { path = "/health", interval_ms = 100, timeout_ms = 200, rise = 2, fall = 2 }"#;
/// Three tries, each at most 1 s.
const RETRY: &str = "retry = { attempts = 3, per_try_timeout_ms = 1000 }";
/// interval × fall (= interval × rise) = 200 ms, plus slack for a busy two-core machine.
const DETECT: Duration = Duration::from_millis(200 + 600);
/// Each client request gives up after this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Harness: serial runner, child processes, the router, clients and load.
// ---------------------------------------------------------------------------------------------

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs one test's body on a runtime of its own, one test at a time.
fn run_serial(test: impl Future<Output = ()>) {
    let _one_at_a_time = lock(&SERIAL);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime");
    runtime.block_on(test);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `{ name = "NAME", address = "ADDR" }` with `extra` keys.
fn entry(name: &str, addr: SocketAddr, extra: &str) -> String {
    let extra = if extra.is_empty() { String::new() } else { format!(", {extra}") };
    format!("{{ name = \"{name}\", address = \"{addr}\"{extra} }}")
}

/// `members = [...]`.
fn members_line(entries: impl IntoIterator<Item = String>) -> String {
    format!("members = [{}]", entries.into_iter().collect::<Vec<_>>().join(", "))
}

/// `rondo serve --workers 1` as a child process.
struct RouterProc {
    _proc: Proc,
    _dir: TempDir,
    /// `http://127.0.0.1:PORT`.
    base: String,
}

/// Starts the router with listener `web` on a free port and `rest` (routes and clusters).
fn start_router(rest: &str) -> RouterProc {
    let dir = TempDir::new("failover");
    let port = free_port();
    let text = format!("[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:{port}\"\n\n{rest}");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, &text).expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    let line = p.line_with("listener web on", Duration::from_secs(10));
    assert!(line.ends_with(&format!("127.0.0.1:{port}")), "{line}\nconfig:\n{text}");
    RouterProc { _proc: p, _dir: dir, base: format!("http://127.0.0.1:{port}") }
}

/// One route from `web` to cluster `c`, whose body is `cluster`.
fn one_cluster(cluster: &str) -> String {
    format!("[[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n[cluster.c]\n{cluster}\n")
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A keep-alive HTTP/1.1 client (one connection at a time when used sequentially).
fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A response, collected (body trimmed).
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    body: String,
    set_cookie: Option<String>,
}

/// Sends `req`, giving up after [`REQUEST_TIMEOUT`]; an error says what failed.
async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Result<Reply, String> {
    let fut = async {
        let resp = client.request(req).await.map_err(|e| format!("request failed: {e:?}"))?;
        let status = resp.status().as_u16();
        let set_cookie =
            resp.headers().get(SET_COOKIE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = resp.into_body().collect().await.map_err(|e| format!("body failed: {e}"))?;
        let body = String::from_utf8_lossy(&body.to_bytes()).trim().to_owned();
        Ok(Reply { status, body, set_cookie })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err(format!("no reply within {REQUEST_TIMEOUT:?}")))
}

fn get(url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::default()).expect("request builds")
}

/// One request of a load: when it started and ended (since the test's `t0`) and how it went.
#[derive(Debug, Clone)]
struct Sample {
    id: u64,
    start: Duration,
    end: Duration,
    outcome: Result<Reply, String>,
}

impl Sample {
    fn ok_body(&self) -> Option<&str> {
        match &self.outcome {
            Ok(r) if r.status == 200 => Some(&r.body),
            _ => None,
        }
    }
}

type MakeRequest = Arc<dyn Fn(u64) -> Request<Full<Bytes>> + Send + Sync>;

/// `clients` keep-alive clients, each sending one request at a time (`make` builds it from an id
/// unique in this process) and pausing `pace` after each, until `t0 + until`.
fn start_load(
    clients: usize,
    t0: Instant,
    until: Duration,
    pace: Duration,
    make: MakeRequest,
) -> JoinHandle<Vec<Sample>> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    tokio::spawn(async move {
        let mut tasks = JoinSet::new();
        for _ in 0..clients {
            let make = make.clone();
            tasks.spawn(async move {
                let client = http_client();
                let mut samples = Vec::new();
                while t0.elapsed() < until {
                    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                    let start = t0.elapsed();
                    let outcome = send(&client, make(id)).await;
                    samples.push(Sample { id, start, end: t0.elapsed(), outcome });
                    tokio::time::sleep(pace).await;
                }
                samples
            });
        }
        let mut all = Vec::new();
        while let Some(done) = tasks.join_next().await {
            all.extend(done.expect("load client"));
        }
        all.sort_by_key(|s| s.start);
        all
    })
}

async fn sleep_until(t0: Instant, at: Duration) {
    tokio::time::sleep_until((t0 + at).into()).await;
}

/// The samples that did not answer 200.
fn failures(samples: &[Sample]) -> Vec<&Sample> {
    samples.iter().filter(|s| s.ok_body().is_none()).collect()
}

/// Responses per body among 200s.
fn tally<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for s in samples {
        if let Some(b) = s.ok_body() {
            *m.entry(b.to_owned()).or_default() += 1;
        }
    }
    m
}

fn first<'a>(v: &[&'a Sample], n: usize) -> Vec<&'a Sample> {
    v.iter().take(n).copied().collect()
}

// ---------------------------------------------------------------------------------------------
// Members inside the test process, and a squatter on a dead member's port.
// ---------------------------------------------------------------------------------------------

/// What an in-test member does with a request (other than `/health`, always 200).
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Waits `delay_ms` after reading the body, then answers 200 with the body.
    Echo { delay_ms: u64 },
    /// Answers 500 with its name.
    Fail500,
}

/// What an in-test member received (health checks excluded).
#[derive(Default)]
struct Seen {
    /// `x-id` header value -> times received (counted when the request head arrives).
    ids: Mutex<HashMap<String, u32>>,
    /// When each request head arrived.
    arrivals: Mutex<Vec<Instant>>,
}

/// A member serving HTTP/1.1 on a runtime of its own (the pattern of `Killable` in
/// `tests/router/support.rs`): dropping the runtime closes its listener and every connection.
struct TestMember {
    name: String,
    addr: SocketAddr,
    seen: Arc<Seen>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TestMember {
    fn spawn(name: &str, mode: Mode) -> TestMember {
        let seen = Arc::new(Seen::default());
        let (s, n) = (seen.clone(), Arc::<str>::from(name));
        let (runtime, addr) = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("member runtime");
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .expect("member binds");
            let addr = listener.local_addr().expect("member address");
            runtime.spawn(accept_loop(listener, n, mode, s));
            (runtime, addr)
        })
        .join()
        .expect("member thread");
        TestMember { name: name.to_owned(), addr, seen, runtime: Some(runtime) }
    }

    /// Dies: the listener and every open connection close (waits until they have).
    async fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            tokio::task::spawn_blocking(move || drop(runtime)).await.expect("runtime dropped");
        }
    }

    fn arrivals(&self) -> Vec<Instant> {
        lock(&self.seen.arrivals).clone()
    }

    fn ids(&self) -> HashMap<String, u32> {
        lock(&self.seen.ids).clone()
    }
}

impl Drop for TestMember {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    name: Arc<str>,
    mode: Mode,
    seen: Arc<Seen>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let (name, seen) = (name.clone(), seen.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| answer(name.clone(), mode, seen.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn answer(
    name: Arc<str>,
    mode: Mode,
    seen: Arc<Seen>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/health" {
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))));
    }
    lock(&seen.arrivals).push(Instant::now());
    if let Some(id) = req.headers().get("x-id").and_then(|v| v.to_str().ok()) {
        *lock(&seen.ids).entry(id.to_owned()).or_default() += 1;
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let (status, body) = match mode {
        Mode::Echo { delay_ms } => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            (StatusCode::OK, body)
        }
        Mode::Fail500 => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::from(format!("{name}\n"))),
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&name) {
        resp.headers_mut().insert("x-member", v);
    }
    Ok(resp)
}

/// Listens on a dead member's port: records each connection's request as a health probe
/// (`User-Agent: rondo-probe`) or a proxied request, with its time since `t0`, and closes it
/// without answering (so probes keep failing and the member stays down).
struct Sentinel {
    hits: Arc<Mutex<Vec<(Duration, bool)>>>,
    task: JoinHandle<()>,
}

impl Sentinel {
    async fn start(addr: SocketAddr, t0: Instant) -> Sentinel {
        let listener =
            tokio::net::TcpListener::bind(addr).await.expect("bind the dead member's port");
        let hits = Arc::new(Mutex::new(Vec::new()));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { continue };
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let read_head = async {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(1), read_head).await;
                    if !buf.is_empty() {
                        let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                        lock(&h).push((t0.elapsed(), head.contains("user-agent: rondo-probe")));
                    }
                });
            }
        });
        Sentinel { hits, task }
    }

    fn hits(&self) -> Vec<(Duration, bool)> {
        lock(&self.hits).clone()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// 1. kill -9 of a member under GET load.
// ---------------------------------------------------------------------------------------------

#[test]
fn kill_9_of_a_member_under_get_load_fails_no_request_and_the_router_stops_trying_it() {
    run_serial(kill_9_scenario(""));
}

/// The same with passive outlier detection off: health checks alone must stop the tries.
#[test]
fn kill_9_under_get_load_with_health_checks_alone() {
    run_serial(kill_9_scenario("outlier = { consecutive_failures = 0 }"));
}

/// Three `rondo member` processes, four clients of GETs for 3 s, `kill -9` of m2 at 1 s.
/// `outlier` is a line of the cluster.
async fn kill_9_scenario(outlier: &str) {
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for name in ["m1", "m2", "m3"] {
        let (p, a) = start_member(name, "127.0.0.1:0");
        procs.push(p);
        addrs.push(a);
    }
    let members =
        members_line(["m1", "m2", "m3"].iter().zip(&addrs).map(|(n, a)| entry(n, *a, "")));
    let router = start_router(&one_cluster(&format!(
        "algorithm = \"round-robin\"\n{outlier}\n{HEALTH}\n{RETRY}\n{members}"
    )));
    let url = format!("{}/", router.base);

    let t0 = Instant::now();
    let make: MakeRequest = Arc::new(move |_| get(&url, &[]));
    let load = start_load(4, t0, Duration::from_secs(3), Duration::from_millis(5), make);
    sleep_until(t0, Duration::from_secs(1)).await;
    let kill_start = t0.elapsed();
    procs[1].kill();
    let killed = t0.elapsed();
    // Something must answer on m2's port to see whether the router still sends it requests:
    // a squatter that reads each request and hangs up (a reset: GETs are retried).
    let sentinel = Sentinel::start(addrs[1], t0).await;
    let samples = load.await.expect("load");
    let hits = sentinel.hits();

    let failed = failures(&samples);
    eprintln!(
        "kill -9 under GET load: {} requests, {} failed, m2 killed at {kill_start:?}..{killed:?}; \
         per member {:?}; after the kill m2's port saw {} proxied requests (the last {:?} after the kill) and {} probes",
        samples.len(),
        failed.len(),
        tally(&samples),
        hits.iter().filter(|h| !h.1).count(),
        hits.iter().filter(|h| !h.1).map(|h| h.0.saturating_sub(killed)).max(),
        hits.iter().filter(|h| h.1).count(),
    );
    assert!(
        failed.is_empty(),
        "{} of {} GETs failed: {:#?}",
        failed.len(),
        samples.len(),
        first(&failed, 10)
    );
    let before = tally(samples.iter().filter(|s| s.end < kill_start));
    for m in ["m1", "m2", "m3"] {
        assert!(
            before.get(m).copied().unwrap_or(0) > 0,
            "{m} served nothing before the kill: {before:?}"
        );
    }
    let after = tally(samples.iter().filter(|s| s.start >= killed));
    assert_eq!(after.get("m2"), None, "the dead member answered: {after:?}");
    for m in ["m1", "m3"] {
        assert!(
            after.get(m).copied().unwrap_or(0) > 0,
            "{m} served nothing after the kill: {after:?}"
        );
    }
    assert!(hits.iter().any(|h| h.1), "no health probe reached m2's port after the kill: {hits:?}");
    let late: Vec<_> = hits.iter().filter(|h| !h.1 && h.0 >= killed + DETECT).collect();
    assert!(
        late.is_empty(),
        "the router still sent requests to m2 more than {DETECT:?} after it died: {late:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. kill of a member under POST load: no request reaches a member twice.
// ---------------------------------------------------------------------------------------------

#[test]
fn kill_of_a_member_under_post_load_never_sends_a_post_twice() {
    run_serial(async {
        let mut members: Vec<TestMember> = ["m1", "m2", "m3"]
            .iter()
            .map(|n| TestMember::spawn(n, Mode::Echo { delay_ms: 20 }))
            .collect();
        let list = members_line(members.iter().map(|m| entry(&m.name, m.addr, "")));
        let router = start_router(&one_cluster(&format!(
            "algorithm = \"round-robin\"\n{HEALTH}\n{RETRY}\n{list}"
        )));
        let url = format!("{}/echo", router.base);

        let t0 = Instant::now();
        let make: MakeRequest = Arc::new(move |id| {
            Request::post(&url)
                .header("x-id", id.to_string())
                .body(Full::new(Bytes::from(id.to_string())))
                .expect("request builds")
        });
        let load = start_load(4, t0, Duration::from_secs(3), Duration::from_millis(2), make);
        sleep_until(t0, Duration::from_secs(1)).await;
        let kill_start = t0.elapsed();
        members[1].kill().await;
        let killed = t0.elapsed();
        let samples = load.await.expect("load");

        let mut received: HashMap<String, u32> = HashMap::new();
        let mut per_member = Vec::new();
        for m in &members {
            let ids = m.ids();
            per_member.push((m.name.clone(), ids.len()));
            for (id, n) in ids {
                *received.entry(id).or_default() += n;
            }
        }
        let failed = failures(&samples);
        eprintln!(
            "kill under POST load: {} POSTs, {} failed ({} of them reached m2, {} reached no \
             member; started at {:.1?} ms from the kill; statuses {:?}), m2 killed at {kill_start:?}..{killed:?}; ids received per \
             member {per_member:?}",
            samples.len(),
            failed.len(),
            failed.iter().filter(|s| received.contains_key(&s.id.to_string())).count(),
            failed.iter().filter(|s| !received.contains_key(&s.id.to_string())).count(),
            failed
                .iter()
                .map(|s| (s.start.as_secs_f64() - killed.as_secs_f64()) * 1000.0)
                .collect::<Vec<_>>(),
            failed
                .iter()
                .map(|s| s.outcome.as_ref().map(|r| r.status).map_err(String::as_str))
                .collect::<Vec<_>>(),
        );
        let mut twice: Vec<_> = received.iter().filter(|(_, n)| **n > 1).collect();
        twice.sort();
        assert!(twice.is_empty(), "POSTs received more than once (id, times): {twice:?}");
        for s in &samples {
            if let Some(body) = s.ok_body() {
                assert_eq!(body, s.id.to_string(), "wrong echo for {s:?}");
                assert_eq!(
                    received.get(&s.id.to_string()),
                    Some(&1),
                    "a 200 for a POST no member received: {s:?}"
                );
            }
        }
        for (name, n) in &per_member {
            assert!(*n > 0, "{name} received no POST: {per_member:?}");
        }
        // Failures are allowed only for POSTs caught by the death: in flight at the kill, or sent
        // to the dead member before health checks took it out.
        let unexplained: Vec<_> =
            failed.iter().filter(|s| s.end < kill_start || s.start >= killed + DETECT).collect();
        assert!(
            unexplained.is_empty(),
            "POSTs failed outside the kill window {kill_start:?}..{:?}: {unexplained:#?}",
            killed + DETECT
        );
        for s in &failed {
            assert!(
                matches!(&s.outcome, Ok(r) if r.status == 502),
                "a POST caught by the kill should get 502: {s:?}"
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 3. Backup cluster.
// ---------------------------------------------------------------------------------------------

#[test]
fn backup_cluster_takes_over_only_when_the_primary_is_down_and_gives_traffic_back() {
    // Passive ejection off for `a`: health checks alone drive the switch over and back.
    run_serial(backup_scenario("outlier = { consecutive_failures = 0 }"));
}

/// Regression: with the default passive outlier detection (`consecutive_failures = 5`,
/// `base_ejection_ms = 30000`), the first primary member to die under load is ejected by its
/// connect failures before health checks notice; after its restart it stayed out for the whole
/// ejection although its health checks passed. Coming back up now lifts the ejection.
#[test]
fn backup_cluster_gives_traffic_back_to_every_restarted_member_with_default_outlier_detection() {
    run_serial(backup_scenario(""));
}

/// Cluster `a` (a1, a2) with backup `b` (b1), `rondo member` processes, two clients of GETs:
/// a1 dies at 1 s, a2 at 2 s, both restart on their ports at 3 s. `outlier` is a line of
/// cluster `a`.
async fn backup_scenario(outlier: &str) {
    let (mut pa1, a1) = start_member("a1", "127.0.0.1:0");
    let (mut pa2, a2) = start_member("a2", "127.0.0.1:0");
    let (_pb1, b1) = start_member("b1", "127.0.0.1:0");
    // Panic mode off for `a`: with both members down it would keep trying them (and send
    // traffic back to a restarted member before its health checks pass).
    let router = start_router(&format!(
        "[[route]]\nlistener = \"web\"\ncluster = \"a\"\nbackups = [\"b\"]\n\n\
         [cluster.a]\nalgorithm = \"round-robin\"\npanic_threshold_percent = 0\n{outlier}\n{HEALTH}\n{RETRY}\n{}\n\n\
         [cluster.b]\nalgorithm = \"round-robin\"\n{HEALTH}\n{RETRY}\n{}\n",
        members_line([entry("a1", a1, ""), entry("a2", a2, "")]),
        members_line([entry("b1", b1, "")]),
    ));
    let url = format!("{}/", router.base);

    let t0 = Instant::now();
    let make: MakeRequest = Arc::new(move |_| get(&url, &[]));
    let load = start_load(2, t0, Duration::from_millis(4600), Duration::from_millis(5), make);
    sleep_until(t0, Duration::from_secs(1)).await;
    pa1.kill();
    let kill1 = t0.elapsed();
    sleep_until(t0, Duration::from_secs(2)).await;
    let kill2_start = t0.elapsed();
    pa2.kill();
    let kill2 = t0.elapsed();
    sleep_until(t0, Duration::from_secs(3)).await;
    let restart_start = t0.elapsed();
    let (_pa1, a1_again) = start_member("a1", &a1.to_string());
    let (_pa2, a2_again) = start_member("a2", &a2.to_string());
    let restarted = t0.elapsed();
    assert_eq!((a1_again, a2_again), (a1, a2));
    let samples = load.await.expect("load");

    eprintln!(
        "backup: {} requests; a1 killed at {kill1:?}, a2 at {kill2:?}, both restarted \
         {restart_start:?}..{restarted:?}; before the kills {:?}, a2 alone {:?}, both dead {:?}, \
         after the restart {:?}",
        samples.len(),
        tally(samples.iter().filter(|s| s.end < kill1)),
        tally(samples.iter().filter(|s| s.start >= kill1 && s.end < kill2_start)),
        tally(samples.iter().filter(|s| s.start >= kill2 && s.end < restart_start)),
        tally(samples.iter().filter(|s| s.start >= restarted)),
    );
    let failed = failures(&samples);
    assert!(
        failed.is_empty(),
        "{} of {} GETs failed: {:#?}",
        failed.len(),
        samples.len(),
        first(&failed, 10)
    );
    let b_early: Vec<_> =
        samples.iter().filter(|s| s.end < kill2_start && s.ok_body() == Some("b1")).collect();
    assert!(
        b_early.is_empty(),
        "the backup served while a primary member was up: {:#?}",
        first(&b_early, 10)
    );
    let a2_alone =
        tally(samples.iter().filter(|s| s.start >= kill1 + DETECT && s.end < kill2_start));
    assert!(
        a2_alone.len() == 1 && a2_alone.contains_key("a2"),
        "after a1 died only a2 should serve: {a2_alone:?}"
    );
    let backup =
        tally(samples.iter().filter(|s| s.start >= kill2 + DETECT && s.end < restart_start));
    assert!(
        backup.len() == 1 && backup.contains_key("b1"),
        "with both primary members dead only the backup should serve: {backup:?}"
    );
    let back = tally(samples.iter().filter(|s| s.start >= restarted + DETECT));
    assert!(
        back.len() == 2 && back.contains_key("a1") && back.contains_key("a2"),
        "traffic should return to both restarted primary members only: {back:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Passive outlier detection.
// ---------------------------------------------------------------------------------------------

/// First ejection time in the outlier tests.
const EJECTION: Duration = Duration::from_millis(1500);

/// Four in-test members, the first `bad` answering 500; one sequential client for
/// EJECTION + 900 ms. Returns each member's arrival times since t0 and the samples.
async fn outlier_run(bad: usize) -> (Vec<Vec<Duration>>, Vec<Sample>) {
    let members: Vec<TestMember> = (1..=4)
        .map(|i| {
            let mode = if i <= bad { Mode::Fail500 } else { Mode::Echo { delay_ms: 0 } };
            TestMember::spawn(&format!("m{i}"), mode)
        })
        .collect();
    let list = members_line(members.iter().map(|m| entry(&m.name, m.addr, "")));
    let router = start_router(&one_cluster(&format!(
        "algorithm = \"round-robin\"\n\
         outlier = {{ consecutive_failures = 3, count_5xx = true, base_ejection_ms = {}, max_ejected_percent = 50 }}\n{list}",
        EJECTION.as_millis()
    )));
    let url = format!("{}/", router.base);
    let t0 = Instant::now();
    let make: MakeRequest = Arc::new(move |_| get(&url, &[]));
    let samples =
        start_load(1, t0, EJECTION + Duration::from_millis(900), Duration::from_millis(10), make)
            .await
            .expect("load");
    let arrivals = members
        .iter()
        .map(|m| m.arrivals().iter().map(|a| a.duration_since(t0)).collect())
        .collect();
    (arrivals, samples)
}

/// Every request answered (no failover for a member's own 500), 500s exactly from bad members.
fn check_statuses(bad: usize, arrivals: &[Vec<Duration>], samples: &[Sample]) {
    let answered: Vec<_> = samples.iter().filter_map(|s| s.outcome.as_ref().ok()).collect();
    assert_eq!(answered.len(), samples.len(), "requests failed: {:#?}", failures(samples));
    let n500 = answered.iter().filter(|r| r.status == 500).count();
    let n200 = answered.iter().filter(|r| r.status == 200).count();
    let bad_arrivals: usize = arrivals[..bad].iter().map(Vec::len).sum();
    let good_arrivals: usize = arrivals[bad..].iter().map(Vec::len).sum();
    assert_eq!((n500, n200), (bad_arrivals, good_arrivals), "statuses vs arrivals {arrivals:?}");
}

/// A bad member got 3 requests, none for the ejection time, then 3 more (ejected again).
fn check_ejected_then_back(name: &str, a: &[Duration]) {
    assert_eq!(a.len(), 6, "{name}: 3 failures, ejection, back, 3 failures, ejection again: {a:?}");
    assert!(a[2] < Duration::from_secs(1), "{name}: its first 3 requests came late: {a:?}");
    let gap = a[3] - a[2];
    assert!(
        gap >= EJECTION - Duration::from_millis(10),
        "{name}: requests within the {EJECTION:?} ejection (gap {gap:?}): {a:?}"
    );
    assert!(
        gap <= EJECTION + Duration::from_millis(500),
        "{name}: not back soon after the {EJECTION:?} ejection (gap {gap:?}): {a:?}"
    );
}

#[test]
fn a_member_answering_500_is_ejected_after_3_failures_for_the_ejection_time() {
    run_serial(async {
        let (arrivals, samples) = outlier_run(1).await;
        eprintln!(
            "outlier, 1 bad of 4: {} requests; arrivals per member {:?}",
            samples.len(),
            arrivals.iter().map(Vec::len).collect::<Vec<_>>()
        );
        check_statuses(1, &arrivals, &samples);
        check_ejected_then_back("m1", &arrivals[0]);
    });
}

#[test]
fn two_bad_members_of_4_are_both_ejected() {
    run_serial(async {
        let (arrivals, samples) = outlier_run(2).await;
        eprintln!(
            "outlier, 2 bad of 4: {} requests; arrivals per member {:?}",
            samples.len(),
            arrivals.iter().map(Vec::len).collect::<Vec<_>>()
        );
        check_statuses(2, &arrivals, &samples);
        check_ejected_then_back("m1", &arrivals[0]);
        check_ejected_then_back("m2", &arrivals[1]);
    });
}

#[test]
fn with_three_bad_members_of_4_at_most_half_are_ejected() {
    run_serial(async {
        let (arrivals, samples) = outlier_run(3).await;
        check_statuses(3, &arrivals, &samples);
        // Until the first ejection could end, count each bad member's requests.
        let first_third =
            arrivals[..3].iter().filter_map(|a| a.get(2)).min().copied().expect("a third request");
        let window = first_third + EJECTION - Duration::from_millis(100);
        let mut counts: Vec<usize> =
            arrivals[..3].iter().map(|a| a.iter().filter(|t| **t < window).count()).collect();
        eprintln!(
            "outlier, 3 bad of 4: {} requests; bad members' requests before {window:?}: {counts:?}; all {:?}",
            samples.len(),
            arrivals.iter().map(Vec::len).collect::<Vec<_>>()
        );
        counts.sort_unstable();
        assert_eq!(
            &counts[..2],
            &[3, 3],
            "two bad members ejected after 3 failures each: {arrivals:?}"
        );
        assert!(counts[2] >= 10, "the third bad member must stay in (50% cap): {arrivals:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// 5. A draining member keeps its sticky sessions.
// ---------------------------------------------------------------------------------------------

/// The sticky cookie's token for a member (docs/router.md, "Placement").
fn token(member: &str) -> String {
    format!("{:016x}", rondo_core::hash::hash_key(member.as_bytes()))
}

fn cookie_of(name: &str) -> String {
    format!("rondo-member={}", token(name))
}

#[test]
fn a_draining_member_keeps_its_sticky_sessions_but_gets_no_new_ones() {
    run_serial(async {
        let (mut p1, a1) = start_member("m1", "127.0.0.1:0");
        let (_p2, a2) = start_member("m2", "127.0.0.1:0");
        let (_p3, a3) = start_member("m3", "127.0.0.1:0");
        let list = members_line([
            entry("m1", a1, "state = \"draining\""),
            entry("m2", a2, ""),
            entry("m3", a3, ""),
        ]);
        let router = start_router(&one_cluster(&format!(
            "algorithm = \"round-robin\"\ngranularity = \"session\"\n{HEALTH}\n{RETRY}\n{list}"
        )));
        let url = format!("{}/", router.base);
        let client = http_client();

        // New sessions: never on m1; each response pins the session with a cookie.
        let mut new_sessions = HashMap::new();
        for _ in 0..30 {
            let r = send(&client, get(&url, &[])).await.expect("reply");
            assert_eq!(r.status, 200, "{r:?}");
            assert_ne!(r.body, "m1", "a new session landed on the draining member");
            let expected = format!("{}; Path=/; HttpOnly; SameSite=Lax", cookie_of(&r.body));
            assert_eq!(r.set_cookie.as_deref(), Some(expected.as_str()), "{r:?}");
            *new_sessions.entry(r.body).or_insert(0) += 1;
        }
        assert!(
            new_sessions.len() == 2,
            "new sessions should spread over m2 and m3: {new_sessions:?}"
        );

        // Existing sessions stay where they are, on the draining member too, with no new cookie.
        for (member, n) in [("m1", 20), ("m3", 10)] {
            let cookie = cookie_of(member);
            for _ in 0..n {
                let r =
                    send(&client, get(&url, &[(COOKIE.as_str(), &cookie)])).await.expect("reply");
                assert_eq!((r.status, r.body.as_str()), (200, member), "{r:?}");
                assert_eq!(r.set_cookie, None, "a kept session got a new cookie: {r:?}");
            }
        }

        // A token of no member: a new session.
        let r = send(&client, get(&url, &[(COOKIE.as_str(), "rondo-member=0123456789abcdef")]))
            .await
            .expect("reply");
        assert!(r.status == 200 && (r.body == "m2" || r.body == "m3"), "{r:?}");
        assert!(r.set_cookie.is_some(), "an unknown session got no cookie: {r:?}");

        // The draining member dies: its sessions move (the request that finds it dead is retried),
        // with the new member's cookie, before and after health checks notice.
        p1.kill();
        let killed = Instant::now();
        let cookie = cookie_of("m1");
        let mut moved = Vec::new();
        while killed.elapsed() < DETECT + Duration::from_millis(300) {
            let r = send(&client, get(&url, &[(COOKIE.as_str(), &cookie)])).await.expect("reply");
            assert!(r.status == 200 && (r.body == "m2" || r.body == "m3"), "{r:?}");
            let expected = format!("{}; Path=/; HttpOnly; SameSite=Lax", cookie_of(&r.body));
            assert_eq!(r.set_cookie.as_deref(), Some(expected.as_str()), "{r:?}");
            moved.push(r.body);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "draining: new sessions {new_sessions:?}; {} requests of m1's session after it died",
            moved.len()
        );
    });
}
