//! Build script: records, for `rondo --version`, the git commit the binary is built from
//! (`RONDO_GIT_COMMIT`; `unknown` when there is no git or no repository: a source tarball,
//! `cargo install` from a registry) and the enabled cargo features (`RONDO_FEATURES`).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    println!("cargo:rustc-env=RONDO_GIT_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
    // The enabled optional features, for `rondo --version` (cargo sets CARGO_FEATURE_<NAME>).
    let features: Vec<&str> = [
        ("dns", "CARGO_FEATURE_DNS"),
        ("etcd", "CARGO_FEATURE_ETCD"),
        ("nats", "CARGO_FEATURE_NATS"),
        ("otel", "CARGO_FEATURE_OTEL"),
    ]
    .into_iter()
    .filter(|(_, var)| std::env::var_os(var).is_some())
    .map(|(name, _)| name)
    .collect();
    let features = if features.is_empty() { "none".to_owned() } else { features.join(", ") };
    println!("cargo:rustc-env=RONDO_FEATURES={features}");
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it points at (a commit),
    // and packed-refs (a branch whose ref was packed). Paths from git, so worktrees work too.
    println!("cargo:rerun-if-changed=build.rs");
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(p) = git(&["rev-parse", "--git-path", &name]) {
            let mut path = PathBuf::from(p);
            if path.is_relative()
                && let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR")
            {
                path = PathBuf::from(dir).join(path);
            }
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}
