//! Hitless upgrades under HTTP/3 (issue 40): load through three upgrades, and QUIC connections
//! held open through an upgrade (and through two), whose later requests and uploads the old
//! process answers, steered to it by connection ID.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::{self, Proc, start_member};
use super::{CLIENT, Router, serve, status, statuses};

/// `r`'s configuration with an upgrade socket and a drain of 5 s, `r`'s process stopped: the
/// file's path, for [`serve_config`].
fn upgradable(r: &mut Router) -> String {
    let path = r._dir.0.join("rondo.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let sock = r._dir.0.join("upgrade.sock");
    let text = format!(
        "[router]\nupgrade_socket = \"{}\"\ndrain_timeout_ms = 5000\n{text}",
        sock.display()
    );
    std::fs::write(&path, text).unwrap();
    r.proc.kill();
    path.to_str().unwrap().to_owned()
}

/// `rondo serve` on `config` (with `upgrade`, taking over from the process running on it),
/// once its admin API is up.
fn serve_config(config: &str, upgrade: bool) -> Proc {
    let mut args = vec!["serve", "--config", config, "--workers", "1"];
    if upgrade {
        args.insert(1, "--upgrade");
    }
    let mut p = Proc::start(&args);
    p.line_with("admin API on", Duration::from_secs(20));
    p
}

#[test]
fn upgrades_under_http3_load_fail_nothing() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let mut r = serve(&[("m1", a1)], "");
    let config = upgradable(&mut r);
    let start = |upgrade: bool| serve_config(&config, upgrade);
    let mut current = start(false);
    let (web, ca) = (r.web, r.ca.clone());

    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Two clients, each one connection after another with 5 requests on each.
        let loads: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut got = Vec::new();
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed)
                        && Instant::now() < deadline
                    {
                        got.extend(statuses(web, &ca, "/", 5));
                    }
                    got
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        for round in 1..=3 {
            // A connection with requests in flight through the upgrade: they finish on the
            // old process.
            let slow = scope.spawn(|| statuses(web, &ca, "/slow/1500", 3));
            // A connection kept open across the upgrade: a request before, an upload begun,
            // then a request and the upload's body after the new process took the socket.
            let mut held = Session::start(web, &ca);
            assert_eq!(status(&held.ask("get /", 1)[0]), 200, "round {round}");
            assert_eq!(held.ask("open 1 /collect 20000", 1)[0]["opened"], 1);
            std::thread::sleep(Duration::from_millis(300));
            let next = start(true);
            let handed = format!("rondo: handed over to pid {}", next.child.id());
            current.line_with(&handed, Duration::from_secs(20));
            let mut old = std::mem::replace(&mut current, next);
            assert_eq!(status(&held.ask("get /", 1)[0]), 200, "round {round}");
            assert_eq!(status(&held.ask("send", 1)[0]), 200, "round {round}");
            held.ask("quit", 0);
            assert_eq!(slow.join().unwrap(), vec![200; 3], "round {round}");
            let deadline = Instant::now() + Duration::from_secs(20);
            while old.child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "round {round}: the old process never exited");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let got: Vec<u64> = loads.into_iter().flat_map(|l| l.join().unwrap()).collect();
        eprintln!("{} requests over HTTP/3 through 3 upgrades", got.len());
        assert!(!got.is_empty(), "no request went through");
        assert!(got.iter().all(|s| *s == 200), "{got:?}");
    });
}

/// One HTTP/3 connection kept open by `h3_client.py session`, driven a command at a time.
struct Session {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Session {
    fn start(web: SocketAddr, ca: &Path) -> Session {
        let mut child = Command::new("python3")
            .args([CLIENT, "session", &web.to_string(), ca.to_str().unwrap(), "localhost"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let stdin = child.stdin.take().unwrap();
        let lines = common::send_lines(child.stdout.take().unwrap());
        Session { child, stdin, lines }
    }

    /// Sends `command`; its `answers` JSON lines (30 s at most).
    fn ask(&mut self, command: &str, answers: usize) -> Vec<Value> {
        use std::io::Write as _;
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        (0..answers)
            .map(|_| {
                let line = self.lines.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|e| {
                    panic!("{command}: no answer from the client ({e})");
                });
                serde_json::from_str(&line).expect("a JSON line")
            })
            .collect()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_connection_open_through_an_upgrade_stays_with_the_old_process() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    // Each process's access log on its own stdout: which process answered is on the record.
    let mut r = serve(&[("m1", a1)], "access_log = { path = \"-\" }");
    let config = upgradable(&mut r);
    let mut old = serve_config(&config, false);
    let wait = Duration::from_secs(10);
    let mut s = Session::start(r.web, &r.ca);
    let before = s.ask("get /before", 1);
    assert_eq!((status(&before[0]), before[0]["body"].as_str()), (200, Some("m1\n")));
    old.line_with("path=/before ", wait);
    // Two uploads begun on the connection: their bodies go after the upgrade.
    assert_eq!(s.ask("open 2 /collect 30000", 1)[0]["opened"], 2);
    let new = serve_config(&config, true);
    old.line_with(&format!("rondo: handed over to pid {}", new.child.id()), wait);
    // The new process reads the UDP socket now. The same connection: new requests (before
    // the drain's GOAWAY, a second after the hand-over) and the uploads' bodies.
    for path in ["/after-1", "/after-2"] {
        let got = s.ask(&format!("get {path}"), 1);
        assert_eq!((status(&got[0]), got[0]["body"].as_str()), (200, Some("m1\n")), "{path}");
        // Answered by the old process.
        old.line_with(&format!("path={path} "), wait);
    }
    for got in s.ask("send", 2) {
        assert_eq!((status(&got), got["body"].as_str()), (200, Some("m1 got 30000 bytes\n")));
    }
    // Their datagrams went through the new process, which passed them on.
    let forwarded = r.event("forwarded");
    eprintln!("{forwarded} datagrams passed on, {} dropped", r.event("forward_dropped"));
    assert!(forwarded > 0, "{forwarded} datagrams passed on");
    // A new connection is the new process's.
    assert_eq!(statuses(r.web, &r.ca, "/new", 1), vec![200]);
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = new.lines.recv_timeout(left).expect("the new process logs /new");
        assert!(!line.contains("path=/after-"), "the new process answered {line}");
        if line.contains("path=/new ") {
            break;
        }
    }
    s.ask("quit", 0);
}

#[test]
fn an_upload_open_through_two_upgrades_finishes_on_the_first_process() {
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let mut r = serve(&[("m1", a1)], "access_log = { path = \"-\" }");
    let config = upgradable(&mut r);
    let mut first = serve_config(&config, false);
    let wait = Duration::from_secs(10);
    let mut s = Session::start(r.web, &r.ca);
    assert_eq!(status(&s.ask("get /before", 1)[0]), 200);
    assert_eq!(s.ask("open 1 /collect 30000", 1)[0]["opened"], 1);
    // Replaced twice while the first process still drains: the third passes the first's
    // datagrams to the second, which passes them on.
    let mut second = serve_config(&config, true);
    first.line_with(&format!("rondo: handed over to pid {}", second.child.id()), wait);
    let third = serve_config(&config, true);
    second.line_with(&format!("rondo: handed over to pid {}", third.child.id()), wait);
    let got = s.ask("send", 1);
    assert_eq!((status(&got[0]), got[0]["body"].as_str()), (200, Some("m1 got 30000 bytes\n")));
    first.line_with("path=/collect ", wait);
    s.ask("quit", 0);
}
