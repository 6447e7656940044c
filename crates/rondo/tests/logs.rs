//! The process's log and the access log, read from a real `rondo serve` writing to files and
//! pipes: state changes at the default level (a member going down and coming back, reloads
//! applied and rejected), JSON lines that parse, no colour escapes off a terminal, and access
//! log lines with the right fields for a proxied 200, a 404 and a 502.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Proc, TempDir, free_port, request, start_member};

/// `rondo serve --config PATH ARGS...` with stderr written to `stderr` (a file: not a terminal).
fn serve(config: &Path, stderr: &Path, args: &[&str]) -> Proc {
    let child = Command::new(BIN)
        .args(["serve", "--config", config.to_str().expect("utf-8 path"), "--workers", "1"])
        .args(args)
        .env_remove("RONDO_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr).expect("create stderr file"))
        .spawn()
        .expect("start rondo serve");
    Proc::from_child(child)
}

/// The file's lines once one of them contains every one of `needles` (15 s at most).
#[track_caller]
fn wait_for_line(path: &Path, needles: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return l.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {needles:?} in {}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A config: listener `web` on `port` (plus `extra_listener` lines), route `/` to cluster `c`
/// of `members`, health-checked every 100 ms (down after one failure, up after one success).
fn config(port: u16, members: &str, extra: &str) -> String {
    format!(
        r#"
[[listener]]
name = "web"
listen = "127.0.0.1:{port}"
{extra}
[[route]]
name = "main"
listener = "web"
cluster = "c"

[cluster.c]
health = {{ kind = "tcp", interval_ms = 100, fall = 1, rise = 1 }}
members = [{members}]
"#
    )
}

#[test]
fn state_changes_are_logged_at_the_default_level_without_colour() {
    let dir = TempDir::new("logs");
    let (mut m1, a1) = start_member("m1", "127.0.0.1:0");
    let port = free_port();
    let path = dir.0.join("rondo.toml");
    let members = format!("{{ name = \"m1\", address = \"{a1}\" }}");
    std::fs::write(&path, config(port, &members, "")).expect("write config");
    let log = dir.0.join("stderr.log");
    let mut router = serve(&path, &log, &[]);
    router.line_with("listener web on", Duration::from_secs(10));

    // The member goes away: down, with the reason; it comes back on the same address: up.
    m1.kill();
    let down = wait_for_line(&log, &["member down", "m1"]);
    assert!(down.contains("WARN"), "{down}");
    assert!(down.contains("health check(s) failed in a row"), "reason missing: {down}");
    let (_m1, _) = start_member("m1", &a1.to_string());
    let up = wait_for_line(&log, &["member up", "m1"]);
    assert!(up.contains("INFO"), "info is the default level: {up}");
    assert!(up.contains("passed in a row"), "reason missing: {up}");

    // A reload is applied (with its view id), a broken file is rejected.
    let weighted = format!("{{ name = \"m1\", address = \"{a1}\", weight = 50 }}");
    std::fs::write(&path, config(port, &weighted, "")).expect("rewrite");
    let applied = wait_for_line(&log, &["config reload", "view 2 applied"]);
    assert!(applied.contains("INFO"), "{applied}");
    std::fs::write(&path, "[cluster.c]\nalgoritm = \"x\"\n").expect("break the file");
    wait_for_line(&log, &["config reload", "rejected"]);

    let text = std::fs::read_to_string(&log).expect("read the log");
    assert!(!text.contains('\u{1b}'), "colour escapes in a file:\n{text}");
    assert!(!text.contains("DEBUG"), "debug lines at the default level:\n{text}");
}

#[test]
fn json_log_lines_parse_from_the_config_or_the_command_line() {
    let dir = TempDir::new("logs");
    let dead = free_port();
    let members = format!("{{ name = \"gone\", address = \"127.0.0.1:{dead}\" }}");

    // `[log] format = "json"` in the config.
    let port = free_port();
    let path = dir.0.join("rondo.toml");
    let text = config(port, &members, "") + "\n[log]\nformat = \"json\"\n";
    std::fs::write(&path, text).expect("write config");
    let log = dir.0.join("stderr.log");
    let mut router = serve(&path, &log, &[]);
    // stdout's status lines are JSON too, in the log's shape.
    let status = router.line_with("listener web on", Duration::from_secs(10));
    let status: serde_json::Value =
        serde_json::from_str(&status).unwrap_or_else(|e| panic!("not JSON ({e}): {status}"));
    assert_eq!(status["level"], "INFO");
    let message = status["fields"]["message"].as_str().expect("message");
    assert!(message.starts_with("rondo: listener web on 127.0.0.1:"), "{status}");
    wait_for_line(&log, &["member down", "gone"]);
    router.kill();
    for line in router.lines.try_iter() {
        let v: Result<serde_json::Value, _> = serde_json::from_str(&line);
        assert!(v.is_ok(), "a stdout line that is not JSON: {line}");
    }
    let text = std::fs::read_to_string(&log).expect("read the log");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    // A listener is announced once, by its status line on stdout (issue 43), not also logged.
    assert!(!lines.iter().any(|v| v["fields"]["message"] == "listening"), "{text}");
    let down = lines.iter().find(|v| v["fields"]["message"] == "member down").expect("down line");
    assert_eq!(down["level"], "WARN");
    assert!(down["timestamp"].is_string(), "{down}");
    assert_eq!(down["fields"]["member"], "gone");
    let reason = down["fields"]["reason"].as_str().expect("reason is a string");
    assert!(reason.contains("refused"), "{reason}");

    // `--log-format json --log-level warn` on the command line: info lines are left out.
    let port = free_port();
    std::fs::write(&path, config(port, &members, "")).expect("write config");
    let log = dir.0.join("stderr-2.log");
    let mut router = serve(&path, &log, &["--log-format", "json", "--log-level", "warn"]);
    router.line_with("listener web on", Duration::from_secs(10));
    wait_for_line(&log, &["member down", "gone"]);
    router.kill();
    let text = std::fs::read_to_string(&log).expect("read the log");
    for l in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert_ne!(v["level"], "INFO", "an info line at --log-level warn: {l}");
    }
    assert!(!text.contains('\u{1b}'), "{text}");
}

#[test]
fn with_a_json_log_refusals_and_a_bad_rondo_log_are_json_too() {
    let dir = TempDir::new("logs");
    let path = dir.0.join("rondo.toml");
    // A config error, before any `[log]` is known: `--log-format json` decides.
    std::fs::write(&path, "[cluster.c]\nalgoritm = \"x\"\n").expect("write config");
    let out = Command::new(BIN)
        .args(["serve", "--log-format", "json", path.to_str().expect("utf-8")])
        .env("RONDO_LOG", "rondo=nonsense[")
        .output()
        .expect("run rondo serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let message = |v: &serde_json::Value| v["fields"]["message"].as_str().unwrap_or("").to_owned();
    assert!(lines.iter().any(|v| message(v).contains("algoritm")), "{stderr}");
    assert!(lines.iter().any(|v| message(v).contains("ignoring RONDO_LOG")), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn access_log_lines_name_route_cluster_member_status_bytes_and_tries() {
    let dir = TempDir::new("logs");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (dead, dead2) = (free_port(), free_port());
    let (web, plain) = (free_port(), free_port());
    let path = dir.0.join("rondo.toml");
    let text = format!(
        r#"
[[listener]]
name = "web"
listen = "127.0.0.1:{web}"
access_log = {{ path = "logs/access.json", format = "json" }}

[[listener]]
name = "plain"
listen = "127.0.0.1:{plain}"
access_log = {{ path = "-" }}

[[route]]
name = "broken"
listener = "web"
match = {{ path_prefix = "/broken" }}
cluster = "dead"

[[route]]
name = "main"
listener = "web"
match = {{ path_prefix = "/echo" }}
cluster = "c"

[[route]]
name = "other"
listener = "plain"
cluster = "c"

[cluster.c]
algorithm = "round-robin"
members = [{{ name = "m1", address = "{a1}" }}]

[cluster.dead]
retry = {{ attempts = 2 }}
members = [{{ name = "d1", address = "127.0.0.1:{dead}" }}, {{ name = "d2", address = "127.0.0.1:{dead2}" }}]
"#
    );
    std::fs::create_dir_all(dir.0.join("logs")).expect("mkdir");
    std::fs::write(&path, text).expect("write config");
    let stderr = dir.0.join("stderr.log");
    let mut router = serve(&path, &stderr, &[]);
    router.line_with("listener plain on", Duration::from_secs(10));
    let web: SocketAddr = format!("127.0.0.1:{web}").parse().expect("addr");
    let plain: SocketAddr = format!("127.0.0.1:{plain}").parse().expect("addr");

    let body = vec![b'x'; 1000];
    let (status, echoed) = request(web, "POST", "/echo?token=secret", &body);
    assert_eq!((status, echoed.len()), (200, 1000));
    let (status, _) = request(web, "GET", "/nowhere", b"");
    assert_eq!(status, 404);
    let (status, _) = request(web, "GET", "/broken/x", b"");
    assert_eq!(status, 502);

    let log = dir.0.join("logs/access.json");
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines.len() < 3 {
        assert!(Instant::now() < deadline, "three access log lines expected, got {lines:?}");
        std::thread::sleep(Duration::from_millis(50));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        lines = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .collect();
    }
    let by_status = |s: u64| {
        lines.iter().find(|v| v["status"] == s).unwrap_or_else(|| panic!("no {s} in {lines:?}"))
    };
    let ok = by_status(200);
    assert_eq!(ok["method"], "POST");
    assert_eq!(ok["path"], "/echo", "the query is left out: {ok}");
    assert_eq!(ok["route"], "main");
    assert_eq!(ok["cluster"], "c");
    assert_eq!(ok["member"], "m1");
    assert_eq!(ok["bytes_in"], 1000);
    assert_eq!(ok["bytes_out"], 1000);
    assert_eq!(ok["tries"], 1);
    assert!(ok["reason"].as_str().is_some_and(|r| r.starts_with("round-robin: ")), "{ok}");
    assert_eq!(ok["error"], serde_json::Value::Null);
    assert!(ok["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{ok}");
    assert!(ok["time"].as_str().is_some_and(|t| t.ends_with('Z') && t.len() == 24), "{ok}");
    assert!(ok["duration_ms"].as_f64().is_some_and(|d| d > 0.0), "{ok}");

    let missing = by_status(404);
    assert_eq!(missing["path"], "/nowhere");
    assert_eq!(missing["route"], serde_json::Value::Null);
    assert_eq!(missing["error"], "no route");
    assert_eq!(missing["tries"], 0);
    assert!(missing["bytes_out"].as_u64().is_some_and(|b| b > 0), "{missing}");

    let bad = by_status(502);
    assert_eq!(bad["route"], "broken");
    assert_eq!(bad["cluster"], "dead");
    assert!(bad["member"] == "d1" || bad["member"] == "d2", "{bad}");
    assert_eq!(bad["tries"], 2, "{bad}");
    assert_eq!(bad["error"], "connection refused");

    // The text format, on stdout.
    let (status, _) = request(plain, "GET", "/hello", b"");
    assert_eq!(status, 200);
    let line = router.line_with("path=/hello", Duration::from_secs(10));
    for field in [
        "method=GET",
        "status=200",
        "route=other",
        "cluster=c",
        "member=m1",
        "bytes_in=0",
        "bytes_out=3",
        "tries=1",
        "reason=\"round-robin: ",
        "error=-",
    ] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    assert!(line.starts_with("time=") && line.contains(" client=127.0.0.1:"), "{line}");
}

#[test]
fn ejections_and_returns_are_logged_with_the_reason() {
    let dir = TempDir::new("logs");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let port = free_port();
    let path = dir.0.join("rondo.toml");
    let text = format!(
        r#"
[[listener]]
name = "web"
listen = "127.0.0.1:{port}"

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
algorithm = "round-robin"
outlier = {{ consecutive_failures = 2, base_ejection_ms = 200, max_ejection_ms = 200 }}
members = [{{ name = "m1", address = "{a1}" }}, {{ name = "m2", address = "{a2}" }}]
"#
    );
    std::fs::write(&path, text).expect("write config");
    let log = dir.0.join("stderr.log");
    let mut router = serve(&path, &log, &[]);
    router.line_with("listener web on", Duration::from_secs(10));
    let web: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");

    // 500s from both members: one is ejected (the 50 % cap keeps the other).
    for _ in 0..4 {
        assert_eq!(request(web, "GET", "/status/500", b"").0, 500);
    }
    let ejected = wait_for_line(&log, &["member ejected by outlier detection"]);
    assert!(ejected.contains("WARN"), "{ejected}");
    assert!(
        ejected.contains("reason=\"2 consecutive failure(s), the last a 5xx response\""),
        "{ejected}"
    );
    // After its ejection time, its first success brings it back.
    std::thread::sleep(Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(request(web, "GET", "/", b"").0, 200);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("member back from ejection")) {
            assert!(l.contains("INFO"), "{l}");
            break;
        }
        assert!(Instant::now() < deadline, "no return logged:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Log rotation: the file renamed, then SIGHUP; later lines go to a new file at the path.
#[test]
fn sighup_reopens_the_access_log_after_a_rotation() {
    let dir = TempDir::new("logs");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let port = free_port();
    let path = dir.0.join("rondo.toml");
    let members = format!("{{ name = \"m1\", address = \"{a1}\" }}");
    let extra = "access_log = { path = \"access.log\" }\n";
    std::fs::write(&path, config(port, &members, extra)).expect("write config");
    let mut router = serve(&path, &dir.0.join("stderr.log"), &[]);
    router.line_with("reloading on changes", Duration::from_secs(10));
    let web: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let log = dir.0.join("access.log");

    assert_eq!(request(web, "GET", "/before", b"").0, 200);
    wait_for_line(&log, &["path=/before"]);
    let rotated = dir.0.join("access.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    let hup = Command::new("kill")
        .args(["-HUP", &router.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(hup.success());
    // The signal is handled asynchronously: send until a line lands in the new file.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("path=/after") {
        assert!(Instant::now() < deadline, "no new access.log after SIGHUP");
        assert_eq!(request(web, "GET", "/after", b"").0, 200);
        std::thread::sleep(Duration::from_millis(100));
    }
    let old = std::fs::read_to_string(&rotated).expect("rotated file");
    assert!(old.contains("path=/before"), "{old}");
}
