//! `[cluster.NAME]`: the policy (algorithm, granularity, health, outlier detection, retries, slow
//! start, locality, hashing, agents, EWMA, sessions) and the members; `health` and `retry` are in
//! their own modules.

use super::health::compile_health;
use super::retry::{grpc_policy, retry};
use super::*;

use crate::raw::{RawAgent, RawEwma, RawOutlier, RawSession, RawSlowStart};

/// Largest `connect_timeout_ms`.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);

pub(super) fn compile_cluster(
    c: &mut Compiler<'_>,
    name: &str,
    rc: &RawCluster,
    agent_interval: Duration,
    shared: &BTreeMap<String, MemberSpec>,
) -> ClusterSpec {
    let path = FieldPath::root().key("cluster").key(name);
    c.name(path.clone(), "cluster", name);
    compile_cluster_at(c, &path, name, rc, agent_interval, shared)
}

/// Why a registration's declared policy is refused: every problem, each starting with the
/// field it concerns (`policy.algorithm: unknown algorithm ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct DeclaredPolicyError(pub Vec<String>);

/// Compiles the policy a registration declares for cluster `cluster` (the naming API's
/// `policy` object, PKUAS's deployment descriptor): the fields and values of a `[cluster.NAME]`
/// table, checked by the same code with the same messages, the field paths under `policy`
/// instead of `cluster.NAME`. `members` (members register themselves) and `upstream_tls` (it
/// names files on the router) are refused. `agent.misses` counts intervals of the default
/// `[agent] interval_ms`. The result has no members.
pub fn compile_declared_policy(
    cluster: &str,
    policy: &serde_json::Value,
) -> Result<ClusterSpec, DeclaredPolicyError> {
    let rc: RawCluster = serde_path_to_error::deserialize(policy).map_err(|e| {
        let at = e.path().to_string();
        let field =
            if at == "." || at.is_empty() { "policy".to_owned() } else { format!("policy.{at}") };
        DeclaredPolicyError(vec![format!("{field}: {}", e.inner())])
    })?;
    let mut problems = Vec::new();
    if !rc.members.is_empty() {
        problems.push(
            "policy.members: members register themselves, a declared policy cannot list them"
                .to_owned(),
        );
    }
    if rc.upstream_tls.is_some() {
        problems.push(
            "policy.upstream_tls: it names files on the router, only the config file can set it"
                .to_owned(),
        );
    }
    if rc.members_dns.is_some() {
        problems.push(
            "policy.members_dns: members register themselves, a declared policy cannot name a \
             DNS name to resolve"
                .to_owned(),
        );
    }
    let rc = RawCluster { members: Vec::new(), upstream_tls: None, members_dns: None, ..rc };
    let mut c = Compiler { problems: Vec::new(), base_dir: Path::new("") };
    let path = FieldPath::root().key("policy");
    let none = BTreeMap::new();
    let spec = compile_cluster_at(&mut c, &path, cluster, &rc, AgentSpec::DEFAULT_INTERVAL, &none);
    problems.extend(c.problems.into_iter().map(|p| format!("{}: {}", p.path, p.message)));
    if problems.is_empty() { Ok(spec) } else { Err(DeclaredPolicyError(problems)) }
}

/// A cluster table at `path` (`cluster.NAME`, or a declared `policy`).
fn compile_cluster_at(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    name: &str,
    rc: &RawCluster,
    agent_interval: Duration,
    shared: &BTreeMap<String, MemberSpec>,
) -> ClusterSpec {
    let path = path.clone();
    let d = Policy::default();
    let algorithm = algorithm(c, &path, rc.algorithm.as_deref());
    let granularity = granularity(c, &path, rc.granularity.as_deref());
    let upstream_protocol = upstream_protocol(c, &path, rc.upstream_protocol.as_deref());
    let panic_threshold_percent = c.percent(
        path.key("panic_threshold_percent"),
        rc.panic_threshold_percent,
        d.panic_threshold_percent,
        0,
    );

    let members = compile_members(c, &path.key("members"), &rc.members, shared);
    let health = rc.health.as_ref().map(|h| compile_health(c, &path.key("health"), h));
    let outlier = rc.outlier.as_ref().map_or_else(|| d.outlier.clone(), |o| outlier(c, &path, o));
    let retry = rc.retry.as_ref().map_or_else(|| d.retry.clone(), |r| retry(c, &path, r));
    let slow_start = rc.slow_start.as_ref().map_or(d.slow_start, |s| slow_start(c, &path, s));
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
    let agent = agent_policy(c, &path, rc.agent.as_ref(), agent_interval);
    let ewma = rc.ewma.as_ref().map_or(d.ewma, |e| ewma(c, &path, e));
    let sticky = rc.session.as_ref().map_or_else(StickySession::default, |s| session(c, &path, s));

    let upstream_tls = rc.upstream_tls.as_ref().map(|t| compile_upstream_tls(c, &path, t));
    super::udp::check_cluster(c, &path, rc, upstream_protocol, health.as_ref());
    let limits = (rc.max_connection_age_ms, rc.max_requests_per_connection);
    let connections = c.connection_limits(&path, limits, no_connection_limits(upstream_protocol));
    let grpc = grpc_policy(c, &path, rc);
    let connect_timeout = connect_timeout(c, &path, rc.connect_timeout_ms);
    let limits = request_limits(c, &path, rc, upstream_protocol);
    let send_proxy = send_proxy(c, &path, rc.proxy_protocol.as_deref());
    check_tcp_cluster(c, &path, rc, &retry, upstream_protocol);
    let xds =
        rc.xds.as_ref().map_or(d.xds, |x| super::services::cluster_xds(c, &path, x, algorithm));
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
            connections,
            grpc,
            connect_timeout,
            limits,
            send_proxy,
            xds,
            view_id_header: rc.view_id_header.unwrap_or(false),
        },
        upstream_protocol,
        sticky,
        upstream_tls,
    }
}

