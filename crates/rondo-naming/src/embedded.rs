//! The embedded registry: registrations in process memory, each with its own lease, removed
//! when the lease lapses (checked every [`EXPIRY_TICK`]); optionally written to a snapshot file
//! so that a restarted router comes back with its registrations, each with a fresh lease.
//!
//! Group commit: registrations and deregistrations are queued (at most [`MAX_QUEUE`]) to one
//! writer thread, which takes everything pending (at most [`MAX_BATCH`]), applies it, writes the
//! snapshot once (a temporary file, synced, renamed, the directory synced), publishes the view
//! once, and only then answers every caller of the batch. A success therefore means "visible in
//! lookups and on disk", and the cost of a registration is one batch's work (one view of the
//! whole registry, one write of the whole file: linear in the registry) divided by the batch's
//! size, the number of changes that arrived while the previous batch was committed. A failed
//! write undoes the batch and answers each caller
//! `Unavailable` (503): nothing is acknowledged that a restart would lose. The work runs on its
//! own thread, never on the runtime's workers that carry requests, and lookups never take the
//! registry's lock. Keepalives change only a lease's deadline (not written), under the lock.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rondo_core::wire::Lease;
use rondo_core::{AdminState, Entropy, MemberSpec, SplitMix64};
use rondo_runtime::live::Registered;
use rondo_runtime::{Live, probe};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::registry::{self, Limits, Registration, RegistryError, RegistryStatus, StartError};

/// How often lapsed leases are looked for.
pub const EXPIRY_TICK: Duration = Duration::from_millis(100);
/// Most changes waiting for the writer; more are refused with 503 until it catches up.
pub const MAX_QUEUE: usize = 65_536;
/// Most changes in one batch (one snapshot write, one view).
pub const MAX_BATCH: usize = 8192;

type Key = (String, String);

/// The in-process registry.
#[derive(Debug)]
pub struct Embedded {
    shared: Arc<Shared>,
    queue: SyncSender<Job>,
}

/// What the API side and the writer thread share.
#[derive(Debug)]
struct Shared {
    live: Arc<Live>,
    snapshot: Option<PathBuf>,
    limits: Limits,
    state: Mutex<State>,
    stopped: AtomicBool,
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
    /// No lease lapses before this (a lower bound: keepalives only push deadlines later).
    next_expiry: Option<Instant>,
    rng: SplitMix64,
    last_error: Option<String>,
    /// The snapshot file is behind memory (a write failed after leases lapsed): write again.
    dirty: bool,
}

#[derive(Debug, Clone)]
struct Entry {
    member: MemberSpec,
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
    registrations: Vec<SavedRegistration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRegistration {
    cluster: String,
    name: String,
    address: String,
    weight: u32,
    group: Option<String>,
    ttl_ms: u64,
    lease: String,
}

/// [`SavedRegistration`] borrowed from memory, for writing.
#[derive(Serialize)]
struct SavedRef<'a> {
    cluster: &'a str,
    name: &'a str,
    address: &'a str,
    weight: u32,
    group: Option<&'a str>,
    ttl_ms: u64,
    lease: String,
}

