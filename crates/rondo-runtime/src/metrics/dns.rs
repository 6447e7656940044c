//! Members discovered through DNS (`members_dns`): resolutions by cluster and result, and the
//! members the last answer gave each cluster. One series per configured cluster with
//! `members_dns` (and result), so the label sets are bounded by the configuration; a cluster
//! whose `members_dns` goes away has its series removed.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{ClusterLabels, Metrics};

/// Labels of a DNS resolution.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DnsLabels {
    /// The cluster resolved for.
    pub cluster: String,
    /// `ok` (an answer, possibly empty) or `error` (no answer: timeout, refusal, no server).
    pub result: &'static str,
}

/// The families, kept in [`Metrics`].
#[derive(Debug, Default)]
pub(super) struct DnsFamilies {
    resolutions: Family<DnsLabels, Counter>,
    members: Family<ClusterLabels, Gauge>,
}

impl Metrics {
    /// Counts a resolution of `cluster`'s `members_dns`.
    pub fn dns_resolved(&self, cluster: &str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.dns
            .resolutions
            .get_or_create(&DnsLabels { cluster: cluster.to_owned(), result })
            .inc();
    }

    /// Sets how many members `cluster` has from DNS now.
    pub fn dns_members(&self, cluster: &str, n: usize) {
        let labels = ClusterLabels { cluster: cluster.to_owned() };
        self.dns.members.get_or_create(&labels).set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Removes `cluster`'s DNS series (its `members_dns` went away).
    pub fn dns_forget(&self, cluster: &str) {
        for result in ["ok", "error"] {
            self.dns.resolutions.remove(&DnsLabels { cluster: cluster.to_owned(), result });
        }
        self.dns.members.remove(&ClusterLabels { cluster: cluster.to_owned() });
    }
}

pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "dns_resolutions",
        "Resolutions of clusters' members_dns, by cluster and result (ok or error)",
        m.dns.resolutions.clone(),
    );
    r.register(
        "dns_members",
        "Members of a cluster taken from its last DNS answer",
        m.dns.members.clone(),
    );
}
