//! The process-wide tables: `[router]`, `[log]`, `[agent]`, `[admin]` (and the tokens it shares with
//! `[naming]`, which has its own module). `[admin]`, `[naming]` and `[agent]` each take a `tls`
//! table, checked like a listener's. Also a cluster's `xds`, which only the naming service's xDS
//! server reads.

use rondo_core::{XdsLb, XdsPolicy};

use super::*;
use crate::raw::{RawClusterXds, RawRouter};

/// `[router]`: its group, the tier key, the upgrade socket, the drain timeout.
pub(super) fn compile_router(c: &mut Compiler<'_>, r: &RawRouter) -> RouterSpec {
    let p = FieldPath::root().key("router");
    if let Some(g) = &r.group
        && g.is_empty()
    {
        c.err(p.key("group"), "group must not be empty");
    }
    let tier_key = match (&r.tier_key, &r.tier_key_file) {
        (Some(_), Some(_)) => {
            c.err(p.key("tier_key_file"), "set `tier_key` or `tier_key_file`, not both");
            None
        }
        (Some(k), None) if k.len() < 16 => {
            c.err(p.key("tier_key"), "tier_key must be at least 16 bytes");
            None
        }
        (Some(k), None) => Some(AdminToken::Inline(k.clone())),
        (None, Some(f)) => c.file_path(p.key("tier_key_file"), f).map(AdminToken::File),
        (None, None) => None,
    };
    let upgrade_socket =
        r.upgrade_socket.as_ref().and_then(|f| c.file_path(p.key("upgrade_socket"), f));
    let drain_timeout = match r.drain_timeout_ms {
        None => crate::spec::DEFAULT_DRAIN_TIMEOUT,
        Some(ms) if ms <= 3_600_000 => Duration::from_millis(ms),
        Some(_) => {
            c.err(p.key("drain_timeout_ms"), "drain_timeout_ms must be 0 to 3600000");
            crate::spec::DEFAULT_DRAIN_TIMEOUT
        }
    };
    let revocations_file =
        r.revocations_file.as_ref().and_then(|f| c.file_path(p.key("revocations_file"), f));
    RouterSpec {
        group: r.group.clone(),
        tier_key,
        upgrade_socket,
        drain_timeout,
        revocations_file,
        watch_config: r.watch_config.unwrap_or(true),
    }
}

/// A `format` of `[log]` or of an access log.
pub(super) fn log_format(c: &mut Compiler<'_>, path: FieldPath, s: Option<&str>) -> LogFormat {
    match s {
        None => LogFormat::default(),
        Some(s) => LogFormat::parse(s).unwrap_or_else(|| {
            let all = LogFormat::ALL.map(LogFormat::as_str);
            c.err(path, format!("unknown log format `{s}`, expected {}", one_of(all)));
            LogFormat::default()
        }),
    }
}

pub(super) fn compile_log(c: &mut Compiler<'_>, l: &RawLog) -> LogSpec {
    let path = FieldPath::root().key("log");
    let format = log_format(c, path.key("format"), l.format.as_deref());
    if let Some(level) = &l.level
        && !LogSpec::LEVELS.contains(&level.as_str())
    {
        c.err(
            path.key("level"),
            format!("unknown log level `{level}`, expected {}", one_of(LogSpec::LEVELS)),
        );
    }
    LogSpec { format, level: l.level.clone() }
}

pub(super) fn compile_agent(c: &mut Compiler<'_>, a: &RawAgentReceiver) -> AgentSpec {
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
    let tls = a.tls.as_ref().map(|t| compile_listener_tls(c, &path.key("tls"), t));
    AgentSpec { listen, key, interval, tls }
}

pub(super) fn compile_admin(c: &mut Compiler<'_>, a: &RawAdmin, clusters: &[&str]) -> AdminSpec {
    let path = FieldPath::root().key("admin");
    let listen = a.listen.as_deref().unwrap_or(AdminSpec::DEFAULT_LISTEN);
    let listen = c
        .socket_addr(path.key("listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let token = compile_token(c, &path, a.token.as_ref(), a.token_file.as_ref());
    let tls = a.tls.as_ref().map(|t| compile_listener_tls(c, &path.key("tls"), t));
    let probes = compile_probes(c, &path, a, clusters);
    AdminSpec { listen, token, tls, probes }
}

/// The paths the admin API answers itself, which a probe path may not take.
const ADMIN_PATHS: [&str; 4] = ["/api/", "/metrics", "/dashboard", "/favicon"];

/// `ready_path`, `live_path`, `probe_listen` and `ready_clusters` of `[admin]` (`clusters`: the
/// file's cluster names).
fn compile_probes(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    a: &RawAdmin,
    clusters: &[&str],
) -> ProbeSpec {
    let mut probe_path = |key: &str, value: &Option<String>| {
        let p = value.as_ref()?;
        let bad = if !p.starts_with('/') {
            Some("must start with `/`".to_owned())
        } else if p == "/" || ADMIN_PATHS.iter().any(|a| p.starts_with(a.trim_end_matches('/'))) {
            Some(format!("is a path of the admin API itself (`/`, {})", ADMIN_PATHS.join(", ")))
        } else if p.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b == b'?') {
            Some("must be a plain path (no spaces, controls or query)".to_owned())
        } else {
            None
        };
        match bad {
            Some(why) => {
                c.err(path.key(key), format!("{key} {why}"));
                None
            }
            None => Some(p.clone()),
        }
    };
    let ready_path = probe_path("ready_path", &a.ready_path);
    let live_path = probe_path("live_path", &a.live_path);
    if ready_path.is_some() && ready_path == live_path {
        c.err(path.key("live_path"), "live_path must differ from ready_path");
    }
    let listen = a.probe_listen.as_deref().and_then(|l| c.socket_addr(path.key("probe_listen"), l));
    if a.probe_listen.is_some() && a.ready_path.is_none() && a.live_path.is_none() {
        c.err(path.key("probe_listen"), "probe_listen needs ready_path or live_path");
    }
    if let Some(names) = &a.ready_clusters {
        if a.ready_path.is_none() {
            c.err(path.key("ready_clusters"), "ready_clusters needs ready_path");
        }
        for (i, n) in names.iter().enumerate() {
            if !clusters.contains(&n.as_str()) {
                c.err(path.key("ready_clusters").index(i), format!("no cluster named `{n}`"));
            }
        }
    }
    ProbeSpec { ready_path, live_path, listen, ready_clusters: a.ready_clusters.clone() }
}

/// `token` or `token_file` (not both, not empty) of the table at `path`.
pub(super) fn compile_token(
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

/// A cluster's `xds` (at `path.xds`): the LB policy its proxyless gRPC clients run. `orca-wrr`
/// replaces the algorithm's mapping, so it is refused for `hash`, whose clients need the ring
/// to keep a key on its member.
pub(super) fn cluster_xds(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    x: &RawClusterXds,
    algorithm: Algorithm,
) -> XdsPolicy {
    let path = path.key("xds").key("lb");
    let lb = match x.lb.as_deref() {
        None => XdsLb::default(),
        Some(s) => XdsLb::parse(s).unwrap_or_else(|| {
            let all = XdsLb::ALL.map(XdsLb::as_str);
            c.err(path.clone(), format!("unknown xds lb `{s}`, expected {}", one_of(all)));
            XdsLb::default()
        }),
    };
    if lb == XdsLb::OrcaWrr && algorithm == Algorithm::Hash {
        c.err(
            path,
            "xds lb `orca-wrr` cannot serve a `hash` cluster (its clients need the ring to keep \
             a key on its member)",
        );
    }
    XdsPolicy { lb }
}
