//! Revoked sign-on tokens, by token id (`jti`) or by subject (`sub`): the admin API adds one
//! here (in force on this router at once) and hands it to the registry's publisher, which shares
//! it with the tier (etcd: a key under `{prefix}/revoked/` with a lease that lapses with the
//! revocation; every router's watch brings it in with [`Revocations::set_shared`]). Each entry is
//! kept until its own expiry (as long as the tokens it refuses could live), and the set is
//! bounded ([`MAX_REVOCATIONS`]). A router's own revocations go to the process that replaces it
//! in a hitless upgrade ([`Revocations::hand_over`], [`Revocations::take_over`]): they are the
//! only copy a router without a store has.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

/// Most revocations kept at once; past it a new one is refused (the admin API answers 507).
pub const MAX_REVOCATIONS: usize = 100_000;

/// What a revocation names.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RevokeKind {
    /// One token, by its `jti`.
    TokenId,
    /// Every token of a subject (`sub`), issued before the revocation's expiry lapses.
    Subject,
}

impl RevokeKind {
    /// The spelling in the API and in etcd keys.
    pub fn as_str(self) -> &'static str {
        match self {
            RevokeKind::TokenId => "token_id",
            RevokeKind::Subject => "subject",
        }
    }

    /// Parses [`RevokeKind::as_str`].
    pub fn parse(s: &str) -> Option<RevokeKind> {
        [RevokeKind::TokenId, RevokeKind::Subject].into_iter().find(|k| k.as_str() == s)
    }
}

/// One revocation: what it names and until when (Unix seconds) it holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Revocation {
    /// Token id or subject.
    pub kind: RevokeKind,
    /// The `jti` or `sub`.
    pub value: String,
    /// Unix seconds after which it is forgotten.
    pub until: u64,
}

type Set = HashMap<(RevokeKind, String), u64>;

/// Why a revocation was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeError {
    /// The set is full, the store cannot keep it, or the registry's publisher has stopped.
    Refused(String),
    /// This process has handed its revocations to the process that replaces it: the new one
    /// must take it (made here, it would be lost with this process).
    HandedOver,
}

impl std::fmt::Display for RevokeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RevokeError::Refused(e) => f.write_str(e),
            RevokeError::HandedOver => f.write_str(
                "this router has handed over to a new process: make the revocation again there",
            ),
        }
    }
}

/// A revocation handed to the registry's publisher, and where it answers whether the tier has
/// it (etcd: the put with its lease succeeded).
pub type Publish = (Revocation, tokio::sync::oneshot::Sender<Result<(), String>>);

/// Whether a revocation reached the tier: the registry's answer, when the registry shares
/// revocations (`None`: this router's alone, as with the embedded registry).
pub type Shared = Option<tokio::sync::oneshot::Receiver<Result<(), String>>>;

/// This router's revocations: its own (made through its admin API) and the tier's (from the
/// registry), read without a lock on the request path.
#[derive(Default)]
pub struct Revocations {
    local: Mutex<Set>,
    shared: Mutex<Set>,
    merged: ArcSwap<Set>,
    publisher: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Publish>>>,
    /// Where this router's own revocations are kept across restarts (the embedded registry's
    /// snapshot with `.revoked` appended), when set.
    store: Mutex<Option<PathBuf>>,
    /// Set once the local set went to a new process ([`Revocations::hand_over`]); read and
    /// written under `local`'s lock.
    handed_over: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Revocations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revocations").field("in_force", &self.merged.load().len()).finish()
    }
}

impl Revocations {
    /// Whether a token with id `jti` (if any) of `subject` is revoked at `now` (Unix seconds).
    pub fn is_revoked(&self, jti: Option<&str>, subject: &str, now: u64) -> bool {
        let set = self.merged.load();
        if set.is_empty() {
            return false;
        }
        let hit = |k: RevokeKind, v: &str| set.get(&(k, v.to_owned())).is_some_and(|&u| u > now);
        jti.is_some_and(|j| hit(RevokeKind::TokenId, j)) || hit(RevokeKind::Subject, subject)
    }

