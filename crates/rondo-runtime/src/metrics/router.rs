//! The router's request path: members' responses and their latency, retries and the retry
//! budget, body bytes, multicast copies, session replays, sign-on refusals, and the handles the
//! request path keeps so that it never builds a label set ([`RouteMetrics`], [`ResponseHandles`]).

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use rondo_core::grpc::Code;

use super::Metrics;

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

/// Labels of a gRPC call's final status (`rondo_grpc_responses_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct GrpcLabels {
    /// Route name.
    pub route: String,
    /// Cluster name.
    pub cluster: String,
    /// The status's name (`ok`, `unavailable`, `deadline-exceeded`, ...).
    pub grpc_status: &'static str,
}

/// Labels of a multicast copy's outcome (`rondo_multicast_copies_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MulticastLabels {
    /// Route name.
    pub route: String,
    /// The branch's cluster.
    pub branch: String,
    /// `answered`, `5xx`, `failed` (every try failed), `overflow` (dropped: queue full) or
    /// `too_large` (a mirror skipped: the body over `multicast_max_body_bytes`).
    pub outcome: &'static str,
}

/// Labels of a hedged try (`rondo_hedges_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HedgeLabels {
    /// Cluster name.
    pub cluster: String,
    /// `won` (its answer was the request's) or `lost` (another try answered first).
    pub outcome: &'static str,
}

/// Labels of a request a circuit breaker refused (`rondo_circuit_breaker_refusals_total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BreakerLabels {
    /// Cluster name.
    pub cluster: String,
    /// `max_requests` or `max_requests_per_member`.
    pub limit: &'static str,
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

/// A member's latency histograms on a route.
pub(super) type Histograms = Family<MemberRouteLabels, Histogram, fn() -> Histogram>;

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
    /// gRPC calls' statuses, each code's counter created with its first call.
    grpc: Box<[OnceLock<Counter>]>,
    grpc_family: Family<GrpcLabels, Counter>,
    /// The route's client-facing durations, resolved at its first answer.
    downstream: OnceLock<std::sync::Arc<super::DownstreamHandles>>,
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
            grpc: (0..Code::NAMES.len()).map(|_| OnceLock::new()).collect(),
            grpc_family: metrics.grpc_responses.clone(),
            downstream: OnceLock::new(),
        }
    }

    /// The route's client-facing duration handles on `listener` (its route's listener),
    /// resolved at the first call.
    pub fn downstream(&self, metrics: &Metrics, listener: &str) -> &super::DownstreamHandles {
        self.downstream.get_or_init(|| metrics.downstream(listener, &self.route))
    }

    /// Counts a gRPC call on the route and cluster that ended with `code` (a member's status,
    /// or the router's own answer).
    pub fn grpc_status(&self, code: Code) {
        let Some(slot) = self.grpc.get(code.number() as usize) else { return };
        slot.get_or_init(|| {
            let labels = GrpcLabels {
                route: self.route.clone(),
                cluster: self.cluster.clone(),
                grpc_status: code.name(),
            };
            self.grpc_family.get_or_create(&labels).clone()
        })
        .inc();
    }

    /// Counts member `index` (called `name`)'s response with `status`, its head after
    /// `latency` seconds.
    pub fn record(&self, metrics: &Metrics, index: usize, name: &str, status: u16, latency: f64) {
        let Some(slot) = self.members.get(index) else { return };
        slot.get_or_init(|| metrics.response_handles(&self.route, &self.cluster, name))
            .record(metrics, status, latency);
    }
}

impl Metrics {
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
        self.departed.route(cluster, member, route);
        ResponseHandles { labels, latency, classes: Default::default() }
    }

    /// Counts a hedge on `cluster`: its answer `won`, or it lost (`rondo_hedges_total`).
    pub fn hedge(&self, cluster: &str, won: bool) {
        let outcome = if won { "won" } else { "lost" };
        self.hedges.get_or_create(&HedgeLabels { cluster: cluster.to_owned(), outcome }).inc();
    }

    /// Counts a request a circuit breaker of `cluster` refused (`rondo_circuit_breaker_refusals_total`).
    pub fn breaker(&self, cluster: &str, limit: &'static str) {
        let labels = BreakerLabels { cluster: cluster.to_owned(), limit };
        self.breakers.get_or_create(&labels).inc();
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
}

/// Registers the router's own responses, multicast copies, session replays and body bytes.
pub(super) fn register_outcomes(m: &Metrics, r: &mut Registry) {
    r.register(
            "router_responses",
            "Responses the router made itself (no route, timeouts, body too large, bad gateway, no member...), by listener, route, cluster and status",
            m.router_responses.clone(),
        );
    r.register(
            "multicast_copies",
            "Copies of requests sent to multicast branches and mirrors, by route, branch cluster and outcome (answered, 5xx, failed, overflow: dropped with the branch's queue full, too_large: a mirror skipped for its body)",
            m.multicast.clone(),
        );
    r.register(
            "session_replays",
            "Sessions whose kept requests were replayed to the member that took them over, by route and result (replayed, failed, skipped: over the limits, failed over without replay)",
            m.replays.clone(),
        );
    r.register(
        "hedges",
        "Hedged tries (a second try for a slow answer, retry.hedge) by cluster and outcome (won: its answer was the request's; lost: another try answered first)",
        m.hedges.clone(),
    );
    r.register(
        "circuit_breaker_refusals",
        "Requests a cluster's circuit breaker refused at once (answered 503 unless a backup cluster took them), by cluster and limit (max_requests, max_requests_per_member)",
        m.breakers.clone(),
    );
    r.register(
        "session_replay_bytes",
        "Bytes of requests the session replay logs hold",
        m.replay_bytes.clone(),
    );
    r.register(
        "grpc_responses",
        "gRPC calls by route, cluster and final gRPC status (a member's, in its answer's head or trailers, or the router's own answer)",
        m.grpc_responses.clone(),
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
}

/// Registers members' responses, their latency, retries, the retry budget and sign-on refusals.
pub(super) fn register_tries(m: &Metrics, r: &mut Registry) {
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
}
