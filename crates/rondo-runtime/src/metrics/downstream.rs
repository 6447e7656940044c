//! The client-facing request duration (`rondo_downstream_request_duration_seconds{listener,
//! route,status_class}`): from a request's arrival to the end of its response, so it covers
//! every try, the backoff between them and the router's own answers, where
//! `rondo_request_duration_seconds` times one try.
//!
//! The request path counts into [`DownstreamHandles`] resolved once per (listener, route): a
//! member's response through the route's [`super::RouteMetrics`], which keeps them at first use,
//! the router's own answers (rarer) through a look-up by name here. An observation is then one
//! bucket search and a few atomic adds.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::buckets::latency_histogram;

/// Labels of a client-facing request's duration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DownstreamLabels {
    /// Listener name.
    pub listener: String,
    /// Route name, empty when no route matched (the router's 404, a loop refused).
    pub route: String,
    /// `1xx` to `5xx`, of the status the client got.
    pub status_class: &'static str,
}

type Family5 = Family<DownstreamLabels, Histogram, fn() -> Histogram>;

/// The status classes, in [`class_of`]'s order.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// `status`'s class index (anything outside 100-499 counts as `5xx`).
fn class_of(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

/// One (listener, route)'s histograms, each class's created with its first request (a class
/// never seen is not shown).
#[derive(Debug)]
pub struct DownstreamHandles {
    listener: String,
    route: String,
    family: Family5,
    classes: [OnceLock<Histogram>; 5],
}

impl DownstreamHandles {
    /// The histogram a request answered with `status` counts into (a handle to keep and
    /// observe into later: a clone shares the counts).
    pub fn class(&self, status: u16) -> &Histogram {
        let i = class_of(status);
        self.classes[i].get_or_init(|| {
            let labels = DownstreamLabels {
                listener: self.listener.clone(),
                route: self.route.clone(),
                status_class: CLASSES[i],
            };
            self.family.get_or_create(&labels).clone()
        })
    }

    /// Counts a request answered with `status` after `seconds`.
    pub fn observe(&self, status: u16, seconds: f64) {
        self.class(status).observe(seconds);
    }
}

/// The handles made so far, listener → route → handles (looked up by `&str`, no key built).
#[derive(Debug)]
pub(super) struct DownstreamFamily {
    family: Family5,
    made: RwLock<HashMap<String, HashMap<String, Arc<DownstreamHandles>>>>,
}

impl Default for DownstreamFamily {
    fn default() -> Self {
        DownstreamFamily {
            family: Family::new_with_constructor(latency_histogram),
            made: RwLock::default(),
        }
    }
}

impl Metrics {
    /// The client-facing duration handles of `route` on `listener` (`""`: no route), made at
    /// the first call and shared after (keep them: the look-up takes a lock).
    pub fn downstream(&self, listener: &str, route: &str) -> Arc<DownstreamHandles> {
        let d = &self.downstream;
        let find = |made: &HashMap<String, HashMap<String, Arc<DownstreamHandles>>>| {
            made.get(listener).and_then(|routes| routes.get(route)).cloned()
        };
        if let Some(h) = find(&d.made.read().unwrap_or_else(|e| e.into_inner())) {
            return h;
        }
        let mut made = d.made.write().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = find(&made) {
            return h;
        }
        let handles = Arc::new(DownstreamHandles {
            listener: listener.to_owned(),
            route: route.to_owned(),
            family: d.family.clone(),
            classes: Default::default(),
        });
        let routes = made.entry(listener.to_owned()).or_default();
        routes.insert(route.to_owned(), handles.clone());
        handles
    }
}

/// Registers the family.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "downstream_request_duration_seconds",
        "Time from a request's arrival to the end of its response to the client, every try and the backoff between them included (the router's own answers too), by listener, route (empty: none matched) and the status class the client got",
        m.downstream.family.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_shared_per_listener_and_route_and_classes_appear_when_used() {
        let m = Metrics::new();
        let a = m.downstream("web", "main");
        assert!(Arc::ptr_eq(&a, &m.downstream("web", "main")));
        assert!(!Arc::ptr_eq(&a, &m.downstream("other", "main")));
        a.observe(200, 0.01);
        a.class(204).observe(0.3);
        m.downstream("web", "").observe(404, 0.001);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).expect("encode");
        let count = |labels: &str, n: u64| {
            format!("rondo_downstream_request_duration_seconds_count{{{labels}}} {n}\n")
        };
        let main = "listener=\"web\",route=\"main\",status_class=\"2xx\"";
        assert!(text.contains(&count(main, 2)), "{text}");
        let none = "listener=\"web\",route=\"\",status_class=\"4xx\"";
        assert!(text.contains(&count(none, 1)), "{text}");
        assert!(!text.contains("status_class=\"5xx\""), "{text}");
        let bucket =
            format!("rondo_downstream_request_duration_seconds_bucket{{le=\"0.128\",{main}}} 1\n");
        assert!(text.contains(&bucket), "{text}");
    }
}
