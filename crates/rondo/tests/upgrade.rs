//! Hitless restarts and binary upgrades against real `rondo serve` processes: ten upgrades in a
//! row under load (HTTP/1.1 keep-alive, h2c, a TCP listener, a WebSocket and a TCP tunnel held
//! open, naming lookups) with no refused connection and no failed request; the state a new
//! process takes over (health, drains and who set them); refusals that leave the running
//! process serving (a broken config, a racing upgrade, a new process gone before it is ready);
//! `rondo ctl upgrade`, `SIGUSR2`, and the drain on `SIGTERM`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Proc, TempDir};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TOKEN: &str = "upgrade-test-token-0123456789";
/// Every load loop ends by this deadline whatever happens.
const LOAD_LIMIT: Duration = Duration::from_secs(120);

/// What one load generator counted.
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    /// HTTP/2 requests the router's GOAWAY said it did not process (sent again, as RFC 9113
    /// section 6.8 allows).
    not_processed: AtomicU64,
}

impl Counts {
    fn add(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self) -> (u64, u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// An echo server: every connection gets back what it sends.
async fn tcp_echo() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Reads one request head from `s`: its first line and its header lines, lower-cased (`None`:
/// the connection ended first).
async fn read_head<R: tokio::io::AsyncBufRead + Unpin>(s: &mut R) -> Option<(String, Vec<String>)> {
    let mut first = String::new();
    if s.read_line(&mut first).await.unwrap_or(0) == 0 {
        return None;
    }
    let mut fields = Vec::new();
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        if line == "\r\n" {
            return Some((first, fields));
        }
        fields.push(line.to_ascii_lowercase());
    }
}

/// A WebSocket-like member: answers an `Upgrade: websocket` request with 101, then echoes.
async fn ws_member() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut s = BufReader::new(s);
                if read_head(&mut s).await.is_none() {
                    return;
                }
                let answer = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                              Upgrade: websocket\r\n\r\n";
                if s.get_mut().write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                let (mut r, mut w) = tokio::io::split(s);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// The router's configuration: listener `web` (HTTP, to `app`; `/ws` to the WebSocket member),
/// listener `tcp` (to the echo member), admin, naming with an embedded registry on disk and
/// DNS, an agent receiver.
fn config(dir: &Path, app: &[rondo::member::Member], echo: SocketAddr, ws: SocketAddr) -> String {
    let members: Vec<String> = app
        .iter()
        .map(|m| format!("{{ name = \"{}\", address = \"{}\" }}", m.name, m.addr))
        .collect();
    format!(
        "[router]\nupgrade_socket = \"{sock}\"\ndrain_timeout_ms = 8000\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nsnapshot = \"{snap}\"\ndns_listen = \"127.0.0.1:0\"\n\n\
         [agent]\nlisten = \"127.0.0.1:0\"\nkey = \"agent-key-of-the-upgrade-test\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nname = \"tcp\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
         [[route]]\nname = \"ws\"\nlistener = \"web\"\ncluster = \"ws\"\n\
         match = {{ path_prefix = \"/ws\" }}\n\n\
         [[route]]\nname = \"app\"\nlistener = \"web\"\ncluster = \"app\"\n\n\
         [[route]]\nname = \"tcp\"\nlistener = \"tcp\"\ncluster = \"echo\"\n\n\
         [cluster.app]\nalgorithm = \"round-robin\"\nmembers = [{}]\n\n\
         [cluster.echo]\nupstream_protocol = \"tcp\"\n\
         members = [{{ name = \"e1\", address = \"{echo}\" }}]\n\n\
         [cluster.ws]\nmembers = [{{ name = \"w1\", address = \"{ws}\" }}]\n",
        members.join(", "),
        sock = dir.join("upgrade.sock").display(),
        snap = dir.join("registry.json").display(),
    )
}

/// A router generation: its process and the addresses it printed.
struct Gen {
    proc: Proc,
    web: SocketAddr,
    tcp: SocketAddr,
    naming: SocketAddr,
    /// The agent receiver's and the DNS server's addresses.
    others: (String, SocketAddr),
}

fn addr_of(line: &str) -> SocketAddr {
    line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("an address ends the line")
}

/// Starts `rondo serve` (with `--upgrade`: taking over) and waits until it serves.
fn start(config: &Path, upgrade: bool) -> Gen {
    start_notifying(config, upgrade, None)
}

/// [`start`], with `NOTIFY_SOCKET` set to `notify` when given.
fn start_notifying(config: &Path, upgrade: bool, notify: Option<&Path>) -> Gen {
    let path = config.to_str().unwrap();
    let args: Vec<&str> = if upgrade {
        vec!["serve", "--upgrade", "--config", path]
    } else {
        vec!["serve", "--config", path]
    };
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.args(&args).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    cmd.stderr(std::process::Stdio::null());
    if let Some(n) = notify {
        cmd.env("NOTIFY_SOCKET", n);
    }
    let mut proc = Proc::from_child(cmd.spawn().expect("start rondo serve"));
    let wait = Duration::from_secs(20);
    let web = addr_of(&proc.line_with("rondo: listener web on", wait));
    let tcp = addr_of(&proc.line_with("rondo: listener tcp on", wait));
    let agent = proc.line_with("rondo: agent receiver on", wait);
    let agent = agent.split(' ').nth(4).expect("the agent receiver's address").to_owned();
    let naming = addr_of(&proc.line_with("rondo: naming API (registry embedded) on", wait));
    let dns = addr_of(&proc.line_with("rondo: naming DNS", wait));
    proc.line_with("rondo: reloading on changes", wait);
    Gen { proc, web, tcp, naming, others: (agent, dns) }
}

/// Reads one HTTP/1.1 response (content-length bodies) from `r`: status, whether it closes
/// the connection, the body.
async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
) -> std::io::Result<(u16, bool, String)> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut len, mut close) = (0usize, false);
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await?;
    Ok((status, close, String::from_utf8_lossy(&body).into_owned()))
}

