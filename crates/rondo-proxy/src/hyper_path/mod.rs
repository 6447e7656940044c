//! The hyper codec: requests on connections hyper serves (HTTP/2, HTTP/1.0, upgrades, routes
//! with body filters, multicast or session replay, members over TLS or HTTP/2) run the shared
//! stages ([`crate::http`]) here: [`handle`] is hyper's service, `proxy` the request's walk:
//! [`request`] (the guards, the route, the body peek, `prepare`), the failover loop of
//! [`crate::http::forward`] over [`tries`], and [`respond`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::client_body::ClientBody;
use http::{Request, Response, Version};
use http_body::Body as _;
use rondo_runtime::Snapshot;

use self::grpc::GrpcCall;
use self::request::{decide, no_route, peek_body, prepare, route};
use self::tries::HyperTries;
use crate::access;
use crate::http::route::Routed;
use crate::http::{Decided, Failure, HttpCtx, forward, on_route};

use crate::body::{Finish, ProxyBody};
use crate::chain::{Applied, Chain, FieldOps, Stopped, gate};
use crate::conn::ConnState;
use crate::error::Kind;

/// Serves one request.
pub async fn handle(
    ctx: Arc<HttpCtx>,
    conn: Arc<ConnState>,
    peer: SocketAddr,
    req: Request<ClientBody>,
) -> Result<Response<ProxyBody>, Infallible> {
    conn.request_started();
    let arrived = std::time::Instant::now();
    // Until the response exists, a drop of this future (an HTTP/2 stream the client reset)
    // must still end the request on the connection, or its idle timer would never run again.
    let open = Open(Some(conn.clone()));
    let version = req.version();
    if version == Version::HTTP_2 {
        // hyper drops a stream's handler when the client resets it, but only once the handler
        // waits: yield once, so a stream already reset when its handler first runs (opened and
        // reset at once) reaches neither the pick nor a member connection.
        tokio::task::yield_now().await;
    }
    let snapshot = ctx.views.load();
    let mut start = ctx.access.as_ref().map(|log| {
        let extra = || crate::access_fields::Extra::of_request(&req, conn.tls.as_ref());
        access::Start::new(peer, &req).with_extra(extra, log)
    });
    let grpc = grpc::is_grpc(req.headers());
    // A gRPC-Web client reads the router's own errors in its own content type.
    let web = if grpc { grpc_web::client_type(req.headers()) } else { None };
    // Boxed: the request's walk is some kilobytes of state, and hyper moves this future into
    // its stream task and tokio into the task's cell; a pointer moves instead.
    let mut route_name = "";
    let walk =
        Box::pin(proxy(&ctx, &snapshot, &conn, peer, req, grpc, (&mut start, &mut route_name)));
    // A failure before the route was chosen may still name it (a body over the limit).
    let mut failed_route = None;
    let mut resp = match walk.await {
        Ok(mut resp) => {
            if let (Some(log), Some(start)) = (&ctx.access, start) {
                let line = access::Pending::served(log, start, resp.status().as_u16());
                resp.body_mut().log(line);
            }
            resp
        }
        Err(Failed { failure: (e, idle), edits }) => {
            tracing::debug!(listener = %ctx.listener.name, error = %e, "request failed");
            let status = e.kind.status().as_u16();
            ctx.metrics.router_response(status, e.route.as_deref(), e.cluster.as_deref());
            if route_name.is_empty() {
                failed_route.clone_from(&e.route);
            }
            let line =
                ctx.access.as_ref().zip(start).map(|(l, s)| access::Pending::failed(l, s, &e));
            let mut resp = if grpc {
                let mut resp = grpc::failure(&e, ctx.listener.error_detail, &ctx.live.metrics);
                if let Some(web) = web {
                    resp.headers_mut().insert(http::header::CONTENT_TYPE, web);
                }
                resp
            } else {
                respond::failure(e, ctx.listener.error_detail)
            };
            if let Some(edits) = edits {
                edits.apply(resp.headers_mut());
            }
            resp.body_mut().set_finish(Finish::default().conn(conn, idle).log(line));
            resp
        }
    };
    // The whole request, every try included, timed until its response is over.
    let names = (ctx.listener.name.as_str(), failed_route.as_deref().unwrap_or(route_name));
    let status = resp.status().as_u16();
    resp.body_mut().time(&ctx.live.metrics, names, arrived, status);
    *resp.version_mut() =
        if version == Version::HTTP_2 { Version::HTTP_2 } else { Version::HTTP_11 };
    // A listener that also serves HTTP/3 says so on its TCP responses (RFC 7838).
    if let Some(alt) = ctx.alt_svc.as_ref().filter(|_| version != Version::HTTP_3) {
        resp.headers_mut().insert(http::header::ALT_SVC, alt.clone());
    }
    // The response body's end now reports to the connection.
    open.disarm();
    Ok(resp)
}

/// A request begun on its connection and not yet handed to a response body.
struct Open(Option<Arc<ConnState>>);

impl Open {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            conn.request_abandoned();
        }
    }
}

