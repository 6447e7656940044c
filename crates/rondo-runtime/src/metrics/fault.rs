//! The `fault` filter's injections (`rondo_filter_faults_total{route, kind}`): every delay and
//! abort it injected, so that a fault left on by mistake shows.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of an injected fault.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FaultLabels {
    /// Route name.
    pub route: String,
    /// `delay` or `abort`.
    pub kind: &'static str,
}

impl Metrics {
    /// The counter of `kind` faults injected on `route` (the filter keeps it: no label set is
    /// built per request).
    pub fn fault_counter(&self, route: &str, kind: &'static str) -> Counter {
        self.faults.get_or_create(&FaultLabels { route: route.to_owned(), kind }).clone()
    }
}

/// Registers the fault filter's counter.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "filter_faults",
        "Faults the `fault` filter injected, by route and kind (delay, abort)",
        m.faults.clone(),
    );
}
