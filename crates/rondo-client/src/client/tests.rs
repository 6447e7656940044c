//! The call loop without a network: an offline client held at a fixed answer, and closures
//! that fail or succeed as each test says.

use std::sync::atomic::AtomicUsize;

use rondo_core::wire::{Member, Source};
use rondo_core::{AdminState, Algorithm, Granularity, Policy};

use super::*;
use crate::AttemptError;

fn member(name: &str, port: u16) -> Member {
    Member {
        name: name.into(),
        address: format!("127.0.0.1:{port}"),
        weight: 100,
        group: None,
        state: AdminState::Active,
        source: Source::Config,
    }
}

fn offline(policy: Policy, names: &[&str]) -> Client {
    let members = names.iter().zip(1u16..).map(|(n, p)| member(n, p)).collect();
    let answer = Answer { service: "web".into(), view_id: 1, policy, members };
    Client::builder("web").seed(42).offline(answer)
}

fn refused() -> std::io::Error {
    std::io::ErrorKind::ConnectionRefused.into()
}

fn in_flight(client: &Client) -> u32 {
    client.inner.lock().balancer.states().iter().map(|s| s.load.in_flight).sum()
}

fn sessions(client: &Client, name: &str) -> u32 {
    let st = client.inner.lock();
    let i = st.balancer.member_index(name).expect("member");
    st.balancer.states()[i].load.sessions
}

#[tokio::test]
async fn a_refused_connection_goes_to_the_next_member() {
    let client = offline(Policy::default(), &["a", "b", "c"]);
    let tried = Mutex::new(Vec::new());
    let got =
        client
            .call(|t| {
                tried.lock().unwrap().push(t.name().to_owned());
                let first = tried.lock().unwrap().len() == 1;
                async move {
                    if first { Err(Failed::Connect(refused())) } else { Ok(t.name().to_owned()) }
                }
            })
            .await
            .expect("the second member answers");
    let tried = tried.into_inner().unwrap();
    assert_eq!(tried.len(), 2);
    assert_ne!(tried[0], tried[1]);
    assert_eq!(got, tried[1]);
    assert_eq!(in_flight(&client), 0, "every try ended");
}

#[tokio::test]
async fn when_every_member_fails_the_error_lists_every_attempt() {
    let client = offline(Policy::default(), &["a", "b"]);
    let err = client
        .call(|_t| async { Err::<(), _>(Failed::Connect(refused())) })
        .await
        .expect_err("nothing answers");
    assert!(err.is_all_failed(), "{err}");
    // Two members tried, then nothing left to pick (policy attempts: 3).
    assert_eq!(err.attempts().len(), 3, "{err}");
    let names: Vec<_> = err.attempts().map(|a| a.member()).collect();
    assert!(names.contains(&Some("a")) && names.contains(&Some("b")), "{err}");
    let last = err.attempts().nth(2).expect("a third attempt");
    assert!(matches!(last.error(), AttemptError::NoMember(_)), "{err}");
    let text = err.to_string();
    assert!(text.starts_with("call to web: every member tried failed (3 attempts: "), "{text}");
    assert!(text.contains("a at 127.0.0.1:1: connect failed: connection refused"), "{text}");
    assert_eq!(in_flight(&client), 0);
}

#[tokio::test]
async fn a_service_without_members_says_so() {
    let client = offline(Policy::default(), &[]);
    let err =
        client.call(|t| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) }).await;
    let err = err.expect_err("nobody to call");
    assert!(err.is_no_member(), "{err}");
    assert!(err.to_string().contains("no eligible member"), "{err}");
}

