//! The embedded registry: registrations in process memory, each with its own lease, removed
//! when the lease lapses (checked every [`EXPIRY_TICK`]); optionally kept on disk (a snapshot
//! file and an append-only log beside it, `journal`) so that a restarted router comes
//! back with its registrations, each with a fresh lease.
//!
//! Group commit: registrations and deregistrations are queued (at most [`MAX_QUEUE`]) to one
//! writer thread, which takes everything pending (at most [`MAX_BATCH`]), applies it, appends
//! one line holding the batch's changes to the log and syncs it once, swaps in a view in which
//! only the clusters the batch changed are rebuilt, and only then answers every caller of the
//! batch. A success therefore means "visible in lookups and on disk", and a registration costs
//! its own record on disk and its own cluster in the view, never a pass over the whole registry.
//! A service of [`DEFERRED_VIEW_MEMBERS`] registered members or more is the exception: its view
//! is composed after the answers, paced to at most half the writer's time (`Deferred`), so
//! that its registrations stay O(1) amortised; a success there means "on disk, and in lookups
//! within about two compositions of that service's view".
//! Once the log holds as many bytes as the last snapshot (and at least
//! [`DEFAULT_COMPACT_BYTES`]), the batch is written as a whole new snapshot instead (a temporary
//! file, synced, renamed, the directory synced) and the log emptied: a snapshot of N
//! registrations comes after at least N bytes of log, so its cost is amortised over them, and
//! the files stay within about twice the snapshot's size. The first batch of a process is
//! written as a snapshot too (folding in the log it started from).
//!
//! A failed write undoes the batch and answers each caller `Unavailable` (503): nothing is
//! acknowledged that a restart would lose; after a failed append the log's end is unknown, so
//! the next batch goes to a new snapshot. At start the snapshot is read and the log replayed
//! over it, every entry checked as the API checks a registration. The work runs on its own
//! thread, never on the runtime's workers that carry requests, and lookups never take the
//! registry's lock. Keepalives change only a lease's deadline (not written), under the lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rondo_core::wire::Lease;
use rondo_core::{AdminState, Entropy, MemberSpec, SplitMix64};
use rondo_runtime::live::{Registered, RegisteredCluster};
use rondo_runtime::metrics::Metrics;
use rondo_runtime::{Live, probe};
use serde::Deserialize;
use tokio::sync::oneshot;

use crate::journal::{self, Change, SavedRef, SavedRegistration};
use crate::registry::{
    self, Declared, Limits, Registration, RegistryError, RegistryStatus, StartError,
};

/// How often lapsed leases are looked for.
pub const EXPIRY_TICK: Duration = Duration::from_millis(100);
/// Most changes waiting for the writer; more are refused with 503 until it catches up.
pub const MAX_QUEUE: usize = 65_536;
/// Most changes in one batch (one log line, one view).
pub const MAX_BATCH: usize = 8192;
/// The log is folded into a new snapshot once it holds this many bytes, or as many as the last
/// snapshot when that is more.
pub const DEFAULT_COMPACT_BYTES: u64 = 1 << 20;
/// A service with at least this many registered members has its view composed after the
/// batch is answered, paced (see `Deferred`); a smaller one before.
pub const DEFERRED_VIEW_MEMBERS: usize = 1000;

/// The services whose view the writer composes after answering, paced so that composing takes
/// at most half of its time: after a composition that took `t`, the next one waits `t`. A
/// registration into a big service therefore costs its own record on disk plus a share of one
/// composition, and one composition is shared by every change that arrived during the last
/// one and the wait after it (as many as `2t` lets in): O(1) amortised whatever the service's
/// size, where composing before each answer cost a service of 10,000 members ~28 ms per
/// registration made one at a time.
#[derive(Debug, Default)]
struct Deferred {
    /// The services changed since their view was last composed.
    services: BTreeSet<String>,
    /// When they are composed.
    due: Option<Instant>,
    /// No composition before this (the last one's end plus its length).
    not_before: Option<Instant>,
}

impl Deferred {
    fn add(&mut self, service: String, now: Instant) {
        self.services.insert(service);
        if self.due.is_none() {
            self.due = Some(self.not_before.map_or(now, |t| t.max(now)));
        }
    }

    /// How long the writer may wait for a job before the deferred views are due.
    fn wait(&self, now: Instant) -> Duration {
        self.due.map_or(EXPIRY_TICK, |t| t.saturating_duration_since(now).min(EXPIRY_TICK))
    }
}

type Key = (String, String);

/// The in-process registry.
#[derive(Debug)]
pub struct Embedded {
    shared: Arc<Shared>,
    queue: SyncSender<Job>,
    /// What the start found on disk (see [`Embedded::recovery`]).
    recovery: String,
}

