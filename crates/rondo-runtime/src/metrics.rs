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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::{Snapshot, clock};

/// The `Content-Type` of [`Metrics::render`]'s output (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A row of TLS failures: (cluster, member, reason).
type TlsFailureKey = (String, String, &'static str);

/// Most (cluster, member, reason) rows of TLS failures kept for the admin API's explain.
pub const MAX_TLS_FAILURE_ROWS: usize = 10_000;

/// Labels of a response from a member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResponseLabels {
    /// Route name.
    pub route: String,
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
    /// `1xx` to `5xx`.
    pub class: &'static str,
}

/// Labels of a response's latency.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MemberRouteLabels {
    /// Route name.
    pub route: String,
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
}

/// Labels of a route's tries on a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouteClusterLabels {
    /// Route name.
    pub route: String,
    /// Cluster name.
    pub cluster: String,
}

/// Labels of a multicast copy's outcome (`rondo_multicast_copies_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MulticastLabels {
    /// Route name.
    pub route: String,
    /// The branch's cluster.
    pub branch: String,
    /// `answered`, `5xx`, `failed` (every try failed) or `overflow` (dropped: queue full).
    pub outcome: &'static str,
}

/// Labels of a session replay event (`rondo_session_replays_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReplayLabels {
    /// Route name.
    pub route: String,
    /// `replayed` (the kept requests reached the new member), `failed` (a replay try failed;
    /// the next member was tried) or `skipped` (over the limits: failed over without replay).
    pub result: &'static str,
}

/// Labels of a sign-on token refused on a route (`rondo_auth_refusals_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AuthLabels {
    /// Route name.
    pub route: String,
    /// Why (`missing`, `expired`, `bad_signature`, `wrong_audience`, `alg_none`, ...).
    pub reason: &'static str,
}

/// Labels of a cluster event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ClusterLabels {
    /// Cluster name.
    pub cluster: String,
}

/// Labels of a TLS listener event (a handshake, a certificate reload) and its result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TlsListenerLabels {
    /// Listener name.
    pub listener: String,
    /// `ok`, `failed` or `timeout` (handshakes); `accepted` or `rejected` (reloads).
    pub result: &'static str,
}

/// Labels of a failure of TLS to a member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TlsMemberLabels {
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
    /// [`rondo_core::TlsFailure::as_str`].
    pub reason: &'static str,
}

/// Labels of a member's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MemberLabels {
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
}

/// Labels of the reason a member takes no new requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MemberReasonLabels {
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
    /// [`rondo_core::Ineligible::as_str`].
    pub reason: &'static str,
}

/// Labels of a cluster's shadow evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ShadowLabels {
    /// Cluster name.
    pub cluster: String,
    /// The live algorithm.
    pub live: &'static str,
    /// The shadow algorithm.
    pub shadow: &'static str,
}

/// Labels of one side's (live or shadow) picks of a member in a shadow evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ShadowPickLabels {
    /// Cluster name.
    pub cluster: String,
    /// The shadow algorithm.
    pub shadow: &'static str,
    /// Member name (`(departed)` for the members that left since the shadow started).
    pub member: String,
    /// `live` or `shadow`.
    pub side: &'static str,
    /// `all`, `failed` (the member's next request to end failed) or `slow` (made while the
    /// member was slow).
    pub kind: &'static str,
}

/// Labels of a reload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `accepted` or `rejected`.
    pub result: &'static str,
}

/// Labels of a message from a load agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AgentLabels {
    /// `heartbeat` (UDP) or `hello` (TCP).
    pub kind: &'static str,
    /// What became of it: for heartbeats `accepted`, `bad_mac`, `truncated`, `bad_version`,
    /// `malformed`, `replayed` or `unknown_member`; for hellos `accepted` or `refused`.
    pub result: &'static str,
}

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

type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;
type Histograms = Family<MemberRouteLabels, Histogram, fn() -> Histogram>;

/// The latency buckets: 0.5 ms doubling to about 16 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The status classes of `rondo_requests_total`.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// A member's response metrics on one route: its latency histogram, and its response counter
/// of each status class, created with the class's first response (a class never seen is not
/// shown).
#[derive(Debug)]
pub struct ResponseHandles {
    labels: MemberRouteLabels,
    latency: Histogram,
    classes: [OnceLock<Counter>; 5],
}

