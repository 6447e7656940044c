use std::sync::atomic::AtomicUsize;

use rondo_core::{Actor, PickRequest};

use super::*;
use crate::clock;

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rondo-reload-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A config with listener `web` on `listen`, one route to cluster `c` of `members` (names; the
/// addresses are never dialled: no health checks).
fn config(listen: &str, members: &[&str]) -> String {
    let entries: Vec<String> = members
        .iter()
        .enumerate()
        .map(|(i, m)| format!("{{ name = \"{m}\", address = \"127.0.0.1:{}\" }}", 1 + i))
        .collect();
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"{listen}\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"least-sessions\"\nmembers = [{}]\n",
        entries.join(", ")
    )
}

/// A reloader of `dir/rondo.toml` holding `text`, started from it at view 1.
fn start(dir: &TempDir, text: &str) -> Arc<Reloader> {
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, text).expect("write config");
    let config = rondo_config::load_file(&path, 1).expect("valid start config");
    let live = crate::Live::new(config.view.clone(), None);
    let (views, regs) = (live.views.clone(), live.registrations.clone());
    Arc::new(Reloader::new(path, views, regs, live.metrics.clone(), live.defaults.clone(), &config))
}

fn names(r: &Reloader) -> Vec<String> {
    r.views().load().view.clusters["c"].members.iter().map(|m| m.name.clone()).collect()
}

/// The members picked in `n` picks of cluster `c`.
fn picked(r: &Reloader, n: usize) -> std::collections::BTreeSet<String> {
    let snap = r.views().load();
    let rt = &snap.clusters["c"];
    (0..n)
        .map(|_| {
            let d = rt.pick(&PickRequest { now: clock::now(), ..PickRequest::default() }).unwrap();
            rt.spec.members[d.member].name.clone()
        })
        .collect()
}

