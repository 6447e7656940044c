//! Runs the real `rondo` binary: `rondo check` on the example config, on broken configs and on
//! a missing file; `--version` and `--help`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{BIN, TempDir};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rondo.toml")
}

fn rondo(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run rondo")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes `contents` to a fresh `rondo.toml` and runs `rondo check` on it.
fn check_text(contents: &str) -> (PathBuf, Output) {
    let dir = TempDir::new("cli");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, contents).expect("write config");
    let out = rondo(&["check", "--config", path.to_str().unwrap()]);
    drop(dir);
    (path, out)
}

/// 1-based line and column of `needle` in `text`.
fn pos(text: &str, needle: &str) -> (usize, usize) {
    let at = text.find(needle).expect("needle in text");
    let before = &text[..at];
    (before.matches('\n').count() + 1, at - before.rfind('\n').map_or(0, |i| i + 1) + 1)
}

#[test]
fn check_accepts_the_example() {
    let path = example();
    let out = rondo(&["check", "--config", path.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(
        stdout,
        format!(
            "ok: {}: 3 listeners, 10 routes, 11 clusters, 27 members, view 1\n",
            path.display()
        )
    );
    assert!(out.stderr.is_empty());
}

#[test]
fn check_reports_a_typo_with_file_line_column_and_field() {
    let example = std::fs::read_to_string(example()).unwrap();
    let broken = example.replacen("algorithm = \"random\"", "algoritm = \"random\"", 1);
    let (path, out) = check_text(&broken);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    let (line, column) = pos(&broken, "algoritm");
    let want = format!(
        "{}:{line}:{column}: field `cluster.assets.algoritm`: unknown field `algoritm`, expected one of `algorithm`,",
        path.display()
    );
    assert!(stderr.starts_with(&want), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
}

#[test]
fn check_reports_a_route_to_a_missing_cluster() {
    let example = std::fs::read_to_string(example()).unwrap();
    let broken = example.replacen("cluster = \"search\"", "cluster = \"serch\"", 1);
    let (path, out) = check_text(&broken);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let (line, column) = pos(&broken, "\"serch\"");
    let want = format!(
        "{}:{line}:{column}: field `route[2].cluster`: unknown cluster `serch`, expected one of ",
        path.display()
    );
    assert!(stderr.starts_with(&want), "stderr: {stderr}");
}

#[test]
fn check_reports_every_error_one_per_line() {
    let example = std::fs::read_to_string(example()).unwrap();
    let broken = example
        .replacen("cluster = \"search\"", "cluster = \"serch\"", 1)
        .replacen("weight = 200", "weight = 0", 1)
        .replacen("state = \"draining\"", "state = \"drain\"", 1);
    let (path, out) = check_text(&broken);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "stderr: {stderr}");
    let prefix = format!("{}:", path.display());
    assert!(lines.iter().all(|l| l.starts_with(&prefix)), "stderr: {stderr}");
    assert!(
        lines[1].contains(
            "field `cluster.api.members[1].weight`: must be between 1 and 1000000, got 0"
        )
    );
    assert!(lines[2].contains("field `cluster.api.members[2].state`: unknown state `drain`"));
}

#[test]
fn check_reports_a_missing_file() {
    let dir = TempDir::new("cli");
    let path = dir.0.join("does-not-exist.toml");
    let out = rondo(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}:1:1: cannot read config file: ", path.display())),
        "stderr: {stderr}"
    );
}

#[test]
fn version_and_help() {
    let out = rondo(&["--version"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), format!("rondo {}\n", env!("CARGO_PKG_VERSION")));

    let out = rondo(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(help.contains("check"), "{help}");
    // Only commands that work are listed (and clap's own `help`).
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["serve", "check", "member", "demo", "agent", "ctl", "help"], "{help}");

    let out = rondo(&["check"]);
    assert_eq!(out.status.code(), Some(2), "a missing --config is a usage error");
    assert!(text(&out.stderr).contains("--config <FILE>"));
}