impl ResponseHandles {
    /// Counts a response with `status` whose head arrived after `latency` seconds.
    pub fn record(&self, metrics: &Metrics, status: u16, latency: f64) {
        let class = match status {
            100..=199 => 0,
            200..=299 => 1,
            300..=399 => 2,
            400..=499 => 3,
            _ => 4,
        };
        self.latency.observe(latency);
        self.classes[class]
            .get_or_init(|| {
                let MemberRouteLabels { route, cluster, member } = self.labels.clone();
                let labels = ResponseLabels { route, cluster, member, class: CLASSES[class] };
                metrics.requests.get_or_create(&labels).clone()
            })
            .inc();
    }
}

/// One route's metrics on one cluster, resolved once and kept by the cluster runtime
/// (by the router, beside the cluster runtime): body bytes in and out, and each member's response
/// metrics, created with the member's first response.
#[derive(Debug)]
pub struct RouteMetrics {
    /// Route name.
    pub route: String,
    /// Cluster name.
    pub cluster: String,
    /// Request body bytes passed to the cluster's members (`rondo_bytes_in_total`).
    pub bytes_in: Counter,
    /// Response body bytes passed from the cluster's members to clients
    /// (`rondo_bytes_out_total`).
    pub bytes_out: Counter,
    members: Box<[OnceLock<ResponseHandles>]>,
}

