//! Spans exported over OTLP (`[tracing]`): the spans sent, and those lost, by reason (the
//! export queue was full, or the collector refused or did not answer an export). Two label
//! values in all.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of spans lost.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TraceDropLabels {
    /// `queue_full` (the exporter was behind) or `export_failed` (the collector failed a batch).
    pub reason: &'static str,
}

/// The families, kept in [`Metrics`].
#[derive(Debug, Default)]
pub(super) struct TraceFamilies {
    dropped: Family<TraceDropLabels, Counter>,
    exported: Counter,
}

impl Metrics {
    /// Counts `n` finished spans lost for `reason` (`queue_full` or `export_failed`).
    pub fn trace_dropped(&self, reason: &'static str, n: u64) {
        self.trace.dropped.get_or_create(&TraceDropLabels { reason }).inc_by(n);
    }

    /// Counts `n` spans a collector accepted.
    pub fn trace_exported(&self, n: u64) {
        self.trace.exported.inc_by(n);
    }
}

pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "trace_spans_dropped",
        "Finished spans not exported, by reason (queue_full: the export queue was full; \
         export_failed: the collector failed the batch)",
        m.trace.dropped.clone(),
    );
    r.register("trace_spans_exported", "Spans a collector accepted", m.trace.exported.clone());
}
