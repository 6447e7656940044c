//! Validation and compilation: turns the raw schema into a [`Config`] (a `rondo_core::View` plus
//! listeners, router, admin and naming settings), filling defaults from `rondo-core`'s `Default`
//! impls and recording every semantic problem with the field path it concerns, so that all of
//! them are reported at once.
//!
//! One module per part of the file: [`services`] (`[router]`, `[log]`, `[agent]`, `[admin]`),
//! [`naming`], [`listeners`], [`route_table`] (the list) with [`routes`] and [`route_match`]
//! (one route), [`clusters`] with [`health`] and [`retry`], [`queues`]; this one holds the
//! [`Compiler`] that collects the problems and the order in which the parts are compiled.

mod breakers;
mod clusters;
mod health;
mod hedge;
mod listeners;
mod members_dns;
mod naming;
mod naming_parent;
mod observe;
mod queues;
mod rate_limit;
mod retry;
mod route_match;
mod route_table;
mod routes;
mod sampling;
mod services;
mod shared_members;
mod splice;
mod split;
mod tracing;
mod traffic;
mod traffic_edge;
mod udp;

use clusters::compile_cluster;
pub use clusters::{DeclaredPolicyError, compile_declared_policy};
use listeners::{
    OwnSockets, check_members_are_not_own, check_unique_listeners, compile_listener,
    compile_listener_tls,
};
use naming::compile_naming;
use queues::{check_queue_route, check_queues, compile_queue};
use routes::{check_route_protocol, compile_route};
use services::{compile_admin, compile_agent, compile_log, compile_router, log_format};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rondo_core::{
    AdminState, AgentPolicy, Algorithm, Branch, ClusterSpec, EwmaPolicy, FilterRef, Granularity,
    HashKeySource, HashPolicy, HashTable, HealthCheck, HealthCheckKind, Locality, MemberSpec,
    OutlierDetection, Policy, RetryPolicy, Route, RouteAuth, RouteLogin, RouteMatch, SessionReplay,
    SlowStart, StickySession, UpstreamProtocol, UpstreamTls, View,
};

use crate::Config;
use crate::path::FieldPath;
use crate::raw::{
    RawAccessLog, RawAdmin, RawAgentReceiver, RawAuth, RawCluster, RawConfig, RawHash, RawHealth,
    RawListener, RawListenerTls, RawLog, RawMatch, RawMemberEntry, RawNaming, RawQueue, RawRoute,
    RawUpstreamTls, RawXds,
};
use crate::spec::{
    AccessLogSpec, AccessLogTarget, AdminSpec, AdminToken, AgentKey, AgentSpec, DnsSpec,
    ErrorDetail, Http2Limits, Http3Spec, ListenerProtocol, ListenerSpec, LogFormat, LogSpec,
    NamingSpec, ProbeSpec, QueueBackend, QueueSpec, RegistrySpec, RouterSpec, Routing, XdsSpec,
};
use crate::tls::{self, CertKeyPaths, ClientAuth, ListenerTls};

/// Default idle timeout of a route's client connections (`idle_timeout_ms`).
pub const DEFAULT_ROUTE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default whole-request timeout of a route (`request_timeout_ms`).
pub const DEFAULT_ROUTE_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `max_peek_bytes` of a route with a body filter: 64 KiB.
pub const DEFAULT_MAX_PEEK_BYTES: u64 = 64 * 1024;
/// Largest `max_peek_bytes`: 16 MiB (the bytes are held in memory while the route is decided).
pub const MAX_PEEK_BYTES: u64 = 16 << 20;
/// Default `expect_status` of an HTTP health check.
pub const DEFAULT_EXPECT_STATUS: (u16, u16) = (200, 399);
/// Default `path` of an HTTP health check.
pub const DEFAULT_HEALTH_PATH: &str = "/";
/// Default member `weight`.
pub const DEFAULT_WEIGHT: u64 = 100;
/// Largest member `weight`.
pub const MAX_WEIGHT: u64 = 1_000_000;
/// Largest `ring_vnodes` (the ring holds about `ring_vnodes` entries per member).
pub const MAX_RING_VNODES: u64 = 100_000;