impl RouteMetrics {
    /// The handles of `route` on `cluster`, whose members are `members` (by index).
    pub fn new(metrics: &Metrics, route: &str, cluster: &str, members: usize) -> RouteMetrics {
        let labels = RouteClusterLabels { route: route.to_owned(), cluster: cluster.to_owned() };
        RouteMetrics {
            route: route.to_owned(),
            cluster: cluster.to_owned(),
            bytes_in: metrics.bytes_in.get_or_create(&labels).clone(),
            bytes_out: metrics.bytes_out.get_or_create(&labels).clone(),
            members: (0..members).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Counts member `index` (called `name`)'s response with `status`, its head after
    /// `latency` seconds.
    pub fn record(&self, metrics: &Metrics, index: usize, name: &str, status: u16, latency: f64) {
        let Some(slot) = self.members.get(index) else { return };
        slot.get_or_init(|| metrics.response_handles(&self.route, &self.cluster, name))
            .record(metrics, status, latency);
    }
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
    responses: Family<RouterResponseLabels, Counter>,
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
    /// Bytes the session replay logs hold now (`rondo_session_replay_bytes`).
    pub replay_bytes: Gauge,
    /// Request body bytes passed to members (`rondo_bytes_in_total`), by route and cluster.
    pub bytes_in: Family<RouteClusterLabels, Counter>,
    /// Response body bytes passed to clients (`rondo_bytes_out_total`), by route and cluster.
    pub bytes_out: Family<RouteClusterLabels, Counter>,
    conn_active: Family<ListenerLabels, Gauge>,
    conn_accepted: Family<ListenerLabels, Counter>,
    conn_refused: Family<ListenerLabels, Counter>,
    conn_closed: Family<ClosedLabels, Counter>,
    http1_handoffs: Family<HandoffLabels, Counter>,
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
        let mut m = Metrics {
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
            registry_resyncs: Counter::default(),
            registrations: Gauge::default(),
            registry_bytes_written: Counter::default(),
            registry_compactions: Counter::default(),
            agent_messages: Family::default(),
            router_responses: Family::default(),
            multicast: Family::default(),
            replays: Family::default(),
            replay_bytes: Gauge::default(),
            bytes_in: Family::default(),
            bytes_out: Family::default(),
            conn_active: Family::default(),
            conn_accepted: Family::default(),
            conn_refused: Family::default(),
            conn_closed: Family::default(),
            http1_handoffs: Family::default(),
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
            scrape: Mutex::new(()),
            queues: OnceLock::new(),
        };
        for result in ["accepted", "rejected"] {
            m.reloads.get_or_create(&ReloadLabels { result }).inc_by(0);
        }
        m.process.register_collector(Box::new(crate::process::ProcessCollector));
        let r = &mut m.registry;
        r.register(
            "router_responses",
            "Responses the router made itself (no route, timeouts, body too large, bad gateway, no member...), by listener, route, cluster and status",
            m.router_responses.clone(),
        );
        r.register(
            "multicast_copies",
            "Copies of requests sent to multicast branches, by route, branch cluster and outcome (answered, 5xx, failed, overflow: dropped with the branch's queue full)",
            m.multicast.clone(),
        );
        r.register(
            "session_replays",
            "Sessions whose kept requests were replayed to the member that took them over, by route and result (replayed, failed, skipped: over the limits, failed over without replay)",
            m.replays.clone(),
        );
        r.register(
            "session_replay_bytes",
            "Bytes of requests the session replay logs hold",
            m.replay_bytes.clone(),
        );
        r.register(
            "bytes_in",
            "Request body bytes passed to members, by route and cluster",
            m.bytes_in.clone(),
        );
        r.register(
            "bytes_out",
            "Response body bytes passed from members to clients, by route and cluster",
            m.bytes_out.clone(),
        );
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
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind",
            m.access_dropped.clone(),
        );
        r.register(
            "requests",
            "Responses from members, by route, cluster, member and status class",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from sending a try to the member's response head, by route, cluster and member",
            m.latency.clone(),
        );
        r.register(
            "retries",
            "Tries after a request's first, by route and the cluster tried",
            m.retries.clone(),
        );
        r.register(
            "retry_budget_exhausted",
            "Retries refused because the cluster's retry budget was spent",
            m.budget_exhausted.clone(),
        );
        r.register(
            "auth_refusals",
            "Requests refused 401 by a route's auth before reaching a member, by route and reason",
            m.auth_refusals.clone(),
        );
        r.register("ejections", "Members ejected by outlier detection", m.ejections.clone());
        r.register(
            "ejection_returns",
            "Members back from an ejection (first success after it ended)",
            m.returns.clone(),
        );
        r.register(
            "drains_completed",
            "Draining members that reached no request in flight and no session",
            m.drains_completed.clone(),
        );
        r.register(
            "config_reloads",
            "Reloads of the config file (file change or SIGHUP), by result",
            m.reloads.clone(),
        );
        r.register("view_id", "Id of the live view", m.view.clone());
        r.register(
            "registry_connected",
            "1 while the naming registry backend is reachable, 0 while serving the last view without it",
            m.registry_connected.clone(),
        );
        r.register(
            "registry_resyncs",
            "Full resynchronisations with the naming registry (start, reconnect, compacted watch)",
            m.registry_resyncs.clone(),
        );
        r.register(
            "registry_registrations",
            "Members registered with the naming service",
            m.registrations.clone(),
        );
        r.register(
            "registry_bytes_written",
            "Bytes the embedded naming registry wrote (log appends and snapshots)",
            m.registry_bytes_written.clone(),
        );
        r.register(
            "registry_compactions",
            "Snapshots the embedded naming registry wrote to fold its log",
            m.registry_compactions.clone(),
        );
        r.register(
            "agent_messages",
            "Messages from load agents received, by kind (heartbeat, hello) and result",
            m.agent_messages.clone(),
        );
        r.register("member_in_flight", "Requests in flight on a member", m.in_flight.clone());
        r.register("member_sessions", "Sessions pinned to a member", m.sessions.clone());
        r.register(
            "member_healthy",
            "1 when the member's health checks (or the registry) say it is up, else 0; see member_eligible for whether it gets traffic",
            m.healthy.clone(),
        );
        r.register(
            "member_eligible",
            "1 when the member is a candidate for new requests and sessions now (admin state, health checks, ejection, agent, locality, panic), else 0",
            m.eligible.clone(),
        );
        r.register(
            "member_ineligible",
            "1 for the reason a member gets no new requests (disabled, draining, health_check, ejected, agent_silent, other_group); absent while it is eligible",
            m.ineligible.clone(),
        );
        r.register(
            "member_ejected",
            "1 while outlier detection keeps the member ejected, else 0",
            m.ejected.clone(),
        );
        r.register(
            "member_agent_heartbeat_age_seconds",
            "Age of the member's latest load-agent report (absent before the first)",
            m.agent_age.clone(),
        );
        r.register(
            "shadow_decisions",
            "Picks compared since the cluster's shadow algorithm started (rondo ctl shadow)",
            m.shadow_decisions.clone(),
        );
        r.register(
            "shadow_differed",
            "Of the picks compared, those where the shadow algorithm would have chosen another member",
            m.shadow_differed.clone(),
        );
        r.register(
            "shadow_picks",
            "Picks of a member by the live and by the shadow algorithm since the shadow started: all, those whose member's next request to end failed, those made while the member was slow",
            m.shadow_picks.clone(),
        );
        r.register(
            "tls_handshakes",
            "TLS handshakes with clients on TLS listeners, by listener and result (ok, failed: not TLS, no common version, a refused client certificate...; timeout)",
            m.tls_handshakes.clone(),
        );
        r.register(
            "tls_reloads",
            "Certificate reloads of TLS listeners (file change or SIGHUP), by listener and result",
            m.tls_reloads.clone(),
        );
        r.register(
            "tls_member_failures",
            "Tries that failed in TLS to a member, by cluster, member and reason",
            m.tls_member_failures.clone(),
        );
        m
    }

