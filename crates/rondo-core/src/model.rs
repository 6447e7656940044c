//! The policy model: members, clusters, policies, routes and the immutable, versioned [`View`]
//! that holds them all. These are plain values compiled from configuration (or from the registry);
//! the run-time state of a member (health, load, admin changes) lives in [`crate::Balancer`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// One server instance as configured or registered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberSpec {
    /// Unique within its cluster; state survives view swaps by name.
    pub name: String,
    /// `host:port` (resolved by the data plane, never by the core).
    pub address: String,
    /// Relative weight, 1..=1_000_000 (validated by the config layer; 0 is refused there).
    pub weight: u32,
    /// Locality group (SGD load-balancing group, a zone); `None` belongs to no group.
    pub group: Option<String>,
    /// The admin state the configuration asks for.
    pub admin: AdminState,
}

/// The operator's word on a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum AdminState {
    /// Takes new sessions and requests.
    #[default]
    Active,
    /// Takes no new sessions; sticky sessions and in-flight requests finish (SGD "can start
    /// applications" off).
    Draining,
    /// Takes nothing, not even in panic mode.
    Disabled,
}

impl AdminState {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Active => "active",
            AdminState::Draining => "draining",
            AdminState::Disabled => "disabled",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => AdminState::Active,
            "draining" => AdminState::Draining,
            "disabled" => AdminState::Disabled,
            _ => return None,
        })
    }
}

/// Who changed a member's state; shown wherever the state is shown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Actor {
    /// The configuration file or an applied config.
    Config,
    /// A named operator through the admin API or `rondo ctl`.
    Operator(String),
    /// The member's load agent (missed heartbeats).
    Agent,
    /// Active health checks.
    HealthCheck,
    /// Passive outlier detection.
    OutlierDetection,
    /// The naming service registry (lease lapsed, registration).
    Registry,
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Actor::Config => f.write_str("config"),
            Actor::Operator(who) => write!(f, "operator:{who}"),
            Actor::Agent => f.write_str("agent"),
            Actor::HealthCheck => f.write_str("health-check"),
            Actor::OutlierDetection => f.write_str("outlier-detection"),
            Actor::Registry => f.write_str("registry"),
        }
    }
}

/// How a cluster chooses a member. See `docs/algorithms.md` for each one's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Algorithm {
    /// Next member in order.
    #[default]
    RoundRobin,
    /// Uniformly random member (PKUAS).
    Random,
    /// Smooth weighted round robin over static weights (GlassFish lb-weight, nginx).
    Weighted,
    /// GlassFish RMI-IIOP: list randomized once, rotated per context, fail over down the list.
    Rotating,
    /// Ranked by the latest probe round (CLB's table), picks shared by smooth weighted round
    /// robin with weights inversely proportional to each member's probe round trip.
    ResponseTime,
    /// CLB exactly: ranked by the latest probe round, round robin down the ranked table from its
    /// top after each refresh (even shares when there are many picks per round).
    ResponseTimeClb,
    /// Fewest active sessions + in-flight requests per unit of weight (SGD, HAProxy leastconn).
    LeastSessions,
    /// Lowest agent-reported CPU use; least-sessions without fresh reports (SGD).
    LeastCpu,
    /// Most agent-reported free memory; least-sessions without fresh reports (SGD).
    MostFreeMemory,
    /// Power of two choices over peak-EWMA latency x in-flight (Mitzenmacher; Finagle).
    P2cEwma,
    /// Lowest expected delay over every candidate (sampled in large clusters): the higher of the
    /// passive peak-EWMA latency and the latest probe round trip, x (in-flight + 1) / weight,
    /// with a uniform exploration floor (CLB's probes and linkerd's EWMA together).
    Adaptive,
    /// Consistent hashing on a request key, with bounded load.
    Hash,
}

