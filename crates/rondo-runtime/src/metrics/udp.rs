//! `udp` listeners: datagrams each way, flows open, started, evicted and refused, by listener
//! and cluster (`rondo_udp_*`). The data plane takes its handles once per listener and cluster
//! ([`Metrics::udp`]), so a datagram counts without building a label set.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of a `udp` listener's figure.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct UdpLabels {
    /// Listener name.
    pub listener: String,
    /// The cluster of its route (`""` for datagrams no cluster took).
    pub cluster: String,
}

/// The families, kept in [`Metrics`].
#[derive(Debug, Default)]
pub(super) struct UdpFamilies {
    datagrams_in: Family<UdpLabels, Counter>,
    datagrams_out: Family<UdpLabels, Counter>,
    dropped: Family<UdpLabels, Counter>,
    flows: Family<UdpLabels, Gauge>,
    flows_started: Family<UdpLabels, Counter>,
    evicted: Family<UdpLabels, Counter>,
    member_errors: Family<UdpLabels, Counter>,
}

/// One `udp` listener's handles for one cluster (clones count into the same series).
#[derive(Debug, Clone)]
pub struct UdpMetrics {
    /// Datagrams from clients passed to members (`rondo_udp_datagrams_in_total`).
    pub datagrams_in: Counter,
    /// Datagrams from members passed to clients (`rondo_udp_datagrams_out_total`).
    pub datagrams_out: Counter,
    /// Datagrams dropped: no member eligible, no socket for a new flow, or a send that
    /// failed (`rondo_udp_dropped_total`).
    pub dropped: Counter,
    /// Flows open now (`rondo_udp_flows`).
    pub flows: Gauge,
    /// Flows started (`rondo_udp_flows_started_total`).
    pub flows_started: Counter,
    /// Flows ended early to make room for a new one over `max_flows`
    /// (`rondo_udp_flows_evicted_total`).
    pub evicted: Counter,
    /// Flows ended by an error from their member, such as ICMP port unreachable
    /// (`rondo_udp_member_errors_total`).
    pub member_errors: Counter,
}

impl Metrics {
    /// The handles of `udp` listener `listener` for `cluster`.
    pub fn udp(&self, listener: &str, cluster: &str) -> UdpMetrics {
        let labels = UdpLabels { listener: listener.to_owned(), cluster: cluster.to_owned() };
        let u = &self.udp;
        UdpMetrics {
            datagrams_in: u.datagrams_in.get_or_create(&labels).clone(),
            datagrams_out: u.datagrams_out.get_or_create(&labels).clone(),
            dropped: u.dropped.get_or_create(&labels).clone(),
            flows: u.flows.get_or_create(&labels).clone(),
            flows_started: u.flows_started.get_or_create(&labels).clone(),
            evicted: u.evicted.get_or_create(&labels).clone(),
            member_errors: u.member_errors.get_or_create(&labels).clone(),
        }
    }
}

/// Registers the families.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    let u = &m.udp;
    r.register(
        "udp_datagrams_in",
        "Datagrams udp listeners passed from clients to members, by listener and cluster",
        u.datagrams_in.clone(),
    );
    r.register(
        "udp_datagrams_out",
        "Datagrams udp listeners passed from members back to clients, by listener and cluster",
        u.datagrams_out.clone(),
    );
    r.register(
        "udp_dropped",
        "Datagrams udp listeners dropped (no eligible member, no socket, a failed send)",
        u.dropped.clone(),
    );
    r.register(
        "udp_flows",
        "Flows open on udp listeners, by listener and cluster",
        u.flows.clone(),
    );
    r.register("udp_flows_started", "Flows started on udp listeners", u.flows_started.clone());
    r.register(
        "udp_flows_evicted",
        "Flows ended to make room for a new one over the listener's max_flows",
        u.evicted.clone(),
    );
    r.register(
        "udp_member_errors",
        "Flows ended by an error from their member (ICMP port unreachable)",
        u.member_errors.clone(),
    );
}
