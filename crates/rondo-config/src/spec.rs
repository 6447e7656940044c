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
    /// Queued messages: `POST /queues/{queue}` over HTTP/1.1, answered `202 Accepted` once the
    /// message is durable, delivered later by the queue's workers (rondo-queue).
    Queue,
    /// UDP datagrams; one route, no match conditions; balanced per flow or per datagram
    /// (`udp.granularity`).
    Udp,
}

impl ListenerProtocol {
    /// Every protocol.
    pub const ALL: [ListenerProtocol; 4] = [
        ListenerProtocol::Http,
        ListenerProtocol::Tcp,
        ListenerProtocol::Queue,
        ListenerProtocol::Udp,
    ];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerProtocol::Http => "http",
            ListenerProtocol::Tcp => "tcp",
            ListenerProtocol::Queue => "queue",
            ListenerProtocol::Udp => "udp",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        ListenerProtocol::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Which routes of an HTTP listener get a request (`routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Routing {
    /// The first matching route (by priority, then file order) gets it.
    #[default]
    FirstMatch,
    /// Every matching route's cluster gets it (WCF's multicast over the filter table); the
    /// first matching route answers the client, the others get copies as multicast branches.
    AllMatches,
}

impl Routing {
    /// Every mode.
    pub const ALL: [Routing; 2] = [Routing::FirstMatch, Routing::AllMatches];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Routing::FirstMatch => "first-match",
            Routing::AllMatches => "all-matches",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Routing::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// How much an error the router answers itself tells the client (`error_detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorDetail {
    /// Status and reason only: no route, cluster or member names (the default on listeners
    /// bound beyond loopback).
    Brief,
    /// Also the route, its cluster and every attempt by member name (the default on loopback
    /// listeners; member addresses are never shown).
    Full,
}

impl ErrorDetail {
    /// Every setting.
    pub const ALL: [ErrorDetail; 2] = [ErrorDetail::Brief, ErrorDetail::Full];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorDetail::Brief => "brief",
            ErrorDetail::Full => "full",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        ErrorDetail::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The default for a listener bound to `listen`: full detail only where every client is
    /// on this machine.
    pub fn default_for(listen: SocketAddr) -> Self {
        if listen.ip().is_loopback() { ErrorDetail::Full } else { ErrorDetail::Brief }
    }
}

/// The peers some setting trusts: nobody, everybody, or those in some networks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Trusted {
    /// Nobody (`false`, the default).
    #[default]
    Nobody,
    /// Everybody (`true`).
    Everyone,
    /// Peers whose address is in one of these networks.
    Networks(Vec<ipnet::IpNet>),
}

impl Trusted {
    /// Whether a peer at `ip` is trusted (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        match self {
            Trusted::Nobody => false,
            Trusted::Everyone => true,
            Trusted::Networks(nets) => {
                let ip = ip.to_canonical();
                nets.iter().any(|n| n.contains(&ip))
            }
        }
    }
}

/// Which PROXY protocol header a listener requires of its trusted sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocolMode {
    /// Version 1 (text), required.
    V1,
    /// Version 2 (binary), required.
    V2,
    /// Either version, or none (the connection's own address is used then).
    Optional,
}

impl ProxyProtocolMode {
    /// Every mode.
    pub const ALL: [ProxyProtocolMode; 3] =
        [ProxyProtocolMode::V1, ProxyProtocolMode::V2, ProxyProtocolMode::Optional];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyProtocolMode::V1 => "v1",
            ProxyProtocolMode::V2 => "v2",
            ProxyProtocolMode::Optional => "optional",
        }
    }
}

