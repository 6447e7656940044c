//! The embedded registry's writer thread: the changes it is sent, one batch at a time (lapsed
//! leases out, the changes in, one write to disk, one view of the clusters it changed, then the
//! answers), and the deferred views of big services (see the parent module's docs).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rondo_core::wire::Lease;
use rondo_core::{AdminState, Entropy, MemberSpec};
use rondo_runtime::live::{Registered, RegisteredCluster};
use rondo_runtime::probe;
use tokio::sync::oneshot;

use super::disk::{Disk, snapshot_text};
use super::state::{Entry, Key, State, expire, insert, members_of, remove, saved};
use super::{DEFERRED_VIEW_MEMBERS, EXPIRY_TICK, MAX_BATCH, Shared};
use crate::journal;
use crate::registry::{self, Registration, RegistryError};

/// The services whose view the writer composes after answering, paced so that composing takes
/// at most half of its time: after a composition that took `t`, the next one waits `t`. A
/// registration into a big service therefore costs its own record on disk plus a share of one
/// composition, and one composition is shared by every change that arrived during the last
/// one and the wait after it (as many as `2t` lets in): O(1) amortised whatever the service's
/// size, where composing before each answer cost a service of 10,000 members ~28 ms per
/// registration made one at a time.
#[derive(Debug, Default)]
pub(super) struct Deferred {
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

/// A change for the writer, and where its answer goes.
#[derive(Debug)]
pub(super) enum Job {
    Register(Registration, oneshot::Sender<Result<Lease, RegistryError>>),
    Deregister(Key, oneshot::Sender<Result<(), RegistryError>>),
}

/// An applied change's answer, sent once the batch is durable (or its error).
pub(super) enum Reply {
    Register(Lease, oneshot::Sender<Result<Lease, RegistryError>>),
    Deregister(oneshot::Sender<Result<(), RegistryError>>),
}

impl Reply {
    /// Answers the caller: its result, or `Unavailable` naming the failed write's error.
    fn send(self, failed: Option<&str>) {
        let error =
            |e: &str| RegistryError::Unavailable(format!("{e}: the change was not made, retry"));
        match (self, failed) {
            (Reply::Register(lease, tx), None) => {
                let _ = tx.send(Ok(lease));
            }
            (Reply::Register(_, tx), Some(e)) => {
                let _ = tx.send(Err(error(e)));
            }
            (Reply::Deregister(tx), None) => {
                let _ = tx.send(Ok(()));
            }
            (Reply::Deregister(tx), Some(e)) => {
                let _ = tx.send(Err(error(e)));
            }
        }
    }
}

/// What a batch changed in memory: the leases that lapsed, how to undo its changes, whom to
/// answer, its log records and the clusters whose member lists it changed.
struct Applied {
    lapsed: Vec<Key>,
    undo: Vec<(Key, Option<Entry>)>,
    replies: Vec<Reply>,
    changes: Vec<String>,
    touched: BTreeSet<String>,
}

impl Shared {
    /// The writer thread: a batch whenever changes are pending, and lapsed leases looked for
    /// every [`EXPIRY_TICK`]; ends when stopped or when the registry is dropped.
    pub(super) fn run(&self, jobs: &Receiver<Job>, mut disk: Option<Disk>) {
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
            self.registrations.reap_retired();
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
        let applied = self.apply_batch(&mut st, batch, now);
        let behind = disk.as_ref().is_some_and(|d| d.behind);
        if applied.changes.is_empty() && !behind {
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
        let (written, compaction_error) = match (disk.as_deref_mut(), plan) {
            (Some(d), Some((seq, snapshot))) => {
                d.write(seq, snapshot, &applied.changes, &self.metrics)
            }
            _ => (Ok(0), None),
        };
        let t1 = Instant::now();
        match written {
            Ok(bytes) => {
                self.committed(applied, compaction_error, deferred, bytes, t1 - t0, t1);
            }
            Err(e) => self.failed(applied, disk, &e),
        }
    }

    /// The batch applied in memory, after the leases that lapsed by `now`; a change refused
    /// (a cap, a policy that conflicts, a member not registered) is answered at once.
    fn apply_batch(&self, st: &mut State, batch: Vec<Job>, now: Instant) -> Applied {
        let lapsed = expire(st, now);
        let mut a = Applied {
            undo: Vec::with_capacity(batch.len()),
            replies: Vec::with_capacity(batch.len()),
            changes: Vec::with_capacity(batch.len() + lapsed.len()),
            touched: BTreeSet::new(),
            lapsed: Vec::new(),
        };
        for key in &lapsed {
            a.changes.push(journal::del(&key.0, &key.1));
            a.touched.insert(key.0.clone());
        }
        a.lapsed = lapsed;
        for job in batch {
            match job {
                Job::Register(reg, tx) => match self.apply_register(st, reg, now) {
                    Ok((key, old, lease)) => {
                        if let Some(e) = st.regs.get(&key) {
                            a.changes.push(journal::put(saved(&key.0, e)));
                        }
                        a.touched.insert(key.0.clone());
                        a.undo.push((key, old));
                        a.replies.push(Reply::Register(lease, tx));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                },
                Job::Deregister(key, tx) => match remove(st, &key) {
                    Some(old) => {
                        tracing::info!(cluster = key.0, member = key.1, "member deregistered");
                        a.changes.push(journal::del(&key.0, &key.1));
                        a.touched.insert(key.0.clone());
                        a.undo.push((key, Some(old)));
                        a.replies.push(Reply::Deregister(tx));
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
        a
    }

    /// After the batch is on disk: the views of the clusters it changed (a big service's
    /// composed later, paced; a small one's now), then every answer.
    fn committed(
        &self,
        applied: Applied,
        compaction_error: Option<String>,
        deferred: &mut Deferred,
        bytes: usize,
        wrote: Duration,
        t1: Instant,
    ) {
        let mut st = self.lock();
        st.last_error = compaction_error;
        let mut updates: Vec<(String, RegisteredCluster)> = Vec::new();
        for c in applied.touched {
            if st.per_service.get(&c).copied().unwrap_or(0) >= DEFERRED_VIEW_MEMBERS {
                deferred.add(c, t1);
            } else {
                // Out of the deferred ones: this composition is the latest.
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
            changes = applied.changes.len(),
            registrations = count,
            clusters,
            bytes,
            write_us = wrote.as_micros() as u64,
            publish_us = t1.elapsed().as_micros() as u64,
            "batch committed"
        );
        for reply in applied.replies {
            reply.send(None);
        }
    }

    /// After the write failed (`e`): the batch undone and every caller answered
    /// `Unavailable`. Lapsed leases stay out of memory; the files catch up at the next write.
    fn failed(&self, applied: Applied, disk: Option<&mut Disk>, e: &str) {
        tracing::warn!("{e}");
        let mut st = self.lock();
        for (key, old) in applied.undo.into_iter().rev() {
            remove(&mut st, &key);
            if let Some(old) = old {
                insert(&mut st, key, old);
            }
        }
        st.last_error = Some(e.to_owned());
        let mut updates = Vec::new();
        if !applied.lapsed.is_empty() {
            if let Some(d) = disk {
                d.behind = true;
            }
            let clusters: BTreeSet<&String> = applied.lapsed.iter().map(|k| &k.0).collect();
            for c in clusters {
                updates.push((c.clone(), members_of(&st, c)));
            }
        }
        let count = st.regs.len();
        drop(st);
        if !updates.is_empty() {
            self.publish(updates, count);
        }
        for reply in applied.replies {
            reply.send(Some(e));
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
        self.metrics.registrations.set(count as i64);
        if updates.is_empty() {
            return;
        }
        let (_, built) = self.registrations.update_registered(updates);
        let _runtime = self.runtime.enter();
        probe::spawn_clusters(&built);
    }

    /// Swaps every registration into the live view (at start).
    pub(super) fn publish_all(&self, registered: (Registered, usize)) {
        let (registered, count) = registered;
        self.metrics.registrations.set(count as i64);
        let snapshot = self.registrations.set_registered(registered);
        let _runtime = self.runtime.enter();
        probe::spawn(&snapshot);
    }
}