/// What the API side and the writer thread share.
#[derive(Debug)]
struct Shared {
    live: Arc<Live>,
    snapshot: Option<PathBuf>,
    limits: Limits,
    state: Mutex<State>,
    stopped: AtomicBool,
    /// Set (and signalled) when the writer thread has ended.
    writer_done: (Mutex<bool>, std::sync::Condvar),
    /// The runtime the probes of a new view are spawned on.
    runtime: tokio::runtime::Handle,
}

#[derive(Debug)]
struct State {
    regs: BTreeMap<Key, Entry>,
    /// Lease id to (cluster, member).
    leases: HashMap<u64, Key>,
    /// Registered members per service (for the caps).
    per_service: HashMap<String, usize>,
    /// The policy a cluster's registrations declared, and how many of them hold it (every
    /// registration of a cluster the configuration lacks holds its cluster's one).
    declared: HashMap<String, (Arc<Declared>, usize)>,
    /// No lease lapses before this (a lower bound: keepalives only push deadlines later).
    next_expiry: Option<Instant>,
    rng: SplitMix64,
    last_error: Option<String>,
}

#[derive(Debug, Clone)]
struct Entry {
    member: MemberSpec,
    /// The policy it declared or joined (none: into a configured cluster).
    policy: Option<Arc<Declared>>,
    lease: u64,
    ttl: Duration,
    expires: Instant,
}

/// A change for the writer, and where its answer goes.
#[derive(Debug)]
enum Job {
    Register(Registration, oneshot::Sender<Result<Lease, RegistryError>>),
    Deregister(Key, oneshot::Sender<Result<(), RegistryError>>),
}

/// An applied change's answer, sent once the batch is durable (or its error).
enum Reply {
    Register(Lease, oneshot::Sender<Result<Lease, RegistryError>>),
    Deregister(oneshot::Sender<Result<(), RegistryError>>),
}

/// The snapshot file's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotFile {
    /// The last log batch it holds (0, or absent: none).
    #[serde(default)]
    seq: u64,
    registrations: Vec<SavedRegistration>,
}

/// The writer thread's files: the snapshot, the log beside it, and where they stand.
#[derive(Debug)]
struct Disk {
    snapshot: PathBuf,
    log: PathBuf,
    /// The last batch number written (to the snapshot or the log).
    seq: u64,
    /// Bytes in the log since the last snapshot.
    log_len: u64,
    /// Bytes of the last snapshot written or read.
    snapshot_len: u64,
    /// The next batch must go to a new snapshot: the first batch of this process (folding the
    /// log it started from, and a torn end), or a failed append left the log's end unknown.
    must_compact: bool,
    /// Memory holds removals (lapsed leases) that no file does yet: write even with no change.
    behind: bool,
    /// The log's least size for a compaction ([`DEFAULT_COMPACT_BYTES`]).
    compact_bytes: u64,
}

impl Embedded {
    /// Starts the registry with the default [`DEFAULT_COMPACT_BYTES`]; see
    /// [`Embedded::start_with`].
    pub fn start(
        live: Arc<Live>,
        snapshot: Option<PathBuf>,
        limits: Limits,
    ) -> Result<Arc<Embedded>, StartError> {
        Self::start_with(live, snapshot, limits, DEFAULT_COMPACT_BYTES)
    }

