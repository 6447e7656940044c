//! The handles the naming service is given, one per part of the process it answers from or
//! feeds, in place of the process's whole live state: what it reaches is written down here.

use std::sync::Arc;

use rondo_runtime::metrics::Metrics;
use rondo_runtime::revoke::Revocations;
use rondo_runtime::sockets::Sockets;
use rondo_runtime::sockets::drain::Drain;
use rondo_runtime::{Live, Registrations, TierKeys, Views};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct NamingParts {
    /// The view its answers come from (and the tier's shared configuration the etcd backend
    /// sets on it).
    pub views: Views,
    /// The registered members' layer of the view, which the registry feeds.
    pub registrations: Registrations,
    /// Its metrics (registry, xDS, the tier's routers).
    pub metrics: Arc<Metrics>,
    /// This router's locality group, the default of a lookup's.
    pub group: Option<Arc<str>>,
    /// The process's sockets, which its listeners bind through.
    pub sockets: Arc<Sockets>,
    /// The drain, which stops the API.
    pub drain: Arc<Drain>,
    /// The revocations the etcd backend shares with the tier.
    pub revocations: Arc<Revocations>,
    /// The tier key the tier's shared configuration sets.
    pub tier_keys: TierKeys,
}

impl NamingParts {
    /// The naming service's handles of the process's live state (at the process's start).
    pub fn of(live: &Live) -> NamingParts {
        NamingParts {
            views: live.views.clone(),
            registrations: live.registrations.clone(),
            metrics: live.metrics.clone(),
            group: live.group.as_deref().map(Arc::from),
            sockets: live.sockets.clone(),
            drain: live.drain.clone(),
            revocations: live.revocations.clone(),
            tier_keys: live.tier_keys.clone(),
        }
    }
}