impl Algorithm {
    /// Every algorithm, in documentation order.
    pub const ALL: [Algorithm; 12] = [
        Algorithm::RoundRobin,
        Algorithm::Random,
        Algorithm::Weighted,
        Algorithm::Rotating,
        Algorithm::ResponseTime,
        Algorithm::ResponseTimeClb,
        Algorithm::LeastSessions,
        Algorithm::LeastCpu,
        Algorithm::MostFreeMemory,
        Algorithm::P2cEwma,
        Algorithm::Adaptive,
        Algorithm::Hash,
    ];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round-robin",
            Algorithm::Random => "random",
            Algorithm::Weighted => "weighted",
            Algorithm::Rotating => "rotating",
            Algorithm::ResponseTime => "response-time",
            Algorithm::ResponseTimeClb => "response-time-clb",
            Algorithm::LeastSessions => "least-sessions",
            Algorithm::LeastCpu => "least-cpu",
            Algorithm::MostFreeMemory => "most-free-memory",
            Algorithm::P2cEwma => "p2c-ewma",
            Algorithm::Adaptive => "adaptive",
            Algorithm::Hash => "hash",
        }
    }

    /// Whether picks follow the probe rounds' ranked table (`response-time`,
    /// `response-time-clb`): such a cluster is probed even without a health check.
    pub fn ranks_by_probes(self) -> bool {
        matches!(self, Algorithm::ResponseTime | Algorithm::ResponseTimeClb)
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Algorithm::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a balancing decision is made (PKUAS's three granularities).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Granularity {
    /// Every call is balanced.
    #[default]
    Request,
    /// The member chosen when the session is created keeps the session.
    Session,
    /// The naming service picks once per lookup; the caller keeps the answer.
    Lookup,
}

impl Granularity {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Request => "request",
            Granularity::Session => "session",
            Granularity::Lookup => "lookup",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "request" => Granularity::Request,
            "session" => Granularity::Session,
            "lookup" => Granularity::Lookup,
            _ => return None,
        })
    }
}

/// Which consistent-hashing table `hash` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum HashTable {
    /// Karger et al.'s ring with virtual nodes (ketama).
    #[default]
    Ring,
    /// Google's Maglev lookup table (Eisenbud et al., NSDI 2016).
    Maglev,
}

/// Where `hash` takes its key from (used by the data plane; the core hashes bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum HashKeySource {
    /// The client's IP address.
    #[default]
    ClientAddress,
    /// A request header, by name.
    Header(String),
    /// A cookie, by name.
    Cookie(String),
}

/// Consistent-hashing settings.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct HashPolicy {
    /// Ring or Maglev.
    pub table: HashTable,
    /// Where the key comes from.
    pub key: HashKeySource,
    /// Bounded-load factor `c >= 1` (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
    /// Bounded Loads", SODA 2018): no member takes more than `ceil(c * average)` active requests.
    /// `None` turns the bound off.
    pub bounded_load: Option<f64>,
    /// Virtual nodes per member of average weight on the ring.
    pub ring_vnodes: u32,
}

impl Default for HashPolicy {
    fn default() -> Self {
        HashPolicy {
            table: HashTable::Ring,
            key: HashKeySource::ClientAddress,
            bounded_load: Some(1.25),
            ring_vnodes: 160,
        }
    }
}

/// Ramp-up of members that just joined or recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct SlowStart {
    /// How long the ramp lasts; zero disables slow start.
    #[cfg_attr(feature = "serde", serde(rename = "duration_ms", with = "crate::wire::millis"))]
    pub duration: Duration,
    /// Share of the full weight at the start of the ramp, 1..=100 percent.
    pub initial_percent: u8,
}

impl Default for SlowStart {
    fn default() -> Self {
        SlowStart { duration: Duration::ZERO, initial_percent: 10 }
    }
}

/// Locality preference (SGD load-balancing groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct Locality {
    /// Prefer members of the caller's group while that group has a healthy member.
    pub prefer_local: bool,
}

impl Default for Locality {
    fn default() -> Self {
        Locality { prefer_local: true }
    }
}

/// Active health checking (CLB's 200 ms poll).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct HealthCheck {
    /// What a probe does.
    pub kind: HealthCheckKind,
    /// Between probe rounds.
    #[cfg_attr(feature = "serde", serde(rename = "interval_ms", with = "crate::wire::millis"))]
    pub interval: Duration,
    /// A probe slower than this fails.
    #[cfg_attr(feature = "serde", serde(rename = "timeout_ms", with = "crate::wire::millis"))]
    pub timeout: Duration,
    /// Consecutive successes that bring a down member up.
    pub rise: u32,
    /// Consecutive failures that take an up member down.
    pub fall: u32,
    /// The port probed instead of the member's own (`health.port`): a TCP or HTTP check on a
    /// side port of a UDP member, say.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub port: Option<u16>,
}

