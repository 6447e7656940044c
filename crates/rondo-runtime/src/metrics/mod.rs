//! The router's Prometheus metrics (`/metrics` on the admin listener, `docs/admin.md`).
//!
//! Events are counted where they happen: responses and their latency, bytes, retries and
//! retry-budget exhaustion on the request path (`rondo-proxy`), responses the router makes
//! itself and connections per listener through the handles of [`ListenerMetrics`], ejections in
//! [`crate::ClusterRt`], reloads in [`crate::Reloader`]. State (view id, in-flight, sessions,
//! health, ejection, agent heartbeat age) is read from the live snapshot when scraped, by
//! [`Metrics::render`], and the process's figures (CPU, memory, descriptors) from `/proc/self`
//! at the same moment ([`crate::process`]).
//!
//! The request path never builds a label set: it counts into handles resolved once per
//! listener ([`ListenerMetrics`]) or per route and cluster ([`RouteMetrics`]).
//!
//! By product: `router` (the request path), `listener` (connections and hand-offs),
//! `members` (cluster events and member state), `naming` (the registry and load agents),
//! `tls`, `quic` (HTTP/3 listeners), `xds` (the naming service's xDS server), `dns` (`members_dns`), `udp` (`udp` listeners), `splice` (tcp listeners' bytes, spliced or copied), `trace` (spans exported over OTLP); the durable queues' figures are rendered by [`crate::queues`] and the process's by
//! [`crate::process`].

mod buckets;
mod departed;
mod dns;
mod downstream;
mod fault;
mod filters;
mod limits;
mod listener;
mod members;
mod naming;
mod quic;
mod router;
mod splice;
mod tls;
mod tls_detail;
mod trace;
mod udp;
mod xds;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::clock;

use buckets::latency_histogram;
pub use departed::DEPARTED_GRACE;
pub use dns::DnsLabels;
pub use downstream::{DownstreamHandles, DownstreamLabels};
pub use fault::FaultLabels;
pub use filters::CompressLabels;
pub use limits::LimitLabels;
pub use listener::{
    ClosedLabels, Handoff, HandoffLabels, Handoffs, ListenerLabels, ListenerMetrics, OpenConn,
    RouterResponseLabels,
};
pub use members::{
    ClusterLabels, MemberLabels, MemberReasonLabels, Scraped, ShadowLabels, ShadowPickLabels,
};
pub use naming::AgentLabels;
pub use quic::{Http3Labels, Http3Metrics};
use router::Histograms;
pub use router::{
    AuthLabels, GrpcLabels, MemberRouteLabels, MulticastLabels, ReplayLabels, ResponseHandles,
    ResponseLabels, RouteClusterLabels, RouteMetrics,
};
pub use splice::{BodyBytes, ForwardedLabels};
use tls::TlsFailureKey;
pub use tls::{MAX_TLS_FAILURE_ROWS, TlsListenerLabels, TlsMemberLabels};
pub use tls_detail::{OcspLabels, TlsDetail, TlsKxLabels};
pub use trace::TraceDropLabels;
pub use udp::{UdpLabels, UdpMetrics};
pub use xds::{XdsMetrics, XdsTypeLabels};

/// The `Content-Type` of [`Metrics::render`]'s output (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Labels of a reload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `accepted` or `rejected`.
    pub result: &'static str,
}

