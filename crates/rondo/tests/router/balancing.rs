//! The distribution of every algorithm through the real router: real members on 127.0.0.1, a
//! router started from a config text, requests counted by the member name in each answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use http::header::SET_COOKIE;
use rondo::member::Member;

use super::support::{
    self, Killable, TestRouter, count, entry, get, get_with, member_list, members, members_of,
    one_cluster, router, served_by, served_name, served_name_with, spawn_member,
};

/// A router whose cluster `c` uses `algorithm` and has the rest of its body in `rest`.
async fn router_with(algorithm: &str, rest: &str) -> TestRouter {
    router(&one_cluster(&format!("algorithm = \"{algorithm}\"\n{rest}"))).await
}

/// The member names that served `n` sequential GETs through [`router_with`]`(algorithm, rest)`.
async fn served_with(algorithm: &str, rest: &str, n: usize) -> Vec<String> {
    let r = router_with(algorithm, rest).await;
    served_by(&r.url("web", "/"), n).await
}

/// Members `m1..m3` and a router over them whose cluster `c` uses `algorithm`, with other
/// cluster `keys`.
async fn over_three(algorithm: &str, keys: &str) -> (TestRouter, Vec<Member>) {
    let ms = members(3, Duration::ZERO).await;
    let r = router_with(algorithm, &format!("{keys}\n{}", member_list(&ms))).await;
    (r, ms)
}

/// The member names that served `n` sequential GETs through [`over_three`]`(algorithm, keys)`.
async fn served_by_three(algorithm: &str, keys: &str, n: usize) -> Vec<String> {
    let (r, _ms) = over_three(algorithm, keys).await;
    served_by(&r.url("web", "/"), n).await
}

/// How many requests `m1`, `m2` and `m3` served.
fn counts(names: &[String]) -> (usize, usize, usize) {
    (count(names, "m1"), count(names, "m2"), count(names, "m3"))
}

/// Each of `m1`, `m2` and `m3` served exactly `n` of `names`.
fn assert_each_served(names: &[String], n: usize) {
    for m in ["m1", "m2", "m3"] {
        assert_eq!(count(names, m), n, "{names:?}");
    }
}

/// The distinct names in `names`, sorted.
fn distinct(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names.dedup();
    names
}