/// The probe.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum HealthCheckKind {
    /// A TCP connect.
    Tcp,
    /// An HTTP GET of `path`; statuses in `expect_min..=expect_max` pass.
    Http {
        /// Request path.
        path: String,
        /// Lowest passing status.
        expect_min: u16,
        /// Highest passing status.
        expect_max: u16,
    },
    /// gRPC's health-checking protocol (`grpc.health.v1.Health/Check`) for `service` (empty:
    /// the server as a whole); only `SERVING` passes.
    Grpc {
        /// The service asked about.
        service: String,
    },
    /// A UDP datagram `send` to the member; an answer within the timeout passes when it
    /// contains `expect` (empty: any answer).
    Udp {
        /// The probe's payload.
        send: Vec<u8>,
        /// Bytes the answer must contain.
        expect: Vec<u8>,
    },
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: HealthCheckKind::Tcp,
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(1000),
            rise: 2,
            fall: 2,
            port: None,
        }
    }
}

/// Passive outlier detection (Envoy's consecutive-failure ejection).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct OutlierDetection {
    /// Consecutive connect failures, resets or counted 5xx that eject a member; 0 disables.
    pub consecutive_failures: u32,
    /// Whether 5xx answers count as failures (connect failures and resets always count).
    pub count_5xx: bool,
    /// Ejection time for the first ejection; the n-th consecutive ejection lasts n times this.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "base_ejection_ms", with = "crate::wire::millis")
    )]
    pub base_ejection: Duration,
    /// Upper bound on one ejection.
    #[cfg_attr(feature = "serde", serde(rename = "max_ejection_ms", with = "crate::wire::millis"))]
    pub max_ejection: Duration,
    /// At most this share of a cluster's members is ejected at once, percent.
    pub max_ejected_percent: u8,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_failures: 5,
            count_5xx: true,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// Retries and failover.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct RetryPolicy {
    /// Total tries per request across members of one cluster (1 = no retry).
    pub attempts: u32,
    /// Timeout of one try; `None` leaves only the route's request timeout.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "per_try_timeout_ms", with = "crate::wire::millis_opt")
    )]
    pub per_try_timeout: Option<Duration>,
    /// Retries may add at most this share of extra load, percent (Finagle retry budget).
    pub budget_percent: u8,
    /// Retries always allowed per second regardless of the ratio.
    pub budget_min_per_sec: u32,
    /// HTTP statuses a member may answer that send the request to another member instead
    /// (`retry_on`: `5xx`, `gateway-error`, `retriable-status:N`); empty: none.
    pub statuses: StatusSet,
    /// A pause before each retry (`backoff`); `None`: retried at once.
    pub backoff: Option<Backoff>,
    /// Whether a request that is not idempotent (a POST) may go to another member after one
    /// failed with it (`retry_non_idempotent`, WCF's behaviour); its body is kept for that.
    pub non_idempotent: bool,
    /// The most request body bytes kept to send again (`retry_buffer_bytes`): a longer body is
    /// not retried once sent.
    pub buffer_bytes: u32,
    /// A second try for a slow answer (`hedge`); `None`: no hedging.
    pub hedge: Option<crate::failover::hedge::Hedge>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            per_try_timeout: None,
            budget_percent: 20,
            budget_min_per_sec: 10,
            statuses: StatusSet::EMPTY,
            backoff: None,
            non_idempotent: false,
            buffer_bytes: RetryPolicy::DEFAULT_BUFFER_BYTES,
            hedge: None,
        }
    }
}

impl RetryPolicy {
    /// [`RetryPolicy::buffer_bytes`]'s default: 64 KiB.
    pub const DEFAULT_BUFFER_BYTES: u32 = 64 * 1024;