/// A listener's `proxy_protocol` and `trusted_sources`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyProtocolSpec {
    /// What a trusted source's connection must start with.
    pub mode: ProxyProtocolMode,
    /// The proxies whose headers are believed (`trusted_sources`). On an `http` listener a
    /// connection from anywhere else is served with its own address and refused if it carries
    /// a header; on a `tcp` listener it is refused.
    pub trusted: Vec<ipnet::IpNet>,
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
    /// Client connections open at once; one over it is refused (HTTP: 503) and closed.
    pub max_connections: u32,
    /// The listen backlog: connections the kernel completes and queues until the router
    /// accepts them (capped by the kernel at `net.core.somaxconn`).
    pub backlog: u32,
    /// Time allowed for a request's header to arrive (HTTP only).
    pub header_read_timeout: Duration,
    /// Longest wait for the next byte of a request body from the client (HTTP and queue
    /// listeners); past it the client gets 408 (when no byte of the response went out yet) and
    /// the connection is closed.
    pub body_read_timeout: Duration,
    /// Largest request header accepted, bytes (HTTP only).
    pub max_header_bytes: u32,
    /// Most header fields accepted (HTTP only).
    pub max_headers: u32,
    /// Largest request body accepted, bytes; 0 means no limit (HTTP only).
    pub max_body_bytes: u64,
    /// Whose `X-Forwarded-For` is kept and appended to rather than replaced (and whose
    /// `Forwarded` is passed on rather than removed).
    pub trust_forwarded_for: Trusted,
    /// The PROXY protocol header clients' connections start with (`proxy_protocol`,
    /// `trusted_sources`); `None`: none is read.
    pub proxy_protocol: Option<ProxyProtocolSpec>,
    /// What the router's own error responses name.
    pub error_detail: ErrorDetail,
    /// HTTP/2 (h2c) protections against single hostile clients (HTTP only).
    pub http2: Http2Limits,
    /// Where and how this listener logs each request (`access_log`); `None`: no access log
    /// (the default).
    pub access_log: Option<AccessLogSpec>,
    /// TLS termination (`tls`), when set: clients speak TLS 1.2 or 1.3 to this listener.
    pub tls: Option<crate::tls::ListenerTls>,
    /// How long client connections live (`max_connection_age_ms`, `max_requests_per_connection`):
    /// HTTP/1 ones then close after a response that says `Connection: close`, HTTP/2 ones get
    /// GOAWAY, so keep-alive clients and gRPC channels reconnect (and spread onto routers and
    /// members that joined).
    pub connections: rondo_core::ConnectionLimits,
    /// Which matching routes get a request (HTTP only).
    pub routing: Routing,
    /// Filters every request of the listener runs before its route's (`filters`, HTTP only).
    pub filters: Vec<rondo_core::traffic::TrafficFilter>,
    /// HTTP/3 over QUIC on the same port, UDP (`http3 = true`, TLS `http` listeners only);
    /// `None`: TCP only (the default).
    pub http3: Option<Http3Spec>,
    /// A `udp` listener's flows (`udp`); `None` on every other protocol.
    pub udp: Option<UdpSpec>,
    /// Whether a `tcp` listener forwards with splice(2) (`splice`); `Off` on every other
    /// protocol.
    pub splice: Splice,
}

/// How a `tcp` listener moves bytes between client and member (`splice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Splice {
    /// Through a kernel pipe with splice(2) once a direction carries bulk (a read fills the
    /// copy buffer), as HAProxy's `option splice-auto`; TLS on either side copies.
    #[default]
    Auto,
    /// Always through a userspace buffer.
    Off,
}

impl Splice {
    /// Every setting.
    pub const ALL: [Splice; 2] = [Splice::Auto, Splice::Off];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Splice::Auto => "auto",
            Splice::Off => "off",
        }
    }
}

/// How a `udp` listener balances its datagrams (its `udp` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpSpec {
    /// A flow with no datagram either way for this long ends (`idle_timeout`).
    pub idle_timeout: Duration,
    /// Flows open at once; a new client past it evicts the flow idle longest (`max_flows`).
    pub max_flows: u32,
    /// Whether a client's datagrams stay on one member or each picks one (`granularity`).
    pub granularity: UdpGranularity,
}

impl UdpSpec {
    /// Default `idle_timeout`.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default `max_flows`.
    pub const DEFAULT_MAX_FLOWS: u32 = 65_536;
}

impl Default for UdpSpec {
    fn default() -> Self {
        UdpSpec {
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            max_flows: Self::DEFAULT_MAX_FLOWS,
            granularity: UdpGranularity::Flow,
        }
    }
}

/// What a `udp` listener balances (`udp.granularity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UdpGranularity {
    /// A client address's datagrams all go to the member its first one was placed on.
    #[default]
    Flow,
    /// Every datagram picks a member (DNS, syslog, statsd).
    Request,
}

impl UdpGranularity {
    /// Every setting.
    pub const ALL: [UdpGranularity; 2] = [UdpGranularity::Flow, UdpGranularity::Request];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            UdpGranularity::Flow => "flow",
            UdpGranularity::Request => "request",
        }
    }
}

/// A listener's HTTP/3 (`http3 = true` and the `http3_*` limits). QUIC connections count
/// against the listener's `max_connections` with its TCP ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http3Spec {
    /// Request streams one QUIC connection may have open at once (`http3_max_streams`).
    pub max_streams: u32,
    /// A QUIC connection with no packet for this long is closed (`http3_idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// Handshakes in progress past which a new client must first prove its address with a
    /// Retry (`http3_retry_above`; 0: every client does).
    pub retry_above: u32,
    /// Requests in 0-RTT early data accepted, safe methods only (`http3_0rtt`; off).
    pub zero_rtt: bool,
}