/// `algorithm`: one of the core's, its default when unset.
fn algorithm(c: &mut Compiler<'_>, path: &FieldPath, s: Option<&str>) -> Algorithm {
    let d = Policy::default().algorithm;
    let Some(s) = s else { return d };
    Algorithm::parse(s).unwrap_or_else(|| {
        let all = Algorithm::ALL.map(Algorithm::as_str);
        c.err(path.key("algorithm"), format!("unknown algorithm `{s}`, expected {}", one_of(all)));
        d
    })
}

/// `granularity`: what one pick serves (a request, a session, a lookup).
fn granularity(c: &mut Compiler<'_>, path: &FieldPath, s: Option<&str>) -> Granularity {
    let d = Policy::default().granularity;
    let Some(s) = s else { return d };
    Granularity::parse(s).unwrap_or_else(|| {
        let all = GRANULARITIES.map(Granularity::as_str);
        c.err(
            path.key("granularity"),
            format!("unknown granularity `{s}`, expected {}", one_of(all)),
        );
        d
    })
}

/// `upstream_protocol`: what the cluster's members speak.
fn upstream_protocol(c: &mut Compiler<'_>, path: &FieldPath, s: Option<&str>) -> UpstreamProtocol {
    let Some(s) = s else { return UpstreamProtocol::default() };
    UPSTREAM_PROTOCOLS.iter().find(|(n, _)| *n == s).map(|(_, p)| *p).unwrap_or_else(|| {
        let all = UPSTREAM_PROTOCOLS.map(|(n, _)| n);
        c.err(
            path.key("upstream_protocol"),
            format!("unknown upstream_protocol `{s}`, expected {}", one_of(all)),
        );
        UpstreamProtocol::default()
    })
}

/// Why members of `up` refuse connection limits (age, requests per connection), if they do.
fn no_connection_limits(up: UpstreamProtocol) -> Option<&'static str> {
    match up {
        UpstreamProtocol::Tcp => {
            Some("tcp members carry one session per connection: no limit applies")
        }
        UpstreamProtocol::Udp => Some("udp members carry flows, not connections: no limit applies"),
        _ => None,
    }
}

/// `connect_timeout_ms`: greater than 0, at most 5 minutes.
fn connect_timeout(c: &mut Compiler<'_>, path: &FieldPath, v: Option<u64>) -> Duration {
    let connect_timeout =
        c.ms(path.key("connect_timeout_ms"), v, Policy::DEFAULT_CONNECT_TIMEOUT, false);
    if connect_timeout > MAX_CONNECT_TIMEOUT {
        c.err(path.key("connect_timeout_ms"), "connect_timeout_ms must be at most 300000 (5 min)");
    }
    connect_timeout
}

/// `max_requests`, `max_requests_per_member` and `max_connections`: the circuit breakers.
fn request_limits(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    rc: &RawCluster,
    up: UpstreamProtocol,
) -> rondo_core::RequestLimits {
    let cap =
        |c: &mut Compiler<'_>, key: &str, v: Option<u64>| v.map(|_| c.u32(path.key(key), v, 1, 1));
    rondo_core::RequestLimits {
        max_requests: cap(c, "max_requests", rc.max_requests),
        max_requests_per_member: cap(c, "max_requests_per_member", rc.max_requests_per_member),
        max_connections: super::breakers::connection_cap(c, path, rc, up),
    }
}

/// `proxy_protocol`: the PROXY header (`v1` or `v2`) sent to members.
fn send_proxy(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    s: Option<&str>,
) -> Option<rondo_core::ProxyHeader> {
    match s {
        None => None,
        Some("v1") => Some(rondo_core::ProxyHeader::V1),
        Some("v2") => Some(rondo_core::ProxyHeader::V2),
        Some(other) => {
            let message = format!("unknown proxy_protocol `{other}`, expected `v1` or `v2`");
            c.err(path.key("proxy_protocol"), message);
            None
        }
    }
}