    /// Counts a TLS event of `listener` (a handshake or a reload) with `result`.
    pub fn tls_listener(&self, reloads: bool, listener: &str, result: &'static str) {
        let family = if reloads { &self.tls_reloads } else { &self.tls_handshakes };
        family.get_or_create(&TlsListenerLabels { listener: listener.to_owned(), result }).inc();
    }

    /// Counts a try that failed in TLS to `member` of `cluster`.
    pub fn tls_member_failure(&self, cluster: &str, member: &str, why: rondo_core::TlsFailure) {
        let labels = TlsMemberLabels {
            cluster: cluster.to_owned(),
            member: member.to_owned(),
            reason: why.as_str(),
        };
        self.tls_member_failures.get_or_create(&labels).inc();
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut rows = self.tls_failure_rows.lock().unwrap_or_else(|e| e.into_inner());
        let key = (labels.cluster, labels.member, labels.reason);
        let full = rows.len() >= MAX_TLS_FAILURE_ROWS;
        match rows.get_mut(&key) {
            Some(row) => *row = (row.0 + 1, at),
            // A new row past the cap is dropped (the counter above still counts it).
            None if full => {}
            None => {
                rows.insert(key, (1, at));
            }
        }
    }

    /// The TLS failures of `cluster`'s members since the process started, by member and reason:
    /// `(member, reason, count, last at in Unix ms)`, sorted by member and reason.
    pub fn tls_failures_of(&self, cluster: &str) -> Vec<(String, &'static str, u64, u64)> {
        let rows = self.tls_failure_rows.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = rows
            .iter()
            .filter(|((c, _, _), _)| c == cluster)
            .map(|((_, m, r), (n, at))| (m.clone(), *r, *n, *at))
            .collect();
        out.sort();
        out
    }

    /// Counts a member's response (its head arrived after `latency`).
    pub fn response(&self, route: &str, cluster: &str, member: &str, status: u16, latency: f64) {
        self.response_handles(route, cluster, member).record(self, status, latency);
    }