#[tokio::test]
async fn a_member_failure_is_retried_only_for_idempotent_calls() {
    let client = offline(Policy::default(), &["a", "b", "c"]);
    let calls = AtomicUsize::new(0);
    let fail_first = |t: Target| {
        let n = calls.fetch_add(1, Ordering::Relaxed);
        async move { if n == 0 { Err(Failed::Member(refused())) } else { Ok(t.name().to_owned()) } }
    };
    client.call(fail_first).await.expect("idempotent: retried elsewhere");
    assert_eq!(calls.swap(0, Ordering::Relaxed), 2);

    let fail_first = |t: Target| {
        let n = calls.fetch_add(1, Ordering::Relaxed);
        async move { if n == 0 { Err(Failed::Member(refused())) } else { Ok(t.name().to_owned()) } }
    };
    let err = client
        .call_with(CallOptions::not_idempotent(), fail_first)
        .await
        .expect_err("not sent twice");
    assert!(err.is_not_retryable(), "{err}");
    assert_eq!(err.attempts().len(), 1);
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_fatal_failure_returns_at_once() {
    let client = offline(Policy::default(), &["a", "b"]);
    let err = client
        .call(|_t| async { Err::<(), _>(Failed::Fatal("bad request")) })
        .await
        .expect_err("fatal");
    assert!(err.is_fatal(), "{err}");
    assert_eq!(err.attempts().len(), 1);
    assert_eq!(err.last_error(), Some(&"bad request"));
    assert_eq!(in_flight(&client), 0);
}

#[tokio::test]
async fn a_try_slower_than_the_per_try_timeout_goes_elsewhere() {
    let mut policy = Policy::default();
    policy.retry.per_try_timeout = Some(Duration::from_millis(30));
    let client = offline(policy, &["a", "b"]);
    let calls = AtomicUsize::new(0);
    let got = client
        .call(|t| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            async move {
                if n == 0 {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
                Ok::<_, Failed<std::io::Error>>(t.name().to_owned())
            }
        })
        .await
        .expect("the second try answers");
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    let st = client.inner.lock();
    let slow = st.balancer.spec().members.iter().position(|m| m.name != got).unwrap();
    assert_eq!(st.balancer.states()[slow].load.consecutive_failures, 1, "the timeout was counted");
}

#[tokio::test]
async fn an_empty_retry_budget_stops_retries_after_a_member_failure_but_not_failover() {
    let mut policy = Policy::default();
    policy.retry.budget_percent = 0;
    policy.retry.budget_min_per_sec = 0;
    let client = offline(policy, &["a", "b", "c"]);
    let err = client
        .call(|_t| async { Err::<(), _>(Failed::Member(refused())) })
        .await
        .expect_err("no budget");
    assert!(err.is_budget_exhausted(), "{err}");
    assert_eq!(err.attempts().len(), 1);
    // A refused connection sent nothing: failing over after it is free.
    let calls = AtomicUsize::new(0);
    client
        .call(|t| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            async move { if n < 2 { Err(Failed::Connect(refused())) } else { Ok(t.name().to_owned()) } }
        })
        .await
        .expect("the third member answers");
}

#[tokio::test]
async fn a_session_stays_on_its_member_and_moves_when_it_fails() {
    let client = offline(Policy::default(), &["a", "b", "c"]);
    let session = client.session();
    let name = |t: Target| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) };
    let first = session.call(name).await.unwrap();
    for _ in 0..5 {
        assert_eq!(session.call(name).await.unwrap(), first);
    }
    assert_eq!(session.member().as_deref(), Some(first.as_str()));
    assert_eq!(sessions(&client, &first), 1);

    // Its member refuses: the session moves to the next one and stays there.
    let moved =
        session
            .call(|t| {
                let down = t.name() == first;
                async move {
                    if down { Err(Failed::Connect(refused())) } else { Ok(t.name().to_owned()) }
                }
            })
            .await
            .unwrap();
    assert_ne!(moved, first);
    for _ in 0..3 {
        assert_eq!(session.call(name).await.unwrap(), moved);
    }
    assert_eq!(sessions(&client, &first), 0);
    assert_eq!(sessions(&client, &moved), 1);
    drop(session);
    assert_eq!(sessions(&client, &moved), 0, "the session count ends with the session");
}

#[tokio::test]
async fn rotating_contexts_start_one_further_down_the_list() {
    let policy = Policy { algorithm: Algorithm::Rotating, ..Policy::default() };
    let client = offline(policy, &["a", "b", "c"]);
    let name = |t: Target| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) };
    let mut firsts = Vec::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        let s = client.session();
        firsts.push(s.call(name).await.unwrap());
        assert_eq!(s.call(name).await.unwrap(), *firsts.last().unwrap(), "sticky");
        held.push(s);
    }
    firsts.sort();
    assert_eq!(firsts, ["a", "b", "c"], "three contexts, three starting points");
    let contexts: Vec<_> = held.iter().map(|s| s.context().unwrap()).collect();
    assert_eq!(contexts, [0, 1, 2]);
}

#[tokio::test]
async fn with_session_granularity_the_client_is_one_session() {
    let policy = Policy { granularity: Granularity::Session, ..Policy::default() };
    let client = offline(policy, &["a", "b", "c"]);
    let name = |t: Target| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) };
    let first = client.call(name).await.unwrap();
    for _ in 0..5 {
        assert_eq!(client.call(name).await.unwrap(), first);
    }
}