    /// Starts the registry (loading `snapshot` if the file exists and replaying its log over
    /// it, after removing temporary files a crashed writer left beside it) and its writer
    /// thread; must run inside a tokio runtime. The log is folded into a new snapshot once it
    /// holds `compact_bytes`, or as many bytes as the last snapshot when that is more. Fails,
    /// naming the file, when the snapshot cannot be read or parsed, when an entry fails the
    /// API's checks (naming the entry and what is wrong), or when the log is corrupt before its
    /// last record (naming the byte offset); the files are left untouched. A torn last record of
    /// the log (a crash while it was written: never acknowledged) is ignored and reported.
    pub fn start_with(
        live: Arc<Live>,
        snapshot: Option<PathBuf>,
        limits: Limits,
        compact_bytes: u64,
    ) -> Result<Arc<Embedded>, StartError> {
        let seed = rondo_runtime::clock::now().0 ^ u64::from(std::process::id());
        let mut state = State {
            regs: BTreeMap::new(),
            leases: HashMap::new(),
            per_service: HashMap::new(),
            declared: HashMap::new(),
            next_expiry: None,
            rng: SplitMix64::new(seed),
            last_error: None,
        };
        let mut disk = None;
        let mut recovery = "in memory (no snapshot)".to_owned();
        if let Some(path) = &snapshot {
            remove_stale_temporaries(path);
            let (snapshot_seq, snapshot_len) = load_snapshot(path, &mut state)?;
            let from_snapshot = state.regs.len();
            let log = journal::log_path(path);
            let replay = replay_log(&log, snapshot_seq, &mut state)?;
            recovery = format!(
                "{from_snapshot} registrations from the snapshot (batch {snapshot_seq}), {} \
                 batches replayed from the log ({} already in the snapshot)",
                replay.replayed, replay.skipped
            );
            if let Some((offset, len)) = replay.torn {
                let torn = format!(
                    "naming log {}: torn last record at byte offset {offset} ({len} bytes) \
                     ignored: a crash while it was written, never acknowledged",
                    log.display()
                );
                tracing::warn!("{torn}");
                recovery.push_str("; ");
                recovery.push_str(&torn);
            }
            disk = Some(Disk {
                snapshot: path.clone(),
                log,
                seq: replay.seq.max(snapshot_seq),
                log_len: replay.len,
                snapshot_len,
                must_compact: true,
                behind: false,
                compact_bytes,
            });
        }
        let shared = Arc::new(Shared {
            live,
            snapshot,
            limits,
            state: Mutex::new(state),
            stopped: AtomicBool::new(false),
            writer_done: (Mutex::new(false), std::sync::Condvar::new()),
            runtime: tokio::runtime::Handle::current(),
        });
        {
            let st = shared.lock();
            if !st.regs.is_empty() {
                tracing::info!(registrations = st.regs.len(), "registrations restored: {recovery}");
                let registered = registered(&st);
                drop(st);
                shared.publish_all(registered);
            }
        }
        let (queue, jobs) = std::sync::mpsc::sync_channel(MAX_QUEUE);
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("rondo-registry".to_owned())
            .spawn(move || writer.run(&jobs, disk))
            .map_err(StartError::Thread)?;
        shared.live.metrics.registry_connected.set(1);
        Ok(Arc::new(Embedded { shared, queue, recovery }))
    }

    /// What the start found on disk: registrations from the snapshot, batches replayed from the
    /// log, and a torn last record ignored (with its offset), if any.
    pub fn recovery(&self) -> &str {
        &self.recovery
    }

