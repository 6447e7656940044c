//! The embedded store: one redb file per queue (`{directory}/{name}.redb`), crash-safe (redb's
//! copy-on-write B-trees and a durable commit per write transaction: after `kill -9` or a power
//! cut the file opens at its last commit), and an index of every message in memory.
//!
//! **Group commit.** Every change goes through one writer thread: it takes the changes waiting
//! in its channel (up to [`MAX_BATCH`] or [`MAX_BATCH_BYTES`]), writes them in one transaction,
//! commits it with [`Durability::Immediate`](redb::Durability::Immediate) (one fsync for the batch), and only then answers
//! each of them and applies them to the index. So a `202 Accepted` is never sent for a message
//! that a crash could lose, and a delivery never sees a message before it is durable.
//!
//! **The file.** Tables `meta` (sequence → accepted time, size, session key), `messages`
//! (sequence → the message), `tries` (sequence → its failed attempts), `dead` (sequence → when
//! it was dead-lettered) and `info` (`uid`, the store's random id in every message id, and
//! `next_seq`, so ids are never reused even once every message is gone). A file that is not a
//! redb database, or whose records cannot be read, refuses to open with an error naming the
//! file: a store is never silently reset.
//!
//! **I/O errors.** After a failed write (a full disk) redb refuses every later one until the
//! file is opened again: the writer thread opens it again with backoff, refusing new messages at
//! once meanwhile and holding the other changes, makes the file and the index agree (a commit
//! reported failed may still have reached the file), and takes messages again once a write
//! succeeds. A message answered 503 is never delivered; one answered 202 is never lost.
//!
//! **The index.** Messages not yet delivered by sequence (so the oldest is the first), the
//! ready set ordered by due time, one FIFO per session key (only its head is ever ready or in
//! delivery: messages of a session go in order, one at a time), the leases, and the dead
//! letters with their last reason. Leases live in memory only: after a crash every message not
//! completed is delivered again, which is where duplicates come from (docs/queues.md).

mod file;
mod index;
#[cfg(test)]
mod tests;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use redb::Database;
use rondo_config::QueueSpec;
use rondo_runtime::queues::{
    BoxFuture, DeadLetter, DeadLetterSummary, QueueError, QueueStats, TryRecord,
};
use tokio::sync::{Notify, oneshot};

use self::file::{load, read_message};
use self::index::{Dead, Index};
use self::writer::{Appended, Op, writer};
use crate::record::{self, MetaRecord};
use crate::store::{AppendError, Counters, Lease, Message, Store, unix_ms};

/// Most changes in one commit.
pub const MAX_BATCH: usize = 4096;
/// Most message bytes in one commit (a batch is closed once past it).
pub const MAX_BATCH_BYTES: usize = 16 << 20;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("queue {queue}: store file {}: {message}", path.display())]
pub struct OpenError {
    /// The queue.
    pub queue: String,
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

struct Shared {
    name: String,
    path: PathBuf,
    spec: QueueSpec,
    uid: u32,
    /// The store; `None` once [`Embedded::close`] released the file (a hitless upgrade's new
    /// process opens it then; redb holds a lock on it while it is open).
    db: std::sync::RwLock<Option<Database>>,
    index: Mutex<Index>,
    notify: Notify,
    counters: Counters,
    /// Transactions committed (each one fsync).
    commits: AtomicU64,
}

impl Shared {
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the open store; an error once it is closed.
    fn with_db<R>(&self, f: impl FnOnce(&Database) -> Result<R, String>) -> Result<R, String> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        match db.as_ref() {
            Some(db) => f(db),
            None => Err(format!("queue {}: the store is closed", self.name)),
        }
    }
}

