//! The embedded store's unit tests: ordering, dead letters, all-or-none appends, reopening.

use super::writer::{reconcile, write_batch};
use super::*;

fn spec(dir: &Path) -> (QueueSpec, PathBuf) {
    let spec = QueueSpec {
        name: "t".into(),
        backend: rondo_config::QueueBackend::Embedded { directory: dir.to_path_buf() },
        max_messages: 3,
        max_bytes: 1 << 20,
        max_message_bytes: 1 << 10,
        max_attempts: 3,
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
        lease: Duration::from_secs(1),
        concurrency: 1,
        session_header: Some("s".into()),
    };
    (spec, dir.to_path_buf())
}

fn msg(body: &'static str) -> Message {
    Message {
        listener: "in".into(),
        path: "/queues/t".into(),
        headers: Vec::new(),
        body: bytes::Bytes::from_static(body.as_bytes()),
        peer: None,
        branch: None,
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rondo-queue-unit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

async fn next(s: &Embedded) -> Option<Lease> {
    tokio::time::timeout(Duration::from_millis(200), s.next()).await.ok().map(|l| l.unwrap())
}

#[tokio::test]
async fn a_session_goes_in_order_one_at_a_time_and_ids_are_never_reused() {
    let dir = tempdir("order");
    let (spec, d) = spec(&dir);
    let s = Embedded::open(&spec, &d).unwrap();
    let a = s.append(msg("a"), Some("k".into())).await.unwrap();
    let b = s.append(msg("b"), Some("k".into())).await.unwrap();
    let c = s.append(msg("c"), None).await.unwrap();
    // Full at max_messages.
    assert!(matches!(s.append(msg("d"), None).await, Err(AppendError::Full { .. })));
    let first = next(&s).await.unwrap();
    assert_eq!(first.id, a);
    // `b` waits for `a`; `c` has no session and goes.
    let second = next(&s).await.unwrap();
    assert_eq!(second.id, c);
    assert!(next(&s).await.is_none(), "b waits while a is in delivery");
    let t = TryRecord { attempt: 1, at_ms: 0, reason: "x".into() };
    s.retry(first, t, Duration::from_millis(1)).await.unwrap();
    let again = next(&s).await.unwrap();
    assert_eq!((again.id.as_str(), again.attempts, again.tries.len()), (a.as_str(), 1, 1));
    s.complete(again).await.unwrap();
    s.complete(second).await.unwrap();
    let third = next(&s).await.unwrap();
    assert_eq!(third.id, b);
    s.complete(third).await.unwrap();
    assert_eq!(s.stats().depth, 0);
    s.close();
    drop(s);
    // Reopened: empty, and the next id follows the last one given.
    let s = Embedded::open(&spec, &d).unwrap();
    assert_eq!(s.stats().depth, 0);
    let e = s.append(msg("e"), None).await.unwrap();
    let seq = |id: &str| id.split_once('-').unwrap().1.parse::<u64>().unwrap();
    assert_eq!(seq(&e), seq(&c) + 1);
    assert_eq!(e.split_once('-').unwrap().0, a.split_once('-').unwrap().0, "same store uid");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn dead_letters_survive_a_reopen_with_their_tries_and_requeue() {
    let dir = tempdir("dead");
    let (spec, d) = spec(&dir);
    let s = Embedded::open(&spec, &d).unwrap();
    let id = s.append(msg("p"), None).await.unwrap();
    let l = next(&s).await.unwrap();
    let t = |n| TryRecord { attempt: n, at_ms: 0, reason: format!("try {n}") };
    s.dead_letter(l, t(1)).await.unwrap();
    s.close();
    drop(s);
    let s = Embedded::open(&spec, &d).unwrap();
    let st = s.stats();
    assert_eq!((st.depth, st.dead_letters), (0, 1));
    let d1 = s.dead_letter_get(&id).await.unwrap();
    assert_eq!(d1.tries.len(), 1);
    assert_eq!(d1.body, b"p");
    assert!(next(&s).await.is_none(), "a dead letter is not delivered");
    assert_eq!(s.requeue(Some(&id)).await.unwrap(), 1);
    let l = next(&s).await.unwrap();
    assert_eq!((l.id.as_str(), l.attempts), (id.as_str(), 0));
    s.dead_letter(l, t(1)).await.unwrap();
    assert_eq!(s.purge(None).await.unwrap(), 1);
    assert_eq!(s.stats().bytes, 0);
    assert!(matches!(s.dead_letter_get(&id).await, Err(QueueError::UnknownMessage(_))));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

// A commit reported failed may still reach the file. When the store is opened again after
// an I/O error, a message refused that way leaves the file (its client was told 503), and
// one whose delivery reached the file leaves the index (else it would be handed out and
// found missing for ever).
// A multicast message's copies: all kept, in one commit, or none when they do not all fit.
#[tokio::test]
async fn copies_are_appended_all_or_none() {
    let dir = tempdir("all-or-none");
    let (spec, d) = spec(&dir);
    let s = Embedded::open(&spec, &d).unwrap();
    let copy = |b: &str| Message { branch: Some(b.into()), ..msg("m") };
    let commits = s.shared.commits.load(Ordering::Relaxed);
    let ids = s.append_all(vec![(msg("m"), None), (copy("audit"), None)]).await.unwrap();
    assert_eq!(ids.len(), 2);
    assert_eq!(s.shared.commits.load(Ordering::Relaxed), commits + 1, "one commit");
    // max_messages is 3: two more copies do not fit, so neither is kept.
    let full = s.append_all(vec![(msg("n"), None), (copy("audit"), None)]).await;
    assert!(matches!(full, Err(AppendError::Full { .. })), "{full:?}");
    assert_eq!(s.stats().depth, 2);
    let first = next(&s).await.unwrap();
    let second = next(&s).await.unwrap();
    assert_eq!((first.message.branch, second.message.branch), (None, Some("audit".into())));
    assert!(next(&s).await.is_none());
    s.close();
    drop(s);
    // And they come back as written after a restart.
    let s = Embedded::open(&spec, &d).unwrap();
    assert_eq!(s.stats().depth, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn opened_again_the_file_and_the_index_agree() {
    let dir = tempdir("reconcile");
    let (spec, d) = spec(&dir);
    let s = Embedded::open(&spec, &d).unwrap();
    let a = s.append(msg("a"), None).await.unwrap();
    let b = s.append(msg("b"), None).await.unwrap();
    let seq = |id: &str| s.seq_of(id).unwrap();
    let stray = seq(&b) + 1;
    let ((r1, _), (r2, _)) = (oneshot::channel(), oneshot::channel());
    let behind_its_back = [
        Op::Append {
            items: vec![Appended {
                seq: stray,
                meta: MetaRecord { accepted_ms: 0, size: 1, session: None },
                message: record::encode_message(&msg("x")),
            }],
            reply: r1,
        },
        Op::Complete { seq: seq(&a), reply: r2 },
    ];
    s.shared.with_db(|db| write_batch(db, &behind_its_back).map_err(|e| e.to_string())).unwrap();
    s.shared.with_db(|db| reconcile(&s.shared, db)).unwrap();
    let st = s.stats();
    assert_eq!((st.depth, st.bytes), (1, msg("b").size()));
    assert_eq!(next(&s).await.unwrap().id, b);
    assert!(next(&s).await.is_none(), "neither the delivered nor the refused one");
    s.close();
    drop(s);
    let s = Embedded::open(&spec, &d).unwrap();
    assert_eq!(s.stats().depth, 1, "the refused message is gone from the file");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_that_is_not_a_store_is_refused_by_name() {
    let dir = tempdir("junk");
    let (spec, d) = spec(&dir);
    std::fs::create_dir_all(&d).unwrap();
    let file = store_path(&d, "t");
    std::fs::write(&file, vec![7u8; 8192]).unwrap();
    let e = Embedded::open(&spec, &d).unwrap_err();
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), vec![7u8; 8192]);
    let _ = std::fs::remove_dir_all(&dir);
}
