//! What the naming tests share: `rondo serve` from a config text (its listener and naming API
//! addresses), `curl -i` against either, and a bounded poll.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{Proc, TempDir, free_port};

/// A running `rondo serve` with its announced addresses.
pub(crate) struct Served {
    pub(crate) proc: Proc,
    pub(crate) naming: SocketAddr,
    pub(crate) listener: Option<SocketAddr>,
}

/// `rondo serve` on `config` (written into `dir`): the naming API's address, and listener
/// `web`'s when the config has one.
pub(crate) fn serve(dir: &TempDir, config: &str) -> Served {
    let path = dir.0.join(format!("rondo-{}.toml", free_port()));
    std::fs::write(&path, config).expect("write config");
    let mut proc =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8 path"), "--workers", "1"]);
    let listener =
        config.contains("[[listener]]").then(|| proc.addr_after("rondo: listener web on"));
    let line = proc.line_with("naming API", Duration::from_secs(10));
    let naming = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("naming address");
    proc.line_with("rondo: reloading on changes", Duration::from_secs(10));
    Served { proc, naming, listener }
}

/// `curl -si URL` (10 s at most): the status, the header block (lower-cased names) and the
/// body.
pub(crate) fn curl(url: &str, extra: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-si", "--max-time", "10"])
        .args(extra)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_lowercase(), body.to_owned())
}

/// A header's value in a lower-cased header block.
pub(crate) fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
}

/// Calls `f` every 50 ms until it gives `Some`, at most `limit`.
pub(crate) fn until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `rondo ARGS` with `env` added (and RONDO_NAMING_ENDPOINTS removed unless `env` sets it):
/// success, stdout, stderr.
pub(crate) fn rondo(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(crate::common::BIN);
    cmd.args(args).env_remove("RONDO_NAMING_ENDPOINTS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run rondo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
