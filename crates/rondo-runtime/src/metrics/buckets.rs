//! The buckets of every latency histogram: the members' (`router.rs`) and the clients'
//! (`downstream.rs`) alike, so that the two can be compared bucket by bucket.

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// The latency buckets: 0.5 ms doubling to about 16 s.
pub(super) fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}