    fn send<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, RegistryError>>) -> Job,
    ) -> Result<oneshot::Receiver<Result<T, RegistryError>>, RegistryError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(RegistryError::Unavailable("the registry is stopped".to_owned()));
        }
        let (tx, rx) = oneshot::channel();
        match self.queue.try_send(job(tx)) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => Err(RegistryError::Unavailable(format!(
                "the registry's queue is full ({MAX_QUEUE} changes waiting): retry later"
            ))),
            Err(TrySendError::Disconnected(_)) => {
                Err(RegistryError::Unavailable("the registry is stopped".to_owned()))
            }
        }
    }

    /// See [`crate::Registry::register`]: answers once the registration is in the view and
    /// on disk.
    pub async fn register(&self, reg: Registration) -> Result<Lease, RegistryError> {
        let rx = self.send(|tx| Job::Register(reg, tx))?;
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// See [`crate::Registry::keepalive`].
    pub fn keepalive(&self, lease: &str) -> Result<Lease, RegistryError> {
        let id = parse_lease(lease)?;
        let mut st = self.shared.lock();
        let key = st.leases.get(&id).cloned().ok_or_else(|| unknown_lease(lease))?;
        let entry = st.regs.get_mut(&key).ok_or_else(|| unknown_lease(lease))?;
        entry.expires = Instant::now() + entry.ttl;
        Ok(Lease { lease: lease.to_owned(), ttl_ms: entry.ttl.as_millis() as u64 })
    }

    /// See [`crate::Registry::deregister`]: answers once the member is out of the view and
    /// on disk.
    pub async fn deregister(&self, cluster: &str, member: &str) -> Result<(), RegistryError> {
        let key = (cluster.to_owned(), member.to_owned());
        let rx = self.send(|tx| Job::Deregister(key, tx))?;
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// See [`crate::Registry::status`].
    pub fn status(&self) -> RegistryStatus {
        let st = self.shared.lock();
        RegistryStatus {
            backend: "embedded",
            connected: true,
            detail: match &self.shared.snapshot {
                Some(p) => {
                    format!("snapshot {}, log {}", p.display(), journal::log_path(p).display())
                }
                None => "in memory (no snapshot)".to_owned(),
            },
            last_error: st.last_error.clone(),
            registrations: st.regs.len(),
            resyncs: 0,
        }
    }

    /// Stops the writer thread (pending changes are answered `Unavailable`).
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
    }

    /// Stops the writer thread and waits (at most `timeout`) until its batch in progress is on
    /// disk and it has ended, so that another process can open the files (a hitless upgrade's
    /// hand-off). Returns whether it ended in time.
    pub fn release(&self, timeout: std::time::Duration) -> bool {
        self.stop();
        let (done, ended) = &self.shared.writer_done;
        let done = done.lock().unwrap_or_else(|e| e.into_inner());
        let (done, _) =
            ended.wait_timeout_while(done, timeout, |d| !*d).unwrap_or_else(|e| e.into_inner());
        *done
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer thread: a batch whenever changes are pending, and lapsed leases looked for
    /// every [`EXPIRY_TICK`]; ends when stopped or when the registry is dropped.
    fn run(&self, jobs: &Receiver<Job>, mut disk: Option<Disk>) {
        /// Says the writer ended, however it ends.
        struct Ended<'a>(&'a (Mutex<bool>, std::sync::Condvar));
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                *self.0.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
                self.0.1.notify_all();
            }
        }
        let _ended = Ended(&self.writer_done);
        let mut deferred = Deferred::default();
        loop {
            if deferred.due.is_some_and(|t| t <= Instant::now()) {
                self.publish_deferred(&mut deferred);
            }
            // Freed here, not on a request thread that held the last old snapshot.
            self.live.reap_retired();
            let first = match jobs.recv_timeout(deferred.wait(Instant::now())) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut batch: Vec<Job> = first.into_iter().collect();
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if self.stopped.load(Ordering::Acquire) {
                // Dropping the jobs answers their callers with `Unavailable`.
                return;
            }
            self.commit(disk.as_mut(), batch, Instant::now(), &mut deferred);
        }
    }

    /// Composes the view of the services [`Deferred`] holds, as they are now.
    fn publish_deferred(&self, deferred: &mut Deferred) {
        let started = Instant::now();
        let services = std::mem::take(&mut deferred.services);
        deferred.due = None;
        let st = self.lock();
        let updates: Vec<(String, RegisteredCluster)> = services
            .into_iter()
            .map(|c| {
                let members = members_of(&st, &c);
                (c, members)
            })
            .collect();
        let count = st.regs.len();
        drop(st);
        let clusters = updates.len();
        self.publish(updates, count);
        let took = started.elapsed();
        deferred.not_before = Some(Instant::now() + took);
        tracing::debug!(clusters, publish_us = took.as_micros() as u64, "deferred views composed");
    }

    /// One batch: lapsed leases out, the changes in (with what each replaced, to undo them),
    /// one log line (or a new snapshot), one view of the clusters it changed; then every
    /// answer.
    fn commit(
        &self,
        mut disk: Option<&mut Disk>,
        batch: Vec<Job>,
        now: Instant,
        deferred: &mut Deferred,
    ) {
        let mut st = self.lock();
        let lapsed = expire(&mut st, now);
        let mut undo: Vec<(Key, Option<Entry>)> = Vec::with_capacity(batch.len());
        let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
        // The batch's log records, and the clusters whose member lists it changed.
        let mut changes: Vec<String> = Vec::with_capacity(batch.len() + lapsed.len());
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for key in &lapsed {
            changes.push(journal::del(&key.0, &key.1));
            touched.insert(key.0.clone());
        }
        for job in batch {
            match job {
                Job::Register(reg, tx) => match self.apply_register(&mut st, reg, now) {
                    Ok((key, old, lease)) => {
                        if let Some(e) = st.regs.get(&key) {
                            changes.push(journal::put(saved(&key.0, e)));
                        }
                        touched.insert(key.0.clone());
                        undo.push((key, old));
                        replies.push(Reply::Register(lease, tx));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                },
                Job::Deregister(key, tx) => match remove(&mut st, &key) {
                    Some(old) => {
                        tracing::info!(cluster = key.0, member = key.1, "member deregistered");
                        changes.push(journal::del(&key.0, &key.1));
                        touched.insert(key.0.clone());
                        undo.push((key, Some(old)));
                        replies.push(Reply::Deregister(tx));
                    }
                    None => {
                        let _ = tx.send(Err(RegistryError::NotFound(format!(
                            "no registered member `{}` in service `{}`",
                            key.1, key.0
                        ))));
                    }
                },
            }
        }
        let behind = disk.as_ref().is_some_and(|d| d.behind);
        if changes.is_empty() && !behind {
            return;
        }
        let t0 = Instant::now();
        // What goes to disk: a new snapshot when one is due (made under the lock: it reads
        // every registration), else the batch's line (made after it).
        let plan = disk.as_ref().map(|d| {
            let seq = d.seq + 1;
            let snapshot = d.compaction_due().then(|| snapshot_text(&st, seq));
            (seq, snapshot)
        });
        drop(st);
        let mut compaction_error = None;
        let mut written = Ok(0);
        if let (Some(d), Some((seq, snapshot))) = (disk.as_deref_mut(), plan) {
            written = match snapshot {
                Some(text) => match d.compact(&text, &self.live.metrics) {
                    Ok(()) => Ok(text.len()),
                    Err(e) if d.must_compact || d.behind => Err(e),
                    Err(e) => {
                        // The log is sound: the batch goes there, and the next one tries again.
                        tracing::warn!("{e}: appending to the log instead");
                        compaction_error = Some(e);
                        let line = journal::line(seq, &changes);
                        d.append(&line, &self.live.metrics).map(|()| line.len())
                    }
                },
                None => {
                    let line = journal::line(seq, &changes);
                    d.append(&line, &self.live.metrics).map(|()| line.len())
                }
            };
            // A failed batch's number is not used again: its line may be partly on disk.
            d.seq = seq;
        }
        let t1 = Instant::now();
        match written {
            Ok(bytes) => {
                let mut st = self.lock();
                st.last_error = compaction_error;
                // A big service's view is composed after the answers, paced; a small one's now
                // (and out of the deferred ones: this composition is the latest).
                let mut updates: Vec<(String, RegisteredCluster)> = Vec::new();
                for c in touched {
                    if st.per_service.get(&c).copied().unwrap_or(0) >= DEFERRED_VIEW_MEMBERS {
                        deferred.add(c, t1);
                    } else {
                        deferred.services.remove(&c);
                        let members = members_of(&st, &c);
                        updates.push((c, members));
                    }
                }
                let count = st.regs.len();
                drop(st);
                let clusters = updates.len();
                self.publish(updates, count);
                tracing::debug!(
                    changes = changes.len(),
                    registrations = count,
                    clusters,
                    bytes,
                    write_us = (t1 - t0).as_micros() as u64,
                    publish_us = t1.elapsed().as_micros() as u64,
                    "batch committed"
                );
                for reply in replies {
                    match reply {
                        Reply::Register(lease, tx) => {
                            let _ = tx.send(Ok(lease));
                        }
                        Reply::Deregister(tx) => {
                            let _ = tx.send(Ok(()));
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!("{e}");
                let mut st = self.lock();
                for (key, old) in undo.into_iter().rev() {
                    remove(&mut st, &key);
                    if let Some(old) = old {
                        insert(&mut st, key, old);
                    }
                }
                st.last_error = Some(e.clone());
                // Lapsed leases stay out of memory; the files catch up at the next write.
                let mut updates = Vec::new();
                if !lapsed.is_empty() {
                    if let Some(d) = disk {
                        d.behind = true;
                    }
                    let clusters: BTreeSet<&String> = lapsed.iter().map(|k| &k.0).collect();
                    for c in clusters {
                        updates.push((c.clone(), members_of(&st, c)));
                    }
                }
                let count = st.regs.len();
                drop(st);
                if !updates.is_empty() {
                    self.publish(updates, count);
                }
                let error =
                    || RegistryError::Unavailable(format!("{e}: the change was not made, retry"));
                for reply in replies {
                    match reply {
                        Reply::Register(_, tx) => {
                            let _ = tx.send(Err(error()));
                        }
                        Reply::Deregister(tx) => {
                            let _ = tx.send(Err(error()));
                        }
                    }
                }
            }
        }
    }

    /// Puts `reg` in with a new lease (replacing the member's registration if it has one);
    /// returns its key, what it replaced and the lease.
    fn apply_register(
        &self,
        st: &mut State,
        reg: Registration,
        now: Instant,
    ) -> Result<(Key, Option<Entry>, Lease), RegistryError> {
        let key = (reg.cluster.clone(), reg.member.name.clone());
        if !st.regs.contains_key(&key) {
            let in_service = st.per_service.get(&reg.cluster).copied().unwrap_or(0);
            self.limits.check(&reg.cluster, in_service, st.regs.len())?;
        }
        let old = remove(st, &key);
        // Settled against the others' policy: the member's own old registration is out.
        let current = st.declared.get(&reg.cluster).map(|(d, _)| d);
        let policy = match registry::settle(&reg.cluster, &reg.policy, current) {
            Ok(p) => p,
            Err(e) => {
                if let Some(old) = old {
                    insert(st, key, old);
                }
                return Err(e);
            }
        };
        let lease = loop {
            let id = st.rng.next_u64() >> 1;
            if id != 0 && !st.leases.contains_key(&id) {
                break id;
            }
        };
        let member = MemberSpec { admin: AdminState::Active, ..reg.member };
        tracing::info!(
            cluster = reg.cluster,
            member = member.name,
            address = member.address,
            ttl_ms = reg.ttl.as_millis() as u64,
            "member registered"
        );
        let entry = Entry { member, policy, lease, ttl: reg.ttl, expires: now + reg.ttl };
        insert(st, key.clone(), entry);
        Ok((key, old, Lease { lease: lease.to_string(), ttl_ms: reg.ttl.as_millis() as u64 }))
    }

    /// Swaps the changed clusters' registered members into the live view (lookups see them
    /// when this returns); every other cluster keeps its runtime.
    fn publish(&self, updates: Vec<(String, RegisteredCluster)>, count: usize) {
        self.live.metrics.registrations.set(count as i64);
        if updates.is_empty() {
            return;
        }
        let (_, built) = self.live.update_registered(updates);
        let _runtime = self.runtime.enter();
        probe::spawn_clusters(&built);
    }

    /// Swaps every registration into the live view (at start).
    fn publish_all(&self, registered: (Registered, usize)) {
        let (registered, count) = registered;
        self.live.metrics.registrations.set(count as i64);
        let snapshot = self.live.set_registered(registered);
        let _runtime = self.runtime.enter();
        probe::spawn(&snapshot);
    }
}

impl Disk {
    /// Whether the next batch goes to a new snapshot rather than the log.
    fn compaction_due(&self) -> bool {
        self.must_compact
            || self.behind
            || self.log_len >= self.compact_bytes.max(self.snapshot_len)
    }

    /// Writes `text` (every registration, through the batch it names) as the new snapshot, then
    /// empties the log (all of it is in the snapshot now; a crash between the two leaves lines
    /// the snapshot's batch number makes the replay skip).
    fn compact(&mut self, text: &str, metrics: &Metrics) -> Result<(), String> {
        save_snapshot(&self.snapshot, text)?;
        metrics.registry_bytes_written.inc_by(text.len() as u64);
        metrics.registry_compactions.inc();
        self.snapshot_len = text.len() as u64;
        self.behind = false;
        self.must_compact = false;
        match empty_log(&self.log) {
            Ok(()) => self.log_len = 0,
            Err(e) => {
                // Its lines are in the snapshot; what is appended after them must not follow
                // an unknown end: the next batch tries again.
                tracing::warn!("naming log {}: cannot empty it: {e}", self.log.display());
                self.must_compact = true;
            }
        }
        Ok(())
    }

    /// Appends `line` to the log and syncs it. On failure the log is cut back to where it was
    /// (as far as that works) and the next batch goes to a new snapshot.
    fn append(&mut self, line: &[u8], metrics: &Metrics) -> Result<(), String> {
        use std::io::Write;
        let log = &self.log;
        let fail = |e: std::io::Error| format!("naming log {}: cannot write: {e}", log.display());
        // Opened per batch (one open and close beside the write and the sync), so the log is
        // the file at its path now, whatever happened to it.
        let mut file = match std::fs::OpenOptions::new().append(true).open(log) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(log)
                    .map_err(fail)?;
                sync_parent(log).map_err(fail)?;
                f
            }
            Err(e) => return Err(fail(e)),
        };
        let before = file.metadata().map_err(fail)?.len();
        match file.write_all(line).and_then(|()| file.sync_data()) {
            Ok(()) => {
                self.log_len = before + line.len() as u64;
                metrics.registry_bytes_written.inc_by(line.len() as u64);
                Ok(())
            }
            Err(e) => {
                self.must_compact = true;
                let _ = file.set_len(before).and_then(|()| file.sync_data());
                Err(fail(e))
            }
        }
    }
}

fn stopped() -> RegistryError {
    RegistryError::Unavailable("the registry is stopped".to_owned())
}

fn insert(st: &mut State, key: Key, entry: Entry) {
    st.leases.insert(entry.lease, key.clone());
    *st.per_service.entry(key.0.clone()).or_default() += 1;
    if let Some(p) = &entry.policy {
        st.declared.entry(key.0.clone()).or_insert_with(|| (p.clone(), 0)).1 += 1;
    }
    st.next_expiry = Some(st.next_expiry.map_or(entry.expires, |t| t.min(entry.expires)));
    st.regs.insert(key, entry);
}

fn remove(st: &mut State, key: &Key) -> Option<Entry> {
    let old = st.regs.remove(key)?;
    st.leases.remove(&old.lease);
    if old.policy.is_some()
        && let Some((_, n)) = st.declared.get_mut(&key.0)
    {
        *n -= 1;
        if *n == 0 {
            st.declared.remove(&key.0);
        }
    }
    if let Some(n) = st.per_service.get_mut(&key.0) {
        *n -= 1;
        if *n == 0 {
            st.per_service.remove(&key.0);
        }
    }
    Some(old)
}

/// Removes every registration whose lease lapsed by `now`; returns their keys.
fn expire(st: &mut State, now: Instant) -> Vec<Key> {
    if st.next_expiry.is_none_or(|t| t > now) {
        return Vec::new();
    }
    // A pass over every lease, at most once per tick and only once the earliest deadline
    // known passed (keepalives only push deadlines later, so it is a lower bound).
    let lapsed: Vec<Key> =
        st.regs.iter().filter(|(_, e)| e.expires <= now).map(|(k, _)| k.clone()).collect();
    for key in &lapsed {
        remove(st, key);
        tracing::info!(cluster = key.0, member = key.1, "lease lapsed: member removed");
    }
    st.next_expiry = st.regs.values().map(|e| e.expires).min();
    lapsed
}

/// The registered members by cluster, and their number.
fn registered(st: &State) -> (Registered, usize) {
    let mut registered = Registered::new();
    for ((cluster, _), e) in &st.regs {
        registered.entry(cluster.clone()).or_default().members.push(e.member.clone());
    }
    for (cluster, reg) in &mut registered {
        reg.declared = declared_of(st, cluster);
    }
    (registered, st.regs.len())
}

/// The registered members of `cluster`, in name order (a range of the map: the cluster's
/// size, not the registry's), and the cluster they declared.
fn members_of(st: &State, cluster: &str) -> RegisteredCluster {
    let members = st
        .regs
        .range((cluster.to_owned(), String::new())..)
        .take_while(|((c, _), _)| c == cluster)
        .enumerate()
        .map(|(i, (_, e))| {
            rondo_runtime::live::yield_now_and_then(i);
            e.member.clone()
        })
        .collect();
    RegisteredCluster { members, declared: declared_of(st, cluster) }
}

/// The cluster `cluster`'s registrations declared, if they did.
fn declared_of(st: &State, cluster: &str) -> Option<Arc<rondo_core::ClusterSpec>> {
    st.declared.get(cluster).map(|(d, _)| d.spec.clone())
}

/// `e` of `cluster` as the snapshot and the log store it.
fn saved<'a>(cluster: &'a str, e: &'a Entry) -> SavedRef<'a> {
    SavedRef {
        cluster,
        name: &e.member.name,
        address: &e.member.address,
        weight: e.member.weight,
        group: e.member.group.as_deref(),
        ttl_ms: e.ttl.as_millis() as u64,
        lease: e.lease.to_string(),
        policy: e.policy.as_ref().map(|p| &p.raw),
    }
}

fn parse_lease(lease: &str) -> Result<u64, RegistryError> {
    lease
        .parse()
        .map_err(|_| RegistryError::Invalid(format!("lease id `{lease}` is not a decimal number")))
}

fn unknown_lease(lease: &str) -> RegistryError {
    RegistryError::NotFound(format!("no lease `{lease}` (it lapsed or was never granted)"))
}

/// The temporary file a writer with process id `pid` uses for `path`: `registry.json` writes
/// `registry.tmp.<pid>` first.
fn temporary(path: &Path, pid: u32) -> PathBuf {
    path.with_extension(format!("tmp.{pid}"))
}

/// Removes the [`temporary`] files beside the snapshot: a writer that crashed between creating
/// and renaming one left it (the snapshot itself is whole either way).
fn remove_stale_temporaries(path: &Path) {
    let Some(name) = path.file_stem().and_then(|n| n.to_str()) else { return };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let prefix = format!("{name}.tmp.");
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else { continue };
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stale = e.path();
        let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir(&stale)
        } else {
            std::fs::remove_file(&stale)
        };
        match removed {
            Ok(()) => tracing::info!(file = %stale.display(), "stale snapshot temporary removed"),
            Err(e) => {
                tracing::warn!(file = %stale.display(), "cannot remove stale snapshot temporary: {e}")
            }
        }
    }
}