    /// A member's response metrics on a route, to keep and count into without building labels
    /// for every response (the router keeps one per route and member).
    pub fn response_handles(&self, route: &str, cluster: &str, member: &str) -> ResponseHandles {
        let labels = MemberRouteLabels {
            route: route.to_owned(),
            cluster: cluster.to_owned(),
            member: member.to_owned(),
        };
        let latency = self.latency.get_or_create(&labels).clone();
        ResponseHandles { labels, latency, classes: Default::default() }
    }

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
            responses: self.router_responses.clone(),
            local: RwLock::new(Vec::new()),
        })
    }

    /// Counts a try after a request's first, on `cluster`.
    pub fn retry(&self, route: &str, cluster: &str) {
        let labels = RouteClusterLabels { route: route.to_owned(), cluster: cluster.to_owned() };
        self.retries.get_or_create(&labels).inc();
    }

    /// Counts a retry refused by `cluster`'s retry budget.
    pub fn budget_exhausted(&self, route: &str, cluster: &str) {
        let labels = RouteClusterLabels { route: route.to_owned(), cluster: cluster.to_owned() };
        self.budget_exhausted.get_or_create(&labels).inc();
    }

    /// Counts a multicast copy of `route` to `branch` with `outcome`.
    pub fn multicast(&self, route: &str, branch: &str, outcome: &'static str) {
        let labels =
            MulticastLabels { route: route.to_owned(), branch: branch.to_owned(), outcome };
        self.multicast.get_or_create(&labels).inc();
    }

    /// Counts a session replay event of `route` with `result`.
    pub fn replay(&self, route: &str, result: &'static str) {
        self.replays.get_or_create(&ReplayLabels { route: route.to_owned(), result }).inc();
    }

    /// Counts a sign-on token refused on `route` for `reason`.
    pub fn auth_refused(&self, route: &str, reason: &'static str) {
        self.auth_refusals.get_or_create(&AuthLabels { route: route.to_owned(), reason }).inc();
    }

    /// The counter of agent messages of `kind` with `result` (shown from zero on once asked
    /// for; a clone counts into the same metric).
    pub fn agent_counter(&self, kind: &'static str, result: &'static str) -> Counter {
        self.agent_messages.get_or_create(&AgentLabels { kind, result }).clone()
    }

    /// Counts a config file reload.
    pub fn reload(&self, accepted: bool) {
        let result = if accepted { "accepted" } else { "rejected" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// Sets the shadow gauges of `cluster` from its shadow's report.
    fn shadow(&self, cluster: &str, r: &rondo_core::ShadowReport) {
        let gauge = |n: u64| n.min(i64::MAX as u64) as i64;
        let labels = ShadowLabels {
            cluster: cluster.to_owned(),
            live: r.live.as_str(),
            shadow: r.algorithm.as_str(),
        };
        self.shadow_decisions.get_or_create(&labels).set(gauge(r.decisions));
        self.shadow_differed.get_or_create(&labels).set(gauge(r.differed()));
        for m in &r.members {
            let member = if m.name.is_empty() { "(departed)".to_owned() } else { m.name.clone() };
            for (side, c) in [("live", m.live), ("shadow", m.shadow)] {
                for (kind, n) in [("all", c.picks), ("failed", c.failed), ("slow", c.slow)] {
                    let l = ShadowPickLabels {
                        cluster: cluster.to_owned(),
                        shadow: r.algorithm.as_str(),
                        member: member.clone(),
                        side,
                        kind,
                    };
                    self.shadow_picks.get_or_create(&l).set(gauge(n));
                }
            }
        }
    }

    /// Every metric in the Prometheus text format, the state gauges read from `snap` now.
    pub fn render(&self, snap: &Snapshot) -> String {
        let _serial = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        let now = clock::now();
        self.view.set(snap.view.id as i64);
        for f in [&self.in_flight, &self.sessions, &self.healthy, &self.eligible, &self.ejected] {
            f.clear();
        }
        self.ineligible.clear();
        let group = self.group.get().cloned().flatten();
        self.agent_age.clear();
        self.shadow_decisions.clear();
        self.shadow_differed.clear();
        self.shadow_picks.clear();
        for name in snap.view.clusters.keys() {
            let Some(rt) = snap.clusters.get(name) else { continue };
            // Event counters of every cluster are shown from zero on.
            let cl = ClusterLabels { cluster: name.clone() };
            self.ejections.get_or_create(&cl).inc_by(0);
            self.returns.get_or_create(&cl).inc_by(0);
            rt.with(|b| {
                let (eligibility, _) = b.eligibility(now, group.as_deref());
                for ((m, s), e) in rt.spec.members.iter().zip(b.states()).zip(eligibility) {
                    let l = MemberLabels { cluster: name.clone(), member: m.name.clone() };
                    self.in_flight.get_or_create(&l).set(s.load.in_flight as i64);
                    self.sessions.get_or_create(&l).set(s.load.sessions as i64);
                    self.healthy.get_or_create(&l).set(i64::from(s.healthy));
                    self.eligible.get_or_create(&l).set(i64::from(e.eligible));
                    if let (false, Some(why)) = (e.eligible, e.reason) {
                        let l = MemberReasonLabels {
                            cluster: name.clone(),
                            member: m.name.clone(),
                            reason: why.as_str(),
                        };
                        self.ineligible.get_or_create(&l).set(1);
                    }
                    let ejected = s.ejected_until.is_some_and(|u| u > now);
                    self.ejected.get_or_create(&l).set(i64::from(ejected));
                    if let Some(r) = s.load.agent {
                        self.agent_age.get_or_create(&l).set(now.since(r.at).as_secs_f64());
                    }
                }
                if let Some(r) = b.shadow_report(now) {
                    self.shadow(name, &r);
                }
            });
        }
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
