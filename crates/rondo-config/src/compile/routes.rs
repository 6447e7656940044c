//! One `[[route]]`: its clusters and backups, timeouts, auth, multicast and session replay, and
//! whether the listener's protocol and the clusters' upstream protocols fit together.

use super::route_match::compile_match;
use super::*;
use crate::raw::RawSessionReplay;

pub(super) fn compile_route(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    i: usize,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) -> Route {
    let name = route_name(c, path, i, r);
    // With `[naming] allow_registered_clusters` a cluster the file lacks is one a registration
    // may declare; until one does the route finds no member (503), and `rondo check` warns.
    let filters = super::traffic::compile_filters(c, &path.key("filters"), r.filters.as_deref());
    let split = super::split::compile_split(c, path, r, clusters, declared_ok);
    super::sampling::check_mirrors(c, path, r, clusters, declared_ok);
    if split.is_none() {
        // A weighted split names the route's clusters (checked there).
        check_primary(c, path, r, &filters, clusters, declared_ok);
    }
    check_backups(c, path, r, clusters, declared_ok);
    let matcher = compile_match(c, &path.key("match"), r.matcher.as_ref());
    let auth = r.auth.as_ref().and_then(|a| compile_auth(c, &path.key("auth"), a));
    let priority = compile_priority(c, path, r.priority);
    let multicast = compile_multicast(c, path, r, clusters, declared_ok);
    let multicast_max_body_bytes = c.int(
        path.key("multicast_max_body_bytes"),
        r.multicast_max_body_bytes,
        Route::DEFAULT_MULTICAST_MAX_BODY,
        1,
        u64::MAX,
    );
    let session_replay =
        r.session_replay.as_ref().map(|sr| compile_session_replay(c, path, r, sr, clusters));
    let (cluster, split) = split.unwrap_or_else(|| (r.cluster.clone(), Vec::new()));
    Route {
        name,
        listener: r.listener.clone(),
        matcher,
        cluster,
        split,
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
        auth,
        login: r.login.as_ref().map(|l| RouteLogin {
            ttl: c.ms(path.key("login").key("ttl_ms"), l.ttl_ms, RouteLogin::DEFAULT_TTL, false),
        }),
        priority,
        position: i,
        multicast,
        multicast_max_body_bytes,
        session_replay,
        filters,
        compiled: Default::default(),
    }
}

/// The route's `name`, or `route-N` after its place in the file.
fn route_name(c: &mut Compiler<'_>, path: &FieldPath, i: usize, r: &RawRoute) -> String {
    match &r.name {
        Some(n) => {
            c.name(path.key("name"), "route", n);
            n.clone()
        }
        None => format!("route-{}", i + 1),
    }
}

/// The route's `cluster` is known; only a route whose filters answer every request may go
/// without one.
fn check_primary(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    filters: &[rondo_core::traffic::TrafficFilter],
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) {
    if r.cluster.is_empty() {
        if !filters.iter().any(|f| f.always_answers()) {
            c.err(
                path.key("cluster"),
                "a route needs a `cluster`, unless a filter answers every request \
                 (`redirect`, `respond`)",
            );
        }
    } else if !clusters.contains_key(&r.cluster) && !declared_ok {
        c.err(path.key("cluster"), unknown_cluster(&r.cluster, clusters));
    }
}

/// The route's `backups`: known clusters, none the primary, none listed twice.
fn check_backups(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) {
    let known = |b: &str| {
        if clusters.contains_key(b) || declared_ok {
            Ok(())
        } else {
            Err(unknown_cluster(b, clusters))
        }
    };
    check_backup_list(
        c,
        &path.key("backups"),
        &r.backups,
        (&r.cluster, "the route's primary cluster"),
        known,
    );
}