/// A stored registration checked as the API checks one, with a fresh lease deadline.
fn restore(r: SavedRegistration, now: Instant) -> Result<(Key, Entry), String> {
    let ttl = Duration::from_millis(r.ttl_ms);
    registry::check_name("service", &r.cluster)
        .and_then(|()| registry::check_name("member", &r.name))
        .and_then(|()| registry::check_address(&r.address))
        .and_then(|()| registry::check_weight(r.weight))
        .and_then(|()| {
            r.group.as_deref().map_or(Ok(()), |g| registry::check_name("field `group`", g))
        })
        .and_then(|()| registry::check_ttl(ttl))?;
    let lease = match r.lease.parse::<u64>() {
        Ok(l) if l != 0 => l,
        _ => return Err(format!("lease `{}` is not a non-zero number", r.lease)),
    };
    let policy = match r.policy {
        Some(raw) => Some(Arc::new(Declared::compile(&r.cluster, raw)?)),
        None => None,
    };
    let key = (r.cluster, r.name.clone());
    let member = MemberSpec {
        name: r.name,
        address: r.address,
        weight: r.weight,
        group: r.group,
        admin: AdminState::Active,
    };
    Ok((key, Entry { member, policy, lease, ttl, expires: now + ttl }))
}

/// Reads the snapshot, checking every entry as the API checks a registration; returns the last
/// log batch it holds and its size in bytes (0 and 0 when there is no file).
fn load_snapshot(path: &Path, st: &mut State) -> Result<(u64, u64), StartError> {
    let failed = |reason: String| StartError::Snapshot { path: path.to_owned(), reason };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(failed(format!("cannot read: {e}"))),
    };
    let file: SnapshotFile =
        serde_json::from_str(&text).map_err(|e| failed(format!("invalid: {e}")))?;
    let now = Instant::now();
    for (i, r) in file.registrations.into_iter().enumerate() {
        let what = format!("registrations[{i}] (`{}` in `{}`)", r.name, r.cluster);
        let bad = |why: String| failed(format!("{what}: {why}"));
        let (key, entry) = restore(r, now).map_err(bad)?;
        if st.leases.contains_key(&entry.lease) {
            return Err(bad(format!("lease `{}` is used twice", entry.lease)));
        }
        if st.regs.contains_key(&key) {
            return Err(bad("the member is registered twice".to_owned()));
        }
        insert(st, key, entry);
    }
    Ok((file.seq, text.len() as u64))
}