/// HTTP/1.1 keep-alive: requests one after another on one connection, a new connection when a
/// response says `Connection: close`. Any request without a 200 is a failure.
async fn h1_load(addr: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let start = Instant::now();
    let mut conn: Option<BufReader<TcpStream>> = None;
    while !stop.load(Ordering::Relaxed) && start.elapsed() < LOAD_LIMIT {
        if conn.is_none() {
            match TcpStream::connect(addr).await {
                Ok(s) => conn = Some(BufReader::new(s)),
                Err(_) => {
                    counts.add(&counts.refused);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().unwrap();
        let sent = c.get_mut().write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let answer = match sent {
            Ok(()) => read_response(c).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok((200, close, _)) => {
                counts.add(&counts.ok);
                if close {
                    conn = None;
                }
            }
            Ok((_, _, _)) | Err(_) => {
                counts.add(&counts.failed);
                conn = None;
            }
        }
    }
}

/// Whether an HTTP/2 request failed without reaching the server: the server's GOAWAY left it
/// unprocessed, or the client connection closed (after a GOAWAY) before it was sent (hyper's
/// `Canceled`, which its pooled client retries too).
fn unprocessed(e: &hyper::Error) -> bool {
    if e.is_canceled() {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.is_go_away() || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        source = s.source();
    }
    false
}

/// h2c (prior knowledge): requests one after another on one connection, a new one when it goes
/// away.
async fn h2_load(addr: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let start = Instant::now();
    let mut sender: Option<hyper::client::conn::http2::SendRequest<Empty<Bytes>>> = None;
    while !stop.load(Ordering::Relaxed) && start.elapsed() < LOAD_LIMIT {
        if sender.as_ref().is_none_or(|s| s.is_closed()) {
            let Ok(stream) = TcpStream::connect(addr).await else {
                counts.add(&counts.refused);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            match hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
            {
                Ok((s, conn)) => {
                    tokio::spawn(conn);
                    sender = Some(s);
                }
                Err(e) => {
                    eprintln!("h2c handshake failed: {e:?}");
                    counts.add(&counts.failed);
                    continue;
                }
            }
        }
        let s = sender.as_mut().unwrap();
        if s.ready().await.is_err() {
            // The connection went away between requests: nothing was sent on it.
            sender = None;
            continue;
        }
        let req = http::Request::get(format!("http://{addr}/")).body(Empty::new()).unwrap();
        match s.send_request(req).await {
            Ok(resp) if resp.status() == 200 => match resp.into_body().collect().await {
                Ok(_) => counts.add(&counts.ok),
                Err(e) => {
                    eprintln!("h2c response body failed: {e:?}");
                    counts.add(&counts.failed);
                }
            },
            Ok(resp) => {
                eprintln!("h2c response: {}", resp.status());
                counts.add(&counts.failed);
            }
            Err(e) if unprocessed(&e) => {
                counts.add(&counts.not_processed);
                sender = None;
            }
            Err(e) => {
                eprintln!("h2c request failed: {e:?}");
                counts.add(&counts.failed);
                sender = None;
            }
        }
    }
}

/// The TCP listener: a new connection for each exchange.
async fn tcp_load(addr: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let start = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && start.elapsed() < LOAD_LIMIT {
        n += 1;
        let Ok(s) = TcpStream::connect(addr).await else {
            counts.add(&counts.refused);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let line = format!("exchange {n}\n");
        let mut s = BufReader::new(s);
        let mut back = String::new();
        let ok = s.get_mut().write_all(line.as_bytes()).await.is_ok()
            && tokio::time::timeout(Duration::from_secs(10), s.read_line(&mut back))
                .await
                .is_ok_and(|r| r.is_ok())
            && back == line;
        counts.add(if ok { &counts.ok } else { &counts.failed });
    }
}

/// Naming lookups, each on a fresh connection.
async fn lookup_load(addr: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && start.elapsed() < LOAD_LIMIT {
        let Ok(s) = TcpStream::connect(addr).await else {
            counts.add(&counts.refused);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut s = BufReader::new(s);
        let req = "GET /v1/lookup/app HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let answer = match s.get_mut().write_all(req.as_bytes()).await {
            Ok(()) => read_response(&mut s).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok((200, _, _)) => counts.add(&counts.ok),
            other => {
                eprintln!("lookup failed: {other:?}");
                counts.add(&counts.failed);
            }
        }
    }
}

/// A connection held open through an upgrade: one line out and back.
async fn exchange(conn: &mut BufReader<TcpStream>, line: &str) -> bool {
    let mut back = String::new();
    conn.get_mut().write_all(line.as_bytes()).await.is_ok()
        && tokio::time::timeout(Duration::from_secs(5), conn.read_line(&mut back))
            .await
            .is_ok_and(|r| r.is_ok())
        && back == line
}

async fn open_ws(web: SocketAddr) -> BufReader<TcpStream> {
    let mut s = BufReader::new(TcpStream::connect(web).await.expect("connect for the websocket"));
    let req = "GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
               Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    let mut line = String::new();
    s.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("HTTP/1.1 101"), "websocket upgrade answered {line:?}");
    loop {
        line.clear();
        s.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_upgrades_under_load_refuse_nothing_and_fail_nothing() {
    let dir = TempDir::new("upgrade");
    let app = vec![
        rondo::member::spawn("m1", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap(),
        rondo::member::spawn("m2", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap(),
    ];
    let (echo, ws) = (tcp_echo().await, ws_member().await);
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config(&dir.0, &app, echo, ws)).unwrap();
    let mut current = start(&path, false);
    let (web, tcp, naming) = (current.web, current.tcp, current.naming);

    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<(&str, Arc<Counts>)> = ["http/1.1", "h2c", "tcp", "lookups"]
        .into_iter()
        .map(|n| (n, Arc::new(Counts::default())))
        .collect();
    let loads = vec![
        tokio::spawn(h1_load(web, stop.clone(), counts[0].1.clone())),
        tokio::spawn(h1_load(web, stop.clone(), counts[0].1.clone())),
        tokio::spawn(h2_load(web, stop.clone(), counts[1].1.clone())),
        tokio::spawn(tcp_load(tcp, stop.clone(), counts[2].1.clone())),
        tokio::spawn(lookup_load(naming, stop.clone(), counts[3].1.clone())),
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A 5-second request, started before the first upgrade.
    let mut slow = Some(tokio::spawn(async move {
        let mut s = BufReader::new(TcpStream::connect(web).await.unwrap());
        s.get_mut().write_all(b"GET /slow/5000 HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
        read_response(&mut s).await
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut old_exits = Vec::new();
    for round in 1..=10 {
        // Held open through this upgrade: a WebSocket and a TCP tunnel.
        let mut socket = open_ws(web).await;
        let mut tunnel = BufReader::new(TcpStream::connect(tcp).await.unwrap());
        assert!(exchange(&mut socket, &format!("ws before {round}\n")).await);
        assert!(exchange(&mut tunnel, &format!("tunnel before {round}\n")).await);

        let next = tokio::task::spawn_blocking({
            let path = path.clone();
            move || start(&path, true)
        })
        .await
        .unwrap();
        // The same sockets: the same addresses.
        assert_eq!((next.web, next.tcp, next.naming), (web, tcp, naming));
        assert_eq!(next.others, current.others, "the agent receiver and DNS keep their sockets");
        let mut old = std::mem::replace(&mut current, next);
        let handed = Instant::now();
        old.proc.line_with(
            &format!("rondo: handed over to pid {}", current.proc.child.id()),
            Duration::from_secs(10),
        );
        // The old process still carries what it held.
        assert!(exchange(&mut socket, &format!("ws after {round}\n")).await, "round {round}");
        assert!(exchange(&mut tunnel, &format!("tunnel after {round}\n")).await, "round {round}");
        drop((socket, tunnel));
        // It exits within drain_timeout_ms + 1 s.
        let exited = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(status)) = old.proc.child.try_wait() {
                    return Some(status);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        })
        .await
        .unwrap();
        let took = handed.elapsed();
        let status =
            exited.unwrap_or_else(|| panic!("round {round}: the old process never exited"));
        assert!(status.success(), "round {round}: the old process exited with {status}");
        old_exits.push(took);
        if let Some(slow) = slow.take() {
            let (status, _, body) = slow.await.unwrap().expect("the 5-second request");
            assert_eq!(status, 200, "the 5-second request: {body}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for l in loads {
        l.await.unwrap();
    }
    // DNS answers from the last process, on the first one's socket.
    let dns = current.others.1;
    let dig = std::process::Command::new("dig")
        .args(["@127.0.0.1", "-p", &dns.port().to_string(), "app.rondo.", "A", "+short"])
        .args(["+time=2", "+tries=2"])
        .output();
    match dig {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.lines().any(|l| l == "127.0.0.1"), "dig answered {text:?}");
        }
        Err(_) => assert!(std::env::var_os("CI").is_none(), "dig is missing (dnsutils)"),
    }
    for (name, c) in &counts {
        let (ok, failed, refused) = c.get();
        let retried = c.not_processed.load(Ordering::Relaxed);
        eprintln!("{name}: {ok} ok, {failed} failed, {refused} refused, {retried} not processed");
        assert!(ok > 0, "{name}: no request went through");
        assert_eq!((failed, refused), (0, 0), "{name}: failed or refused requests");
    }
    eprintln!("old processes exited after {old_exits:?}");
    for took in &old_exits {
        assert!(*took <= Duration::from_millis(8000 + 1000), "an old process took {took:?}");
    }
    drop(app);
}

/// `GET /api/v1/status` of the admin API at `admin`.
async fn status(admin: SocketAddr) -> serde_json::Value {
    let mut s = BufReader::new(TcpStream::connect(admin).await.unwrap());
    let req = format!(
        "GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    );
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    let (code, _, body) = read_response(&mut s).await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn member_of<'a>(
    status: &'a serde_json::Value,
    cluster: &str,
    member: &str,
) -> &'a serde_json::Value {
    let c = status["clusters"].as_array().unwrap().iter().find(|c| c["name"] == cluster).unwrap();
    c["members"].as_array().unwrap().iter().find(|m| m["name"] == member).unwrap()
}

/// `rondo ctl ARGS` against `admin`; its stdout, or its stderr on failure.
fn ctl(admin: SocketAddr, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(common::BIN)
        .args(["ctl", "--admin", &admin.to_string(), "--token", TOKEN])
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if out.status.success() { Ok(text(&out.stdout)) } else { Err(text(&out.stderr)) }
}

/// Sends `n` requests to `web` (fresh connections); the member name each answer carries.
async fn answered_by(web: SocketAddr, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..n {
        let mut s = BufReader::new(TcpStream::connect(web).await.unwrap());
        s.get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let (code, _, body) = read_response(&mut s).await.unwrap();
        assert_eq!(code, 200, "{body}");
        names.push(body.trim().to_owned());
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_the_old_process_knew_down_or_drained_gets_nothing_from_the_new_one() {
    let dir = TempDir::new("upgrade-state");
    // m2 serves requests but fails its health check (`/health` answers 503): only health
    // checks say it is down. A new process that forgot it would need `fall` (3) probes, a
    // minute apart in the new configuration, to learn it again, and would send it traffic
    // meanwhile.
    let m1 =
        rondo::member::spawn("m1", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap();
    let m3 =
        rondo::member::spawn("m3", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap();
    let m2 = sick_member("m2").await;
    let write = |interval_ms: u64| {
        format!(
            "[router]\nupgrade_socket = \"{}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \
             \"{TOKEN}\"\n\n[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"sess\"\nmatch = {{ path_prefix = \"/s\" \
             }}\n\n[[route]]\nlistener = \"web\"\ncluster = \"app\"\n\n[cluster.app]\n\
             algorithm = \"round-robin\"\npanic_threshold_percent = 0\n\
             health = {{ path = \"/health\", interval_ms = {interval_ms}, rise = 3, fall = 3 }}\n\
             members = [{{ name = \"m1\", address = \"{m1}\" }}, {{ name = \"m2\", address = \
             \"{m2}\" }}, {{ name = \"m3\", address = \"{m3}\" }}]\n\n\
             [cluster.sess]\nalgorithm = \"random\"\ngranularity = \"session\"\n\
             session = {{ header = \"x-session\" }}\n\
             members = [{{ name = \"m1\", address = \"{m1}\" }}, {{ name = \"m2\", address = \
             \"{m2}\" }}, {{ name = \"m3\", address = \"{m3}\" }}]\n",
            dir.0.join("upgrade.sock").display(),
            m1 = m1.addr,
            m3 = m3.addr,
        )
    };
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, write(100)).unwrap();
    let mut old = tokio::task::spawn_blocking({
        let path = path.clone();
        move || {
            let mut proc = Proc::start(&["serve", "--config", path.to_str().unwrap()]);
            let wait = Duration::from_secs(20);
            let web = addr_of(&proc.line_with("rondo: listener web on", wait));
            let admin = addr_of(&proc.line_with("rondo: admin API on", wait));
            proc.line_with("rondo: reloading on changes", wait);
            (proc, web, admin)
        }
    })
    .await
    .unwrap();
    let (web, admin) = (old.1, old.2);
    // m2 goes down by its checks; an operator drains m1.
    let deadline = Instant::now() + Duration::from_secs(10);
    while member_of(&status(admin).await, "app", "m2")["health"] != "down" {
        assert!(Instant::now() < deadline, "m2 never went down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ctl(admin, &["--operator", "alice", "drain", "app", "m1"]).expect("drain m1");
    let before = status(admin).await;
    assert!(answered_by(web, 6).await.iter().all(|n| n == "m3"));
    // Twelve header sessions, placed at random: a new process that forgot them would place
    // them again, and all twelve landing where they were has a chance of 3^-12.
    let mut sessions = Vec::new();
    for i in 0..12 {
        sessions.push(session_member(web, &format!("s{i}")).await);
    }
    // The new configuration probes once a minute: only the hand-off can tell the new process
    // that m2 is down.
    std::fs::write(&path, write(60_000)).unwrap();
    let new = tokio::task::spawn_blocking({
        let path = path.clone();
        move || {
            let mut proc = Proc::start(&["serve", "--upgrade", "--config", path.to_str().unwrap()]);
            let wait = Duration::from_secs(20);
            proc.line_with("rondo: reloading on changes", wait);
            proc
        }
    })
    .await
    .unwrap();
    old.0.line_with(&format!("handed over to pid {}", new.child.id()), Duration::from_secs(10));
    let after = status(admin).await;
    assert_eq!(after["pid"], new.child.id(), "the new process answers the admin API");
    assert!(after["view"].as_u64() > before["view"].as_u64(), "view ids keep growing");
    for m in ["m1", "m2", "m3"] {
        let (b, a) = (member_of(&before, "app", m), member_of(&after, "app", m));
        for field in ["admin", "admin_by", "health", "health_by"] {
            assert_eq!(a[field], b[field], "{m}.{field} after the upgrade");
        }
    }
    assert_eq!(member_of(&after, "app", "m1")["admin_by"], "operator:alice");
    assert_eq!(member_of(&after, "app", "m2")["health"], "down");
    let names = answered_by(web, 12).await;
    assert!(names.iter().all(|n| n == "m3"), "the new process sent requests to {names:?}");
    for (i, was) in sessions.iter().enumerate() {
        assert_eq!(&session_member(web, &format!("s{i}")).await, was, "session s{i}");
    }
    drop(new);
}

/// The member that answers a request of header session `id` (route `/s`).
async fn session_member(web: SocketAddr, id: &str) -> String {
    let mut s = BufReader::new(TcpStream::connect(web).await.unwrap());
    let req = format!("GET /s HTTP/1.1\r\nHost: t\r\nX-Session: {id}\r\nConnection: close\r\n\r\n");
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    let (code, _, body) = read_response(&mut s).await.unwrap();
    assert_eq!(code, 200, "{body}");
    body.trim().to_owned()
}

/// A member whose `/health` answers 503 and everything else 200 with its name.
async fn sick_member(name: &'static str) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut s = BufReader::new(s);
                while let Some((first, _)) = read_head(&mut s).await {
                    let (status, body) = if first.starts_with("GET /health") {
                        ("503 Service Unavailable", "sick\n".to_owned())
                    } else {
                        ("200 OK", format!("{name}\n"))
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if s.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A temporary directory, member `m1`, and the router's configuration written there (to
/// `m1`, an echo member and a WebSocket member).
async fn one_member_setup(kind: &str) -> (TempDir, Vec<rondo::member::Member>, std::path::PathBuf) {
    let dir = TempDir::new(kind);
    let app = vec![
        rondo::member::spawn("m1", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap(),
    ];
    let (echo, ws) = (tcp_echo().await, ws_member().await);
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config(&dir.0, &app, echo, ws)).unwrap();
    (dir, app, path)
}

/// `GET /slow/MS` on a connection of its own to `web`, answered by a task.
fn slow_request(
    web: SocketAddr,
    ms: u64,
) -> tokio::task::JoinHandle<std::io::Result<(u16, bool, String)>> {
    tokio::spawn(async move {
        let mut s = BufReader::new(TcpStream::connect(web).await.unwrap());
        let req = format!("GET /slow/{ms} HTTP/1.1\r\nHost: t\r\n\r\n");
        s.get_mut().write_all(req.as_bytes()).await.unwrap();
        read_response(&mut s).await
    })
}

/// One frame of the upgrade protocol (a 4-byte length, then JSON), as a new process sends it.
fn send_frame(s: &mut std::os::unix::net::UnixStream, json: &str) {
    use std::io::Write;
    s.write_all(&(json.len() as u32).to_be_bytes()).unwrap();
    s.write_all(json.as_bytes()).unwrap();
}

/// One frame as the running process answers it (descriptors riding on it are dropped).
fn read_frame(s: &mut std::os::unix::net::UnixStream) -> serde_json::Value {
    use std::io::Read;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// `rondo serve --upgrade --config PATH` to its end: exit status and stderr.
fn upgrade_to_end(path: &Path) -> (std::process::ExitStatus, String) {
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--upgrade", "--config", path.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_or_failed_upgrades_leave_the_running_process_serving() {
    let dir = TempDir::new("upgrade-refusals");
    let app = vec![
        rondo::member::spawn("m1", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap(),
    ];
    let (echo, ws) = (tcp_echo().await, ws_member().await);
    let good = config(&dir.0, &app, echo, ws);
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, &good).unwrap();
    let path2 = path.clone();
    let mut running = tokio::task::spawn_blocking(move || start(&path2, false)).await.unwrap();
    let web = running.web;
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let load = tokio::spawn(h1_load(web, stop.clone(), counts.clone()));

    // A broken configuration: the running process never hears of it.
    let broken = dir.0.join("broken.toml");
    std::fs::write(&broken, good.replace("drain_timeout_ms = 8000", "drain_timeout_ms = -1"))
        .unwrap();
    let (status, stderr) =
        tokio::task::spawn_blocking(move || upgrade_to_end(&broken)).await.unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("broken.toml:3:") && stderr.contains("drain_timeout_ms"), "{stderr}");
    assert!(stderr.contains("the running rondo was not touched"), "{stderr}");

    // A new process that cannot reach a running one (nobody answers on its upgrade socket).
    let lonely = dir.0.join("lonely.toml");
    let nobody = dir.0.join("nobody.sock");
    std::fs::write(
        &lonely,
        good.replace(
            &dir.0.join("upgrade.sock").display().to_string(),
            &nobody.display().to_string(),
        ),
    )
    .unwrap();
    let (status, stderr) =
        tokio::task::spawn_blocking(move || upgrade_to_end(&lonely)).await.unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach the running rondo on its upgrade socket"), "{stderr}");

    // An upgrade in progress (a new process that took the offer and is not ready yet): a
    // second one is refused.
    let sock = dir.0.join("upgrade.sock");
    let mut first = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    send_frame(&mut first, r#"{"type":"hello","pid":1,"version":"test"}"#);
    assert_eq!(read_frame(&mut first)["type"], "offer");
    assert_eq!(read_frame(&mut first)["type"], "state");
    let p = path.clone();
    let (status, stderr) = tokio::task::spawn_blocking(move || upgrade_to_end(&p)).await.unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("an upgrade is already in progress"), "{stderr}");
    // The first one goes away before it is ready (as a killed new process does).
    drop(first);

    // A new process that dies before it is ready: it takes the sockets, then cannot bind a
    // listener of its own (the port is taken) and exits.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let failing = dir.0.join("failing.toml");
    std::fs::write(
        &failing,
        format!(
            "{good}\n[[listener]]\nname = \"extra\"\nlisten = \"{}\"\n\n[[route]]\n\
             name = \"extra\"\nlistener = \"extra\"\ncluster = \"app\"\n",
            taken.local_addr().unwrap()
        ),
    )
    .unwrap();
    let (status, stderr) =
        tokio::task::spawn_blocking(move || upgrade_to_end(&failing)).await.unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot bind listener extra"), "{stderr}");
    drop(taken);
    // The running process noticed, and resumed: an upgrade now goes through.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answers = answered_by(web, 5).await;
    assert!(answers.iter().all(|n| n == "m1"), "{answers:?}");
    let p = path.clone();
    let next = tokio::task::spawn_blocking(move || start(&p, true)).await.unwrap();
    running.proc.line_with(
        &format!("rondo: handed over to pid {}", next.proc.child.id()),
        Duration::from_secs(10),
    );
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let (ok, failed, refused) = counts.get();
    assert!(ok > 0);
    assert_eq!((failed, refused), (0, 0), "requests failed or were refused meanwhile");
    drop(next);
}

/// The pid in `rondo: handed over to pid N: draining ...`.
fn handed_to(line: &str) -> u32 {
    let after = line.split("handed over to pid ").nth(1).expect("a hand-over line");
    after.split(':').next().and_then(|p| p.parse().ok()).expect("a pid")
}

/// `kill -SIG PID`.
fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Kills a process this test did not start itself (a successor started by a router) on drop.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-9", &self.0.to_string()]).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_upgrade_and_sigusr2_start_the_successor_themselves() {
    let (_dir, _app, path) = one_member_setup("upgrade-ctl").await;
    let p = path.clone();
    let mut first = tokio::task::spawn_blocking(move || {
        let mut proc = Proc::start(&["serve", "--config", p.to_str().unwrap()]);
        let web = addr_of(&proc.line_with("rondo: listener web on", Duration::from_secs(20)));
        let admin = addr_of(&proc.line_with("rondo: admin API on", Duration::from_secs(20)));
        proc.line_with("rondo: reloading on changes", Duration::from_secs(20));
        (proc, web, admin)
    })
    .await
    .unwrap();
    let (web, admin) = (first.1, first.2);
    let said = ctl(admin, &["upgrade"]).expect("ctl upgrade");
    assert!(said.starts_with("upgrade started: the new process is pid "), "{said}");
    // The successor writes to the same standard output (inherited).
    let second =
        handed_to(&first.0.line_with("rondo: handed over to pid", Duration::from_secs(20)));
    let _second = KillOnDrop(second);
    assert!(said.contains(&second.to_string()), "{said} / {second}");
    assert_eq!(status(admin).await["pid"], second);
    let _ = first.0.child.wait();

    signal(second, "-USR2");
    let third = handed_to(&first.0.line_with("rondo: handed over to pid", Duration::from_secs(20)));
    let _third = KillOnDrop(third);
    assert_ne!(third, second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(admin).await["pid"] != third {
        assert!(Instant::now() < deadline, "the admin API never answered from pid {third}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The third generation serves on the first one's listener.
    assert!(answered_by(web, 3).await.iter().all(|n| n == "m1"));
}

/// Regression: the running process wrote the hand-over on its upgrade socket's thread and
/// could exit (nothing to drain) before that write finished, leaving the new process with a
/// frame cut short ("waiting for the hand-over: the other process hung up"; it then exits and
/// nobody serves). A state larger than the socket's buffers and a new process slow to read it
/// made that certain; now the old process exits only once the hand-over is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_process_stays_until_its_hand_over_is_written() {
    let dir = TempDir::new("upgrade-slow-reader");
    let sock = dir.0.join("upgrade.sock");
    // 4,000 members (no health checks, never asked): a state of about 1 MB.
    let members: Vec<String> = (0..4000)
        .map(|i| format!("{{ name = \"m{i}\", address = \"127.0.0.1:{}\" }}", 20000 + i))
        .collect();
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            "[router]\nupgrade_socket = \"{}\"\n\n[[listener]]\nname = \"web\"\n\
             listen = \"127.0.0.1:0\"\n\n[[route]]\nlistener = \"web\"\ncluster = \"big\"\n\n\
             [cluster.big]\nmembers = [{}]\n",
            sock.display(),
            members.join(", ")
        ),
    )
    .unwrap();
    let mut old = tokio::task::spawn_blocking(move || {
        let mut proc = Proc::start(&["serve", "--config", path.to_str().unwrap()]);
        proc.line_with("rondo: reloading on changes", Duration::from_secs(30));
        proc
    })
    .await
    .unwrap();
    let handover = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        send_frame(&mut s, r#"{"type":"hello","pid":1,"version":"test"}"#);
        assert_eq!(read_frame(&mut s)["type"], "offer");
        let state = read_frame(&mut s);
        assert_eq!(state["type"], "state");
        assert_eq!(state["state"]["clusters"]["big"]["members"].as_array().unwrap().len(), 4000);
        send_frame(&mut s, r#"{"type":"ready"}"#);
        // Slow to read: the old process has nothing to drain and would be gone by now.
        std::thread::sleep(Duration::from_millis(1500));
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0; u32::from_be_bytes(len) as usize];
        assert!(
            body.len() > 1 << 19,
            "a hand-over of {} bytes fits the socket buffers",
            body.len()
        );
        s.read_exact(&mut body).expect("the whole hand-over, not a frame cut short");
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(handover["type"], "handover");
    assert_eq!(handover["state"]["clusters"]["big"]["members"].as_array().unwrap().len(), 4000);
    old.line_with("rondo: handed over to pid 1", Duration::from_secs(10));
    let status = tokio::task::spawn_blocking(move || old.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_what_is_in_flight_and_a_second_one_cuts_it_short() {
    let (dir, _app, path) = one_member_setup("upgrade-term").await;

    // One SIGTERM: the request in flight is answered (and told the connection closes), new
    // connections are refused, and the process exits once it is done.
    let p = path.clone();
    let mut router = tokio::task::spawn_blocking(move || start(&p, false)).await.unwrap();
    let web = router.web;
    let slow = slow_request(web, 2000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    signal(router.proc.child.id(), "-TERM");
    router.proc.line_with("rondo: shutting down: draining 1 connection(s)", Duration::from_secs(5));
    // Its listeners close as the drain begins: connections are refused, not queued.
    let deadline = Instant::now() + Duration::from_secs(2);
    while TcpStream::connect(web).await.is_ok() {
        assert!(Instant::now() < deadline, "a draining router still accepts connections");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, close, body) = slow.await.unwrap().expect("the request in flight is answered");
    assert_eq!((code, close, body.as_str()), (200, true, "m1\n"));
    let status =
        tokio::task::spawn_blocking(move || router.proc.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    assert!(sent.elapsed() < Duration::from_secs(5), "exited {:?} after SIGTERM", sent.elapsed());

    // The drain timeout ends a drain: a 10-second request is cut after `drain_timeout_ms`.
    let short = dir.0.join("short.toml");
    std::fs::write(
        &short,
        std::fs::read_to_string(&path)
            .unwrap()
            .replace("drain_timeout_ms = 8000", "drain_timeout_ms = 1000"),
    )
    .unwrap();
    let mut router = tokio::task::spawn_blocking(move || start(&short, false)).await.unwrap();
    let web = router.web;
    let slow = slow_request(web, 10000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    signal(router.proc.child.id(), "-TERM");
    let status =
        tokio::task::spawn_blocking(move || router.proc.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(3),
        "exited after {took:?}"
    );
    assert!(slow.await.unwrap().is_err(), "the request past the drain timeout is cut");

    // A second SIGTERM ends the drain at once: the 10-second request is cut.
    let p = path.clone();
    let mut router = tokio::task::spawn_blocking(move || start(&p, false)).await.unwrap();
    let web = router.web;
    let slow = slow_request(web, 10000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(router.proc.child.id(), "-TERM");
    router.proc.line_with("rondo: shutting down", Duration::from_secs(5));
    let sent = Instant::now();
    signal(router.proc.child.id(), "-TERM");
    let status =
        tokio::task::spawn_blocking(move || router.proc.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "exited {:?} after the second",
        sent.elapsed()
    );
    assert!(slow.await.unwrap().is_err(), "the request in flight is cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_manager_hears_ready_and_the_new_main_pid() {
    let (dir, _app, path) = one_member_setup("upgrade-notify").await;
    // What systemd does for Type=notify: a datagram socket in NOTIFY_SOCKET.
    let notify = dir.0.join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    manager.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let heard = || {
        let mut buf = [0u8; 512];
        let n = manager.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let (p, n) = (path.clone(), notify.clone());
    let mut first =
        tokio::task::spawn_blocking(move || start_notifying(&p, false, Some(&n))).await.unwrap();
    assert_eq!(heard(), "READY=1");
    let (p, n) = (path.clone(), notify.clone());
    let mut second =
        tokio::task::spawn_blocking(move || start_notifying(&p, true, Some(&n))).await.unwrap();
    assert_eq!(heard(), format!("MAINPID={}\nREADY=1", second.proc.child.id()));
    // The old one drains without a word (a STOPPING=1 from it could stop the service).
    let status = tokio::task::spawn_blocking(move || first.proc.child.wait()).await.unwrap();
    assert!(status.unwrap().success());
    signal(second.proc.child.id(), "-TERM");
    assert_eq!(heard(), "STOPPING=1");
    let status = tokio::task::spawn_blocking(move || second.proc.child.wait()).await.unwrap();
    assert!(status.unwrap().success());
}

/// A member that records the `Idempotency-Key` of every request and answers 200.
async fn key_member(keys: Arc<std::sync::Mutex<std::collections::HashSet<String>>>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let keys = keys.clone();
            tokio::spawn(async move {
                let mut s = BufReader::new(s);
                while let Some((_, fields)) = read_head(&mut s).await {
                    let (mut key, mut len) = (None, 0usize);
                    for f in &fields {
                        if let Some(v) = f.strip_prefix("idempotency-key:") {
                            key = Some(v.trim().to_owned());
                        }
                        if let Some(v) = f.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; len];
                    if s.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    if let Some(k) = key {
                        keys.lock().unwrap().insert(k);
                    }
                    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
                    if s.get_mut().write_all(ok.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_accepted_across_an_upgrade_are_all_delivered() {
    let dir = TempDir::new("upgrade-queue");
    let keys = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let member = key_member(keys.clone()).await;
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            "[router]\nupgrade_socket = \"{}\"\n\n[[listener]]\nname = \"in\"\n\
             listen = \"127.0.0.1:0\"\nprotocol = \"queue\"\n\n[[route]]\nlistener = \"in\"\n\
             cluster = \"c\"\n\n[cluster.c]\nmembers = [{{ name = \"m1\", address = \"{member}\" }}]\n\n\
             [[queue]]\nname = \"orders\"\ndirectory = \"{}\"\n",
            dir.0.join("upgrade.sock").display(),
            dir.0.join("store").display()
        ),
    )
    .unwrap();
    let p = path.clone();
    let (mut old, intake) = tokio::task::spawn_blocking(move || {
        let mut proc = Proc::start(&["serve", "--config", p.to_str().unwrap()]);
        let intake =
            addr_of(&proc.line_with("rondo: queue listener in on", Duration::from_secs(20)));
        proc.line_with("rondo: reloading on changes", Duration::from_secs(20));
        (proc, intake)
    })
    .await
    .unwrap();
    // Messages posted one after another while the upgrade runs; each 202 names its id.
    let stop = Arc::new(AtomicBool::new(false));
    let poster = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut accepted, mut refused, mut unavailable, mut cut) = (Vec::new(), 0, 0, 0);
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_LIMIT {
                let Ok(s) = TcpStream::connect(intake).await else {
                    refused += 1;
                    continue;
                };
                let mut s = BufReader::new(s);
                let req = "POST /queues/orders HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\
                           Connection: close\r\n\r\nhello";
                let answer = match s.get_mut().write_all(req.as_bytes()).await {
                    Ok(()) => read_response(&mut s).await,
                    Err(e) => Err(e),
                };
                match answer {
                    Ok((202, _, body)) => {
                        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                        accepted.push(v["id"].as_str().unwrap().to_owned());
                    }
                    // A message the old process could no longer store (after its hand-over):
                    // refused, so the client sends it again; never accepted and lost.
                    Ok((503, _, _)) => unavailable += 1,
                    // A connection cut before any answer: nothing was acknowledged, so the
                    // client sends the message again (counted, and said in the output).
                    Err(_) => cut += 1,
                    other => panic!("a post answered {other:?}"),
                }
            }
            (accepted, refused, unavailable, cut)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = path.clone();
    let new = tokio::task::spawn_blocking(move || {
        let mut proc = Proc::start(&["serve", "--upgrade", "--config", p.to_str().unwrap()]);
        proc.line_with("rondo: reloading on changes", Duration::from_secs(20));
        proc
    })
    .await
    .unwrap();
    old.line_with(&format!("handed over to pid {}", new.child.id()), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (accepted, refused, unavailable, cut) = poster.await.unwrap();
    eprintln!(
        "{} accepted, {refused} refused, {unavailable} answered 503, {cut} cut before an answer",
        accepted.len()
    );
    assert_eq!(refused, 0, "connections to the queue listener were refused");
    assert!(accepted.len() > 10);
    // Every accepted message reaches the member (at least once), from one process or the other.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lost = {
            let keys = keys.lock().unwrap();
            accepted.iter().filter(|id| !keys.contains(*id)).count()
        };
        if lost == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{lost} accepted messages never delivered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(new);
}

/// `GET /` on `web` with `token` as the bearer: the status.
async fn status_with_token(web: SocketAddr, token: &str) -> u16 {
    let mut s = BufReader::new(TcpStream::connect(web).await.unwrap());
    let req = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    read_response(&mut s).await.unwrap().0
}

/// A token of `subject` signed with the dev key in `keys`, and its `jti`.
fn dev_token(keys: &Path, subject: &str) -> (String, String) {
    use base64::Engine as _;
    let out = std::process::Command::new(common::BIN)
        .args(["auth", "token", "--key", keys.join("dev-key.pem").to_str().unwrap()])
        .args(["--issuer", "iss", "--audience", "aud", "--subject", subject])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let payload = token.split('.').nth(1).unwrap();
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap(),
    )
    .unwrap();
    (token, claims["jti"].as_str().expect("a jti").to_owned())
}

/// Issue 41 item 6: a router without `[naming]` (so without a revocation store) kept its own
/// revocations in memory only, and they were not in the hand-over: after `rondo ctl upgrade`
/// the new process accepted a revoked token again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_are_handed_to_the_new_process() {
    let dir = TempDir::new("upgrade-revoked");
    let keys = dir.0.join("keys");
    let made = std::process::Command::new(common::BIN)
        .args(["auth", "dev-key", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let m1 =
        rondo::member::spawn("m1", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap();
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            "[router]\nupgrade_socket = \"{}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             token = \"{TOKEN}\"\n\n[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"app\"\n\
             auth = {{ issuer = \"iss\", audience = \"aud\", keys = \"keys/jwks.json\" }}\n\n\
             [cluster.app]\nmembers = [{{ name = \"m1\", address = \"{}\" }}]\n",
            dir.0.join("upgrade.sock").display(),
            m1.addr,
        ),
    )
    .unwrap();
    let mut first = tokio::task::spawn_blocking(move || {
        let mut proc = Proc::start(&["serve", "--config", path.to_str().unwrap()]);
        let web = addr_of(&proc.line_with("rondo: listener web on", Duration::from_secs(20)));
        let admin = addr_of(&proc.line_with("rondo: admin API on", Duration::from_secs(20)));
        proc.line_with("rondo: reloading on changes", Duration::from_secs(20));
        (proc, web, admin)
    })
    .await
    .unwrap();
    let (web, admin) = (first.1, first.2);
    let (alice, _) = dev_token(&keys, "alice");
    let (bob, bob_jti) = dev_token(&keys, "bob");
    let (carol, _) = dev_token(&keys, "carol");
    for t in [&alice, &bob, &carol] {
        assert_eq!(status_with_token(web, t).await, 200);
    }
    ctl(admin, &["revoke", "--subject", "alice"]).expect("revoke alice");
    ctl(admin, &["revoke", "--token-id", &bob_jti]).expect("revoke bob's token");
    assert_eq!(status_with_token(web, &alice).await, 401);
    assert_eq!(status_with_token(web, &bob).await, 401);

    let said = ctl(admin, &["upgrade"]).expect("ctl upgrade");
    assert!(said.starts_with("upgrade started"), "{said}");
    let second =
        handed_to(&first.0.line_with("rondo: handed over to pid", Duration::from_secs(20)));
    let _second = KillOnDrop(second);
    let _ = tokio::task::spawn_blocking(move || first.0.child.wait()).await.unwrap();
    assert_eq!(status(admin).await["pid"], second, "the new process answers");
    // Only the new process is left: it refuses both, and still lets carol in.
    assert_eq!(status_with_token(web, &alice).await, 401, "alice's subject revoked");
    assert_eq!(status_with_token(web, &bob).await, 401, "bob's token revoked");
    assert_eq!(status_with_token(web, &carol).await, 200);
    let listed = ctl(admin, &["revocations"]).expect("ctl revocations");
    assert!(listed.contains("subject alice") && listed.contains(&bob_jti), "{listed}");
    drop(m1);
}

/// What a [`recording_member`] saw of one request: its target and whether it was a replay.
type SeenLog = Arc<std::sync::Mutex<Vec<(String, bool)>>>;

/// A member that answers every request 200 with its name, and logs each request's target and
/// whether it carried `x-rondo-replay` (after reading its `Content-Length` body whole).
async fn recording_member(name: &'static str) -> (SocketAddr, SeenLog) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = SeenLog::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut s = BufReader::new(s);
                while let Some((first, fields)) = read_head(&mut s).await {
                    let len = fields
                        .iter()
                        .find_map(|f| f.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap_or(0));
                    let mut body = vec![0; len.min(1 << 20)];
                    if s.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let target = first.split(' ').nth(1).unwrap_or("").to_owned();
                    let replay = fields.iter().any(|f| f.starts_with("x-rondo-replay:"));
                    log.lock().unwrap().push((target, replay));
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{name}\n",
                        name.len() + 1
                    );
                    if s.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// `POST target` of header session `id` on `web`: the member that answered.
async fn session_post(web: SocketAddr, id: &str, target: &str) -> String {
    let mut s = BufReader::new(TcpStream::connect(web).await.unwrap());
    let body = format!("body of {target}");
    let req = format!(
        "POST {target} HTTP/1.1\r\nHost: t\r\nX-Session: {id}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    let (code, _, answer) = read_response(&mut s).await.unwrap();
    assert_eq!(code, 200, "{answer}");
    answer.trim().to_owned()
}

/// Issue 41 item 6: a session's kept requests (`session_replay`) were not in the hand-over, so
/// a session that moved to another member after an upgrade got there without its history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_requests_are_replayed_by_the_new_process() {
    let dir = TempDir::new("upgrade-replay");
    let ((a1, seen1), (a2, seen2)) = (recording_member("m1").await, recording_member("m2").await);
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            "[router]\nupgrade_socket = \"{}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             token = \"{TOKEN}\"\n\n[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nname = \"s\"\nlistener = \"web\"\ncluster = \"sess\"\n\
             session_replay = {{ max_messages = 16 }}\n\n\
             [cluster.sess]\ngranularity = \"session\"\nsession = {{ header = \"x-session\" }}\n\
             members = [{{ name = \"m1\", address = \"{a1}\" }}, \
             {{ name = \"m2\", address = \"{a2}\" }}]\n",
            dir.0.join("upgrade.sock").display(),
        ),
    )
    .unwrap();
    let mut first = tokio::task::spawn_blocking(move || {
        let mut proc = Proc::start(&["serve", "--config", path.to_str().unwrap()]);
        let web = addr_of(&proc.line_with("rondo: listener web on", Duration::from_secs(20)));
        let admin = addr_of(&proc.line_with("rondo: admin API on", Duration::from_secs(20)));
        proc.line_with("rondo: reloading on changes", Duration::from_secs(20));
        (proc, web, admin)
    })
    .await
    .unwrap();
    let (web, admin) = (first.1, first.2);
    let holder = session_post(web, "s1", "/m/0").await;
    for i in 1..4 {
        assert_eq!(session_post(web, "s1", &format!("/m/{i}")).await, holder, "it sticks");
    }
    let said = ctl(admin, &["upgrade"]).expect("ctl upgrade");
    assert!(said.starts_with("upgrade started"), "{said}");
    let second =
        handed_to(&first.0.line_with("rondo: handed over to pid", Duration::from_secs(20)));
    let _second = KillOnDrop(second);
    let _ = tokio::task::spawn_blocking(move || first.0.child.wait()).await.unwrap();
    assert_eq!(status(admin).await["pid"], second, "the new process answers");

    // The session's member is disabled on the new process: the session moves, and the member
    // taking it over gets the four kept requests, in order and marked, then the new one.
    ctl(admin, &["disable", "sess", &holder]).expect("disable the session's member");
    let heir = session_post(web, "s1", "/m/4").await;
    assert_ne!(heir, holder, "the session moved");
    let seen = if heir == "m1" { &seen1 } else { &seen2 };
    let want: Vec<(String, bool)> = (0..5).map(|i| (format!("/m/{i}"), i < 4)).collect();
    assert_eq!(*seen.lock().unwrap(), want, "the heir's requests: (target, replayed)");
    assert_eq!(session_post(web, "s1", "/m/5").await, heir, "replayed once, then it sticks");
    assert_eq!(seen.lock().unwrap().len(), 6);
}

/// Issue 41 item 6: an acknowledged revocation of a router without `[naming]` was in memory
/// only, so `kill -9` and a restart forgot it; `[router] revocations_file` keeps it (written and
/// fsynced before the 201). A damaged file stops the start, naming the file and the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_survive_kill_9_with_a_revocations_file() {
    let dir = TempDir::new("upgrade-revoked-kill");
    let keys = dir.0.join("keys");
    let made = std::process::Command::new(common::BIN)
        .args(["auth", "dev-key", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let m1 =
        rondo::member::spawn("m1", "127.0.0.1:0".parse().unwrap(), Duration::ZERO).await.unwrap();
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            "[router]\nrevocations_file = \"state/revoked\"\n\n[admin]\n\
             listen = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n[[listener]]\nname = \"web\"\n\
             listen = \"127.0.0.1:0\"\n\n[[route]]\nlistener = \"web\"\ncluster = \"app\"\n\
             auth = {{ issuer = \"iss\", audience = \"aud\", keys = \"keys/jwks.json\" }}\n\n\
             [cluster.app]\nmembers = [{{ name = \"m1\", address = \"{}\" }}]\n",
            m1.addr,
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.0.join("state")).unwrap();
    let start = |path: std::path::PathBuf| {
        tokio::task::spawn_blocking(move || {
            let mut proc = Proc::start(&["serve", "--config", path.to_str().unwrap()]);
            let web = addr_of(&proc.line_with("rondo: listener web on", Duration::from_secs(20)));
            let admin = addr_of(&proc.line_with("rondo: admin API on", Duration::from_secs(20)));
            proc.line_with("rondo: reloading on changes", Duration::from_secs(20));
            (proc, web, admin)
        })
    };
    let (mut first, web, admin) = start(path.clone()).await.unwrap();
    let (alice, _) = dev_token(&keys, "alice");
    let (carol, _) = dev_token(&keys, "carol");
    ctl(admin, &["revoke", "--subject", "alice"]).expect("revoke alice");
    assert_eq!(status_with_token(web, &alice).await, 401);
    first.kill();
    let (_second, web, _) = start(path.clone()).await.unwrap();
    assert_eq!(status_with_token(web, &alice).await, 401, "alice's revocation kept");
    assert_eq!(status_with_token(web, &carol).await, 200);
    drop(_second);
    // A damaged file: the start fails and says where.
    std::fs::write(dir.0.join("state/revoked"), "subject\talice\n").unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("state/revoked") && said.contains("line 1"), "{said}");
    drop(m1);
}
