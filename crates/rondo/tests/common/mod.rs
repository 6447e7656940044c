//! Process helpers shared by the integration-test binaries: a temporary directory removed on
//! drop, `rondo` child processes killed and reaped on drop, free ports and `rondo member`
//! processes. Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod browser;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_rondo");

/// A fresh directory of this test process, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `rondo-{kind}-test-PID-N` under the system temporary directory.
    pub fn new(kind: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rondo-{kind}-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `rondo` child process, killed with SIGKILL and reaped on drop (or by [`Proc::kill`]), with
/// its stdout lines on a channel.
pub struct Proc {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `rondo ARGS`; its stderr is dropped, or shown with the test's output when
    /// `RONDO_TEST_STDERR` is set (to see why a process of a failing test ended).
    pub fn start(args: &[&str]) -> Proc {
        let child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("RONDO_TEST_STDERR").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("start rondo");
        Proc::from_child(child)
    }

    /// Takes over `child`, whose stdout must be piped.
    pub fn from_child(mut child: Child) -> Proc {
        let lines = send_lines(child.stdout.take().expect("stdout"));
        Proc { child, lines }
    }

    /// The first stdout line containing `needle`, waiting at most `wait` in all.
    pub fn line_with(&mut self, needle: &str, wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => {
                    let status = self.child.try_wait().ok().flatten();
                    panic!("no line with {needle:?} ({e}); exit status {status:?}");
                }
            }
        }
    }

    /// The address at the end of the first stdout line containing `needle` (10 s at most).
    pub fn addr_after(&mut self, needle: &str) -> SocketAddr {
        let line = self.line_with(needle, Duration::from_secs(10));
        line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("address")
    }

    /// `kill -9`, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The lines of `pipe` on a channel, read by a thread of their own.
pub fn send_lines(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

/// The lines of `pipe`, collected by a thread of their own.
pub fn collect_lines(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    });
    lines
}

/// A port free right now (bound, then released), never the same twice in this process (the
/// kernel may hand a released port out again at once).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("local addr").port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Starts `rondo member --name NAME --listen LISTEN` and returns it with its address.
pub fn start_member(name: &str, listen: &str) -> (Proc, SocketAddr) {
    let mut p = Proc::start(&["member", "--name", name, "--listen", listen]);
    let line = p.line_with(&format!("rondo member {name} on "), Duration::from_secs(10));
    let addr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("member address");
    (p, addr)
}

/// A child process killed with SIGKILL and reaped on drop, stopped or not.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Sends `sig` (e.g. `-STOP`) with `kill`.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`): status and body.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    request_with(addr, method, path, "", body)
}

/// [`request`] with more header lines (`extra`, each ending in `\r\n`).
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &str,
    body: &[u8],
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the router");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send head");
    s.write_all(body).expect("send body");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("read the answer");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// dnsmasq on a free loopback port answering from `dir/hosts` (re-read on SIGHUP) with a TTL of
/// `ttl` seconds, names under `test.` without a record NXDOMAIN, and `extra` arguments. A port
/// another test takes between its choice and dnsmasq's bind (dnsmasq then exits) is chosen
/// again, five times at most.
#[allow(dead_code)]
pub fn dnsmasq(dir: &std::path::Path, ttl: u32, extra: &[String]) -> (ChildGuard, SocketAddr) {
    for _ in 0..5 {
        if let Some(started) = dnsmasq_on(dir, ttl, extra, free_port()) {
            return started;
        }
    }
    panic!("dnsmasq did not start on any of five ports");
}

/// dnsmasq on `port`, once it answers on TCP (10 s at most); `None` if it exited first.
fn dnsmasq_on(
    dir: &std::path::Path,
    ttl: u32,
    extra: &[String],
    port: u16,
) -> Option<(ChildGuard, SocketAddr)> {
    let mut args = vec![
        "--keep-in-foreground".to_owned(),
        "--conf-file=/dev/null".to_owned(),
        format!("--port={port}"),
        "--listen-address=127.0.0.1".to_owned(),
        "--bind-interfaces".to_owned(),
        "--no-resolv".to_owned(),
        "--no-hosts".to_owned(),
        format!("--addn-hosts={}", dir.join("hosts").display()),
        format!("--local-ttl={ttl}"),
        "--local=/test/".to_owned(),
        format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
    ];
    // As root, dnsmasq would switch to `nobody`, who may not read the test's directory.
    let uid = Command::new("id").arg("-u").output().map(|o| o.stdout).unwrap_or_default();
    if uid.trim_ascii() == b"0" {
        args.push("--user=root".to_owned());
    }
    args.extend(extra.iter().cloned());
    let child = Command::new("dnsmasq")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dnsmasq");
    let mut guard = ChildGuard(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if guard.0.try_wait().ok().flatten().is_some() {
            return None;
        }
        assert!(Instant::now() < deadline, "dnsmasq did not start on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((guard, addr))
}

/// The open sockets and pipes of process `pid` (`/proc/PID/fd`).
pub fn sockets_and_pipes(pid: u32) -> (usize, usize) {
    let dir = format!("/proc/{pid}/fd");
    let (mut sockets, mut pipes) = (0, 0);
    for entry in std::fs::read_dir(dir).expect("read the router's fds").flatten() {
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        sockets += usize::from(target.starts_with("socket:"));
        pipes += usize::from(target.starts_with("pipe:"));
    }
    (sockets, pipes)
}

/// Waits (10 s at most) until process `pid` holds no more sockets than `sockets`, then checks
/// that its pipes are at most `pipes` plus `pool` (a splice pipe pool's descriptors).
pub fn assert_nothing_held(pid: u32, (sockets, pipes): (usize, usize), pool: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = sockets_and_pipes(pid);
    while now.0 > sockets && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now = sockets_and_pipes(pid);
    }
    assert!(now.0 <= sockets, "sockets left open: {} now, {sockets} before", now.0);
    assert!(now.1 <= pipes + pool, "pipes left open: {} now, {pipes} before", now.1);
}