/// What replaying the log found.
#[derive(Debug, Default)]
struct Replay {
    /// The last batch in the log (0: none).
    seq: u64,
    /// The log's bytes up to its torn end, if any.
    len: u64,
    replayed: usize,
    /// Batches the snapshot already holds (a crash between a snapshot and emptying the log).
    skipped: usize,
    /// A torn last record: its offset and length.
    torn: Option<(u64, u64)>,
}

/// Replays the log `path` (if it exists) over the snapshot holding batches up to
/// `snapshot_seq`, checking every registration as the API does.
fn replay_log(path: &Path, snapshot_seq: u64, st: &mut State) -> Result<Replay, StartError> {
    let failed = |offset: u64, reason: String| StartError::Log {
        path: path.to_owned(),
        offset,
        reason: format!("record at byte offset {offset}: {reason}"),
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Replay::default()),
        Err(e) => {
            let reason = format!("cannot read: {e}");
            return Err(StartError::Log { path: path.to_owned(), offset: 0, reason });
        }
    };
    let read = journal::read(&bytes).map_err(|c| failed(c.offset, c.reason))?;
    let mut replay = Replay {
        len: read.torn.map_or(bytes.len() as u64, |(offset, _)| offset),
        torn: read.torn,
        ..Replay::default()
    };
    let now = Instant::now();
    for record in read.records {
        replay.seq = record.seq;
        if record.seq <= snapshot_seq {
            replay.skipped += 1;
            continue;
        }
        replay.replayed += 1;
        for (i, change) in record.changes.into_iter().enumerate() {
            match change {
                Change::Put(r) => {
                    let what = format!(
                        "batch {}, change {i} (`{}` in `{}`)",
                        record.seq, r.name, r.cluster
                    );
                    let bad = |why: String| failed(record.offset, format!("{what}: {why}"));
                    let (key, entry) = restore(r, now).map_err(bad)?;
                    remove(st, &key);
                    if st.leases.contains_key(&entry.lease) {
                        return Err(bad(format!("lease `{}` is used twice", entry.lease)));
                    }
                    insert(st, key, entry);
                }
                Change::Del { cluster, name } => {
                    remove(st, &(cluster, name));
                }
            }
        }
    }
    Ok(replay)
}

