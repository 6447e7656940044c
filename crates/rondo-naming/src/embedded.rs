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

mod disk;
mod state;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rondo_core::SplitMix64;
use rondo_core::wire::Lease;
use rondo_runtime::Registrations;
use rondo_runtime::metrics::Metrics;

use crate::NamingParts;
use tokio::sync::oneshot;

use self::disk::{Disk, load_snapshot, remove_stale_temporaries, replay_log};
use self::state::{State, registered};
use self::writer::Job;
use crate::journal;
use crate::registry::{Limits, Registration, RegistryError, RegistryStatus, StartError};

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
    /// The registered members' layer of the view, which it feeds.
    registrations: Registrations,
    metrics: Arc<Metrics>,
    snapshot: Option<PathBuf>,
    limits: Limits,
    state: Mutex<State>,
    stopped: AtomicBool,
    /// Set (and signalled) when the writer thread has ended.
    writer_done: (Mutex<bool>, std::sync::Condvar),
    /// The runtime the probes of a new view are spawned on.
    runtime: tokio::runtime::Handle,
}

impl Embedded {
    /// Starts the registry with the default [`DEFAULT_COMPACT_BYTES`]; see
    /// [`Embedded::start_with`].
    pub fn start(
        parts: &NamingParts,
        snapshot: Option<PathBuf>,
        limits: Limits,
    ) -> Result<Arc<Embedded>, StartError> {
        Self::start_with(parts, snapshot, limits, DEFAULT_COMPACT_BYTES)
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
        parts: &NamingParts,
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
            registrations: parts.registrations.clone(),
            metrics: parts.metrics.clone(),
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
        shared.metrics.registry_connected.set(1);
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
}

fn stopped() -> RegistryError {
    RegistryError::Unavailable("the registry is stopped".to_owned())
}

fn parse_lease(lease: &str) -> Result<u64, RegistryError> {
    lease
        .parse()
        .map_err(|_| RegistryError::Invalid(format!("lease id `{lease}` is not a decimal number")))
}

fn unknown_lease(lease: &str) -> RegistryError {
    RegistryError::NotFound(format!("no lease `{lease}` (it lapsed or was never granted)"))
}
