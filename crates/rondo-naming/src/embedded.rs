//! The embedded registry: registrations in process memory, each with its own lease, removed
//! when the lease lapses (checked every [`EXPIRY_TICK`]); optionally written to a snapshot file
//! after every registration change (not keepalives: a temporary file, synced, renamed, and the
//! directory synced) so that a restarted router comes back with its registrations, each with a
//! fresh lease. The write happens under the registry's lock: registrations are rare next to
//! lookups, which never take it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rondo_core::wire::Lease;
use rondo_core::{AdminState, Entropy, MemberSpec, SplitMix64};
use rondo_runtime::live::Registered;
use rondo_runtime::{Live, probe};
use serde::{Deserialize, Serialize};

use crate::registry::{Registration, RegistryError, RegistryStatus};

/// How often lapsed leases are looked for.
pub const EXPIRY_TICK: Duration = Duration::from_millis(100);

/// The in-process registry.
#[derive(Debug)]
pub struct Embedded {
    live: Arc<Live>,
    snapshot: Option<PathBuf>,
    state: Mutex<State>,
    expiry: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug)]
struct State {
    /// By (cluster, member).
    regs: BTreeMap<(String, String), Entry>,
    /// Lease id to (cluster, member).
    leases: HashMap<u64, (String, String)>,
    rng: SplitMix64,
    last_error: Option<String>,
}

#[derive(Debug, Clone)]
struct Entry {
    member: MemberSpec,
    lease: u64,
    ttl: Duration,
    expires: Instant,
}

/// The snapshot file's format.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotFile {
    registrations: Vec<SavedRegistration>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedRegistration {
    cluster: String,
    name: String,
    address: String,
    weight: u32,
    group: Option<String>,
    ttl_ms: u64,
    lease: String,
}

