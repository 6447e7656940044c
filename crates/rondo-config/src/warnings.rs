//! What a valid configuration may still get wrong, and what this build cannot serve: the
//! warnings (`[admin]` without a token, agent-fed algorithms without `[agent]`, routes an
//! earlier route on the same listener always answers first, clusters nothing sends requests to)
//! and the feature errors (`dns_listen` without the `dns` cargo feature, `registry = "etcd"`
//! without `etcd`). Both are [`Problem`]s with field paths, turned into file:line:column
//! diagnostics by the caller like every other error, so `rondo check`, `rondo serve` at start
//! and a reload report the same thing.

use std::collections::BTreeSet;

use rondo_core::{Algorithm, RouteMatch};

use crate::Config;
use crate::compile::Problem;
use crate::path::FieldPath;
use crate::raw::RawConfig;

/// The optional parts of rondo a build has (its cargo features). A configuration that needs a
/// part the build lacks is an error naming the feature, reported by `rondo check` and by
/// `rondo serve` before it binds anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// DNS answers from the naming service (`[naming] dns_listen`): cargo feature `dns`.
    pub dns: bool,
    /// The etcd registry (`[naming] registry = "etcd"`): cargo feature `etcd`.
    pub etcd: bool,
    /// Queues in NATS JetStream (`[[queue]] backend = "nats"`): cargo feature `nats`.
    pub nats: bool,
    /// The naming service's xDS server (`[naming] xds`): cargo feature `xds`.
    pub xds: bool,
    /// Spans exported over OTLP/HTTP (`[tracing]`): cargo feature `otel`.
    pub otel: bool,
}

impl Features {
    /// Every optional part: what [`crate::parse_str`] and [`crate::load_file`] accept.
    pub const ALL: Features = Features { dns: true, etcd: true, nats: true, xds: true, otel: true };
    /// None of them.
    pub const NONE: Features =
        Features { dns: false, etcd: false, nats: false, xds: false, otel: false };

    /// The enabled features' cargo names, in alphabetical order (`["dns", "etcd"]`).
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.dns {
            v.push("dns");
        }
        if self.etcd {
            v.push("etcd");
        }
        if self.nats {
            v.push("nats");
        }
        if self.otel {
            v.push("otel");
        }
        if self.xds {
            v.push("xds");
        }
        v
    }
}

/// The settings in `raw` that need a feature `features` lacks, each naming the cargo feature.
pub(crate) fn unsupported(raw: &RawConfig, features: Features) -> Vec<Problem> {
    let mut out = Vec::new();
    let naming = FieldPath::root().key("naming");
    let lacks = |what: &str, feature: &str| {
        format!(
            "{what} needs the `{feature}` cargo feature, which this rondo was built without \
             (cargo build --release --features {feature})"
        )
    };
    if !features.nats && raw.tier.is_some() {
        out.push(Problem {
            path: FieldPath::root().key("tier").key("nats"),
            message: lacks("the tier's load view over NATS", "nats"),
        });
    }
    if !features.nats {
        for (i, q) in raw.queue.iter().enumerate() {
            if q.backend.as_deref() == Some("nats") {
                out.push(Problem {
                    path: FieldPath::root().key("queue").index(i).key("backend"),
                    message: lacks("a NATS JetStream queue", "nats"),
                });
            }
        }
    }
    if !features.otel && raw.tracing.is_some() {
        out.push(Problem {
            path: FieldPath::root().key("tracing"),
            message: lacks("tracing (OTLP export)", "otel"),
        });
    }
    let Some(n) = &raw.naming else { return out };
    if !features.dns && n.dns_listen.is_some() {
        out.push(Problem { path: naming.key("dns_listen"), message: lacks("DNS", "dns") });
    }
    if !features.xds && n.xds.is_some() {
        out.push(Problem { path: naming.key("xds"), message: lacks("the xDS server", "xds") });
    }
    if !features.etcd && n.registry.as_deref() == Some("etcd") {
        out.push(Problem {
            path: naming.key("registry"),
            message: lacks("the etcd registry", "etcd"),
        });
    }
    out
}

/// What is valid but probably not what was meant, in `config` (compiled from the same file:
/// the view's routes are in evaluation order, each knowing its place in the file).
pub(crate) fn warnings(config: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    admin_without_token(config, &mut out);
    agent_algorithms_without_agent(config, &mut out);
    tls_names(config, &mut out);
    redirect_loops(config, &mut out);
    lonely_tier_limits(config, &mut out);
    shadowed_routes(config, &mut out);
    undeclared_clusters(config, &mut out);
    // With a naming service, clients and DNS look clusters up by name: no route is needed.
    if config.naming.is_none() {
        unused_clusters(config, &mut out);
    }
    out
}

