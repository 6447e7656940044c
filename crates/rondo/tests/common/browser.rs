//! The headless browser of the browser tests: Debian's `chromium` (or `RONDO_CHROMIUM`),
//! `node`, and playwright-core in `target/ui-test` (or `RONDO_UI_TEST_DIR`, or
//! `$CARGO_TARGET_DIR/ui-test` when `target/ui-test` has none), which `.ci/run` installs; and
//! a bounded run of a test script under node.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The browser and the playwright-core folder.
pub struct Tools {
    pub chromium: PathBuf,
    pub playwright: PathBuf,
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where playwright-core is installed and screenshots go: `RONDO_UI_TEST_DIR`, else the
/// repository's `target/ui-test` (where `.ci/run` installs it), else, when that has none and
/// `CARGO_TARGET_DIR` is set, that target directory's `ui-test`.
pub fn ui_test_dir() -> PathBuf {
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

/// The tools, or what is missing.
pub fn tools() -> Result<Tools, String> {
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
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The tools, or `None` after saying what is missing (a failure under CI, which installs them).
pub fn tools_or_skip(test: &str) -> Option<Tools> {
    match tools() {
        Ok(t) => Some(t),
        Err(missing) if in_ci() => {
            panic!("CI is set but the browser test cannot run: missing {missing}")
        }
        Err(missing) => {
            eprintln!("SKIPPED {test}: missing {missing} (bash .ci/run installs them)");
            None
        }
    }
}

/// Runs `node script` with `env` (and `CHROMIUM`, `PLAYWRIGHT_DIR`), its output in `dir`, for
/// at most `limit`; its standard output, or why it failed.
pub fn run_node(
    tools: &Tools,
    script: &Path,
    env: &[(&str, String)],
    dir: &Path,
    limit: Duration,
) -> Result<String, String> {
    let (out, err) = (dir.join("node.log"), dir.join("node.err"));
    let mut node = Command::new("node");
    node.arg(script)
        .env("CHROMIUM", &tools.chromium)
        .env("PLAYWRIGHT_DIR", &tools.playwright)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).map_err(|e| e.to_string())?)
        .stderr(std::fs::File::create(&err).map_err(|e| e.to_string())?);
    for (k, v) in env {
        node.env(k, v);
    }
    let mut node = node.spawn().map_err(|e| format!("start node: {e}"))?;
    let deadline = Instant::now() + limit;
    let exit = loop {
        if let Some(s) = node.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = node.kill();
            let _ = node.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    match exit {
        None => Err(format!("the browser run took over {limit:?}\n{stdout}{stderr}")),
        Some(s) if !s.success() => Err(format!("the browser run failed ({s}):\n{stdout}{stderr}")),
        Some(_) if stdout.trim() != "ok" => Err(format!("no `ok` from the run:\n{stdout}{stderr}")),
        Some(_) => Ok(stdout),
    }
}
