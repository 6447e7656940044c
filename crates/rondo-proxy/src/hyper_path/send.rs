//! A try's request handed to the right pool ([`send`]): the shared pools, the cluster's own
//! (TLS, age, connect timeout, `max_connections`), or the client connection's own for a cluster
//! with `proxy_protocol` ([`crate::proxied`]). A cluster at its `max_connections` refuses a new
//! connection at once ([`rondo_runtime::pools::gate`]); the request then waits, among at most
//! `max_pending` others, for a connection to close or come back idle, and asks its pool again,
//! until the cluster's `connect_timeout` has passed.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use hyper::body::Incoming;
use rondo_core::TlsFailure;
use rondo_runtime::ClusterRt;
use rondo_runtime::pools::at_capacity;

use super::request::Prepared;
use crate::conn::ConnState;
use crate::error::Breaker;
use crate::http::HttpCtx;

/// How often a waiting request asks its pool again when no connection closed meanwhile (a
/// connection that came back idle to hyper-util's pool says nothing).
const LOOK_AGAIN: Duration = Duration::from_millis(10);

/// Why a try was not sent.
pub(super) enum Unsent {
    /// The cluster's `upstream_tls` files could not be loaded.
    Tls(TlsFailure),
    /// A connection breaker: `max_pending` requests were waiting already, or none came within
    /// `connect_timeout` (`max_connections`).
    Breaker(Breaker),
}

/// What hyper-util's client answered.
type Answer = Result<Response<Incoming>, rondo_runtime::pools::SendError>;

/// Sends `req`'s try to `member` of `rt` (made by `make`, again for each look at the pool).
pub(super) async fn send(
    ctx: &HttpCtx,
    conn: &ConnState,
    rt: &Arc<ClusterRt>,
    req: &Prepared,
    make: impl Fn(&Prepared) -> http::Request<crate::body::UpstreamBody>,
) -> Result<Answer, Unsent> {
    let answer = once(ctx, conn, rt, make(req)).await?;
    let Err(e) = &answer else { return Ok(answer) };
    if !at_capacity(e) {
        return Ok(answer);
    }
    // Only a cluster with `max_connections` refuses so.
    let Some(gate) = ctx.clients.gate(rt) else { return Ok(answer) };
    let Some(_waiting) = gate.wait() else {
        return Err(Unsent::Breaker(Breaker::MaxPending));
    };
    let until = tokio::time::Instant::now() + rt.spec.policy.connect_timeout;
    loop {
        let now = tokio::time::Instant::now();
        if now >= until {
            return Err(Unsent::Breaker(Breaker::MaxConnections));
        }
        let _ = tokio::time::timeout((until - now).min(LOOK_AGAIN), gate.freed()).await;
        match once(ctx, conn, rt, make(req)).await? {
            Err(e) if at_capacity(&e) => {}
            answer => return Ok(answer),
        }
    }
}

/// One look at the pool for `rt`'s members.
async fn once(
    ctx: &HttpCtx,
    conn: &ConnState,
    rt: &Arc<ClusterRt>,
    request: http::Request<crate::body::UpstreamBody>,
) -> Result<Answer, Unsent> {
    let sent = match rt.spec.policy.send_proxy {
        None => ctx.clients.for_cluster(rt).map(|c| c.request(request)),
        Some(version) => conn.proxied.sender(&ctx.clients, rt, version).map(|c| c.request(request)),
    };
    Ok(sent.map_err(Unsent::Tls)?.await)
}