/// An `[admin]` without a token refuses every call.
fn admin_without_token(config: &Config, out: &mut Vec<Problem>) {
    if let Some(admin) = &config.admin
        && admin.token.is_none()
    {
        out.push(Problem {
            path: FieldPath::root().key("admin"),
            message: format!(
                "no `token` or `token_file`: the admin API on {} refuses every call with 403 \
                 (`rondo ctl`, the dashboard's data and `/metrics` do not work)",
                admin.listen
            ),
        });
    }
}

/// A cluster whose algorithm ranks by agent reports, with no `[agent]` to receive them.
fn agent_algorithms_without_agent(config: &Config, out: &mut Vec<Problem>) {
    if config.agent.is_some() {
        return;
    }
    for (name, cluster) in &config.view.clusters {
        let algorithm = cluster.policy.algorithm;
        if matches!(algorithm, Algorithm::LeastCpu | Algorithm::MostFreeMemory) {
            out.push(Problem {
                path: FieldPath::root().key("cluster").key(name).key("algorithm"),
                message: format!(
                    "`{algorithm}` ranks members by load-agent reports, but there is no [agent] \
                     table to receive them: every pick falls back to least-sessions"
                ),
            });
        }
    }
}

/// A route that an earlier route on its listener (by priority, then file order) always takes
/// first.
fn shadowed_routes(config: &Config, out: &mut Vec<Problem>) {
    let routes = &config.view.routes;
    for (i, route) in routes.iter().enumerate() {
        // Under `routing = "all-matches"` a later route still gets its copy.
        let all_matches = config
            .listeners
            .iter()
            .any(|l| l.name == route.listener && l.routing == crate::Routing::AllMatches);
        let earlier = routes[..i]
            .iter()
            // A tcp listener tries its `sni` routes first and its route without `sni` last.
            .find(|r| {
                !all_matches
                    && r.listener == route.listener
                    && (route.matcher.sni.is_none() || r.matcher.sni.is_some())
                    && covers(&r.matcher, &route.matcher)
            });
        if let Some(first) = earlier {
            let what = if is_catch_all(&first.matcher) {
                "matches every request".to_owned()
            } else {
                "matches every request this one matches".to_owned()
            };
            let before = if first.priority > route.priority {
                format!("(route[{}], priority {}) above it", first.position, first.priority)
            } else {
                format!("(route[{}]) before it", first.position)
            };
            out.push(Problem {
                path: FieldPath::root().key("route").index(route.position),
                message: format!(
                    "route `{}` is never used: route `{}` {before} on listener `{}` {what}",
                    route.name, first.name, route.listener
                ),
            });
        }
    }
}

/// A route to a cluster the file lacks (only valid with `allow_registered_clusters`).
fn undeclared_clusters(config: &Config, out: &mut Vec<Problem>) {
    let root = FieldPath::root();
    for route in &config.view.routes {
        let i = route.position;
        let split = route.split.iter().enumerate().map(|(j, w)| {
            (root.key("route").index(i).key("clusters").index(j).key("cluster"), &w.cluster)
        });
        let targets = std::iter::once((root.key("route").index(i).key("cluster"), &route.cluster))
            .filter(|_| route.split.is_empty())
            .chain(split)
            .chain(
                route
                    .backups
                    .iter()
                    .enumerate()
                    .map(|(j, b)| (root.key("route").index(i).key("backups").index(j), b)),
            );
        for (path, name) in targets {
            // An empty name: a route whose filters answer every request has no cluster.
            if !name.is_empty() && !config.view.clusters.contains_key(name) {
                out.push(Problem {
                    path,
                    message: format!(
                        "cluster `{name}` is not in the file: it is declared by its members' \
                         registrations, and until one registers the route finds no member (503)"
                    ),
                });
            }
        }
    }
}

/// A cluster no route, backup, multicast branch or mirror sends requests to.
fn unused_clusters(config: &Config, out: &mut Vec<Problem>) {
    let used: BTreeSet<&str> = config
        .view
        .routes
        .iter()
        .flat_map(|r| {
            std::iter::once(&r.cluster)
                .chain(r.split.iter().map(|w| &w.cluster))
                .chain(&r.backups)
                .chain(
                    r.multicast.iter().flat_map(|b| std::iter::once(&b.cluster).chain(&b.backups)),
                )
                .chain(r.filters.iter().filter_map(|f| match f {
                    rondo_core::traffic::TrafficFilter::Mirror(m) => Some(&m.cluster),
                    _ => None,
                }))
        })
        .map(String::as_str)
        .collect();
    for name in config.view.clusters.keys() {
        if !used.contains(name.as_str()) {
            out.push(Problem {
                path: FieldPath::root().key("cluster").key(name),
                message: format!(
                    "no route or backup refers to cluster `{name}` and there is no [naming] \
                     to look it up: nothing sends it requests"
                ),
            });
        }
    }
}

