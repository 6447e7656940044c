//! The dashboard in a real headless Chromium: a `rondo serve` process with three `rondo member`
//! processes and an admin API, driven by `tests/ui/dashboard.mjs` (Node + playwright-core). The
//! page loads, refuses a wrong token, shows the members, starts a shadow algorithm whose panel
//! shows a report that adds up, and a Drain click makes the member draining (the status API
//! agrees). Screenshot: `dashboard.png` beside playwright-core (`target/ui-test/dashboard.png`).
//!
//! Needs Debian's `chromium` (or `RONDO_CHROMIUM`), `node`, and playwright-core in
//! `target/ui-test` (or `RONDO_UI_TEST_DIR`, or `$CARGO_TARGET_DIR/ui-test` when
//! `target/ui-test` has none); `.ci/run` installs them. Without them the test
//! says so and passes, unless `CI` is set: then it fails.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Proc, TempDir};

const TOKEN: &str = "dashboard-test-token";
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];
const DRAINED: &str = "m2";
const SHADOW: &str = "random";

/// The browser, the playwright-core folder and the script, or what is missing.
struct Tools {
    chromium: PathBuf,
    playwright: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where playwright-core is installed and the screenshot goes: `RONDO_UI_TEST_DIR`, else the
/// repository's `target/ui-test` (where `.ci/run` installs it), else, when that has none and
/// `CARGO_TARGET_DIR` is set, that target directory's `ui-test`.
fn ui_test_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RONDO_UI_TEST_DIR") {
        return PathBuf::from(dir);
    }
    let repo_dir = repo().join("target/ui-test");
    let installed = |d: &Path| d.join("node_modules/playwright-core/package.json").is_file();
    match std::env::var_os("CARGO_TARGET_DIR").map(|t| PathBuf::from(t).join("ui-test")) {
        Some(dir) if !installed(&repo_dir) && installed(&dir) => dir,
        _ => repo_dir,
    }
}

fn tools() -> Result<Tools, String> {
    let chromium = std::env::var_os("RONDO_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let playwright = ui_test_dir();
    let mut missing = Vec::new();
    if !chromium.is_file() {
        missing.push(format!("chromium ({})", chromium.display()));
    }
    let node = Command::new("node").arg("--version").stdout(Stdio::null()).status();
    if !node.is_ok_and(|s| s.success()) {
        missing.push("node".to_owned());
    }
    if !playwright.join("node_modules/playwright-core/package.json").is_file() {
        missing.push(format!(
            "playwright-core (npm install --prefix {} playwright-core@1)",
            playwright.display()
        ));
    }
    if missing.is_empty() { Ok(Tools { chromium, playwright }) } else { Err(missing.join(", ")) }
}

/// `CI` set to anything but empty, `0` or `false`.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

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
    let tools = match tools() {
        Ok(t) => t,
        Err(missing) if in_ci() => {
            panic!("CI is set but the browser test cannot run: missing {missing}")
        }
        Err(missing) => {
            eprintln!(
                "SKIPPED dashboard browser test: missing {missing} (bash .ci/run installs them)"
            );
            return;
        }
    };

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
    let log = stack.dir.0.join("node.log");
    let mut node = Command::new("node")
        .arg(repo().join("crates/rondo/tests/ui/dashboard.mjs"))
        .env("DASHBOARD_URL", format!("http://{admin}/"))
        .env("TOKEN", TOKEN)
        .env("CLUSTER", "web")
        .env("MEMBERS", MEMBERS.join(","))
        .env("DRAIN", DRAINED)
        .env("SHADOW", SHADOW)
        .env("QUEUE", "orders")
        .env("SCREENSHOT", &screenshot)
        .env("CHROMIUM", &tools.chromium)
        .env("PLAYWRIGHT_DIR", &tools.playwright)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(stack.dir.0.join("node.err")).unwrap())
        .spawn()
        .expect("start node");
    let deadline = Instant::now() + Duration::from_secs(120);
    let exit = loop {
        if let Some(s) = node.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = node.kill();
            let _ = node.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&log).unwrap_or_default();
    let stderr = std::fs::read_to_string(stack.dir.0.join("node.err")).unwrap_or_default();
    let exit = exit.unwrap_or_else(|| panic!("the browser run took over 120 s\n{stdout}{stderr}"));
    assert!(exit.success(), "the browser run failed ({exit}):\n{stdout}{stderr}");
    assert_eq!(stdout.trim(), "ok", "{stderr}");
    assert!(screenshot.is_file(), "no screenshot at {}", screenshot.display());

    let (status, body) = http(admin, "GET", "/api/v1/status", Some(TOKEN));
    assert!(status.contains(" 200 "), "{status}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    let members_json = v["clusters"][0]["members"].as_array().expect("members");
    for m in members_json {
        let want = if m["name"] == DRAINED { "draining" } else { "active" };
        assert_eq!(m["admin"], want, "{m}");
    }
    let served: u64 = members_json.iter().map(|m| m["served"].as_u64().unwrap_or(0)).sum();
    assert!(served > 0, "the status counts served requests: {v}");
    // The shadow the page started is running, and its report adds up.
    assert_eq!(v["clusters"][0]["shadow"], SHADOW, "{v}");
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
    for m in v["clusters"][0]["members"].as_array().expect("members") {
        assert_eq!(m["served"], 2, "{m}");
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
        for name in MEMBERS {
            let mut p = Proc::start(&["member", "--name", name, "--listen", "127.0.0.1:0"]);
            let addr = p.addr_after(&format!("rondo member {name} on "));
            entries.push(format!("{{ name = \"{name}\", address = \"{addr}\" }}"));
            members.push(p);
        }
        let dir = TempDir::new("dashboard");
        let config = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
                 [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
                 [[route]]\nlistener = \"web\"\ncluster = \"web\"\n\n\
                 [cluster.web]\nalgorithm = \"round-robin\"\nmembers = [{}]\n\n\
                 [[listener]]\nname = \"intake\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"queue\"\n\n\
                 [[route]]\nlistener = \"intake\"\ncluster = \"web\"\n\n\
                 [[queue]]\nname = \"orders\"\ndirectory = \"{}\"\n",
            entries.join(", "),
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

#[test]
fn demo_serve_prints_the_dashboard_address_and_token() {
    let mut demo = Proc::start(&["demo", "--serve", "--calls", "12"]);
    let line = demo.line_with("dashboard: ", Duration::from_secs(60));
    // `  dashboard: http://127.0.0.1:PORT/ (token: HEX)`
    let rest = line.trim().strip_prefix("dashboard: http://").expect("dashboard line");
    let (addr, token) = rest.split_once("/ (token: ").expect("token");
    let token = token.strip_suffix(')').expect("closing parenthesis");
    assert_eq!(token.len(), 32, "{line}");
    let addr: SocketAddr = addr.parse().expect("address");
    let (status, body) = http(addr, "GET", "/", None);
    assert!(status.contains(" 200 ") && body.contains("rondo dashboard"), "{status}");
    let (status, body) = http(addr, "GET", "/api/v1/status", Some(token));
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.contains("\"round-robin\""), "{body}");
}
