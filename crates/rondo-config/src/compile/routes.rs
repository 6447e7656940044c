//! `[[route]]`: matches, timeouts, backups, and whether the listener's protocol and the clusters'
//! upstream protocols fit together.

use super::*;

pub(super) fn compile_route(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    i: usize,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) -> Route {
    let name = match &r.name {
        Some(n) => {
            c.name(path.key("name"), "route", n);
            n.clone()
        }
        None => format!("route-{}", i + 1),
    };
    let unknown_cluster = |name: &str| unknown_cluster(name, clusters);
    // With `[naming] allow_registered_clusters` a cluster the file lacks is one a registration
    // may declare; until one does the route finds no member (503), and `rondo check` warns.
    let filters = super::traffic::compile_filters(c, &path.key("filters"), r.filters.as_deref());
    let split = super::split::compile_split(c, path, r, clusters, declared_ok);
    super::sampling::check_mirrors(c, path, r, clusters, declared_ok);
    if split.is_some() {
        // A weighted split names the route's clusters (checked there).
    } else if r.cluster.is_empty() {
        // Only a route whose filters answer every request may go without a cluster.
        if !filters.iter().any(|f| f.always_answers()) {
            c.err(
                path.key("cluster"),
                "a route needs a `cluster`, unless a filter answers every request \
                 (`redirect`, `respond`)",
            );
        }
    } else if !clusters.contains_key(&r.cluster) && !declared_ok {
        c.err(path.key("cluster"), unknown_cluster(&r.cluster));
    }
    let mut seen = BTreeSet::new();
    for (j, b) in r.backups.iter().enumerate() {
        let p = path.key("backups").index(j);
        if *b == r.cluster {
            c.err(p, format!("backup `{b}` is the route's primary cluster"));
        } else if !seen.insert(b.as_str()) {
            c.err(p, format!("backup `{b}` is listed twice"));
        } else if !clusters.contains_key(b) && !declared_ok {
            c.err(p, unknown_cluster(b));
        }
    }
    let matcher = compile_match(c, &path.key("match"), r.matcher.as_ref());
    let auth = r.auth.as_ref().and_then(|a| compile_auth(c, &path.key("auth"), a));
    let priority = match r.priority {
        None => 0,
        Some(p) => i32::try_from(p).unwrap_or_else(|_| {
            c.err(
                path.key("priority"),
                format!("must be between {} and {}, got {p}", i32::MIN, i32::MAX),
            );
            0
        }),
    };
    let multicast = compile_multicast(c, path, r, clusters, declared_ok);
    let multicast_max_body_bytes = c.int(
        path.key("multicast_max_body_bytes"),
        r.multicast_max_body_bytes,
        Route::DEFAULT_MULTICAST_MAX_BODY,
        1,
        u64::MAX,
    );
    let session_replay = r.session_replay.as_ref().map(|sr| {
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
    });
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
        let mut seen = BTreeSet::new();
        for (k, backup) in b.backups.iter().enumerate() {
            let bp = p.key("backups").index(k);
            if *backup == b.cluster {
                c.err(bp, format!("backup `{backup}` is the branch's own cluster"));
            } else if !seen.insert(backup.as_str()) {
                c.err(bp, format!("backup `{backup}` is listed twice"));
            } else if !clusters.contains_key(backup) && !declared_ok {
                c.err(bp, format!("unknown cluster `{backup}`"));
            }
        }
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

pub(super) fn compile_match(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    m: Option<&RawMatch>,
) -> RouteMatch {
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
    if let Some(p) = &m.path
        && (!p.starts_with('/') || p.contains('?'))
    {
        c.err(path.key("path"), format!("`{p}` must start with `/` and hold no query"));
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
    let mut filters: Vec<FilterRef> = Vec::new();
    let names = |c: &mut Compiler<'_>, key: &str, list: Option<&Vec<String>>| {
        let mut out: Vec<String> = Vec::new();
        for (j, name) in list.into_iter().flatten().enumerate() {
            let lower = name.to_ascii_lowercase();
            if !is_token(name) {
                c.err(path.key(key).index(j), format!("`{name}` is not a header name"));
            } else if out.contains(&lower) {
                c.err(path.key(key).index(j), format!("header `{lower}` is listed twice"));
            } else {
                out.push(lower);
            }
        }
        out
    };
    let headers_present = names(c, "headers_present", m.headers_present.as_ref());
    let headers_absent = names(c, "headers_absent", m.headers_absent.as_ref());
    for (j, name) in headers_absent.iter().enumerate() {
        if headers_present.contains(name) || headers.iter().any(|(n, _)| n == name) {
            c.err(
                path.key("headers_absent").index(j),
                format!("header `{name}` cannot be both required and absent: the route would never match"),
            );
        }
    }
    for (name, pattern) in m.headers_regex.iter().flatten() {
        let p = path.key("headers_regex").key(name);
        if !is_token(name) {
            c.err(p, format!("`{name}` is not a header name"));
            continue;
        }
        match crate::filter::HeaderRegex::new(name, pattern) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err(e) => c.err(p, e),
        }
    }
    if let Some(pattern) = &m.path_regex {
        match crate::filter::PathRegex::new(pattern) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err(e) => c.err(path.key("path_regex"), e),
        }
    }
    let mut query = Vec::new();
    for (name, value) in m.query.iter().flatten() {
        if name.is_empty() {
            c.err(path.key("query"), "query parameter names must not be empty");
        }
        query.push((name.clone(), value.clone()));
    }
    let mut reads_body = false;
    if let Some(fields) = &m.body_json {
        reads_body = true;
        if fields.is_empty() {
            c.err(path.key("body_json"), "must name at least one field (`\"$.a.b\" = \"value\"`)");
        }
        match crate::filter::BodyJson::new(fields.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err((field, e)) => c.err(path.key("body_json").key(&field), e),
        }
    }
    if let Some(x) = &m.body_xml {
        reads_body = true;
        let p = path.key("body_xml");
        let mut ns = Vec::new();
        for (prefix, uri) in x.ns.iter().flatten() {
            if prefix.is_empty() || prefix.contains(':') || uri.is_empty() {
                c.err(p.key("ns").key(prefix), "a prefix and a namespace URI, both non-empty");
            }
            ns.push((prefix.clone(), uri.clone()));
        }
        match crate::filter::BodyXml::new(&x.path, &ns, x.equals.as_deref()) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err(e) => c.err(p.key("path"), e),
        }
    }
    let max_peek_bytes = match m.max_peek_bytes {
        Some(_) if !reads_body => {
            c.err(
                path.key("max_peek_bytes"),
                "only body filters read the body: set `body_json` or `body_xml`, or drop it",
            );
            0
        }
        v if reads_body => {
            c.int(path.key("max_peek_bytes"), v, DEFAULT_MAX_PEEK_BYTES, 1, MAX_PEEK_BYTES)
        }
        _ => 0,
    };
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
    RouteMatch {
        host: m.host.clone(),
        path_prefix: m.path_prefix.clone(),
        path: m.path.clone(),
        methods,
        headers,
        headers_present,
        headers_absent,
        query,
        filters,
        max_peek_bytes,
        sni,
    }
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
    if proto == ListenerProtocol::Tcp && (r.multicast.is_some() || r.session_replay.is_some()) {
        let what = if r.multicast.is_some() { "multicast" } else { "session_replay" };
        c.err(
            path.key(what),
            format!(
                "route on tcp listener `{}` cannot have `{what}`: it copies or keeps HTTP requests",
                r.listener
            ),
        );
    }
    if proto == ListenerProtocol::Tcp && r.clusters.is_some() {
        c.err(
            path.key("clusters"),
            format!(
                "route on tcp listener `{}` cannot split its requests over weighted clusters: \
                 it has `cluster`",
                r.listener
            ),
        );
    }
    if proto == ListenerProtocol::Tcp && r.auth.is_some() {
        c.err(
            path.key("auth"),
            format!(
                "route on tcp listener `{}` cannot require a token: tcp has no HTTP request to carry one",
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
        if m.path.is_some() {
            conds.push("path");
        }
        if m.method.is_some() {
            conds.push("method");
        }
        if m.headers.is_some() {
            conds.push("headers");
        }
        for (set, name) in [
            (m.headers_present.is_some(), "headers_present"),
            (m.headers_absent.is_some(), "headers_absent"),
            (m.headers_regex.is_some(), "headers_regex"),
            (m.path_regex.is_some(), "path_regex"),
            (m.query.is_some(), "query"),
            (m.body_json.is_some(), "body_json"),
            (m.body_xml.is_some(), "body_xml"),
        ] {
            if set {
                conds.push(name);
            }
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
