//! The real binary: `rondo serve` as a child process in front of two `rondo member` processes;
//! `rondo serve` on an invalid config; `rondo --help`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::support::{self, count};

const BIN: &str = env!("CARGO_BIN_EXE_rondo");

/// A fresh directory of this test process, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rondo-serve-test-{}-{}",
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

/// A child process killed (and reaped) on drop, with its stdout lines on a channel.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rondo");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Proc { child, lines }
    }

    /// The first stdout line containing `needle`, waiting at most `wait` in all.
    fn line_with(&mut self, needle: &str, wait: Duration) -> String {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
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
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `rondo member --name NAME` on a port of its choosing and returns it with its address.
fn start_member(name: &str) -> (Proc, SocketAddr) {
    let mut p = Proc::start(&["member", "--name", name, "--listen", "127.0.0.1:0"]);
    let line = p.line_with(&format!("rondo member {name} on "), Duration::from_secs(10));
    let addr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("member address");
    (p, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_balances_over_member_processes() {
    let dir = TempDir::new();
    let (_m1, a1) = start_member("m1");
    let (_m2, a2) = start_member("m2");
    // A port free right now (bound, then released).
    let port = support::dead_addr().port();
    let path = dir.0.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[listener]]
name = "web"
listen = "127.0.0.1:{port}"

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
algorithm = "round-robin"
members = [{{ name = "m1", address = "{a1}" }}, {{ name = "m2", address = "{a2}" }}]
"#
        ),
    )
    .expect("write config");
    let mut router =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    let line = router.line_with("listener web on", Duration::from_secs(10));
    assert!(line.ends_with(&format!("127.0.0.1:{port}")), "{line}");

    let names = support::served_by(&format!("http://127.0.0.1:{port}/"), 20).await;
    assert_eq!(count(&names, "m1"), 10, "{names:?}");
    assert_eq!(count(&names, "m2"), 10, "{names:?}");
}

#[test]
fn serve_with_an_invalid_config_exits_1_naming_the_place() {
    let dir = TempDir::new();
    let path = dir.0.join("bad.toml");
    let text = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n[[route]]\n\
                listener = \"web\"\ncluster = \"c\"\n\n[cluster.c]\nalgorithm = \"fastest\"\n\
                members = [{ name = \"m1\", address = \"127.0.0.1:9\" }]\n";
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(BIN)
        .args(["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"])
        .stdin(Stdio::null())
        .output()
        .expect("run rondo serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // `algorithm = "fastest"` is line 10; the value starts at column 13.
    let place = format!("{}:10:13:", path.display());
    assert!(stderr.contains(&place), "no {place} in {stderr}");
    assert!(stderr.contains("cluster.c.algorithm"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listener"), "it started serving");
}

#[test]
fn help_lists_serve_check_and_member() {
    let out = Command::new(BIN).arg("--help").output().expect("run rondo --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for c in ["serve", "check", "member"] {
        assert!(commands.contains(&c), "{c} missing from {commands:?} in {help}");
    }
}