const UPSTREAM_PROTOCOLS: [(&str, UpstreamProtocol); 4] = [
    ("http1", UpstreamProtocol::Http1),
    ("http2", UpstreamProtocol::Http2),
    ("tcp", UpstreamProtocol::Tcp),
    ("udp", UpstreamProtocol::Udp),
];
const HASH_TABLES: [(&str, HashTable); 2] =
    [("ring", HashTable::Ring), ("maglev", HashTable::Maglev)];
const GRANULARITIES: [Granularity; 3] =
    [Granularity::Request, Granularity::Session, Granularity::Lookup];
const ADMIN_STATES: [AdminState; 3] =
    [AdminState::Active, AdminState::Draining, AdminState::Disabled];
const HEALTH_KINDS: [&str; 4] = ["grpc", "http", "tcp", "udp"];
const REGISTRIES: [&str; 2] = ["embedded", "etcd"];

/// The configuration spelling of an upstream protocol.
pub fn upstream_protocol_str(p: UpstreamProtocol) -> &'static str {
    UPSTREAM_PROTOCOLS.iter().find(|(_, q)| *q == p).map_or("?", |(s, _)| s)
}

/// One semantic problem: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub path: FieldPath,
    pub message: String,
}

/// The error of a cluster name the file does not define.
fn unknown_cluster(name: &str, clusters: &BTreeMap<String, Arc<ClusterSpec>>) -> String {
    format!(
        "unknown cluster `{name}`, expected {}",
        if clusters.is_empty() {
            "a [cluster.NAME] to be defined".to_owned()
        } else {
            format!("one of {}", one_of(clusters.keys().map(String::as_str)))
        }
    )
}

/// `a`, `b` or `c` / `a` or `b` / `a`.
pub(crate) fn one_of<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| format!("`{s}`")).collect();
    match items.len() {
        0 => String::new(),
        1 => items[0].clone(),
        n => format!("{} or {}", items[..n - 1].join(", "), items[n - 1]),
    }
}

/// RFC 9110 `token` (header names, methods, cookie names).
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Checks a `host:port` address (host a DNS name, an IPv4 address or a bracketed IPv6 address).
fn check_host_port(addr: &str) -> Result<(), String> {
    if let Some((scheme, rest)) = addr.split_once("://") {
        // A URL where an address goes: show the address it names.
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let port = if scheme.eq_ignore_ascii_case("https") { "443" } else { "80" };
        let fixed = match authority.rsplit_once(':') {
            Some((_, p)) if !p.is_empty() && !p.contains(']') => authority.to_owned(),
            _ => format!("{authority}:{port}"),
        };
        return Err(format!("an address is host:port without a scheme: write `{fixed}`"));
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("`{addr}` is not host:port"));
    };
    if host.is_empty() {
        return Err(format!("`{addr}` has no host"));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let ok = inner.strip_suffix(']').is_some_and(|ip| ip.parse::<Ipv6Addr>().is_ok());
        if !ok {
            return Err(format!("`{host}` in `{addr}` is not a bracketed IPv6 address"));
        }
    } else if host.contains(':') {
        return Err(format!("an IPv6 address in `{addr}` must be in brackets, like `[::1]:80`"));
    } else if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    {
        return Err(format!("`{host}` in `{addr}` is not a host name or IP address"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("`{port}` in `{addr}` is not a port, expected 1 to 65535")),
    }
}

/// Whether connecting to `address` (a member's `host:port`) reaches a socket bound at `bound`
/// on this host, judged from the text alone: the same port, and the same IP, or `localhost`
/// or a loopback or unspecified IP when `bound` is loopback or unspecified (`0.0.0.0` and `[::]`
/// answer on every local address; connecting to an unspecified IP reaches this host). Other
/// host names are not resolved. The naming API adds the host's own interface addresses for an
/// unspecified `bound`.
pub fn address_reaches(address: &str, bound: SocketAddr) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else { return false };
    if port.parse::<u16>().ok() != Some(bound.port()) {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) if host.eq_ignore_ascii_case("localhost") => {
            return bound.ip().is_loopback() || bound.ip().is_unspecified();
        }
        Err(_) => return false,
    };
    let ip = canonical_ip(ip);
    let b = canonical_ip(bound.ip());
    ip == b || ip.is_unspecified() || (b.is_unspecified() && ip.is_loopback())
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Collects problems while compiling.
struct Compiler<'a> {
    problems: Vec<Problem>,
    base_dir: &'a Path,
}