/// A `tcp` cluster neither hedges nor adds a header to HTTP responses.
fn check_tcp_cluster(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    rc: &RawCluster,
    retry: &RetryPolicy,
    up: UpstreamProtocol,
) {
    if up != UpstreamProtocol::Tcp {
        return;
    }
    if retry.hedge.is_some() {
        c.err(
            path.key("retry").key("hedge"),
            "tcp clusters cannot hedge (a session is one stream)",
        );
    }
    if rc.view_id_header == Some(true) {
        let why = "view_id_header is a field of HTTP responses: a tcp cluster has none";
        c.err(path.key("view_id_header"), why);
    }
}

pub(super) fn compile_members(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    raw: &[RawMemberEntry],
    shared: &BTreeMap<String, MemberSpec>,
) -> Vec<MemberSpec> {
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut addrs: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, entry) in raw.iter().enumerate() {
        let p = path.index(i);
        // A `[member.NAME]` was checked at its own table: here only its name, and the
        // duplicates within this cluster, at the entry.
        let (spec, name_at, address_ok, address_at) = match entry {
            RawMemberEntry::Inline(m) => {
                c.name(p.key("name"), "member", &m.name);
                let ok = check_host_port(&m.address).map_err(|msg| c.err(p.key("address"), msg));
                let spec = shared_members::member_spec(
                    c, &p, &m.name, &m.address, m.weight, &m.group, &m.state,
                );
                (spec, p.key("name"), ok.is_ok(), p.key("address"))
            }
            RawMemberEntry::Shared(name) => match shared.get(name) {
                Some(spec) => (spec.clone(), p.clone(), true, p.clone()),
                None => {
                    c.err(p.clone(), shared_members::unknown(name, shared));
                    continue;
                }
            },
        };
        match names.get(spec.name.as_str()) {
            Some(first) if !spec.name.is_empty() => {
                c.err(
                    name_at,
                    format!(
                        "duplicate member name `{}`, first used by members[{first}]",
                        spec.name
                    ),
                );
            }
            _ => {
                names.insert(spec.name.clone(), i);
            }
        }
        if address_ok {
            let key = spec.address.to_ascii_lowercase();
            match addrs.get(&key) {
                Some(first) => c.err(
                    address_at,
                    format!(
                        "duplicate member address `{}`, first used by members[{first}]",
                        spec.address
                    ),
                ),
                None => {
                    addrs.insert(key, i);
                }
            }
        }
        out.push(spec);
    }
    out
}

pub(super) fn compile_hash(
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
                    if matches!(up, UpstreamProtocol::Tcp | UpstreamProtocol::Udp)
                        && k != HashKeySource::ClientAddress
                    {
                        let up = upstream_protocol_str(up);
                        c.err(path.key("key"), format!("a {up} cluster has no headers or cookies, it can only hash on `client-address`, not `{s}`"));
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

/// `outlier`: passive ejection.
fn outlier(c: &mut Compiler<'_>, path: &FieldPath, o: &RawOutlier) -> OutlierDetection {
    let p = path.key("outlier");
    let od = OutlierDetection::default();
    let base = c.ms(p.key("base_ejection_ms"), o.base_ejection_ms, od.base_ejection, false);
    let max = c.ms(p.key("max_ejection_ms"), o.max_ejection_ms, od.max_ejection, false);
    if max < base {
        let at = if o.max_ejection_ms.is_some() { "max_ejection_ms" } else { "base_ejection_ms" };
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

/// `slow_start`.
fn slow_start(c: &mut Compiler<'_>, path: &FieldPath, s: &RawSlowStart) -> SlowStart {
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

/// `agent`: how long an agent may stay silent.
fn agent_policy(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    agent: Option<&RawAgent>,
    agent_interval: Duration,
) -> AgentPolicy {
    // Silence allowed: `timeout_ms` if given, else `misses` (default 3) heartbeat intervals of
    // `[agent] interval_ms` (default 200 ms, so 600 ms, the core's default).
    let default_timeout = agent_interval * AgentSpec::DEFAULT_MISSES;
    match agent {
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
    }
}

/// `ewma`: the peak-EWMA estimator.
fn ewma(c: &mut Compiler<'_>, path: &FieldPath, e: &RawEwma) -> EwmaPolicy {
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

/// `session`: how a session is recognised.
fn session(c: &mut Compiler<'_>, path: &FieldPath, s: &RawSession) -> StickySession {
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
        idle_timeout: c.ms(p.key("idle_timeout_ms"), s.idle_timeout_ms, sd.idle_timeout, false),
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
            let paths = CertKeyPaths { cert: cert.clone(), key: key.clone(), ocsp: None };
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