type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Every metric, registered once; shared by [`crate::Live`] and its cluster runtimes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Responses from members by status class (`rondo_requests_total`).
    pub requests: Family<ResponseLabels, Counter>,
    /// Time from sending a try to the member's response head (`rondo_request_duration_seconds`).
    pub latency: Histograms,
    /// Tries after a request's first (`rondo_retries_total`), by the cluster tried.
    pub retries: Family<RouteClusterLabels, Counter>,
    /// Retries refused by the cluster's retry budget (`rondo_retry_budget_exhausted_total`).
    pub budget_exhausted: Family<RouteClusterLabels, Counter>,
    /// Sign-on tokens refused by a route's `auth` (`rondo_auth_refusals_total`).
    pub auth_refusals: Family<AuthLabels, Counter>,
    /// Passive ejections by outlier detection (`rondo_ejections_total`).
    pub ejections: Family<ClusterLabels, Counter>,
    /// Members back from an ejection (`rondo_ejection_returns_total`).
    pub returns: Family<ClusterLabels, Counter>,
    /// Draining members that reached no request in flight and no session
    /// (`rondo_drains_completed_total`).
    pub drains_completed: Family<ClusterLabels, Counter>,
    /// Config file reloads by result (`rondo_config_reloads_total`).
    pub reloads: Family<ReloadLabels, Counter>,
    /// 1 while the registry backend is reachable (`rondo_registry_connected`; the embedded one
    /// always is), 0 while a router serves its last view without it.
    pub registry_connected: Gauge,
    /// The tier's routers present in the etcd registry, this one included
    /// (`rondo_tier_routers`; 1 without an etcd registry): a tier `rate_limit`'s divisor.
    pub tier_routers: Gauge,
    /// Other routers of the tier whose load reports this one counts (`[tier]`;
    /// `rondo_tier_load_routers`): a router silent for 3 intervals is no longer one.
    pub tier_load_routers: Gauge,
    /// Full resynchronisations with the registry (`rondo_registry_resyncs_total`).
    pub registry_resyncs: Counter,
    /// Registered members known (`rondo_registry_registrations`).
    pub registrations: Gauge,
    /// Bytes the embedded registry wrote to its log and snapshots
    /// (`rondo_registry_bytes_written_total`): flat per registration, whatever the registry's
    /// size.
    pub registry_bytes_written: Counter,
    /// Snapshots the embedded registry wrote to fold its log (`rondo_registry_compactions_total`).
    pub registry_compactions: Counter,
    /// Messages from load agents by kind and result (`rondo_agent_messages_total`); the agent
    /// receiver counts into them ([`Metrics::agent_counter`]).
    pub agent_messages: Family<AgentLabels, Counter>,
    /// Responses the router made itself (`rondo_router_responses_total`), by listener, route,
    /// cluster and status.
    pub router_responses: Family<RouterResponseLabels, Counter>,
    /// Multicast copies by route, branch and outcome (`rondo_multicast_copies_total`).
    pub multicast: Family<MulticastLabels, Counter>,
    /// Session replays by route and result (`rondo_session_replays_total`).
    pub replays: Family<ReplayLabels, Counter>,
    /// Requests refused by a cluster's circuit breaker (`rondo_circuit_breaker_refusals_total`).
    pub breakers: Family<router::BreakerLabels, Counter>,
    /// Hedged tries by cluster and outcome (`rondo_hedges_total`).
    pub hedges: Family<router::HedgeLabels, Counter>,
    /// Faults the `fault` filter injected, by route and kind (`rondo_filter_faults_total`).
    pub faults: Family<FaultLabels, Counter>,
    /// Bytes the session replay logs hold now (`rondo_session_replay_bytes`).
    pub replay_bytes: Gauge,
    /// Request body bytes passed to members (`rondo_bytes_in_total`), by route and cluster.
    pub bytes_in: Family<RouteClusterLabels, Counter>,
    /// Response body bytes passed to clients (`rondo_bytes_out_total`), by route and cluster.
    pub bytes_out: Family<RouteClusterLabels, Counter>,
    /// gRPC calls by route, cluster and final status (`rondo_grpc_responses_total`).
    pub grpc_responses: Family<GrpcLabels, Counter>,
    /// The `rate_limit` filters' figures.
    limits: limits::LimitFamilies,
    /// The xDS server's figures.
    xds: xds::XdsFamilies,
    /// `udp` listeners' figures.
    udp: udp::UdpFamilies,
    /// `members_dns` resolutions and members.
    dns: dns::DnsFamilies,
    /// Bytes tcp sessions forwarded, spliced or copied (`rondo_tcp_forwarded_bytes_total`).
    splice: splice::SpliceFamilies,
    /// Client-facing request durations (`rondo_downstream_request_duration_seconds`).
    downstream: downstream::DownstreamFamily,
    /// Spans exported over OTLP and lost (`[tracing]`).
    trace: trace::TraceFamilies,
    /// Bytes the `compress` filter took in (`rondo_compress_bytes_in_total`).
    compress_in: Family<CompressLabels, Counter>,
    /// Bytes the `compress` filter sent out (`rondo_compress_bytes_out_total`).
    compress_out: Family<CompressLabels, Counter>,
    conn_active: Family<ListenerLabels, Gauge>,
    conn_accepted: Family<ListenerLabels, Counter>,
    conn_refused: Family<ListenerLabels, Counter>,
    proxy_protocol: Family<listener::ProxyProtocolLabels, Counter>,
    conn_closed: Family<ClosedLabels, Counter>,
    http1_handoffs: Family<HandoffLabels, Counter>,
    http3_events: Family<Http3Labels, Counter>,
    access_dropped: Family<ListenerLabels, Counter>,
    /// The process's figures, without the `rondo_` prefix (the names every exporter uses).
    process: Registry,
    view: Gauge,
    in_flight: Family<MemberLabels, Gauge>,
    sessions: Family<MemberLabels, Gauge>,
    healthy: Family<MemberLabels, Gauge>,
    eligible: Family<MemberLabels, Gauge>,
    ineligible: Family<MemberReasonLabels, Gauge>,
    ejected: Family<MemberLabels, Gauge>,
    /// The router's locality group, for eligibility (set once by [`crate::Live::new`]).
    pub group: std::sync::OnceLock<Option<String>>,
    agent_age: Family<MemberLabels, F64Gauge>,
    shadow_decisions: Family<ShadowLabels, Gauge>,
    shadow_differed: Family<ShadowLabels, Gauge>,
    shadow_picks: Family<ShadowPickLabels, Gauge>,
    /// TLS handshakes with clients by listener and result (`rondo_tls_handshakes_total`).
    pub tls_handshakes: Family<TlsListenerLabels, Counter>,
    /// Certificate reloads of TLS listeners by result (`rondo_tls_reloads_total`).
    pub tls_reloads: Family<TlsListenerLabels, Counter>,
    /// Tries that failed in TLS to a member, by reason (`rondo_tls_member_failures_total`).
    pub tls_member_failures: Family<TlsMemberLabels, Counter>,
    /// The same failures as the admin API's explain shows them: (cluster, member, reason) ->
    /// (count, last at, Unix ms); at most [`MAX_TLS_FAILURE_ROWS`] rows.
    tls_failure_rows: Mutex<HashMap<TlsFailureKey, (u64, u64)>>,
    /// Serialises scrapes (each refills the state gauges).
    scrape: Mutex<()>,
    /// The series of members, noted to be removed once the member has left.
    departed: departed::Departed,
    /// Key exchange groups of TLS handshakes and OCSP fetches (`rondo_tls_key_exchanges_total`,
    /// `rondo_tls_ocsp_fetches_total`).
    pub tls_detail: TlsDetail,
    /// The process's durable queues, once `rondo serve` started them: their figures are read
    /// at scrape time ([`crate::queues::render`]) and the admin API operates their dead letters.
    pub queues: OnceLock<Arc<dyn crate::queues::QueueOps>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric registered, at zero.
    pub fn new() -> Metrics {
        let mut m = Metrics::zeroed();
        m.register_all();
        m
    }

    /// Every family and gauge at zero (the tier's router count at one, this one), none
    /// registered yet.
    fn zeroed() -> Metrics {
        Metrics {
            registry: Registry::with_prefix("rondo"),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            retries: Family::default(),
            budget_exhausted: Family::default(),
            auth_refusals: Family::default(),
            ejections: Family::default(),
            returns: Family::default(),
            drains_completed: Family::default(),
            reloads: Family::default(),
            registry_connected: Gauge::default(),
            tier_routers: {
                let g = Gauge::default();
                g.set(1);
                g
            },
            tier_load_routers: Gauge::default(),
            registry_resyncs: Counter::default(),
            registrations: Gauge::default(),
            registry_bytes_written: Counter::default(),
            registry_compactions: Counter::default(),
            agent_messages: Family::default(),
            router_responses: Family::default(),
            multicast: Family::default(),
            replays: Family::default(),
            breakers: Family::default(),
            hedges: Family::default(),
            faults: Family::default(),
            replay_bytes: Gauge::default(),
            bytes_in: Family::default(),
            bytes_out: Family::default(),
            grpc_responses: Family::default(),
            limits: Default::default(),
            xds: Default::default(),
            udp: Default::default(),
            dns: Default::default(),
            splice: Default::default(),
            downstream: Default::default(),
            trace: Default::default(),
            compress_in: Family::default(),
            compress_out: Family::default(),
            conn_active: Family::default(),
            conn_accepted: Family::default(),
            conn_refused: Family::default(),
            proxy_protocol: Family::default(),
            conn_closed: Family::default(),
            http1_handoffs: Family::default(),
            http3_events: Family::default(),
            access_dropped: Family::default(),
            process: Registry::default(),
            view: Gauge::default(),
            in_flight: Family::default(),
            sessions: Family::default(),
            healthy: Family::default(),
            eligible: Family::default(),
            ineligible: Family::default(),
            ejected: Family::default(),
            group: std::sync::OnceLock::new(),
            agent_age: Family::default(),
            shadow_decisions: Family::default(),
            shadow_differed: Family::default(),
            shadow_picks: Family::default(),
            tls_handshakes: Family::default(),
            tls_reloads: Family::default(),
            tls_member_failures: Family::default(),
            tls_failure_rows: Mutex::new(HashMap::new()),
            departed: departed::Departed::default(),
            tls_detail: TlsDetail::default(),
            scrape: Mutex::new(()),
            queues: OnceLock::new(),
        }
    }

    /// Registers every family: the process collector, then product by product.
    fn register_all(&mut self) {
        let m = self;
        for result in ["accepted", "rejected"] {
            m.reloads.get_or_create(&ReloadLabels { result }).inc_by(0);
        }
        m.process.register_collector(Box::new(crate::process::ProcessCollector));
        // Registered product by product, in the order `/metrics` has always shown them.
        let mut r = std::mem::take(&mut m.registry);
        router::register_outcomes(m, &mut r);
        listener::register(m, &mut r);
        router::register_tries(m, &mut r);
        downstream::register(m, &mut r);
        fault::register(m, &mut r);
        members::register_events(m, &mut r);
        r.register(
            "config_reloads",
            "Reloads of the config file (file change or SIGHUP), by result",
            m.reloads.clone(),
        );
        r.register("view_id", "Id of the live view", m.view.clone());
        naming::register(m, &mut r);
        members::register_state(m, &mut r);
        tls::register(m, &mut r);
        m.tls_detail.register(&mut r);
        quic::register(m, &mut r);
        limits::register(m, &mut r);
        filters::register(m, &mut r);
        xds::register(m, &mut r);
        udp::register(m, &mut r);
        dns::register(m, &mut r);
        splice::register(m, &mut r);
        trace::register(m, &mut r);
        m.registry = r;
    }

    /// Counts a config file reload.
    pub fn reload(&self, accepted: bool) {
        let result = if accepted { "accepted" } else { "rejected" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// Every metric in the Prometheus text format, the state gauges read from `snap` now.
    pub fn render(&self, snap: &impl Scraped) -> String {
        let _serial = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        let now = clock::now();
        self.view.set(snap.view().id as i64);
        self.members_changed(snap.view(), None);
        self.member_state(snap, now);
        let mut out = String::new();
        // Writing to a String cannot fail. The text format has no end marker, so the process's
        // unprefixed registry follows the rest.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.process);
        if let Some(q) = self.queues.get() {
            out.push_str(&crate::queues::render(&q.stats()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Snapshot;

    #[test]
    fn responses_are_counted_by_status_class() {
        let m = Metrics::new();
        for status in [200, 204, 302, 404, 500, 503, 101] {
            m.response("r", "c", "m", status, 0.001);
        }
        let n = |class| {
            let l = ResponseLabels {
                route: "r".into(),
                cluster: "c".into(),
                member: "m".into(),
                class,
            };
            m.requests.get_or_create(&l).get()
        };
        assert_eq!((n("1xx"), n("2xx"), n("3xx"), n("4xx"), n("5xx")), (1, 2, 1, 1, 2));
        let snap = Snapshot {
            view: Arc::new(rondo_core::View {
                id: 7,
                routes: vec![],
                clusters: Default::default(),
            }),
            clusters: Default::default(),
            registered: Default::default(),
            declared: Default::default(),
        };
        let text = m.render(&snap);
        assert!(text.contains("rondo_view_id 7\n"), "{text}");
        assert!(
            text.contains(
                "rondo_request_duration_seconds_count{route=\"r\",cluster=\"c\",member=\"m\"} 7\n"
            ),
            "{text}"
        );
        assert!(text.contains("rondo_config_reloads_total{result=\"rejected\"} 0\n"), "{text}");
    }
}
