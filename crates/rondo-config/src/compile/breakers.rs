//! A cluster's connection breakers: `max_connections` and `max_pending` (Envoy's cluster
//! circuit breakers of the same names), compiled into the core's `ConnectionCap`.

use rondo_core::{ConnectionCap, UpstreamProtocol};

use super::Compiler;
use crate::path::FieldPath;
use crate::raw::RawCluster;

/// `max_connections` and `max_pending` of the cluster at `path`: `None` without
/// `max_connections` (then nothing is counted). `max_pending` needs `max_connections`, and a
/// `tcp` cluster has neither (each session is a connection of its own: `max_requests` caps them).
pub(super) fn connection_cap(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    rc: &RawCluster,
    protocol: UpstreamProtocol,
) -> Option<ConnectionCap> {
    if rc.max_pending.is_some() && rc.max_connections.is_none() {
        c.err(
            path.key("max_pending"),
            "max_pending needs max_connections (requests wait only while the cluster is at it)",
        );
        return None;
    }
    rc.max_connections?;
    if protocol == UpstreamProtocol::Tcp {
        c.err(
            path.key("max_connections"),
            "tcp clusters open one member connection per session: cap them with max_requests",
        );
        return None;
    }
    let connections = c.u32(path.key("max_connections"), rc.max_connections, 1, 1);
    let pending = c.u32(path.key("max_pending"), rc.max_pending, ConnectionCap::DEFAULT_PENDING, 0);
    Some(ConnectionCap { connections, pending })
}