/// A queue in its own redb file; see the module docs.
pub struct Embedded {
    shared: Arc<Shared>,
    writer: Mutex<Option<mpsc::Sender<Op>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("queue", &self.shared.name)
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// The store file of queue `name` in `directory`.
pub fn store_path(directory: &Path, name: &str) -> PathBuf {
    directory.join(format!("{name}.redb"))
}

impl Embedded {
    /// Opens (or creates) the store of `spec` in `directory` and reads its index; a file that
    /// is not a readable store is an error naming it.
    pub fn open(spec: &QueueSpec, directory: &Path) -> Result<Embedded, OpenError> {
        let path = store_path(directory, &spec.name);
        let fail =
            |message: String| OpenError { queue: spec.name.clone(), path: path.clone(), message };
        std::fs::create_dir_all(directory)
            .map_err(|e| fail(format!("cannot create directory {}: {e}", directory.display())))?;
        let db = Database::create(&path).map_err(|e| {
            fail(format!(
                "cannot be opened as a queue store: {e} (the file is left as it is; move it away \
                 to start this queue empty)"
            ))
        })?;
        let (uid, index) = load(&db, spec).map_err(fail)?;
        let shared = Arc::new(Shared {
            name: spec.name.clone(),
            path: path.clone(),
            spec: spec.clone(),
            uid,
            db: std::sync::RwLock::new(Some(db)),
            index: Mutex::new(index),
            notify: Notify::new(),
            counters: Counters::default(),
            commits: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("queue-{}", spec.name))
            .spawn(move || writer(s, rx))
            .map_err(|e| fail(format!("cannot start the writer thread: {e}")))?;
        Ok(Embedded { shared, writer: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Commits made so far (each is one fsync).
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    fn send(&self, op: Op) -> Result<(), String> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        match w.as_ref() {
            Some(tx) => tx.send(op).map_err(|_| "the writer thread stopped".to_owned()),
            None => Err("the store is closed".to_owned()),
        }
    }

    /// Sends `op` (made with a reply channel) and waits for its commit.
    async fn commit(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<(), String>>) -> Op,
    ) -> Result<(), QueueError> {
        let (tx, rx) = oneshot::channel();
        self.send(op(tx)).map_err(QueueError::Store)?;
        match rx.await {
            Ok(r) => r.map_err(QueueError::Store),
            Err(_) => Err(QueueError::Store("the writer thread stopped".to_owned())),
        }
    }

    fn id(&self, seq: u64) -> String {
        format!("{:08x}-{seq}", self.shared.uid)
    }

    fn seq_of(&self, id: &str) -> Result<u64, QueueError> {
        let unknown = || QueueError::UnknownMessage(id.to_owned());
        let (uid, seq) = id.split_once('-').ok_or_else(unknown)?;
        if u32::from_str_radix(uid, 16).ok() != Some(self.shared.uid) {
            return Err(unknown());
        }
        seq.parse().map_err(|_| unknown())
    }

    /// Stops the writer thread once it has committed what it was given.
    pub fn close(&self) {
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        // What was given is committed: the file (and redb's lock on it) is released.
        self.shared.db.write().unwrap_or_else(|e| e.into_inner()).take();
    }

    async fn read_blocking(&self, seq: u64) -> Result<(Message, Vec<TryRecord>), String> {
        // redb reads are memory-mapped page reads: short, but they may touch the disk.
        let s = self.shared.clone();
        tokio::task::spawn_blocking(move || s.with_db(|db| read_message(db, seq)))
            .await
            .unwrap_or_else(|e| Err(format!("reading message {seq}: {e}")))
    }

    fn summary(&self, seq: u64, d: &Dead) -> DeadLetterSummary {
        DeadLetterSummary {
            id: self.id(seq),
            accepted_ms: d.meta.accepted_ms,
            dead_ms: d.dead_ms,
            attempts: d.attempts,
            bytes: d.meta.size,
            last_reason: d.last_reason.clone(),
            session: d.meta.session.clone(),
        }
    }
}

/// A message's failed attempts with `tried` added, encoded for the `tries` table, and their
/// number.
fn tries_with(mut tries: Vec<TryRecord>, tried: TryRecord) -> (Vec<u8>, u32) {
    tries.push(tried);
    (record::encode_tries(&tries), tries.len() as u32)
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.close();
    }
}

impl Store for Embedded {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn count_too_large(&self) {
        self.shared.counters.rejected_too_large.fetch_add(1, Ordering::Relaxed);
    }

