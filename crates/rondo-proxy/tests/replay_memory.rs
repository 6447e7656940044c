//! Session replay's memory under 10,000 sessions (docs/router.md "Session replay"): the logs'
//! resident memory, measured from `/proc/self/statm` in a process of its own, stays within a
//! small factor of the bytes they account for, and the route's `max_total_bytes` bounds both
//! however many sessions come.

use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method};
use rondo_core::SessionReplay;
use rondo_proxy::session_replay::{Kept, Recorded, Store};

/// Resident bytes of this process (Linux).
fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// A request as a session sends it: a dozen header fields, a 200-byte body.
fn request(session: usize, i: usize) -> Kept {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "orders.example.com".to_owned()),
        ("user-agent", "test-client/1.0".to_owned()),
        ("accept", "application/json".to_owned()),
        ("content-type", "application/json".to_owned()),
        ("x-session", format!("session-{session:08}")),
        ("x-request-id", format!("{session}-{i}")),
        ("x-forwarded-for", "10.1.2.3".to_owned()),
        ("x-forwarded-proto", "http".to_owned()),
        ("x-forwarded-host", "orders.example.com".to_owned()),
        ("via", "1.1 rondo-0123456789abcdef".to_owned()),
    ] {
        h.insert(k, HeaderValue::from_str(&v).unwrap());
    }
    let pq = PathAndQuery::try_from(format!("/orders/{session}/lines/{i}")).unwrap();
    Kept::new(Method::POST, pq, h, Bytes::from(vec![b'x'; 200]), None)
}

#[test]
fn ten_thousand_sessions_stay_bounded() {
    const SESSIONS: usize = 10_000;
    const MESSAGES: usize = 8;
    let idle = Duration::from_secs(600);
    let limits = SessionReplay {
        max_messages: 64,
        max_bytes: 1 << 20,
        max_total_bytes: SessionReplay::DEFAULT_MAX_TOTAL_BYTES,
    };
    let store = Store::default();
    let before = resident();
    for i in 0..MESSAGES {
        for s in 0..SESSIONS {
            let key = format!("session-{s:08}");
            let got = store.record("orders", limits, idle, &key, "m1", Some(request(s, i)), false);
            assert_eq!(got, Recorded::Kept);
        }
    }
    let after = resident();
    let accounted = store.bytes();
    assert_eq!(store.sessions(), SESSIONS);
    let per_message = accounted / (SESSIONS * MESSAGES) as u64;
    eprintln!(
        "{SESSIONS} sessions x {MESSAGES} messages: {accounted} bytes accounted ({per_message} per message)"
    );
    if let (Some(b), Some(a)) = (before, after) {
        let grown = a.saturating_sub(b);
        eprintln!(
            "resident memory grew by {grown} bytes: {:.2} x accounted, {} per session",
            grown as f64 / accounted as f64,
            grown / SESSIONS as u64
        );
        // The table, the records and the allocator's rounding cost more than the bytes kept
        // (measured 1.4x with 10,000 sessions of 8 messages), but less than twice.
        assert!(grown < 2 * accounted, "{grown} resident for {accounted} accounted");
    }

    // However many sessions come, the route's total holds: the rest are not kept.
    let tight = SessionReplay { max_total_bytes: 4 << 20, ..limits };
    let store = Store::default();
    let before = resident();
    let mut over = 0;
    for i in 0..MESSAGES {
        for s in 0..SESSIONS {
            let key = format!("session-{s:08}");
            if store.record("orders", tight, idle, &key, "m1", Some(request(s, i)), false)
                == Recorded::Over
            {
                over += 1;
            }
        }
    }
    assert!(store.bytes() <= tight.max_total_bytes, "{}", store.bytes());
    assert!(over > 0, "the total was reached");
    if let (Some(b), Some(a)) = (before, resident()) {
        let grown = a.saturating_sub(b);
        eprintln!(
            "with max_total_bytes = 4 MiB: {} accounted, resident grew by {grown}",
            store.bytes()
        );
        assert!(grown < 2 * tight.max_total_bytes + (16 << 20), "{grown}");
    }
}
