//! The compiled, validated settings that are not part of the balancing model in `rondo-core`:
//! this router's identity, the admin API, the naming service, the load-agent receiver, the
//! process's log, metrics and tracing; listeners, queues and `members_dns` have modules of their
//! own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod listener;
mod members_dns;
mod queue;

pub use listener::*;
pub use members_dns::*;
pub use queue::*;

/// The format of log lines: the process's log (`[log] format`) and access logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LogFormat {
    /// One line of text per event (`key=value` fields).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Every format.
    pub const ALL: [LogFormat; 2] = [LogFormat::Text, LogFormat::Json];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        LogFormat::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// `[metrics]`: how `/metrics` bounds its series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSpec {
    /// How long the series of a member that left stay (`departed_grace`).
    pub departed_grace: std::time::Duration,
}

impl MetricsSpec {
    /// Default `departed_grace`: five minutes.
    pub const DEFAULT_DEPARTED_GRACE: std::time::Duration = std::time::Duration::from_secs(300);
}

impl Default for MetricsSpec {
    fn default() -> Self {
        MetricsSpec { departed_grace: MetricsSpec::DEFAULT_DEPARTED_GRACE }
    }
}

/// `[log]`: the process's own log, written to stderr.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogSpec {
    /// Text or JSON lines (default text).
    pub format: LogFormat,
    /// The lowest level written: `error`, `warn`, `info`, `debug` or `trace`; `None` leaves the
    /// default (`info`). `RONDO_LOG` and `--log-level` override it.
    pub level: Option<String>,
}

impl LogSpec {
    /// The levels `level` accepts.
    pub const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
}

/// `[router]`: this router's identity, and how it hands over to its successor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterSpec {
    /// This router's locality group; `prefer_local` clusters prefer members of this group.
    pub group: Option<String>,
    /// The key every router of a tier shares (`tier_key` or `tier_key_file`): it signs sticky
    /// session cookies, so any router of the tier honours another's.
    pub tier_key: Option<AdminToken>,
    /// The Unix socket on which the running process hands its sockets and state to a new one
    /// (`rondo serve --upgrade`); `None`: no hitless upgrade.
    pub upgrade_socket: Option<PathBuf>,
    /// How long a draining process (after `SIGTERM` or an upgrade) lets requests, streams and
    /// tunnels in progress finish before it exits anyway.
    pub drain_timeout: Duration,
    /// Where this router's own revocations are kept across restarts; `None`: beside the
    /// embedded registry's snapshot (`SNAPSHOT.revoked`) when there is one, else nowhere.
    pub revocations_file: Option<PathBuf>,
    /// Whether saves of the config file are applied (polled, debounced); `false`
    /// (`watch_config = false`): only SIGHUP and the admin API reload.
    pub watch_config: bool,
}

/// [`RouterSpec::drain_timeout`]'s default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for RouterSpec {
    fn default() -> Self {
        RouterSpec {
            group: None,
            tier_key: None,
            upgrade_socket: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            revocations_file: None,
            watch_config: true,
        }
    }
}

/// How admin API callers authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminToken {
    /// The bearer token itself (`token`).
    Inline(String),
    /// A file holding the token (`token_file`), relative paths resolved against the
    /// configuration file's directory.
    File(PathBuf),
}

/// `[admin]`: the admin HTTP API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSpec {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Required bearer token; `None` when neither `token` nor `token_file` is set.
    pub token: Option<AdminToken>,
    /// TLS (`tls`, the same table as a listener's), when set: the API speaks HTTPS only.
    pub tls: Option<crate::tls::ListenerTls>,
    /// The unauthenticated readiness and liveness endpoints (`ready_path`, `live_path`,
    /// `probe_listen`, `ready_clusters`).
    pub probes: ProbeSpec,
}

/// The platform probes of `[admin]`: paths answered without a token, on the admin listener or
/// on a plain HTTP listener of their own that answers nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProbeSpec {
    /// Readiness (`ready_path`): 200 once the process serves, every cluster of
    /// [`ProbeSpec::ready_clusters`] has an eligible member and no drain has started; else 503
    /// with the reasons.
    pub ready_path: Option<String>,
    /// Liveness (`live_path`): 200 while the process answers.
    pub live_path: Option<String>,
    /// A listener of their own (`probe_listen`), plain HTTP; `None`: the admin listener.
    pub listen: Option<SocketAddr>,
    /// The clusters readiness needs an eligible member in; `None`: every cluster of the view.
    pub ready_clusters: Option<Vec<String>>,
}

impl AdminSpec {
    /// Default `listen`.
    pub const DEFAULT_LISTEN: &str = "127.0.0.1:9900";
}

/// Where the naming service keeps its registrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrySpec {
    /// In-process, optionally persisted to a snapshot file (relative paths resolved against the
    /// configuration file's directory).
    Embedded {
        /// Snapshot file.
        snapshot: Option<PathBuf>,
    },
    /// An etcd cluster.
    Etcd {
        /// `host:port` of each etcd member.
        endpoints: Vec<String>,
        /// Key prefix under which rondo keeps its data.
        prefix: String,
    },
}

