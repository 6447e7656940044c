//! The multicast branches' bounded queues: the copies waiting or in flight per listener, route
//! and branch. A leaf, so that the listener's context (`crate::http::HttpCtx`) can own them
//! while the copying itself (`crate::multicast`) runs over that context.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The copies waiting or in flight per (route, branch cluster) of one listener.
#[derive(Debug, Default)]
pub struct Queues {
    map: Mutex<HashMap<(String, String), Arc<Queue>>>,
}

#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) pending: AtomicU32,
    pub(super) overflowed: AtomicU64,
}

impl Queues {
    pub(super) fn of(&self, route: &str, cluster: &str) -> Arc<Queue> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((route.to_owned(), cluster.to_owned())).or_default().clone()
    }
}

/// A place in a branch's queue, given back when the copy is over.
pub(super) struct Held(pub(super) Arc<Queue>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}
