//! Runs the real `rondo` binary: `rondo check` on the examples, on every configuration the docs
//! show, on broken configs, on configs with warnings and on a missing file; `--version`,
//! `--help`, `completions` and `man`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{BIN, Proc, TempDir, collect_lines};

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
    // The file as an argument or with --config.
    for args in
        [vec!["check", path.to_str().unwrap()], vec!["check", "--config", path.to_str().unwrap()]]
    {
        let out = rondo(&args);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "stderr: {}", text(&out.stderr));
        assert_eq!(
            stdout,
            format!(
                "ok: {}: 3 listeners, 11 routes, 13 clusters, 32 members, view 1\n",
                path.display()
            )
        );
        assert!(out.stderr.is_empty());
    }
    // Not both.
    let out = rondo(&["check", path.to_str().unwrap(), "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// Every `*.toml` under `dir`, sorted.
fn tomls(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

/// Whether this binary was built with every cargo feature `text` needs (comments aside).
fn has_features_for(text: &str) -> bool {
    let sets = |start: &str| text.lines().any(|l| l.trim_start().starts_with(start));
    (cfg!(feature = "dns") || !sets("dns_listen"))
        && (cfg!(feature = "etcd") || !sets("registry = \"etcd\""))
        && (cfg!(feature = "nats") || !sets("backend = \"nats\""))
        && (cfg!(feature = "otel") || !sets("[tracing]"))
}

#[test]
fn check_accepts_every_example_without_warnings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let files = tomls(&dir);
    assert!(files.len() >= 2, "{files:?}");
    for path in files {
        let contents = std::fs::read_to_string(&path).unwrap();
        let out = rondo(&["check", "--strict", path.to_str().unwrap()]);
        if has_features_for(&contents) {
            assert!(out.status.success(), "{}: {}", path.display(), text(&out.stderr));
            assert!(out.stderr.is_empty(), "{}: {}", path.display(), text(&out.stderr));
        } else {
            // Built without a feature it needs: refused, naming the feature.
            assert_eq!(out.status.code(), Some(1), "{}", path.display());
            assert!(text(&out.stderr).contains("cargo feature"), "{}", text(&out.stderr));
        }
    }
}

/// The ```toml blocks of a markdown file.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start() == "```toml" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start() == "```" => blocks.push(current.take().unwrap()),
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed ```toml block");
    blocks
}

#[test]
fn check_accepts_every_config_in_the_quickstart() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/quickstart.md");
    let markdown = std::fs::read_to_string(&doc).expect("docs/quickstart.md");
    let blocks = toml_blocks(&markdown);
    assert!(blocks.len() >= 5, "only {} ```toml blocks", blocks.len());
    // The first config is about ten lines.
    assert!(blocks[0].lines().filter(|l| !l.trim().is_empty()).count() <= 12, "{}", blocks[0]);
    for (i, block) in blocks.iter().enumerate() {
        let dir = TempDir::new("cli");
        let path = dir.0.join(format!("quickstart-{i}.toml"));
        std::fs::write(&path, block).unwrap();
        let out = rondo(&["check", "--strict", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "docs/quickstart.md, ```toml block {i}:\n{block}\n{}",
            text(&out.stderr)
        );
    }
}

/// A config with two warnings: an admin API without a token, and a cluster nothing uses.
const WARNED: &str = r#"[admin]
listen = "127.0.0.1:0"

[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [{ name = "a", address = "127.0.0.1:9101" }]

[cluster.spare]
members = [{ name = "s", address = "127.0.0.1:9102" }]
"#;

#[test]
fn check_prints_warnings_and_exits_0_or_1_with_strict() {
    let dir = TempDir::new("cli");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, WARNED).unwrap();
    let p = path.to_str().unwrap();
    let out = rondo(&["check", p]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    let (l, c) = pos(WARNED, "[admin]");
    assert!(
        lines[0].starts_with(&format!("{p}:{l}:{c}: warning: field `admin`: no `token`")),
        "{stderr}"
    );
    let (l, c) = pos(WARNED, "[cluster.spare]");
    assert!(
        lines[1].starts_with(&format!("{p}:{l}:{c}: warning: field `cluster.spare`: no route")),
        "{stderr}"
    );
    assert_eq!(
        text(&out.stdout),
        format!("ok: {p}: 1 listener, 1 route, 2 clusters, 2 members, view 1 (2 warnings)\n")
    );

    let out = rondo(&["check", "--strict", p]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let strict = text(&out.stderr);
    assert!(strict.starts_with(&stderr), "{strict}");
    assert!(strict.ends_with(&format!("{p}: 2 warnings, refused by --strict\n")), "{strict}");
}

#[test]
fn check_and_serve_refuse_what_this_build_cannot_serve() {
    let config = r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [{ name = "a", address = "127.0.0.1:9101" }]

[naming]
listen = "127.0.0.1:0"
dns_listen = "127.0.0.1:0"
"#;
    let (path, out) = check_text(config);
    if cfg!(feature = "dns") {
        assert!(out.status.success(), "{}", text(&out.stderr));
    } else {
        assert_eq!(out.status.code(), Some(1));
        // The value of `dns_listen` (the same text as the listener's, so not by `pos`).
        let (l, c) = pos(config, "dns_listen = ");
        let c = c + "dns_listen = ".len();
        let stderr = text(&out.stderr);
        assert!(
            stderr.starts_with(&format!(
                "{}:{l}:{c}: field `naming.dns_listen`: DNS needs the `dns` cargo feature",
                path.display()
            )),
            "{stderr}"
        );
        // `serve` refuses it the same way, before binding anything (no listener line).
        let dir = TempDir::new("cli");
        let path = dir.0.join("rondo.toml");
        std::fs::write(&path, config).unwrap();
        let out = rondo(&["serve", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
        assert!(text(&out.stderr).contains("`dns` cargo feature"), "{}", text(&out.stderr));
    }
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
        "{}:{line}:{column}: field `cluster.assets.algoritm`: unknown field `algoritm`, did you mean `algorithm`?\n",
        path.display()
    );
    assert_eq!(stderr, want, "stderr: {stderr}");
}

/// `members_dns` (issue 38): a valid one is counted in the summary, a wrong port is located.
#[test]
fn check_covers_members_dns() {
    let config = |dns: &str| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"api\"\n\n\
             [cluster.api]\nmembers_dns = {{ {dns} }}\n"
        )
    };
    let (_, out) = check_text(&config(r#"name = "api.internal", port = 8080, refresh = "10s""#));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("0 members (and members from DNS in 1 cluster)"), "{stdout}");

    let broken = config(r#"name = "api.internal", port = 99999"#);
    let (path, out) = check_text(&broken);
    assert_eq!(out.status.code(), Some(1));
    let (line, column) = pos(&broken, "99999");
    let want = format!(
        "{}:{line}:{column}: field `cluster.api.members_dns.port`: must be between 1 and 65535, got 99999\n",
        path.display()
    );
    assert_eq!(text(&out.stderr), want);
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
    // The path and the OS error; no made-up position.
    assert_eq!(
        stderr,
        format!(
            "{}: cannot read config file: No such file or directory (os error 2)\n",
            path.display()
        )
    );
    let out = rondo(&["check", path.to_str().unwrap()]);
    assert_eq!(text(&out.stderr), stderr);
}

/// Issue 41 item 8: a file that is not UTF-8 is named at its first bad byte's line and column
/// (in characters, so the `é` before it counts once), not as a position-less read error.
#[test]
fn check_reports_a_file_that_is_not_utf8_at_its_first_bad_byte() {
    let dir = TempDir::new("cli");
    let path = dir.0.join("rondo.toml");
    let mut bytes = b"# caf\xc3\xa9\n[[listener]]\nname = \"w\xc3\xa9b\xff\"\n".to_vec();
    bytes.extend_from_slice(b"listen = \"127.0.0.1:0\"\n");
    std::fs::write(&path, &bytes).expect("write config");
    let out = rondo(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr),
        format!(
            "{}:3:12: the file is not UTF-8 (as TOML must be): bad byte 0xff\n",
            path.display()
        )
    );
    // `rondo ctl apply` reads the file the same way, before it calls any admin API.
    let out =
        rondo(&["ctl", "--admin", "127.0.0.1:9", "--token", "t", "apply", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "rondo ctl: {}:3:12: the file is not UTF-8 (as TOML must be): bad byte 0xff\n",
            path.display()
        )
    );
}

#[test]
fn version_and_help() {
    let out = rondo(&["-V"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), format!("rondo {}\n", env!("CARGO_PKG_VERSION")));
    // --version: the commit (as git says now, or `unknown` without git) and the features.
    let out = rondo(&["--version"]);
    assert!(out.status.success());
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".to_owned(), |o| text(&o.stdout).trim().to_owned());
    let mut features = Vec::new();
    if cfg!(feature = "dns") {
        features.push("dns");
    }
    if cfg!(feature = "etcd") {
        features.push("etcd");
    }
    if cfg!(feature = "nats") {
        features.push("nats");
    }
    if cfg!(feature = "otel") {
        features.push("otel");
    }
    let features = if features.is_empty() { "none".to_owned() } else { features.join(", ") };
    assert_eq!(
        text(&out.stdout),
        format!("rondo {}\ncommit: {head}\nfeatures: {features}\n", env!("CARGO_PKG_VERSION"))
    );

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
    assert_eq!(
        commands,
        [
            "serve",
            "check",
            "member",
            "demo",
            "agent",
            "ctl",
            "tls",
            "auth",
            "simulate",
            "completions",
            "man",
            "help"
        ],
        "{help}"
    );
    assert!(help.contains("RONDO_LOG"), "{help}");
    // One default log level, the true one, in the first lines and in the footer alike.
    assert!(help.lines().next().unwrap_or("").contains("rondo, a load balancer"), "{help}");
    assert!(help.contains("at `info` by default"), "{help}");
    assert!(!help.contains("default `warn`"), "{help}");

    // A bare port for an address gets an example to copy.
    let out = rondo(&["member", "--name", "m", "--listen", "9109"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("write it like `127.0.0.1:9109`"), "{stderr}");

    let out = rondo(&["check"]);
    assert_eq!(out.status.code(), Some(2), "a missing file is a usage error");
    assert!(text(&out.stderr).contains("<FILE|--config <FILE>>"), "{}", text(&out.stderr));
}

#[test]
fn completions_load_in_bash_and_name_every_command() {
    let out = rondo(&["completions", "bash"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    for cmd in ["serve", "check", "ctl", "completions", "--strict", "--token-file"] {
        assert!(script.contains(cmd), "{cmd} not in the bash completion");
    }
    // bash itself loads it and registers the completion for `rondo`.
    let dir = TempDir::new("cli");
    let file = dir.0.join("rondo.bash");
    std::fs::write(&file, &script).unwrap();
    let bash = Command::new("bash")
        .args(["-c", &format!("source {} && complete -p rondo", file.display())])
        .output()
        .expect("run bash");
    assert!(bash.status.success(), "{}", text(&bash.stderr));
    assert!(text(&bash.stdout).contains("_rondo"), "{}", text(&bash.stdout));

    for (shell, marker) in [("zsh", "#compdef rondo"), ("fish", "complete -c rondo")] {
        let out = rondo(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        assert!(text(&out.stdout).contains(marker), "{shell}: {}", text(&out.stdout));
    }
    let out = rondo(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "an unknown shell is a usage error");
}

#[test]
fn man_prints_a_roff_page_of_every_command() {
    let out = rondo(&["man"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH rondo 1"), "{page}");
    assert!(page.contains(".SH NAME"), "{page}");
    for cmd in ["serve", "check", "ctl", "completions"] {
        assert!(page.contains(cmd), "{cmd} not in the man page");
    }
    // --dir: a page per command, each with its own options.
    let dir = TempDir::new("cli");
    let out = rondo(&["man", "--dir", dir.0.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for page in ["rondo.1", "rondo-serve.1", "rondo-check.1", "rondo-ctl.1", "rondo-ctl-apply.1"] {
        assert!(dir.0.join(page).is_file(), "{page} not written");
    }
    let check = std::fs::read_to_string(dir.0.join("rondo-check.1")).unwrap();
    assert!(check.contains("strict"), "{check}");
    let missing = dir.0.join("no/such/dir");
    let out = rondo(&["man", "--dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .starts_with(&format!("rondo man: cannot write pages to {}: ", missing.display())),
        "{}",
        text(&out.stderr)
    );
    // man(1) renders it when it is installed (Debian's man-db).
    if Command::new("man").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let dir = TempDir::new("cli");
        let file = dir.0.join("rondo.1");
        std::fs::write(&file, &page).unwrap();
        let shown = Command::new("man")
            .arg("-l")
            .arg(&file)
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .output()
            .expect("run man");
        assert!(shown.status.success(), "{}", text(&shown.stderr));
        assert!(text(&shown.stdout).contains("load balancer"), "{}", text(&shown.stdout));
    }
}

#[test]
fn the_systemd_unit_runs_rondo_serve_and_verifies() {
    let unit_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rondo.service");
    let unit = std::fs::read_to_string(&unit_path).expect("examples/rondo.service");
    let lines: Vec<&str> = unit.lines().collect();
    for want in [
        "Type=notify",
        "NotifyAccess=all",
        "ExecStart=/usr/local/bin/rondo serve /etc/rondo/rondo.toml",
        "ExecReload=/bin/kill -USR2 $MAINPID",
        "RuntimeDirectory=rondo",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(lines.contains(&want), "{want} not in examples/rondo.service");
    }
    // systemd's own check, with this build's binary in place of /usr/local/bin/rondo (an
    // unknown key or a bad value is reported on stderr).
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let dir = TempDir::new("cli");
        let file = dir.0.join("rondo.service");
        std::fs::write(&file, unit.replace("/usr/local/bin/rondo", BIN)).unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&file)
            .output()
            .expect("run systemd-analyze");
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    }
}

/// `rondo serve --workers 1 PATH` with stdout and stderr piped, `RONDO_LOG` set to `log` (or
/// removed): the process, and stderr's lines as they come.
fn serve_piped(
    path: &Path,
    log: Option<&str>,
) -> (Proc, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--workers", "1", path.to_str().unwrap()]);
    match log {
        Some(level) => cmd.env("RONDO_LOG", level),
        None => cmd.env_remove("RONDO_LOG"),
    };
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rondo serve");
    let mut proc = Proc::from_child(child);
    let stderr = collect_lines(proc.child.stderr.take().expect("stderr"));
    (proc, stderr)
}

#[test]
fn serve_logs_the_warnings_at_start_and_on_reload() {
    let dir = TempDir::new("cli");
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, WARNED).unwrap();
    let (mut proc, stderr) = serve_piped(&path, None);
    proc.line_with("rondo: reloading on changes", std::time::Duration::from_secs(10));
    let p = path.display().to_string();
    let wait_for = |needle: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let lines = stderr.lock().unwrap().clone();
            if lines.iter().any(|l| l.contains(needle)) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} in stderr:\n{}",
                lines.join("\n")
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    // At start, at the default log level.
    let (l, c) = pos(WARNED, "[cluster.spare]");
    wait_for(&format!("config: {p}:{l}:{c}: warning: field `cluster.spare`: no route"));
    // On reload (the file watcher or SIGHUP, whichever comes first), the new file's warnings.
    let changed = format!(
        "{WARNED}\n[cluster.other]\nmembers = [{{ name = \"o\", address = \"127.0.0.1:9103\" }}]\n"
    );
    std::fs::write(&path, &changed).unwrap();
    let ok = Command::new("sh")
        .args(["-c", &format!("kill -HUP {}", proc.child.id())])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -HUP failed");
    let (l, c) = pos(&changed, "[cluster.other]");
    wait_for(&format!("): {p}:{l}:{c}: warning: field `cluster.other`: no route"));
}

#[test]
fn with_watch_config_off_a_save_waits_for_sighup() {
    let dir = TempDir::new("cli");
    let path = dir.0.join("rondo.toml");
    let config = "[router]\nwatch_config = false\n\n[[listener]]\nname = \"web\"\n\
                  listen = \"127.0.0.1:0\"\n\n[[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
                  [cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:9\" }]\n";
    std::fs::write(&path, config).unwrap();
    let (mut proc, stderr) = serve_piped(&path, Some("info"));
    proc.line_with("rondo: reloading on SIGHUP and reload calls only", Duration::from_secs(10));
    let applied = || stderr.lock().unwrap().iter().any(|l| l.contains("applied from"));
    // A save: the watcher (were it on) would apply it within 450 ms; wait four times that.
    std::fs::write(
        &path,
        format!(
            "{config}\n[cluster.d]\nmembers = [{{ name = \"m2\", address = \"127.0.0.1:9\" }}]\n"
        ),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1800));
    assert!(!applied(), "a save was applied with watch_config = false");
    let ok = Command::new("kill")
        .args(["-HUP", &proc.child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -HUP failed");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !applied() {
        assert!(std::time::Instant::now() < deadline, "SIGHUP did not reload:\n{:?}", stderr);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_announces_nothing_when_a_part_cannot_bind() {
    // The admin port is taken: `serve` fails naming it, and has not said the listener is up.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dir = TempDir::new("cli");
    let path = dir.0.join("rondo.toml");
    let config = format!(
        "[admin]\nlisten = \"{}\"\ntoken = \"cli-test-token-0123456789\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"127.0.0.1:9\" }}]\n",
        taken.local_addr().unwrap()
    );
    std::fs::write(&path, config).expect("write config");
    let out = rondo(&["serve", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(text(&out.stdout), "", "announced before every part was bound");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("admin API on"), "{stderr}");
}
