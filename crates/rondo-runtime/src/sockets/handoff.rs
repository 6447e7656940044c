//! What a running process hands to the process that replaces it in a hitless upgrade, besides
//! its sockets ([`crate::sockets`]): the view id (ids keep growing across processes), every
//! cluster's member state by name ([`rondo_core::handoff`]: health, drains and who set them,
//! ejections, EWMA, probe rankings, agent reports, the retry budget), the router's own
//! revocations ([`crate::revoke`]), and the data plane's own state and the agent receiver's,
//! opaque here. `Live::export_state` and `Live::import_state` write and take it.
//!
//! A field added later has a serde default, so that a new process accepts the document of an
//! older one that lacks it (an older process sends no revocations: an empty list).

use std::collections::BTreeMap;

use rondo_core::handoff::ClusterHandoff;
use serde::{Deserialize, Serialize};

use crate::revoke::Revocation;

/// The state document, sent as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateDoc {
    /// The process that wrote it.
    pub pid: u32,
    /// Its current view id: the new process starts above it.
    pub view_id: u64,
    /// Every cluster's state, by cluster name.
    pub clusters: BTreeMap<String, ClusterHandoff>,
    /// This router's own revocations in force (at most [`crate::revoke::MAX_REVOCATIONS`]).
    #[serde(default)]
    pub revoked: Vec<Revocation>,
    /// The state of the process's other parts, each in its own format, by part: `"router"`
    /// (its sticky sessions), `"agent"` (the receiver's epoch and sequence numbers).
    pub parts: BTreeMap<String, serde_json::Value>,
}

/// How the admin API (`POST /v1/upgrade`, `rondo ctl upgrade`) starts an upgrade: set by
/// `rondo serve` when `[router] upgrade_socket` is; it starts the new process and returns its
/// pid, or says why it could not.
#[derive(Default)]
pub struct Upgrader(std::sync::OnceLock<Box<dyn Fn() -> Result<u32, String> + Send + Sync>>);

impl std::fmt::Debug for Upgrader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgrader").field("set", &self.0.get().is_some()).finish()
    }
}

impl Upgrader {
    /// Sets how an upgrade starts (once).
    pub fn set(&self, start: impl Fn() -> Result<u32, String> + Send + Sync + 'static) {
        let _ = self.0.set(Box::new(start));
    }

    /// Starts an upgrade: the new process's pid, or why not; `None` when this process cannot
    /// be upgraded (no `[router] upgrade_socket`).
    pub fn start(&self) -> Option<Result<u32, String>> {
        self.0.get().map(|start| start())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_process_without_revocations_is_still_understood() {
        let older = r#"{"pid": 7, "view_id": 3, "clusters": {}, "parts": {}}"#;
        let doc: StateDoc = serde_json::from_str(older).unwrap();
        assert_eq!((doc.pid, doc.view_id, doc.revoked.len()), (7, 3, 0));
        let newer = r#"{"pid": 7, "view_id": 3, "clusters": {}, "parts": {},
            "revoked": [{"kind": "subject", "value": "alice", "until": 99}]}"#;
        let doc: StateDoc = serde_json::from_str(newer).unwrap();
        assert_eq!(doc.revoked[0].kind, crate::revoke::RevokeKind::Subject);
    }
}
