//! Validation and compilation: turns the raw schema into a [`Config`] (a `rondo_core::View` plus
//! listeners, router, admin and naming settings), filling defaults from `rondo-core`'s `Default`
//! impls and recording every semantic problem with the field path it concerns, so that all of
//! them are reported at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rondo_core::{
    AdminState, AgentPolicy, Algorithm, ClusterSpec, EwmaPolicy, Granularity, HashKeySource,
    HashPolicy, HashTable, HealthCheck, HealthCheckKind, Locality, MemberSpec, OutlierDetection,
    Policy, RetryPolicy, Route, RouteMatch, SlowStart, StickySession, UpstreamProtocol,
    UpstreamTls, View,
};

use crate::Config;
use crate::path::FieldPath;
use crate::raw::{
    RawAdmin, RawAgentReceiver, RawCluster, RawConfig, RawHash, RawHealth, RawListener,
    RawListenerTls, RawMatch, RawMember, RawNaming, RawRoute, RawUpstreamTls,
};
use crate::spec::{
    AdminSpec, AdminToken, AgentKey, AgentSpec, DnsSpec, ErrorDetail, Http2Limits,
    ListenerProtocol, ListenerSpec, NamingSpec, RegistrySpec, RouterSpec,
};
use crate::tls::{self, CertKeyPaths, ClientAuth, ListenerTls};

/// Default idle timeout of a route's client connections (`idle_timeout_ms`).
pub const DEFAULT_ROUTE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default whole-request timeout of a route (`request_timeout_ms`).
pub const DEFAULT_ROUTE_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
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

const UPSTREAM_PROTOCOLS: [(&str, UpstreamProtocol); 3] = [
    ("http1", UpstreamProtocol::Http1),
    ("http2", UpstreamProtocol::Http2),
    ("tcp", UpstreamProtocol::Tcp),
];
const HASH_TABLES: [(&str, HashTable); 2] =
    [("ring", HashTable::Ring), ("maglev", HashTable::Maglev)];
const GRANULARITIES: [Granularity; 3] =
    [Granularity::Request, Granularity::Session, Granularity::Lookup];
const ADMIN_STATES: [AdminState; 3] =
    [AdminState::Active, AdminState::Draining, AdminState::Disabled];
const HEALTH_KINDS: [&str; 2] = ["http", "tcp"];
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

/// `a`, `b` or `c` / `a` or `b` / `a`.
fn one_of<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
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

/// Validates and compiles `raw`; `base_dir` resolves relative file paths.
pub(crate) fn compile(
    raw: RawConfig,
    base_dir: &Path,
    view_id: u64,
) -> Result<Config, Vec<Problem>> {
    let mut c = Compiler { problems: Vec::new(), base_dir };
    let root = FieldPath::root();

    let router = match &raw.router {
        None => RouterSpec::default(),
        Some(r) => {
            if let Some(g) = &r.group
                && g.is_empty()
            {
                c.err(root.key("router").key("group"), "group must not be empty");
            }
            RouterSpec { group: r.group.clone() }
        }
    };
    let admin = raw.admin.as_ref().map(|a| compile_admin(&mut c, a));
    let naming = raw.naming.as_ref().map(|n| compile_naming(&mut c, n));
    let agent = raw.agent.as_ref().map(|a| compile_agent(&mut c, a));

    let listeners: Vec<Option<ListenerSpec>> =
        raw.listener.iter().enumerate().map(|(i, l)| compile_listener(&mut c, i, l)).collect();
    check_unique_listeners(
        &mut c,
        &raw,
        &listeners,
        admin.as_ref(),
        naming.as_ref(),
        agent.as_ref(),
    );

    let mut clusters = BTreeMap::new();
    for (name, rc) in &raw.cluster {
        let interval = agent.as_ref().map_or(AgentSpec::DEFAULT_INTERVAL, |a| a.interval);
        let spec = compile_cluster(&mut c, name, rc, interval);
        clusters.insert(name.clone(), Arc::new(spec));
    }

    // Each listener name's protocol (the first listener of a name; duplicates are errors).
    let mut protocols: HashMap<&str, ListenerProtocol> = HashMap::new();
    for l in &raw.listener {
        let proto = match l.protocol.as_deref() {
            None => Some(ListenerProtocol::default()),
            Some(s) => ListenerProtocol::parse(s),
        };
        if let Some(proto) = proto {
            protocols.entry(l.name.as_str()).or_insert(proto);
        }
    }
    let known_listeners: BTreeSet<&str> = raw.listener.iter().map(|l| l.name.as_str()).collect();
    let mut routes = Vec::with_capacity(raw.route.len());
    let mut route_names: HashMap<String, usize> = HashMap::new();
    let mut tcp_routes: HashMap<&str, String> = HashMap::new();
    for (i, r) in raw.route.iter().enumerate() {
        let path = root.key("route").index(i);
        let route = compile_route(&mut c, &path, i, r, &clusters);
        match route_names.get(&route.name) {
            Some(first) => {
                let p = if r.name.is_some() { path.key("name") } else { path.clone() };
                c.err(p, format!("route name `{}` already used by route[{first}]", route.name));
            }
            None => {
                route_names.insert(route.name.clone(), i);
            }
        }
        if !known_listeners.contains(r.listener.as_str()) {
            let msg = format!(
                "unknown listener `{}`, expected {}",
                r.listener,
                if known_listeners.is_empty() {
                    "a [[listener]] to be defined".to_owned()
                } else {
                    format!("one of {}", one_of(known_listeners.iter().copied()))
                }
            );
            c.err(path.key("listener"), msg);
        } else if let Some(&proto) = protocols.get(r.listener.as_str()) {
            check_route_protocol(&mut c, &path, r, &route, proto, &clusters);
            // A tcp listener takes one route without `sni` (its catch-all), and any number
            // with `sni`, tried in file order.
            if proto == ListenerProtocol::Tcp && route.matcher.sni.is_none() {
                match tcp_routes.get(r.listener.as_str()) {
                    Some(first) => c.err(
                        path.key("listener"),
                        format!(
                            "tcp listener `{}` already has route `{first}` without `match.sni`; a tcp listener takes one route without `sni` (more routes need `match = {{ sni = ... }}`)",
                            r.listener
                        ),
                    ),
                    None => {
                        tcp_routes.insert(&r.listener, route.name.clone());
                    }
                }
            }
        }
        routes.push(route);
    }

    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    Ok(Config {
        view: View { id: view_id, routes, clusters },
        listeners: listeners.into_iter().flatten().collect(),
        router,
        admin,
        naming,
        agent,
        warnings: Vec::new(),
    })
}

