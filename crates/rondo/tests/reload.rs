//! Live reconfiguration: a real `rondo serve` process picking up config file changes (saved by
//! rename, edited in place with SIGHUP, invalid), and 100 view swaps under steady load with no
//! failed request, no reset connection and view ids that only grow.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rondo::member::{self, Member};
use rondo_runtime::Live;

use common::{BIN, Proc, TempDir, collect_lines};

/// `rondo serve` as a child process, killed (and reaped) on drop, with its stdout lines on a
/// channel and its stderr lines collected.
struct Serve {
    proc: Proc,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    fn start(config: &Path) -> Serve {
        let mut child = Command::new(BIN)
            .args(["serve", "--config", config.to_str().expect("utf-8 path"), "--workers", "1"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rondo");
        let stderr = collect_lines(child.stderr.take().expect("stderr"));
        Serve { proc: Proc::from_child(child), stderr }
    }

    /// The first stdout line containing `needle`, waiting at most `wait` in all.
    fn line_with(&mut self, needle: &str, wait: Duration) -> String {
        self.proc.line_with(needle, wait)
    }

    /// Waits at most `wait` for a stderr line containing every one of `needles`.
    async fn stderr_with(&self, needles: &[&str], wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(l) =
                self.stderr.lock().unwrap().iter().find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return l.clone();
            }
            if Instant::now() > deadline {
                panic!("no stderr line with {needles:?}: {:#?}", self.stderr.lock().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal_hup(&self) {
        // The shell's built-in kill: no extra package, no libc binding.
        let ok = Command::new("sh")
            .args(["-c", &format!("kill -HUP {}", self.proc.child.id())])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -HUP failed");
    }

    fn assert_running(&mut self) {
        assert_eq!(self.proc.child.try_wait().expect("try_wait"), None, "rondo serve exited");
    }
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn members(n: usize, delay: Duration) -> Vec<Member> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.push(member::spawn(&format!("m{i}"), any_port(), delay).await.expect("member starts"));
    }
    v
}

/// One listener `web` on a free port, one route to cluster `c` (`algorithm`) over `members`
/// (name, address, weight), padded with a comment to `pad` bytes when `pad` is set.
fn config(algorithm: &str, members: &[(&str, SocketAddr, u32)], pad: usize) -> String {
    let entries: Vec<String> = members
        .iter()
        .map(|(n, a, w)| format!("{{ name = \"{n}\", address = \"{a}\", weight = {w} }}"))
        .collect();
    let mut text = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"{algorithm}\"\nmembers = [{}]\n",
        entries.join(", ")
    );
    if pad > 0 {
        assert!(text.len() < pad, "config longer than its padding");
        text.push('#');
        while text.len() < pad - 1 {
            text.push('-');
        }
        text.push('\n');
    }
    text
}

/// Writes `text` to a temporary file beside `path` and renames it over `path`, as editors do.
fn save_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).expect("write temp file");
    std::fs::rename(&tmp, path).expect("rename over the config");
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// GETs `url`, which must answer 200 within 10 s: the serving member's name.
async fn served(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> String {
    let fut = async {
        let resp = client
            .request(Request::get(url).body(Empty::new()).unwrap())
            .await
            .expect("request succeeds");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let body = String::from_utf8_lossy(&body).trim().to_owned();
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    };
    tokio::time::timeout(Duration::from_secs(10), fut).await.expect("reply within 10 s")
}

/// The members that served `n` requests.
async fn served_set(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    n: usize,
) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for _ in 0..n {
        set.insert(served(client, url).await);
    }
    set
}

/// Waits at most `wait` until `n` requests are served by exactly the members `want`; returns
/// how long it took.
async fn until_served_by(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    want: &[&str],
    wait: Duration,
) -> Duration {
    let start = Instant::now();
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    loop {
        let got = served_set(client, url, 30).await;
        if got == want {
            return start.elapsed();
        }
        assert!(start.elapsed() < wait, "after {wait:?} still served by {got:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reloads_on_rename_sighup_and_keeps_the_old_view_on_errors() {
    let dir = TempDir::new("reload");
    let ms = members(3, Duration::ZERO).await;
    let m = |i: usize| (ms[i].name.as_str(), ms[i].addr, 100);
    const PAD: usize = 1024;
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config("round-robin", &[m(0), m(1)], PAD)).expect("write config");
    let mut serve = Serve::start(&path);
    let line = serve.line_with("listener web on", Duration::from_secs(10));
    let addr: SocketAddr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("address");
    serve.line_with("rondo: reloading on changes", Duration::from_secs(10));
    let url = format!("http://{addr}/");
    let c = client();
    assert_eq!(served_set(&c, &url, 20).await, ["m1", "m2"].map(String::from).into());

    // An editor-style save (new file renamed over the old one) adding m3.
    save_by_rename(&path, &config("round-robin", &[m(0), m(1), m(2)], PAD));
    let took = until_served_by(&c, &url, &["m1", "m2", "m3"], Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(2), "the new member served after {took:?}");

    // An in-place edit the watcher cannot see (same length, inode and modification time):
    // only SIGHUP applies it.
    let before = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::write(&path, config("round-robin", &[m(2)], PAD)).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(before).unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        served_set(&c, &url, 20).await.len(),
        3,
        "an unseen edit is not applied without SIGHUP"
    );
    serve.signal_hup();
    until_served_by(&c, &url, &["m3"], Duration::from_secs(2)).await;
    serve.assert_running();

    // An invalid config (a typo'd field): logged with file:line:column, the old view stays.
    let bad = config("round-robin", &[m(0)], PAD).replace("algorithm", "algoritm");
    save_by_rename(&path, &bad);
    let logged = serve
        .stderr_with(&[&format!("{}:11:1", path.display()), "algoritm"], Duration::from_secs(3))
        .await;
    assert!(logged.contains("file change"), "names the source: {logged}");
    assert_eq!(served_set(&c, &url, 20).await, ["m3"].map(String::from).into());
    serve.signal_hup();
    serve.stderr_with(&["SIGHUP", "algoritm"], Duration::from_secs(3)).await;
    assert_eq!(served_set(&c, &url, 20).await, ["m3"].map(String::from).into());
    serve.assert_running();

    // A file that is not UTF-8 (issue 41 item 8): logged at the first bad byte's line and
    // column, the old view stays.
    let text = config("round-robin", &[m(0)], PAD);
    let at = text.find("#-").expect("padding") + 1;
    let line = text[..at].matches('\n').count() + 1;
    let mut bad = text.into_bytes();
    bad[at] = 0xff;
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, &bad).expect("write temp file");
    std::fs::rename(&tmp, &path).expect("rename over the config");
    let logged = serve
        .stderr_with(
            &[&format!("{}:{line}:2", path.display()), "not UTF-8"],
            Duration::from_secs(3),
        )
        .await;
    assert!(logged.contains("bad byte 0xff"), "{logged}");
    assert_eq!(served_set(&c, &url, 20).await, ["m3"].map(String::from).into());
    serve.assert_running();

