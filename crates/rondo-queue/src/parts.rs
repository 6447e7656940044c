//! The handles the queues are given, in place of the process's whole live state: the view
//! deliveries place their tries on, the metrics, the sockets the intakes bind through, and
//! what an intake's `auth` reads.

use std::sync::Arc;

use rondo_identity::auth::GateParts;
use rondo_runtime::metrics::Metrics;
use rondo_runtime::revoke::Revocations;
use rondo_runtime::sockets::Sockets;
use rondo_runtime::{Live, TierKeys, Views};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct QueueParts {
    /// The view a delivery's tries are placed on, and an intake's routes.
    pub views: Views,
    /// The queues' and their listeners' metrics (the admin API reaches the queues there).
    pub metrics: Arc<Metrics>,
    /// This router's locality group, for placing.
    pub group: Option<String>,
    /// The process's sockets, which the intakes bind through.
    pub sockets: Arc<Sockets>,
    /// The tier's key, for an intake's `auth`.
    pub tier_keys: TierKeys,
    /// The revoked tokens, for an intake's `auth`.
    pub revocations: Arc<Revocations>,
}

impl QueueParts {
    /// The queues' handles of the process's live state (at the process's start).
    pub fn of(live: &Live) -> QueueParts {
        QueueParts {
            views: live.views.clone(),
            metrics: live.metrics.clone(),
            group: live.group.clone(),
            sockets: live.sockets.clone(),
            tier_keys: live.tier_keys.clone(),
            revocations: live.revocations.clone(),
        }
    }

    /// What an intake's `auth` gate reads.
    pub fn gate(&self) -> GateParts<'_> {
        GateParts {
            tier_keys: &self.tier_keys,
            revocations: &self.revocations,
            metrics: &self.metrics,
        }
    }
}
