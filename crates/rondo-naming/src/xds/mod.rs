//! The naming service as an xDS management server (feature `xds`): the aggregated discovery
//! service (ADS, state of the world, which is what gRPC clients speak) over the live view, so
//! that a gRPC client in any language with the target `xds:///CLUSTER` balances by the
//! cluster's members, health, drains, weights, locality and retries with no proxy on the path.
//!
//! - `resources`: the Listener, RouteConfiguration, Cluster and ClusterLoadAssignment of a
//!   cluster, built from the snapshot (the policy mapping).
//! - `stream`: one client's stream: subscriptions, nonces, ACK and NACK, pushes on view changes.
//! - `cache`: the resources of the current view, built once for every stream.
//!
//! The view id is every response's `version_info`. The server only reads the view: it takes no
//! registrations.

mod cache;
mod resources;
mod stream;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use rondo_runtime::Views;

use crate::NamingParts;
use rondo_runtime::metrics::{Gauge, XdsMetrics};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use resources::{FAILOVER_SUFFIX, Kind};
pub use stream::MAX_NAMES;

/// Largest request message accepted (a subscription of [`MAX_NAMES`] long names fits).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Responses queued for one client before its stream waits for it to read.
const QUEUE: usize = 16;

/// One connected client as the server counts it: the clusters (Listeners) it subscribed to.
#[derive(Debug, Clone, Default)]
struct ClientInfo {
    services: BTreeSet<String>,
}

/// What every stream shares.
#[derive(Debug)]
struct Shared {
    /// Set when the server stops: every stream ends (clients reconnect, to the process that
    /// took the socket over in an upgrade).
    closing: tokio::sync::watch::Sender<bool>,
    /// The resources of the current view, shared by the streams.
    cache: cache::Cache,
    metrics: XdsMetrics,
    clients: Mutex<HashMap<u64, ClientInfo>>,
    next_client: AtomicU64,
    max_clients: usize,
}

impl Shared {
    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ClientInfo>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, kind: Kind) {
        self.metrics.pushed(kind.label()).inc();
    }

    fn ack(&self, kind: Kind) {
        self.metrics.acked(kind.label()).inc();
    }

    fn nack(&self, kind: Kind) {
        self.metrics.nacked(kind.label()).inc();
    }

    fn cluster_gauge(&self, cluster: &str) -> Gauge {
        self.metrics.cluster(cluster)
    }
}

/// A connected client's entry in [`Shared::clients`], removed when its stream ends.
struct ClientGuard {
    shared: Arc<Shared>,
    id: u64,
    node: String,
}

impl ClientGuard {
    fn node(&self) -> &str {
        &self.node
    }

    /// The client's node id, for the log (at most 256 characters kept).
    fn set_node(&mut self, node: &str) {
        self.node = node.chars().take(256).collect();
    }

    /// The clusters (Listeners) the client subscribed to, of those `known` (in the view: a
    /// client's made-up names add no metric labels).
    fn set_services(&self, names: &BTreeSet<String>, known: impl Fn(&str) -> bool) {
        let services: BTreeSet<String> = names.iter().filter(|n| known(n)).cloned().collect();
        let mut clients = self.shared.clients();
        let Some(c) = clients.get_mut(&self.id) else { return };
        for gone in c.services.difference(&services) {
            self.shared.cluster_gauge(gone).dec();
        }
        for new in services.difference(&c.services) {
            self.shared.cluster_gauge(new).inc();
        }
        c.services = services;
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        if let Some(c) = self.shared.clients().remove(&self.id) {
            for service in &c.services {
                self.shared.cluster_gauge(service).dec();
            }
        }
        self.shared.metrics.clients.dec();
    }
}

/// The ADS service.
struct Ads {
    views: Views,
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let id = self.shared.next_client.fetch_add(1, Ordering::Relaxed);
        {
            let mut clients = self.shared.clients();
            if clients.len() >= self.shared.max_clients {
                return Err(Status::resource_exhausted(format!(
                    "{} xDS clients connected, `[naming] xds.max_clients` = {}",
                    clients.len(),
                    self.shared.max_clients
                )));
            }
            clients.insert(id, ClientInfo::default());
            self.shared.metrics.clients.inc();
        }
        let guard = ClientGuard { shared: self.shared.clone(), id, node: String::new() };
        let (tx, rx) = mpsc::channel(QUEUE);
        let stream = stream::Stream::new(self.views.clone(), self.shared.clone(), guard, tx);
        tokio::spawn(stream.run(request.into_inner()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "delta xDS is not served: use the state-of-the-world stream (gRPC clients do)",
        ))
    }
}

/// A running ADS server; dropping it stops it (open streams end with it).
#[derive(Debug)]
pub struct XdsServer {
    /// The bound address.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl XdsServer {
    /// Stops accepting and ends every stream with `UNAVAILABLE` (clients keep their config and
    /// reconnect: in a hitless upgrade, to the new process, which holds the socket now).
    pub fn stop(&self) {
        self.task.abort();
        self.shared.closing.send_replace(true);
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the ADS server on `listen` (taken over from the previous process in an upgrade),
/// serving `parts`' view to at most `max_clients` streams at once.
pub async fn start(
    listen: SocketAddr,
    parts: &NamingParts,
    max_clients: usize,
) -> std::io::Result<XdsServer> {
    let listener = parts.sockets.tcp_listener("naming xds", listen)?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        closing: tokio::sync::watch::channel(false).0,
        cache: cache::Cache::new(stream::REWEIGH),
        metrics: parts.metrics.xds(),
        clients: Mutex::default(),
        next_client: AtomicU64::new(0),
        max_clients,
    });
    let ads = Ads { views: parts.views.clone(), shared: shared.clone() };
    let service =
        AggregatedDiscoveryServiceServer::new(ads).max_decoding_message_size(MAX_REQUEST_BYTES);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        // Pings find clients that vanished without closing (a partition, a host gone): their
        // streams end instead of holding a slot of `max_clients` for ever.
        let served = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .tcp_nodelay(true)
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            tracing::error!("xds server on {addr}: {e}");
        }
    });
    Ok(XdsServer { addr, shared, task })
}