impl Embedded {
    /// Starts the registry (loading `snapshot` if the file exists) and its expiry task; must
    /// run inside a tokio runtime. Fails, naming the file, when the snapshot cannot be read or
    /// parsed (it is left untouched).
    pub fn start(live: Arc<Live>, snapshot: Option<PathBuf>) -> Result<Arc<Embedded>, String> {
        let seed = rondo_runtime::clock::now().0 ^ u64::from(std::process::id());
        let mut state = State {
            regs: BTreeMap::new(),
            leases: HashMap::new(),
            rng: SplitMix64::new(seed),
            last_error: None,
        };
        if let Some(path) = &snapshot {
            load_snapshot(path, &mut state)?;
        }
        let reg = Arc::new(Embedded {
            live,
            snapshot,
            state: Mutex::new(state),
            expiry: Mutex::new(None),
        });
        if !reg.lock().regs.is_empty() {
            let st = reg.lock();
            tracing::info!(registrations = st.regs.len(), "registrations restored from snapshot");
            reg.publish(&st);
        }
        let weak = Arc::downgrade(&reg);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPIRY_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(reg) = weak.upgrade() else { return };
                reg.expire(Instant::now());
            }
        });
        *reg.expiry.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        reg.live.metrics.registry_connected.set(1);
        Ok(reg)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`crate::Registry::register`].
    pub fn register(&self, reg: Registration) -> Result<Lease, RegistryError> {
        let mut st = self.lock();
        let key = (reg.cluster.clone(), reg.member.name.clone());
        if let Some(old) = st.regs.remove(&key) {
            st.leases.remove(&old.lease);
        }
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
        st.leases.insert(lease, key.clone());
        st.regs
            .insert(key, Entry { member, lease, ttl: reg.ttl, expires: Instant::now() + reg.ttl });
        self.changed(&mut st);
        Ok(Lease { lease: lease.to_string(), ttl_ms: reg.ttl.as_millis() as u64 })
    }

    /// See [`crate::Registry::keepalive`].
    pub fn keepalive(&self, lease: &str) -> Result<Lease, RegistryError> {
        let id = parse_lease(lease)?;
        let mut st = self.lock();
        let key = st.leases.get(&id).cloned().ok_or_else(|| unknown_lease(lease))?;
        let entry = st.regs.get_mut(&key).ok_or_else(|| unknown_lease(lease))?;
        entry.expires = Instant::now() + entry.ttl;
        Ok(Lease { lease: lease.to_owned(), ttl_ms: entry.ttl.as_millis() as u64 })
    }

    /// See [`crate::Registry::deregister`].
    pub fn deregister(&self, cluster: &str, member: &str) -> Result<(), RegistryError> {
        let mut st = self.lock();
        let Some(old) = st.regs.remove(&(cluster.to_owned(), member.to_owned())) else {
            return Err(RegistryError::NotFound(format!(
                "no registered member `{member}` in service `{cluster}`"
            )));
        };
        st.leases.remove(&old.lease);
        tracing::info!(cluster, member, "member deregistered");
        self.changed(&mut st);
        Ok(())
    }

    /// Removes every registration whose lease lapsed before `now`.
    fn expire(&self, now: Instant) {
        let mut st = self.lock();
        let lapsed: Vec<(String, String)> =
            st.regs.iter().filter(|(_, e)| e.expires <= now).map(|(k, _)| k.clone()).collect();
        if lapsed.is_empty() {
            return;
        }
        for key in &lapsed {
            if let Some(e) = st.regs.remove(key) {
                st.leases.remove(&e.lease);
                tracing::info!(cluster = key.0, member = key.1, "lease lapsed: member removed");
            }
        }
        self.changed(&mut st);
    }

    /// Publishes the registrations into the live view and writes the snapshot.
    fn changed(&self, st: &mut State) {
        self.publish(st);
        if let Some(path) = &self.snapshot {
            st.last_error = save_snapshot(path, st).err();
            if let Some(e) = &st.last_error {
                tracing::warn!("{e}");
            }
        }
    }

    fn publish(&self, st: &State) {
        let mut registered = Registered::new();
        for ((cluster, _), e) in &st.regs {
            registered.entry(cluster.clone()).or_default().push(e.member.clone());
        }
        self.live.metrics.registrations.set(st.regs.len() as i64);
        let snapshot = self.live.set_registered(registered);
        probe::spawn(&snapshot);
    }

    /// See [`crate::Registry::status`].
    pub fn status(&self) -> RegistryStatus {
        let st = self.lock();
        RegistryStatus {
            backend: "embedded",
            connected: true,
            detail: match &self.snapshot {
                Some(p) => format!("snapshot {}", p.display()),
                None => "in memory (no snapshot)".to_owned(),
            },
            last_error: st.last_error.clone(),
            registrations: st.regs.len(),
            resyncs: 0,
        }
    }

    /// Stops the expiry task.
    pub fn stop(&self) {
        if let Some(t) = self.expiry.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.stop();
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

fn load_snapshot(path: &Path, st: &mut State) -> Result<(), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("naming snapshot {}: cannot read: {e}", path.display())),
    };
    let file: SnapshotFile = serde_json::from_str(&text)
        .map_err(|e| format!("naming snapshot {}: invalid: {e}", path.display()))?;
    let now = Instant::now();
    for r in file.registrations {
        let lease = r.lease.parse::<u64>().map_err(|_| {
            format!("naming snapshot {}: lease `{}` is not a number", path.display(), r.lease)
        })?;
        let member = MemberSpec {
            name: r.name.clone(),
            address: r.address,
            weight: r.weight,
            group: r.group,
            admin: AdminState::Active,
        };
        let ttl = Duration::from_millis(r.ttl_ms);
        let key = (r.cluster, r.name);
        st.leases.insert(lease, key.clone());
        st.regs.insert(key, Entry { member, lease, ttl, expires: now + ttl });
    }
    Ok(())
}

fn save_snapshot(path: &Path, st: &State) -> Result<(), String> {
    let file = SnapshotFile {
        registrations: st
            .regs
            .iter()
            .map(|((cluster, _), e)| SavedRegistration {
                cluster: cluster.clone(),
                name: e.member.name.clone(),
                address: e.member.address.clone(),
                weight: e.member.weight,
                group: e.member.group.clone(),
                ttl_ms: e.ttl.as_millis() as u64,
                lease: e.lease.to_string(),
            })
            .collect(),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
    // Durable and atomic: a temporary file of this process, synced, renamed over the snapshot,
    // and the directory synced, so a crash leaves the old snapshot or the new one, whole.
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
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
    write().map_err(|e| format!("naming snapshot {}: cannot write: {e}", path.display()))
}