    fn append(
        &self,
        message: Message,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<String, AppendError>> {
        Box::pin(async move {
            let mut ids = self.append_all(vec![(message, session)]).await?;
            Ok(ids.pop().unwrap_or_default())
        })
    }

    fn append_all(
        &self,
        copies: Vec<(Message, Option<String>)>,
    ) -> BoxFuture<'_, Result<Vec<String>, AppendError>> {
        Box::pin(async move {
            let spec = &self.shared.spec;
            let accepted_ms = unix_ms();
            let mut items: Vec<Appended> = copies
                .into_iter()
                .map(|(message, session)| {
                    let size = message.size();
                    let message = record::encode_message(&message);
                    Appended { seq: 0, meta: MetaRecord { accepted_ms, size, session }, message }
                })
                .collect();
            let (n, size) = (items.len() as u64, items.iter().map(|a| a.meta.size).sum::<u64>());
            let (tx, rx) = oneshot::channel();
            let seqs = {
                let mut ix = self.shared.index();
                let why = if ix.count + n > spec.max_messages {
                    Some(format!("{} messages held, max_messages {}", ix.count, spec.max_messages))
                } else if ix.bytes + size > spec.max_bytes {
                    Some(format!("{} bytes held, max_bytes {}", ix.bytes, spec.max_bytes))
                } else {
                    None
                };
                if let Some(why) = why {
                    self.shared.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
                    return Err(AppendError::Full { queue: self.shared.name.clone(), why });
                }
                let first = ix.next_seq;
                for (i, a) in items.iter_mut().enumerate() {
                    a.seq = first + i as u64;
                }
                // Sent under the index lock: the writer's channel holds appends in sequence order.
                let sent = self.send(Op::Append { items, reply: tx });
                if let Err(error) = sent {
                    return Err(AppendError::Store { queue: self.shared.name.clone(), error });
                }
                ix.next_seq += n;
                ix.count += n;
                ix.bytes += size;
                first..first + n
            };
            let store_err =
                |error: String| AppendError::Store { queue: self.shared.name.clone(), error };
            match rx.await {
                Ok(Ok(())) => Ok(seqs.map(|seq| self.id(seq)).collect()),
                Ok(Err(e)) => Err(store_err(e)),
                Err(_) => Err(store_err("the writer thread stopped".to_owned())),
            }
        })
    }

    fn next(&self) -> BoxFuture<'_, Result<Lease, QueueError>> {
        Box::pin(async move {
            loop {
                let notified = self.shared.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let now = Instant::now();
                let picked = {
                    let mut ix = self.shared.index();
                    match ix.ready.first().copied() {
                        Some((due, seq)) if due <= now => {
                            ix.ready.remove(&(due, seq));
                            ix.leased.insert(seq);
                            let l = &ix.live[&seq];
                            Ok((seq, l.attempts, l.meta.accepted_ms))
                        }
                        Some((due, _)) => Err(Some(due)),
                        None => Err(None),
                    }
                };
                match picked {
                    Ok((seq, attempts, accepted_ms)) => {
                        return match self.read_blocking(seq).await {
                            Ok((message, tries)) => Ok(Lease {
                                id: self.id(seq),
                                message,
                                accepted_ms,
                                attempts,
                                tries,
                                key: seq,
                            }),
                            Err(e) => {
                                self.shared.index().release(seq, now + Duration::from_secs(1));
                                Err(QueueError::Store(e))
                            }
                        };
                    }
                    Err(Some(due)) => {
                        tokio::select! {
                            _ = notified => {}
                            _ = tokio::time::sleep_until(due.into()) => {}
                        }
                    }
                    Err(None) => notified.await,
                }
            }
        })
    }