/// A list of backups at `path` (a route's or a multicast branch's): none is the owner's own
/// cluster (`own`: its name and what it is to the owner), none listed twice, each `known` (else
/// the error it returns).
fn check_backup_list(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    backups: &[String],
    (own, own_is): (&str, &str),
    known: impl Fn(&str) -> Result<(), String>,
) {
    let mut seen = BTreeSet::new();
    for (j, b) in backups.iter().enumerate() {
        let p = path.index(j);
        if *b == own {
            c.err(p, format!("backup `{b}` is {own_is}"));
        } else if !seen.insert(b.as_str()) {
            c.err(p, format!("backup `{b}` is listed twice"));
        } else if let Err(message) = known(b) {
            c.err(p, message);
        }
    }
}

/// `priority`: an `i32`, 0 by default.
fn compile_priority(c: &mut Compiler<'_>, path: &FieldPath, v: Option<i64>) -> i32 {
    match v {
        None => 0,
        Some(p) => i32::try_from(p).unwrap_or_else(|_| {
            c.err(
                path.key("priority"),
                format!("must be between {} and {}, got {p}", i32::MIN, i32::MAX),
            );
            0
        }),
    }
}

/// `session_replay`: its bounds, on a route whose cluster keeps sticky sessions.
fn compile_session_replay(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    sr: &RawSessionReplay,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
) -> SessionReplay {
    let p = path.key("session_replay");
    if let Some(cluster) = clusters.get(&r.cluster)
        && cluster.policy.granularity != Granularity::Session
    {
        c.err(
            p.clone(),
            format!(
                "session_replay keeps the requests of sticky sessions, but cluster `{}` has \
                 granularity `{}` (it needs `session`, with a session cookie or header)",
                r.cluster,
                cluster.policy.granularity.as_str()
            ),
        );
    }
    SessionReplay {
        max_messages: c.u32(
            p.key("max_messages"),
            sr.max_messages,
            SessionReplay::DEFAULT_MAX_MESSAGES,
            1,
        ),
        max_bytes: c.int(
            p.key("max_bytes"),
            sr.max_bytes,
            SessionReplay::DEFAULT_MAX_BYTES,
            1,
            u64::MAX,
        ),
        max_total_bytes: c.int(
            p.key("max_total_bytes"),
            sr.max_total_bytes,
            SessionReplay::DEFAULT_MAX_TOTAL_BYTES,
            1,
            u64::MAX,
        ),
    }
}

/// A route's `multicast` branches: known clusters, none the route's own primary or backups,
/// none listed twice, their backups checked as a route's are.
fn compile_multicast(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) -> Vec<Branch> {
    let mut out: Vec<Branch> = Vec::new();
    for (j, b) in r.multicast.iter().flatten().enumerate() {
        let p = path.key("multicast").index(j);
        let in_split = r.clusters.iter().flatten().any(|w| w.cluster == b.cluster);
        if b.cluster == r.cluster || r.backups.contains(&b.cluster) || in_split {
            c.err(
                p.key("cluster"),
                format!(
                    "cluster `{}` already serves the route (its cluster, split or a backup): a \
                     multicast branch is another cluster that gets a copy",
                    b.cluster
                ),
            );
        } else if out.iter().any(|o| o.cluster == b.cluster) {
            c.err(p.key("cluster"), format!("branch `{}` is listed twice", b.cluster));
        } else if !clusters.contains_key(&b.cluster) && !declared_ok {
            c.err(p.key("cluster"), format!("unknown cluster `{}`", b.cluster));
        }
        let known = |b: &str| {
            if clusters.contains_key(b) || declared_ok {
                Ok(())
            } else {
                Err(format!("unknown cluster `{b}`"))
            }
        };
        let own = (b.cluster.as_str(), "the branch's own cluster");
        check_backup_list(c, &p.key("backups"), &b.backups, own, known);
        let queue = c.u32(p.key("queue"), b.queue, Branch::DEFAULT_QUEUE, 1);
        out.push(Branch { cluster: b.cluster.clone(), backups: b.backups.clone(), queue });
    }
    out
}

