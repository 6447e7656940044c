//! Test support: a real etcd (`/usr/bin/etcd`) on free loopback ports that can be killed,
//! restarted on the same ports and data directory, stopped and continued; and a TCP proxy that
//! can be paused to cut one client off from etcd without a word (a silent partition).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The etcd binary the tests run.
pub const ETCD: &str = "/usr/bin/etcd";

/// A free loopback TCP port (bound, then released), never the same twice in this process (the
/// kernel may hand a released port out again at once).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = l.local_addr().unwrap().port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A unique, fresh directory under the system temporary directory.
pub fn temp_dir(what: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rondo-{what}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        SystemNanos::now()
    ));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

struct SystemNanos;

impl SystemNanos {
    fn now() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    }
}

/// One single-member etcd cluster; killed, and its data directory removed, on drop.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    stopped: bool,
}

impl Etcd {
    /// Starts etcd on free ports and waits until it answers `/health`.
    pub fn start() -> Etcd {
        let mut etcd = Etcd {
            child: None,
            dir: temp_dir("etcd"),
            client_port: free_port(),
            peer_port: free_port(),
            stopped: false,
        };
        etcd.spawn();
        etcd
    }

    /// `127.0.0.1:PORT` of the client listener.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The process id of the running etcd.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("etcd is running").id()
    }

    fn spawn(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("open the etcd log");
        let child = Command::new(ETCD)
            .arg("--name")
            .arg("default")
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("default={peer}"))
            // A short election timeout makes etcd's shortest lease 1 s (1.5 election timeouts,
            // rounded up to a second) and restarts quick.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone the log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start /usr/bin/etcd");
        self.child = Some(child);
        self.stopped = false;
        self.wait_healthy();
    }

    /// Waits (up to 15 s) until `/health` says `true`.
    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.healthy() {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                panic!("etcd exited with {status} before answering:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "etcd on port {} did not become healthy within 15 s",
                self.client_port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether etcd answers `GET /health` with `"health":"true"` within 500 ms.
    pub fn healthy(&self) -> bool {
        let addr = ([127, 0, 0, 1], self.client_port).into();
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// `kill -9`, and waits for the process to go.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stopped = false;
    }

    /// Starts etcd again on the same ports and data directory (after [`Etcd::kill`]).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "kill etcd before restarting it");
        self.spawn();
    }

    /// `kill -STOP`: etcd stays, its sockets stay open, nothing answers.
    pub fn pause(&mut self) {
        signal("-STOP", self.pid());
        self.stopped = true;
    }

    /// `kill -CONT`.
    pub fn resume(&mut self) {
        signal("-CONT", self.pid());
        self.stopped = false;
    }
}

fn signal(sig: &str, pid: u32) {
    let status = Command::new("kill").arg(sig).arg(pid.to_string()).status().expect("run kill");
    assert!(status.success(), "kill {sig} {pid} failed");
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.stopped {
                // A stopped process still dies of SIGKILL; continue it anyway to be tidy.
                let _ = Command::new("kill").arg("-CONT").arg(child.id().to_string()).status();
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy on a free loopback port to `target`; while paused it moves no bytes in either
/// direction but keeps every connection open (a silent partition). It can also delay every byte
/// by a fixed time in each direction (a slow link). Stops on drop.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    paused: Arc<AtomicBool>,
    shutdown: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts proxying to `target` (`host:port`).
    pub fn start(target: &str) -> Proxy {
        Proxy::with_delay(target, Duration::ZERO)
    }

    /// Starts proxying to `target`, each byte delayed by `delay` in each direction.
    pub fn with_delay(target: &str, delay: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let port = listener.local_addr().unwrap().port();
        let paused = Arc::new(AtomicBool::new(false));
        let shutdown = Arc::new(AtomicBool::new(false));
        let (p, s, target) = (paused.clone(), shutdown.clone(), target.to_owned());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let _ = down.set_nonblocking(false);
                        let Ok(up) = TcpStream::connect(&target) else { continue };
                        let _ = (down.set_nodelay(true), up.set_nodelay(true));
                        for (from, to) in
                            [(down.try_clone().unwrap(), up.try_clone().unwrap()), (up, down)]
                        {
                            pipe(from, to, delay, p.clone(), s.clone());
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy { port, paused, shutdown }
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops moving bytes (connections stay open).
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }

    /// Moves bytes again.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` in two threads: a reader that stamps each chunk with its arrival, and
/// a writer that sends it `delay` later, holding everything back while paused.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    paused: Arc<AtomicBool>,
    shutdown: Arc<AtomicBool>,
) {
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let stop = shutdown.clone();
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
        let mut buf = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::Relaxed) {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        let held = || paused.load(Ordering::Relaxed) && !shutdown.load(Ordering::Relaxed);
        while let Ok((at, chunk)) = rx.recv() {
            if let Some(wait) = (at + delay).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            while held() {
                std::thread::sleep(Duration::from_millis(5));
            }
            if shutdown.load(Ordering::Relaxed) || to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// Polls `cond` every 20 ms for up to `limit`; panics naming `what` when it never holds.
/// Returns how long it took.
pub async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
