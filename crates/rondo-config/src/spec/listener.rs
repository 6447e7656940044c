//! A compiled `[[listener]]`: its protocol and routing, limits, trusted peers and PROXY protocol,
//! HTTP/2 protections, HTTP/3, `udp` flows, error detail and access log.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::LogFormat;

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
    /// Whether a `tcp` listener forwards with splice(2) (`splice`), and an `http` listener its
    /// HTTP/1 bodies of known length; `Off` on every other protocol.
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