impl Http3Spec {
    /// Default `http3_max_streams`.
    pub const DEFAULT_MAX_STREAMS: u32 = 100;
    /// Default `http3_idle_timeout_ms`.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default `http3_retry_above`.
    pub const DEFAULT_RETRY_ABOVE: u32 = 64;
}

/// A listener's HTTP/2 protections: keepalive PINGs, a bounded wait after GOAWAY, and the stream
/// reset budget (per connection and per client address, over [`Http2Limits::RESET_WINDOW`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    /// How often a PING goes to a client; `None` (`h2_keepalive_interval_ms = 0`): never.
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// How long an idle connection told GOAWAY may take to finish before it is dropped.
    pub shutdown_timeout: Duration,
    /// Stream resets (by the client, or by the router for the client's protocol errors) one
    /// connection may cause per window; more, when they are also more than half of the
    /// streams it opened in the window, get GOAWAY `ENHANCE_YOUR_CALM`.
    pub max_resets: u32,
    /// The same, summed over all connections from one client address (IPv6: one /64).
    pub max_resets_per_address: u32,
}

impl Http2Limits {
    /// The window the reset budgets are counted over.
    pub const RESET_WINDOW: Duration = Duration::from_secs(10);
    /// Default `h2_keepalive_interval_ms`.
    pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
    /// Default `h2_keepalive_timeout_ms`.
    pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `h2_shutdown_timeout_ms`.
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default `h2_max_resets`.
    pub const DEFAULT_MAX_RESETS: u32 = 200;
    /// Default `h2_max_resets_per_address`.
    pub const DEFAULT_MAX_RESETS_PER_ADDRESS: u32 = 1000;
}

impl Default for Http2Limits {
    fn default() -> Self {
        Http2Limits {
            keepalive_interval: Some(Self::DEFAULT_KEEPALIVE_INTERVAL),
            keepalive_timeout: Self::DEFAULT_KEEPALIVE_TIMEOUT,
            shutdown_timeout: Self::DEFAULT_SHUTDOWN_TIMEOUT,
            max_resets: Self::DEFAULT_MAX_RESETS,
            max_resets_per_address: Self::DEFAULT_MAX_RESETS_PER_ADDRESS,
        }
    }
}

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

/// Where an access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// The process's standard output (`path = "-"`).
    Stdout,
    /// A file, appended to (created if missing); relative paths are resolved against the
    /// configuration file's directory.
    File(PathBuf),
}

/// A listener's `access_log = { path = "...", format = "text" | "json" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogSpec {
    /// Where the lines go.
    pub target: AccessLogTarget,
    /// One `key=value` line or one JSON object per request.
    pub format: LogFormat,
    /// The fields of each line, in order (`fields`); `None`: the default fields.
    pub fields: Option<Vec<crate::access_format::AccessField>>,
    /// A template instead of `text` or `json` (`format = "{client_ip} {status}"`).
    pub template: Option<Vec<crate::access_format::Piece>>,
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

impl ListenerSpec {
    /// Default `max_connections`.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;
    /// Default `backlog`: Linux's default `net.core.somaxconn` (the standard library and tokio
    /// listen with 128, which a burst of new connections overflows between two accepts).
    pub const DEFAULT_BACKLOG: u32 = 4096;
    /// Largest `backlog` accepted (the kernel caps it at `net.core.somaxconn` anyway).
    pub const MAX_BACKLOG: u64 = 65_535;
    /// Default `header_read_timeout_ms`.
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `body_read_timeout_ms`: HAProxy's common `timeout client 30s`, so a client
    /// that stalls mid-body holds its connection slot no longer than there.
    pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default `max_header_bytes`.
    pub const DEFAULT_MAX_HEADER_BYTES: u32 = 64 * 1024;
    /// Smallest `max_header_bytes` (hyper's smallest read buffer).
    pub const MIN_MAX_HEADER_BYTES: u64 = 8192;
    /// Default `max_headers`.
    pub const DEFAULT_MAX_HEADERS: u32 = 100;
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

/// Where a queue keeps its messages (`backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueBackend {
    /// The embedded, crash-safe store (redb): the file `{directory}/{name}.redb`.
    Embedded {
        /// The directory of the store file (created if missing), relative paths resolved
        /// against the configuration file's directory.
        directory: PathBuf,
    },
    /// A NATS JetStream work-queue stream (`nats_url`, `host:port`), shared by every router
    /// that names the same server and queue (cargo feature `nats`).
    Nats {
        /// `host:port` of the NATS server.
        url: String,
        /// How many subjects (each with its own one-at-a-time consumer) the session keys are
        /// hashed over; every router of a tier must name the same number.
        session_partitions: u32,
    },
}