    /// The pause before retry number `retry` (1 for the first retry): "full jitter", a uniform
    /// draw below `base · 2^(retry−1)` capped at `max`; zero without a backoff.
    pub fn backoff_delay(&self, retry: u32, rng: &mut dyn crate::Entropy) -> Duration {
        let Some(b) = self.backoff else { return Duration::ZERO };
        let doubled = b.base.saturating_mul(1 << retry.saturating_sub(1).min(20));
        let cap = doubled.min(b.max).as_micros().min(u128::from(u64::MAX)) as u64;
        if cap == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(rng.next_u64() % (cap + 1))
    }
}

/// Exponential backoff between retries (`retry.backoff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Backoff {
    /// The first retry's ceiling.
    pub base: Duration,
    /// The largest ceiling.
    pub max: Duration,
}

/// A set of HTTP statuses (100 to 611), for `retry_on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StatusSet {
    bits: [u64; 8],
    /// Whether any bit is set: the router asks on every request whether a route's clusters
    /// retry on statuses, and one byte answers it.
    any: bool,
}

impl StatusSet {
    /// No status.
    pub const EMPTY: StatusSet = StatusSet { bits: [0; 8], any: false };

    /// `self` with `status` added (one outside 100-611 is left out).
    pub fn with(mut self, status: u16) -> StatusSet {
        if let Some(i) = status.checked_sub(100).map(usize::from).filter(|i| *i < 512) {
            self.bits[i / 64] |= 1 << (i % 64);
            self.any = true;
        }
        self
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        self.any
            && status
                .checked_sub(100)
                .map(usize::from)
                .filter(|i| *i < 512)
                .is_some_and(|i| self.bits[i / 64] & (1 << (i % 64)) != 0)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        !self.any
    }
}

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

/// Upstream protocol for a cluster's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive.
    #[default]
    Http1,
    /// HTTP/2 prior knowledge (gRPC).
    Http2,
    /// Raw TCP (for `tcp` listeners).
    Tcp,
    /// UDP datagrams (for `udp` listeners).
    Udp,
}

/// A named set of members with a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// Unique name.
    pub name: String,
    /// Members in configuration order (the order `round-robin` walks).
    pub members: Vec<MemberSpec>,
    /// How the cluster is balanced.
    pub policy: Policy,
    /// How the data plane talks to members.
    pub upstream_protocol: UpstreamProtocol,
    /// How `session` granularity pins a client to its member.
    pub sticky: StickySession,
    /// TLS to the members (`upstream_tls`), when set: requests, TCP sessions and health checks
    /// go over TLS, members verified against `ca`.
    pub upstream_tls: Option<UpstreamTls>,
}

/// A cluster's `upstream_tls`: what the router trusts and presents when it speaks TLS to the
/// members (paths resolved against the configuration file's directory; the files are read by
/// the runtime, never here).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// PEM roots members' certificates are verified against.
    pub ca: std::path::PathBuf,
    /// The name members' certificates must be valid for; `None`: each member's host.
    pub server_name: Option<String>,
    /// The router's certificate chain (PEM), presented to members that ask (mTLS).
    pub cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `cert`.
    pub key: Option<std::path::PathBuf>,
}

/// Why TLS to a member failed (a request's 502 and a health check say it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsFailure {
    /// The member's certificate is not valid for the name the router asked for.
    NotValidForName,
    /// The member's certificate has expired (or is not valid yet).
    Expired,
    /// The member's certificate is not signed by the cluster's `ca`.
    UnknownIssuer,
    /// The member refused the router (an alert during the handshake: its certificate, or none).
    Refused,
    /// The member spoke no TLS, or another handshake failure.
    Handshake,
    /// The cluster's TLS files could not be loaded.
    Config,
}

impl TlsFailure {
    /// A label for metrics (`not_valid_for_name`, `expired`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TlsFailure::NotValidForName => "not_valid_for_name",
            TlsFailure::Expired => "expired",
            TlsFailure::UnknownIssuer => "unknown_issuer",
            TlsFailure::Refused => "refused",
            TlsFailure::Handshake => "handshake",
            TlsFailure::Config => "config",
        }
    }
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsFailure::NotValidForName => "tls: certificate not valid for the server name",
            TlsFailure::Expired => "tls: certificate expired",
            TlsFailure::UnknownIssuer => "tls: certificate not signed by the cluster's ca",
            TlsFailure::Refused => "tls: the member refused the router's handshake",
            TlsFailure::Handshake => "tls: handshake failed",
            TlsFailure::Config => "tls: the cluster's upstream_tls files could not be loaded",
        })
    }
}

