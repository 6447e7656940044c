//! What a running process hands to the process that replaces it in a hitless upgrade, besides
//! its sockets ([`crate::sockets`]): the view id (ids keep growing across processes), every
//! cluster's member state by name ([`rondo_core::handoff`]: health, drains and who set them,
//! ejections, EWMA, probe rankings, agent reports, the retry budget), and the data plane's own
//! state and the agent receiver's, opaque here.

use std::collections::BTreeMap;

use rondo_core::handoff::ClusterHandoff;
use serde::{Deserialize, Serialize};

use crate::Live;

/// The state document, sent as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateDoc {
    /// The process that wrote it.
    pub pid: u32,
    /// Its current view id: the new process starts above it.
    pub view_id: u64,
    /// Every cluster's state, by cluster name.
    pub clusters: BTreeMap<String, ClusterHandoff>,
    /// The state of the process's other parts, each in its own format, by part: `"router"`
    /// (its sticky sessions), `"agent"` (the receiver's epoch and sequence numbers).
    pub parts: BTreeMap<String, serde_json::Value>,
}

/// `live`'s state now.
pub fn export(live: &Live) -> StateDoc {
    let now = crate::clock::now();
    let snapshot = live.load();
    let clusters = snapshot
        .clusters
        .iter()
        .map(|(name, rt)| (name.clone(), rt.with(|b| b.export(now))))
        .collect();
    StateDoc {
        pid: std::process::id(),
        view_id: snapshot.view.id,
        clusters,
        parts: BTreeMap::new(),
    }
}

/// Takes over `doc` into `live`'s clusters (by cluster and member name); returns how many
/// members of the view it had state for.
pub fn import(live: &Live, doc: &StateDoc) -> usize {
    let now = crate::clock::now();
    let snapshot = live.load();
    let mut matched = 0;
    for (name, rt) in &snapshot.clusters {
        let Some(state) = doc.clusters.get(name) else { continue };
        matched += state
            .members
            .iter()
            .filter(|m| rt.spec.members.iter().any(|s| s.name == m.name))
            .count();
        rt.with(|b| b.import(state, now));
        rt.state_changed();
    }
    matched
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