impl QueueBackend {
    /// The configuration spelling (`embedded` or `nats`).
    pub fn as_str(&self) -> &'static str {
        match self {
            QueueBackend::Embedded { .. } => "embedded",
            QueueBackend::Nats { .. } => "nats",
        }
    }
}

/// A `[[queue]]`: a durable queue of messages accepted by `queue` listeners and delivered to the
/// cluster their route picks, with peek-lock, retries and a dead-letter queue (docs/queues.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// The name, also the last segment of `POST /queues/{name}`.
    pub name: String,
    /// Where the messages live.
    pub backend: QueueBackend,
    /// Most messages held (waiting, in delivery and dead letters); more are answered 503.
    pub max_messages: u64,
    /// Most bytes held (each message's path, header fields and body); more are answered 503.
    pub max_bytes: u64,
    /// Largest message body accepted; a larger one is answered 413.
    pub max_message_bytes: u64,
    /// Delivery attempts before a message moves to the dead-letter queue.
    pub max_attempts: u32,
    /// The wait before the second attempt; doubled for each later one.
    pub backoff_initial: Duration,
    /// The longest wait between attempts.
    pub backoff_max: Duration,
    /// How long a delivery holds its message (peek-lock); a delivery still running then is
    /// counted as failed and the message returns.
    pub lease: Duration,
    /// Deliveries under way at once.
    pub concurrency: u32,
    /// The header field (lower case) whose value is a message's session key: messages with the
    /// same key are delivered in the order they were accepted, one at a time.
    pub session_header: Option<String>,
}

impl QueueSpec {
    /// Default `max_messages`.
    pub const DEFAULT_MAX_MESSAGES: u64 = 1_000_000;
    /// Default `max_bytes` (1 GiB).
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
    /// Default `max_message_bytes` (1 MiB).
    pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1 << 20;
    /// Default `max_attempts`.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
    /// Default `backoff_initial_ms`.
    pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(500);
    /// Default `backoff_max_ms`.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
    /// Default `lease_ms`.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
    /// Default `concurrency`.
    pub const DEFAULT_CONCURRENCY: u32 = 32;
    /// Largest `concurrency`.
    pub const MAX_CONCURRENCY: u64 = 10_000;
    /// Largest `max_attempts`.
    pub const MAX_ATTEMPTS: u64 = 1000;
    /// Default `session_partitions` (NATS).
    pub const DEFAULT_SESSION_PARTITIONS: u32 = 16;
    /// Largest `session_partitions` (NATS).
    pub const MAX_SESSION_PARTITIONS: u64 = 1024;

    /// The wait after failed attempt `attempt` (1-based): `backoff_initial` doubled for each
    /// attempt after the first, at most `backoff_max`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(30);
        self.backoff_initial.saturating_mul(1 << shift).min(self.backoff_max)
    }
}

/// A cluster's `members_dns`: members discovered through DNS, re-resolved by the answer's TTL
/// within [`MembersDnsSpec::MIN_REFRESH`] and `refresh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembersDnsSpec {
    /// What is asked.
    pub query: DnsQuery,
    /// The longest time an answer is kept before asking again (`refresh_ms`); a shorter TTL
    /// asks sooner.
    pub refresh: Duration,
    /// The DNS server asked (`resolver`); `None`: the system's (`/etc/resolv.conf`).
    pub resolver: Option<SocketAddr>,
    /// Most members taken from one answer (`max_members`); the rest are left out.
    pub max_members: u32,
}

impl MembersDnsSpec {
    /// Default `refresh_ms`.
    pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
    /// Shortest time between two resolutions, whatever the TTL (and the least `refresh_ms`).
    pub const MIN_REFRESH: Duration = Duration::from_secs(1);
    /// Largest `refresh_ms`.
    pub const MAX_REFRESH: Duration = Duration::from_secs(86_400);
    /// Default `max_members`.
    pub const DEFAULT_MAX_MEMBERS: u32 = 1_000;
    /// Largest `max_members`.
    pub const MAX_MAX_MEMBERS: u32 = 10_000;
}

/// The question a `members_dns` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsQuery {
    /// A and AAAA records of `name`; each address a member on `port`.
    Address {
        /// The name resolved (`name`).
        name: String,
        /// The members' port (`port`).
        port: u16,
    },
    /// SRV records of `name`; each target's addresses members on the record's port, weighted
    /// by its weight (only the records of the lowest priority).
    Srv {
        /// The SRV name (`srv`), e.g. `_http._tcp.api.internal`.
        name: String,
    },
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