/// The request path in four stages: [`route`] (the guards and the route; a route with a body
/// filter first peeks at the body, [`peek_body`]), [`prepare`] (the request as members get it;
/// multicast copies leave here, [`crate::multicast`]), the failover loop of [`forward`] over
/// [`attempt`]s, and [`respond`] with the member's answer.
async fn proxy<'s>(
    ctx: &Arc<HttpCtx>,
    snapshot: &'s Arc<Snapshot>,
    conn: &Arc<ConnState>,
    peer: SocketAddr,
    mut req: Request<ClientBody>,
    grpc: bool,
    (start, route_name): (&mut Option<access::Start>, &mut &'s str),
) -> Result<Response<ProxyBody>, Failed> {
    let (decided, host) = route(ctx, snapshot, &mut req)?;
    let (routed, read) = match decided {
        Decided::Route(routed) => (routed, None),
        Decided::NeedsBody(n) => {
            // A body filter decides: read the body's first bytes, then look again.
            let peeked = peek_body(ctx, None, &mut req, n).await?;
            let routed = match decide(ctx, snapshot, &req, host.as_deref(), Some(&peeked))? {
                Decided::Route(routed) => routed,
                // Never: the body was read as far as every route needs.
                Decided::NeedsBody(_) => return Err(no_route(ctx, &req, host.as_deref()).into()),
            };
            (routed, Some(peeked))
        }
    };
    let route = routed.route;
    *route_name = &route.name;
    // Should the client abandon the request, the connection then idles under this route's timeout.
    conn.set_idle(route.idle_timeout);
    // The route's filters (its `auth` among them): edits for the tries and the response, or
    // an answer of their own.
    let mut applied = match Chain::of(ctx, route) {
        None => None,
        Some(chain) => {
            let info = request::info(ctx, conn, &req, host.as_deref());
            let outcome = chain.request(&info, req.headers(), gate(ctx, route));
            let applied = match &outcome {
                Ok(applied) => applied,
                Err(stopped) => stopped.applied(),
            };
            if let Some(start) = start.as_mut() {
                start.set_request_id(applied.request_id());
            }
            match outcome {
                Ok(applied) => Some(applied),
                Err(stopped) => match *stopped {
                    Stopped::Answered(answer, applied) => {
                        crate::chain::hold(Some(&applied), route).await;
                        return Ok(respond::answered(ctx, conn, route, answer, &applied));
                    }
                    Stopped::Refused(e, applied) => {
                        // The edits of the filters before `auth` apply to its refusal.
                        let edits = response_edits(Some(&applied));
                        return Err(Failed { failure: (e, route.idle_timeout), edits });
                    }
                },
            }
        }
    };
    // An injected delay (`fault`) holds the request before anything is read or sent.
    crate::chain::hold(applied.as_deref(), route).await;
    let sent = send(
        ctx,
        snapshot,
        conn,
        peer,
        req,
        grpc,
        &routed,
        host.as_deref(),
        read,
        (&mut applied, start),
    );
    // The filters' response edits (a request id, HSTS) apply to the router's own answer too.
    sent.await.map_err(|failure| Failed { failure, edits: response_edits(applied.as_deref()) })
}

/// A request the router answers itself, with the response edits of the filters that ran.
struct Failed {
    failure: Failure,
    edits: Option<FieldOps>,
}

impl From<Failure> for Failed {
    fn from(failure: Failure) -> Failed {
        Failed { failure, edits: None }
    }
}

/// The response edits of a request's filters for an answer of the router's own.
fn response_edits(applied: Option<&Applied>) -> Option<FieldOps> {
    applied.filter(|a| a.edits_response()).map(|a| a.response(""))
}