/// The value of cookie `name` in the response's `Set-Cookie` headers.
fn set_cookie(r: &support::Reply, name: &str) -> Option<String> {
    r.headers.get_all(SET_COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        let first = v.split(';').next()?.trim();
        let (k, val) = first.split_once('=')?;
        (k == name).then(|| val.to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_takes_members_in_order() {
    let names = served_by_three("round-robin", "", 30).await;
    for (i, name) in names.iter().enumerate() {
        assert_eq!(name, &format!("m{}", i % 3 + 1), "request {i} in {names:?}");
    }
    assert_each_served(&names, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_spreads_over_every_member() {
    let names = served_by_three("random", "", 300).await;
    for m in ["m1", "m2", "m3"] {
        let n = count(&names, m);
        assert!((60..=140).contains(&n), "{m} served {n} of 300");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_follows_the_weights_exactly() {
    let ms = members(3, Duration::ZERO).await;
    let list = members_of([
        entry(&ms[0], "weight = 1"),
        entry(&ms[1], "weight = 2"),
        entry(&ms[2], "weight = 3"),
    ]);
    let names = served_with("weighted", &list, 60).await;
    assert_eq!(count(&names, "m1"), 10, "{names:?}");
    assert_eq!(count(&names, "m2"), 20, "{names:?}");
    assert_eq!(count(&names, "m3"), 30, "{names:?}");
    // Smooth: every cycle of 6 picks honours the weights, not just the whole run.
    for cycle in names.chunks(6) {
        assert_eq!(count(cycle, "m1"), 1, "{cycle:?} in {names:?}");
        assert_eq!(count(cycle, "m3"), 3, "{cycle:?} in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_rotates_per_request() {
    let names = served_by_three("rotating", "granularity = \"request\"", 30).await;
    assert_each_served(&names, 10);
    // Each request starts one further down the (once shuffled) list: no member twice in a row.
    for w in names.windows(2) {
        assert_ne!(w[0], w[1], "{names:?}");
    }
}

/// Waits (bounded) for a completed probe round that measured every member of cluster `c`.
async fn wait_for_a_ranked_round(r: &TestRouter) {
    let rt = r.live.load().clusters.get("c").expect("cluster c").clone();
    let ranked = |rt: &rondo_runtime::ClusterRt| {
        rt.with(|b| b.states().iter().all(|s| s.load.probe_rtt.is_some()))
    };
    let start = Instant::now();
    while !ranked(&rt) {
        assert!(start.elapsed() < Duration::from_secs(5), "no probe round completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_time_clb_prefers_the_fastest_probe() {
    // HTTP probes include each member's delay: m2 is fastest, then m3, then m1.
    let ms =
        [spawn_member("m1", 80).await, spawn_member("m2", 0).await, spawn_member("m3", 30).await];
    let health = "health = { path = \"/health\", interval_ms = 50, timeout_ms = 2000, fall = 5 }";
    let r = router_with("response-time-clb", &format!("{}\n{health}", member_list(&ms))).await;
    wait_for_a_ranked_round(&r).await;

    // A probe round re-ranks the table and restarts it at the top: after a quiet spell longer
    // than a round, the next request goes to the fastest member.
    let c = support::client();
    let url = r.url("web", "/");
    let mut names = Vec::new();
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let name = served_name(&c, &url).await;
        assert_eq!(name, "m2", "first request after quiet spell {i}");
        names.push(name);
    }

    // Within each table cycle the order is fastest first (m2, m3, m1); probe rounds restart it
    // at any time, so over a run that starts at the top the counts are ordered fastest to
    // slowest.
    names.extend(served_by(&url, 15).await);
    let (n1, n2, n3) = counts(&names);
    assert!(n2 >= n3 && n3 >= n1, "m1 {n1}, m2 {n2}, m3 {n3}: {names:?}");
    assert!(n2 > n1, "m1 {n1}, m2 {n2}, m3 {n3}: {names:?}");
    for w in names.windows(2) {
        let next = match w[0].as_str() {
            "m2" => ["m3", "m2"],
            "m3" => ["m1", "m2"],
            _ => ["m2", "m2"],
        };
        assert!(next.contains(&w[1].as_str()), "{} after {}: {names:?}", w[1], w[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_time_gives_a_slow_probe_a_small_share() {
    // HTTP probes include each member's delay: m1's take 150 ms, the others' well under 1 ms.
    let ms =
        [spawn_member("m1", 150).await, spawn_member("m2", 0).await, spawn_member("m3", 0).await];
    let health = "health = { path = \"/health\", interval_ms = 50, timeout_ms = 2000, fall = 5 }";
    let r = router_with("response-time", &format!("{}\n{health}", member_list(&ms))).await;
    wait_for_a_ranked_round(&r).await;

    // CLB would deal a third of these to m1 (every round's table walk reaches it); shares by
    // round trip give it a few hundredths of a share at most, so the fast two take them all
    // but a rare one.
    let names = served_by(&r.url("web", "/"), 30).await;
    let (n1, n2, n3) = counts(&names);
    assert!(n1 <= 2, "m1 {n1}, m2 {n2}, m3 {n3}: {names:?}");
    assert!(n2 >= 9 && n3 >= 9, "m1 {n1}, m2 {n2}, m3 {n3}: {names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_sessions_avoids_the_slow_member() {
    let ms =
        [spawn_member("m1", 300).await, spawn_member("m2", 0).await, spawn_member("m3", 0).await];
    let r = router_with("least-sessions", &member_list(&ms)).await;

    // 30 requests taken from one pool by 6 concurrent clients: whoever is free takes the next.
    const TOTAL: usize = 30;
    const CLIENTS: usize = 6;
    let next = Arc::new(AtomicUsize::new(0));
    let url = r.url("web", "/");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (next, url) = (next.clone(), url.clone());
        tasks.spawn(async move {
            let c = support::client();
            let mut names = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < TOTAL {
                names.push(served_name(&c, &url).await);
            }
            names
        });
    }
    let mut names = Vec::new();
    let all = async {
        while let Some(done) = tasks.join_next().await {
            names.extend(done.expect("client task"));
        }
    };
    tokio::time::timeout(Duration::from_secs(20), all).await.expect("load run finishes");
    assert_eq!(names.len(), TOTAL);
    let (n1, n2, n3) = counts(&names);
    assert!(n1 < n2 && n1 < n3, "slow m1 {n1}, m2 {n2}, m3 {n3}");
}

async fn agent_algorithm_falls_back(algorithm: &str) {
    let names = served_by_three(algorithm, "", 30).await;
    for m in ["m1", "m2", "m3"] {
        // Without reports this is least-sessions: sequential traffic goes round the members.
        assert!(count(&names, m) >= 5, "{algorithm}: {m} in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_cpu_without_agents_falls_back_to_least_sessions() {
    agent_algorithm_falls_back("least-cpu").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_free_memory_without_agents_falls_back_to_least_sessions() {
    agent_algorithm_falls_back("most-free-memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_ewma_shuns_the_slow_member() {
    let ms =
        [spawn_member("m1", 100).await, spawn_member("m2", 0).await, spawn_member("m3", 0).await];
    let names = served_with("p2c-ewma", &member_list(&ms), 60).await;
    let (n1, n2, n3) = counts(&names);
    // Uniform choice would give the slow member about 20.
    assert!(n1 <= 10, "slow m1 {n1}, m2 {n2}, m3 {n3}");
    assert!(n2 > 0 && n3 > 0, "slow m1 {n1}, m2 {n2}, m3 {n3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_shuns_the_slow_member() {
    let ms =
        [spawn_member("m1", 100).await, spawn_member("m2", 0).await, spawn_member("m3", 0).await];
    let names = served_with("adaptive", &member_list(&ms), 60).await;
    let (n1, n2, n3) = counts(&names);
    // Round robin would give the slow member 20. Sequential requests (one in flight) go to the
    // member with the lowest measured latency; a member not yet measured keeps the default
    // estimate until an exploration pick measures it, so m2 and m3 need not share evenly.
    assert!(n1 <= 10, "slow m1 {n1}, m2 {n2}, m3 {n3}");
    assert!(n2 + n3 >= 50, "slow m1 {n1}, m2 {n2}, m3 {n3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_on_a_header_keeps_each_key_on_one_member() {
    let (r, _ms) = over_three("hash", "hash = { key = \"header:x-user\" }").await;
    let c = support::client();
    let url = r.url("web", "/");
    let mut homes = Vec::new();
    for user in ["alice", "bob", "carol", "dave", "erin"] {
        let mut seen = Vec::new();
        for _ in 0..20 {
            seen.push(served_name_with(&c, &url, &[("x-user", user)]).await);
        }
        assert!(seen.iter().all(|s| *s == seen[0]), "user {user} moved: {seen:?}");
        homes.push(seen[0].clone());
    }
    let homes = distinct(homes);
    assert!(homes.len() > 1, "every user on {homes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_on_the_client_address_keeps_a_client_on_one_member() {
    let names = served_by_three("hash", "hash = { key = \"client-address\" }", 30).await;
    assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_cookie_session_keeps_its_member_and_moves_when_it_dies() {
    let mut ms: Vec<Killable> = ["m1", "m2", "m3"].iter().map(|n| Killable::spawn(n)).collect();
    let list = members_of(ms.iter().map(|m| support::member_entry(&m.name, m.addr, "")));
    let r = router_with("round-robin", &format!("granularity = \"session\"\n{list}")).await;
    let c = support::client();
    let url = r.url("web", "/");
    let with_cookie = async |token: &str| {
        get_with(&c, &url, &[("cookie", &format!("rondo-member={token}"))]).await
    };

    let first = get(&c, &url).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let token = set_cookie(&first, "rondo-member").expect("first response sets rondo-member");
    let home = first.body.trim().to_owned();
    // The token is opaque: neither the member's name nor its address.
    assert!(!token.contains(&home) && !token.contains("127.0.0.1"), "token {token}");
    for i in 0..10 {
        let reply = with_cookie(&token).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body.trim(), home, "request {i} with the cookie");
        assert!(set_cookie(&reply, "rondo-member").is_none(), "cookie reset on request {i}");
    }

    // The session's member dies (listener and connections): the session moves.
    let victim = ms.iter_mut().find(|m| m.name == home).expect("home member");
    victim.kill().await;
    let moved = with_cookie(&token).await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.body);
    let new_home = moved.body.trim().to_owned();
    assert_ne!(new_home, home, "served by the dead member");
    let new_token = set_cookie(&moved, "rondo-member").expect("moved session gets a new cookie");
    assert_ne!(new_token, token);
    for i in 0..10 {
        let reply = with_cookie(&new_token).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body.trim(), new_home, "request {i} with the new cookie");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_header_session_keeps_its_member() {
    let session = "granularity = \"session\"\nsession = { header = \"x-session-id\" }";
    let (r, _ms) = over_three("round-robin", session).await;
    let c = support::client();
    let url = r.url("web", "/");
    let mut homes = Vec::new();
    for id in ["s1", "s2", "s3", "s4", "s5"] {
        let first = get_with(&c, &url, &[("x-session-id", id)]).await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.body);
        assert!(set_cookie(&first, "rondo-member").is_none(), "header sessions set no cookie");
        let home = first.body.trim().to_owned();
        for i in 0..5 {
            let reply = get_with(&c, &url, &[("x-session-id", id)]).await;
            assert_eq!(reply.body.trim(), home, "session {id}, request {i}");
        }
        homes.push(home);
    }
    let homes = distinct(homes);
    assert!(homes.len() > 1, "every session on {homes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_member_gets_no_requests() {
    let ms = members(3, Duration::ZERO).await;
    let list =
        members_of([entry(&ms[0], ""), entry(&ms[1], "state = \"draining\""), entry(&ms[2], "")]);
    let names = served_with("round-robin", &list, 30).await;
    assert_eq!(count(&names, "m2"), 0, "{names:?}");
    assert_eq!(count(&names, "m1"), 15, "{names:?}");
    assert_eq!(count(&names, "m3"), 15, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_cluster_serves_when_the_primary_cannot() {
    let bs = [spawn_member("b1", 0).await, spawn_member("b2", 0).await];
    let config = support::web_config("", "backups = [\"b\"]", &support::dead_members("a", 2))
        + &support::cluster_table("b", &member_list(&bs));
    let r = router(&config).await;
    let names = served_by(&r.url("web", "/"), 10).await;
    assert_eq!(count(&names, "b1") + count(&names, "b2"), 10, "{names:?}");
    assert!(count(&names, "b1") > 0 && count(&names, "b2") > 0, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locality_prefers_the_local_group_and_spills_when_it_is_down() {
    let east = spawn_member("e1", 0).await;
    let west1 = spawn_member("w1", 0).await;
    let west2 = spawn_member("w2", 0).await;
    let cluster = format!(
        "algorithm = \"round-robin\"\n{}\nhealth = {{ interval_ms = 50, fall = 1, rise = 1 }}",
        members_of([
            entry(&west1, "group = \"west\""),
            entry(&east, "group = \"east\""),
            entry(&west2, "group = \"west\""),
        ])
    );
    let r = router(&format!("[router]\ngroup = \"east\"\n{}", one_cluster(&cluster))).await;
    let url = r.url("web", "/");
    let names = served_by(&url, 20).await;
    assert_eq!(count(&names, "e1"), 20, "{names:?}");

    east.stop();
    drop(east);
    // The next probe round takes e1 down; from then on requests spill to the west.
    let spilled =
        |reply: &support::Reply| reply.status == StatusCode::OK && reply.body.trim() != "e1";
    support::get_until(&support::client(), &url, spilled, "no spill").await;
    let names = served_by(&url, 10).await;
    assert_eq!(count(&names, "w1") + count(&names, "w2"), 10, "{names:?}");
    assert!(count(&names, "w1") > 0 && count(&names, "w2") > 0, "{names:?}");
}