/// Routes whose `match.host` no certificate of their TLS listener covers: such clients get the
/// default certificate, which their TLS client refuses for the name. Certificates that fail to
/// load are errors already, and are skipped here.
fn tls_names(config: &Config, out: &mut Vec<Problem>) {
    let root = FieldPath::root();
    let services = [
        ("admin", config.admin.as_ref().and_then(|a| a.tls.as_ref())),
        ("naming", config.naming.as_ref().and_then(|n| n.tls.as_ref())),
        ("agent", config.agent.as_ref().and_then(|a| a.tls.as_ref())),
    ];
    for (table, tls) in services {
        if let Some(tls) = tls
            && tls.client_ca.is_some()
            && tls.client_auth == crate::tls::ClientAuth::None
        {
            out.push(Problem {
                path: root.key(table).key("tls").key("client_ca"),
                message: "`client_ca` without `client_auth = \"optional\"` or `\"required\"`: \
                          no client certificate is asked for"
                    .to_owned(),
            });
        }
    }
    for (i, l) in config.listeners.iter().enumerate() {
        let Some(tls) = &l.tls else { continue };
        if tls.client_ca.is_some() && tls.client_auth == crate::tls::ClientAuth::None {
            out.push(Problem {
                path: root.key("listener").index(i).key("tls").key("client_ca"),
                message: "`client_ca` without `client_auth = \"optional\"` or `\"required\"`: \
                          no client certificate is asked for"
                    .to_owned(),
            });
        }
        let names: Vec<String> = tls
            .certs
            .iter()
            .filter_map(|ck| crate::tls::load_cert_key(ck).ok())
            .flat_map(|c| c.names)
            .collect();
        for (i, route) in config.view.routes.iter().enumerate() {
            let Some(host) = route.matcher.host.as_deref() else { continue };
            if route.listener != l.name {
                continue;
            }
            // A `*.x` route host is served by a `*.x` certificate name.
            let covered = names
                .iter()
                .any(|n| crate::tls::name_matches(n, host) || n.eq_ignore_ascii_case(host));
            if !covered {
                out.push(Problem {
                    path: root.key("route").index(i).key("match").key("host"),
                    message: format!(
                        "no certificate of tls listener `{}` is for `{host}` (its names: {}): \
                         clients asking for `{host}` get the default certificate and refuse it",
                        l.name,
                        if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                    ),
                });
            }
        }
    }
}

/// Whether `m` matches every request.
/// Redirects that send a client back to a request the same route matches again: a redirect
/// that changes nothing, or only to the listener's own scheme, or to a path its route matches,
/// on the same host and port.
fn redirect_loops(config: &Config, out: &mut Vec<Problem>) {
    use rondo_core::traffic::TrafficFilter;
    let root = FieldPath::root();
    for (i, route) in config.view.routes.iter().enumerate() {
        let Some((k, listener)) =
            config.listeners.iter().enumerate().find(|(_, l)| l.name == route.listener)
        else {
            continue;
        };
        let own = if listener.tls.is_some() { "https" } else { "http" };
        let filters = listener.filters.iter().map(|f| (true, f));
        for (j, (on_listener, f)) in
            filters.chain(route.filters.iter().map(|f| (false, f))).enumerate()
        {
            let TrafficFilter::Redirect(r) = f else { continue };
            let same_origin = r.scheme.as_deref().is_none_or(|s| s == own)
                && r.host.is_none()
                && r.port.is_none_or(|p| p == listener.listen.port());
            let same_path = match &r.path {
                None => true,
                Some(p) => route.matcher.path.as_deref().map_or_else(
                    || route.matcher.path_prefix.as_deref().is_none_or(|pre| p.starts_with(pre)),
                    |exact| exact == p,
                ),
            };
            if same_origin && same_path {
                let path = if on_listener {
                    root.key("listener").index(k).key("filters").index(j)
                } else {
                    root.key("route").index(i).key("filters").index(j - listener.filters.len())
                };
                out.push(Problem {
                    path,
                    message: "this redirect sends the client back to a request the same route \
                              matches (same scheme, host, port and a path it matches): a loop"
                        .to_owned(),
                });
            }
        }
    }
}

/// `rate_limit`s with `scope = "tier"` on a router that has no etcd registry: it cannot see the
/// tier's other routers, so it takes the whole rate.
fn lonely_tier_limits(config: &Config, out: &mut Vec<Problem>) {
    use rondo_core::traffic::TrafficFilter;
    let etcd = config
        .naming
        .as_ref()
        .is_some_and(|n| matches!(n.registry, crate::RegistrySpec::Etcd { .. }));
    if etcd {
        return;
    }
    let root = FieldPath::root();
    for (i, route) in config.view.routes.iter().enumerate() {
        for (j, f) in route.filters.iter().enumerate() {
            if let TrafficFilter::RateLimit(r) = f
                && r.tier
            {
                out.push(Problem {
                    path: root.key("route").index(i).key("filters").index(j).key("rate_limit"),
                    message: "`scope = \"tier\"` shares the rate among the routers present in \
                              the etcd registry, but this router has none ([naming] registry = \
                              \"etcd\"): it counts itself alone and takes the whole rate"
                        .to_owned(),
                });
            }
        }
    }
}