    /// Adds a revocation made on this router (in force here at once) and hands it to the
    /// registry's publisher, if one is set, with the longest expiry this router holds for it
    /// (a shorter one given later never cuts the tier's short); the publisher's answer comes on
    /// the returned receiver. Errors when the set is full, the store cannot keep it, or the set
    /// was handed over to a new process.
    pub fn revoke(&self, r: Revocation, now: u64) -> Result<Shared, RevokeError> {
        use RevokeError::Refused;
        let mut r = r;
        {
            let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            if self.handed_over.load(std::sync::atomic::Ordering::Acquire) {
                return Err(RevokeError::HandedOver);
            }
            local.retain(|_, &mut u| u > now);
            let key = (r.kind, r.value.clone());
            if !local.contains_key(&key) && local.len() >= MAX_REVOCATIONS {
                return Err(Refused(format!("{MAX_REVOCATIONS} revocations are in force already")));
            }
            let until = local.get(&key).map_or(r.until, |&u| u.max(r.until));
            // Durable before it is in force or answered: a restart must not forget it. Written
            // under the lock, so two revocations cannot write the file out of order.
            if let Some(path) = self.store.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                let mut next = local.clone();
                next.insert(key.clone(), until);
                write_store(path, &next).map_err(|e| {
                    Refused(format!("cannot keep the revocation in {}: {e}", path.display()))
                })?;
            }
            local.insert(key, until);
            r.until = until;
        }
        self.merge(now);
        let publisher = self.publisher.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = publisher.as_ref() else { return Ok(None) };
        let (done, answer) = tokio::sync::oneshot::channel();
        if tx.send((r, done)).is_err() {
            return Err(Refused("the registry's publisher has stopped".to_owned()));
        }
        Ok(Some(answer))
    }

    /// Replaces the tier's revocations (the registry's whole set).
    pub fn set_shared(&self, set: impl IntoIterator<Item = Revocation>, now: u64) {
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            shared.clear();
            for r in set.into_iter().filter(|r| r.until > now).take(MAX_REVOCATIONS) {
                shared.insert((r.kind, r.value), r.until);
            }
        }
        self.merge(now);
    }

    /// Keeps this router's own revocations in `path` from now on (the embedded registry's
    /// snapshot beside it): the revocations in force there are loaded first. A file that
    /// cannot be read or holds a line that is not a revocation is an error naming the file and
    /// the line; a missing file is an empty set.
    /// Revocations already held (handed over by the process this one replaced) and not in the
    /// file are written to it at once.
    pub fn set_store(&self, path: PathBuf, now: u64) -> Result<usize, String> {
        let loaded = read_store(&path, now)?;
        let n = loaded.len();
        let written = {
            let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            local.retain(|_, &mut u| u > now);
            let behind = local.iter().any(|(k, u)| loaded.get(k).is_none_or(|f| f < u));
            for (k, u) in loaded {
                let e = local.entry(k).or_insert(u);
                *e = (*e).max(u);
            }
            let written = if behind { write_store(&path, &local) } else { Ok(()) };
            *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.clone());
            written
        };
        self.merge(now);
        written.map_err(|e| format!("revocations {}: {e}", path.display()))?;
        Ok(n)
    }

    /// This router's own revocations in force at `now`, for the process that replaces it in an
    /// upgrade (the tier's come to that process from the registry). With `last`, the hand-over
    /// itself: from then on [`Revocations::revoke`] refuses ([`RevokeError::HandedOver`]), so
    /// that no revocation is answered here that the new process never got.
    pub fn hand_over(&self, now: u64, last: bool) -> Vec<Revocation> {
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if last {
            self.handed_over.store(true, std::sync::atomic::Ordering::Release);
        }
        in_force(&local, now)
    }

    /// Takes over the revocations a previous process handed over ([`Revocations::hand_over`]):
    /// in force here at once, as this router's own (each with the longer expiry when both
    /// hold it), and written to the store when one is set. A revocation with a value the admin
    /// API would refuse, or past [`MAX_REVOCATIONS`], is left out. Returns how many were taken;
    /// an error when the store cannot keep them (they are in force regardless: the old process
    /// acknowledged them).
    pub fn take_over(&self, list: &[Revocation], now: u64) -> Result<usize, String> {
        let mut taken = 0;
        let written = {
            let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            local.retain(|_, &mut u| u > now);
            for r in list.iter().filter(|r| r.until > now && valid_value(&r.value)) {
                let key = (r.kind, r.value.clone());
                if !local.contains_key(&key) && local.len() >= MAX_REVOCATIONS {
                    break;
                }
                let e = local.entry(key).or_insert(r.until);
                *e = (*e).max(r.until);
                taken += 1;
            }
            match self.store.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                Some(path) if taken > 0 => write_store(path, &local)
                    .map_err(|e| format!("revocations {}: {e}", path.display())),
                _ => Ok(()),
            }
        };
        self.merge(now);
        written.map(|()| taken)
    }

    /// Where new local revocations go to be shared (the etcd registry sets one).
    pub fn set_publisher(&self, tx: tokio::sync::mpsc::UnboundedSender<Publish>) {
        *self.publisher.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    }

    /// Every revocation in force at `now`, sorted.
    pub fn list(&self, now: u64) -> Vec<Revocation> {
        in_force(&self.merged.load(), now)
    }

    fn merge(&self, now: u64) {
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut merged: Set =
            shared.iter().filter(|(_, u)| **u > now).map(|(k, u)| (k.clone(), *u)).collect();
        for (k, &u) in local.iter().filter(|(_, u)| **u > now) {
            let e = merged.entry(k.clone()).or_insert(u);
            *e = (*e).max(u);
        }
        self.merged.store(Arc::new(merged));
    }
}

