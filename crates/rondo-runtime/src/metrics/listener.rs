//! A listener's connections: open, accepted, refused over `max_connections`, closed by a
//! timeout, handed from the own HTTP/1 path to hyper's ([`Handoff`]), access log lines dropped,
//! and the responses the router makes itself, through handles resolved once per listener
//! ([`ListenerMetrics`]).

use std::sync::{Arc, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of a listener's connections.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ListenerLabels {
    /// Listener name.
    pub listener: String,
}

/// Labels of connections closed by a timeout.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ClosedLabels {
    /// Listener name.
    pub listener: String,
    /// `header_timeout` or `idle_timeout`.
    pub reason: &'static str,
}

/// Labels of a connection's PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProxyProtocolLabels {
    /// Listener name.
    pub listener: String,
    /// `accepted`, `own_address`, `refused_untrusted`, `refused_missing`, `refused_malformed`.
    pub result: &'static str,
}

/// Labels of a connection the own HTTP/1 path handed to hyper.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandoffLabels {
    /// Listener name.
    pub listener: String,
    /// A [`Handoff`]'s label.
    pub reason: &'static str,
}

/// Labels of a response the router made itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouterResponseLabels {
    /// Listener name.
    pub listener: String,
    /// Route name, empty when no route matched (or the response came before routing).
    pub route: String,
    /// The route's cluster, empty when no route matched.
    pub cluster: String,
    /// HTTP status.
    pub status: u16,
}

/// A listener's metrics, resolved once when it starts: connections and the responses the
/// router makes itself (404, 408, 413, 431, 502, 503, 504...).
#[derive(Debug)]
pub struct ListenerMetrics {
    /// Listener name.
    pub listener: String,
    /// Client connections open now (`rondo_connections_active`).
    pub active: Gauge,
    /// Client connections accepted (`rondo_connections_accepted_total`).
    pub accepted: Counter,
    /// Client connections refused over `max_connections` (`rondo_connections_refused_total`).
    pub refused: Counter,
    /// Connections closed because a request head did not arrive in time (answered 408).
    pub header_timeouts: Counter,
    /// Connections closed after waiting idle for their next request for the idle timeout.
    pub idle_timeouts: Counter,
    /// Access log lines dropped because the writer fell behind (`rondo_access_log_dropped_total`).
    pub access_dropped: Counter,
    /// Connections handed to hyper, per reason (`rondo_http1_handoffs_total`).
    pub handoffs: Handoffs,
    /// HTTP/1 body bytes spliced or copied (`rondo_http_body_bytes_total`).
    pub bodies: super::BodyBytes,
    responses: Family<RouterResponseLabels, Counter>,
    proxy_protocol: Family<ProxyProtocolLabels, Counter>,
    /// The router's own responses seen so far by route, cluster and status, so that a flood of
    /// them builds no label set after the first.
    local: RwLock<Vec<(String, String, u16, Counter)>>,
}

/// A client connection counted as open; counted as closed when dropped.
#[derive(Debug)]
pub struct OpenConn(Arc<ListenerMetrics>);

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.0.active.dec();
    }
}

/// Why the own HTTP/1 path hands a connection to hyper (the `reason` of
/// `rondo_http1_handoffs_total`, the table in `docs/router.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// HTTP/2: the h2c preface, or `h2` chosen by ALPN.
    H2,
    /// An HTTP/1.0 request.
    Http10,
    /// A target that is not origin-form.
    TargetForm,
    /// A request carrying `Upgrade`.
    Upgrade,
    /// A route whose members are spoken to over TLS or HTTP/2.
    Upstream,
    /// A route that reads or holds the body (body filters, multicast, session replay).
    Route,
}

impl Handoff {
    /// Every reason, in the order [`Handoffs`] keeps their counters.
    pub const ALL: [Handoff; 6] = [
        Handoff::H2,
        Handoff::Http10,
        Handoff::TargetForm,
        Handoff::Upgrade,
        Handoff::Upstream,
        Handoff::Route,
    ];

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Handoff::H2 => "h2",
            Handoff::Http10 => "http10",
            Handoff::TargetForm => "target_form",
            Handoff::Upgrade => "upgrade",
            Handoff::Upstream => "upstream",
            Handoff::Route => "route",
        }
    }
}

/// A listener's hand-off counters, one per [`Handoff`], resolved when the listener starts.
#[derive(Debug)]
pub struct Handoffs([Counter; 6]);

impl Handoffs {
    /// Counts a connection handed to hyper for `reason`.
    pub fn inc(&self, reason: Handoff) {
        self.0[reason as usize].inc();
    }

    /// Connections handed to hyper for `reason` so far.
    pub fn get(&self, reason: Handoff) -> u64 {
        self.0[reason as usize].get()
    }

    /// Every reason with its count so far, in [`Handoff::ALL`]'s order.
    pub fn counts(&self) -> Vec<(Handoff, u64)> {
        Handoff::ALL.iter().map(|&r| (r, self.get(r))).collect()
    }
}

impl ListenerMetrics {
    /// A connection's PROXY protocol header read with `result` (`rondo_proxy_protocol_total`).
    pub fn proxy_protocol(&self, result: &'static str) {
        let labels = ProxyProtocolLabels { listener: self.listener.clone(), result };
        self.proxy_protocol.get_or_create(&labels).inc();
    }

