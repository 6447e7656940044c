//! The compiled, validated settings that are not part of the balancing model in `rondo-core`:
//! listeners, this router's identity, the admin API, the naming service and the load-agent
//! receiver.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What a listener speaks to its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ListenerProtocol {
    /// HTTP/1.1; routes may match on host, path, method and headers.
    #[default]
    Http,
    /// Raw TCP; one route, no match conditions.
    Tcp,
}

impl ListenerProtocol {
    /// Every protocol.
    pub const ALL: [ListenerProtocol; 2] = [ListenerProtocol::Http, ListenerProtocol::Tcp];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerProtocol::Http => "http",
            ListenerProtocol::Tcp => "tcp",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        ListenerProtocol::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// A `[[listener]]`: where the router accepts clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    /// Unique name; routes refer to it.
    pub name: String,
    /// Address to bind.
    pub listen: SocketAddr,
    /// What clients speak.
    pub protocol: ListenerProtocol,
    /// Connections accepted at once; more wait in the backlog.
    pub max_connections: u32,
    /// Time allowed for a request's header to arrive (HTTP only).
    pub header_read_timeout: Duration,
    /// Largest request header accepted, bytes (HTTP only).
    pub max_header_bytes: u32,
    /// Most header fields accepted (HTTP only).
    pub max_headers: u32,
    /// Largest request body accepted, bytes; 0 means no limit (HTTP only).
    pub max_body_bytes: u64,
    /// Whether an incoming `X-Forwarded-For` is kept and appended to rather than replaced.
    pub trust_forwarded_for: bool,
}

impl ListenerSpec {
    /// Default `max_connections`.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;
    /// Default `header_read_timeout_ms`.
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `max_header_bytes`.
    pub const DEFAULT_MAX_HEADER_BYTES: u32 = 64 * 1024;
    /// Smallest `max_header_bytes` (hyper's smallest read buffer).
    pub const MIN_MAX_HEADER_BYTES: u64 = 8192;
    /// Default `max_headers`.
    pub const DEFAULT_MAX_HEADERS: u32 = 100;
}

/// `[router]`: this router's identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouterSpec {
    /// This router's locality group; `prefer_local` clusters prefer members of this group.
    pub group: Option<String>,
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