impl Embedded {
    /// Starts the registry (loading `snapshot` if the file exists, after removing temporary
    /// files a crashed writer left beside it) and its writer thread; must run inside a tokio
    /// runtime. Fails, naming the file, when the snapshot cannot be read or parsed, or when an
    /// entry fails the API's checks (naming the entry and what is wrong); the file is left
    /// untouched.
    pub fn start(
        live: Arc<Live>,
        snapshot: Option<PathBuf>,
        limits: Limits,
    ) -> Result<Arc<Embedded>, StartError> {
        let seed = rondo_runtime::clock::now().0 ^ u64::from(std::process::id());
        let mut state = State {
            regs: BTreeMap::new(),
            leases: HashMap::new(),
            per_service: HashMap::new(),
            next_expiry: None,
            rng: SplitMix64::new(seed),
            last_error: None,
            dirty: false,
        };
        if let Some(path) = &snapshot {
            remove_stale_temporaries(path);
            load_snapshot(path, &mut state)?;
        }
        let shared = Arc::new(Shared {
            live,
            snapshot,
            limits,
            state: Mutex::new(state),
            stopped: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
        });
        {
            let st = shared.lock();
            if !st.regs.is_empty() {
                tracing::info!(
                    registrations = st.regs.len(),
                    "registrations restored from snapshot"
                );
                let registered = registered(&st);
                drop(st);
                shared.publish(registered);
            }
        }
        let (queue, jobs) = std::sync::mpsc::sync_channel(MAX_QUEUE);
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("rondo-registry".to_owned())
            .spawn(move || writer.run(&jobs))
            .map_err(StartError::Thread)?;
        shared.live.metrics.registry_connected.set(1);
        Ok(Arc::new(Embedded { shared, queue }))
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

    /// See [`crate::Registry::deregister`]: answers once the member is out of the view and of
    /// the snapshot.
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
                Some(p) => format!("snapshot {}", p.display()),
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
    fn run(&self, jobs: &Receiver<Job>) {
        loop {
            let first = match jobs.recv_timeout(EXPIRY_TICK) {
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
            self.commit(batch, Instant::now());
        }
    }

    /// One batch: lapsed leases out, the changes in (with what each replaced, to undo them),
    /// one snapshot write, one view; then every answer.
    fn commit(&self, batch: Vec<Job>, now: Instant) {
        let mut st = self.lock();
        let expired = expire(&mut st, now);
        let mut undo: Vec<(Key, Option<Entry>)> = Vec::with_capacity(batch.len());
        let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
        for job in batch {
            match job {
                Job::Register(reg, tx) => match self.apply_register(&mut st, reg, now) {
                    Ok((key, old, lease)) => {
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
        if !expired && undo.is_empty() && !st.dirty {
            return;
        }
        let t0 = Instant::now();
        let text = self.snapshot.as_ref().map(|_| snapshot_text(&st));
        let published = registered(&st);
        let count = st.regs.len();
        drop(st);
        let t1 = Instant::now();
        let written = match (&self.snapshot, text) {
            (Some(path), Some(text)) => save_snapshot(path, &text),
            _ => Ok(()),
        };
        let t2 = Instant::now();
        match written {
            Ok(()) => {
                let mut st = self.lock();
                st.last_error = None;
                st.dirty = false;
                drop(st);
                self.publish(published);
                tracing::debug!(
                    changes = undo.len(),
                    registrations = count,
                    encode_us = (t1 - t0).as_micros() as u64,
                    write_us = (t2 - t1).as_micros() as u64,
                    publish_us = t2.elapsed().as_micros() as u64,
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
                // Lapsed leases stay out of memory; the file catches up at the next write.
                st.dirty = true;
                let published = expired.then(|| registered(&st));
                drop(st);
                if let Some(p) = published {
                    self.publish(p);
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
        let entry = Entry { member, lease, ttl: reg.ttl, expires: now + reg.ttl };
        insert(st, key.clone(), entry);
        Ok((key, old, Lease { lease: lease.to_string(), ttl_ms: reg.ttl.as_millis() as u64 }))
    }

    /// Swaps the registrations into the live view (lookups see them when this returns).
    fn publish(&self, registered: (Registered, usize)) {
        let (registered, count) = registered;
        self.live.metrics.registrations.set(count as i64);
        let snapshot = self.live.set_registered(registered);
        let _runtime = self.runtime.enter();
        probe::spawn(&snapshot);
    }
}

fn stopped() -> RegistryError {
    RegistryError::Unavailable("the registry is stopped".to_owned())
}

fn insert(st: &mut State, key: Key, entry: Entry) {
    st.leases.insert(entry.lease, key.clone());
    *st.per_service.entry(key.0.clone()).or_default() += 1;
    st.next_expiry = Some(st.next_expiry.map_or(entry.expires, |t| t.min(entry.expires)));
    st.regs.insert(key, entry);
}

fn remove(st: &mut State, key: &Key) -> Option<Entry> {
    let old = st.regs.remove(key)?;
    st.leases.remove(&old.lease);
    if let Some(n) = st.per_service.get_mut(&key.0) {
        *n -= 1;
        if *n == 0 {
            st.per_service.remove(&key.0);
        }
    }
    Some(old)
}

/// Removes every registration whose lease lapsed by `now`; whether any did.
fn expire(st: &mut State, now: Instant) -> bool {
    if st.next_expiry.is_none_or(|t| t > now) {
        return false;
    }
    let lapsed: Vec<Key> =
        st.regs.iter().filter(|(_, e)| e.expires <= now).map(|(k, _)| k.clone()).collect();
    for key in &lapsed {
        remove(st, key);
        tracing::info!(cluster = key.0, member = key.1, "lease lapsed: member removed");
    }
    st.next_expiry = st.regs.values().map(|e| e.expires).min();
    !lapsed.is_empty()
}

/// The registered members by cluster, and their number.
fn registered(st: &State) -> (Registered, usize) {
    let mut registered = Registered::new();
    for ((cluster, _), e) in &st.regs {
        registered.entry(cluster.clone()).or_default().push(e.member.clone());
    }
    (registered, st.regs.len())
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

/// Reads the snapshot, checking every entry as the API checks a registration.
fn load_snapshot(path: &Path, st: &mut State) -> Result<(), StartError> {
    let failed = |reason: String| StartError::Snapshot { path: path.to_owned(), reason };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed(format!("cannot read: {e}"))),
    };
    let file: SnapshotFile =
        serde_json::from_str(&text).map_err(|e| failed(format!("invalid: {e}")))?;
    let now = Instant::now();
    for (i, r) in file.registrations.into_iter().enumerate() {
        let bad = |what: String| {
            failed(format!("registrations[{i}] (`{}` in `{}`): {what}", r.name, r.cluster))
        };
        let ttl = Duration::from_millis(r.ttl_ms);
        let checks = registry::check_name("service", &r.cluster)
            .and_then(|()| registry::check_name("member", &r.name))
            .and_then(|()| registry::check_address(&r.address))
            .and_then(|()| registry::check_weight(r.weight))
            .and_then(|()| {
                r.group.as_deref().map_or(Ok(()), |g| registry::check_name("field `group`", g))
            })
            .and_then(|()| registry::check_ttl(ttl));
        checks.map_err(bad)?;
        let lease = match r.lease.parse::<u64>() {
            Ok(l) if l != 0 => l,
            _ => return Err(bad(format!("lease `{}` is not a non-zero number", r.lease))),
        };
        if st.leases.contains_key(&lease) {
            return Err(bad(format!("lease `{lease}` is used twice")));
        }
        let key = (r.cluster.clone(), r.name.clone());
        if st.regs.contains_key(&key) {
            return Err(bad("the member is registered twice".to_owned()));
        }
        let member = MemberSpec {
            name: r.name,
            address: r.address,
            weight: r.weight,
            group: r.group,
            admin: AdminState::Active,
        };
        insert(st, key, Entry { member, lease, ttl, expires: now + ttl });
    }
    Ok(())
}

/// The snapshot's text: JSON, one registration per line.
fn snapshot_text(st: &State) -> String {
    let mut text = String::with_capacity(64 + st.regs.len() * 160);
    text.push_str("{\"registrations\": [");
    for (i, ((cluster, _), e)) in st.regs.iter().enumerate() {
        // Borrowed: no copy of the strings for each entry of each write.
        let saved = SavedRef {
            cluster,
            name: &e.member.name,
            address: &e.member.address,
            weight: e.member.weight,
            group: e.member.group.as_deref(),
            ttl_ms: e.ttl.as_millis() as u64,
            lease: e.lease.to_string(),
        };
        text.push_str(if i == 0 { "\n  " } else { ",\n  " });
        // Plain strings and numbers into a String: serialising cannot fail.
        if let Ok(line) = serde_json::to_string(&saved) {
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
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| {
        // A temporary left by a failed write (the rename failed) goes now, not at next start.
        let _ = std::fs::remove_file(&tmp);
        format!("naming snapshot {}: cannot write: {e}", path.display())
    })
}
