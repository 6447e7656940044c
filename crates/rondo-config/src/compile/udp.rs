//! The UDP parts of a config: a `udp` listener's `udp` table and the listener options that mean
//! nothing to datagrams; a `udp` listener's one route (no match conditions, `udp` clusters
//! only); a `udp` cluster's own checks; and the health checks UDP members need (`health.udp`, a
//! datagram sent and an answer expected, or a TCP/HTTP check on a side port, `health.port`).

use super::*;
use crate::raw::{RawCluster, RawListenerUdp, RawUdpHealth};
use crate::spec::{UdpGranularity, UdpSpec};

/// Largest `max_flows`: each flow holds a socket (a file descriptor) while it is open.
pub(super) const MAX_MAX_FLOWS: u64 = 1 << 20;

/// Largest payload of a UDP datagram over IPv4 (65,535 minus the IP and UDP headers).
const MAX_DATAGRAM: usize = 65_507;

/// A listener's `udp` table (`None` for every other protocol, where the table is refused), and
/// the refusal of every listener option a `udp` listener has no use for (those that other
/// checks already refuse for non-HTTP listeners are left to them).
pub(super) fn compile_listener_udp(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Option<UdpSpec> {
    if protocol != ListenerProtocol::Udp {
        if l.udp.is_some() {
            c.err(path.key("udp"), "only applies to listeners with protocol `udp`");
        }
        return None;
    }
    let unused = [
        ("max_connections", l.max_connections.is_some()),
        ("backlog", l.backlog.is_some()),
        ("header_read_timeout_ms", l.header_read_timeout_ms.is_some()),
        ("body_read_timeout_ms", l.body_read_timeout_ms.is_some()),
        ("max_header_bytes", l.max_header_bytes.is_some()),
        ("max_headers", l.max_headers.is_some()),
        ("max_body_bytes", l.max_body_bytes.is_some()),
        ("trust_forwarded_for", l.trust_forwarded_for.is_some()),
        ("proxy_protocol", l.proxy_protocol.is_some()),
        ("trusted_sources", l.trusted_sources.is_some()),
        ("error_detail", l.error_detail.is_some()),
        ("h2_keepalive_interval_ms", l.h2_keepalive_interval_ms.is_some()),
        ("h2_keepalive_timeout_ms", l.h2_keepalive_timeout_ms.is_some()),
        ("h2_shutdown_timeout_ms", l.h2_shutdown_timeout_ms.is_some()),
        ("h2_max_resets", l.h2_max_resets.is_some()),
        ("h2_max_resets_per_address", l.h2_max_resets_per_address.is_some()),
        ("access_log", l.access_log.is_some()),
        ("tls", l.tls.is_some()),
        ("max_connection_age_ms", l.max_connection_age_ms.is_some()),
        ("max_requests_per_connection", l.max_requests_per_connection.is_some()),
        ("routing", l.routing.is_some()),
    ];
    for (field, set) in unused {
        if set {
            c.err(
                path.key(field),
                "does not apply to a udp listener (it takes `name`, `listen`, `protocol` and the \
                 `udp` table)",
            );
        }
    }
    Some(l.udp.as_ref().map_or_else(UdpSpec::default, |u| udp_table(c, &path.key("udp"), u)))
}

fn udp_table(c: &mut Compiler<'_>, path: &FieldPath, u: &RawListenerUdp) -> UdpSpec {
    let idle_timeout =
        c.ms(path.key("idle_timeout_ms"), u.idle_timeout_ms, UdpSpec::DEFAULT_IDLE_TIMEOUT, false);
    let max_flows = c.int(
        path.key("max_flows"),
        u.max_flows,
        u64::from(UdpSpec::DEFAULT_MAX_FLOWS),
        1,
        MAX_MAX_FLOWS,
    );
    let granularity = match u.granularity.as_deref() {
        None => UdpGranularity::default(),
        Some(s) => UdpGranularity::ALL.into_iter().find(|g| g.as_str() == s).unwrap_or_else(|| {
            let all = UdpGranularity::ALL.map(UdpGranularity::as_str);
            c.err(
                path.key("granularity"),
                format!("unknown granularity `{s}`, expected {}", one_of(all)),
            );
            UdpGranularity::default()
        }),
    };
    UdpSpec {
        idle_timeout,
        max_flows: u32::try_from(max_flows).unwrap_or(UdpSpec::DEFAULT_MAX_FLOWS),
        granularity,
    }
}

/// A route on `udp` listener `r.listener`: its only route (`seen` holds each udp listener's
/// first route), without match conditions or HTTP features, to `udp` clusters.
pub(super) fn check_route<'a>(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &'a RawRoute,
    route: &Route,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    seen: &mut HashMap<&'a str, String>,
) {
    let listener = &r.listener;
    match seen.get(listener.as_str()) {
        Some(first) => c.err(
            path.key("listener"),
            format!(
                "udp listener `{listener}` already has route `{first}`; a udp listener takes one \
                 route"
            ),
        ),
        None => {
            seen.insert(listener, route.name.clone());
        }
    }
    let features = [
        (
            "match",
            r.matcher.is_some(),
            "it has no request to match: its one route takes every datagram",
        ),
        (
            "clusters",
            r.clusters.is_some(),
            "it has `cluster` (and `backups`), not a weighted split",
        ),
        ("multicast", r.multicast.is_some(), "it copies HTTP requests"),
        (
            "multicast_max_body_bytes",
            r.multicast_max_body_bytes.is_some(),
            "it copies HTTP requests",
        ),
        ("session_replay", r.session_replay.is_some(), "it keeps HTTP requests"),
        ("auth", r.auth.is_some(), "a datagram carries no token"),
        ("login", r.login.is_some(), "a datagram carries no session"),
        ("filters", r.filters.is_some(), "filters edit HTTP requests"),
        (
            "idle_timeout_ms",
            r.idle_timeout_ms.is_some(),
            "flows end after the listener's `udp.idle_timeout`",
        ),
        (
            "request_timeout_ms",
            r.request_timeout_ms.is_some(),
            "flows end after the listener's `udp.idle_timeout`",
        ),
    ];
    for (field, set, why) in features {
        if set {
            c.err(
                path.key(field),
                format!("route on udp listener `{listener}` cannot have `{field}`: {why}"),
            );
        }
    }
    let targets = std::iter::once((path.key("cluster"), &route.cluster))
        .chain(route.backups.iter().enumerate().map(|(j, b)| (path.key("backups").index(j), b)));
    for (p, name) in targets {
        let Some(cluster) = clusters.get(name) else { continue };
        let up = cluster.upstream_protocol;
        if up != UpstreamProtocol::Udp {
            c.err(
                p,
                format!(
                    "udp listener `{listener}` cannot route to cluster `{name}` with \
                     upstream_protocol `{}`, it needs `udp`",
                    upstream_protocol_str(up)
                ),
            );
        }
    }
}