/// How the data plane recognises a session (granularity `session`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct StickySession {
    /// Cookie carrying the session's member; set by the router on the first response.
    pub cookie: String,
    /// Alternatively a request header whose value identifies the session (hashed to pin it).
    pub header: Option<String>,
    /// A session unused this long is forgotten.
    #[cfg_attr(feature = "serde", serde(rename = "idle_timeout_ms", with = "crate::wire::millis"))]
    pub idle_timeout: Duration,
}

impl Default for StickySession {
    fn default() -> Self {
        StickySession {
            cookie: "rondo-member".to_owned(),
            header: None,
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// A condition of a route's match that the core holds but does not evaluate itself: a regular
/// expression on the path or a header, a JSON or XML body path. Such conditions are compiled
/// outside the core (by `rondo-config`, once per view, so a bad pattern is a configuration
/// error) and evaluated by the data plane through this trait; the core stays free of the
/// regular-expression and parser crates.
pub trait Filter: fmt::Debug + Send + Sync {
    /// The condition as written (`path_regex = "^/a"`); views compare filters by it.
    fn describe(&self) -> &str;
    /// Whether the request's head satisfies the condition (a body filter: always).
    fn matches_head(&self, req: &RequestFacts<'_>) -> bool;
    /// Whether the condition reads the request's body.
    fn reads_body(&self) -> bool {
        false
    }
    /// Whether `body` satisfies the condition (only asked of filters that read the body).
    fn matches_body(&self, body: &BodyPeek<'_>) -> bool {
        let _ = body;
        true
    }
}

/// A shared [`Filter`], compared by what it says ([`Filter::describe`]).
#[derive(Debug, Clone)]
pub struct FilterRef(pub Arc<dyn Filter>);

impl PartialEq for FilterRef {
    fn eq(&self, other: &Self) -> bool {
        self.0.describe() == other.0.describe()
    }
}

impl Eq for FilterRef {}

/// The first bytes of a request body, as body filters see them.
#[derive(Debug, Clone, Copy)]
pub struct BodyPeek<'a> {
    /// The bytes read (at most the route's `max_peek_bytes`).
    pub bytes: &'a [u8],
    /// Whether `bytes` is the whole body.
    pub complete: bool,
}

/// What a route matches; every present condition must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteMatch {
    /// `Host` without port, compared case-insensitively; a leading `*.` matches any subdomain.
    pub host: Option<String>,
    /// Path prefix, compared on the raw path.
    pub path_prefix: Option<String>,
    /// The whole path (without the query), compared exactly.
    pub path: Option<String>,
    /// Method, upper case.
    pub methods: Vec<String>,
    /// Header name (lower case) and exact value.
    pub headers: Vec<(String, String)>,
    /// Header names (lower case) that must be present (any value).
    pub headers_present: Vec<String>,
    /// Header names (lower case) that must be absent.
    pub headers_absent: Vec<String>,
    /// Query parameters (name, value), both percent-decoded (`+` is a space): some parameter
    /// of the name must have exactly the value.
    pub query: Vec<(String, String)>,
    /// Conditions evaluated outside the core (regular expressions, body paths).
    pub filters: Vec<FilterRef>,
    /// The most body bytes a body filter reads (0: no filter reads the body).
    pub max_peek_bytes: u64,
    /// `tcp` listeners only: the TLS server name (SNI) the client's ClientHello asks for,
    /// lower case; a leading `*.` matches one more label. A client that sends no SNI matches
    /// only routes without one.
    pub sni: Option<String>,
}

impl RouteMatch {
    /// Whether a connection whose ClientHello named `sni` (if any) satisfies `sni`.
    pub fn matches_sni(&self, sni: Option<&str>) -> bool {
        let Some(want) = &self.sni else { return true };
        let Some(host) = sni else { return false };
        let host = host.trim_end_matches('.');
        match want.strip_prefix("*.") {
            Some(suffix) => host.split_once('.').is_some_and(|(first, rest)| {
                !first.is_empty() && rest.eq_ignore_ascii_case(suffix)
            }),
            None => host.eq_ignore_ascii_case(want),
        }
    }
}

/// Facts about a request that routes match on.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// Host without port.
    pub host: Option<&'a str>,
    /// The path, normalized ([`crate::path::normalize`]).
    pub path: &'a str,
    /// The query, without its `?` (`None`: the target has none).
    pub query: Option<&'a str>,
    /// Method.
    pub method: &'a str,
    /// Header lookup by lower-case name (the first value, when it is visible ASCII).
    pub header: &'a dyn Fn(&str) -> Option<&'a str>,
    /// Whether a header of the lower-case name is present (whatever its value).
    pub present: &'a dyn Fn(&str) -> bool,
    /// The body's first bytes, once read (routes with body filters need them).
    pub body: Option<BodyPeek<'a>>,
}

impl fmt::Debug for RequestFacts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestFacts")
            .field("host", &self.host)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl RouteMatch {
    /// Whether the request satisfies every condition; a route with a body filter matches only
    /// once the body's first bytes are among the facts.
    pub fn matches(&self, req: &RequestFacts<'_>) -> bool {
        self.matches_head(req)
            && (!self.reads_body() || req.body.is_some_and(|b| self.body_matches(&b)))
    }

    /// Whether any condition reads the body.
    pub fn reads_body(&self) -> bool {
        self.max_peek_bytes > 0
    }

    /// Whether the body conditions hold for `body` (read up to at least this route's
    /// `max_peek_bytes`, or complete): each body filter sees at most `max_peek_bytes` of it.
    pub fn body_matches(&self, body: &BodyPeek<'_>) -> bool {
        let limit = usize::try_from(self.max_peek_bytes).unwrap_or(usize::MAX);
        let seen = if body.bytes.len() > limit {
            BodyPeek { bytes: &body.bytes[..limit], complete: false }
        } else {
            *body
        };
        self.filters.iter().filter(|f| f.0.reads_body()).all(|f| f.0.matches_body(&seen))
    }

    /// Whether the request's head satisfies every condition that does not read the body.
    pub fn matches_head(&self, req: &RequestFacts<'_>) -> bool {
        if let Some(want) = &self.host {
            let Some(host) = req.host else { return false };
            // `orders.example.` is `orders.example` (the root's empty label).
            let host = host.strip_suffix('.').unwrap_or(host);
            let ok = match want.strip_prefix("*.") {
                Some(suffix) => {
                    host.len() > suffix.len() + 1
                        && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
                }
                None => host.eq_ignore_ascii_case(want),
            };
            if !ok {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix
            && !req.path.starts_with(prefix.as_str())
        {
            return false;
        }
        if let Some(path) = &self.path
            && req.path != path
        {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == req.method) {
            return false;
        }
        if !self.headers.iter().all(|(name, value)| (req.header)(name) == Some(value.as_str())) {
            return false;
        }
        if !self.headers_present.iter().all(|name| (req.present)(name))
            || self.headers_absent.iter().any(|name| (req.present)(name))
        {
            return false;
        }
        if !self.query.iter().all(|(name, value)| query_has(req.query, name, value)) {
            return false;
        }
        self.filters.iter().all(|f| f.0.matches_head(req))
    }
}

/// Whether `query` (`a=1&b=2`, without the `?`) has a parameter `name` whose value is `value`,
/// both compared percent-decoded with `+` as a space (as HTML forms send them). A parameter
/// without `=` has the empty value.
pub fn query_has(query: Option<&str>, name: &str, value: &str) -> bool {
    let Some(query) = query else { return false };
    query.split('&').filter(|p| !p.is_empty()).any(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        decoded_eq(k, name) && decoded_eq(v, value)
    })
}

/// Whether the query component `raw` decodes to `want`.
fn decoded_eq(raw: &str, want: &str) -> bool {
    let (raw, want) = (raw.as_bytes(), want.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < raw.len() {
        let b = match raw[i] {
            b'+' => b' ',
            b'%' => {
                let digit = |k: usize| raw.get(k).copied().and_then(hex_digit);
                match (digit(i + 1), digit(i + 2)) {
                    (Some(h), Some(l)) => {
                        i += 2;
                        h << 4 | l
                    }
                    _ => b'%',
                }
            }
            b => b,
        };
        if want.get(j) != Some(&b) {
            return false;
        }
        i += 1;
        j += 1;
    }
    j == want.len()
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A route's sign-on requirement (`auth`, PKUAS single sign-on): every request must carry a
/// token from `issuer` for `audience`, signed by a key of the `keys` file (JWKS), whose claims
/// hold each `require` pair; the router checks it before any member sees the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAuth {
    /// The `iss` a token must name.
    pub issuer: String,
    /// The `aud` a token must name (or list).
    pub audience: String,
    /// The JWKS file (resolved against the configuration file's directory); reloaded when it
    /// changes.
    pub keys: std::path::PathBuf,
    /// Claim name and a value the claim must hold (equal, one of its space-separated words, or
    /// an element of its array).
    pub require: Vec<(String, String)>,
    /// Claims passed on to members (their names as in the token), each in
    /// `x-rondo-claim-<name>` (the name in lower case).
    pub claims: Vec<String>,
}

/// A login route's sign-on (`login`): a member's response naming a subject in `x-rondo-login`
/// makes the router issue a tier-wide session cookie for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLogin {
    /// How long the session token is good for.
    pub ttl: Duration,
}

impl RouteLogin {
    /// Default `ttl_ms`: eight hours (a working day's sign-on).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(8 * 3600);
}

/// A match → a cluster, plus ordered backups (WCF filter table and backup lists).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Name (generated `route-N` when the config gives none).
    pub name: String,
    /// The listener it belongs to.
    pub listener: String,
    /// The condition.
    pub matcher: RouteMatch,
    /// Primary cluster (with a split: its first cluster of positive weight, which names the
    /// route in errors and labels).
    pub cluster: String,
    /// The weighted clusters each request picks its primary from (`clusters`); empty: the
    /// primary is always `cluster`.
    pub split: Vec<crate::split::WeightedCluster>,
    /// Tried in order when the primary cannot serve.
    pub backups: Vec<String>,
    /// Idle timeout of a client connection on this route.
    pub idle_timeout: Duration,
    /// Whole-request timeout (first byte to last response byte header).
    pub request_timeout: Duration,
    /// The sign-on token the route requires (`auth`), if any.
    pub auth: Option<Arc<RouteAuth>>,
    /// Whether (and how) members of this route may sign users on (`login`).
    pub login: Option<RouteLogin>,
    /// Routes of a listener are evaluated by priority, higher first, then in file order.
    pub priority: i32,
    /// The route's place in the file (0-based): the tie-break after `priority`, and where
    /// diagnostics point.
    pub position: usize,
    /// Other clusters that get a copy of every request the route matches (WCF multicast);
    /// their answers never reach the client.
    pub multicast: Vec<Branch>,
    /// A request with a multicast branch and a body larger than this is answered 413 before
    /// anything is sent (the body is held for every branch).
    pub multicast_max_body_bytes: u64,
    /// The requests of each sticky session kept for replay to the member that takes the
    /// session over (WCF session recovery), when set.
    pub session_replay: Option<SessionReplay>,
    /// The route's traffic filters, in order (`filters`): edits, answers and limits.
    pub filters: Vec<crate::traffic::TrafficFilter>,
    /// What the router compiles from `filters`, once per view.
    pub compiled: Slot,
}

/// A slot the core carries for a data plane and never looks into: what a data plane derives
/// once from a part of the view (a route's compiled filter chain) lives beside it, made at first
/// use. Clones share it; it compares equal to every other slot (it is derived, not policy).
#[derive(Clone, Default)]
pub struct Slot(Arc<std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>>);

impl Slot {
    /// The value, made by `make` at the first call.
    pub fn get_or_init(
        &self,
        make: impl FnOnce() -> Arc<dyn std::any::Any + Send + Sync>,
    ) -> &Arc<dyn std::any::Any + Send + Sync> {
        self.0.get_or_init(make)
    }
}

impl PartialEq for Slot {
    fn eq(&self, _: &Slot) -> bool {
        true
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Slot(made)" } else { "Slot(empty)" })
    }
}

impl Route {
    /// Default `multicast_max_body_bytes`: 1 MiB.
    pub const DEFAULT_MULTICAST_MAX_BODY: u64 = 1 << 20;
}

/// One multicast branch of a route: a cluster with its own backups, tried with its own
/// failover, under a bounded queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    /// The cluster that gets the copy.
    pub cluster: String,
    /// Tried in order when it cannot serve the copy.
    pub backups: Vec<String>,
    /// Copies waiting or in flight on this branch at most; one more is dropped and counted.
    pub queue: u32,
}