/// A route's `auth`: issuer and audience non-empty, the keys file's path resolved, claim names
/// that can be header names.
fn compile_auth(c: &mut Compiler<'_>, path: &FieldPath, a: &RawAuth) -> Option<Arc<RouteAuth>> {
    if a.issuer.is_empty() {
        c.err(path.key("issuer"), "issuer must not be empty");
    }
    if a.audience.is_empty() {
        c.err(path.key("audience"), "audience must not be empty");
    }
    let keys = c.file_path(path.key("keys"), &a.keys)?;
    // Read now, so that `rondo check`, a start and a reload refuse a file with no usable key.
    if let Err(e) = crate::jwks::load(&keys) {
        c.err(path.key("keys"), e);
    }
    let require: Vec<(String, String)> =
        a.require.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (k, _) in &require {
        if k.is_empty() {
            c.err(path.key("require"), "claim names must not be empty");
        }
    }
    let mut claims = Vec::new();
    // Claims are looked up by their own (case-sensitive) names; two that would give the same
    // lower-case header are refused.
    for (j, name) in a.claims.iter().flatten().enumerate() {
        if !is_token(name) {
            c.err(path.key("claims").index(j), format!("`{name}` cannot name a header"));
        } else if claims.iter().any(|c: &String| c.eq_ignore_ascii_case(name)) {
            let lower = name.to_ascii_lowercase();
            c.err(path.key("claims").index(j), format!("claim `{lower}` is listed twice"));
        } else {
            claims.push(name.clone());
        }
    }
    Some(Arc::new(RouteAuth {
        issuer: a.issuer.clone(),
        audience: a.audience.clone(),
        keys,
        require,
        claims,
    }))
}

/// What a route may do given its listener's protocol.
pub(super) fn check_route_protocol(
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
    if proto == ListenerProtocol::Tcp {
        check_tcp_route(c, path, r);
    }
    check_upstream_protocols(c, path, r, route, proto, clusters);
}

/// A route on a `tcp` listener has none of the fields that need an HTTP request.
fn check_tcp_route(c: &mut Compiler<'_>, path: &FieldPath, r: &RawRoute) {
    if r.multicast.is_some() || r.session_replay.is_some() {
        let what = if r.multicast.is_some() { "multicast" } else { "session_replay" };
        c.err(
            path.key(what),
            format!(
                "route on tcp listener `{}` cannot have `{what}`: it copies or keeps HTTP requests",
                r.listener
            ),
        );
    }
    if r.clusters.is_some() {
        c.err(
            path.key("clusters"),
            format!(
                "route on tcp listener `{}` cannot split its requests over weighted clusters: \
                 it has `cluster`",
                r.listener
            ),
        );
    }
    if r.auth.is_some() {
        c.err(
            path.key("auth"),
            format!(
                "route on tcp listener `{}` cannot require a token: tcp has no HTTP request to carry one",
                r.listener
            ),
        );
    }
    if let Some(m) = &r.matcher {
        let conds = super::route_match::http_conditions(m);
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
}

/// Every cluster the route may send to (primary or split, backups, multicast branches and their
/// backups) speaks an upstream protocol its listener can forward to.
fn check_upstream_protocols(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    route: &Route,
    proto: ListenerProtocol,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
) {
    let branches = route.multicast.iter().enumerate().flat_map(|(j, b)| {
        let p = path.key("multicast").index(j);
        std::iter::once((p.key("cluster"), &b.cluster))
            .chain(b.backups.iter().enumerate().map(move |(k, x)| (p.key("backups").index(k), x)))
    });
    let targets = std::iter::once((path.key("cluster"), &route.cluster))
        .filter(|_| route.split.is_empty())
        .chain(super::split::targets(path, route))
        .chain(route.backups.iter().enumerate().map(|(j, b)| (path.key("backups").index(j), b)))
        .chain(branches);
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
            ListenerProtocol::Http if matches!(up, UpstreamProtocol::Tcp | UpstreamProtocol::Udp) => c.err(
                p,
                format!(
                    "http listener `{}` cannot route to cluster `{name}` with upstream_protocol `{}`, it needs `http1` or `http2`",
                    r.listener,
                    upstream_protocol_str(up)
                ),
            ),
            _ => {}
        }
    }
}