fn compile_agent(c: &mut Compiler<'_>, a: &RawAgentReceiver) -> AgentSpec {
    let path = FieldPath::root().key("agent");
    let listen = a.listen.as_deref().unwrap_or(AgentSpec::DEFAULT_LISTEN);
    let listen = c
        .socket_addr(path.key("listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let key = match (&a.key, &a.key_file) {
        (Some(_), Some(_)) => {
            c.err(path.key("key_file"), "set `key` or `key_file`, not both");
            AgentKey::Inline(String::new())
        }
        (Some(k), None) => {
            if k.is_empty() {
                c.err(path.key("key"), "key must not be empty");
            }
            AgentKey::Inline(k.clone())
        }
        (None, Some(f)) => c
            .file_path(path.key("key_file"), f)
            .map_or(AgentKey::Inline(String::new()), AgentKey::File),
        (None, None) => {
            c.err(path.clone(), "[agent] needs `key` or `key_file` (the agents' shared HMAC key)");
            AgentKey::Inline(String::new())
        }
    };
    let default_ms = AgentSpec::DEFAULT_INTERVAL.as_millis() as u64;
    let ms =
        c.int(path.key("interval_ms"), a.interval_ms, default_ms, 1, AgentSpec::MAX_INTERVAL_MS);
    let interval = Duration::from_millis(ms);
    AgentSpec { listen, key, interval }
}

fn compile_admin(c: &mut Compiler<'_>, a: &RawAdmin) -> AdminSpec {
    let path = FieldPath::root().key("admin");
    let listen = a.listen.as_deref().unwrap_or(AdminSpec::DEFAULT_LISTEN);
    let listen = c
        .socket_addr(path.key("listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let token = compile_token(c, &path, a.token.as_ref(), a.token_file.as_ref());
    AdminSpec { listen, token }
}

/// `token` or `token_file` (not both, not empty) of the table at `path`.
fn compile_token(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    token: Option<&String>,
    token_file: Option<&String>,
) -> Option<AdminToken> {
    match (token, token_file) {
        (Some(_), Some(_)) => {
            c.err(path.key("token_file"), "set `token` or `token_file`, not both");
            None
        }
        (Some(t), None) => {
            if t.is_empty() {
                c.err(path.key("token"), "token must not be empty");
            }
            Some(AdminToken::Inline(t.clone()))
        }
        (None, Some(f)) => c.file_path(path.key("token_file"), f).map(AdminToken::File),
        (None, None) => None,
    }
}

fn compile_naming(c: &mut Compiler<'_>, n: &RawNaming) -> NamingSpec {
    let path = FieldPath::root().key("naming");
    let listen = n.listen.as_deref().unwrap_or(NamingSpec::DEFAULT_LISTEN);
    let listen = c
        .socket_addr(path.key("listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let registry = match n.registry.as_deref().unwrap_or("embedded") {
        "embedded" => {
            if n.etcd_endpoints.is_some() {
                c.err(path.key("etcd_endpoints"), "only applies to registry `etcd`");
            }
            if n.etcd_prefix.is_some() {
                c.err(path.key("etcd_prefix"), "only applies to registry `etcd`");
            }
            let snapshot = n.snapshot.as_deref().and_then(|s| c.file_path(path.key("snapshot"), s));
            RegistrySpec::Embedded { snapshot }
        }
        "etcd" => {
            if n.snapshot.is_some() {
                c.err(path.key("snapshot"), "only applies to registry `embedded`");
            }
            let endpoints = n.etcd_endpoints.clone().unwrap_or_default();
            if endpoints.is_empty() {
                c.err(path.key("registry"), "registry `etcd` needs `etcd_endpoints`");
            }
            for (i, e) in endpoints.iter().enumerate() {
                if let Err(msg) = check_host_port(e) {
                    c.err(path.key("etcd_endpoints").index(i), msg);
                }
            }
            let prefix =
                n.etcd_prefix.clone().unwrap_or_else(|| NamingSpec::DEFAULT_ETCD_PREFIX.to_owned());
            if !prefix.starts_with('/') {
                c.err(path.key("etcd_prefix"), format!("`{prefix}` must start with `/`"));
            }
            RegistrySpec::Etcd { endpoints, prefix }
        }
        other => {
            c.err(
                path.key("registry"),
                format!("unknown registry `{other}`, expected {}", one_of(REGISTRIES)),
            );
            RegistrySpec::Embedded { snapshot: None }
        }
    };
    let dns = n.dns_listen.as_deref().map(|l| {
        let listen = c
            .socket_addr(path.key("dns_listen"), l)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let zone = n.dns_zone.as_deref().unwrap_or(NamingSpec::DEFAULT_DNS_ZONE);
        let zone = match dns_zone(zone) {
            Ok(z) => z,
            Err(msg) => {
                c.err(path.key("dns_zone"), msg);
                NamingSpec::DEFAULT_DNS_ZONE.to_owned()
            }
        };
        DnsSpec { listen, zone }
    });
    if dns.is_none() && n.dns_zone.is_some() {
        c.err(path.key("dns_zone"), "only applies with `dns_listen`");
    }
    let token = compile_token(c, &path, n.token.as_ref(), n.token_file.as_ref());
    NamingSpec { listen, registry, dns, token }
}

/// A DNS zone name, lower-cased, with its final dot.
fn dns_zone(zone: &str) -> Result<String, String> {
    let z = zone.trim_end_matches('.').to_ascii_lowercase();
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if z.is_empty() || z.len() > 253 || !z.split('.').all(ok_label) {
        return Err(format!(
            "`{zone}` is not a DNS zone name (labels of letters, digits and `-`, e.g. `rondo.`)"
        ));
    }
    Ok(format!("{z}."))
}

fn compile_listener(c: &mut Compiler<'_>, i: usize, l: &RawListener) -> Option<ListenerSpec> {
    let path = FieldPath::root().key("listener").index(i);
    c.name(path.key("name"), "listener", &l.name);
    let listen = c.socket_addr(path.key("listen"), &l.listen);
    let protocol = match l.protocol.as_deref() {
        None => ListenerProtocol::default(),
        Some(s) => ListenerProtocol::parse(s).unwrap_or_else(|| {
            let all = ListenerProtocol::ALL.map(ListenerProtocol::as_str);
            c.err(
                path.key("protocol"),
                format!("unknown protocol `{s}`, expected {}", one_of(all)),
            );
            ListenerProtocol::default()
        }),
    };
    let max_connections = c.u32(
        path.key("max_connections"),
        l.max_connections,
        ListenerSpec::DEFAULT_MAX_CONNECTIONS,
        1,
    );
    let header_read_timeout = c.ms(
        path.key("header_read_timeout_ms"),
        l.header_read_timeout_ms,
        ListenerSpec::DEFAULT_HEADER_READ_TIMEOUT,
        false,
    );
    let max_header_bytes = c.u32(
        path.key("max_header_bytes"),
        l.max_header_bytes,
        ListenerSpec::DEFAULT_MAX_HEADER_BYTES,
        ListenerSpec::MIN_MAX_HEADER_BYTES,
    );
    let max_body_bytes = c.int(path.key("max_body_bytes"), l.max_body_bytes, 0, 0, u64::MAX);
    let max_headers =
        c.u32(path.key("max_headers"), l.max_headers, ListenerSpec::DEFAULT_MAX_HEADERS, 1);
    let error_detail = match l.error_detail.as_deref() {
        None => None,
        Some(s) => ErrorDetail::parse(s).or_else(|| {
            let all = ErrorDetail::ALL.map(ErrorDetail::as_str);
            c.err(
                path.key("error_detail"),
                format!("unknown error_detail `{s}`, expected {}", one_of(all)),
            );
            None
        }),
    };
    let listen = listen?;
    Some(ListenerSpec {
        name: l.name.clone(),
        listen,
        protocol,
        max_connections,
        header_read_timeout,
        max_header_bytes,
        max_headers,
        max_body_bytes,
        trust_forwarded_for: l.trust_forwarded_for.unwrap_or(false),
        error_detail: error_detail.unwrap_or_else(|| ErrorDetail::default_for(listen)),
        http2: compile_http2(c, &path, l),
        tls: l.tls.as_ref().map(|t| compile_listener_tls(c, &path.key("tls"), t)),
    })
}

/// A listener's `tls`: the settings, and every file they name loaded and checked (so `rondo
/// check` finds a missing file, unreadable PEM, a key of another certificate or an expired
/// certificate at the field naming it).
fn compile_listener_tls(c: &mut Compiler<'_>, path: &FieldPath, t: &RawListenerTls) -> ListenerTls {
    if t.certs.is_empty() {
        c.err(path.key("certs"), "a tls listener needs at least one certificate in `certs`");
    }
    let mut certs = Vec::with_capacity(t.certs.len());
    for (j, ck) in t.certs.iter().enumerate() {
        let p = path.key("certs").index(j);
        let cert = c.file_path(p.key("cert"), &ck.cert);
        let key = c.file_path(p.key("key"), &ck.key);
        let (Some(cert), Some(key)) = (cert, key) else { continue };
        let paths = CertKeyPaths { cert, key };
        if let Err((which, msg)) = tls::load_cert_key(&paths) {
            let field = match which {
                tls::Which::Cert => "cert",
                tls::Which::Key => "key",
            };
            c.err(p.key(field), msg);
        }
        certs.push(paths);
    }
    let client_auth = match t.client_auth.as_deref() {
        None => ClientAuth::None,
        Some(s) => ClientAuth::parse(s).unwrap_or_else(|| {
            let all = ClientAuth::ALL.map(ClientAuth::as_str);
            c.err(
                path.key("client_auth"),
                format!("unknown client_auth `{s}`, expected {}", one_of(all)),
            );
            ClientAuth::None
        }),
    };
    let client_ca = t.client_ca.as_deref().and_then(|s| c.file_path(path.key("client_ca"), s));
    if let Some(ca) = &client_ca
        && let Err(msg) = tls::load_roots(ca, "client_ca")
    {
        c.err(path.key("client_ca"), msg);
    }
    if client_auth != ClientAuth::None && t.client_ca.is_none() {
        c.err(
            path.key("client_auth"),
            format!(
                "client_auth `{}` needs `client_ca`, the roots client certificates are checked against",
                client_auth.as_str()
            ),
        );
    }
    ListenerTls { certs, client_ca, client_auth }
}

fn compile_http2(c: &mut Compiler<'_>, path: &FieldPath, l: &RawListener) -> Http2Limits {
    let d = Http2Limits::default();
    let interval = c.ms(
        path.key("h2_keepalive_interval_ms"),
        l.h2_keepalive_interval_ms,
        Http2Limits::DEFAULT_KEEPALIVE_INTERVAL,
        true,
    );
    let max_resets =
        c.u32(path.key("h2_max_resets"), l.h2_max_resets, Http2Limits::DEFAULT_MAX_RESETS, 1);
    let per_address_path = path.key("h2_max_resets_per_address");
    let max_resets_per_address = c.u32(
        per_address_path.clone(),
        l.h2_max_resets_per_address,
        Http2Limits::DEFAULT_MAX_RESETS_PER_ADDRESS.max(max_resets),
        1,
    );
    if max_resets_per_address < max_resets {
        c.err(
            per_address_path,
            format!("must be at least h2_max_resets ({max_resets}), got {max_resets_per_address}"),
        );
    }
    Http2Limits {
        keepalive_interval: (!interval.is_zero()).then_some(interval),
        keepalive_timeout: c.ms(
            path.key("h2_keepalive_timeout_ms"),
            l.h2_keepalive_timeout_ms,
            d.keepalive_timeout,
            false,
        ),
        shutdown_timeout: c.ms(
            path.key("h2_shutdown_timeout_ms"),
            l.h2_shutdown_timeout_ms,
            d.shutdown_timeout,
            false,
        ),
        max_resets,
        max_resets_per_address,
    }
}

/// Duplicate listener names, and two sockets bound to the same address.
fn check_unique_listeners(
    c: &mut Compiler<'_>,
    raw: &RawConfig,
    listeners: &[Option<ListenerSpec>],
    admin: Option<&AdminSpec>,
    naming: Option<&NamingSpec>,
    agent: Option<&AgentSpec>,
) {
    let root = FieldPath::root();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, l) in raw.listener.iter().enumerate() {
        if l.name.is_empty() {
            continue;
        }
        if let Some(&first) = names.get(l.name.as_str()) {
            c.err(
                root.key("listener").index(i).key("name"),
                format!("duplicate listener name `{}`, first used by listener[{first}]", l.name),
            );
        } else {
            names.insert(&l.name, i);
        }
    }
    let mut addrs: HashMap<SocketAddr, String> = HashMap::new();
    let mut bind = |c: &mut Compiler<'_>, addr: SocketAddr, path: FieldPath| {
        if addr.port() == 0 {
            return;
        }
        match addrs.get(&addr) {
            Some(first) => c.err(path, format!("address `{addr}` is already used by {first}")),
            None => {
                addrs.insert(addr, path.to_string());
            }
        }
    };
    for (i, l) in listeners.iter().enumerate() {
        if let Some(l) = l {
            bind(c, l.listen, root.key("listener").index(i).key("listen"));
        }
    }
    if let Some(a) = admin {
        bind(c, a.listen, root.key("admin").key("listen"));
    }
    if let Some(n) = naming {
        bind(c, n.listen, root.key("naming").key("listen"));
        // DNS is UDP and TCP on its own port; a clash with a TCP listener is still a clash.
        if let Some(d) = &n.dns {
            bind(c, d.listen, root.key("naming").key("dns_listen"));
        }
    }
    if let Some(a) = agent {
        bind(c, a.listen, root.key("agent").key("listen"));
    }
}

fn compile_route(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    i: usize,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
) -> Route {
    let name = match &r.name {
        Some(n) => {
            c.name(path.key("name"), "route", n);
            n.clone()
        }
        None => format!("route-{}", i + 1),
    };
    let unknown_cluster = |name: &str| {
        format!(
            "unknown cluster `{name}`, expected {}",
            if clusters.is_empty() {
                "a [cluster.NAME] to be defined".to_owned()
            } else {
                format!("one of {}", one_of(clusters.keys().map(String::as_str)))
            }
        )
    };
    if !clusters.contains_key(&r.cluster) {
        c.err(path.key("cluster"), unknown_cluster(&r.cluster));
    }
    let mut seen = BTreeSet::new();
    for (j, b) in r.backups.iter().enumerate() {
        let p = path.key("backups").index(j);
        if *b == r.cluster {
            c.err(p, format!("backup `{b}` is the route's primary cluster"));
        } else if !seen.insert(b.as_str()) {
            c.err(p, format!("backup `{b}` is listed twice"));
        } else if !clusters.contains_key(b) {
            c.err(p, unknown_cluster(b));
        }
    }
    let matcher = compile_match(c, &path.key("match"), r.matcher.as_ref());
    Route {
        name,
        listener: r.listener.clone(),
        matcher,
        cluster: r.cluster.clone(),
        backups: r.backups.clone(),
        idle_timeout: c.ms(
            path.key("idle_timeout_ms"),
            r.idle_timeout_ms,
            DEFAULT_ROUTE_IDLE_TIMEOUT,
            false,
        ),
        request_timeout: c.ms(
            path.key("request_timeout_ms"),
            r.request_timeout_ms,
            DEFAULT_ROUTE_REQUEST_TIMEOUT,
            false,
        ),
    }
}

fn compile_match(c: &mut Compiler<'_>, path: &FieldPath, m: Option<&RawMatch>) -> RouteMatch {
    let Some(m) = m else {
        return RouteMatch::default();
    };
    if let Some(h) = &m.host {
        let bare = h.strip_prefix("*.").unwrap_or(h);
        if bare.is_empty() || bare.contains('*') {
            c.err(path.key("host"), format!("`{h}` is not a host name or `*.` wildcard"));
        } else if bare.contains(':') && !bare.starts_with('[') {
            c.err(path.key("host"), format!("`{h}` must not include a port"));
        }
    }
    if let Some(p) = &m.path_prefix
        && !p.starts_with('/')
    {
        c.err(path.key("path_prefix"), format!("`{p}` must start with `/`"));
    }
    let mut methods: Vec<String> = Vec::new();
    if let Some(list) = &m.method {
        if list.0.is_empty() {
            c.err(
                path.key("method"),
                "must list at least one method (omit it to match every method)",
            );
        }
        for (j, meth) in list.0.iter().enumerate() {
            if !is_token(meth) {
                let p = if list.0.len() == 1 {
                    path.key("method")
                } else {
                    path.key("method").index(j)
                };
                c.err(p, format!("`{meth}` is not an HTTP method"));
            }
            let up = meth.to_ascii_uppercase();
            if !methods.contains(&up) {
                methods.push(up);
            }
        }
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in m.headers.iter().flatten() {
        let p = path.key("headers").key(name);
        let lower = name.to_ascii_lowercase();
        if !is_token(name) {
            c.err(p, format!("`{name}` is not a header name"));
        } else if headers.iter().any(|(n, _)| *n == lower) {
            c.err(p, format!("header `{lower}` is listed twice (names are case-insensitive)"));
        }
        headers.push((lower, value.clone()));
    }
    let sni = m.sni.as_ref().map(|n| {
        let bare = n.strip_prefix("*.").unwrap_or(n);
        let ok = !bare.is_empty()
            && bare.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !ok {
            c.err(path.key("sni"), format!("`{n}` is not a DNS name or `*.` wildcard"));
        }
        n.to_ascii_lowercase()
    });
    RouteMatch { host: m.host.clone(), path_prefix: m.path_prefix.clone(), methods, headers, sni }
}

/// What a route may do given its listener's protocol.
fn check_route_protocol(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    route: &Route,
    proto: ListenerProtocol,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
) {
    if proto == ListenerProtocol::Http
        && let Some(m) = &r.matcher
        && m.sni.is_some()
    {
        c.err(
            path.key("match").key("sni"),
            format!(
                "route on http listener `{}` cannot match on `sni`: it matches the TLS server name \
                 of tcp listeners (an http listener routes on `host`)",
                r.listener
            ),
        );
    }
    if proto == ListenerProtocol::Tcp
        && let Some(m) = &r.matcher
    {
        let mut conds = Vec::new();
        if m.host.is_some() {
            conds.push("host");
        }
        if m.path_prefix.is_some() {
            conds.push("path_prefix");
        }
        if m.method.is_some() {
            conds.push("method");
        }
        if m.headers.is_some() {
            conds.push("headers");
        }
        if !conds.is_empty() {
            c.err(
                path.key("match"),
                format!(
                    "route on tcp listener `{}` cannot match on {} (tcp has no HTTP request to match)",
                    r.listener,
                    one_of(conds)
                ),
            );
        }
    }
    let targets = std::iter::once((path.key("cluster"), &route.cluster))
        .chain(route.backups.iter().enumerate().map(|(j, b)| (path.key("backups").index(j), b)));
    for (p, name) in targets {
        let Some(cluster) = clusters.get(name) else {
            continue;
        };
        let up = cluster.upstream_protocol;
        match proto {
            ListenerProtocol::Tcp if up != UpstreamProtocol::Tcp => c.err(
                p,
                format!(
                    "tcp listener `{}` cannot route to cluster `{name}` with upstream_protocol `{}`, it needs `tcp`",
                    r.listener,
                    upstream_protocol_str(up)
                ),
            ),
            ListenerProtocol::Http if up == UpstreamProtocol::Tcp => c.err(
                p,
                format!(
                    "http listener `{}` cannot route to cluster `{name}` with upstream_protocol `tcp`, it needs `http1` or `http2`",
                    r.listener
                ),
            ),
            _ => {}
        }
    }
}

fn compile_cluster(
    c: &mut Compiler<'_>,
    name: &str,
    rc: &RawCluster,
    agent_interval: Duration,
) -> ClusterSpec {
    let path = FieldPath::root().key("cluster").key(name);
    c.name(path.clone(), "cluster", name);
    let d = Policy::default();

    let algorithm = match rc.algorithm.as_deref() {
        None => d.algorithm,
        Some(s) => Algorithm::parse(s).unwrap_or_else(|| {
            let all = Algorithm::ALL.map(Algorithm::as_str);
            c.err(
                path.key("algorithm"),
                format!("unknown algorithm `{s}`, expected {}", one_of(all)),
            );
            d.algorithm
        }),
    };
    let granularity = match rc.granularity.as_deref() {
        None => d.granularity,
        Some(s) => Granularity::parse(s).unwrap_or_else(|| {
            let all = GRANULARITIES.map(Granularity::as_str);
            c.err(
                path.key("granularity"),
                format!("unknown granularity `{s}`, expected {}", one_of(all)),
            );
            d.granularity
        }),
    };
    let upstream_protocol = match rc.upstream_protocol.as_deref() {
        None => UpstreamProtocol::default(),
        Some(s) => {
            UPSTREAM_PROTOCOLS.iter().find(|(n, _)| *n == s).map(|(_, p)| *p).unwrap_or_else(|| {
                let all = UPSTREAM_PROTOCOLS.map(|(n, _)| n);
                c.err(
                    path.key("upstream_protocol"),
                    format!("unknown upstream_protocol `{s}`, expected {}", one_of(all)),
                );
                UpstreamProtocol::default()
            })
        }
    };
    let panic_threshold_percent = c.percent(
        path.key("panic_threshold_percent"),
        rc.panic_threshold_percent,
        d.panic_threshold_percent,
        0,
    );

    let members = compile_members(c, &path.key("members"), &rc.members);
    let health = rc.health.as_ref().map(|h| compile_health(c, &path.key("health"), h));

    let outlier = match &rc.outlier {
        None => d.outlier.clone(),
        Some(o) => {
            let p = path.key("outlier");
            let od = OutlierDetection::default();
            let base = c.ms(p.key("base_ejection_ms"), o.base_ejection_ms, od.base_ejection, false);
            let max = c.ms(p.key("max_ejection_ms"), o.max_ejection_ms, od.max_ejection, false);
            if max < base {
                let at = if o.max_ejection_ms.is_some() {
                    "max_ejection_ms"
                } else {
                    "base_ejection_ms"
                };
                c.err(
                    p.key(at),
                    format!(
                        "max_ejection_ms ({}) must be at least base_ejection_ms ({})",
                        max.as_millis(),
                        base.as_millis()
                    ),
                );
            }
            OutlierDetection {
                consecutive_failures: c.u32(
                    p.key("consecutive_failures"),
                    o.consecutive_failures,
                    od.consecutive_failures,
                    0,
                ),
                count_5xx: o.count_5xx.unwrap_or(od.count_5xx),
                base_ejection: base,
                max_ejection: max,
                max_ejected_percent: c.percent(
                    p.key("max_ejected_percent"),
                    o.max_ejected_percent,
                    od.max_ejected_percent,
                    0,
                ),
            }
        }
    };

    let retry = match &rc.retry {
        None => d.retry.clone(),
        Some(r) => {
            let p = path.key("retry");
            let rd = RetryPolicy::default();
            RetryPolicy {
                attempts: c.u32(p.key("attempts"), r.attempts, rd.attempts, 1),
                per_try_timeout: r
                    .per_try_timeout_ms
                    .map(|ms| c.ms(p.key("per_try_timeout_ms"), Some(ms), Duration::ZERO, false))
                    .or(rd.per_try_timeout),
                budget_percent: c.percent(
                    p.key("budget_percent"),
                    r.budget_percent,
                    rd.budget_percent,
                    0,
                ),
                budget_min_per_sec: c.u32(
                    p.key("budget_min_per_sec"),
                    r.budget_min_per_sec,
                    rd.budget_min_per_sec,
                    0,
                ),
            }
        }
    };

    let slow_start = match &rc.slow_start {
        None => d.slow_start,
        Some(s) => {
            let p = path.key("slow_start");
            let sd = SlowStart::default();
            SlowStart {
                duration: c.ms(p.key("duration_ms"), s.duration_ms, sd.duration, true),
                initial_percent: c.percent(
                    p.key("initial_percent"),
                    s.initial_percent,
                    sd.initial_percent,
                    1,
                ),
            }
        }
    };

    let locality = match &rc.locality {
        None => d.locality,
        Some(l) => {
            Locality { prefer_local: l.prefer_local.unwrap_or(Locality::default().prefer_local) }
        }
    };

    let hash = match &rc.hash {
        None => d.hash.clone(),
        Some(h) => compile_hash(c, &path.key("hash"), h, upstream_protocol),
    };

    // Silence allowed: `timeout_ms` if given, else `misses` (default 3) heartbeat intervals of
    // `[agent] interval_ms` (default 200 ms, so 600 ms, the core's default).
    let default_timeout = agent_interval * AgentSpec::DEFAULT_MISSES;
    let agent = match &rc.agent {
        None => AgentPolicy { timeout: default_timeout },
        Some(a) => {
            let p = path.key("agent");
            if a.timeout_ms.is_some() && a.misses.is_some() {
                c.err(p.key("misses"), "set `misses` or `timeout_ms`, not both");
            }
            let misses = c.int(
                p.key("misses"),
                a.misses,
                u64::from(AgentSpec::DEFAULT_MISSES),
                1,
                AgentSpec::MAX_MISSES,
            );
            let by_misses = agent_interval * u32::try_from(misses).unwrap_or(1);
            AgentPolicy { timeout: c.ms(p.key("timeout_ms"), a.timeout_ms, by_misses, false) }
        }
    };

    let ewma = match &rc.ewma {
        None => d.ewma,
        Some(e) => {
            let p = path.key("ewma");
            let ed = EwmaPolicy::default();
            EwmaPolicy {
                decay: c.ms(p.key("decay_ms"), e.decay_ms, ed.decay, false),
                default_rtt: c.ms(p.key("default_rtt_ms"), e.default_rtt_ms, ed.default_rtt, true),
                failure_penalty: c.ms(
                    p.key("failure_penalty_ms"),
                    e.failure_penalty_ms,
                    ed.failure_penalty,
                    true,
                ),
            }
        }
    };

    let sticky = match &rc.session {
        None => StickySession::default(),
        Some(s) => {
            let p = path.key("session");
            let sd = StickySession::default();
            let cookie = s.cookie.clone().unwrap_or(sd.cookie);
            if !is_token(&cookie) {
                c.err(p.key("cookie"), format!("`{cookie}` is not a cookie name"));
            }
            let header = s.header.as_ref().map(|h| {
                if !is_token(h) {
                    c.err(p.key("header"), format!("`{h}` is not a header name"));
                }
                h.to_ascii_lowercase()
            });
            StickySession {
                cookie,
                header: header.or(sd.header),
                idle_timeout: c.ms(
                    p.key("idle_timeout_ms"),
                    s.idle_timeout_ms,
                    sd.idle_timeout,
                    false,
                ),
            }
        }
    };

    let upstream_tls = rc.upstream_tls.as_ref().map(|t| compile_upstream_tls(c, &path, t));
    ClusterSpec {
        name: name.to_owned(),
        members,
        policy: Policy {
            algorithm,
            granularity,
            slow_start,
            locality,
            panic_threshold_percent,
            health,
            outlier,
            retry,
            hash,
            agent,
            ewma,
        },
        upstream_protocol,
        sticky,
        upstream_tls,
    }
}

/// A cluster's `upstream_tls`, every file loaded and checked like a listener's.
fn compile_upstream_tls(
    c: &mut Compiler<'_>,
    cluster: &FieldPath,
    t: &RawUpstreamTls,
) -> UpstreamTls {
    let path = cluster.key("upstream_tls");
    let ca = c.file_path(path.key("ca"), &t.ca).unwrap_or_default();
    if !t.ca.is_empty()
        && let Err(msg) = tls::load_roots(&ca, "ca")
    {
        c.err(path.key("ca"), msg);
    }
    if let Some(name) = &t.server_name
        && rustls_pki_types::ServerName::try_from(name.as_str()).is_err()
    {
        c.err(path.key("server_name"), format!("`{name}` is not a DNS name or IP address"));
    }
    let cert = t.cert.as_deref().and_then(|s| c.file_path(path.key("cert"), s));
    let key = t.key.as_deref().and_then(|s| c.file_path(path.key("key"), s));
    match (&cert, &key) {
        (Some(cert), Some(key)) => {
            let paths = CertKeyPaths { cert: cert.clone(), key: key.clone() };
            if let Err((which, msg)) = tls::load_cert_key(&paths) {
                let field = match which {
                    tls::Which::Cert => "cert",
                    tls::Which::Key => "key",
                };
                c.err(path.key(field), msg);
            }
        }
        (Some(_), None) => c.err(path.key("cert"), "`cert` needs `key`, its private key"),
        (None, Some(_)) => c.err(path.key("key"), "`key` needs `cert`, its certificate"),
        (None, None) => {}
    }
    UpstreamTls { ca, server_name: t.server_name.clone(), cert, key }
}

fn compile_members(c: &mut Compiler<'_>, path: &FieldPath, raw: &[RawMember]) -> Vec<MemberSpec> {
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut addrs: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        let p = path.index(i);
        c.name(p.key("name"), "member", &m.name);
        match names.get(m.name.as_str()) {
            Some(first) if !m.name.is_empty() => {
                c.err(
                    p.key("name"),
                    format!("duplicate member name `{}`, first used by members[{first}]", m.name),
                );
            }
            _ => {
                names.insert(&m.name, i);
            }
        }
        match check_host_port(&m.address) {
            Err(msg) => c.err(p.key("address"), msg),
            Ok(()) => {
                let key = m.address.to_ascii_lowercase();
                match addrs.get(&key) {
                    Some(first) => c.err(
                        p.key("address"),
                        format!(
                            "duplicate member address `{}`, first used by members[{first}]",
                            m.address
                        ),
                    ),
                    None => {
                        addrs.insert(key, i);
                    }
                }
            }
        }
        let weight = c.int(p.key("weight"), m.weight, DEFAULT_WEIGHT, 1, MAX_WEIGHT);
        if let Some(g) = &m.group
            && g.is_empty()
        {
            c.err(p.key("group"), "group must not be empty");
        }
        let admin = match m.state.as_deref() {
            None => AdminState::default(),
            Some(s) => AdminState::parse(s).unwrap_or_else(|| {
                let all = ADMIN_STATES.map(AdminState::as_str);
                c.err(p.key("state"), format!("unknown state `{s}`, expected {}", one_of(all)));
                AdminState::default()
            }),
        };
        out.push(MemberSpec {
            name: m.name.clone(),
            address: m.address.clone(),
            weight: u32::try_from(weight).unwrap_or(1),
            group: m.group.clone(),
            admin,
        });
    }
    out
}

/// Parses `200` or `200-399`.
fn parse_status_range(s: &str) -> Result<(u16, u16), String> {
    let parse = |t: &str| match t.trim().parse::<u16>() {
        Ok(n) if (100..=599).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{s}` is not a status or status range between 100 and 599, like `200` or `200-399`"
        )),
    };
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (parse(a)?, parse(b)?),
        None => {
            let n = parse(s)?;
            (n, n)
        }
    };
    if lo > hi {
        return Err(format!("`{s}` is an empty range: {lo} is greater than {hi}"));
    }
    Ok((lo, hi))
}

fn compile_health(c: &mut Compiler<'_>, path: &FieldPath, h: &RawHealth) -> HealthCheck {
    let hd = HealthCheck::default();
    let http_fields = h.path.is_some() || h.expect_status.is_some();
    let is_http = match h.kind.as_deref() {
        None => http_fields,
        Some("http") => true,
        Some("tcp") => {
            for (field, set) in
                [("path", h.path.is_some()), ("expect_status", h.expect_status.is_some())]
            {
                if set {
                    c.err(path.key(field), "only applies to health checks of kind `http`");
                }
            }
            false
        }
        Some(other) => {
            c.err(
                path.key("kind"),
                format!("unknown health check kind `{other}`, expected {}", one_of(HEALTH_KINDS)),
            );
            http_fields
        }
    };
    let kind = if is_http {
        let p = h.path.clone().unwrap_or_else(|| DEFAULT_HEALTH_PATH.to_owned());
        if !p.starts_with('/') {
            c.err(path.key("path"), format!("`{p}` must start with `/`"));
        }
        let (expect_min, expect_max) = match h.expect_status.as_deref().map(parse_status_range) {
            None => DEFAULT_EXPECT_STATUS,
            Some(Ok(r)) => r,
            Some(Err(msg)) => {
                c.err(path.key("expect_status"), msg);
                DEFAULT_EXPECT_STATUS
            }
        };
        HealthCheckKind::Http { path: p, expect_min, expect_max }
    } else {
        HealthCheckKind::Tcp
    };
    HealthCheck {
        kind,
        interval: c.ms(path.key("interval_ms"), h.interval_ms, hd.interval, false),
        timeout: c.ms(path.key("timeout_ms"), h.timeout_ms, hd.timeout, false),
        rise: c.u32(path.key("rise"), h.rise, hd.rise, 1),
        fall: c.u32(path.key("fall"), h.fall, hd.fall, 1),
    }
}

fn compile_hash(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    h: &RawHash,
    up: UpstreamProtocol,
) -> HashPolicy {
    let hd = HashPolicy::default();
    let table = match h.table.as_deref() {
        None => hd.table,
        Some(s) => {
            HASH_TABLES.iter().find(|(n, _)| *n == s).map(|(_, t)| *t).unwrap_or_else(|| {
                let all = HASH_TABLES.map(|(n, _)| n);
                c.err(
                    path.key("table"),
                    format!("unknown hash table `{s}`, expected {}", one_of(all)),
                );
                hd.table
            })
        }
    };
    let key = match h.key.as_deref() {
        None => hd.key.clone(),
        Some(s) => {
            let parsed = if s == "client-address" {
                Ok(HashKeySource::ClientAddress)
            } else if let Some(name) = s.strip_prefix("header:") {
                if is_token(name) {
                    Ok(HashKeySource::Header(name.to_ascii_lowercase()))
                } else {
                    Err(format!("`{name}` in `{s}` is not a header name"))
                }
            } else if let Some(name) = s.strip_prefix("cookie:") {
                if is_token(name) {
                    Ok(HashKeySource::Cookie(name.to_owned()))
                } else {
                    Err(format!("`{name}` in `{s}` is not a cookie name"))
                }
            } else {
                Err(format!(
                    "unknown hash key `{s}`, expected `client-address`, `header:NAME` or `cookie:NAME`"
                ))
            };
            match parsed {
                Ok(k) => {
                    if up == UpstreamProtocol::Tcp && k != HashKeySource::ClientAddress {
                        c.err(path.key("key"), format!("a tcp cluster has no headers or cookies, it can only hash on `client-address`, not `{s}`"));
                    }
                    k
                }
                Err(msg) => {
                    c.err(path.key("key"), msg);
                    hd.key.clone()
                }
            }
        }
    };
    let bounded_load = match h.bounded_load {
        None => hd.bounded_load,
        Some(0.0) => None,
        Some(x) if x.is_finite() && x >= 1.0 => Some(x),
        Some(x) => {
            c.err(path.key("bounded_load"), format!("must be 0 (off) or at least 1.0, got {x}"));
            hd.bounded_load
        }
    };
    let ring_vnodes = c.int(
        path.key("ring_vnodes"),
        h.ring_vnodes,
        u64::from(hd.ring_vnodes),
        1,
        MAX_RING_VNODES,
    );
    HashPolicy {
        table,
        key,
        bounded_load,
        ring_vnodes: u32::try_from(ring_vnodes).unwrap_or(hd.ring_vnodes),
    }
}