/// After the filters: the body the steps need read first (a SOAP conversion, the copies, a
/// session's log), the request as members get it, the copies sent, and the tries. `applied`
/// goes into the request, and comes back should no member answer.
#[allow(clippy::too_many_arguments)]
async fn send(
    ctx: &Arc<HttpCtx>,
    snapshot: &Arc<Snapshot>,
    conn: &Arc<ConnState>,
    peer: SocketAddr,
    mut req: Request<ClientBody>,
    grpc: bool,
    routed: &Routed<'_>,
    host: Option<&str>,
    mut read: Option<request::Peeked>,
    (applied, start): (&mut Option<Box<Applied>>, &mut Option<access::Start>),
) -> Result<Response<ProxyBody>, Failure> {
    let route = routed.route;
    if let Some((plan, applied)) = applied.as_mut().and_then(|a| Some((a.soap?, a))) {
        // The message is converted whole before anything is sent (or copied).
        read = Some(soap::request(ctx, route, &mut req, read.take(), plan, applied).await?);
    }
    let web = applied.as_ref().and_then(|a| a.grpc_web);
    if let Some((plan, applied)) = web.filter(|w| w.text).zip(applied.as_mut()) {
        // A text call's message is decoded whole before anything is sent.
        read = Some(grpc_web::request(ctx, route, &mut req, read.take(), plan, applied).await?);
    }
    let copies = applied.as_ref().map_or(&[][..], |a| &a.copies[..]);
    let mut branches = crate::multicast::branches(route, &routed.also, copies);
    if !branches.is_empty() {
        // Only mirrors: a body too large to copy skips the copies, never the request.
        let whole = applied.as_ref().is_some_and(|a| a.copies_whole);
        let lenient = !whole && routed.also.is_empty();
        read = copied_body(ctx, route, &mut req, read, lenient).await?;
        let limit = route.multicast_max_body_bytes;
        if !read.as_ref().is_some_and(|r| r.complete && r.bytes.len() as u64 <= limit) {
            crate::multicast::too_large(ctx, route, std::mem::take(&mut branches));
        }
    }
    if let Some(limits) = applied.as_ref().and_then(|a| a.replay)
        && !read.as_ref().is_some_and(|r| r.complete)
    {
        // A session's request is kept whole for replay: its body is read first, up to the
        // session's limit (a larger one streams on, and the session is no longer kept).
        let more =
            peek_body(ctx, Some(route), &mut req, limits.max_bytes.saturating_add(1)).await?;
        read = Some(match read.take() {
            Some(first) => first.then(more),
            None => more,
        });
    }
    if let Some(limit) = retry::hedged_body(snapshot, route, &req, grpc)
        && !read.as_ref().is_some_and(|r| r.complete)
    {
        // A request its cluster may hedge is read whole first, up to `retry_buffer_bytes`, so
        // that tries side by side each send all of it (a longer one streams, unhedged).
        // Boxed: rare, and its state would take room in every request's future.
        let more = Box::pin(peek_body(ctx, Some(route), &mut req, limit.saturating_add(1))).await?;
        read = Some(match read.take() {
            Some(first) => first.then(more),
            None => more,
        });
    }
    let req = prepare(ctx, conn, route, req, host, read, applied)?;
    if !branches.is_empty() {
        crate::multicast::spawn(
            ctx,
            snapshot,
            peer,
            route,
            branches,
            &req.parts,
            &req.path_and_query,
            req.slot.as_ref(),
        );
    }
    let idempotent = req.idempotent;
    let grpc = grpc.then(|| GrpcCall::of(&req.parts.headers));
    let status = retry::StatusRetry::default();
    let mut tries = HyperTries { ctx, conn, route, req, grpc, status, start };
    let answered = match forward(ctx, snapshot, peer, route, idempotent, &mut tries).await {
        // A call a member declined last gets that member's answer.
        Err((e, idle)) => match tries
            .grpc
            .as_mut()
            .map_or_else(|| tries.status.declined_answer(&e), |g| g.declined_answer(&e))
        {
            Some(mut resp) => {
                resp.body_mut().set_finish(Finish::default().conn(conn.clone(), idle));
                Ok(resp)
            }
            None => {
                *applied = tries.req.applied.take();
                Err((e, idle))
            }
        },
        ok => ok,
    };
    // A gRPC-Web call's answer goes back in gRPC-Web's framing.
    match web {
        Some(plan) => answered.map(|resp| grpc_web::response(resp, plan)),
        None => answered,
    }
}

pub(crate) mod grpc;
mod grpc_web;
/// The whole body every copy gets, read first within the route's `multicast_max_body_bytes`
/// (after the bytes already `read`): over it, a 413, or when `lenient` (the copies are only
/// mirrors) the bytes read so far, incomplete, with the rest left to stream to the member.
async fn copied_body(
    ctx: &HttpCtx,
    route: &rondo_core::Route,
    req: &mut Request<ClientBody>,
    read: Option<request::Peeked>,
    lenient: bool,
) -> Result<Option<request::Peeked>, Failure> {
    let limit = route.multicast_max_body_bytes;
    let too_large = || {
        let detail = format!(
            "request body over the multicast limit of {limit} bytes (multicast_max_body_bytes)"
        );
        Err(on_route(route, Kind::BodyTooLarge, detail))
    };
    if req.body().size_hint().lower() > limit {
        return if lenient { Ok(read) } else { too_large() };
    }
    let more = peek_body(ctx, Some(route), req, limit.saturating_add(1)).await?;
    let whole = match read {
        Some(first) => first.then(more),
        None => more,
    };
    if (whole.bytes.len() as u64 > limit || !whole.complete) && !lenient {
        return too_large();
    }
    Ok(Some(whole))
}

pub(crate) mod request;
pub(crate) mod respond;
mod retry;
mod send;
mod soap;
pub(crate) mod tries;

#[cfg(test)]
mod tests {
    /// The size of the future `make` returns, without making it.
    fn size<F>(_: impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every request's walk on this path ([`super::proxy`]) is moved into a box once, and the
    /// whole future is copied, used or not: past a few kilobytes glibc copies it byte by byte
    /// (`rep movsb`, +8,500 instructions per HTTP/2 request when a SOAP conversion awaited
    /// inline in every try took it from 7,976 to 8,672 bytes in this debug build). Rare steps
    /// are boxed where they are awaited.
    #[test]
    #[allow(unreachable_code, clippy::diverging_sub_expression)]
    fn a_requests_walk_stays_small() {
        let walk = size(|| {
            super::proxy(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        assert!(walk <= 8_000, "the request's walk is {walk} bytes");
    }
}