impl Compiler<'_> {
    fn err(&mut self, path: FieldPath, message: impl Into<String>) {
        self.problems.push(Problem { path, message: message.into() });
    }

    /// An integer field in `min..=max`, else the default.
    fn int(&mut self, path: FieldPath, v: Option<u64>, default: u64, min: u64, max: u64) -> u64 {
        match v {
            None => default,
            Some(v) if (min..=max).contains(&v) => v,
            Some(v) => {
                let msg = if v < min && max >= u64::from(u32::MAX) {
                    if min == 1 {
                        "must be greater than 0".to_owned()
                    } else {
                        format!("must be at least {min}, got {v}")
                    }
                } else if min == 0 || v > max && max >= u64::from(u32::MAX) {
                    format!("must be at most {max}, got {v}")
                } else {
                    format!("must be between {min} and {max}, got {v}")
                };
                self.err(path, msg);
                default
            }
        }
    }

    /// A `u32` field, at least `min`.
    fn u32(&mut self, path: FieldPath, v: Option<u64>, default: u32, min: u64) -> u32 {
        let n = self.int(path, v, u64::from(default), min, u64::from(u32::MAX));
        u32::try_from(n).unwrap_or(default)
    }

    /// A percentage in `min..=100`.
    fn percent(&mut self, path: FieldPath, v: Option<u64>, default: u8, min: u64) -> u8 {
        let n = self.int(path, v, u64::from(default), min, 100);
        u8::try_from(n).unwrap_or(default)
    }

    /// A `*_ms` duration; zero refused unless `zero_ok`.
    fn ms(
        &mut self,
        path: FieldPath,
        v: Option<u64>,
        default: Duration,
        zero_ok: bool,
    ) -> Duration {
        match v {
            None => default,
            Some(0) if !zero_ok => {
                self.err(path, "must be greater than 0");
                default
            }
            Some(ms) => Duration::from_millis(ms),
        }
    }

    /// `max_connection_age_ms` and `max_requests_per_connection` at `path` (each at least 1);
    /// `tunnels`: why a `tcp` listener or cluster refuses them.
    fn connection_limits(
        &mut self,
        path: &FieldPath,
        (age_ms, requests): (Option<u64>, Option<u64>),
        tunnels: Option<&str>,
    ) -> rondo_core::ConnectionLimits {
        if let Some(why) = tunnels {
            for (field, v) in
                [("max_connection_age_ms", age_ms), ("max_requests_per_connection", requests)]
            {
                if v.is_some() {
                    self.err(path.key(field), why);
                }
            }
        }
        let max_age = age_ms.map(|_| {
            self.ms(path.key("max_connection_age_ms"), age_ms, Duration::from_secs(1), false)
        });
        let max_requests = requests
            .map(|_| self.int(path.key("max_requests_per_connection"), requests, 1, 1, u64::MAX));
        rondo_core::ConnectionLimits { max_age, max_requests }
    }

    /// A name (of a listener, route, cluster or member): non-empty, no white space or controls.
    fn name(&mut self, path: FieldPath, what: &str, s: &str) {
        if s.is_empty() {
            self.err(path, format!("{what} name must not be empty"));
        } else if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            self.err(
                path,
                format!("{what} name `{}` must not contain white space", s.escape_debug()),
            );
        }
    }

    /// A socket address to bind.
    fn socket_addr(&mut self, path: FieldPath, s: &str) -> Option<SocketAddr> {
        match s.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                let msg =
                    format!("`{s}` is not a socket address, expected IP:PORT like 127.0.0.1:8080");
                self.err(path, msg);
                None
            }
        }
    }

    /// A relative path resolved against the configuration file's directory.
    fn file_path(&mut self, path: FieldPath, s: &str) -> Option<std::path::PathBuf> {
        if s.is_empty() {
            self.err(path, "path must not be empty");
            None
        } else {
            Some(self.base_dir.join(s))
        }
    }
}

