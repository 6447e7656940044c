//! The etcd registry against a real etcd (`/usr/bin/etcd`): two registries on one etcd play two
//! routers of a tier. Run with `cargo test -p rondo-naming --features etcd --test etcd`.

#![cfg(feature = "etcd")]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rondo_core::{AdminState, MemberSpec};
use rondo_naming::etcd::EtcdRegistry;
use rondo_naming::{Registration, RegistryError};
use rondo_runtime::Live;
use support::{Etcd, Proxy, wait_for};

/// Each router's own configuration: cluster `app` with one configured member.
const ROUTER: &str = r#"
[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "app"

[cluster.app]
members = [{ name = "a1", address = "127.0.0.1:9001" }]
"#;

/// A shared configuration: clusters `app` and `extra`.
const SHARED: &str = r#"
[[listener]]
name = "web"
listen = "127.0.0.1:8080"

[[route]]
listener = "web"
cluster = "app"

[[route]]
listener = "web"
cluster = "extra"

[cluster.app]
members = [{ name = "s1", address = "127.0.0.1:9101" }]

[cluster.extra]
members = [{ name = "x1", address = "127.0.0.1:9201" }]
"#;

/// Generous limit for anything that should take well under a second or two.
const LIMIT: Duration = Duration::from_secs(5);

fn live() -> Arc<Live> {
    let config = rondo_config::parse_str(ROUTER, Path::new("router.toml"), 1).expect("valid");
    Arc::new(Live::new(config.view, None))
}

fn prefix() -> String {
    "/rondo".to_owned()
}

/// One router: its live state and its etcd registry.
struct Router {
    live: Arc<Live>,
    reg: Arc<EtcdRegistry>,
}

impl Router {
    fn start(endpoint: &str) -> Router {
        let live = live();
        let reg = EtcdRegistry::start(
            vec![endpoint.to_owned()],
            prefix(),
            &rondo_naming::NamingParts::of(&live),
        );
        Router { live, reg }
    }

    /// The member names of `cluster` in the view in effect (empty if no such cluster).
    fn members(&self, cluster: &str) -> Vec<String> {
        let snap = self.live.load();
        snap.view
            .clusters
            .get(cluster)
            .map(|c| c.members.iter().map(|m| m.name.clone()).collect())
            .unwrap_or_default()
    }

    fn address_of(&self, cluster: &str, member: &str) -> Option<String> {
        let snap = self.live.load();
        let c = snap.view.clusters.get(cluster)?;
        c.members.iter().find(|m| m.name == member).map(|m| m.address.clone())
    }

    fn has(&self, cluster: &str, member: &str) -> bool {
        self.members(cluster).iter().any(|m| m == member)
    }

    fn connected(&self) -> bool {
        self.reg.status().connected
    }

    async fn wait_connected(&self) -> Duration {
        wait_for("the registry to connect", LIMIT, || self.connected()).await
    }
}

fn registration(cluster: &str, name: &str, port: u16, ttl: Duration) -> Registration {
    Registration {
        cluster: cluster.to_owned(),
        member: MemberSpec {
            name: name.to_owned(),
            address: format!("127.0.0.1:{port}"),
            weight: 100,
            group: None,
            admin: AdminState::Active,
        },
        ttl,
        policy: rondo_naming::registry::PolicyClaim::Configured,
    }
}

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_registered_through_one_router_appears_in_the_other() {
    let etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    let b = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    b.wait_connected().await;
    let st = a.reg.status();
    assert_eq!(st.backend, "etcd");
    assert!(st.detail.contains(&etcd.endpoint()) && st.detail.contains("/rondo"), "{st:?}");
    assert_eq!(a.live.metrics.registry_connected.get(), 1);

    let t0 = Instant::now();
    let lease = a.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    let answered = t0.elapsed();
    assert!(lease.lease.parse::<i64>().is_ok_and(|l| l > 0), "{lease:?}");
    assert_eq!(lease.ttl_ms, 30_000);
    wait_for("r1 on router b", LIMIT, || b.has("app", "r1")).await;
    let t_b = t0.elapsed();
    wait_for("r1 on router a", LIMIT, || a.has("app", "r1")).await;
    eprintln!("register: answered after {answered:?}, in b's view {t_b:?} after the call");
    assert!(t_b < Duration::from_secs(1), "router b saw r1 after {t_b:?}");
    assert!(b.live.load().is_registered("app", "r1"));
    assert_eq!(b.reg.status().registrations, 1);
    assert_eq!(b.live.metrics.registrations.get(), 1);
    // Configured members stay.
    assert!(a.has("app", "a1") && b.has("app", "a1"));

    // Re-registering replaces the address; the old lease is revoked.
    let again = b.reg.register(registration("app", "r1", 8002, TTL)).await.expect("again");
    assert_ne!(again.lease, lease.lease);
    wait_for("r1's new address on a", LIMIT, || {
        a.address_of("app", "r1").as_deref() == Some("127.0.0.1:8002")
    })
    .await;
    assert!(matches!(a.reg.keepalive(&lease.lease).await, Err(RegistryError::NotFound(_))));
    assert_eq!(a.reg.status().registrations, 1);

    // A registration for a cluster the view does not have is kept but not shown.
    a.reg.register(registration("nowhere", "n1", 8003, TTL)).await.expect("registered");
    wait_for("n1 counted on b", LIMIT, || b.reg.status().registrations == 2).await;
    assert!(b.members("nowhere").is_empty());

    // Deregistering through the other router removes it from both.
    let t0 = Instant::now();
    b.reg.deregister("app", "r1").await.expect("deregistered");
    wait_for("r1 gone from a", LIMIT, || !a.has("app", "r1")).await;
    let t_a = t0.elapsed();
    wait_for("r1 gone from b", LIMIT, || !b.has("app", "r1")).await;
    eprintln!("deregister: gone from a's view {t_a:?} after the call");
    assert!(t_a < Duration::from_secs(1));
    match a.reg.deregister("app", "r1").await {
        Err(RegistryError::NotFound(m)) => assert!(m.contains("r1") && m.contains("app"), "{m}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        a.reg.register(registration("a/b", "r", 1, TTL)).await,
        Err(RegistryError::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lapse_everywhere_unless_kept_alive_through_any_router() {
    let etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    let b = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    b.wait_connected().await;
    let one = Duration::from_secs(1);

    // No keepalive: gone from both soon after its 1 s TTL.
    let lease = a.reg.register(registration("app", "short", 8001, one)).await.expect("registered");
    assert_eq!(lease.ttl_ms, 1000);
    let registered = Instant::now();
    wait_for("short on b", LIMIT, || b.has("app", "short")).await;
    wait_for("short gone from a", LIMIT, || !a.has("app", "short")).await;
    wait_for("short gone from b", LIMIT, || !b.has("app", "short")).await;
    eprintln!("1 s lease lapsed and removed everywhere after {:?}", registered.elapsed());
    match b.reg.keepalive(&lease.lease).await {
        Err(RegistryError::NotFound(m)) => {
            assert_eq!(m, format!("no lease `{}` (it lapsed or was never granted)", lease.lease))
        }
        other => panic!("expected NotFound, got {other:?}"),
    }

    // Kept alive through the other router: survives several TTLs.
    let lease = a.reg.register(registration("app", "kept", 8002, one)).await.expect("registered");
    wait_for("kept on b", LIMIT, || b.has("app", "kept")).await;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let renewed = b.reg.keepalive(&lease.lease).await.expect("kept alive");
        assert_eq!(renewed, lease);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(a.has("app", "kept") && b.has("app", "kept"), "kept lapsed while kept alive");
    }
    // Then left alone, it lapses.
    wait_for("kept gone from a", LIMIT, || !a.has("app", "kept")).await;
    wait_for("kept gone from b", LIMIT, || !b.has("app", "kept")).await;

    assert!(matches!(b.reg.keepalive("abc").await, Err(RegistryError::Invalid(_))));
    assert!(matches!(b.reg.keepalive("-3").await, Err(RegistryError::Invalid(_))));
    assert!(matches!(b.reg.keepalive("12345").await, Err(RegistryError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_config_put_through_one_router_changes_both() {
    let etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    let b = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    b.wait_connected().await;
    a.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    wait_for("r1 on b", LIMIT, || b.has("app", "r1")).await;

    let t0 = Instant::now();
    a.reg.put_config(SHARED.to_owned()).await.expect("stored");
    wait_for("extra on b", LIMIT, || b.has("extra", "x1")).await;
    let t_b = t0.elapsed();
    wait_for("extra on a", LIMIT, || a.has("extra", "x1")).await;
    eprintln!("shared config: in b's view {t_b:?} after the call");
    assert!(t_b < Duration::from_secs(1));
    // The shared configuration replaces the file's; registered members stay appended.
    for r in [&a, &b] {
        assert_eq!(r.members("app"), ["s1", "r1"]);
    }

    // An invalid configuration is refused with line, column and field; nothing changes.
    let view_a = a.live.load().view.id;
    let bad = SHARED.replace("127.0.0.1:9201\" }", "127.0.0.1:9201\", weight = 0 }");
    match b.reg.put_config(bad.clone()).await {
        Err(RegistryError::Invalid(m)) => {
            assert!(m.starts_with("etcd:/rondo/config:18:"), "{m}");
            assert!(m.contains("field `cluster.extra.members[0].weight`"), "{m}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.live.load().view.id, view_a);
    assert!(a.has("extra", "x1") && b.has("extra", "x1"));

    // An invalid configuration written to etcd directly is rejected by every router, which
    // keep the last good one and report why.
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("client");
    raw.put("/rondo/config", bad, None).await.expect("put");
    wait_for("the rejection on b", LIMIT, || b.reg.status().last_error.is_some()).await;
    let err = b.reg.status().last_error.unwrap();
    assert!(err.contains("etcd:/rondo/config:18:") && err.contains("weight"), "{err}");
    assert!(b.has("extra", "x1"));

    // Removing the key goes back to each router's own configuration.
    raw.delete("/rondo/config", None).await.expect("delete");
    wait_for("extra gone from a", LIMIT, || a.members("extra").is_empty()).await;
    wait_for("extra gone from b", LIMIT, || b.members("extra").is_empty()).await;
    assert_eq!(a.members("app"), ["a1", "r1"]);
    assert_eq!(b.reg.status().last_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_etcd_keeps_the_view_and_a_restarted_one_converges() {
    let mut etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    let b = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    b.wait_connected().await;
    a.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    // Both routers learn it through their watches (the registering one too): both must have it
    // before etcd goes, or the check below would test the watch's speed, not static stability.
    wait_for("r1 on a", LIMIT, || a.has("app", "r1")).await;
    wait_for("r1 on b", LIMIT, || b.has("app", "r1")).await;
    let resyncs = a.reg.status().resyncs;

    etcd.kill();
    let t = wait_for("a disconnected", LIMIT, || !a.connected()).await;
    wait_for("b disconnected", LIMIT, || !b.connected()).await;
    eprintln!("kill -9 noticed after {t:?}");
    let st = a.reg.status();
    assert!(st.last_error.as_deref().is_some_and(|e| e.contains(&etcd.endpoint())), "{st:?}");
    assert_eq!(a.live.metrics.registry_connected.get(), 0);
    // Static stability: the registered member stays while etcd is gone.
    assert!(a.has("app", "r1") && b.has("app", "r1"));
    assert_eq!(a.reg.status().registrations, 1);

    let started = Instant::now();
    match a.reg.register(registration("app", "r2", 8002, TTL)).await {
        Err(RegistryError::Unavailable(m)) => assert!(m.contains(&etcd.endpoint()), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    eprintln!("register while etcd is down answered after {:?}", started.elapsed());
    assert!(matches!(b.reg.keepalive("1").await, Err(RegistryError::Unavailable(_))));
    assert!(matches!(b.reg.put_config(SHARED.into()).await, Err(RegistryError::Unavailable(_))));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(a.has("app", "r1") && b.has("app", "r1"), "the view was kept");

    // Restart, and change things at once through a third router (before a and b are back).
    // (Waiting for etcd blocks this thread; the registries run on the other worker.)
    tokio::task::block_in_place(|| etcd.restart());
    let restarted = Instant::now();
    let c = Router::start(&etcd.endpoint());
    c.reg.register(registration("app", "r3", 8003, TTL)).await.expect("registered via c");
    c.reg.deregister("app", "r1").await.expect("deregistered via c");
    let t_a = wait_for("r3 on a", LIMIT, || a.has("app", "r3") && !a.has("app", "r1")).await;
    let t_b = wait_for("r3 on b", LIMIT, || b.has("app", "r3") && !b.has("app", "r1")).await;
    eprintln!(
        "after restart converged: a {t_a:?}, b {t_b:?} ({:?} since restart)",
        restarted.elapsed()
    );
    assert!(a.connected() && b.connected());
    assert!(a.reg.status().resyncs > resyncs);
    assert_eq!(a.live.metrics.registry_connected.get(), 1);
    assert_eq!(a.reg.status().last_error, None);
    // And the API works again through a.
    a.reg.register(registration("app", "r4", 8004, TTL)).await.expect("registered via a");
    wait_for("r4 on b", LIMIT, || b.has("app", "r4")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_etcd_is_noticed_and_a_continued_one_converges() {
    let mut etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    a.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    wait_for("r1 on a", LIMIT, || a.has("app", "r1")).await;
    let resyncs = a.reg.status().resyncs;

    etcd.pause();
    let t = wait_for("a disconnected", LIMIT, || !a.connected()).await;
    eprintln!("SIGSTOP noticed after {t:?}");
    assert_eq!(a.live.metrics.registry_connected.get(), 0);
    assert!(a.has("app", "r1"));
    let started = Instant::now();
    assert!(matches!(
        a.reg.register(registration("app", "r2", 8002, TTL)).await,
        Err(RegistryError::Unavailable(_))
    ));
    let took = started.elapsed();
    eprintln!("register while etcd is stopped answered after {took:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(a.has("app", "r1"));

    etcd.resume();
    let t = wait_for("a reconnected", LIMIT, || a.connected()).await;
    eprintln!("SIGCONT: reconnected after {t:?}");
    assert!(a.reg.status().resyncs > resyncs);
    a.reg.register(registration("app", "r2", 8002, TTL)).await.expect("registered");
    wait_for("r2 on a", LIMIT, || a.has("app", "r2")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_router_keeps_its_view_and_catches_up_after_healing() {
    let etcd = Etcd::start();
    let proxy = Proxy::start(&etcd.endpoint());
    let a = Router::start(&proxy.endpoint());
    let b = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    b.wait_connected().await;
    b.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    wait_for("r1 on a", LIMIT, || a.has("app", "r1")).await;
    let resyncs = a.reg.status().resyncs;

    // Cut a off silently; meanwhile the tier changes, and etcd compacts its history past the
    // revision a's watch stood at.
    proxy.pause();
    let cut = Instant::now();
    b.reg.register(registration("app", "r2", 8002, TTL)).await.expect("registered");
    b.reg.deregister("app", "r1").await.expect("deregistered");
    b.reg.put_config(SHARED.into()).await.expect("stored");
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("client");
    for i in 0..50 {
        raw.put(format!("/rondo/other/{i}"), "x", None).await.expect("put");
    }
    let rev = raw.get("/rondo/", None).await.expect("get").header().unwrap().revision();
    raw.compact(rev, Some(etcd_client::CompactionOptions::new().with_physical()))
        .await
        .expect("compacted");
    wait_for("b to see the change", LIMIT, || b.has("app", "r2") && b.has("extra", "x1")).await;

    let t = wait_for("a disconnected", LIMIT, || !a.connected()).await;
    eprintln!("silent partition noticed after {:?} (waited {t:?})", cut.elapsed());
    assert!(a.has("app", "r1") && !a.has("app", "r2"), "a kept its last view");
    assert!(matches!(
        a.reg.register(registration("app", "r3", 8003, TTL)).await,
        Err(RegistryError::Unavailable(_))
    ));

    proxy.resume();
    let t = wait_for("a to catch up", LIMIT, || {
        a.has("app", "r2") && !a.has("app", "r1") && a.has("extra", "x1")
    })
    .await;
    eprintln!("partition healed: a converged after {t:?}");
    assert!(a.connected());
    assert!(a.reg.status().resyncs > resyncs, "{:?}", a.reg.status());
    assert_eq!(a.live.metrics.registry_resyncs.get(), a.reg.status().resyncs);

    // The watch works after the compaction: a later change still arrives at once.
    let t0 = Instant::now();
    b.reg.register(registration("app", "r4", 8004, TTL)).await.expect("registered");
    wait_for("r4 on a", LIMIT, || a.has("app", "r4")).await;
    let t = t0.elapsed();
    eprintln!("after healing: a change through b reached a {t:?} after the call");
    assert!(t < Duration::from_secs(1));
}

/// A watch that starts behind a compaction is cancelled by etcd; the registry reads everything
/// again (a full resync, without counting as an outage) and picks up what it missed.
///
/// A slow link (300 ms each way) opens the window: the registry's first read has been answered
/// (its resync count is 1) but its watch request, starting just after that read's revision,
/// takes another 300 ms to reach etcd. Within that window another router changes a member and
/// etcd compacts past the read's revision, so the watch is created on a compacted revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_a_compaction_is_resynchronised() {
    let etcd = Etcd::start();
    let b = Router::start(&etcd.endpoint());
    b.wait_connected().await;
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("client");
    raw.put("/rondo/other/seed", "x", None).await.expect("put");

    let proxy = Proxy::with_delay(&etcd.endpoint(), Duration::from_millis(300));
    let a = Router::start(&proxy.endpoint());
    wait_for("a's first read", LIMIT, || a.reg.status().resyncs >= 1).await;
    assert!(a.connected());
    assert!(!a.has("app", "r1"));

    // Inside the window: a change, then a compaction past the revision a read.
    let started = Instant::now();
    b.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    let rev =
        raw.put("/rondo/other/seed", "y", None).await.expect("put").header().unwrap().revision();
    raw.compact(rev, Some(etcd_client::CompactionOptions::new().with_physical()))
        .await
        .expect("compacted");
    assert!(started.elapsed() < Duration::from_millis(200), "too slow: {:?}", started.elapsed());

    let mut stayed_connected = true;
    let t = wait_for("r1 on a after the resync", LIMIT, || {
        stayed_connected &= a.connected();
        a.has("app", "r1")
    })
    .await;
    eprintln!("compacted watch: resynchronised and converged after {t:?} (over a 600 ms RTT link)");
    let st = a.reg.status();
    assert!(st.resyncs >= 2, "{st:?}");
    assert!(stayed_connected, "a compacted watch is not an outage");
    assert_eq!(a.live.metrics.registry_resyncs.get(), st.resyncs);
    assert_eq!(st.last_error, None);

    // And the new watch delivers changes.
    b.reg.deregister("app", "r1").await.expect("deregistered");
    wait_for("r1 gone from a", LIMIT, || !a.has("app", "r1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_without_etcd_neither_fails_nor_blocks() {
    let port = support::free_port();
    let live = live();
    let started = Instant::now();
    let reg = EtcdRegistry::start(
        vec![format!("127.0.0.1:{port}")],
        prefix(),
        &rondo_naming::NamingParts::of(&live),
    );
    assert!(started.elapsed() < Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = reg.status();
    assert!(!st.connected);
    assert!(st.last_error.is_some(), "{st:?}");
    // The file's view is untouched.
    assert_eq!(live.load().view.clusters["app"].members.len(), 1);
    assert!(matches!(
        reg.register(registration("app", "r1", 8001, TTL)).await,
        Err(RegistryError::Unavailable(_))
    ));
    reg.stop();
}

// Regression: a lease whose key was deleted behind the registry's back (or whose revoke failed
// after a re-registration) still answered keepalives, so its member never registered again and
// stayed invisible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_on_a_lease_without_its_key_is_not_found() {
    let etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    a.wait_connected().await;
    let lease = a.reg.register(registration("app", "r1", 8001, TTL)).await.expect("registered");
    wait_for("r1 registered", LIMIT, || a.has("app", "r1")).await;
    a.reg.keepalive(&lease.lease).await.expect("kept alive while its key exists");
    let mut c = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
    c.delete("/rondo/members/app/r1", None).await.expect("delete the key");
    wait_for("r1 gone", LIMIT, || !a.has("app", "r1")).await;
    match a.reg.keepalive(&lease.lease).await {
        Err(RegistryError::NotFound(m)) => assert!(m.contains(&lease.lease), "{m}"),
        other => panic!("keepalive on a keyless lease: {other:?}"),
    }
}

/// The caps hold against the tier's members as read from etcd: a registration through the
/// other router counts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caps_count_the_tiers_members() {
    let etcd = Etcd::start();
    let a = Router::start(&etcd.endpoint());
    let b = Router::start(&etcd.endpoint());
    a.reg.set_limits(rondo_naming::Limits { per_service: 2, total: 3 });
    a.wait_connected().await;
    b.wait_connected().await;
    b.reg.register(registration("app", "r1", 8001, TTL)).await.expect("r1");
    b.reg.register(registration("app", "r2", 8002, TTL)).await.expect("r2");
    wait_for("r1 and r2 on a", LIMIT, || a.has("app", "r1") && a.has("app", "r2")).await;
    match a.reg.register(registration("app", "r3", 8003, TTL)).await {
        Err(RegistryError::Full(m)) => {
            assert!(m.contains("`[naming] max_registrations_per_service` = 2"), "{m}")
        }
        other => panic!("want the per-service cap, got {other:?}"),
    }
    // Registering r2 again is no new member.
    a.reg.register(registration("app", "r2", 8004, TTL)).await.expect("r2 again");
    a.reg.register(registration("other", "o1", 8005, TTL)).await.expect("o1");
    wait_for("o1 counted on a", LIMIT, || a.reg.status().registrations == 3).await;
    match a.reg.register(registration("other", "o2", 8006, TTL)).await {
        Err(RegistryError::Full(m)) => {
            assert!(m.contains("`[naming] max_registrations` = 3"), "{m}")
        }
        other => panic!("want the total cap, got {other:?}"),
    }
}