#[tokio::test]
async fn in_flight_and_latency_reach_the_estimators() {
    let mut policy = Policy { algorithm: Algorithm::P2cEwma, ..Policy::default() };
    // Unobserved members look fast, so both get tried first.
    policy.ewma.default_rtt = Duration::from_micros(100);
    let client = offline(policy, &["fast", "slow"]);
    let probe = client.clone();
    let mut slow = 0;
    for _ in 0..60 {
        let name = client
            .call(|t| {
                assert_eq!(in_flight(&probe), 1, "the try is in flight");
                async move {
                    if t.name() == "slow" {
                        tokio::time::sleep(Duration::from_millis(15)).await;
                    }
                    Ok::<_, Failed<std::io::Error>>(t.name().to_owned())
                }
            })
            .await
            .unwrap();
        slow += usize::from(name == "slow");
    }
    assert_eq!(in_flight(&client), 0);
    assert!(slow < 20, "p2c-ewma steers away from the slow member: {slow} of 60");
    let st = client.inner.lock();
    let i = st.balancer.member_index("slow").unwrap();
    assert!(st.balancer.states()[i].load.completed >= 1);
}

#[tokio::test]
async fn a_newer_answer_keeps_state_and_a_newer_view_id_asks_for_a_refetch() {
    let client = offline(Policy::default(), &["a", "b"]);
    client.observe_view_id(1);
    assert_eq!(client.inner.wanted.load(Ordering::Relaxed), 0, "not newer");
    client.observe_view_id(5);
    assert_eq!(client.inner.wanted.load(Ordering::Relaxed), 5);

    let session = client.session();
    let first = session
        .call(|t| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) })
        .await
        .unwrap();
    let mut answer = (*client.answer()).clone();
    answer.view_id = 5;
    answer.members.insert(0, member("z", 9));
    client.inner.apply(answer);
    assert_eq!(client.view_id(), 5);
    assert_eq!(client.members().len(), 3);
    assert_eq!(sessions(&client, &first), 1, "the session count survived the new answer");
    let again = session
        .call(|t| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) })
        .await
        .unwrap();
    assert_eq!(again, first, "the session kept its member across the answer");
}

#[tokio::test]
async fn least_sessions_sees_the_calls_in_flight() {
    let policy = Policy { algorithm: Algorithm::LeastSessions, ..Policy::default() };
    let client = offline(policy, &["a", "b"]);
    let release = Arc::new(Notify::new());
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let long = {
        let (client, release) = (client.clone(), release.clone());
        tokio::spawn(async move {
            let mut held_tx = Some(held_tx);
            client
                .call(|t| {
                    let release = release.clone();
                    let tx = held_tx.take();
                    async move {
                        if let Some(tx) = tx {
                            let _ = tx.send(t.name().to_owned());
                        }
                        release.notified().await;
                        Ok::<_, Failed<std::io::Error>>(t.name().to_owned())
                    }
                })
                .await
        })
    };
    let busy = held_rx.await.expect("the long call started");
    for _ in 0..3 {
        let name = client
            .call(|t| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) })
            .await
            .unwrap();
        assert_ne!(name, busy, "the member with a call in flight is passed over");
    }
    release.notify_one();
    assert_eq!(long.await.unwrap().unwrap(), busy);
    assert_eq!(in_flight(&client), 0);
}

#[test]
fn timings_that_would_spin_are_clamped() {
    let b =
        Client::builder("web").watch_wait(Duration::ZERO).backoff(Duration::ZERO, Duration::ZERO);
    assert_eq!(b.watch_wait, Duration::from_millis(10));
    assert_eq!(
        (b.backoff_min, b.backoff_max),
        (Duration::from_millis(1), Duration::from_millis(1))
    );
    let b = Client::builder("web").watch_wait(Duration::from_secs(3600));
    assert_eq!(b.watch_wait, Duration::from_secs(300), "the naming service refuses longer waits");
}

// Regression: a session pinned to a member that left the answers and came back kept the member
// without being counted on its fresh state (and its close later took a count it never added).
#[tokio::test]
async fn a_session_on_a_member_that_came_back_is_counted_again() {
    let client = offline(Policy::default(), &["a", "b"]);
    let session = client.session();
    let name = |t: Target| async move { Ok::<_, Failed<std::io::Error>>(t.name().to_owned()) };
    let pinned = session.call(name).await.unwrap();
    let other = if pinned == "a" { "b" } else { "a" };
    assert_eq!(sessions(&client, &pinned), 1);
    let answer = |view_id, names: &[&str]| Answer {
        service: "web".into(),
        view_id,
        policy: Policy::default(),
        members: names.iter().map(|n| member(n, if *n == "a" { 1 } else { 2 })).collect(),
    };
    client.inner.apply(answer(2, &[other]));
    client.inner.apply(answer(3, &["a", "b"]));
    assert_eq!(sessions(&client, &pinned), 0, "a fresh state after coming back");
    assert_eq!(session.call(name).await.unwrap(), pinned, "the session keeps its member");
    assert_eq!(sessions(&client, &pinned), 1, "and is counted on it again");
    drop(session);
    assert_eq!(sessions(&client, &pinned), 0);
}

