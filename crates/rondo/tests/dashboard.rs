//! The dashboard in a real headless Chromium: a `rondo serve` process with three `rondo member`
//! processes and an admin API, driven by `tests/ui/dashboard.mjs` (Node + playwright-core). The
//! link with the token in its fragment connects and leaves no token in the address bar; the
//! page refuses a wrong token, shows the members (agent columns hidden without agents; no EWMA
//! before a member's first request, a decayed one marked; health resting on the checks, probe
//! round trips and ranks; a full-width chart with time ticks and a readable y axis), starts a
//! shadow algorithm whose panel shows a report that adds up, and a Drain click makes the member
//! draining (the status API agrees). Screenshot: `dashboard.png` beside playwright-core
//! (`target/ui-test/dashboard.png`).
//!
//! Needs Debian's `chromium` (or `RONDO_CHROMIUM`), `node`, and playwright-core in
//! `target/ui-test` (or `RONDO_UI_TEST_DIR`, or `$CARGO_TARGET_DIR/ui-test` when
//! `target/ui-test` has none); `.ci/run` installs them. Without them the test
//! says so and passes, unless `CI` is set: then it fails.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::browser::{repo, run_node, tools_or_skip};
use common::{Proc, TempDir};
use serde_json::json;

const TOKEN: &str = "dashboard-test-token";
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];
const DRAINED: &str = "m2";
const SHADOW: &str = "random";
/// A cluster with health checks and no route: probed, never sent a request.
const IDLE: &str = "idle";
const IDLE_MEMBERS: [&str; 2] = ["i1", "i2"];

