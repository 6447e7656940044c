//! The handles the admin API is given, one per part of the process it shows or changes, in
//! place of the process's whole live state: what it reaches is written down here.

use std::sync::Arc;

use rondo_runtime::defaults::Defaults;
use rondo_runtime::metrics::Metrics;
use rondo_runtime::revoke::Revocations;
use rondo_runtime::sockets::Sockets;
use rondo_runtime::sockets::drain::Drain;
use rondo_runtime::sockets::handoff::Upgrader;
use rondo_runtime::{Live, Views};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct AdminParts {
    /// The view in effect: status, explanations, member and cluster changes, config applies.
    pub views: Views,
    /// The metrics it serves, and the queues' and xDS clients' state they carry.
    pub metrics: Arc<Metrics>,
    /// The drain, for the readiness probe.
    pub drain: Arc<Drain>,
    /// This router's locality group, for eligibility.
    pub group: Option<String>,
    /// The runtime defaults it shows and changes.
    pub defaults: Arc<Defaults>,
    /// The revocations it lists and adds to.
    pub revocations: Arc<Revocations>,
    /// How it starts a hitless upgrade.
    pub upgrader: Arc<Upgrader>,
    /// The process's sockets, which its listeners bind through (an upgrade hands them over).
    pub sockets: Arc<Sockets>,
}

impl AdminParts {
    /// The admin API's handles of the process's live state (at the process's start).
    pub fn of(live: &Live) -> AdminParts {
        AdminParts {
            views: live.views.clone(),
            metrics: live.metrics.clone(),
            drain: live.drain.clone(),
            group: live.group.clone(),
            defaults: live.defaults.clone(),
            revocations: live.revocations.clone(),
            upgrader: live.upgrader.clone(),
            sockets: live.sockets.clone(),
        }
    }
}
