//! The embedded store: one redb file per queue (`{directory}/{name}.redb`), crash-safe (redb's
//! copy-on-write B-trees and a durable commit per write transaction: after `kill -9` or a power
//! cut the file opens at its last commit), and an index of every message in memory.
//!
//! **Group commit.** Every change goes through one writer thread: it takes the changes waiting
//! in its channel (up to [`MAX_BATCH`] or [`MAX_BATCH_BYTES`]), writes them in one transaction,
//! commits it with [`Durability::Immediate`] (one fsync for the batch), and only then answers
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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use rondo_config::QueueSpec;
use rondo_runtime::queues::{
    BoxFuture, DeadLetter, DeadLetterSummary, QueueError, QueueStats, TryRecord,
};
use tokio::sync::{Notify, oneshot};

use crate::record::{self, MetaRecord};
use crate::store::{AppendError, Counters, Lease, Message, Store, unix_ms};

const META: TableDefinition<u64, &[u8]> = TableDefinition::new("meta");
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
const TRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("tries");
const DEAD: TableDefinition<u64, u64> = TableDefinition::new("dead");
const INFO: TableDefinition<&str, u64> = TableDefinition::new("info");

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

/// A message not yet delivered.
#[derive(Debug, Clone)]
struct Live {
    meta: MetaRecord,
    attempts: u32,
    due: Instant,
}

/// A dead letter.
#[derive(Debug, Clone)]
struct Dead {
    meta: MetaRecord,
    attempts: u32,
    dead_ms: u64,
    last_reason: String,
}

#[derive(Debug, Default)]
struct Index {
    live: BTreeMap<u64, Live>,
    ready: BTreeSet<(Instant, u64)>,
    sessions: HashMap<String, VecDeque<u64>>,
    leased: BTreeSet<u64>,
    dead: BTreeMap<u64, Dead>,
    /// Messages and bytes held, live and dead, plus appends not yet committed.
    count: u64,
    bytes: u64,
    next_seq: u64,
}

impl Index {
    /// Makes `seq` (live, not leased) deliverable at its due time, unless an earlier message of
    /// its session goes first.
    fn schedule(&mut self, seq: u64) {
        let Some(l) = self.live.get(&seq) else { return };
        let due = l.due;
        match &l.meta.session {
            Some(k) => {
                let q = self.sessions.entry(k.clone()).or_default();
                if !q.contains(&seq) {
                    q.push_back(seq);
                }
                if q.front() == Some(&seq) {
                    self.ready.insert((due, seq));
                }
            }
            None => {
                self.ready.insert((due, seq));
            }
        }
    }

    /// `seq` leaves the live set (delivered or dead): the next message of its session may go.
    fn unlink(&mut self, seq: u64) -> Option<Live> {
        self.leased.remove(&seq);
        let l = self.live.remove(&seq)?;
        self.ready.remove(&(l.due, seq));
        if let Some(k) = &l.meta.session
            && let Some(q) = self.sessions.get_mut(k)
        {
            q.retain(|s| *s != seq);
            match q.front().copied() {
                None => {
                    self.sessions.remove(k);
                }
                Some(next) => {
                    if !self.leased.contains(&next)
                        && let Some(n) = self.live.get(&next)
                    {
                        self.ready.insert((n.due, next));
                    }
                }
            }
        }
        Some(l)
    }

    /// The leased `seq` is due again at `due`.
    fn release(&mut self, seq: u64, due: Instant) {
        if self.leased.remove(&seq)
            && let Some(l) = self.live.get_mut(&seq)
        {
            l.due = due;
            self.ready.insert((due, seq));
        }
    }
}

/// A change for the writer thread.
/// One message of an [`Op::Append`]: its sequence number, metadata and record.
struct Appended {
    seq: u64,
    meta: MetaRecord,
    message: Vec<u8>,
}

enum Op {
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

impl Drop for Embedded {
    fn drop(&mut self) {
        self.close();
    }
}

fn read_message(db: &Database, seq: u64) -> Result<(Message, Vec<TryRecord>), String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let msgs = txn.open_table(MESSAGES).map_err(|e| e.to_string())?;
    let tries = txn.open_table(TRIES).map_err(|e| e.to_string())?;
    let m = msgs
        .get(seq)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("message {seq} is missing from the store"))?;
    let m = record::decode_message(m.value()).map_err(|e| format!("message {seq}: {e}"))?;
    let t = match tries.get(seq).map_err(|e| e.to_string())? {
        Some(t) => record::decode_tries(t.value()).map_err(|e| format!("message {seq}: {e}"))?,
        None => Vec::new(),
    };
    Ok((m, t))
}

