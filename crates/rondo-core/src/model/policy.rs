//! A cluster's [`Policy`], everything that governs how it is balanced, with the knobs that
//! belong to no other part: load agents, peak EWMA, xDS, circuit breakers, connection limits.

use std::time::Duration;

use super::algorithm::{Algorithm, Granularity, HashPolicy, Locality, SlowStart};
use super::health::{HealthCheck, OutlierDetection};
use super::retry::RetryPolicy;

/// Load-agent expectations (SGD Advanced Load Management).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct AgentPolicy {
    /// A member that has reported once and then stays silent this long is unavailable, and its
    /// report no longer counts for `least-cpu` / `most-free-memory`.
    #[cfg_attr(feature = "serde", serde(rename = "timeout_ms", with = "crate::wire::millis"))]
    pub timeout: Duration,
}

impl Default for AgentPolicy {
    fn default() -> Self {
        // Three missed 200 ms heartbeats.
        AgentPolicy { timeout: Duration::from_millis(600) }
    }
}

/// Peak-EWMA parameters for `p2c-ewma`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct EwmaPolicy {
    /// Decay time constant: how fast old observations fade (Finagle default 10 s).
    #[cfg_attr(feature = "serde", serde(rename = "decay_ms", with = "crate::wire::millis"))]
    pub decay: Duration,
    /// Estimate for members never observed.
    #[cfg_attr(feature = "serde", serde(rename = "default_rtt_ms", with = "crate::wire::millis"))]
    pub default_rtt: Duration,
    /// A failed request counts as a latency of at least this much.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "failure_penalty_ms", with = "crate::wire::millis")
    )]
    pub failure_penalty: Duration,
}

impl Default for EwmaPolicy {
    fn default() -> Self {
        EwmaPolicy {
            decay: Duration::from_secs(10),
            default_rtt: Duration::from_millis(30),
            failure_penalty: Duration::from_secs(1),
        }
    }
}

/// Everything that governs how one cluster is balanced (PKUAS's reference policy).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct Policy {
    /// The picker.
    pub algorithm: Algorithm,
    /// When a pick happens.
    pub granularity: Granularity,
    /// Ramp for new or recovered members.
    pub slow_start: SlowStart,
    /// Locality preference.
    pub locality: Locality,
    /// When fewer than this percentage of the (active) members are healthy, the cluster balances
    /// over all active members regardless of health (Envoy's panic mode); 0 disables.
    pub panic_threshold_percent: u8,
    /// Active health checks; `None` assumes members are up unless something else says otherwise.
    pub health: Option<HealthCheck>,
    /// Passive outlier detection.
    pub outlier: OutlierDetection,
    /// Retries and failover.
    pub retry: RetryPolicy,
    /// Consistent hashing (used by `hash`).
    pub hash: HashPolicy,
    /// Load agents (used by `least-cpu`, `most-free-memory`, and availability).
    pub agent: AgentPolicy,
    /// Peak EWMA (used by `p2c-ewma`).
    pub ewma: EwmaPolicy,
    /// How long the data plane's connections to members live.
    pub connections: ConnectionLimits,
    /// How gRPC answers count (failure codes, codes retried).
    pub grpc: crate::grpc::GrpcPolicy,
    /// How long a new connection to a member may take to open (`connect_timeout`); past it the
    /// try fails as a connect failure.
    pub connect_timeout: Duration,
    /// Circuit breakers: caps on the requests in flight.
    pub limits: RequestLimits,
    /// The PROXY protocol header each new connection to a member starts with
    /// (`proxy_protocol`, `tcp` clusters); `None`: none.
    pub send_proxy: Option<ProxyHeader>,
    /// What the naming service's xDS server tells proxyless gRPC clients (`xds`).
    pub xds: XdsPolicy,
    /// Routers add the view id (`rondo-view-id`) to the responses they proxy for this cluster
    /// (`view_id_header`), so that clients see a newer view on any reply (PKUAS).
    pub view_id_header: bool,
}

/// A cluster's `xds`: how proxyless gRPC clients of the naming service's xDS server balance it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct XdsPolicy {
    /// The client's LB policy (`lb`).
    pub lb: XdsLb,
}

/// The LB policy a proxyless gRPC client runs for a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum XdsLb {
    /// The policy that maps the cluster's algorithm (docs/naming.md's table).
    #[default]
    Auto,
    /// Client-side weighted round robin by the ORCA load reports the members send (gRFC A58),
    /// round robin where the client lacks it: for members that report their own load.
    OrcaWrr,
}

impl XdsLb {
    /// Every value, in the order documentation lists them.
    pub const ALL: [XdsLb; 2] = [XdsLb::Auto, XdsLb::OrcaWrr];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            XdsLb::Auto => "auto",
            XdsLb::OrcaWrr => "orca-wrr",
        }
    }

    /// The value spelt `s`, if any.
    pub fn parse(s: &str) -> Option<XdsLb> {
        XdsLb::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// A version of HAProxy's PROXY protocol header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ProxyHeader {
    /// Version 1, text.
    V1,
    /// Version 2, binary.
    V2,
}

/// Circuit breakers on a cluster's requests in flight (Envoy's `max_requests`): over a cap a
/// request is refused at once rather than queued behind the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct RequestLimits {
    /// Requests in flight on the whole cluster (`max_requests`); `None`: no cap.
    pub max_requests: Option<u32>,
    /// Requests in flight on one member (`max_requests_per_member`): a member at the cap is
    /// passed over as if already tried; `None`: no cap.
    pub max_requests_per_member: Option<u32>,
    /// Open connections to the cluster's members, and requests that may wait for one while
    /// the cluster is at that cap (`max_connections`, `max_pending`); `None`: no cap. Enforced
    /// by the router's member pools, not by the pick.
    pub max_connections: Option<ConnectionCap>,
}

/// A cluster's `max_connections` and `max_pending` (Envoy's cluster circuit breakers of the same
/// names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConnectionCap {
    /// Connections open to the cluster's members at once.
    pub connections: u32,
    /// Requests waiting for a connection at once; one more is refused.
    pub pending: u32,
}

impl ConnectionCap {
    /// `max_pending`'s default (Envoy's).
    pub const DEFAULT_PENDING: u32 = 1024;
}

impl Policy {
    /// [`Policy::connect_timeout`]'s default.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
}

/// How long a connection lives before it is replaced (so that long-lived clients spread onto
/// members that joined since it opened, e.g. behind a connection-level balancer); `None`: no
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct ConnectionLimits {
    /// The age past which a connection takes no new request (`max_connection_age_ms`).
    pub max_age: Option<Duration>,
    /// The requests past which a connection takes no new one (`max_requests_per_connection`).
    pub max_requests: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            algorithm: Algorithm::default(),
            granularity: Granularity::default(),
            slow_start: SlowStart::default(),
            locality: Locality::default(),
            panic_threshold_percent: 50,
            health: None,
            outlier: OutlierDetection::default(),
            retry: RetryPolicy::default(),
            hash: HashPolicy::default(),
            agent: AgentPolicy::default(),
            ewma: EwmaPolicy::default(),
            connections: ConnectionLimits::default(),
            grpc: crate::grpc::GrpcPolicy::default(),
            connect_timeout: Policy::DEFAULT_CONNECT_TIMEOUT,
            limits: RequestLimits::default(),
            send_proxy: None,
            xds: XdsPolicy::default(),
            view_id_header: false,
        }
    }
}
