//! The embedded store's writer thread: the changes it is sent, their batching into one durable
//! commit, the answers and the index after each commit, and opening the file again after an
//! I/O error (see the parent module's docs).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use tokio::sync::oneshot;

use super::file::{DEAD, INFO, MESSAGES, META, TRIES};
use super::index::{Dead, Live};
use super::{MAX_BATCH, MAX_BATCH_BYTES, Shared};
use crate::record::{self, MetaRecord};
use crate::store::unix_ms;

/// One message of an [`Op::Append`]: its sequence number, metadata and record.
pub(super) struct Appended {
    pub(super) seq: u64,
    pub(super) meta: MetaRecord,
    pub(super) message: Vec<u8>,
}

/// A change for the writer thread.
pub(super) enum Op {
    /// Messages appended in one commit, all or none (a multicast route's copies).
    Append {
        items: Vec<Appended>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Complete {
        seq: u64,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Retry {
        seq: u64,
        tries: Vec<u8>,
        attempts: u32,
        after: Duration,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Dead {
        seq: u64,
        tries: Vec<u8>,
        attempts: u32,
        reason: String,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Requeue {
        seqs: Vec<u64>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Purge {
        seqs: Vec<u64>,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

impl Op {
    fn bytes(&self) -> usize {
        match self {
            Op::Append { items, .. } => items.iter().map(|a| a.message.len()).sum(),
            Op::Retry { tries, .. } | Op::Dead { tries, .. } => tries.len(),
            _ => 16,
        }
    }
}

/// The writer thread: batches, one durable commit each, then the answers and the index. After
/// an I/O error, the store is opened again ([`reopen`]) before the next batch.
pub(super) fn writer(s: Arc<Shared>, rx: mpsc::Receiver<Op>) {
    let mut held = Vec::new();
    // The wait before the next reopen: doubled by each one, back to the first after a commit
    // (a disk still full fails the first write after a reopen, and is not tried ten times a
    // second).
    let mut backoff = REOPEN_FIRST;
    loop {
        let batch = if held.is_empty() {
            let Ok(first) = rx.recv() else { return };
            gather(first, &rx)
        } else {
            std::mem::take(&mut held)
        };
        let mut io = false;
        let result = s.with_db(|db| {
            write_batch(db, &batch).map_err(|e| {
                io = matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo);
                e.to_string()
            })
        });
        if result.is_ok() {
            s.commits.fetch_add(1, Ordering::Relaxed);
            backoff = REOPEN_FIRST;
        } else if let Err(e) = &result {
            tracing::error!(queue = %s.name, path = %s.path.display(), "queue store commit failed: {e}");
        }
        apply(&s, batch, result);
        s.notify.notify_waiters();
        if io {
            match reopen(&s, &rx, &mut backoff) {
                Some(h) => held = h,
                None => return,
            }
        }
    }
}

/// `first` and the changes waiting behind it, up to [`MAX_BATCH`] or [`MAX_BATCH_BYTES`].
fn gather(first: Op, rx: &mpsc::Receiver<Op>) -> Vec<Op> {
    let mut bytes = first.bytes();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
        match rx.try_recv() {
            Ok(op) => {
                bytes += op.bytes();
                batch.push(op);
            }
            Err(_) => break,
        }
    }
    batch
}

/// First wait before the store is opened again after an I/O error.
const REOPEN_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between two tries to open it again.
const REOPEN_MAX: Duration = Duration::from_secs(5);

/// After an I/O error (a full disk) redb refuses every later write until the file is opened
/// again (`Previous I/O error occurred`): closes it and opens it again, which brings it to its
/// last commit, after waiting `backoff` (doubled by each try, up to [`REOPEN_MAX`]). Meanwhile new messages are refused at once (503 with `Retry-After`) rather
/// than held; the other changes (deliveries' outcomes, the admin API's), as many as there are
/// callers waiting for them, are held and returned, to be written first. `None`: the store is
/// being closed (held changes answered with an error).
fn reopen(s: &Shared, rx: &mpsc::Receiver<Op>, backoff: &mut Duration) -> Option<Vec<Op>> {
    let refused = || Err("the store is being opened again after an I/O error".to_owned());

    // Released first: redb holds a lock on the file while it is open.
    s.db.write().unwrap_or_else(|e| e.into_inner()).take();
    let mut held = Vec::new();
    loop {
        let until = Instant::now() + *backoff;
        *backoff = (*backoff * 2).min(REOPEN_MAX);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(op @ Op::Append { .. }) => apply(s, vec![op], refused()),
                Ok(op) => held.push(op),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    apply(s, held, refused());
                    return None;
                }
            }
        }
        let opened = Database::create(&s.path).map_err(|e| e.to_string());
        match opened.and_then(|db| reconcile(s, &db).map(|()| db)) {
            Ok(db) => {
                *s.db.write().unwrap_or_else(|e| e.into_inner()) = Some(db);
                tracing::info!(queue = %s.name, path = %s.path.display(), "queue store opened again after an I/O error");
                return Some(held);
            }
            Err(e) => {
                let next = backoff.as_millis();
                tracing::warn!(queue = %s.name, path = %s.path.display(), "queue store cannot be opened again yet (next try in {next} ms): {e}");
            }
        }
    }
}

/// Makes the reopened file and the index agree. A commit reported failed may still have
/// reached the file (its writes went through and only the flush failed): a message refused
/// with 503 is removed from the file (its client sends it again; it must not also be
/// delivered), and a message whose delivery or purge is on the file but not in the index
/// leaves the index (else it would be handed out and found missing for ever).
pub(super) fn reconcile(s: &Shared, db: &Database) -> Result<(), String> {
    let err = |x: &dyn std::fmt::Display| x.to_string();
    let on_file: BTreeSet<u64> = {
        let txn = db.begin_read().map_err(|x| err(&x))?;
        let meta = txn.open_table(META).map_err(|x| err(&x))?;
        let keys = meta.iter().map_err(|x| err(&x))?;
        keys.map(|r| r.map(|(k, _)| k.value())).collect::<Result<_, _>>().map_err(|x| err(&x))?
    };
    let stray: Vec<u64> = {
        let mut ix = s.index();
        let gone: Vec<u64> = ix
            .live
            .keys()
            .chain(ix.dead.keys())
            .filter(|q| !on_file.contains(q))
            .copied()
            .collect();
        for seq in gone {
            let size = match ix.unlink(seq) {
                Some(l) => l.meta.size,
                None => ix.dead.remove(&seq).map_or(0, |d| d.meta.size),
            };
            ix.count -= 1;
            ix.bytes -= size;
        }
        on_file
            .iter()
            .filter(|q| !ix.live.contains_key(q) && !ix.dead.contains_key(q))
            .copied()
            .collect()
    };
    if stray.is_empty() {
        return Ok(());
    }
    tracing::warn!(queue = %s.name, "{} message(s) refused by a failed commit reached the store file: removed", stray.len());
    let (reply, _) = oneshot::channel();
    write_batch(db, &[Op::Purge { seqs: stray, reply }]).map_err(|x| err(&x))
}

pub(super) fn write_batch(db: &Database, batch: &[Op]) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut meta = txn.open_table(META)?;
        let mut msgs = txn.open_table(MESSAGES)?;
        let mut tries = txn.open_table(TRIES)?;
        let mut dead = txn.open_table(DEAD)?;
        let mut info = txn.open_table(INFO)?;
        let mut next_seq = None;
        for op in batch {
            match op {
                Op::Append { items, .. } => {
                    for Appended { seq, meta: m, message } in items {
                        meta.insert(*seq, record::encode_meta(m).as_slice())?;
                        msgs.insert(*seq, message.as_slice())?;
                        next_seq = Some(seq + 1);
                    }
                }
                Op::Complete { seq, .. } => {
                    meta.remove(*seq)?;
                    msgs.remove(*seq)?;
                    tries.remove(*seq)?;
                }
                Op::Retry { seq, tries: t, .. } => {
                    tries.insert(*seq, t.as_slice())?;
                }
                Op::Dead { seq, tries: t, .. } => {
                    tries.insert(*seq, t.as_slice())?;
                    dead.insert(*seq, unix_ms())?;
                }
                Op::Requeue { seqs, .. } => {
                    for seq in seqs {
                        dead.remove(*seq)?;
                        tries.remove(*seq)?;
                    }
                }
                Op::Purge { seqs, .. } => {
                    for seq in seqs {
                        meta.remove(*seq)?;
                        msgs.remove(*seq)?;
                        tries.remove(*seq)?;
                        dead.remove(*seq)?;
                    }
                }
            }
        }
        if let Some(n) = next_seq {
            info.insert("next_seq", n)?;
        }
    }
    txn.commit().map_err(redb::Error::from)
}