/// A client of members at the given addresses (host names allowed).
fn offline_at(policy: Policy, members: &[(&str, &str)]) -> Client {
    let members =
        members.iter().map(|(n, a)| Member { address: (*a).into(), ..member(n, 0) }).collect();
    let answer = Answer { service: "web".into(), view_id: 1, policy, members };
    Client::builder("web").seed(42).offline(answer)
}

#[tokio::test]
async fn a_host_name_is_resolved_for_the_try_and_one_that_fails_goes_to_the_next_member() {
    // `localhost:7` resolves (no DNS server involved); `no-port` cannot be resolved at all.
    let policy = Policy { algorithm: Algorithm::Rotating, ..Policy::default() };
    let client = offline_at(policy, &[("named", "localhost:7"), ("broken", "no-port")]);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let target = client
            .call(|t| async move { Ok::<_, Failed<std::io::Error>>(t) })
            .await
            .expect("`named` answers every call");
        seen.push(target);
    }
    for t in &seen {
        assert_eq!(t.name(), "named");
        assert_eq!(t.address(), "localhost:7");
        assert!(t.addr().ip().is_loopback() && t.addr().port() == 7, "{t:?}");
    }
    // Calls that started on `broken` (every other one: `rotating`) failed over; the failed
    // resolution was charged to it like a refused connection.
    {
        let st = client.inner.lock();
        let broken = st.balancer.member_index("broken").expect("broken");
        assert!(st.balancer.states()[broken].load.completed >= 1, "a try started on `broken`");
        assert!(st.balancer.states()[broken].load.consecutive_failures >= 1);
    }
    // With only `broken`, the call gives up with the resolver's reason.
    let broken_only = offline_at(Policy::default(), &[("broken", "no-port")]);
    let err = broken_only
        .call(|t| async move { Ok::<_, Failed<std::io::Error>>(t) })
        .await
        .expect_err("nothing resolves");
    let first = err.attempts().next().expect("an attempt");
    assert!(
        matches!(first.error(), AttemptError::Resolve(m) if m.starts_with("no-port: ")),
        "{err}"
    );
    assert_eq!(first.member(), Some("broken"));
    assert_eq!(in_flight(&client), 0);
    assert_eq!(in_flight(&broken_only), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_stops_at_its_deadline_even_with_attempts_left() {
    let client =
        Client::builder("web").seed(42).call_timeout(Duration::from_millis(50)).offline(Answer {
            service: "web".into(),
            view_id: 1,
            policy: Policy::default(),
            members: vec![member("a", 1), member("b", 2), member("c", 3)],
        });
    let calls = AtomicUsize::new(0);
    let err = client
        .call(|_t| {
            calls.fetch_add(1, Ordering::Relaxed);
            async {
                // Each member fails after 40 ms: the second try outlives the call's 50 ms.
                tokio::time::sleep(Duration::from_millis(40)).await;
                Err::<(), _>(Failed::Member(refused()))
            }
        })
        .await
        .expect_err("out of time");
    assert!(err.is_deadline(), "{err}");
    assert_eq!(calls.load(Ordering::Relaxed), 2, "no third try after the deadline");
    let second = err.attempts().nth(1).expect("a second attempt");
    assert!(matches!(second.error(), AttemptError::Timeout(_)), "{err}");
    assert_eq!(in_flight(&client), 0);
}

#[tokio::test]
async fn a_call_dropped_mid_try_ends_its_request_as_cancelled() {
    let client = offline(Policy::default(), &["a", "b"]);
    let started = AtomicUsize::new(0);
    let call = client.call(|_t| {
        started.fetch_add(1, Ordering::Relaxed);
        std::future::pending::<Result<(), Failed<std::io::Error>>>()
    });
    // The caller gives up: the call's future is dropped while its try is under way.
    let gave_up = tokio::time::timeout(Duration::from_millis(20), call).await;
    assert!(gave_up.is_err());
    assert_eq!(started.load(Ordering::Relaxed), 1);
    assert_eq!(in_flight(&client), 0, "the request ended");
    let st = client.inner.lock();
    assert!(st.balancer.states().iter().all(|s| s.load.consecutive_failures == 0), "not charged");
}
