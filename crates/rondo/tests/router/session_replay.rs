//! Session replay (docs/router.md "Session replay"): the session's member is killed in the
//! middle of a 20-message session; the member that takes the session over receives the kept
//! messages in order, then the new one, and nothing is lost or reordered. Checkpoints shorten
//! what is replayed; past the limits the session fails over without replay and says so.
//! Members are [`Recorder`]s that log each request id they receive.

use http::StatusCode;

use super::filters::{Sent, send};
use super::recorder::Recorder;
use super::support::{self, TestRouter, cluster_table, listener_table, route_table};

/// A router with route `s` (`session_replay` = `replay`) to cluster `c` of `members`, sessions
/// by `session` (`header` or `cookie`).
async fn setup(members: &[&Recorder], replay: &str, session: &str) -> TestRouter {
    let entries: Vec<String> = members.iter().map(|m| m.entry()).collect();
    let session = if session == "header" { "session = { header = \"x-session\" }\n" } else { "" };
    let config = listener_table("web", "error_detail = \"full\"")
        + &route_table("s", "web", "c", &format!("session_replay = {replay}"))
        + &cluster_table(
            "c",
            &format!("granularity = \"session\"\n{session}members = [{}]", entries.join(", ")),
        );
    support::router(&config).await
}

async fn message(r: &TestRouter, i: usize, extra: &[(&str, &str)]) -> Sent {
    let id = i.to_string();
    let mut headers = vec![("x-session", "s1"), ("x-request-id", id.as_str())];
    headers.extend_from_slice(extra);
    let body = format!("message {i}");
    let s = send("POST", &r.url("web", "/session"), &headers, body.as_bytes()).await;
    assert_eq!(s.status, StatusCode::OK, "{i}: {}", String::from_utf8_lossy(&s.body));
    s
}

fn range(a: usize, b: usize) -> Vec<String> {
    (a..b).map(|i| i.to_string()).collect()
}

