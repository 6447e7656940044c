//! The resources of the current view, built once and shared by every stream: a push to a
//! thousand clients of one cluster encodes its endpoints once, not a thousand times. Entries
//! belong to one view id and one reweighing period (load-driven weights change without a new
//! view); a newer view or period empties the cache, an older one (a stream still holding the
//! previous snapshot) builds without it. The client's zone is part of the key only where it
//! changes the resource (`prefer_local` endpoints), and the entries are capped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use envoy_types::pb::google::protobuf::Any;
use rondo_runtime::Snapshot;

use super::resources::{self, ClientFacts, Kind};

/// Most resources kept (kinds × clusters × zones that clients named).
const MAX_ENTRIES: usize = 4096;

type Key = (Kind, String, Option<String>);

/// The shared resources.
#[derive(Debug)]
pub(super) struct Cache {
    started: Instant,
    period: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    view: u64,
    epoch: u64,
    entries: HashMap<Key, Option<Any>>,
}

impl Cache {
    /// A cache whose entries last one view and one `period` of reweighing.
    pub(super) fn new(period: Duration) -> Cache {
        Cache { started: Instant::now(), period, inner: Mutex::default() }
    }

    /// The resource of `kind` named `name` for `client` in `snapshot`'s view, built at most
    /// once per view and period (or `None`: no such cluster).
    pub(super) fn get(
        &self,
        snapshot: &Snapshot,
        kind: Kind,
        name: &str,
        client: &ClientFacts,
    ) -> Option<Any> {
        let per_zone = kind == Kind::Endpoints
            && snapshot.view.clusters.get(name).is_some_and(|c| c.policy.locality.prefer_local);
        let key = (kind, name.to_owned(), if per_zone { client.zone.clone() } else { None });
        let epoch = (self.started.elapsed().as_millis() / self.period.as_millis().max(1)) as u64;
        let view = snapshot.view.id;
        // Built under the lock: the streams a view change wakes wait for the first to build.
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if (view, epoch) > (inner.view, inner.epoch) {
            inner.view = view;
            inner.epoch = epoch;
            inner.entries.clear();
        } else if (view, epoch) < (inner.view, inner.epoch) {
            drop(inner);
            return resources::build(snapshot, kind, name, client);
        }
        if let Some(hit) = inner.entries.get(&key) {
            return hit.clone();
        }
        let built = resources::build(snapshot, kind, name, client);
        if inner.entries.len() < MAX_ENTRIES {
            inner.entries.insert(key, built.clone());
        }
        built
    }
}