/// What a `udp` cluster cannot have, and the health check its members need: a UDP probe, or a
/// TCP, HTTP or gRPC check on `health.port` (the members' own port is UDP). A `udp` probe of
/// another cluster needs `health.port` too.
pub(super) fn check_cluster(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    rc: &RawCluster,
    up: UpstreamProtocol,
    health: Option<&HealthCheck>,
) {
    let udp = up == UpstreamProtocol::Udp;
    if udp && rc.upstream_tls.is_some() {
        c.err(path.key("upstream_tls"), "a udp cluster's datagrams are sent as they are (no DTLS)");
    }
    if udp && rc.session.is_some() {
        c.err(
            path.key("session"),
            "a udp cluster keeps a client on its member by flow (the listener's `udp.granularity`), \
             not by cookie or header",
        );
    }
    let Some(h) = health else { return };
    let path = path.key("health");
    let probes_udp = matches!(h.kind, HealthCheckKind::Udp { .. });
    if h.port.is_none() && udp && !probes_udp {
        c.err(
            path.key("kind"),
            "a udp cluster's members answer UDP on their address: probe them with `udp = { send \
             = ... }`, or set `port` to check a TCP or HTTP side port",
        );
    } else if h.port.is_none() && !udp && probes_udp {
        c.err(
            path.key("udp"),
            format!(
                "a udp probe of a cluster with upstream_protocol `{}` needs `port`, the members' \
                 UDP port",
                upstream_protocol_str(up)
            ),
        );
    }
}

