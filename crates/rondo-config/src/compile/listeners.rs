//! `[[listener]]`: addresses, protocols, limits, HTTP/2 protections, access logs; and the checks
//! across listeners and the other sockets of the config (no two bound to one address, no member
//! at one of them).

use super::observe::compile_access_log;
use super::*;
use crate::ocsp::OcspSource;
use crate::raw::Trust;
use crate::spec::{ProxyProtocolMode, ProxyProtocolSpec, Trusted};

pub(super) fn compile_listener(
    c: &mut Compiler<'_>,
    i: usize,
    l: &RawListener,
) -> Option<ListenerSpec> {
    let path = FieldPath::root().key("listener").index(i);
    c.name(path.key("name"), "listener", &l.name);
    let listen = c.socket_addr(path.key("listen"), &l.listen);
    let protocol = listener_protocol(c, &path, l.protocol.as_deref());
    let max_connections = c.u32(
        path.key("max_connections"),
        l.max_connections,
        ListenerSpec::DEFAULT_MAX_CONNECTIONS,
        1,
    );
    let backlog = c.int(
        path.key("backlog"),
        l.backlog,
        u64::from(ListenerSpec::DEFAULT_BACKLOG),
        1,
        ListenerSpec::MAX_BACKLOG,
    );
    let backlog = u32::try_from(backlog).unwrap_or(ListenerSpec::DEFAULT_BACKLOG);
    let header_read_timeout = c.ms(
        path.key("header_read_timeout_ms"),
        l.header_read_timeout_ms,
        ListenerSpec::DEFAULT_HEADER_READ_TIMEOUT,
        false,
    );
    let body_read_timeout = c.ms(
        path.key("body_read_timeout_ms"),
        l.body_read_timeout_ms,
        ListenerSpec::DEFAULT_BODY_READ_TIMEOUT,
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
    let error_detail = error_detail(c, &path, l.error_detail.as_deref());
    let routing = routing(c, &path, l.routing.as_deref());
    if protocol == ListenerProtocol::Tcp {
        check_tcp_listener(c, &path, l, routing);
    }
    let listen = listen?;
    let access_log = access_log(c, &path, l, protocol);
    let tunnels = (protocol == ListenerProtocol::Tcp)
        .then_some("tcp listeners carry tunnels, which are not cut by age or count");
    let limits = (l.max_connection_age_ms, l.max_requests_per_connection);
    let connections = c.connection_limits(&path, limits, tunnels);
    let filters = listener_filters(c, &path, l, protocol);
    Some(ListenerSpec {
        name: l.name.clone(),
        listen,
        protocol,
        max_connections,
        backlog,
        header_read_timeout,
        body_read_timeout,
        max_header_bytes,
        max_headers,
        max_body_bytes,
        trust_forwarded_for: compile_trust(c, &path, l.trust_forwarded_for.as_ref()),
        proxy_protocol: compile_proxy_protocol(c, &path, l, protocol),
        error_detail: error_detail.unwrap_or_else(|| ErrorDetail::default_for(listen)),
        http2: compile_http2(c, &path, l),
        tls: l.tls.as_ref().map(|t| compile_listener_tls(c, &path.key("tls"), t)),
        access_log,
        connections,
        routing,
        filters,
        http3: compile_http3(c, &path, l, protocol),
        udp: super::udp::compile_listener_udp(c, &path, l, protocol),
        splice: super::splice::compile_splice(c, &path, l, protocol),
    })
}

/// `protocol`: what the listener speaks, `http` by default.
fn listener_protocol(c: &mut Compiler<'_>, path: &FieldPath, s: Option<&str>) -> ListenerProtocol {
    let Some(s) = s else { return ListenerProtocol::default() };
    ListenerProtocol::parse(s).unwrap_or_else(|| {
        let all = ListenerProtocol::ALL.map(ListenerProtocol::as_str);
        c.err(path.key("protocol"), format!("unknown protocol `{s}`, expected {}", one_of(all)));
        ListenerProtocol::default()
    })
}

/// `error_detail`: how much an error answer tells; unset, it follows the listen address.
fn error_detail(c: &mut Compiler<'_>, path: &FieldPath, s: Option<&str>) -> Option<ErrorDetail> {
    let s = s?;
    ErrorDetail::parse(s).or_else(|| {
        let all = ErrorDetail::ALL.map(ErrorDetail::as_str);
        c.err(
            path.key("error_detail"),
            format!("unknown error_detail `{s}`, expected {}", one_of(all)),
        );
        None
    })
}

/// `routing`: the first matching route, or every one.
fn routing(c: &mut Compiler<'_>, path: &FieldPath, s: Option<&str>) -> Routing {
    let Some(s) = s else { return Routing::default() };
    Routing::parse(s).unwrap_or_else(|| {
        let all = Routing::ALL.map(Routing::as_str);
        c.err(path.key("routing"), format!("unknown routing `{s}`, expected {}", one_of(all)));
        Routing::default()
    })
}

/// A `tcp` listener routes each connection once and reads no request bodies.
fn check_tcp_listener(c: &mut Compiler<'_>, path: &FieldPath, l: &RawListener, routing: Routing) {
    if routing == Routing::AllMatches {
        c.err(
            path.key("routing"),
            "tcp listeners route each connection once (`all-matches` copies HTTP requests)",
        );
    }
    if l.body_read_timeout_ms.is_some() {
        c.err(path.key("body_read_timeout_ms"), "tcp listeners read no request bodies");
    }
}

/// `access_log`, which logs HTTP requests (not `tcp` sessions, not yet `queue` messages).
fn access_log(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Option<AccessLogSpec> {
    let access_log =
        l.access_log.as_ref().map(|a| compile_access_log(c, path.key("access_log"), a));
    if access_log.is_some() && protocol == ListenerProtocol::Tcp {
        c.err(path.key("access_log"), "tcp listeners have no access log (it logs HTTP requests)");
    }
    if protocol == ListenerProtocol::Queue && access_log.is_some() {
        c.err(path.key("access_log"), "queue listeners have no access log yet");
    }
    access_log
}

/// A listener's `filters` (its edge filters), which only `http` listeners run.
fn listener_filters(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Vec<rondo_core::traffic::TrafficFilter> {
    let filters = super::traffic::compile_filters(c, &path.key("filters"), l.filters.as_deref());
    super::sampling::refuse_listener_mirrors(c, path, l.filters.as_deref());
    if !filters.is_empty() && protocol != ListenerProtocol::Http {
        c.err(path.key("filters"), "only http listeners run filters");
    }
    filters
}

/// A listener's `http3` and its limits; HTTP/3 runs over QUIC, whose handshake is TLS 1.3, so
/// only a TLS `http` listener has it. A limit set without `http3 = true` is refused too (it
/// would do nothing).
fn compile_http3(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Option<Http3Spec> {
    let on = l.http3.unwrap_or(false);
    if on && protocol != ListenerProtocol::Http {
        c.err(path.key("http3"), "only http listeners serve HTTP/3");
    } else if on && l.tls.is_none() {
        c.err(
            path.key("http3"),
            "http3 needs `tls`: QUIC's handshake is TLS 1.3, with the listener's certificates",
        );
    }
    let limits = [
        ("http3_max_streams", l.http3_max_streams),
        ("http3_idle_timeout_ms", l.http3_idle_timeout_ms),
        ("http3_retry_above", l.http3_retry_above),
        ("http3_0rtt", l.http3_0rtt.map(u64::from)),
    ];
    if !on {
        for (field, v) in limits {
            if v.is_some() {
                c.err(path.key(field), format!("{field} needs `http3 = true`"));
            }
        }
        return None;
    }
    let zero_rtt = l.http3_0rtt.unwrap_or(false);
    let client_auth = l.tls.as_ref().and_then(|t| t.client_auth.as_deref()).unwrap_or("none");
    if zero_rtt && client_auth != "none" {
        c.err(
            path.key("http3_0rtt"),
            format!(
                "http3_0rtt cannot be on with client_auth `{client_auth}`: early data arrives \
                 before the client's certificate is checked"
            ),
        );
    }
    let max_streams = c.u32(
        path.key("http3_max_streams"),
        l.http3_max_streams,
        Http3Spec::DEFAULT_MAX_STREAMS,
        1,
    );
    let idle_timeout = c.ms(
        path.key("http3_idle_timeout_ms"),
        l.http3_idle_timeout_ms,
        Http3Spec::DEFAULT_IDLE_TIMEOUT,
        false,
    );
    let retry_above = c.u32(
        path.key("http3_retry_above"),
        l.http3_retry_above,
        Http3Spec::DEFAULT_RETRY_ABOVE,
        0,
    );
    Some(Http3Spec { max_streams, idle_timeout, retry_above, zero_rtt })
}

/// A listener's `tls`: the settings, and every file they name loaded and checked (so `rondo
/// check` finds a missing file, unreadable PEM, a key of another certificate or an expired
/// certificate at the field naming it).
pub(super) fn compile_listener_tls(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    t: &RawListenerTls,
) -> ListenerTls {
    if t.certs.is_empty() {
        c.err(path.key("certs"), "a tls listener needs at least one certificate in `certs`");
    }
    let mut certs = Vec::with_capacity(t.certs.len());
    for (j, ck) in t.certs.iter().enumerate() {
        let p = path.key("certs").index(j);
        let cert = c.file_path(p.key("cert"), &ck.cert);
        let key = c.file_path(p.key("key"), &ck.key);
        let ocsp = match ck.ocsp.as_deref() {
            None => None,
            Some("fetch") => Some(OcspSource::Fetch),
            Some(file) => c.file_path(p.key("ocsp"), file).map(OcspSource::File),
        };
        let (Some(cert), Some(key)) = (cert, key) else { continue };
        let paths = CertKeyPaths { cert, key, ocsp };
        match tls::load_cert_key(&paths) {
            Err((which, msg)) => {
                let field = match which {
                    tls::Which::Cert => "cert",
                    tls::Which::Key => "key",
                };
                c.err(p.key(field), msg);
            }
            Ok(loaded) => {
                if let Err(msg) = tls::check_ocsp(&paths, &loaded) {
                    c.err(p.key("ocsp"), msg);
                }
            }
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

pub(super) fn compile_http2(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
) -> Http2Limits {
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

/// Networks written as CIDRs (`10.0.0.0/8`) or single addresses (`10.1.2.3`, a /32 or /128).
fn networks(c: &mut Compiler<'_>, path: &FieldPath, items: &[String]) -> Vec<ipnet::IpNet> {
    let mut out = Vec::new();
    for (i, s) in items.iter().enumerate() {
        let parsed = s
            .parse::<ipnet::IpNet>()
            .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
        match parsed {
            Ok(n) => out.push(n.trunc()),
            Err(_) => c.err(
                path.index(i),
                format!("`{s}` is not a network: write a CIDR such as `10.0.0.0/8` or an address"),
            ),
        }
    }
    out
}

/// `trust_forwarded_for`: `true`, `false`, or networks.
fn compile_trust(c: &mut Compiler<'_>, path: &FieldPath, t: Option<&Trust>) -> Trusted {
    match t {
        None | Some(Trust::All(false)) => Trusted::Nobody,
        Some(Trust::All(true)) => Trusted::Everyone,
        Some(Trust::Networks(items)) => {
            let path = path.key("trust_forwarded_for");
            if items.is_empty() {
                c.err(path.clone(), "an empty list trusts nobody: write `false`");
            }
            Trusted::Networks(networks(c, &path, items))
        }
    }
}

/// `proxy_protocol` and `trusted_sources` (required with it: whose headers to believe).
fn compile_proxy_protocol(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Option<ProxyProtocolSpec> {
    let Some(mode) = &l.proxy_protocol else {
        if l.trusted_sources.is_some() {
            c.err(path.key("trusted_sources"), "trusted_sources needs proxy_protocol");
        }
        return None;
    };
    let mode = match ProxyProtocolMode::ALL.into_iter().find(|m| m.as_str() == mode) {
        Some(m) => m,
        None => {
            let all = ProxyProtocolMode::ALL.map(ProxyProtocolMode::as_str);
            let message = format!("unknown proxy_protocol `{mode}`, expected {}", one_of(all));
            c.err(path.key("proxy_protocol"), message);
            return None;
        }
    };
    if protocol == ListenerProtocol::Queue {
        c.err(path.key("proxy_protocol"), "queue listeners do not read PROXY headers yet");
    }
    let Some(sources) = &l.trusted_sources else {
        c.err(
            path.key("proxy_protocol"),
            "proxy_protocol needs trusted_sources (the proxies in front, e.g. [\"10.0.0.0/8\"]; \
             [\"0.0.0.0/0\", \"::/0\"] trusts everyone)",
        );
        return None;
    };
    let trusted = networks(c, &path.key("trusted_sources"), &sources.0);
    if sources.0.is_empty() {
        c.err(path.key("trusted_sources"), "trusted_sources must name at least one network");
    }
    Some(ProxyProtocolSpec { mode, trusted })
}

/// The sockets this config binds (port 0: any free port, never a clash), each with its field:
/// the listeners, the admin and naming APIs and the probe listener, DNS (with `dns`), the agent receiver.
pub(super) struct OwnSockets(Vec<(SocketAddr, FieldPath, bool)>);

impl OwnSockets {
    /// Collects them; the flag marks DNS's socket, which counts for clashes but is not compared
    /// with member addresses (those are the other sockets' business).
    pub(super) fn new(
        listeners: &[Option<ListenerSpec>],
        admin: Option<&AdminSpec>,
        naming: Option<&NamingSpec>,
        agent: Option<&AgentSpec>,
    ) -> OwnSockets {
        let root = FieldPath::root();
        let mut own = Vec::new();
        for (i, l) in listeners.iter().enumerate() {
            if let Some(l) = l {
                own.push((l.listen, root.key("listener").index(i).key("listen"), false));
            }
        }
        if let Some(a) = admin {
            own.push((a.listen, root.key("admin").key("listen"), false));
            if let Some(p) = a.probes.listen {
                own.push((p, root.key("admin").key("probe_listen"), false));
            }
        }
        if let Some(n) = naming {
            own.push((n.listen, root.key("naming").key("listen"), false));
            // DNS is UDP and TCP on its own port; a clash with a TCP listener is still a clash.
            if let Some(d) = &n.dns {
                own.push((d.listen, root.key("naming").key("dns_listen"), true));
            }
            if let Some(x) = &n.xds {
                own.push((x.listen, root.key("naming").key("xds").key("listen"), false));
            }
        }
        if let Some(a) = agent {
            own.push((a.listen, root.key("agent").key("listen"), false));
        }
        own.retain(|(a, _, _)| a.port() != 0);
        OwnSockets(own)
    }
}

/// Duplicate listener names, and two sockets bound to the same address.
pub(super) fn check_unique_listeners(c: &mut Compiler<'_>, raw: &RawConfig, own: &OwnSockets) {
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
    for (addr, path, _) in &own.0 {
        match addrs.get(addr) {
            Some(first) => {
                c.err(path.clone(), format!("address `{addr}` is already used by {first}"))
            }
            None => {
                addrs.insert(*addr, path.to_string());
            }
        }
    }
}

/// A configured member at one of this config's own addresses (a listener: a request loop; the
/// admin or naming API: the API served through the public listener; the agent receiver).
pub(super) fn check_members_are_not_own(c: &mut Compiler<'_>, raw: &RawConfig, own: &OwnSockets) {
    let root = FieldPath::root();
    for (name, rc) in &raw.cluster {
        let inline = rc.members.iter().enumerate().filter_map(|(i, m)| match m {
            crate::raw::RawMemberEntry::Inline(m) => Some((i, m)),
            crate::raw::RawMemberEntry::Shared(_) => None,
        });
        for (i, m) in inline {
            let reached = own.0.iter().filter(|(_, _, dns)| !dns);
            if let Some((addr, field, _)) =
                reached.into_iter().find(|(a, _, _)| address_reaches(&m.address, *a))
            {
                c.err(
                    root.key("cluster").key(name).key("members").index(i).key("address"),
                    format!(
                        "member address `{}` is this router's own {field} (`{addr}`): a member \
                         must be another server",
                        m.address
                    ),
                );
            }
        }
    }
    // `[member.NAME]` tables: the same rule, at their own address.
    for (name, m) in &raw.member {
        let reached = own.0.iter().filter(|(_, _, dns)| !dns);
        if let Some((addr, field, _)) =
            reached.into_iter().find(|(a, _, _)| address_reaches(&m.address, *a))
        {
            c.err(
                root.key("member").key(name).key("address"),
                format!(
                    "member address `{}` is this router's own {field} (`{addr}`): a member must \
                     be another server",
                    m.address
                ),
            );
        }
    }
}