/// The store's format: one revocation a line, `KIND<TAB>VALUE<TAB>UNTIL` (values hold no control
/// character, the admin API refuses them).
/// The revocations of `set` in force at `now`, sorted (by kind, then value).
fn in_force(set: &Set, now: u64) -> Vec<Revocation> {
    let mut v: Vec<Revocation> = set
        .iter()
        .filter(|(_, u)| **u > now)
        .map(|((kind, value), until)| Revocation {
            kind: *kind,
            value: value.clone(),
            until: *until,
        })
        .collect();
    v.sort_by(|a, b| (a.kind, &a.value).cmp(&(b.kind, &b.value)));
    v
}

fn write_store(path: &Path, set: &Set) -> std::io::Result<()> {
    let mut text = String::new();
    for ((kind, value), until) in set {
        text.push_str(&format!("{}\t{value}\t{until}\n", kind.as_str()));
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A value a revocation may name: what the admin API accepts (1 to 256 characters, no control
/// character; the store's format needs the latter).
pub fn valid_value(value: &str) -> bool {
    !value.is_empty() && value.len() <= 256 && !value.chars().any(char::is_control)
}

fn read_store(path: &Path, now: u64) -> Result<Set, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Set::new()),
        Err(e) => return Err(format!("revocations {}: {e}", path.display())),
    };
    let mut set = Set::new();
    for (i, line) in text.lines().enumerate() {
        let bad =
            || format!("revocations {}: line {} is not KIND\tVALUE\tUNTIL", path.display(), i + 1);
        let mut parts = line.split('\t');
        let (Some(kind), Some(value), Some(until), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let kind = RevokeKind::parse(kind).ok_or_else(bad)?;
        let until: u64 = until.parse().map_err(|_| bad())?;
        if !valid_value(value) {
            return Err(bad());
        }
        if until > now {
            set.insert((kind, value.to_owned()), until);
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(kind: RevokeKind, v: &str, until: u64) -> Revocation {
        Revocation { kind, value: v.into(), until }
    }

    #[test]
    fn revoked_by_id_or_subject_until_expiry() {
        let rs = Revocations::default();
        assert!(!rs.is_revoked(Some("t1"), "alice", 100));
        rs.revoke(r(RevokeKind::TokenId, "t1", 200), 100).unwrap();
        assert!(rs.is_revoked(Some("t1"), "bob", 100));
        assert!(!rs.is_revoked(Some("t2"), "bob", 100));
        assert!(!rs.is_revoked(Some("t1"), "bob", 200), "expired revocations lapse");
        rs.set_shared([r(RevokeKind::Subject, "alice", 300)], 100);
        assert!(rs.is_revoked(None, "alice", 150));
        assert!(rs.is_revoked(Some("t1"), "bob", 150), "local ones survive a shared update");
        rs.set_shared([], 100);
        assert!(!rs.is_revoked(None, "alice", 150));
        assert_eq!(rs.list(150).len(), 1);
    }

    #[test]
    fn the_tier_is_handed_the_longest_expiry_this_router_holds() {
        let rs = Revocations::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        rs.set_publisher(tx);
        let answer = rs.revoke(r(RevokeKind::Subject, "alice", 300), 100).unwrap();
        let (published, done) = rx.try_recv().unwrap();
        assert_eq!(published.until, 300);
        done.send(Err("etcd is away".into())).unwrap();
        assert_eq!(answer.unwrap().blocking_recv().unwrap(), Err("etcd is away".into()));
        // A shorter revocation of the same subject later must not cut the tier's one short.
        rs.revoke(r(RevokeKind::Subject, "alice", 150), 100).unwrap();
        let (published, _) = rx.try_recv().unwrap();
        assert_eq!(published.until, 300);
        assert!(rs.is_revoked(None, "alice", 200));
    }

    #[test]
    fn an_upgrade_hands_over_local_revocations_and_the_old_process_makes_no_more() {
        let dir = std::env::temp_dir().join(format!("rondo-revoked-up-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let old = Revocations::default();
        old.revoke(r(RevokeKind::Subject, "alice", 300), 100).unwrap();
        old.revoke(r(RevokeKind::TokenId, "t1", 120), 100).unwrap();
        // The tier's are the registry's to bring, not the old process's to hand over.
        old.set_shared([r(RevokeKind::Subject, "bob", 300)], 100);
        let state = old.hand_over(110, false);
        assert_eq!(state.len(), 2);
        old.revoke(r(RevokeKind::Subject, "carol", 300), 110).unwrap();
        // The hand-over itself: a revocation after it is refused, not answered and lost.
        let last = old.hand_over(130, true);
        assert_eq!(last.iter().map(|r| r.value.as_str()).collect::<Vec<_>>(), ["alice", "carol"]);
        let e = old.revoke(r(RevokeKind::Subject, "dave", 300), 130).unwrap_err();
        assert_eq!(e, RevokeError::HandedOver);
        assert!(!old.is_revoked(None, "dave", 130));

        // The new process: its own made meanwhile are kept, the longer expiry wins, values the
        // admin API would refuse are left out, and its store gets them at once.
        let new = Revocations::default();
        let path = dir.join("registry.json.revoked");
        new.set_store(path.clone(), 100).unwrap();
        new.revoke(r(RevokeKind::Subject, "alice", 500), 100).unwrap();
        let mut handed = last.clone();
        handed.push(r(RevokeKind::Subject, "bad\tvalue", 300));
        handed.push(r(RevokeKind::Subject, "", 300));
        assert_eq!(new.take_over(&handed, 130), Ok(2));
        assert!(new.is_revoked(None, "carol", 130) && new.is_revoked(None, "alice", 400));
        assert!(!new.is_revoked(None, "bad\tvalue", 130));
        let restarted = Revocations::default();
        assert_eq!(restarted.set_store(path.clone(), 130), Ok(2), "written to the store");
        assert!(
            restarted.is_revoked(None, "alice", 400) && restarted.is_revoked(None, "carol", 130)
        );

        // A store set after the take-over (the registry opens after the hand-over) is written
        // with what the file lacks.
        let late = Revocations::default();
        late.take_over(&[r(RevokeKind::Subject, "erin", 300)], 130).unwrap();
        let other = dir.join("other.revoked");
        assert_eq!(late.set_store(other.clone(), 130), Ok(0));
        assert_eq!(Revocations::default().set_store(other, 130), Ok(1));

        // Bounded: past MAX_REVOCATIONS the rest are left out.
        let full = Revocations::default();
        let many: Vec<Revocation> = (0..MAX_REVOCATIONS + 5)
            .map(|i| r(RevokeKind::TokenId, &format!("t{i}"), 300))
            .collect();
        assert_eq!(full.take_over(&many, 100), Ok(MAX_REVOCATIONS));
        assert_eq!(full.list(100).len(), MAX_REVOCATIONS);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_store_keeps_local_revocations_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("rondo-revoked-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("registry.json.revoked");
        let rs = Revocations::default();
        assert_eq!(rs.set_store(path.clone(), 100), Ok(0), "a missing file is an empty set");
        rs.revoke(r(RevokeKind::Subject, "alice", 300), 100).unwrap();
        rs.revoke(r(RevokeKind::TokenId, "t1", 150), 100).unwrap();
        // Shared ones are the tier's to keep, not this file's.
        rs.set_shared([r(RevokeKind::Subject, "bob", 300)], 100);
        let again = Revocations::default();
        assert_eq!(again.set_store(path.clone(), 120), Ok(2));
        assert!(again.is_revoked(None, "alice", 120) && again.is_revoked(Some("t1"), "x", 120));
        assert!(!again.is_revoked(None, "bob", 120));
        // Lapsed ones are not loaded.
        assert_eq!(Revocations::default().set_store(path.clone(), 200), Ok(1));
        // A damaged file is refused, naming the file and the line.
        std::fs::write(&path, "subject\talice\t300\nsubject alice\n").unwrap();
        let e = Revocations::default().set_store(path.clone(), 100).unwrap_err();
        assert!(e.contains("registry.json.revoked") && e.contains("line 2"), "{e}");
        // A write that fails refuses the revocation (not in force, not answered as made).
        let rs = Revocations::default();
        rs.set_store(dir.join("no-such-dir").join("r"), 100).unwrap();
        assert!(rs.revoke(r(RevokeKind::Subject, "carol", 300), 100).is_err());
        assert!(!rs.is_revoked(None, "carol", 100));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
