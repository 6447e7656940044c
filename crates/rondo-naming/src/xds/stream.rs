//! One ADS stream (state of the world): what the client subscribed to per resource type, the
//! nonce and content of the last response of each type, and the handling of requests (first
//! request, ACK, NACK, stale nonce) and of view changes (a push of every type whose resources
//! changed). A NACK is logged and counted; nothing is resent until the resources change, so
//! the client keeps its last good config.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;
use rondo_runtime::Views;
use tokio::sync::mpsc;
use tonic::Status;

use super::resources::{ClientFacts, Kind};
use super::{ClientGuard, Shared};

/// Most resource names one client may subscribe to per type: a stream's state stays bounded.
pub const MAX_NAMES: usize = 1024;

/// How often a stream rebuilds its endpoints to follow load-driven weights (`least-cpu`,
/// `most-free-memory`, `response-time`): pushed only when they changed.
pub(super) const REWEIGH: std::time::Duration = std::time::Duration::from_secs(3);

/// What a client subscribed to of one type, and what it was last sent.
#[derive(Debug, Default)]
struct Sub {
    names: BTreeSet<String>,
    /// The nonce of the last response of this type (0: none sent).
    nonce: u64,
    /// A hash of the last response's resources, to send only what changed.
    sent: Option<u64>,
}

/// The state of one stream.
pub(super) struct Stream {
    views: Views,
    shared: Arc<Shared>,
    guard: ClientGuard,
    client: ClientFacts,
    subs: HashMap<Kind, Sub>,
    next_nonce: u64,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
}

impl Stream {
    pub(super) fn new(
        views: Views,
        shared: Arc<Shared>,
        guard: ClientGuard,
        tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) -> Stream {
        Stream {
            views,
            shared,
            guard,
            client: ClientFacts::default(),
            subs: HashMap::new(),
            next_nonce: 0,
            tx,
        }
    }

    /// Serves the stream until the client goes, the server stops, or the client breaks the
    /// protocol (the stream then ends with the status saying why).
    pub(super) async fn run(mut self, mut inbound: tonic::Streaming<DiscoveryRequest>) {
        let mut view = self.views.subscribe();
        let mut closing = self.shared.closing.subscribe();
        let mut reweigh = tokio::time::interval(REWEIGH);
        reweigh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // Only ever set to true: any change (or the server gone) is the end.
                _ = closing.changed() => {
                    let status = Status::unavailable("the naming service's xDS server stopped");
                    let _ = self.tx.send(Err(status)).await;
                    return;
                }
                _ = reweigh.tick() => {
                    // Load-driven weights change without a new view.
                    if !self.push(Kind::Endpoints, false).await {
                        return;
                    }
                }
                req = inbound.message() => match req {
                    Ok(Some(req)) => {
                        if let Err(status) = self.request(req).await {
                            let _ = self.tx.send(Err(status)).await;
                            return;
                        }
                    }
                    Ok(None) | Err(_) => return,
                },
                changed = view.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    for kind in Kind::ALL {
                        if !self.push(kind, false).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// One request: a first request of its type, an ACK or a NACK of the last response, or a
    /// stale one (ignored, as the protocol says).
    async fn request(&mut self, req: DiscoveryRequest) -> Result<(), Status> {
        let Some(kind) = Kind::of(&req.type_url) else {
            // A type this server does not serve: nothing to send (clients ask for it anyway).
            return Ok(());
        };
        if req.resource_names.len() > MAX_NAMES {
            return Err(Status::invalid_argument(format!(
                "{} resource names of type {}: at most {MAX_NAMES} per type",
                req.resource_names.len(),
                kind.label()
            )));
        }
        if let Some(node) = &req.node {
            if self.guard.node().is_empty() {
                self.guard.set_node(&node.id);
            }
            let zone = node.locality.as_ref().map(|l| l.zone.clone()).filter(|z| !z.is_empty());
            if zone.is_some() {
                self.client.zone = zone;
            }
        }
        let sub = self.subs.entry(kind).or_default();
        if !req.response_nonce.is_empty() {
            if req.response_nonce != sub.nonce.to_string() {
                return Ok(());
            }
            match &req.error_detail {
                Some(e) => {
                    tracing::warn!(
                        node = self.guard.node(),
                        kind = kind.label(),
                        version = req.version_info,
                        reason = e.message,
                        "xds: the client rejected the resources (NACK) and keeps its last good config"
                    );
                    self.shared.nack(kind);
                }
                None => self.shared.ack(kind),
            }
        }
        let names: BTreeSet<String> = req.resource_names.into_iter().collect();
        let first = sub.nonce == 0;
        if names != sub.names || first {
            sub.names = names;
            if kind == Kind::Listener {
                let snapshot = self.views.load();
                self.guard.set_services(&sub.names, |n| snapshot.clusters.contains_key(n));
            }
            self.push(kind, true).await;
        }
        Ok(())
    }

    /// Sends the subscribed resources of `kind` when they changed since the last response (or
    /// always, with `force`); false when the client is gone.
    async fn push(&mut self, kind: Kind, force: bool) -> bool {
        let Some(sub) = self.subs.get_mut(&kind) else { return true };
        if sub.nonce == 0 && !force {
            return true;
        }
        let snapshot = self.views.load();
        let resources: Vec<_> = sub
            .names
            .iter()
            .filter_map(|n| self.shared.cache.get(&snapshot, kind, n, &self.client))
            .collect();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for r in &resources {
            r.type_url.hash(&mut h);
            r.value.hash(&mut h);
        }
        let hash = h.finish();
        if !force && sub.sent == Some(hash) {
            return true;
        }
        self.next_nonce += 1;
        sub.nonce = self.next_nonce;
        sub.sent = Some(hash);
        let resp = DiscoveryResponse {
            version_info: snapshot.view.id.to_string(),
            resources,
            type_url: kind.type_url().to_owned(),
            nonce: sub.nonce.to_string(),
            ..Default::default()
        };
        tracing::debug!(
            node = self.guard.node(),
            kind = kind.label(),
            version = snapshot.view.id,
            bytes = resp.encoded_len(),
            "xds: push"
        );
        self.shared.push(kind);
        self.tx.send(Ok(resp)).await.is_ok()
    }
}
