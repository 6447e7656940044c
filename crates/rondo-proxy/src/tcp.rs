//! TCP listeners: each connection is one session, placed once by the route's cluster (then its
//! backups) and spliced to the member until either side closes. A member that refuses the
//! connection is skipped for the next one, up to the cluster's retry attempts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rondo_core::{FailureKind, Outcome, PickRequest};
use rondo_runtime::{Live, clock};
use tokio::net::TcpStream;

/// Connect timeout when the cluster sets no per-try timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one client connection of TCP listener `listener`.
pub async fn handle(live: Arc<Live>, listener: Arc<str>, mut client: TcpStream, peer: SocketAddr) {
    let snapshot = live.load();
    let Some(route) = snapshot.view.routes.iter().find(|r| *r.listener == *listener) else {
        tracing::warn!(%listener, "tcp listener has no route; closing connection");
        return;
    };
    let hash = Some(match peer.ip() {
        std::net::IpAddr::V4(ip) => rondo_core::hash::hash_key(&ip.octets()),
        std::net::IpAddr::V6(ip) => rondo_core::hash::hash_key(&ip.octets()),
    });
    for cluster in std::iter::once(&route.cluster).chain(route.backups.iter()) {
        let Some(rt) = snapshot.clusters.get(cluster) else { continue };
        let mut tried = Vec::new();
        for _ in 0..rt.spec.policy.retry.attempts.max(1) {
            let req = PickRequest {
                now: clock::now(),
                group: live.group.as_deref(),
                hash,
                context: None,
                exclude: &tried,
            };
            let Ok(d) = rt.pick_and_begin(&req) else { break };
            tried.push(d.member);
            let m = &rt.spec.members[d.member];
            let timeout = rt.spec.policy.retry.per_try_timeout.unwrap_or(CONNECT_TIMEOUT);
            let started = Instant::now();
            match tokio::time::timeout(timeout, TcpStream::connect(&m.address)).await {
                Ok(Ok(mut upstream)) => {
                    let _ = upstream.set_nodelay(true);
                    rt.end_request(d.member, Outcome::Success { latency: started.elapsed() });
                    rt.open_session(d.member);
                    let copied = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    rt.close_session(d.member);
                    // Counted when the connection ends (an error loses its counts).
                    if let Ok((to_member, to_client)) = copied {
                        let counted = rt.route_metrics(&route.name);
                        counted.bytes_in.inc_by(to_member);
                        counted.bytes_out.inc_by(to_client);
                    }
                    return;
                }
                Ok(Err(_)) | Err(_) => {
                    let outcome =
                        Outcome::Failure { kind: FailureKind::Connect, latency: started.elapsed() };
                    rt.end_request(d.member, outcome);
                    tracing::debug!(%listener, cluster = %cluster, member = %m.name, "tcp connect failed");
                }
            }
        }
    }
    tracing::warn!(%listener, route = %route.name, "no member accepted the tcp connection; closing");
}
