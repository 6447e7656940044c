//! The embedded registry on disk (snapshot plus append-only log), in process with real files:
//! what a registration costs (bytes written, clusters rebuilt: counted, never timed), the log
//! folded into snapshots as it grows, a torn last record ignored and reported at start, a
//! corrupt record before the last one refused at start with the file and the offset, and a
//! failed compaction falling back to the log.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rondo_core::{AdminState, MemberSpec};
use rondo_naming::embedded::Embedded;
use rondo_naming::{Limits, Registration, StartError};
use rondo_runtime::Live;

const CONFIG: &str = r#"
[cluster.c]
members = [{ name = "m1", address = "127.0.0.1:9001" }]

[cluster.d]
members = [{ name = "d1", address = "127.0.0.1:9002" }]
"#;

fn live() -> Arc<Live> {
    let config = rondo_config::parse_str(CONFIG, Path::new("router.toml"), 1).expect("valid");
    Arc::new(Live::new(config.view, None))
}

fn limits() -> Limits {
    Limits { per_service: 100_000, total: 100_000 }
}

fn reg(name: &str, i: usize) -> Registration {
    Registration {
        cluster: "c".into(),
        member: MemberSpec {
            name: name.into(),
            address: format!("127.0.{}.{}:8080", 1 + i / 250, 1 + i % 250),
            weight: 100,
            group: None,
            admin: AdminState::Active,
        },
        ttl: Duration::from_secs(3600),
        policy: rondo_naming::registry::PolicyClaim::Configured,
    }
}

fn registered(live: &Live) -> Vec<String> {
    let snap = live.load();
    let mut names: Vec<String> =
        snap.registered.get("c").map_or_else(Vec::new, |s| s.iter().cloned().collect());
    names.sort();
    names
}

fn log_of(snapshot: &Path) -> PathBuf {
    let mut s = snapshot.as_os_str().to_owned();
    s.push(".log");
    PathBuf::from(s)
}

