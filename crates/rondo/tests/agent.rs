//! Load agents end to end: an in-process router with an `[agent]` receiver, in-process members,
//! and real `rondo agent` processes on 127.0.0.1 (stopped and continued with SIGSTOP/SIGCONT).

mod common;
#[path = "router/support.rs"]
mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{BIN, ChildGuard as Proc};
use rondo::member::Member;
use rondo_agent::wire::{self, Heartbeat, HelloOk, Key};
use rondo_agent::{Receiver, ReceiverOpts, ReceiverStats};
use rondo_runtime::{Live, clock, probe};
use support::{any_port, count, member_list, members, served_by};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const KEY: &str = "test-agent-key";

/// `rondo agent` reporting to `to` for member `member` of cluster `app`.
fn agent(to: SocketAddr, member: &str, key: &str, extra: &[&str]) -> Proc {
    let child = Command::new(BIN)
        .args(["agent", "--report-to", &to.to_string(), "--cluster", "app", "--member", member])
        .args(["--key", key])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rondo agent");
    Proc(child)
}

struct Setup {
    router: rondo_proxy::Router,
    live: Arc<Live>,
    receiver: Receiver,
    members: Vec<Member>,
}

impl Setup {
    fn url(&self) -> String {
        format!("http://{}/", self.router.addr("web").expect("listener"))
    }

    fn stats(&self) -> ReceiverStats {
        self.receiver.stats()
    }

    /// Whether member `name` of `app` is up (probes, ejection, agent freshness) now.
    fn healthy(&self, name: &str) -> bool {
        let snap = self.live.load();
        snap.clusters["app"].with(|b| {
            let i = b.member_index(name).expect("member");
            b.states()[i].is_healthy(clock::now(), &b.spec().policy)
        })
    }

    /// Whether member `name` has a report at all.
    fn reported(&self, name: &str) -> bool {
        let snap = self.live.load();
        snap.clusters["app"].with(|b| {
            let i = b.member_index(name).expect("member");
            b.states()[i].load.agent.is_some()
        })
    }
}

/// A router with listener `web` -> cluster `app` (`algorithm`, two members m1 and m2, no panic
/// mode, `misses` heartbeats), and an agent receiver at `interval_ms`.
async fn setup(algorithm: &str, interval_ms: u64, misses: u32) -> Setup {
    let ms = members(2, Duration::ZERO).await;
    let text = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"app\"\n\n\
         [cluster.app]\nalgorithm = \"{algorithm}\"\npanic_threshold_percent = 0\n\
         agent = {{ misses = {misses} }}\n{}\n\n\
         [agent]\nlisten = \"127.0.0.1:0\"\nkey = \"{KEY}\"\ninterval_ms = {interval_ms}\n",
        member_list(&ms)
    );
    let config = rondo_config::parse_str(&text, std::path::Path::new("agent-test.toml"), 1)
        .unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
    let spec = config.agent.clone().expect("[agent]");
    assert_eq!(
        config.view.clusters["app"].policy.agent.timeout,
        Duration::from_millis(interval_ms * u64::from(misses))
    );
    let live = Arc::new(Live::new(config.view.clone(), None));
    probe::spawn(&live.load());
    let router = rondo_proxy::start(&config.listeners, live.clone()).await.expect("router starts");
    let opts = ReceiverOpts {
        listen: spec.listen,
        key: Key::new(KEY.as_bytes()),
        interval: spec.interval,
        tls: None,
        resume: None,
    };
    let receiver =
        rondo_agent::receiver::start(opts, live.views.clone(), &live.metrics, &live.sockets)
            .await
            .expect("receiver starts");
    Setup { router, live, receiver, members: ms }
}