/// The snapshot's text, holding batches up to `seq`: JSON, one registration per line.
fn snapshot_text(st: &State, seq: u64) -> String {
    let mut text = String::with_capacity(64 + st.regs.len() * 160);
    text.push_str(&format!("{{\"seq\": {seq}, \"registrations\": ["));
    for (i, ((cluster, _), e)) in st.regs.iter().enumerate() {
        text.push_str(if i == 0 { "\n  " } else { ",\n  " });
        // Borrowed: no copy of the strings for each entry of each write. Plain strings and
        // numbers into a String: serialising cannot fail.
        if let Ok(line) = serde_json::to_string(&saved(cluster, e)) {
            text.push_str(&line);
        }
    }
    text.push_str("\n]}\n");
    text
}

/// Durable and atomic: a temporary file of this process, synced, renamed over the snapshot,
/// and the directory synced, so a crash leaves the old snapshot or the new one, whole.
fn save_snapshot(path: &Path, text: &str) -> Result<(), String> {
    let tmp = temporary(path, std::process::id());
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_parent(path)
    };
    write().map_err(|e| {
        // A temporary left by a failed write (the rename failed) goes now, not at next start.
        let _ = std::fs::remove_file(&tmp);
        format!("naming snapshot {}: cannot write: {e}", path.display())
    })
}

/// Empties the log (if there is one) and syncs it.
fn empty_log(log: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(log) {
        Ok(f) => {
            f.set_len(0)?;
            f.sync_all()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Syncs the directory holding `path` (a rename or a new file in it made durable).
fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => std::fs::File::open(".")?.sync_all(),
    }
}
