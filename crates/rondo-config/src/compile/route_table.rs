//! The `[[route]]` list as a whole: each route compiled, its name unique, its listener known, and
//! each checked against its listener's protocol (a `tcp` listener takes one catch-all route).

use super::*;

/// Every `[[route]]` in file order (`declared_ok`: `[naming] allow_registered_clusters`, so a
/// cluster the file lacks may come from a registration).
pub(super) fn compile_routes(
    c: &mut Compiler<'_>,
    raw: &RawConfig,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    router: &RouterSpec,
    declared_ok: bool,
) -> Vec<Route> {
    let protocols = listener_protocols(raw);
    let known_listeners: BTreeSet<&str> = raw.listener.iter().map(|l| l.name.as_str()).collect();
    let mut routes = Vec::with_capacity(raw.route.len());
    let mut route_names: HashMap<String, usize> = HashMap::new();
    let mut tcp_routes: HashMap<&str, String> = HashMap::new();
    let mut udp_routes: HashMap<&str, String> = HashMap::new();
    for (i, r) in raw.route.iter().enumerate() {
        let path = FieldPath::root().key("route").index(i);
        let route = compile_route(c, &path, i, r, clusters, declared_ok);
        if r.login.is_some() && router.tier_key.is_none() {
            c.err(
                path.key("login"),
                "a login route needs [router] tier_key or tier_key_file: its session tokens are \
                 signed with it",
            );
        }
        check_unique_name(c, &path, i, r, &route, &mut route_names);
        if !known_listeners.contains(r.listener.as_str()) {
            c.err(path.key("listener"), unknown_listener(&r.listener, &known_listeners));
        } else if let Some(&proto) = protocols.get(r.listener.as_str()) {
            if proto == ListenerProtocol::Queue {
                check_queue_route(c, &path, r, &route, clusters);
            } else if proto == ListenerProtocol::Udp {
                udp::check_route(c, &path, r, &route, clusters, &mut udp_routes);
            } else {
                check_route_protocol(c, &path, r, &route, proto, clusters);
            }
            if proto == ListenerProtocol::Tcp && route.matcher.sni.is_none() {
                check_one_tcp_catch_all(c, &path, r, &route, &mut tcp_routes);
            }
        }
        routes.push(route);
    }
    routes
}

/// Each listener name's protocol (the first listener of a name; duplicates are errors).
fn listener_protocols(raw: &RawConfig) -> HashMap<&str, ListenerProtocol> {
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
    protocols
}

/// Route `i`'s name is not one an earlier route has (`names`: each name's first route).
fn check_unique_name(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    i: usize,
    r: &RawRoute,
    route: &Route,
    names: &mut HashMap<String, usize>,
) {
    match names.get(&route.name) {
        Some(first) => {
            let p = if r.name.is_some() { path.key("name") } else { path.clone() };
            c.err(p, format!("route name `{}` already used by route[{first}]", route.name));
        }
        None => {
            names.insert(route.name.clone(), i);
        }
    }
}

/// The error of a listener name the file does not define.
fn unknown_listener(name: &str, known: &BTreeSet<&str>) -> String {
    format!(
        "unknown listener `{name}`, expected {}",
        if known.is_empty() {
            "a [[listener]] to be defined".to_owned()
        } else {
            format!("one of {}", one_of(known.iter().copied()))
        }
    )
}

/// A tcp listener takes one route without `sni` (its catch-all), and any number with `sni`,
/// tried in file order (`catch_alls`: each tcp listener's catch-all route so far).
fn check_one_tcp_catch_all<'r>(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &'r RawRoute,
    route: &Route,
    catch_alls: &mut HashMap<&'r str, String>,
) {
    match catch_alls.get(r.listener.as_str()) {
        Some(first) => c.err(
            path.key("listener"),
            format!(
                "tcp listener `{}` already has route `{first}` without `match.sni`; a tcp listener takes one route without `sni` (more routes need `match = {{ sni = ... }}`)",
                r.listener
            ),
        ),
        None => {
            catch_alls.insert(&r.listener, route.name.clone());
        }
    }
}
