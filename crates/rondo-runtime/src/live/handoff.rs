//! The process's state handed to its successor in a hitless upgrade, written and taken over
//! ([`StateDoc`]: every cluster's member state by name, the router's own revocations).

use std::collections::BTreeMap;

use crate::Live;
use crate::sockets::handoff::StateDoc;

impl Live {
    /// The process's state now; with `last`, the hand-over itself: revocations are no longer made here
    /// ([`crate::revoke::Revocations::hand_over`]).
    pub fn export_state(&self, last: bool) -> StateDoc {
        let now = crate::clock::now();
        let snapshot = self.views.load();
        let clusters = snapshot
            .clusters
            .iter()
            .map(|(name, rt)| (name.clone(), rt.with(|b| b.export(now))))
            .collect();
        StateDoc {
            pid: std::process::id(),
            view_id: snapshot.view.id,
            clusters,
            revoked: self.revocations.hand_over(unix_now(), last),
            parts: BTreeMap::new(),
        }
    }

    /// Takes over `doc` into the clusters (by cluster and member name) and its revocations;
    /// returns how many members of the view it had state for.
    pub fn import_state(&self, doc: &StateDoc) -> usize {
        match self.revocations.take_over(&doc.revoked, unix_now()) {
            Ok(n) if n > 0 => tracing::info!(revocations = n, "upgrade: revocations taken over"),
            Ok(_) => {}
            Err(e) => tracing::error!("upgrade: revocations taken over but not kept: {e}"),
        }
        let now = crate::clock::now();
        let snapshot = self.views.load();
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
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