#[tokio::test]
async fn a_valid_change_applies_a_newer_view() {
    let dir = TempDir::new();
    let r = start(&dir, &config("127.0.0.1:0", &["a", "b"]));
    std::fs::write(r.path(), config("127.0.0.1:0", &["a", "b", "c"])).unwrap();
    let id = r.reload("test").expect("valid");
    assert_eq!(id, 2);
    assert_eq!(r.views().load().view.id, 2);
    assert_eq!(names(&r), ["a", "b", "c"]);
    assert_eq!(picked(&r, 300).len(), 3, "the new member is picked");
    assert_eq!(r.reload("test").expect("valid"), 3, "ids only grow");
    assert_eq!(r.accepted.load(Ordering::Relaxed), 2);
    assert_eq!(r.rejected.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn an_invalid_change_is_rejected_and_the_view_stays() {
    let dir = TempDir::new();
    let r = start(&dir, &config("127.0.0.1:0", &["a", "b"]));
    let before = r.views().load();
    let bad = config("127.0.0.1:0", &["a", "b", "c"]).replace("algorithm", "algoritm");
    std::fs::write(r.path(), bad).unwrap();
    let errors = r.reload("test").expect_err("a typo'd field is rejected");
    let text = errors.to_string();
    let file = r.path().display().to_string();
    assert!(text.contains(&format!("{file}:11:1:")), "names file:line:column: {text}");
    assert!(text.contains("algoritm"), "{text}");
    let after = r.views().load();
    assert!(Arc::ptr_eq(&before, &after), "the running view is untouched");
    assert_eq!(after.view.id, 1);
    assert_eq!(names(&r), ["a", "b"]);
    assert_eq!(r.rejected.load(Ordering::Relaxed), 1);
    // A later valid file still gets the next id.
    std::fs::write(r.path(), config("127.0.0.1:0", &["a"])).unwrap();
    assert_eq!(r.reload("test").expect("valid"), 2);
}

#[tokio::test]
async fn survivors_keep_their_state_and_removed_members_go() {
    let dir = TempDir::new();
    let r = start(&dir, &config("127.0.0.1:0", &["a", "b", "c"]));
    let old = r.views().load().clusters["c"].clone();
    let now = clock::now();
    old.with(|b| {
        b.set_health(1, false, Actor::Operator("test".into()), now);
        b.begin_request(0);
        b.begin_request(0);
    });
    old.open_session(0);
    // b and a survive (reordered, reweighted), c is removed, d is added.
    let text = config("127.0.0.1:0", &["d", "b", "a"]).replace(
        "name = \"a\", address = \"127.0.0.1:3\"",
        "name = \"a\", address = \"127.0.0.1:3\", weight = 300",
    );
    std::fs::write(r.path(), text).unwrap();
    r.reload("test").expect("valid");
    let snap = r.views().load();
    let new = &snap.clusters["c"];
    new.with(|b| {
        let a = b.member_index("a").unwrap();
        let bb = b.member_index("b").unwrap();
        assert_eq!(b.states()[a].load.in_flight, 2, "in-flight carried over");
        assert_eq!(b.states()[a].load.sessions, 1, "sessions carried over");
        assert!(!b.states()[bb].healthy, "health set down stays down");
        assert!(b.member_index("c").is_none());
    });
    let seen = picked(&r, 300);
    assert!(!seen.contains("c"), "a removed member is never picked: {seen:?}");
    assert!(!seen.contains("b"), "a member set down stays out: {seen:?}");
    // Requests that began on the old view end on the new one.
    old.end_request(0, rondo_core::Outcome::Success { latency: Duration::from_millis(1) });
    let a = new.with(|b| b.member_index("a").unwrap());
    assert_eq!(new.with(|b| b.states()[a].load.in_flight), 1);
}

#[tokio::test]
async fn listener_changes_are_not_applied_but_do_not_fail_the_reload() {
    let dir = TempDir::new();
    let r = start(&dir, &config("127.0.0.1:0", &["a"]));
    // Port 9: no member's (a member at a listener's address is a config error).
    std::fs::write(r.path(), config("127.0.0.1:9", &["a", "b"])).unwrap();
    let new = Fixed::of(&rondo_config::load_file(r.path(), 9).unwrap());
    assert_eq!(r.fixed.changed(&new), ["listener web"]);
    let mut renamed = new.clone();
    renamed.listeners[0].name = "api".into();
    assert_eq!(r.fixed.changed(&renamed), ["listener web (removed)", "listener api (added)"]);
    // `[log]` and an access log are bound at start too.
    let mut logged = Fixed::of(&rondo_config::load_file(r.path(), 9).unwrap());
    logged.listeners[0].listen = r.fixed.listeners[0].listen;
    logged.log.format = rondo_config::LogFormat::Json;
    assert_eq!(r.fixed.changed(&logged), ["[log]"]);
    logged.listeners[0].access_log = Some(rondo_config::AccessLogSpec {
        target: rondo_config::AccessLogTarget::Stdout,
        format: rondo_config::LogFormat::Text,
        fields: None,
        template: None,
    });
    assert_eq!(r.fixed.changed(&logged), ["listener web", "[log]"]);
    assert_eq!(r.reload("test").expect("applied"), 2);
    assert_eq!(names(&r), ["a", "b"]);
}

#[tokio::test]
async fn the_watcher_reloads_after_a_save_by_rename() {
    let dir = TempDir::new();
    let r = start(&dir, &config("127.0.0.1:0", &["a"]));
    let watcher = watch_file(r.clone(), Duration::from_millis(20), Duration::from_millis(40));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tmp = dir.0.join(".rondo.toml.swp");
    std::fs::write(&tmp, config("127.0.0.1:0", &["a", "b"])).unwrap();
    std::fs::rename(&tmp, r.path()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while r.views().load().view.id < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no reload after the rename");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(names(&r), ["a", "b"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r.views().load().view.id, 2, "one reload per change");
    watcher.abort();
}

#[tokio::test]
async fn the_watcher_reloads_when_an_included_file_changes_or_appears() {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.0.join("conf.d")).unwrap();
    let text = config("127.0.0.1:0", &["a"]);
    // The cluster lives in an included file; the main file only includes it.
    let (main, cluster) = text.split_at(text.find("[cluster.c]").unwrap());
    let included = dir.0.join("conf.d/c.toml");
    std::fs::write(&included, cluster).unwrap();
    let r = start(&dir, &format!("include = [\"conf.d/*.toml\"]\n{main}"));
    assert_eq!(names(&r), ["a"]);
    let watcher = watch_file(r.clone(), Duration::from_millis(20), Duration::from_millis(40));
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::write(
        &included,
        cluster.replace(
            "\"a\", address = \"127.0.0.1:1\" }",
            "\"a\", address = \"127.0.0.1:1\" }, { name = \"b\", address = \"127.0.0.1:2\" }",
        ),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while r.views().load().view.id < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload after the included file changed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(names(&r), ["a", "b"]);
    // A new file in the directory is a change too.
    std::fs::write(
        dir.0.join("conf.d/d.toml"),
        "[cluster.d]\nmembers = [{ name = \"x\", address = \"127.0.0.1:3\" }]\n",
    )
    .unwrap();
    while r.views().load().view.id < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no reload after a file was added");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(r.views().load().view.clusters.contains_key("d"));
    watcher.abort();
}

/// A reload that makes a member shared (`[member.NAME]` listed by two clusters) attaches both
/// clusters' runtimes to its one state, keeps its drain (state by name), and a `[tier]`
/// change is reported as needing a restart.
#[tokio::test]
async fn a_reload_shares_a_member_and_keeps_its_state() {
    let dir = TempDir::new();
    let r = start(&dir, &config("127.0.0.1:0", &["a", "b"]));
    let snap = r.views().load();
    snap.clusters["c"].set_admin(0, rondo_core::AdminState::Draining, Actor::Operator("t".into()));
    let shared = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [[route]]\nname = \"other\"\nlistener = \"web\"\nmatch = { path_prefix = \"/d\" }\ncluster = \"d\"\n\n\
         [member.a]\naddress = \"127.0.0.1:1\"\n\n\
         [cluster.c]\nalgorithm = \"least-sessions\"\nmembers = [\"a\", { name = \"b\", address = \"127.0.0.1:2\" }]\n\n\
         [cluster.d]\nmembers = [\"a\"]\n";
    std::fs::write(r.path(), shared).unwrap();
    r.reload("test").expect("applied");
    let snap = r.views().load();
    let (c, d) = (&snap.clusters["c"], &snap.clusters["d"]);
    assert!(c.shared_member(0).is_some() && d.shared_member(0).is_some());
    assert!(c.shared_member(1).is_none());
    assert!(Arc::ptr_eq(c.shared_member(0).unwrap(), d.shared_member(0).unwrap()), "one state");
    assert_eq!(c.with(|b| b.states()[0].admin), rondo_core::AdminState::Draining);
    assert_eq!(r.views().shared_members().clusters_of("a"), ["c", "d"]);
    let mut tiered = Fixed::of(&rondo_config::load_file(r.path(), 9).unwrap());
    tiered.listeners = r.fixed.listeners.clone();
    tiered.tier = Some(rondo_config::TierSpec {
        nats: "nats://127.0.0.1:4222".into(),
        subject: "rondo.tier.default.load".into(),
        interval: std::time::Duration::from_millis(100),
    });
    assert_eq!(r.fixed.changed(&tiered), ["[tier]"]);
}
