//! `rondo serve --runtime per-core` against real processes (issue 36, item 3): HTTP/1.1, h2c and
//! `tcp` listener requests served by both per-core runtimes, with one `SO_REUSEPORT` socket per
//! runtime or one shared socket; and hitless upgrades under load between per-core processes of
//! different sizes and a work-stealing one, with no refused connection and no failed request
//! (every shard of every listener is handed over).

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

/// Every load loop and every exchange ends by these limits whatever happens.
const LOAD_LIMIT: Duration = Duration::from_secs(90);
const EXCHANGE_LIMIT: Duration = Duration::from_secs(10);

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

/// Listener `web` (HTTP, to `app`) and listener `tcp` (to the echo server), upgradable.
fn config(dir: &Path, app: &[rondo::member::Member], echo: SocketAddr) -> String {
    let members: Vec<String> = app
        .iter()
        .map(|m| format!("{{ name = \"{}\", address = \"{}\" }}", m.name, m.addr))
        .collect();
    format!(
        "[router]\nupgrade_socket = \"{sock}\"\ndrain_timeout_ms = 5000\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nname = \"tcp\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
         [[route]]\nname = \"app\"\nlistener = \"web\"\ncluster = \"app\"\n\n\
         [[route]]\nname = \"tcp\"\nlistener = \"tcp\"\ncluster = \"echo\"\n\n\
         [cluster.app]\nalgorithm = \"round-robin\"\nmembers = [{}]\n\n\
         [cluster.echo]\nupstream_protocol = \"tcp\"\n\
         members = [{{ name = \"e1\", address = \"{echo}\" }}]\n",
        members.join(", "),
        sock = dir.join("upgrade.sock").display(),
    )
}

/// A running `rondo serve` and its listeners' addresses.
struct Gen {
    proc: Proc,
    web: SocketAddr,
    tcp: SocketAddr,
}

fn addr_of(line: &str) -> SocketAddr {
    line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("an address ends the line")
}

/// `rondo serve --config CONFIG THREADS...` (taking over with `upgrade`), once it serves.
fn start(config: &Path, threads: &[&str], upgrade: bool) -> Gen {
    let mut args = vec!["serve", "--config", config.to_str().unwrap()];
    args.extend_from_slice(threads);
    if upgrade {
        args.push("--upgrade");
    }
    let mut proc = Proc::start(&args);
    let wait = Duration::from_secs(20);
    let web = addr_of(&proc.line_with("rondo: listener web on", wait));
    let tcp = addr_of(&proc.line_with("rondo: listener tcp on", wait));
    proc.line_with("rondo: reloading on", wait);
    Gen { proc, web, tcp }
}

/// The names of `pid`'s threads and the nanoseconds each has run (`/proc/PID/task/*/schedstat`).
fn threads(pid: u32) -> Vec<(String, u64)> {
    let mut all = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ran = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let ran = ran.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0);
        all.push((comm.trim().to_owned(), ran));
    }
    all.sort();
    all
}

/// How many sockets listen on `addr`'s port (`/proc/net/tcp`, state 0A).
fn listening_sockets(addr: SocketAddr) -> usize {
    let port = format!(":{:04X}", addr.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&port) && f[3] == "0A"
        })
        .count()
}

/// Reads one HTTP/1.1 response (content-length bodies): status, whether it closes, the body.
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
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok((status, close, String::from_utf8_lossy(&body).into_owned()))
}

/// One HTTP/1.1 request on a new connection, then a second on the same one: both 200.
async fn h1_twice(web: SocketAddr) -> Result<(), String> {
    let connect = || async {
        let s = TcpStream::connect(web).await.map_err(|e| format!("connect: {e}"))?;
        Ok::<_, String>(BufReader::new(s))
    };
    let mut s = connect().await?;
    for _ in 0..2 {
        s.get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(EXCHANGE_LIMIT, read_response(&mut s)).await {
            Ok(Ok((200, false, _))) => {}
            // A draining process answers with `Connection: close`: the next request goes on a
            // new connection, as a client must (RFC 9112 9.6), not on the one being closed.
            Ok(Ok((200, true, _))) => s = connect().await?,
            other => return Err(format!("http/1.1 answered {other:?}")),
        }
    }
    Ok(())
}