    fn complete(&self, lease: Lease) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(self.commit(move |reply| Op::Complete { seq: lease.key, reply }))
    }

    fn retry(
        &self,
        lease: Lease,
        tried: TryRecord,
        after: Duration,
    ) -> BoxFuture<'_, Result<(), QueueError>> {
        let (t, attempts) = tries_with(lease.tries, tried);
        Box::pin(self.commit(move |reply| Op::Retry {
            seq: lease.key,
            tries: t,
            attempts,
            after,
            reply,
        }))
    }

    fn dead_letter(&self, lease: Lease, tried: TryRecord) -> BoxFuture<'_, Result<(), QueueError>> {
        let reason = tried.reason.clone();
        let (t, attempts) = tries_with(lease.tries, tried);
        Box::pin(self.commit(move |reply| Op::Dead {
            seq: lease.key,
            tries: t,
            attempts,
            reason,
            reply,
        }))
    }

    fn stats(&self) -> QueueStats {
        let spec = &self.shared.spec;
        let ix = self.shared.index();
        let now = unix_ms();
        QueueStats {
            name: self.shared.name.clone(),
            backend: "embedded",
            depth: ix.live.len() as u64,
            in_delivery: ix.leased.len() as u64,
            dead_letters: ix.dead.len() as u64,
            bytes: ix.bytes,
            oldest_age: ix
                .live
                .values()
                .next()
                .map(|l| Duration::from_millis(now.saturating_sub(l.meta.accepted_ms))),
            max_messages: spec.max_messages,
            max_bytes: spec.max_bytes,
            ..self.shared.counters.stats()
        }
    }

    fn dead_letters(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DeadLetterSummary>, QueueError>> {
        let ix = self.shared.index();
        let out = ix.dead.iter().take(limit).map(|(seq, d)| self.summary(*seq, d)).collect();
        Box::pin(async move { Ok(out) })
    }

    fn dead_letter_get(&self, id: &str) -> BoxFuture<'_, Result<DeadLetter, QueueError>> {
        let id = id.to_owned();
        Box::pin(async move {
            let seq = self.seq_of(&id)?;
            let summary = {
                let ix = self.shared.index();
                let d = ix.dead.get(&seq).ok_or_else(|| QueueError::UnknownMessage(id.clone()))?;
                self.summary(seq, d)
            };
            let (m, tries) = self.read_blocking(seq).await.map_err(QueueError::Store)?;
            Ok(m.into_dead_letter(summary, tries))
        })
    }

    fn requeue(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        self.change_dead(id, |seqs, reply| Op::Requeue { seqs, reply })
    }

    fn purge(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        self.change_dead(id, |seqs, reply| Op::Purge { seqs, reply })
    }
}

impl Embedded {
    /// Commits the change `op` makes of the dead letters `id` names (every one with `None`);
    /// answers their number.
    fn change_dead(
        &self,
        id: Option<&str>,
        op: fn(Vec<u64>, oneshot::Sender<Result<(), String>>) -> Op,
    ) -> BoxFuture<'_, Result<u64, QueueError>> {
        let id = id.map(str::to_owned);
        Box::pin(async move {
            let seqs = self.dead_seqs(id.as_deref())?;
            let n = seqs.len() as u64;
            if n > 0 {
                self.commit(move |reply| op(seqs, reply)).await?;
            }
            Ok(n)
        })
    }

    fn dead_seqs(&self, id: Option<&str>) -> Result<Vec<u64>, QueueError> {
        match id {
            Some(id) => {
                let seq = self.seq_of(id)?;
                if !self.shared.index().dead.contains_key(&seq) {
                    return Err(QueueError::UnknownMessage(id.to_owned()));
                }
                Ok(vec![seq])
            }
            None => Ok(self.shared.index().dead.keys().copied().collect()),
        }
    }
}