    // Fixed, it applies again.
    save_by_rename(&path, &config("round-robin", &[m(0), m(2)], PAD));
    until_served_by(&c, &url, &["m1", "m3"], Duration::from_secs(3)).await;
}

/// One keep-alive HTTP/1.1 connection to `addr` sending GETs until `stop`, alternating a quick
/// path and a slow one (so requests are in flight on members being removed); asserts every
/// reply is 200 and that the view ids it sees never go back. Returns the requests sent.
async fn steady_client(addr: SocketAddr, live: Arc<Live>, stop: Arc<AtomicU64>) -> u64 {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    let conn = tokio::spawn(conn);
    let mut sent = 0u64;
    let mut last_view = 0;
    while stop.load(Ordering::Relaxed) == 0 {
        let view = live.load().view.id;
        assert!(view >= last_view, "view id went back from {last_view} to {view}");
        last_view = view;
        let path = if sent.is_multiple_of(2) { "/" } else { "/slow/5" };
        let req = Request::get(path).header("host", "test").body(Empty::<Bytes>::new()).unwrap();
        send.ready().await.expect("connection stays usable");
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .expect("reply within 10 s")
            .expect("no connection error");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("whole body").to_bytes();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        sent += 1;
    }
    drop(send);
    conn.await.expect("connection task").expect("connection closed cleanly");
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_swaps_under_load_fail_no_request() {
    let ms = members(4, Duration::from_millis(1)).await;
    let entry = |i: usize, w: u32| (ms[i].name.as_str(), ms[i].addr, w);
    let all: Vec<_> = (0..4).map(|i| entry(i, 100)).collect();
    let first = rondo_config::parse_str(&config("weighted", &all, 0), Path::new("t.toml"), 1)
        .expect("valid config");
    let live = Arc::new(Live::new(first.view.clone(), None));
    let router = rondo_proxy::start(&first.listeners, live.clone()).await.expect("router starts");
    let addr = router.addr("web").expect("listener");

    let stop = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> =
        (0..4).map(|_| tokio::spawn(steady_client(addr, live.clone(), stop.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let algorithms = ["weighted", "round-robin", "least-sessions", "p2c-ewma"];
    let mut last = live.load().view.id;
    for i in 0..100usize {
        // A non-empty subset of the 4 members (rotating through all 15), reweighted.
        let subset = i % 15 + 1;
        let chosen: Vec<_> = (0..4)
            .filter(|j| subset & (1 << j) != 0)
            .map(|j| entry(j, 1 + ((i * 7 + j * 13) % 10) as u32 * 50))
            .collect();
        let text = config(algorithms[i / 15 % algorithms.len()], &chosen, 0);
        let next = live.load().view.id + 1;
        let cfg = rondo_config::parse_str(&text, Path::new("t.toml"), next).expect("valid");
        let id = live.apply(cfg.view).view.id;
        assert!(id > last, "view id {id} after {last}");
        last = id;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(1, Ordering::Relaxed);
    let mut total = 0;
    for c in clients {
        total += c.await.expect("client task (no failed request, no reset connection)");
    }
    assert_eq!(live.load().view.id, 101);
    assert!(total > 100, "steady load: {total} requests");
    // Every request that began on a retired view ended on its successor: nothing in flight.
    let snap = live.load();
    snap.clusters["c"].with(|b| {
        for s in b.states() {
            assert_eq!(s.load.in_flight, 0, "{s:?}");
        }
    });
    router.stop();
}

/// GETs `url`: the value of the response's `x-policy` field (the request must answer 200).
async fn policy_of(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> String {
    let fut = client.request(Request::get(url).body(Empty::new()).unwrap());
    let resp = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("reply within 10 s")
        .expect("request succeeds");
    assert_eq!(resp.status(), StatusCode::OK);
    let v = resp.headers().get("x-policy").map(|v| v.to_str().unwrap().to_owned());
    v.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_filters_for_new_requests_and_not_for_those_in_flight() {
    let dir = TempDir::new("reload-filters");
    // A member that holds each request 1.5 s, so one is in flight across the reload.
    let ms = members(1, Duration::from_millis(1500)).await;
    let with_policy = |v: &str| {
        config("round-robin", &[(ms[0].name.as_str(), ms[0].addr, 100)], 0).replace(
            "cluster = \"c\"\n",
            &format!(
                "cluster = \"c\"\nfilters = [ {{ headers = {{ response = {{ set = {{ \"x-policy\" = \"{v}\" }} }} }} }} ]\n"
            ),
        )
    };
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, with_policy("v1")).expect("write config");
    let mut serve = Serve::start(&path);
    let line = serve.line_with("listener web on", Duration::from_secs(10));
    let addr: SocketAddr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("address");
    serve.line_with("rondo: reloading on changes", Duration::from_secs(10));
    let url = format!("http://{addr}/");
    let in_flight = {
        let url = url.clone();
        tokio::spawn(async move { policy_of(&client(), &url).await })
    };
    // The request is at the member (it holds it 1.5 s) when the new filter is saved.
    tokio::time::sleep(Duration::from_millis(300)).await;
    save_by_rename(&path, &with_policy("v2"));
    serve.stderr_with(&["config reload", "applied"], Duration::from_secs(3)).await;
    assert!(!in_flight.is_finished(), "the request ended before the reload: nothing tested");
    assert_eq!(in_flight.await.unwrap(), "v1", "a request in flight keeps its chain");
    assert_eq!(policy_of(&client(), &url).await, "v2", "a new request gets the new chain");
    serve.assert_running();
}