impl Branch {
    /// Default `queue`.
    pub const DEFAULT_QUEUE: u32 = 1024;
}

/// A route's `session_replay`: how much of each session is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionReplay {
    /// Requests kept per session, at most.
    pub max_messages: u32,
    /// Bytes (heads and bodies) kept per session, at most.
    pub max_bytes: u64,
    /// Bytes kept over every session of the route, at most.
    pub max_total_bytes: u64,
}

impl SessionReplay {
    /// Default `max_messages`.
    pub const DEFAULT_MAX_MESSAGES: u32 = 64;
    /// Default `max_bytes`: 1 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
    /// Default `max_total_bytes`: 64 MiB.
    pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 64 << 20;
}

/// Where a request goes, as the filter table says.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'v> {
    /// The first matching route (by priority, then file order).
    Found(&'v Route),
    /// A route that matches the head reads the body: look up again with at least this many
    /// of its first bytes (or all of it, when shorter).
    NeedsBody(u64),
    /// No route matches.
    NoRoute,
}

/// An immutable, versioned snapshot of all routes and clusters (PKUAS view, WCF configuration).
/// Replaced as a whole; holders of an `Arc<View>` keep the one they started with.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// Grows with every change; clients that see a newer id refetch.
    pub id: u64,
    /// Routes in priority order: the first match wins.
    pub routes: Vec<Route>,
    /// Clusters by name.
    pub clusters: BTreeMap<String, Arc<ClusterSpec>>,
}