/// One HTTP/1.1 request with `Connection: close`; status line and body (5 s limit).
fn http(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read answer");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// Sends calls through the router until dropped, so the chart has something to draw.
struct Traffic(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Traffic {
    fn start(addr: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
                    let _ = s.read_to_end(&mut Vec::new());
                }
                std::thread::sleep(Duration::from_millis(30));
            }
        });
        Traffic(stop, Some(thread))
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn dashboard_shows_members_and_drains_one_in_headless_chromium() {
    let Some(tools) = tools_or_skip("dashboard browser test") else { return };

    let stack = Stack::start();
    let (web, admin) = (stack.web, stack.admin);
    let _traffic = Traffic::start(web);
    // Three queued messages: the page's queue table counts them.
    for _ in 0..3 {
        let (status, body) = http(stack.intake, "POST", "/queues/orders", None);
        assert!(status.contains(" 202 "), "{status} {body}");
    }
    let out_dir = tools.playwright.clone();
    std::fs::create_dir_all(&out_dir).unwrap();
    let screenshot = out_dir.join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let env = [
        ("DASHBOARD_URL", format!("http://{admin}/")),
        ("TOKEN", TOKEN.to_owned()),
        ("CLUSTER", "web".to_owned()),
        ("MEMBERS", MEMBERS.join(",")),
        ("DRAIN", DRAINED.to_owned()),
        ("SHADOW", SHADOW.to_owned()),
        ("QUEUE", "orders".to_owned()),
        ("IDLE_CLUSTER", IDLE.to_owned()),
        ("IDLE_MEMBERS", IDLE_MEMBERS.join(",")),
        ("SCREENSHOT", screenshot.display().to_string()),
    ];
    let script = repo().join("crates/rondo/tests/ui/dashboard.mjs");
    let limit = Duration::from_secs(120);
    if let Err(why) = run_node(&tools, &script, &env, &stack.dir.0, limit) {
        panic!("{why}");
    }
    assert!(screenshot.is_file(), "no screenshot at {}", screenshot.display());

    let (status, body) = http(admin, "GET", "/api/v1/status", Some(TOKEN));
    assert!(status.contains(" 200 "), "{status}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    let web = v["clusters"].as_array().unwrap().iter().find(|c| c["name"] == "web").unwrap();
    let members_json = web["members"].as_array().expect("members");
    for m in members_json {
        let want = if m["name"] == DRAINED { "draining" } else { "active" };
        assert_eq!(m["admin"], want, "{m}");
    }
    let served: u64 = members_json.iter().map(|m| m["served"].as_u64().unwrap_or(0)).sum();
    assert!(served > 0, "the status counts served requests: {v}");
    // The shadow the page started is running, and its report adds up.
    assert_eq!(web["shadow"], SHADOW, "{v}");
    let (status, body) = http(admin, "GET", "/api/v1/clusters/web/shadow", Some(TOKEN));
    assert!(status.contains(" 200 "), "{status}: {body}");
    let r: serde_json::Value = serde_json::from_str(&body).expect("shadow report JSON");
    let decisions = r["decisions"].as_u64().unwrap();
    assert!(decisions >= 20, "{r}");
    let picks = |side: &str| -> u64 {
        let members = r["members"].as_array().unwrap();
        members.iter().map(|m| m[side]["picks"].as_u64().unwrap()).sum()
    };
    assert_eq!((picks("live"), picks("shadow")), (decisions, decisions), "{r}");
    drop(stack);
}

#[test]
fn the_page_needs_no_token_but_the_api_does() {
    let stack = Stack::start();
    for path in ["/", "/dashboard"] {
        let (status, body) = http(stack.admin, "GET", path, None);
        assert!(status.contains(" 200 "), "{path}: {status}");
        assert!(body.contains("<title>rondo dashboard</title>"), "{path}");
    }
    for path in ["/api/v1/status", "/nope"] {
        let (status, _) = http(stack.admin, "GET", path, None);
        assert!(status.contains(" 401 "), "{path}: {status}");
    }
    // The status counts each member's served requests (the page charts their rate).
    for _ in 0..6 {
        let (status, _) = http(stack.web, "GET", "/", None);
        assert!(status.contains(" 200 "), "{status}");
    }
    let (_, body) = http(stack.admin, "GET", "/api/v1/status", Some(TOKEN));
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    let clusters = v["clusters"].as_array().expect("clusters");
    let cluster = |name: &str| clusters.iter().find(|c| c["name"] == name).expect(name);
    for m in cluster("web")["members"].as_array().expect("members") {
        assert_eq!(m["served"], 2, "{m}");
        // Measured: the latest sample is recent, and the estimate then is given.
        assert!(m["ewma_sample_ago_ms"].as_u64().is_some_and(|a| a < 60_000), "{m}");
        assert!(m["ewma_at_sample_us"].is_u64(), "{m}");
        // Nothing checks these members.
        assert_eq!((&m["health"], &m["health_source"]), (&json!("unchecked"), &json!(null)));
    }
    // The idle cluster's members got no request: no sample (the EWMA is the configured
    // default), and once a check has answered, their health rests on the checks, with the
    // probe's round trip and rank.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http(stack.admin, "GET", "/api/v1/status", Some(TOKEN));
        let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
        let idle = v["clusters"].as_array().unwrap().iter().find(|c| c["name"] == IDLE).unwrap();
        let members = idle["members"].as_array().expect("members");
        let probed = members.iter().all(|m| m["probe_rtt_us"].is_u64() && m["rank"].is_u64());
        if probed || Instant::now() >= deadline {
            for m in members {
                assert_eq!(m["ewma_sample_ago_ms"], json!(null), "{m}");
                assert_eq!(m["ewma_at_sample_us"], json!(null), "{m}");
                assert_eq!(m["health"], "up", "{m}");
                assert_eq!(m["health_by"], "config", "who last changed it: nobody since the start");
                assert_eq!(m["health_source"], "health-check", "{m}");
                assert!(m["checks_in_a_row"]["passed"].as_u64().is_some_and(|n| n >= 1), "{m}");
                assert!(m["probe_rtt_us"].is_u64() && m["rank"].is_u64(), "{m}");
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Three `rondo member` processes behind a `rondo serve` process (round-robin cluster `web`,
/// listener `web`, admin API with [`TOKEN`]); all killed on drop.
struct Stack {
    web: SocketAddr,
    intake: SocketAddr,
    admin: SocketAddr,
    // Dropped in this order: the router, its members, then the directory.
    _serve: Proc,
    _members: Vec<Proc>,
    dir: TempDir,
}

impl Stack {
    fn start() -> Stack {
        let mut members = Vec::new();
        let mut entries = Vec::new();
        let mut idle = Vec::new();
        for name in MEMBERS {
            let mut p = Proc::start(&["member", "--name", name, "--listen", "127.0.0.1:0"]);
            let addr = p.addr_after(&format!("rondo member {name} on "));
            entries.push(format!("{{ name = \"{name}\", address = \"{addr}\" }}"));
            if let Some(i) = IDLE_MEMBERS.get(idle.len()) {
                idle.push(format!("{{ name = \"{i}\", address = \"{addr}\" }}"));
            }
            members.push(p);
        }
        let dir = TempDir::new("dashboard");
        let config = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
                 [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
                 [[route]]\nlistener = \"web\"\ncluster = \"web\"\n\n\
                 [cluster.web]\nalgorithm = \"round-robin\"\nmembers = [{}]\n\n\
                 [cluster.{IDLE}]\nalgorithm = \"response-time\"\nmembers = [{}]\n\
                 health = {{ path = \"/\", interval_ms = 100, rise = 1, fall = 2 }}\n\n\
                 [[listener]]\nname = \"intake\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"queue\"\n\n\
                 [[route]]\nlistener = \"intake\"\ncluster = \"web\"\n\n\
                 [[queue]]\nname = \"orders\"\ndirectory = \"{}\"\n",
            entries.join(", "),
            idle.join(", "),
            dir.0.join("queues").display()
        );
        let path = dir.0.join("rondo.toml");
        std::fs::write(&path, config).unwrap();
        let mut serve =
            Proc::start(&["serve", "--workers", "1", "--config", path.to_str().unwrap()]);
        let web = serve.addr_after("rondo: listener web on ");
        // In the order `rondo serve` prints them: the admin API before the queues.
        let admin = serve.addr_after("rondo: admin API on ");
        let intake = serve.addr_after("rondo: queue listener intake on ");

        Stack { web, intake, admin, _serve: serve, _members: members, dir }
    }
}

/// The token from a dashboard link `http://ADDR/#token=TOKEN` (percent-decoded), and `ADDR`.
fn parse_link(link: &str) -> (SocketAddr, String) {
    let rest = link.trim().strip_prefix("http://").expect("an http link");
    let (addr, token) = rest.split_once("/#token=").expect("a token in the fragment");
    let mut bytes = Vec::new();
    let mut it = token.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hex: String = it.by_ref().take(2).map(char::from).collect();
            bytes.push(u8::from_str_radix(&hex, 16).expect("percent escape"));
        } else {
            bytes.push(b);
        }
    }
    (addr.parse().expect("address"), String::from_utf8(bytes).expect("utf-8 token"))
}

#[test]
fn demo_serve_prints_the_dashboard_link_with_its_token() {
    let mut demo = Proc::start(&["demo", "--serve", "--calls", "12"]);
    let line = demo.line_with("dashboard: ", Duration::from_secs(60));
    // `  dashboard: http://127.0.0.1:PORT/#token=HEX`
    let (addr, token) =
        parse_link(line.trim().strip_prefix("dashboard: ").expect("dashboard line"));
    assert_eq!(token.len(), 32, "{line}");
    let (status, body) = http(addr, "GET", "/", None);
    assert!(status.contains(" 200 ") && body.contains("rondo dashboard"), "{status}");
    let (status, body) = http(addr, "GET", "/api/v1/status", Some(&token));
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.contains("\"round-robin\""), "{body}");
}

/// `rondo serve` prints the link with the token to a terminal (under `script`, which gives it
/// one), and without it to a pipe: a service's output goes to its log.
#[test]
fn serve_prints_the_token_link_to_a_terminal_only() {
    let Ok(script) = Command::new("script").arg("--version").output() else {
        eprintln!("SKIPPED: no `script` (util-linux) to give rondo serve a terminal");
        return;
    };
    assert!(script.status.success());
    let dir = TempDir::new("dashboard-tty");
    // A token that needs percent-encoding in a link.
    let token = "a+b&c#d%e f";
    let config = dir.0.join("rondo.toml");
    std::fs::write(
        &config,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n\n\
             [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"web\"\n\n\
             [cluster.web]\nmembers = [{{ name = \"m1\", address = \"127.0.0.1:9\" }}]\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();

    let mut piped = Proc::start(&["serve", "--config", config]);
    let line = piped.line_with("rondo: dashboard on ", Duration::from_secs(10));
    assert!(
        line.ends_with("/ (it asks for the admin token)") && !line.contains("token="),
        "{line}"
    );
    drop(piped);

    let command = format!("exec {} serve --config {config}", env!("CARGO_BIN_EXE_rondo"));
    let child = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start script");
    let mut tty = Proc::from_child(child);
    // `rondo serve` is `script`'s child (the shell `exec`s it), not ours: killing `script` would
    // only hang up its terminal (SIGHUP, which `rondo serve` takes as "reload"), so it is ended
    // by its own pid, also when an assertion below fails.
    let _serve = Pid::child_of(tty.child.id());
    let line = tty.line_with("rondo: dashboard on ", Duration::from_secs(10));
    let link = line.trim().strip_prefix("rondo: dashboard on ").expect("link");
    let (addr, given) = parse_link(link);
    assert_eq!(given, token, "{link}");
    let (status, body) = http(addr, "GET", "/api/v1/status", Some(token));
    assert!(status.contains(" 200 "), "{status}: {body}");
}

/// A process this test started through another (`script`), killed (`kill -9`) when dropped.
struct Pid(Option<u32>);

impl Pid {
    /// The first child of `parent`, waiting at most 10 s for it to appear.
    fn child_of(parent: u32) -> Pid {
        let children = format!("/proc/{parent}/task/{parent}/children");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
                return Pid(Some(pid));
            }
            if Instant::now() >= deadline {
                return Pid(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pid {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}