/// The one of `a` and `b` called `name`, and the other.
fn split<'a>(
    a: &'a mut Recorder,
    b: &'a mut Recorder,
    name: &str,
) -> (&'a mut Recorder, &'a mut Recorder) {
    if a.name == name { (a, b) } else { (b, a) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_session_member_mid_session_replays_in_order() {
    let (mut m1, mut m2) = (Recorder::spawn("m1"), Recorder::spawn("m2"));
    let r = setup(&[&m1, &m2], "{ max_messages = 64, max_bytes = 1048576 }", "header").await;
    let first = message(&r, 0, &[]).await;
    let holder = first.member().to_owned();
    for i in 1..10 {
        assert_eq!(message(&r, i, &[]).await.member(), holder, "the session sticks");
    }
    let (dead, heir) = split(&mut m1, &mut m2, &holder);
    assert_eq!(dead.ids(), range(0, 10));
    assert!(heir.ids().is_empty());
    dead.kill().await;
    // Message 10 finds its member gone: the member taking the session over gets 0..10 replayed,
    // in order, then 10.
    let moved = message(&r, 10, &[]).await;
    assert_eq!(moved.member(), heir.name);
    assert_eq!(moved.headers.get("x-rondo-replayed").map(|v| v.to_str().unwrap()), Some("10"));
    for i in 11..20 {
        let s = message(&r, i, &[]).await;
        assert_eq!(s.member(), heir.name);
        assert!(!s.headers.contains_key("x-rondo-replayed"), "replayed once only");
    }
    let seen = heir.seen();
    assert_eq!(heir.ids(), range(0, 20), "no message lost or reordered");
    for s in &seen {
        let replayed = s.headers.get("x-rondo-replay").is_some();
        let i: usize = s.id.parse().unwrap();
        assert_eq!(replayed, i < 10, "message {i} marked as a replay: {replayed}");
        assert_eq!(s.body, format!("message {i}").into_bytes(), "the body as sent");
        assert_eq!(s.path, "/session");
    }
    let text = r.live.metrics.render(&r.live.load());
    assert!(
        text.contains("rondo_session_replays_total{route=\"s\",result=\"replayed\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_shortens_the_replay() {
    let (mut m1, mut m2) = (Recorder::spawn("m1"), Recorder::spawn("m2"));
    let r = setup(&[&m1, &m2], "{ max_messages = 64 }", "header").await;
    let holder = message(&r, 0, &[]).await.member().to_owned();
    for i in 1..8 {
        let extra: &[(&str, &str)] = if i == 4 { &[("x-test-checkpoint", "1")] } else { &[] };
        let s = message(&r, i, extra).await;
        assert!(!s.headers.contains_key("x-rondo-checkpoint"), "the checkpoint stays inside");
    }
    let (dead, heir) = split(&mut m1, &mut m2, &holder);
    dead.kill().await;
    let s = message(&r, 8, &[]).await;
    assert_eq!(s.headers.get("x-rondo-replayed").map(|v| v.to_str().unwrap()), Some("3"));
    // Up to the checkpoint (4, included) nothing needs replaying: 5, 6, 7, then 8.
    assert_eq!(heir.ids(), range(5, 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limits_the_session_fails_over_without_replay_and_says_so() {
    let (mut m1, mut m2) = (Recorder::spawn("m1"), Recorder::spawn("m2"));
    let r = setup(&[&m1, &m2], "{ max_messages = 5 }", "header").await;
    let holder = message(&r, 0, &[]).await.member().to_owned();
    for i in 1..8 {
        message(&r, i, &[]).await;
    }
    let (dead, heir) = split(&mut m1, &mut m2, &holder);
    dead.kill().await;
    let s = message(&r, 8, &[]).await;
    assert_eq!(s.member(), heir.name);
    assert_eq!(s.headers.get("x-rondo-replay").map(|v| v.to_str().unwrap()), Some("skipped"));
    assert!(!s.headers.contains_key("x-rondo-replayed"));
    assert_eq!(heir.ids(), ["8"], "nothing replayed");
    let text = r.live.metrics.render(&r.live.load());
    assert!(
        text.contains("rondo_session_replays_total{route=\"s\",result=\"skipped\"} 1"),
        "{text}"
    );
    // The log starts again on the new member.
    message(&r, 9, &[]).await;
    assert_eq!(heir.ids(), ["8", "9"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_sessions_are_replayed_by_their_replay_cookie() {
    let (mut m1, mut m2) = (Recorder::spawn("m1"), Recorder::spawn("m2"));
    let r = setup(&[&m1, &m2], "{ max_messages = 64 }", "cookie").await;
    let url = r.url("web", "/session");
    let first = send("POST", &url, &[("x-request-id", "0")], b"message 0").await;
    let cookies: Vec<String> = first
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .collect();
    assert_eq!(cookies.len(), 2, "the member cookie and the replay cookie: {cookies:?}");
    assert!(cookies.iter().any(|c| c.starts_with("rondo-replay=")), "{cookies:?}");
    let cookie = cookies.join("; ");
    let holder = first.member().to_owned();
    for i in 1..5 {
        let id = i.to_string();
        let s = send("POST", &url, &[("x-request-id", &id), ("cookie", &cookie)], b"m").await;
        assert_eq!(s.member(), holder);
    }
    let (dead, heir) = split(&mut m1, &mut m2, &holder);
    dead.kill().await;
    let s = send("POST", &url, &[("x-request-id", "5"), ("cookie", &cookie)], b"m").await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.headers.get("x-rondo-replayed").map(|v| v.to_str().unwrap()), Some("5"));
    assert_eq!(heir.ids(), range(0, 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_replay_moves_on_down_the_failover_order() {
    // The session starts on m1; m2, the other member of its cluster, cannot take sessions over
    // (it refuses replays); m3, in the backup cluster, can.
    let (mut m1, m2, m3) = (Recorder::spawn("m1"), Recorder::spawn("m2"), Recorder::spawn("m3"));
    m2.fail_replays();
    let session =
        "granularity = \"session\"\nsession = { header = \"x-session\" }\nalgorithm = \"weighted\"";
    let config = listener_table("web", "error_detail = \"full\"")
        + &route_table(
            "s",
            "web",
            "c",
            "backups = [\"d\"]\nsession_replay = { max_messages = 64 }",
        )
        + &cluster_table(
            "c",
            &format!(
                "{session}\nmembers = [{}, {}]",
                m1.entry().replace(" }", ", weight = 1000000 }"),
                m2.entry()
            ),
        )
        + &cluster_table("d", &format!("{session}\nmembers = [{}]", m3.entry()));
    let r = support::router(&config).await;
    for i in 0..6 {
        assert_eq!(message(&r, i, &[]).await.member(), "m1");
    }
    m1.kill().await;
    let s = message(&r, 6, &[]).await;
    assert_eq!(s.member(), "m3");
    assert_eq!(s.headers.get("x-rondo-replayed").map(|v| v.to_str().unwrap()), Some("6"));
    // m2 got the first replayed request, refused it, and never got the new one.
    assert_eq!(m2.ids(), ["0"]);
    assert_eq!(m3.ids(), range(0, 7), "the replay, in order, then the new request");
    let text = r.live.metrics.render(&r.live.load());
    for result in ["failed", "replayed"] {
        let line = format!("rondo_session_replays_total{{route=\"s\",result=\"{result}\"}} 1");
        assert!(text.contains(&line), "{line} in {text}");
    }
}
