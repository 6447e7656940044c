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
    // With `[naming] allow_registered_clusters` a cluster the file lacks is one a registration
    // may declare; until one does the route finds no member (503), and `rondo check` warns.
    if !clusters.contains_key(&r.cluster) && !declared_ok {
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
        auth,
        login: r.login.as_ref().map(|l| RouteLogin {
            ttl: c.ms(path.key("login").key("ttl_ms"), l.ttl_ms, RouteLogin::DEFAULT_TTL, false),
        }),
    }
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
