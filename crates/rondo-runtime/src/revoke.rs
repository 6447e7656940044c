//! Revoked sign-on tokens, by token id (`jti`) or by subject (`sub`): the admin API adds one
//! here (in force on this router at once) and hands it to the registry's publisher, which shares
//! it with the tier (etcd: a key under `{prefix}/revoked/` with a lease that lapses with the
//! revocation; every router's watch brings it in with [`Revocations::set_shared`]). Each entry is
//! kept until its own expiry (as long as the tokens it refuses could live), and the set is
//! bounded ([`MAX_REVOCATIONS`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

/// Most revocations kept at once; past it a new one is refused (the admin API answers 507).
pub const MAX_REVOCATIONS: usize = 100_000;

/// What a revocation names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// Token id or subject.
    pub kind: RevokeKind,
    /// The `jti` or `sub`.
    pub value: String,
    /// Unix seconds after which it is forgotten.
    pub until: u64,
}

type Set = HashMap<(RevokeKind, String), u64>;

/// This router's revocations: its own (made through its admin API) and the tier's (from the
/// registry), read without a lock on the request path.
#[derive(Default)]
pub struct Revocations {
    local: Mutex<Set>,
    shared: Mutex<Set>,
    merged: ArcSwap<Set>,
    publisher: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Revocation>>>,
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
    /// registry's publisher, if one is set. Errors when the set is full.
    pub fn revoke(&self, r: Revocation, now: u64) -> Result<(), String> {
        {
            let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            local.retain(|_, &mut u| u > now);
            let key = (r.kind, r.value.clone());
            if !local.contains_key(&key) && local.len() >= MAX_REVOCATIONS {
                return Err(format!("{MAX_REVOCATIONS} revocations are in force already"));
            }
            let until = local.get(&key).map_or(r.until, |&u| u.max(r.until));
            local.insert(key, until);
        }
        self.merge(now);
        if let Some(tx) = self.publisher.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send(r);
        }
        Ok(())
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

    /// Where new local revocations go to be shared (the etcd registry sets one).
    pub fn set_publisher(&self, tx: tokio::sync::mpsc::UnboundedSender<Revocation>) {
        *self.publisher.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    }

    /// Every revocation in force at `now`, sorted.
    pub fn list(&self, now: u64) -> Vec<Revocation> {
        let mut v: Vec<Revocation> = self
            .merged
            .load()
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
}