fn is_catch_all(m: &RouteMatch) -> bool {
    m.host.is_none()
        && m.sni.is_none()
        && m.path_prefix.as_deref().is_none_or(str::is_empty)
        && m.path.is_none()
        && m.methods.is_empty()
        && m.headers.is_empty()
        && m.headers_present.is_empty()
        && m.headers_absent.is_empty()
        && m.query.is_empty()
        && m.filters.is_empty()
}

/// Whether `a` matches every request `b` matches (each of `a`'s conditions is implied by
/// `b`'s; see `RouteMatch::matches`). Sound, not complete: `false` may still overlap.
fn covers(a: &RouteMatch, b: &RouteMatch) -> bool {
    let host = match (&a.host, &b.host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => {
            a.eq_ignore_ascii_case(b)
                || a.strip_prefix("*.").is_some_and(|suffix| {
                    // `b` (a name or a `*.` pattern) only matches hosts ending in `.suffix`.
                    let tail = format!(".{suffix}");
                    b.len() > tail.len()
                        && b.is_char_boundary(b.len() - tail.len())
                        && b[b.len() - tail.len()..].eq_ignore_ascii_case(&tail)
                })
        }
    };
    // `b`'s paths: exactly one (`path`), or those under a prefix.
    let path = match (&a.path_prefix, b.path.as_ref().or(b.path_prefix.as_ref())) {
        (None, _) => true,
        (Some(a), None) => a.is_empty(),
        (Some(a), Some(b)) => b.starts_with(a.as_str()),
    } && match (&a.path, &b.path) {
        (None, _) => true,
        (Some(a), Some(b)) => a == b,
        (Some(_), None) => false,
    };
    let methods = a.methods.is_empty()
        || (!b.methods.is_empty() && b.methods.iter().all(|m| a.methods.contains(m)));
    let headers = a.headers.iter().all(|h| b.headers.contains(h))
        && a.headers_present
            .iter()
            .all(|h| b.headers_present.contains(h) || b.headers.iter().any(|(n, _)| n == h))
        && a.headers_absent.iter().all(|h| b.headers_absent.contains(h))
        && a.query.iter().all(|q| b.query.contains(q))
        && a.filters.iter().all(|f| b.filters.contains(f));
    let sni = match (&a.sni, &b.sni) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => {
            a == b
                || a.strip_prefix("*.").is_some_and(|suffix| {
                    b.strip_prefix("*.").is_none()
                        && b.split_once('.').is_some_and(|(_, r)| r == suffix)
                })
        }
    };
    host && path && methods && headers && sni
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(host: Option<&str>, path: Option<&str>, methods: &[&str]) -> RouteMatch {
        RouteMatch {
            host: host.map(str::to_owned),
            path_prefix: path.map(str::to_owned),
            methods: methods.iter().map(|s| s.to_string()).collect(),
            ..RouteMatch::default()
        }
    }

    #[test]
    fn covers_is_implication_of_every_condition() {
        let all = m(None, None, &[]);
        assert!(is_catch_all(&all));
        assert!(covers(&all, &m(Some("a.com"), Some("/x"), &["GET"])));
        assert!(covers(&m(None, Some("/a"), &[]), &m(None, Some("/ab"), &[])));
        assert!(!covers(&m(None, Some("/ab"), &[]), &m(None, Some("/a"), &[])));
        assert!(!covers(&m(None, Some("/a"), &[]), &all));
        assert!(covers(&m(Some("*.x.com"), None, &[]), &m(Some("a.X.com"), None, &[])));
        assert!(covers(&m(Some("*.x.com"), None, &[]), &m(Some("*.y.x.com"), None, &[])));
        assert!(!covers(&m(Some("*.x.com"), None, &[]), &m(Some("x.com"), None, &[])));
        assert!(!covers(&m(Some("*.x.com"), None, &[]), &m(Some("ax.com"), None, &[])));
        assert!(covers(&m(None, None, &["GET", "PUT"]), &m(None, None, &["GET"])));
        assert!(!covers(&m(None, None, &["GET"]), &m(None, None, &["GET", "PUT"])));
        assert!(!covers(&m(None, None, &["GET"]), &all));
        let mut h = all.clone();
        h.headers.push(("x-a".into(), "1".into()));
        assert!(!covers(&h, &all));
        assert!(covers(&all, &h));
        assert!(covers(&h, &h));
    }
}
