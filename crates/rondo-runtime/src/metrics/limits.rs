//! The `rate_limit` filter's figures: requests it answered 429 and buckets it dropped to stay
//! within `max_keys`, each by listener and route. The filter takes its counters once, when its
//! chain is compiled ([`Metrics::rate_limited`], [`Metrics::rate_limit_evictions`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of a rate limit's figures.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct LimitLabels {
    /// Listener name.
    pub listener: String,
    /// Route name; empty for a listener's own filter, whose buckets every route shares.
    pub route: String,
}

/// The families, kept in [`Metrics`].
#[derive(Debug, Default)]
pub(super) struct LimitFamilies {
    limited: Family<LimitLabels, Counter>,
    evicted: Family<LimitLabels, Counter>,
}

/// Registers the families.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "filter_rate_limited",
        "Requests a route's rate_limit filter answered 429, by listener and route",
        m.limits.limited.clone(),
    );
    r.register(
        "filter_rate_limit_evictions",
        "Buckets a rate_limit filter dropped (least recently used) to keep at most max_keys, by listener and route (empty for a listener's filter)",
        m.limits.evicted.clone(),
    );
}

impl Metrics {
    /// The counter of requests limited on `route` of `listener`.
    pub fn rate_limited(&self, listener: &str, route: &str) -> Counter {
        let labels = LimitLabels { listener: listener.to_owned(), route: route.to_owned() };
        self.limits.limited.get_or_create(&labels).clone()
    }

    /// The counter of buckets evicted by a filter of `route` (empty: of the listener).
    pub fn rate_limit_evictions(&self, listener: &str, route: &str) -> Counter {
        let labels = LimitLabels { listener: listener.to_owned(), route: route.to_owned() };
        self.limits.evicted.get_or_create(&labels).clone()
    }
}