/// `health.port` (1 to 65535), when set.
pub(super) fn health_port(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    port: Option<u64>,
) -> Option<u16> {
    let p = c.int(path.key("port"), port, 0, 1, u64::from(u16::MAX));
    port.map(|_| u16::try_from(p).unwrap_or(0)).filter(|p| *p != 0)
}

/// `health.udp`: the datagram sent (`send` or `send_hex`, one of them) and the bytes the answer
/// must contain (`expect` or `expect_hex`; neither: any answer passes).
pub(super) fn health_udp(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    u: Option<&RawUdpHealth>,
) -> HealthCheckKind {
    let path = path.key("udp");
    let Some(u) = u else {
        c.err(path, "a health check of kind `udp` needs `udp = { send = ... }`, the datagram sent");
        return HealthCheckKind::Udp { send: Vec::new(), expect: Vec::new() };
    };
    let send = payload(c, &path, ("send", u.send.as_deref()), ("send_hex", u.send_hex.as_deref()));
    if u.send.is_none() && u.send_hex.is_none() {
        c.err(path.key("send"), "a udp check needs `send` or `send_hex`, the datagram sent");
    }
    let expect =
        payload(c, &path, ("expect", u.expect.as_deref()), ("expect_hex", u.expect_hex.as_deref()));
    HealthCheckKind::Udp { send: send.unwrap_or_default(), expect: expect.unwrap_or_default() }
}

/// A payload written as text (`text.0`) or as hex digits (`hex.0`), at most one of them.
fn payload(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    text: (&str, Option<&str>),
    hex: (&str, Option<&str>),
) -> Option<Vec<u8>> {
    let bytes = match (text.1, hex.1) {
        (Some(_), Some(_)) => {
            c.err(path.key(hex.0), format!("set `{}` or `{}`, not both", text.0, hex.0));
            return None;
        }
        (Some(t), None) => t.as_bytes().to_vec(),
        (None, Some(h)) => match decode_hex(h) {
            Ok(b) => b,
            Err(msg) => {
                c.err(path.key(hex.0), msg);
                return None;
            }
        },
        (None, None) => return None,
    };
    if bytes.len() > MAX_DATAGRAM {
        let field = if text.1.is_some() { text.0 } else { hex.0 };
        c.err(
            path.key(field),
            format!("{} bytes is more than a datagram carries ({MAX_DATAGRAM})", bytes.len()),
        );
        return None;
    }
    Some(bytes)
}

/// Hex digits, two per byte; spaces between bytes are allowed (`"00 01 ab"`).
fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| *b != b' ').collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("`{s}` has an odd number of hex digits"));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16);
            let lo = (pair[1] as char).to_digit(16);
            match (hi, lo) {
                (Some(h), Some(l)) => Ok((h * 16 + l) as u8),
                _ => Err(format!("`{s}` is not hex: write two digits 0-9, a-f per byte")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::decode_hex;

    #[test]
    fn hex_payloads() {
        assert_eq!(decode_hex("00ff 1A").unwrap(), vec![0, 255, 26]);
        assert!(decode_hex("abc").unwrap_err().contains("odd number"));
        assert!(decode_hex("zz").unwrap_err().contains("not hex"));
    }
}