/// After the batch's commit (or its failure): the index, the counters and the answers.
fn apply(s: &Shared, batch: Vec<Op>, result: Result<(), String>) {
    let ok = result.is_ok();
    let now = Instant::now();
    let dead_ms = unix_ms();
    let mut replies = Vec::with_capacity(batch.len());
    {
        let mut ix = s.index();
        for op in batch {
            match op {
                Op::Append { items, reply } => {
                    for Appended { seq, meta, .. } in items {
                        if ok {
                            ix.live.insert(seq, Live { meta, attempts: 0, due: now });
                            ix.schedule(seq);
                            s.counters.accepted.fetch_add(1, Ordering::Relaxed);
                        } else {
                            ix.count -= 1;
                            ix.bytes -= meta.size;
                        }
                    }
                    replies.push(reply);
                }
                Op::Complete { seq, reply } => {
                    if ok {
                        if let Some(l) = ix.unlink(seq) {
                            ix.count -= 1;
                            ix.bytes -= l.meta.size;
                        }
                        s.counters.delivered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // Delivered but not recorded: it goes again (a duplicate, not a loss).
                        ix.release(seq, now + Duration::from_secs(1));
                    }
                    replies.push(reply);
                }
                Op::Retry { seq, attempts, after, reply, .. } => {
                    if let Some(l) = ix.live.get_mut(&seq)
                        && ok
                    {
                        l.attempts = attempts;
                    }
                    ix.release(seq, now + if ok { after } else { Duration::from_secs(1) });
                    if ok {
                        s.counters.retried.fetch_add(1, Ordering::Relaxed);
                    }
                    replies.push(reply);
                }
                Op::Dead { seq, attempts, reason, reply, .. } => {
                    if ok {
                        if let Some(l) = ix.unlink(seq) {
                            let d = Dead { meta: l.meta, attempts, dead_ms, last_reason: reason };
                            ix.dead.insert(seq, d);
                        }
                        s.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        ix.release(seq, now + Duration::from_secs(1));
                    }
                    replies.push(reply);
                }
                Op::Requeue { seqs, reply } => {
                    if ok {
                        for seq in seqs {
                            if let Some(d) = ix.dead.remove(&seq) {
                                ix.live.insert(seq, Live { meta: d.meta, attempts: 0, due: now });
                                ix.schedule(seq);
                            }
                        }
                    }
                    replies.push(reply);
                }
                Op::Purge { seqs, reply } => {
                    if ok {
                        for seq in seqs {
                            if let Some(d) = ix.dead.remove(&seq) {
                                ix.count -= 1;
                                ix.bytes -= d.meta.size;
                            }
                        }
                    }
                    replies.push(reply);
                }
            }
        }
    }
    for r in replies {
        let _ = r.send(result.clone());
    }
}