/// `[naming]`: the naming service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamingSpec {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Where registrations live.
    pub registry: RegistrySpec,
    /// DNS answers (A and SRV), when `dns_listen` is set.
    pub dns: Option<DnsSpec>,
    /// Bearer token required by registrations, keepalives, deregistrations and config changes
    /// (lookups stay open); `None` leaves the API open, which only a loopback `listen` allows.
    pub token: Option<AdminToken>,
    /// Most registered members in one service (`max_registrations_per_service`).
    pub max_registrations_per_service: u32,
    /// Most registered members in all (`max_registrations`).
    pub max_registrations: u32,
    /// `Host` names (without port) the API answers besides the loopback ones and its own
    /// address (`allowed_hosts`, lower case); other hosts get 403 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Whether a registration may create a cluster the configuration lacks, with the policy it
    /// declares (`allow_registered_clusters`); a route may then name such a cluster.
    pub allow_registered_clusters: bool,
    /// TLS on the HTTP API (`tls`, the same table as a listener's), when set: HTTPS only. The
    /// DNS answers stay plain DNS.
    pub tls: Option<crate::tls::ListenerTls>,
    /// The xDS (ADS) server for proxyless gRPC clients (`xds`), when set.
    pub xds: Option<XdsSpec>,
    /// The parent naming service's endpoints (`parent`, `host:port` or `http://host:port`):
    /// names this service does not hold are looked up there (PKUAS's naming hierarchy).
    pub parent: Vec<String>,
}

/// The naming service's xDS (ADS) server: gRPC clients with an `xds:///CLUSTER` target balance
/// by the cluster's members and policy, with no proxy on the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsSpec {
    /// Address for gRPC (plain HTTP/2).
    pub listen: SocketAddr,
    /// Most ADS streams open at once (`max_clients`); further streams are refused with
    /// `RESOURCE_EXHAUSTED`.
    pub max_clients: u32,
}

impl XdsSpec {
    /// Default `listen`.
    pub const DEFAULT_LISTEN: &str = "127.0.0.1:18000";
    /// Default `max_clients`.
    pub const DEFAULT_MAX_CLIENTS: u32 = 10_000;
    /// Largest `max_clients`.
    pub const MAX_MAX_CLIENTS: u64 = 1_000_000;
}

/// The naming service's DNS answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSpec {
    /// Address for UDP and TCP.
    pub listen: SocketAddr,
    /// The zone services are named under, lower case, ending in `.` (e.g. `rondo.`).
    pub zone: String,
}

impl NamingSpec {
    /// Default `listen`.
    pub const DEFAULT_LISTEN: &str = "127.0.0.1:9901";
    /// Default `etcd_prefix`.
    pub const DEFAULT_ETCD_PREFIX: &str = "/rondo";
    /// Default `dns_zone`.
    pub const DEFAULT_DNS_ZONE: &str = "rondo.";
    /// Default `max_registrations_per_service`: a 10,000-member cluster is what the view swap
    /// and the pickers are measured with.
    pub const DEFAULT_MAX_REGISTRATIONS_PER_SERVICE: u32 = 10_000;
    /// Default `max_registrations`.
    pub const DEFAULT_MAX_REGISTRATIONS: u32 = 20_000;
    /// Largest `max_registrations` and `max_registrations_per_service`.
    pub const MAX_MAX_REGISTRATIONS: u64 = 1_000_000;
}

/// The shared key of load agents and this router.
#[derive(Clone, PartialEq, Eq)]
pub enum AgentKey {
    /// The key itself (`key`).
    Inline(String),
    /// A file holding the key (`key_file`; relative paths resolved against the configuration
    /// file's directory; one trailing newline is ignored).
    File(PathBuf),
}

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentKey::Inline(_) => f.write_str("Inline(..)"),
            AgentKey::File(p) => f.debug_tuple("File").field(p).finish(),
        }
    }
}

/// `[agent]`: where this router receives load-agent heartbeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// Address for first contact (TCP) and heartbeats (UDP), one port number for both.
    pub listen: SocketAddr,
    /// The shared HMAC key.
    pub key: AgentKey,
    /// The heartbeat interval agents are told to use.
    pub interval: Duration,
    /// TLS on the first contact's TCP listener (`tls`, the same table as a listener's), when
    /// set. Heartbeats stay UDP datagrams, authenticated by their HMAC.
    pub tls: Option<crate::tls::ListenerTls>,
}

impl AgentSpec {
    /// Default `listen`.
    pub const DEFAULT_LISTEN: &str = "127.0.0.1:9902";
    /// Default `interval_ms`.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);
    /// Largest `interval_ms` (one minute).
    pub const MAX_INTERVAL_MS: u64 = 60_000;
    /// Default `cluster.NAME.agent.misses`: heartbeats missed before a member is unavailable.
    pub const DEFAULT_MISSES: u32 = 3;
    /// Largest `misses`.
    pub const MAX_MISSES: u64 = 1000;
}

/// `[tracing]`: OpenTelemetry spans of requests and their tries, exported over OTLP/HTTP
/// (protobuf) to `endpoint`; read at start (cargo feature `otel`).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSpec {
    /// The collector's base URL (`otlp_endpoint`, `http://HOST:PORT`); spans go to
    /// `{endpoint}/v1/traces`.
    pub endpoint: String,
    /// `service.name` of the spans' resource.
    pub service_name: String,
    /// The share of new traces (requests without a sampled parent) that are recorded; a request
    /// whose `traceparent` says sampled or not keeps that decision.
    pub sample_ratio: f64,
    /// Header fields of every export request (`headers`, for the collector's auth), checked.
    pub headers: Vec<(String, String)>,
    /// How long one export request may take.
    pub export_timeout: Duration,
    /// Finished spans waiting for export; more are dropped and counted.
    pub max_queue: usize,
}

impl TracingSpec {
    /// Default `service_name`.
    pub const DEFAULT_SERVICE_NAME: &'static str = "rondo";
    /// Default `export_timeout_ms`.
    pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `max_queue`.
    pub const DEFAULT_MAX_QUEUE: usize = 2048;
    /// Largest `max_queue`.
    pub const MAX_MAX_QUEUE: usize = 1 << 20;
}