/// Stops a registry and waits until its writer thread is surely gone (it looks at the stop
/// flag at least every 100 ms), so that the next one owns the files.
async fn stop(r: Arc<Embedded>) {
    r.stop();
    drop(r);
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The cost of a registration does not grow with the registry: 600 registrations one at a time
/// (each its own batch, the worst case for group commit) write at most 1 KiB each on average
/// (the whole-snapshot writer wrote the whole file each time: ~45 KiB on average here, ~27 MB
/// in all), the log is folded into snapshots and stays bounded, and no registration rebuilds
/// the other cluster. All 600 come back after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_writes_a_flat_number_of_bytes_and_rebuilds_only_its_cluster() {
    const N: usize = 600;
    const COMPACT: u64 = 8 * 1024;
    let dir = support::temp_dir("embedded-flat");
    let file = dir.join("registry.json");
    let live1 = live();
    let d_before = live1.load().clusters["d"].clone();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live1),
        Some(file.clone()),
        limits(),
        COMPACT,
    )
    .unwrap();
    let metrics = live1.metrics.clone();
    let mut biggest_log = 0;
    for i in 0..N {
        r.register(reg(&format!("r{i}"), i)).await.expect("registered");
        let log = std::fs::metadata(log_of(&file)).map_or(0, |m| m.len());
        let snap = std::fs::metadata(&file).unwrap().len();
        // Folded once it holds as many bytes as the snapshot (at least COMPACT): bounded by
        // that plus one line.
        assert!(log <= COMPACT.max(snap) + 512, "log {log} bytes, snapshot {snap}");
        biggest_log = biggest_log.max(log);
    }
    let written = metrics.registry_bytes_written.get();
    let compactions = metrics.registry_compactions.get();
    eprintln!("{N} registrations: {written} bytes written, {compactions} compactions");
    assert!(written <= (N as u64) * 1024, "{written} bytes for {N} registrations");
    assert!(compactions >= 3, "{compactions} compactions");
    assert!(biggest_log >= COMPACT, "the log took the registrations: {biggest_log}");
    // Cluster `d` was never rebuilt: the same runtime, never retired.
    let d_after = live1.load().clusters["d"].clone();
    assert!(Arc::ptr_eq(&d_before, &d_after), "cluster d's runtime was rebuilt");
    assert!(!d_before.is_retired());
    assert_eq!(live1.load().view.clusters["c"].members.len(), N + 1);
    stop(r).await;

    let again = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&again),
        Some(file.clone()),
        limits(),
        COMPACT,
    )
    .unwrap();
    let mut want: Vec<String> = (0..N).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(registered(&again), want);
    stop(r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a registration into a big service composed that service's whole view before it
/// was answered, so registrations made one at a time cost O(service) each (~28 ms apiece at
/// 10,000 members in a release build, `rondo-registry --concurrency 1`). From
/// `DEFERRED_VIEW_MEMBERS` on, the view is composed after the answers, paced, and shared by
/// every registration that arrived meanwhile: far fewer views than registrations (counted by
/// view ids, not timed), and every registration visible soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_into_a_big_service_share_its_view_compositions() {
    use rondo_naming::embedded::DEFERRED_VIEW_MEMBERS;
    let n = DEFERRED_VIEW_MEMBERS * 3;
    let live = live();
    let r = Embedded::start_with(&rondo_naming::NamingParts::of(&live), None, limits(), 1 << 20)
        .unwrap();
    // Below the threshold: visible when answered, one view per registration made alone.
    for i in 0..DEFERRED_VIEW_MEMBERS - 2 {
        r.register(reg(&format!("r{i}"), i)).await.expect("registered");
    }
    let before = live.load().view.id;
    r.register(reg("r-last-small", DEFERRED_VIEW_MEMBERS - 2)).await.expect("registered");
    assert_eq!(live.load().view.id, before + 1, "a small service's view is composed at once");
    assert!(registered(&live).contains(&"r-last-small".to_owned()));
    // From the threshold on: the remaining registrations share a few compositions.
    let before = live.load().view.id;
    let past = n - (DEFERRED_VIEW_MEMBERS - 1);
    for i in DEFERRED_VIEW_MEMBERS - 1..n {
        r.register(reg(&format!("r{i}"), i)).await.expect("registered");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while registered(&live).len() < n {
        assert!(std::time::Instant::now() < deadline, "{} of {n} visible", registered(&live).len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let views = live.load().view.id - before;
    eprintln!("{past} registrations one at a time into a service of {n}: {views} views");
    assert!(views <= (past / 4) as u64, "{views} views for {past} registrations");
    assert_eq!(live.load().view.clusters["c"].members.len(), n + 1);
    r.stop();
}

/// Deregistrations go through the log too and survive a restart; so does a re-registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregistrations_and_re_registrations_are_replayed_from_the_log() {
    let dir = support::temp_dir("embedded-replay");
    let file = dir.join("registry.json");
    let live1 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live1),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .unwrap();
    for i in 0..5 {
        r.register(reg(&format!("r{i}"), i)).await.unwrap();
    }
    r.deregister("c", "r1").await.unwrap();
    let mut moved = reg("r2", 200);
    moved.member.weight = 7;
    r.register(moved).await.unwrap();
    // The first batch went to a snapshot, the rest to the log.
    let log = std::fs::read_to_string(log_of(&file)).unwrap();
    assert_eq!(log.lines().count(), 6, "{log}");
    assert!(log.contains(r#"{"del":{"cluster":"c","name":"r1"}}"#), "{log}");
    stop(r).await;

    let live2 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live2),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .unwrap();
    assert_eq!(registered(&live2), ["r0", "r2", "r3", "r4"]);
    let c = live2.load().view.clusters["c"].clone();
    let r2 = c.members.iter().find(|m| m.name == "r2").unwrap();
    assert_eq!((r2.weight, r2.address.as_str()), (7, "127.0.1.201:8080"));
    assert!(r.recovery().contains("6 batches replayed"), "{}", r.recovery());
    stop(r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A record cut short at the end of the log (a crash while it was written: never answered) is
/// ignored and reported with its offset; everything before it comes back, and the next write
/// leaves a log with no torn end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_record_is_ignored_and_reported() {
    let dir = support::temp_dir("embedded-torn");
    let file = dir.join("registry.json");
    let log = log_of(&file);
    let live1 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live1),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .unwrap();
    for i in 0..3 {
        r.register(reg(&format!("r{i}"), i)).await.unwrap();
    }
    stop(r).await;
    let whole = std::fs::read(&log).unwrap();
    let lines: Vec<&[u8]> = whole.split_inclusive(|&b| b == b'\n').collect();
    assert_eq!(lines.len(), 2, "r1 and r2 in the log");
    // A third line, cut in the middle, as a crash during its write leaves it.
    let mut torn = whole.clone();
    torn.extend_from_slice(&lines[1][..lines[1].len() / 2]);
    std::fs::write(&log, &torn).unwrap();

    let live2 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live2),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .unwrap();
    let note = format!(
        "naming log {}: torn last record at byte offset {} ({} bytes) ignored",
        log.display(),
        whole.len(),
        lines[1].len() / 2
    );
    assert!(r.recovery().contains(&note), "{}", r.recovery());
    assert_eq!(registered(&live2), ["r0", "r1", "r2"]);
    r.register(reg("r3", 3)).await.unwrap();
    stop(r).await;

    let live3 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live3),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .unwrap();
    assert!(!r.recovery().contains("torn"), "{}", r.recovery());
    assert_eq!(registered(&live3), ["r0", "r1", "r2", "r3"]);
    stop(r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A damaged record with another after it cannot come from a crash: the start is refused,
/// naming the log and the record's byte offset, and the files are left as they were. So is a
/// whole record (its checksum right) holding an entry the API would refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_before_the_last_stops_the_start_naming_file_and_offset() {
    let dir = support::temp_dir("embedded-corrupt");
    let file = dir.join("registry.json");
    let log = log_of(&file);
    let live1 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live1),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .unwrap();
    for i in 0..4 {
        r.register(reg(&format!("r{i}"), i)).await.unwrap();
    }
    stop(r).await;
    let whole = std::fs::read(&log).unwrap();
    let first = whole.iter().position(|&b| b == b'\n').unwrap() + 1;
    let snapshot = std::fs::read(&file).unwrap();

    // One byte of the second line flipped (an address digit), lines after it intact.
    let mut bad = whole.clone();
    let at = first + bad[first..].windows(7).position(|w| w == b"127.0.1").unwrap() + 4;
    bad[at] = b'9';
    std::fs::write(&log, &bad).unwrap();
    let live2 = live();
    let e = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live2),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .expect_err("a corrupt log is refused");
    assert!(
        matches!(&e, StartError::Log { path, offset, .. } if *path == log && *offset == first as u64),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(
        e.contains(&format!("naming log {}: record at byte offset {first}", log.display())),
        "{e}"
    );
    assert!(e.contains("checksum mismatch"), "{e}");
    assert_eq!(std::fs::read(&log).unwrap(), bad, "the log is left alone");
    assert_eq!(std::fs::read(&file).unwrap(), snapshot, "the snapshot is left alone");
    assert!(registered(&live2).is_empty(), "nothing was published");

    // A whole record whose entry the API refuses (weight 0), with its checksum right.
    let json = r#"{"seq":99,"changes":[{"put":{"cluster":"c","name":"w0","address":"127.0.0.2:80","weight":0,"group":null,"ttl_ms":10000,"lease":"5"}}]}"#;
    let mut with_bad_entry = whole.clone();
    with_bad_entry.extend_from_slice(format!("{:08x} {json}\n", crc32(json.as_bytes())).as_bytes());
    std::fs::write(&log, &with_bad_entry).unwrap();
    let e = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live()),
        Some(file.clone()),
        limits(),
        1 << 20,
    )
    .expect_err("an invalid entry is refused")
    .to_string();
    assert!(
        e.contains(&format!("naming log {}: record at byte offset {}", log.display(), whole.len())),
        "{e}"
    );
    assert!(e.contains("(`w0` in `c`): field `weight`: 0 is out of range"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// When a due compaction cannot write the snapshot, the batch still goes to the (sound) log and
/// is acknowledged; the error shows in the status until a later compaction succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_compaction_falls_back_to_the_log() {
    const COMPACT: u64 = 1024;
    let dir = support::temp_dir("embedded-compact-fail");
    let file = dir.join("registry.json");
    let live1 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live1),
        Some(file.clone()),
        limits(),
        COMPACT,
    )
    .unwrap();
    r.register(reg("r0", 0)).await.unwrap();
    // The log past the threshold (and past the snapshot's size).
    let mut i = 1;
    while std::fs::metadata(log_of(&file)).map_or(0, |m| m.len())
        < COMPACT.max(std::fs::metadata(&file).unwrap().len())
    {
        r.register(reg(&format!("r{i}"), i)).await.unwrap();
        i += 1;
    }
    let compactions = live1.metrics.registry_compactions.get();
    // The snapshot's temporary cannot be created (a directory has its name).
    let tmp = dir.join(format!("registry.tmp.{}", std::process::id()));
    std::fs::create_dir(&tmp).unwrap();
    r.register(reg("kept", 900)).await.expect("acknowledged through the log");
    assert_eq!(live1.metrics.registry_compactions.get(), compactions);
    let status = r.status();
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains("cannot write")), "{status:?}");
    assert!(std::fs::read_to_string(log_of(&file)).unwrap().contains("\"kept\""));
    std::fs::remove_dir(&tmp).unwrap();
    r.register(reg("after", 901)).await.unwrap();
    assert_eq!(live1.metrics.registry_compactions.get(), compactions + 1);
    assert_eq!(r.status().last_error, None);
    stop(r).await;

    let live2 = live();
    let r = Embedded::start_with(
        &rondo_naming::NamingParts::of(&live2),
        Some(file.clone()),
        limits(),
        COMPACT,
    )
    .unwrap();
    let names = registered(&live2);
    assert!(names.contains(&"kept".to_owned()) && names.contains(&"after".to_owned()));
    assert_eq!(names.len(), i + 2);
    stop(r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// CRC-32 (IEEE), as the log's lines carry it (to forge a line with a right checksum).
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}