/// Creates the tables if missing and reads the index.
fn load(db: &Database, spec: &QueueSpec) -> Result<(u32, Index), String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("{what}: {err}");
    let txn = db.begin_write().map_err(|x| e("cannot write", &x))?;
    let uid = {
        let mut info = txn.open_table(INFO).map_err(|x| e("table info", &x))?;
        let got = info.get("uid").map_err(|x| e("table info", &x))?.map(|v| v.value());
        match got {
            Some(u) => u as u32,
            None => {
                let u = (rondo_core::hash::hash_key(
                    format!("{}/{}/{:?}", spec.name, std::process::id(), Instant::now()).as_bytes(),
                ) ^ unix_ms()) as u32;
                info.insert("uid", u64::from(u)).map_err(|x| e("table info", &x))?;
                u
            }
        }
    };
    for t in [META, MESSAGES, TRIES] {
        txn.open_table(t).map_err(|x| e("table", &x))?;
    }
    txn.open_table(DEAD).map_err(|x| e("table dead", &x))?;
    txn.commit().map_err(|x| e("cannot commit", &x))?;

    let txn = db.begin_read().map_err(|x| e("cannot read", &x))?;
    let info = txn.open_table(INFO).map_err(|x| e("table info", &x))?;
    let meta = txn.open_table(META).map_err(|x| e("table meta", &x))?;
    let msgs = txn.open_table(MESSAGES).map_err(|x| e("table messages", &x))?;
    let tries = txn.open_table(TRIES).map_err(|x| e("table tries", &x))?;
    let dead = txn.open_table(DEAD).map_err(|x| e("table dead", &x))?;
    let mut index = Index {
        next_seq: info.get("next_seq").map_err(|x| e("table info", &x))?.map_or(1, |v| v.value()),
        ..Index::default()
    };
    let now = Instant::now();
    let mut last = 0;
    for row in meta.iter().map_err(|x| e("table meta", &x))? {
        let (k, v) = row.map_err(|x| e("table meta", &x))?;
        let seq = k.value();
        last = seq;
        let m = record::decode_meta(v.value()).map_err(|x| format!("message {seq}: {x}"))?;
        if msgs.get(seq).map_err(|x| e("table messages", &x))?.is_none() {
            return Err(format!("message {seq} has metadata but no content"));
        }
        let t = match tries.get(seq).map_err(|x| e("table tries", &x))? {
            Some(t) => {
                record::decode_tries(t.value()).map_err(|x| format!("message {seq}: {x}"))?
            }
            None => Vec::new(),
        };
        index.count += 1;
        index.bytes += m.size;
        let attempts = t.len() as u32;
        match dead.get(seq).map_err(|x| e("table dead", &x))? {
            Some(at) => {
                let last_reason = t.last().map(|t| t.reason.clone()).unwrap_or_default();
                index
                    .dead
                    .insert(seq, Dead { meta: m, attempts, dead_ms: at.value(), last_reason });
            }
            None => {
                index.live.insert(seq, Live { meta: m, attempts, due: now });
            }
        }
    }
    index.next_seq = index.next_seq.max(last + 1);
    let seqs: Vec<u64> = index.live.keys().copied().collect();
    for seq in seqs {
        index.schedule(seq);
    }
    Ok((uid, index))
}

/// The writer thread: batches, one durable commit each, then the answers and the index. After
/// an I/O error, the store is opened again ([`reopen`]) before the next batch.
fn writer(s: Arc<Shared>, rx: mpsc::Receiver<Op>) {
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
fn reconcile(s: &Shared, db: &Database) -> Result<(), String> {
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

fn write_batch(db: &Database, batch: &[Op]) -> Result<(), redb::Error> {
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
        let mut tries = lease.tries;
        tries.push(tried);
        let attempts = tries.len() as u32;
        let t = record::encode_tries(&tries);
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
        let mut tries = lease.tries;
        tries.push(tried);
        let attempts = tries.len() as u32;
        let t = record::encode_tries(&tries);
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
        let id = id.map(str::to_owned);
        Box::pin(async move {
            let seqs = self.dead_seqs(id.as_deref())?;
            let n = seqs.len() as u64;
            if n > 0 {
                self.commit(move |reply| Op::Requeue { seqs, reply }).await?;
            }
            Ok(n)
        })
    }

    fn purge(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        let id = id.map(str::to_owned);
        Box::pin(async move {
            let seqs = self.dead_seqs(id.as_deref())?;
            let n = seqs.len() as u64;
            if n > 0 {
                self.commit(move |reply| Op::Purge { seqs, reply }).await?;
            }
            Ok(n)
        })
    }
}

impl Embedded {
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

#[cfg(test)]
mod tests {
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
        let d =
            std::env::temp_dir().join(format!("rondo-queue-unit-{name}-{}", std::process::id()));
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
        s.shared
            .with_db(|db| write_batch(db, &behind_its_back).map_err(|e| e.to_string()))
            .unwrap();
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
}