    /// Counts a connection accepted and open until the returned guard is dropped.
    pub fn opened(self: &Arc<Self>) -> OpenConn {
        self.accepted.inc();
        self.active.inc();
        OpenConn(self.clone())
    }

    /// Counts a response with `status` made by the router itself, on `route` of `cluster` when
    /// a route matched.
    pub fn router_response(&self, status: u16, route: Option<&str>, cluster: Option<&str>) {
        let (route, cluster) = (route.unwrap_or(""), cluster.unwrap_or(""));
        let find = |list: &[(String, String, u16, Counter)]| {
            list.iter()
                .find(|(r, c, s, _)| *s == status && r == route && c == cluster)
                .map(|(_, _, _, counter)| counter.clone())
        };
        let found = find(&self.local.read().unwrap_or_else(|e| e.into_inner()));
        let counter = match found {
            Some(c) => c,
            None => {
                let mut list = self.local.write().unwrap_or_else(|e| e.into_inner());
                match find(&list) {
                    Some(c) => c,
                    None => {
                        let labels = RouterResponseLabels {
                            listener: self.listener.clone(),
                            route: route.to_owned(),
                            cluster: cluster.to_owned(),
                            status,
                        };
                        let c = self.responses.get_or_create(&labels).clone();
                        // Bounded by routes x statuses (a route removed by a reload stays).
                        list.push((route.to_owned(), cluster.to_owned(), status, c.clone()));
                        c
                    }
                }
            }
        };
        counter.inc();
    }
}

impl Metrics {
    /// The handles of listener `name`, its counters shown from zero on.
    pub fn listener(&self, name: &str) -> Arc<ListenerMetrics> {
        let l = ListenerLabels { listener: name.to_owned() };
        let closed = |reason| {
            let c =
                self.conn_closed.get_or_create(&ClosedLabels { listener: name.to_owned(), reason });
            c.clone()
        };
        Arc::new(ListenerMetrics {
            listener: name.to_owned(),
            active: self.conn_active.get_or_create(&l).clone(),
            accepted: self.conn_accepted.get_or_create(&l).clone(),
            refused: self.conn_refused.get_or_create(&l).clone(),
            header_timeouts: closed("header_timeout"),
            idle_timeouts: closed("idle_timeout"),
            access_dropped: self.access_dropped.get_or_create(&l).clone(),
            handoffs: Handoffs(Handoff::ALL.map(|reason| {
                let labels = HandoffLabels { listener: name.to_owned(), reason: reason.label() };
                self.http1_handoffs.get_or_create(&labels).clone()
            })),
            bodies: self.body_bytes(name),
            responses: self.router_responses.clone(),
            proxy_protocol: self.proxy_protocol.clone(),
            local: RwLock::new(Vec::new()),
        })
    }
}

/// Registers the listeners' connection families.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register("connections_active", "Client connections open", m.conn_active.clone());
    r.register("connections_accepted", "Client connections accepted", m.conn_accepted.clone());
    r.register(
        "connections_refused",
        "Client connections refused over the listener's max_connections",
        m.conn_refused.clone(),
    );
    r.register(
        "connections_closed",
        "Client connections closed by a timeout: header_timeout (answered 408) or idle_timeout",
        m.conn_closed.clone(),
    );
    r.register(
            "http1_handoffs",
            "Client connections the router's own HTTP/1 path handed to hyper's, by the reason of the first request it declined",
            m.http1_handoffs.clone(),
        );
    r.register(
        "proxy_protocol",
        "Client connections by what their PROXY protocol header said: accepted (a client address), own_address (LOCAL, UNKNOWN or no header where optional), or why they were refused",
        m.proxy_protocol.clone(),
    );
    r.register(
        "access_log_dropped",
        "Access log lines dropped because the writer fell behind",
        m.access_dropped.clone(),
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Snapshot;

    fn empty_snapshot() -> Snapshot {
        Snapshot {
            view: Arc::new(rondo_core::View {
                id: 1,
                routes: vec![],
                clusters: Default::default(),
            }),
            clusters: Default::default(),
            registered: Default::default(),
            declared: Default::default(),
        }
    }

    /// Each typed reason counts under its own label, the one `docs/router.md` names.
    #[test]
    fn each_handoff_reason_counts_under_its_documented_label() {
        let documented = ["h2", "http10", "target_form", "upgrade", "upstream", "route"];
        let m = Metrics::new();
        let l = m.listener("web");
        for (n, reason) in Handoff::ALL.into_iter().enumerate() {
            for _ in 0..=n {
                l.handoffs.inc(reason);
            }
        }
        let text = m.render(&empty_snapshot());
        for (n, label) in documented.iter().enumerate() {
            let line = format!(
                "rondo_http1_handoffs_total{{listener=\"web\",reason=\"{label}\"}} {}\n",
                n + 1
            );
            assert!(text.contains(&line), "{line}: {text}");
        }
        let counts: Vec<u64> = l.handoffs.counts().into_iter().map(|(_, c)| c).collect();
        assert_eq!(counts, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(l.handoffs.get(Handoff::Route), 6);
    }
}