/// One h2c (prior knowledge) connection, two requests: both 200.
async fn h2c_twice(web: SocketAddr) -> Result<(), String> {
    let s = TcpStream::connect(web).await.map_err(|e| format!("connect: {e}"))?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .map_err(|e| format!("h2c handshake: {e}"))?;
    tokio::spawn(conn);
    for _ in 0..2 {
        let req = http::Request::get(format!("http://{web}/")).body(Empty::<Bytes>::new()).unwrap();
        let resp = tokio::time::timeout(EXCHANGE_LIMIT, send.send_request(req))
            .await
            .map_err(|_| "h2c request timed out".to_owned())?
            .map_err(|e| format!("h2c request: {e}"))?;
        if resp.status() != 200 {
            return Err(format!("h2c answered {}", resp.status()));
        }
        resp.into_body().collect().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One exchange through the `tcp` listener on a new connection.
async fn tcp_once(tcp: SocketAddr, n: u64) -> Result<(), String> {
    let s = TcpStream::connect(tcp).await.map_err(|e| format!("connect: {e}"))?;
    let mut s = BufReader::new(s);
    let line = format!("exchange {n}\n");
    s.get_mut().write_all(line.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut back = String::new();
    match tokio::time::timeout(EXCHANGE_LIMIT, s.read_line(&mut back)).await {
        Ok(Ok(_)) if back == line => Ok(()),
        other => Err(format!("tcp echoed {back:?} ({other:?})")),
    }
}

/// `n` connections of each kind, 8 at a time; the errors.
async fn every_kind(g: &Gen, n: u64) -> Vec<String> {
    let (web, tcp) = (g.web, g.tcp);
    let mut errors = Vec::new();
    for batch in 0..n.div_ceil(8) {
        let mut tasks = Vec::new();
        for i in 0..8 {
            let k = batch * 8 + i;
            tasks.push(tokio::spawn(async move {
                let mut e = Vec::new();
                for r in [h1_twice(web).await, h2c_twice(web).await, tcp_once(tcp, k).await] {
                    e.extend(r.err());
                }
                e
            }));
        }
        for t in tasks {
            errors.extend(t.await.unwrap());
        }
    }
    errors
}

async fn members() -> Vec<rondo::member::Member> {
    let any = "127.0.0.1:0".parse().unwrap();
    vec![
        rondo::member::spawn("m1", any, Duration::ZERO).await.unwrap(),
        rondo::member::spawn("m2", any, Duration::ZERO).await.unwrap(),
    ]
}

/// Both runtimes serve: 64 new connections of each protocol all answered, and both per-core
/// threads ran while they were (a runtime that accepted nothing, with its own socket, would
/// leave the connections the kernel gave it unanswered).
async fn both_runtimes_serve(shards: &str, sockets: usize) {
    let dir = TempDir::new("cores");
    let app = members().await;
    let echo = tcp_echo().await;
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config(&dir.0, &app, echo)).unwrap();
    let g = start(&path, &["--workers", "2", "--runtime", "per-core", "--shards", shards], false);
    assert_eq!(listening_sockets(g.web), sockets, "sockets on the web listener's port");
    assert_eq!(listening_sockets(g.tcp), sockets, "sockets on the tcp listener's port");
    let pid = g.proc.child.id();
    let before = threads(pid);
    let cores: Vec<&(String, u64)> =
        before.iter().filter(|(n, _)| n.starts_with("rondo-core")).collect();
    assert_eq!(cores.len(), 2, "two per-core runtime threads: {before:?}");
    let errors = every_kind(&g, 64).await;
    assert!(errors.is_empty(), "{} failed: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    let after = threads(pid);
    for (name, ran) in cores {
        let now = after.iter().find(|(n, _)| n == name).map_or(0, |(_, r)| *r);
        assert!(now > *ran, "{name} did not run while 192 connections were served");
    }
    let served: u64 = app.iter().map(|m| m.served.load(Ordering::Relaxed)).sum();
    assert_eq!(served, 64 * 4, "two HTTP/1.1 and two h2c requests per round reached members");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_runtimes_with_a_socket_each_serve_http1_h2c_and_tcp() {
    both_runtimes_serve("by-core", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_runtimes_sharing_one_socket_serve_http1_h2c_and_tcp() {
    both_runtimes_serve("one", 1).await;
}

/// What the load counted: successes and failures (a failure's reason printed once).
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// New connections of every kind one after another until `stop`.
async fn load(g: (SocketAddr, SocketAddr), stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let (web, tcp) = g;
    let start = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && start.elapsed() < LOAD_LIMIT {
        n += 1;
        let r = match n % 3 {
            0 => h1_twice(web).await,
            1 => h2c_twice(web).await,
            _ => tcp_once(tcp, n).await,
        };
        match r {
            Ok(()) => counts.ok.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                eprintln!("under upgrade: {e}");
                counts.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_between_per_core_and_work_stealing_processes_lose_nothing() {
    let dir = TempDir::new("cores-upgrade");
    let app = members().await;
    let echo = tcp_echo().await;
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config(&dir.0, &app, echo)).unwrap();
    let mut current = start(&path, &["--workers", "2", "--runtime", "per-core"], false);
    let (web, tcp) = (current.web, current.tcp);
    assert_eq!(listening_sockets(web), 2);

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let loads: Vec<_> =
        (0..4).map(|_| tokio::spawn(load((web, tcp), stop.clone(), counts.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // More runtimes, then one work-stealing worker, then per-core again sharing the sockets:
    // each takes every shard the one before had (3 after the first step).
    let steps: [(&[&str], usize); 3] = [
        (&["--workers", "3", "--runtime", "per-core"], 3),
        (&["--workers", "1"], 3),
        (&["--workers", "2", "--runtime", "per-core", "--shards", "one"], 3),
    ];
    for (threads, sockets) in steps {
        let next = tokio::task::spawn_blocking({
            let path = path.clone();
            move || start(&path, threads, true)
        })
        .await
        .unwrap();
        assert_eq!((next.web, next.tcp), (web, tcp), "{threads:?}: the same sockets");
        let mut old = std::mem::replace(&mut current, next);
        let pid = current.proc.child.id();
        old.proc.line_with(&format!("rondo: handed over to pid {pid}"), Duration::from_secs(10));
        let status = tokio::task::spawn_blocking(move || {
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
        assert!(status.is_some_and(|s| s.success()), "{threads:?}: the old process's exit");
        // Once the old process is gone, its duplicates too: only the new one's sockets listen.
        assert_eq!(listening_sockets(web), sockets, "{threads:?}: sockets on the web port");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for l in loads {
        tokio::time::timeout(LOAD_LIMIT, l).await.expect("the load ends").unwrap();
    }
    let (ok, failed) = (counts.ok.load(Ordering::Relaxed), counts.failed.load(Ordering::Relaxed));
    eprintln!("{ok} ok, {failed} failed");
    assert!(ok > 30, "too little went through: {ok}");
    assert_eq!(failed, 0, "connections failed across the upgrades");
}
