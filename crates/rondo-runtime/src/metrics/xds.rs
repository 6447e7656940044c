//! The naming service's xDS server: connected clients (in all and by the cluster they
//! subscribed to), and responses pushed, ACKed and NACKed by resource type. The server takes
//! its handles once ([`Metrics::xds`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{ClusterLabels, Metrics};

/// Labels of an xDS exchange.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct XdsTypeLabels {
    /// The resource type: `lds`, `rds`, `cds` or `eds`.
    pub r#type: &'static str,
}

/// The families, kept in [`Metrics`].
#[derive(Debug, Default)]
pub(super) struct XdsFamilies {
    clients: Gauge,
    cluster_clients: Family<ClusterLabels, Gauge>,
    pushes: Family<XdsTypeLabels, Counter>,
    acks: Family<XdsTypeLabels, Counter>,
    nacks: Family<XdsTypeLabels, Counter>,
}

/// The handles of the xDS server's figures.
#[derive(Debug, Clone)]
pub struct XdsMetrics {
    /// ADS streams open (`rondo_xds_clients`).
    pub clients: Gauge,
    /// Responses sent, ACKs and NACKs received, by type (`rondo_xds_{pushes,acks,nacks}_total`).
    pub pushes: Family<XdsTypeLabels, Counter>,
    /// ACKs received by type.
    pub acks: Family<XdsTypeLabels, Counter>,
    /// NACKs received by type.
    pub nacks: Family<XdsTypeLabels, Counter>,
    /// Connected clients by the cluster they subscribed to (`rondo_xds_cluster_clients`).
    pub cluster_clients: Family<ClusterLabels, Gauge>,
}

impl XdsMetrics {
    /// The counter of responses pushed of type `t`.
    pub fn pushed(&self, t: &'static str) -> Counter {
        self.pushes.get_or_create(&XdsTypeLabels { r#type: t }).clone()
    }

    /// The counter of ACKs of type `t`.
    pub fn acked(&self, t: &'static str) -> Counter {
        self.acks.get_or_create(&XdsTypeLabels { r#type: t }).clone()
    }

    /// The counter of NACKs of type `t`.
    pub fn nacked(&self, t: &'static str) -> Counter {
        self.nacks.get_or_create(&XdsTypeLabels { r#type: t }).clone()
    }

    /// The gauge of clients connected to `cluster`.
    pub fn cluster(&self, cluster: &str) -> Gauge {
        self.cluster_clients.get_or_create(&ClusterLabels { cluster: cluster.to_owned() }).clone()
    }
}

impl Metrics {
    /// The xDS clients connected to `cluster` now (0 without an xDS server; adds no series).
    pub fn xds_clients_of(&self, cluster: &str) -> i64 {
        let labels = ClusterLabels { cluster: cluster.to_owned() };
        self.xds.cluster_clients.get(&labels).map_or(0, |g| g.get())
    }

    /// The xDS server's handles (clones count into the same metrics).
    pub fn xds(&self) -> XdsMetrics {
        let x = &self.xds;
        XdsMetrics {
            clients: x.clients.clone(),
            pushes: x.pushes.clone(),
            acks: x.acks.clone(),
            nacks: x.nacks.clone(),
            cluster_clients: x.cluster_clients.clone(),
        }
    }
}

/// Registers the families.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    let x = &m.xds;
    r.register("xds_clients", "xDS (ADS) streams open on the naming service", x.clients.clone());
    r.register(
        "xds_cluster_clients",
        "Connected xDS clients by the cluster (Listener) they subscribed to",
        x.cluster_clients.clone(),
    );
    r.register("xds_pushes", "xDS responses sent, by resource type", x.pushes.clone());
    r.register("xds_acks", "xDS responses ACKed by clients, by resource type", x.acks.clone());
    r.register(
        "xds_nacks",
        "xDS responses rejected (NACKed) by clients, by resource type",
        x.nacks.clone(),
    );
}