/// Polls `cond` every 10 ms for at most `limit`; the time it took, or `None`.
async fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() <= limit {
        if cond() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_cpu_follows_the_agents_and_a_stopped_agent_takes_its_member_out() {
    let (interval, misses) = (100, 3);
    let s = setup("least-cpu", interval, misses).await;
    let to = s.receiver.addr;
    let a1 = agent(to, "m1", KEY, &["--fixed-cpu", "0.1", "--fixed-mem-mib", "512"]);
    let _a2 = agent(to, "m2", KEY, &["--fixed-cpu", "0.9", "--fixed-mem-mib", "512"]);
    within(Duration::from_secs(10), || s.reported("m1") && s.reported("m2"))
        .await
        .expect("both agents report within 10 s");
    assert_eq!(s.stats().hellos, 2);

    let names = served_by(&s.url(), 20).await;
    assert_eq!(count(&names, "m1"), 20, "least-cpu goes to the 10 % member: {names:?}");
    let report = s.live.load().clusters["app"].with(|b| b.states()[0].load.agent.unwrap());
    assert_eq!((report.cpu_used, report.mem_free), (0.1, 512 << 20));

    // Stopped agent: m1 is out within (misses + 1) x interval.
    a1.signal("-STOP");
    let stopped = Instant::now();
    let limit = Duration::from_millis(interval * u64::from(misses + 1));
    let took = within(limit, || !s.healthy("m1")).await;
    assert!(took.is_some(), "m1 still up {limit:?} after its agent stopped");
    eprintln!("m1 down {:?} after SIGSTOP", stopped.elapsed());
    let names = served_by(&s.url(), 20).await;
    assert_eq!(count(&names, "m2"), 20, "nothing to the silent member: {names:?}");

    // Continued: heartbeats resume and m1 takes the traffic again.
    a1.signal("-CONT");
    let took = within(Duration::from_secs(2), || s.healthy("m1")).await;
    let took = took.expect("m1 back within 2 s of SIGCONT");
    eprintln!("m1 up {took:?} after SIGCONT");
    let names = served_by(&s.url(), 20).await;
    assert_eq!(count(&names, "m1"), 20, "back on the 10 % member: {names:?}");
    let st = s.stats();
    assert_eq!((st.bad_mac, st.truncated, st.replayed, st.unknown_member), (0, 0, 0, 0), "{st:?}");
    assert_eq!(s.members.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_free_memory_falls_back_to_least_sessions_without_reports() {
    let s = setup("most-free-memory", 100, 3).await;
    // No agent at all: the pick falls back to least-sessions, which spreads sequential requests.
    let names = served_by(&s.url(), 20).await;
    assert!(count(&names, "m1") > 0 && count(&names, "m2") > 0, "{names:?}");
    let to = s.receiver.addr;
    let _a1 = agent(to, "m1", KEY, &["--fixed-cpu", "0.5", "--fixed-mem-mib", "100"]);
    let _a2 = agent(to, "m2", KEY, &["--fixed-cpu", "0.5", "--fixed-mem-mib", "900"]);
    within(Duration::from_secs(10), || s.reported("m1") && s.reported("m2"))
        .await
        .expect("both agents report");
    let names = served_by(&s.url(), 20).await;
    assert_eq!(count(&names, "m2"), 20, "most free memory: {names:?}");
}

/// Sends `d` to the receiver from a fresh socket.
async fn send(to: SocketAddr, d: &[u8]) {
    let sock = tokio::net::UdpSocket::bind(any_port()).await.expect("bind");
    sock.send_to(d, to).await.expect("send");
}

/// One hello on a new connection; the answer line.
async fn hello(to: SocketAddr, line: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(to).await.expect("connect");
    conn.write_all(line.as_bytes()).await.expect("send hello");
    let mut answer = String::new();
    BufReader::new(conn).read_line(&mut answer).await.expect("answer");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_keys_bad_datagrams_and_unknown_members_are_refused_and_counted() {
    let s = setup("least-cpu", 100, 3).await;
    let to = s.receiver.addr;
    // An agent with the wrong key is refused at hello (and keeps retrying with backoff).
    let _bad = agent(to, "m1", "not-the-key", &["--fixed-cpu", "0.1"]);
    within(Duration::from_secs(5), || s.stats().hellos_refused >= 1)
        .await
        .expect("the wrong key is refused");
    assert_eq!(s.stats().hellos, 0);
    assert!(!s.reported("m1"));

    let key = Key::new(KEY.as_bytes());
    let wrong = Key::new(b"not-the-key");
    assert_eq!(hello(to, &wire::hello_line("app", "m1", &wrong)).await, "ERR bad key\n");
    assert_eq!(
        hello(to, &wire::hello_line("app", "ghost", &key)).await,
        "ERR unknown member app/ghost\n"
    );
    assert_eq!(
        hello(to, &wire::hello_line("nope", "m1", &key)).await,
        "ERR unknown member nope/m1\n"
    );
    assert_eq!(hello(to, "GET / HTTP/1.1\r\n").await, "ERR malformed hello\n");
    let epoch = s.receiver.epoch();
    let ok = hello(to, &wire::hello_line("app", "m2", &key)).await;
    assert_eq!(
        wire::parse_ok(&ok, "app", "m2", &key),
        Ok(HelloOk { interval_ms: 100, next_seq: 0, epoch })
    );
    // The answer is signed for the member that asked.
    assert!(wire::parse_ok(&ok, "app", "m1", &key).is_err());

    let hb = |member: &str, seq: u64| Heartbeat {
        epoch,
        cluster: "app".into(),
        member: member.into(),
        seq,
        cpu_used: 0.2,
        mem_free: 1 << 30,
        sessions: 3,
    };
    let good = wire::encode(&hb("m2", 10), &key).unwrap();
    // The wrong key's datagrams.
    send(to, &wire::encode(&hb("m1", 1), &wrong).unwrap()).await;
    send(to, &wire::encode(&hb("m1", 2), &wrong).unwrap()).await;
    // Truncated, not a heartbeat, another version.
    send(to, &good[..good.len() - 1]).await;
    send(to, b"GET / HTTP/1.1\r\n\r\n").await;
    let mut v1 = good.clone();
    v1[4] = 1;
    send(to, &v1).await;
    // Correctly signed, for another epoch (an earlier run of the router).
    let stale = Heartbeat { epoch: epoch.wrapping_add(1), ..hb("m2", 20) };
    send(to, &wire::encode(&stale, &key).unwrap()).await;
    // Unknown member, unknown cluster (both correctly signed).
    send(to, &wire::encode(&hb("ghost", 1), &key).unwrap()).await;
    let other = Heartbeat { cluster: "nope".into(), ..hb("m1", 1) };
    send(to, &wire::encode(&other, &key).unwrap()).await;
    // Accepted once, then replayed, then an older one.
    send(to, &good).await;
    within(Duration::from_secs(2), || s.stats().accepted == 1).await.expect("accepted");
    send(to, &good).await;
    send(to, &wire::encode(&hb("m2", 9), &key).unwrap()).await;
    let want = ReceiverStats {
        accepted: 1,
        bad_mac: 2,
        truncated: 1,
        bad_version: 2,
        malformed: 0,
        replayed: 2,
        stale_epoch: 1,
        unknown_member: 2,
        hellos: 1,
        hellos_refused: 0,
    };
    let done = within(Duration::from_secs(2), || {
        let st = s.stats();
        st.replayed == 2 && st.bad_mac >= 2 && st.unknown_member == 2 && st.stale_epoch == 1
    })
    .await;
    let st = s.stats();
    assert!(done.is_some(), "{st:?}");
    // The refused agent keeps retrying, so its count grows; everything else is exact.
    assert!(st.hellos_refused >= 4, "{st:?}");
    assert_eq!(ReceiverStats { hellos_refused: 0, ..st }, want);
    // `/metrics` shows the same counts (the receiver counts into the process's metrics).
    let text = s.live.metrics.render(&s.live.load());
    let heartbeats = [
        ("accepted", 1),
        ("bad_mac", 2),
        ("truncated", 1),
        ("bad_version", 2),
        ("malformed", 0),
        ("replayed", 2),
        ("stale_epoch", 1),
        ("unknown_member", 2),
    ];
    let lines =
        heartbeats.iter().map(|(r, n)| ("heartbeat", *r, *n)).chain([("hello", "accepted", 1)]);
    for (kind, result, n) in lines {
        let line =
            format!("rondo_agent_messages_total{{kind=\"{kind}\",result=\"{result}\"}} {n}\n");
        assert!(text.contains(&line), "{line:?} missing from\n{text}");
    }
    assert!(
        text.contains("rondo_agent_messages_total{kind=\"hello\",result=\"refused\"} "),
        "{text}"
    );
    // After a hello, the router tells where the sequence continues.
    let ok = hello(to, &wire::hello_line("app", "m2", &key)).await;
    assert_eq!(
        wire::parse_ok(&ok, "app", "m2", &key),
        Ok(HelloOk { interval_ms: 100, next_seq: 11, epoch })
    );
    assert!(s.reported("m2") && !s.reported("m1"));
    // The router still serves.
    assert_eq!(served_by(&s.url(), 4).await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_percent_loss_and_five_misses_make_no_false_downs_in_30_s() {
    let (interval, misses) = (100, 5);
    let s = setup("least-cpu", interval, misses).await;
    let to = s.receiver.addr;
    let drop = ["--drop-percent", "10"];
    let _a1 = agent(to, "m1", KEY, &[&["--fixed-cpu", "0.3"][..], &drop].concat());
    let _a2 = agent(to, "m2", KEY, &[&["--fixed-cpu", "0.6"][..], &drop].concat());
    within(Duration::from_secs(10), || s.reported("m1") && s.reported("m2"))
        .await
        .expect("both agents report");
    let start = Instant::now();
    let mut checks = 0;
    let mut downs = Vec::new();
    while start.elapsed() < Duration::from_secs(30) {
        for m in ["m1", "m2"] {
            if !s.healthy(m) {
                downs.push((m, start.elapsed()));
            }
        }
        checks += 1;
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
    let st = s.stats();
    eprintln!("{checks} checks, {st:?}");
    assert!(downs.is_empty(), "false downs: {downs:?}");
    assert!(checks >= 200, "only {checks} checks in 30 s");
    // About 10 % of about 2 x 300 heartbeats were not sent.
    let expected = 2 * 30_000 / interval;
    assert!(
        st.accepted > expected * 80 / 100 && st.accepted < expected * 97 / 100,
        "accepted {} of about {expected} heartbeats",
        st.accepted
    );
}

/// Lines a child writes to one of its pipes, collected by a thread.
struct Lines(Arc<std::sync::Mutex<Vec<String>>>);

impl Lines {
    fn collect(pipe: impl std::io::Read + Send + 'static) -> Lines {
        Lines(common::collect_lines(pipe))
    }

    /// Waits (at most `limit`) for a line containing every one of `parts`.
    async fn wait_for(&self, parts: &[&str], limit: Duration) -> String {
        let mut found = None;
        within(limit, || {
            found = self
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .cloned();
            found.is_some()
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "no line with {parts:?} within {limit:?}:\n{}",
                self.0.lock().unwrap().join("\n")
            )
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_process_with_agent_processes_logs_fallback_and_availability() {
    let ms = members(2, Duration::ZERO).await;
    let dir = std::env::temp_dir().join(format!("rondo-agent-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("agent.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let web = support::dead_addr();
    let agent_addr = support::dead_addr();
    let admin_addr = support::dead_addr();
    let path = dir.join("rondo.toml");
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"{web}\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"app\"\n\n\
             [cluster.app]\nalgorithm = \"least-cpu\"\npanic_threshold_percent = 0\n\
             agent = {{ misses = 3 }}\n{}\n\n\
             [agent]\nlisten = \"{agent_addr}\"\nkey_file = \"agent.key\"\ninterval_ms = 100\n\n\
             [admin]\nlisten = \"{admin_addr}\"\ntoken = \"{KEY}\"\n",
            member_list(&ms)
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", path.to_str().unwrap(), "--workers", "1"])
        .env("RONDO_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rondo serve");
    let out = Lines::collect(child.stdout.take().unwrap());
    let err = Lines::collect(child.stderr.take().unwrap());
    let _serve = Proc(child);
    let line = out.wait_for(&["agent receiver on"], Duration::from_secs(10)).await;
    assert!(line.contains(&agent_addr.to_string()), "{line}");
    // No reports yet: least-cpu says it falls back.
    err.wait_for(&["falling back to least-sessions", "app", "m1, m2"], Duration::from_secs(5))
        .await;

    let key = ["--key-file", key_file.to_str().unwrap()];
    let spawn = |member: &str, cpu: &str| {
        let child = Command::new(BIN)
            .args(["agent", "--report-to", &agent_addr.to_string(), "--cluster", "app"])
            .args(["--member", member, "--fixed-cpu", cpu])
            .args(key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rondo agent");
        Proc(child)
    };
    let a1 = spawn("m1", "0.1");
    let _a2 = spawn("m2", "0.9");
    err.wait_for(&["no longer falling back", "app"], Duration::from_secs(10)).await;
    let names = served_by(&format!("http://{web}/"), 20).await;
    assert_eq!(count(&names, "m1"), 20, "{names:?}");

    a1.signal("-STOP");
    err.wait_for(&["member unavailable", "m1"], Duration::from_secs(5)).await;
    let names = served_by(&format!("http://{web}/"), 20).await;
    assert_eq!(count(&names, "m2"), 20, "{names:?}");
    a1.signal("-CONT");
    err.wait_for(&["member available again", "m1"], Duration::from_secs(5)).await;
    let names = served_by(&format!("http://{web}/"), 20).await;
    assert_eq!(count(&names, "m1"), 20, "{names:?}");
    // The admin API's `/metrics` counts the agents' messages.
    let url = format!("http://{admin_addr}/metrics");
    let bearer = format!("Bearer {KEY}");
    let metrics = support::get_with(&support::client(), &url, &[("authorization", &bearer)]).await;
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    let count_of = |kind: &str, result: &str| -> u64 {
        let prefix = format!("rondo_agent_messages_total{{kind=\"{kind}\",result=\"{result}\"}} ");
        let line = metrics.body.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
        line.and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{prefix}in\n{}", metrics.body))
    };
    assert!(count_of("hello", "accepted") >= 2, "{}", metrics.body);
    // Both agents reported, m1 before its SIGSTOP and again after its SIGCONT.
    assert!(count_of("heartbeat", "accepted") >= 3, "{}", metrics.body);
    assert_eq!(count_of("heartbeat", "bad_mac"), 0);
    eprintln!("router log:\n{}", err.0.lock().unwrap().join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn agent_command_refuses_bad_options() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["agent", "--report-to", "127.0.0.1:1", "--cluster", "app", "--member", "m1"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run rondo agent");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "no key is a usage error: {err}");
    assert!(err.contains("--key <KEY>"), "{err}");
    let (code, err) = run(&["--key", "k", "--key-file", "f"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = run(&["--key-file", "/nonexistent/agent.key"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot read agent key file /nonexistent/agent.key"), "{err}");
    let (code, err) = run(&["--key", "k", "--fixed-cpu", "1.5"]);
    assert_eq!((code, err.trim_end()), (Some(1), "rondo agent: fixed cpu 1.5 is outside 0..=1"));
}

/// A `rondo serve` process with its stdout and stderr lines.
struct Serve {
    err: Lines,
    _proc: Proc,
}

/// Writes a config with listener `web` -> cluster `app` (least-cpu, members `ms`), `[agent]` on
/// `agent_addr` (interval 100 ms) and `[admin]` on `admin_addr`, in `dir`; returns its path
/// and the listener's address.
fn serve_config(
    dir: &common::TempDir,
    ms: &[Member],
    agent_addr: SocketAddr,
    admin_addr: SocketAddr,
) -> (std::path::PathBuf, SocketAddr) {
    let path = dir.0.join("rondo.toml");
    let web = support::dead_addr();
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"{web}\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"app\"\n\n\
             [cluster.app]\nalgorithm = \"least-cpu\"\npanic_threshold_percent = 0\n\
             agent = {{ misses = 3 }}\n{}\n\n\
             [agent]\nlisten = \"{agent_addr}\"\nkey = \"{KEY}\"\ninterval_ms = 100\n\n\
             [admin]\nlisten = \"{admin_addr}\"\ntoken = \"{KEY}\"\n",
            member_list(ms)
        ),
    )
    .unwrap();
    (path, web)
}

/// Starts `rondo serve` (log level info) and waits for its agent receiver.
async fn start_serve(config: &std::path::Path) -> Serve {
    let mut child = Command::new(BIN)
        .args(["serve", "--config", config.to_str().unwrap(), "--workers", "1"])
        .env("RONDO_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rondo serve");
    let out = Lines::collect(child.stdout.take().unwrap());
    let err = Lines::collect(child.stderr.take().unwrap());
    let proc = Proc(child);
    out.wait_for(&["agent receiver on"], Duration::from_secs(10)).await;
    Serve { err, _proc: proc }
}

/// `rondo agent` (log level info) for member `member` of `app`, with its stderr lines.
fn logged_agent(to: SocketAddr, member: &str, key: &str) -> (Proc, Lines) {
    let mut child = Command::new(BIN)
        .args(["agent", "--report-to", &to.to_string(), "--cluster", "app", "--member", member])
        .args(["--key", key, "--fixed-cpu", "0.2"])
        .env("RONDO_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rondo agent");
    let err = Lines::collect(child.stderr.take().unwrap());
    (Proc(child), err)
}

/// `rondo_agent_messages_total{kind, result}` from the admin API at `admin` (0 when absent).
async fn agent_count(admin: SocketAddr, kind: &str, result: &str) -> u64 {
    let url = format!("http://{admin}/metrics");
    let bearer = format!("Bearer {KEY}");
    let got = support::get_with(&support::client(), &url, &[("authorization", &bearer)]).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let prefix = format!("rondo_agent_messages_total{{kind=\"{kind}\",result=\"{result}\"}} ");
    got.body
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Polls [`agent_count`] every 50 ms for at most `limit` until `cond` holds; the last count.
async fn agent_count_until(
    admin: SocketAddr,
    kind: &str,
    result: &str,
    limit: Duration,
    cond: impl Fn(u64) -> bool,
) -> u64 {
    let start = Instant::now();
    loop {
        let n = agent_count(admin, kind, result).await;
        if cond(n) || start.elapsed() > limit {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP and UDP relay on one loopback port in front of a router's agent address: hellos pass
/// through, heartbeats are recorded and passed on, the router's datagrams go back to the agent.
struct Relay {
    addr: SocketAddr,
    captured: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn relay(to: SocketAddr) -> Relay {
    let tcp = tokio::net::TcpListener::bind(any_port()).await.expect("bind relay");
    let addr = tcp.local_addr().unwrap();
    let facing = Arc::new(tokio::net::UdpSocket::bind(addr).await.expect("bind relay udp"));
    let upstream = Arc::new(tokio::net::UdpSocket::bind(any_port()).await.expect("bind"));
    let captured = Arc::new(std::sync::Mutex::new(Vec::new()));
    let agent_at = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    let hellos = tokio::spawn(async move {
        while let Ok((mut conn, _)) = tcp.accept().await {
            tokio::spawn(async move {
                if let Ok(mut up) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
            });
        }
    });
    let (f, u, c, a) = (facing.clone(), upstream.clone(), captured.clone(), agent_at.clone());
    let out = tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((n, from)) = f.recv_from(&mut buf).await else { continue };
            *a.lock().unwrap() = Some(from);
            c.lock().unwrap().push(buf[..n].to_vec());
            let _ = u.send_to(&buf[..n], to).await;
        }
    });
    let back = tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((n, _)) = upstream.recv_from(&mut buf).await else { continue };
            let agent = *agent_at.lock().unwrap();
            if let Some(agent) = agent {
                let _ = facing.send_to(&buf[..n], agent).await;
            }
        }
    });
    Relay { addr, captured, tasks: vec![hellos, out, back] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_captured_before_a_router_restart_is_refused_after_it() {
    let ms = members(2, Duration::ZERO).await;
    let dir = common::TempDir::new("agent-epoch");
    let (agent_addr, admin_addr) = (support::dead_addr(), support::dead_addr());
    let (config, _) = serve_config(&dir, &ms, agent_addr, admin_addr);
    let first = start_serve(&config).await;
    let relay = relay(agent_addr).await;
    let (a1, a1_log) = logged_agent(relay.addr, "m1", KEY);
    let n =
        agent_count_until(admin_addr, "heartbeat", "accepted", Duration::from_secs(10), |n| n >= 2)
            .await;
    assert!(n >= 2, "the agent's heartbeats reach the first router through the relay: {n}");
    // Keep one valid heartbeat, then stop the agent so nothing else reaches the next router.
    a1.signal("-STOP");
    let old = relay.captured.lock().unwrap().first().cloned().expect("a captured heartbeat");
    drop(first);

    // The same router, restarted on the same addresses.
    let second = start_serve(&config).await;
    send(agent_addr, &old).await;
    let stale =
        agent_count_until(admin_addr, "heartbeat", "stale_epoch", Duration::from_secs(5), |n| {
            n >= 1
        })
        .await;
    // (At least: one sent just before the SIGSTOP may still have been under way.)
    assert!(stale >= 1, "the replayed heartbeat is counted as another epoch");
    assert_eq!(
        agent_count(admin_addr, "heartbeat", "accepted").await,
        0,
        "the replayed heartbeat was applied"
    );
    let line = second.err.wait_for(&["another epoch", "m1"], Duration::from_secs(5)).await;
    assert!(line.contains("peer=127.0.0.1:"), "the refusal names the sender: {line}");

    // The agent continues: the new router refuses its heartbeats, tells it so, and the agent
    // says hello again and is accepted.
    a1.signal("-CONT");
    a1_log.wait_for(&["saying hello again"], Duration::from_secs(10)).await;
    let accepted =
        agent_count_until(admin_addr, "heartbeat", "accepted", Duration::from_secs(10), |n| n >= 1)
            .await;
    assert!(accepted >= 1, "the agent's heartbeats are accepted after its new hello");
    assert!(agent_count(admin_addr, "hello", "accepted").await >= 1);
    second.err.wait_for(&["agent accepted", "m1", "peer=127.0.0.1:"], Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_backs_off_and_both_sides_say_who_and_why() {
    let ms = members(2, Duration::ZERO).await;
    let dir = common::TempDir::new("agent-key");
    let (agent_addr, admin_addr) = (support::dead_addr(), support::dead_addr());
    let (config, _) = serve_config(&dir, &ms, agent_addr, admin_addr);
    let serve = start_serve(&config).await;
    let started = Instant::now();
    let (_bad, bad_log) = logged_agent(agent_addr, "m1", "not-the-key");
    let (_good, _) = logged_agent(agent_addr, "m2", KEY);
    // The agent says plainly that its key is refused and what to do.
    bad_log.wait_for(&["refused this agent's key", "[agent] key"], Duration::from_secs(5)).await;
    // The router names the member and where it came from.
    let line = serve.err.wait_for(&["wrong key", "m1"], Duration::from_secs(5)).await;
    assert!(line.contains("WARN") && line.contains("peer=127.0.0.1:"), "{line}");
    serve
        .err
        .wait_for(&["INFO", "agent accepted", "m2", "peer=127.0.0.1:"], Duration::from_secs(5))
        .await;
    // Back off: tries at about 0, 1, 3 and 7 s, so at most 3 in the first 4.5 s (the 100 ms
    // start of other failures would make 6).
    let wait = Duration::from_millis(4500).saturating_sub(started.elapsed());
    tokio::time::sleep(wait).await;
    let refused = agent_count(admin_addr, "hello", "refused").await;
    assert!((1..=3).contains(&refused), "{refused} refused hellos in 4.5 s");

    // A flood of refused datagrams: every one counted, few logged.
    let wrong = Key::new(b"not-the-key");
    let before = agent_count(admin_addr, "heartbeat", "bad_mac").await;
    for seq in 1..=50 {
        let hb = Heartbeat {
            epoch: 0,
            cluster: "app".into(),
            member: "m1".into(),
            seq,
            cpu_used: 0.1,
            mem_free: 1,
            sessions: 0,
        };
        send(agent_addr, &wire::encode(&hb, &wrong).unwrap()).await;
    }
    let n = agent_count_until(admin_addr, "heartbeat", "bad_mac", Duration::from_secs(5), |n| {
        n >= before + 50
    })
    .await;
    assert_eq!(n, before + 50);
    // The log is read by a thread of its own: wait for the first line, then a moment more.
    serve.err.wait_for(&["bad mac", "m1", "peer=127.0.0.1:"], Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let logged = serve.err.0.lock().unwrap().iter().filter(|l| l.contains("bad mac")).count();
    assert!(
        (1..=rondo_agent::receiver::LOG_BURST as usize).contains(&logged),
        "{logged} log lines for 50 bad datagrams"
    );
}

/// `GET /api/v1/status` of the admin API at `admin`.
async fn admin_status(admin: SocketAddr) -> serde_json::Value {
    let url = format!("http://{admin}/api/v1/status");
    let bearer = format!("Bearer {KEY}");
    let got = support::get_with(&support::client(), &url, &[("authorization", &bearer)]).await;
    assert_eq!(got.status, 200, "{}", got.body);
    serde_json::from_str(&got.body).expect("status is JSON")
}

/// The status of member `name` of cluster `app`.
fn app_member(status: &serde_json::Value, name: &str) -> serde_json::Value {
    let c = status["clusters"].as_array().unwrap().iter().find(|c| c["name"] == "app").unwrap();
    c["members"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_agent_went_silent_is_reported_out_with_why_in_every_view() {
    let ms = members(2, Duration::ZERO).await;
    let dir = common::TempDir::new("agent-why");
    let (agent_addr, admin_addr) = (support::dead_addr(), support::dead_addr());
    let (config, web) = serve_config(&dir, &ms, agent_addr, admin_addr);
    let _serve = start_serve(&config).await;
    let (a1, _) = logged_agent(agent_addr, "m1", KEY);
    let (_a2, _) = logged_agent(agent_addr, "m2", KEY);
    let n =
        agent_count_until(admin_addr, "heartbeat", "accepted", Duration::from_secs(10), |n| n >= 4)
            .await;
    assert!(n >= 4, "both agents report: {n}");
    let st = admin_status(admin_addr).await;
    for m in ["m1", "m2"] {
        let m = app_member(&st, m);
        assert_eq!((m["eligible"].as_bool(), &m["reason"]), (Some(true), &serde_json::Value::Null));
        // Nobody checks these members: not "up".
        assert_eq!(m["health"], "unchecked", "{m}");
    }

    // m1's agent falls silent: the router sends m1 nothing, and every view says so and why.
    a1.signal("-STOP");
    let start = Instant::now();
    let mut m1 = app_member(&admin_status(admin_addr).await, "m1");
    while m1["eligible"] != false && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        m1 = app_member(&admin_status(admin_addr).await, "m1");
    }
    assert_eq!(m1["eligible"], false, "{m1}");
    assert_eq!(m1["reason"], "agent_silent", "{m1}");
    assert_eq!(m1["healthy"], true, "the health checks (none) did not take it down: {m1}");
    assert_eq!(m1["health"], "unchecked", "{m1}");
    let m2 = app_member(&admin_status(admin_addr).await, "m2");
    assert_eq!((m2["eligible"].as_bool(), &m2["reason"]), (Some(true), &serde_json::Value::Null));

    // Metrics: healthy keeps meaning the health checks; eligible and the reason say the rest.
    let url = format!("http://{admin_addr}/metrics");
    let bearer = format!("Bearer {KEY}");
    let metrics = support::get_with(&support::client(), &url, &[("authorization", &bearer)]).await;
    for line in [
        "rondo_member_healthy{cluster=\"app\",member=\"m1\"} 1\n",
        "rondo_member_eligible{cluster=\"app\",member=\"m1\"} 0\n",
        "rondo_member_eligible{cluster=\"app\",member=\"m2\"} 1\n",
        "rondo_member_ineligible{cluster=\"app\",member=\"m1\",reason=\"agent_silent\"} 1\n",
    ] {
        assert!(metrics.body.contains(line), "{line:?} missing from\n{}", metrics.body);
    }
    assert!(!metrics.body.contains("member=\"m2\",reason="), "{}", metrics.body);

    // `rondo ctl status`.
    let out = Command::new(BIN)
        .args(["ctl", "--admin", &admin_addr.to_string(), "--token", KEY, "status"])
        .output()
        .expect("rondo ctl runs");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let header: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    let col = |h: &str| header.iter().position(|x| *x == h).unwrap();
    assert_eq!(row("m1")[col("HEALTH")], "unchecked", "{table}");
    assert_eq!(row("m1")[col("TRAFFIC")], "no(agent_silent)", "{table}");
    assert_eq!(row("m2")[col("TRAFFIC")], "yes", "{table}");

    // And indeed nothing goes to m1.
    let names = served_by(&format!("http://{web}/"), 10).await;
    assert_eq!(count(&names, "m2"), 10, "{names:?}");
    a1.signal("-CONT");
}