/// Validates and compiles `raw`; `base_dir` resolves relative file paths. The parts are compiled
/// in the order they depend on each other: the process-wide tables, the listeners (whose sockets
/// members must not be), the clusters, then the routes that name both.
pub(crate) fn compile(
    raw: RawConfig,
    base_dir: &Path,
    view_id: u64,
) -> Result<Config, Vec<Problem>> {
    let mut c = Compiler { problems: Vec::new(), base_dir };
    let router = raw.router.as_ref().map(|r| compile_router(&mut c, r)).unwrap_or_default();
    let cluster_names: Vec<&str> = raw.cluster.keys().map(String::as_str).collect();
    let admin = raw.admin.as_ref().map(|a| compile_admin(&mut c, a, &cluster_names));
    let naming = raw.naming.as_ref().map(|n| compile_naming(&mut c, n));
    let agent = raw.agent.as_ref().map(|a| compile_agent(&mut c, a));
    let log = raw.log.as_ref().map(|l| compile_log(&mut c, l)).unwrap_or_default();
    let metrics = raw.metrics.as_ref().map(|m| observe::compile_metrics(&mut c, m));
    let tracing = raw.tracing.as_ref().and_then(|t| tracing::compile_tracing(&mut c, t));

    let listeners: Vec<Option<ListenerSpec>> =
        raw.listener.iter().enumerate().map(|(i, l)| compile_listener(&mut c, i, l)).collect();
    let own = OwnSockets::new(&listeners, admin.as_ref(), naming.as_ref(), agent.as_ref());
    check_unique_listeners(&mut c, &raw, &own);

    let shared = shared_members::compile_shared_members(&mut c, &raw);
    let tier = raw.tier.as_ref().map(|t| shared_members::compile_tier(&mut c, t));
    let agent_interval = agent.as_ref().map_or(AgentSpec::DEFAULT_INTERVAL, |a| a.interval);
    let (clusters, members_dns) = compile_clusters(&mut c, &raw, agent_interval, &shared);
    check_members_are_not_own(&mut c, &raw, &own);

    let declared_ok = naming.as_ref().is_some_and(|n| n.allow_registered_clusters);
    let mut routes = route_table::compile_routes(&mut c, &raw, &clusters, &router, declared_ok);

    let queues: Vec<QueueSpec> =
        raw.queue.iter().enumerate().map(|(i, q)| compile_queue(&mut c, i, q)).collect();
    check_queues(&mut c, &raw);

    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    // Evaluation order: priority, higher first, then file order (a stable sort).
    routes.sort_by_key(|r: &Route| std::cmp::Reverse(r.priority));
    Ok(Config {
        view: View { id: view_id, routes, clusters },
        listeners: listeners.into_iter().flatten().collect(),
        router,
        admin,
        naming,
        agent,
        warnings: Vec::new(),
        log,
        metrics: metrics.unwrap_or_default(),
        queues,
        members_dns,
        shared_members: shared_members::listed_by(&raw),
        tier,
        tracing,
    })
}

/// Every `[cluster.NAME]`, and the `members_dns` of those that have one.
fn compile_clusters(
    c: &mut Compiler<'_>,
    raw: &RawConfig,
    agent_interval: Duration,
    shared: &BTreeMap<String, MemberSpec>,
) -> (BTreeMap<String, Arc<ClusterSpec>>, BTreeMap<String, crate::spec::MembersDnsSpec>) {
    let mut clusters = BTreeMap::new();
    let mut members_dns = BTreeMap::new();
    for (name, rc) in &raw.cluster {
        let spec = compile_cluster(c, name, rc, agent_interval, shared);
        clusters.insert(name.clone(), Arc::new(spec));
        if let Some(d) = &rc.members_dns {
            let path = FieldPath::root().key("cluster").key(name).key("members_dns");
            if let Some(d) = members_dns::compile_members_dns(c, &path, d) {
                members_dns.insert(name.clone(), d);
            }
        }
    }
    (clusters, members_dns)
}
