//! Metrics of the router's traffic filters: the `compress` filter's bytes before and after
//! compression, by route and encoding.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use super::{Counter, Metrics};

/// Labels of the `compress` filter's byte counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CompressLabels {
    /// Route name.
    pub route: String,
    /// `gzip`, `br` or `zstd`.
    pub encoding: &'static str,
}

impl Metrics {
    /// The counters of bytes a route's responses had before and after compression in
    /// `encoding`, looked up once per response.
    pub fn compress_counters(&self, route: &str, encoding: &'static str) -> (Counter, Counter) {
        let l = CompressLabels { route: route.to_owned(), encoding };
        (self.compress_in.get_or_create(&l).clone(), self.compress_out.get_or_create(&l).clone())
    }
}

pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "compress_bytes_in",
        "Response body bytes the compress filter took from members, by route and encoding",
        m.compress_in.clone(),
    );
    r.register(
        "compress_bytes_out",
        "Compressed response body bytes the compress filter sent to clients, by route and encoding",
        m.compress_out.clone(),
    );
}