impl View {
    /// The first route of `listener` that matches `req`.
    pub fn route(&self, listener: &str, req: &RequestFacts<'_>) -> Option<&Route> {
        self.routes.iter().find(|r| r.listener == listener && r.matcher.matches(req))
    }

    /// The first route of `listener` that matches `req`, or the body bytes needed to decide:
    /// a route whose head conditions hold and that reads the body, met before any route that
    /// matches without it, needs `req.body`. With `all` (a listener's `routing =
    /// "all-matches"`), every route that matches must be decided, so any of them that reads
    /// the body needs it.
    pub fn lookup(&self, listener: &str, req: &RequestFacts<'_>, all: bool) -> Lookup<'_> {
        let mut first = None;
        let mut peek = 0;
        for r in self.routes.iter().filter(|r| r.listener == listener) {
            if !r.matcher.matches_head(req) {
                continue;
            }
            if r.matcher.reads_body() {
                match &req.body {
                    None => {
                        peek = peek.max(r.matcher.max_peek_bytes);
                        continue;
                    }
                    Some(body) if !r.matcher.body_matches(body) => continue,
                    Some(_) => {}
                }
            }
            if peek == 0 && first.is_none() {
                first = Some(r);
            }
            if !all && peek == 0 {
                break;
            }
        }
        match first {
            _ if peek > 0 => Lookup::NeedsBody(peek),
            Some(r) => Lookup::Found(r),
            None => Lookup::NoRoute,
        }
    }

    /// Every route of `listener` that matches `req` besides `first` (routing `all-matches`),
    /// in evaluation order.
    pub fn also_matching(
        &self,
        listener: &str,
        first: &Route,
        req: &RequestFacts<'_>,
    ) -> Vec<&Route> {
        self.routes
            .iter()
            .filter(|r| {
                r.listener == listener && !std::ptr::eq(*r, first) && r.matcher.matches(req)
            })
            .collect()
    }

    /// A cluster by name.
    pub fn cluster(&self, name: &str) -> Option<&Arc<ClusterSpec>> {
        self.clusters.get(name)
    }
}
