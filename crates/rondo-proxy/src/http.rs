//! The HTTP request path, top to bottom, in four stages (`proxy`):
//!
//! 1. `route`: refuse loops and malformed `Host`s, find the first matching route in the filter
//!    table (priority, then file order); when a route that reads the body (`body_json`,
//!    `body_xml`) could match, read the body's first bytes (`peek_body`) and look again;
//! 2. `prepare`: the body limit, the head as members get it, the body in a replay slot (bytes
//!    read already go first); a route that copies the request (multicast, `all-matches`) or
//!    keeps it (session replay) reads the whole body first, and the copies leave here
//!    ([`crate::multicast`]), each through `forward` on its own;
//! 3. `forward`: the failover loop. The core's [`Failover`] engine says which cluster the next
//!    try goes to and whether a failed try may go elsewhere; `place` puts the try on a member
//!    (sticky session, hash key or the cluster's algorithm) in the same lock hold as the retry
//!    budget; `attempt` replays a moved session's kept requests to the member first
//!    ([`crate::session_replay`]), sends the try with its timeout and classifies a failure;
//! 4. `respond`: the member's answer streamed back with header hygiene; or, when the tries ran
//!    out, an error that explains itself (`gave_up`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::{self, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rondo_config::{ListenerSpec, Routing};
use rondo_core::failover::is_idempotent_method;
use rondo_core::{
    BodyPeek, Failover, FailureKind, Granularity, HashKeySource, Lookup, Outcome, RequestFacts,
    Route, Stop, TryFailure,
};
use rondo_runtime::metrics::{ListenerMetrics, RouteMetrics};
use rondo_runtime::{ClusterRt, Live, Placed, Refused, Snapshot, clock};

use crate::access::{self, AccessLog, Reason};

use crate::body::{
    BodySlot, BodyStalled, ClientBodyError, Finish, ProxyBody, TooLarge, UpstreamBody,
};
use crate::conn::ConnState;
use crate::error::{Attempt, Kind, ProxyError, Side};
use crate::head::Headers;
use crate::headers::{add_forwarded, append_via, has_looped, is_upgrade, strip_hop_by_hop, via_id};
use crate::sticky::{self, Sessions};
use crate::upstream::Clients;

/// Idle timeout after a response that matched no route.
pub(crate) const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// Everything a listener's requests share.
#[derive(Debug)]
pub struct HttpCtx {
    /// The listener's settings.
    pub listener: ListenerSpec,
    /// Live views and balancers.
    pub live: Arc<Live>,
    /// Upstream pools.
    pub clients: Clients,
    /// Header-identified sessions.
    pub sessions: Sessions,
    /// The listener's connection and own-response metrics.
    pub metrics: Arc<ListenerMetrics>,
    /// The listener's access log, when configured.
    pub access: Option<AccessLog>,
    /// Sign-on token checks (routes' `auth`), shared by every listener.
    pub auth: Arc<crate::auth::Auth>,
    /// The multicast branches' queues.
    pub copies: crate::multicast::Queues,
}

/// Whether a request routed so must take hyper's path: its route copies it (multicast, or the
/// other matching routes of `all-matches`) or keeps it for session replay, both of which hold
/// the request's parts and body as hyper's path has them.
pub(crate) fn needs_hyper(routed: &Routed<'_>) -> bool {
    !routed.route.multicast.is_empty()
        || !routed.also.is_empty()
        || routed.route.session_replay.is_some()
}

/// Serves one request.
pub async fn handle(
    ctx: Arc<HttpCtx>,
    conn: Arc<ConnState>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    conn.request_started();
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
    let snapshot = ctx.live.load();
    let start = ctx.access.as_ref().map(|_| access::Start::new(peer, &req));
    let mut resp = match proxy(&ctx, &snapshot, &conn, peer, req).await {
        Ok(mut resp) => {
            if let (Some(log), Some(start)) = (&ctx.access, start) {
                let line = access::Pending::served(log, start, resp.status().as_u16());
                resp.body_mut().log(line);
            }
            resp
        }
        Err((e, idle)) => {
            tracing::debug!(listener = %ctx.listener.name, error = %e, "request failed");
            let status = e.kind.status().as_u16();
            ctx.metrics.router_response(status, e.route.as_deref(), e.cluster.as_deref());
            let line =
                ctx.access.as_ref().zip(start).map(|(l, s)| access::Pending::failed(l, s, &e));
            let mut resp = e.into_response(ctx.listener.error_detail);
            resp.body_mut().set_finish(Finish::default().conn(conn, idle).log(line));
            resp
        }
    };
    *resp.version_mut() =
        if version == Version::HTTP_2 { Version::HTTP_2 } else { Version::HTTP_11 };
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

/// The host a request is for, without its port, as RFC 9112 section 3.2 has it: an
/// absolute-form target's authority wins over `Host` (which is then replaced by it); an HTTP/1.1
/// request must carry exactly one `Host`; HTTP/2's `:authority` (which hyper puts in the URI)
/// becomes the `Host`, and a `Host` header naming something else is refused. Errors are the
/// client's, answered 400.
fn request_host(req: &mut Request<Incoming>) -> Result<Option<String>, String> {
    let from_uri = req.uri().authority().map(|a| a.as_str().to_owned());
    let full = if let Some(authority) = from_uri {
        // RFC 9113 8.3.1: a Host naming another authority than `:authority` is malformed.
        if req.version() == Version::HTTP_2
            && req
                .headers()
                .get_all(header::HOST)
                .iter()
                .any(|h| !h.as_bytes().eq_ignore_ascii_case(authority.as_bytes()))
        {
            return Err("the Host header differs from the request's :authority".to_owned());
        }
        let v = HeaderValue::from_str(&authority)
            .map_err(|_| format!("request target authority {authority:?} is not a valid Host"))?;
        req.headers_mut().insert(header::HOST, v);
        let mut authority = authority;
        authority.truncate(without_port(&authority).len());
        authority
    } else {
        let mut hosts = req.headers().get_all(header::HOST).iter();
        match (hosts.next(), hosts.next()) {
            (Some(h), None) => {
                let h =
                    h.to_str().map_err(|_| "the Host header is not visible ASCII".to_owned())?;
                without_port(h).to_owned()
            }
            (Some(_), Some(_)) => {
                let n = req.headers().get_all(header::HOST).iter().count();
                return Err(format!("the request has {n} Host headers; exactly one is allowed"));
            }
            (None, _) if req.version() == Version::HTTP_10 => {
                // HTTP/1.0 needs no Host, but the member is spoken to in HTTP/1.1, which does:
                // an empty one (RFC 9112 3.2: no authority), never the member's own address.
                req.headers_mut().insert(header::HOST, HeaderValue::from_static(""));
                return Ok(None);
            }
            (None, _) => return Err("the request has no Host header".to_owned()),
        }
    };
    Ok(Some(full))
}

/// `host[:port]` without the port, minding IPv6 literals.
fn without_port(full: &str) -> &str {
    match full.rfind(':') {
        Some(i) if !full[i..].contains(']') => &full[..i],
        _ => full,
    }
}

/// A failure the client is answered with, and the idle timeout its connection keeps.
pub(crate) type Failure = (ProxyError, Duration);

/// The request path in four stages: [`route`] (the guards and the route; a route with a body
/// filter first peeks at the body, [`peek_body`]), [`prepare`] (the request as members get it;
/// multicast copies leave here, [`crate::multicast`]), the failover loop of [`forward`] over
/// [`attempt`]s, and [`respond`] with the member's answer.
async fn proxy(
    ctx: &Arc<HttpCtx>,
    snapshot: &Arc<Snapshot>,
    conn: &Arc<ConnState>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Failure> {
    let (decided, host) = route(ctx, snapshot, &mut req)?;
    let (routed, mut read) = match decided {
        Decided::Route(routed) => (routed, None),
        Decided::NeedsBody(n) => {
            // A body filter decides: read the body's first bytes, then look again.
            let peeked = peek_body(ctx, None, &mut req, n).await?;
            let routed = match decide(ctx, snapshot, &req, host.as_deref(), Some(&peeked))? {
                Decided::Route(routed) => routed,
                // Never: the body was read as far as every route needs.
                Decided::NeedsBody(_) => return Err(no_route(ctx, &req, host.as_deref())),
            };
            (routed, Some(peeked))
        }
    };
    let route = routed.route;
    // Should the client abandon the request, the connection then idles under this route's timeout.
    conn.set_idle(route.idle_timeout);
    let identity = ctx.auth.gate(route, &ctx.live, req.headers()).map_err(|e| {
        (ProxyError::unauthorized(e, &route.name, &route.cluster), route.idle_timeout)
    })?;
    let branches = crate::multicast::branches(route, &routed.also);
    if !branches.is_empty() {
        // Every branch gets the same body: all of it is read first, within the route's limit.
        let limit = route.multicast_max_body_bytes;
        if req.body().size_hint().lower() > limit {
            let detail = format!(
                "request body over the multicast limit of {limit} bytes (multicast_max_body_bytes)"
            );
            return Err(on_route(route, Kind::BodyTooLarge, detail));
        }
        let whole = peek_body(ctx, Some(route), &mut req, limit.saturating_add(1)).await?;
        let whole = match read.take() {
            Some(first) => first.then(whole),
            None => whole,
        };
        if whole.bytes.len() as u64 > limit || !whole.complete {
            let detail = format!(
                "request body over the multicast limit of {limit} bytes (multicast_max_body_bytes)"
            );
            return Err(on_route(route, Kind::BodyTooLarge, detail));
        }
        read = Some(whole);
    }
    if let Some(limits) = route.session_replay
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
    let req = prepare(ctx, conn, route, req, host.as_deref(), identity.as_ref(), read)?;
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
    forward(ctx, snapshot, peer, route, idempotent, &mut HyperTries { ctx, conn, route, req }).await
}

/// What the route stage found: the route, and (routing `all-matches`) the other routes that
/// match, whose clusters get copies.
pub(crate) struct Routed<'s> {
    pub(crate) route: &'s Route,
    pub(crate) also: Vec<&'s Route>,
}

/// The route stage's answer: a route, or the body bytes a body filter needs to decide.
pub(crate) enum Decided<'s> {
    Route(Routed<'s>),
    NeedsBody(u64),
}

/// Stage 1: refuse what must not be forwarded (a loop, a malformed `Host`), then the first route
/// of this listener whose match holds. Returns the route and the request's host.
fn route<'s>(
    ctx: &HttpCtx,
    snapshot: &'s Snapshot,
    req: &mut Request<Incoming>,
) -> Result<(Decided<'s>, Option<String>), Failure> {
    if has_looped(req.headers()) {
        return Err(looped());
    }
    let host = match request_host(req) {
        Ok(host) => host,
        Err(detail) => return Err((ProxyError::new(Kind::BadRequest, detail), DEFAULT_IDLE)),
    };
    // Routes match, and members get, the normalized path (`/%6Frders` is `/orders`).
    if let Some(path) = rondo_core::path::normalize(req.uri().path()) {
        let target = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let mut parts = req.uri().clone().into_parts();
        let uri = PathAndQuery::try_from(target).ok().and_then(|pq| {
            parts.path_and_query = Some(pq);
            http::Uri::from_parts(parts).ok()
        });
        match uri {
            Some(uri) => *req.uri_mut() = uri,
            None => {
                let detail = "the request path cannot be normalized".to_owned();
                return Err((ProxyError::new(Kind::BadRequest, detail), DEFAULT_IDLE));
            }
        }
    }
    let decided = decide(ctx, snapshot, req, host.as_deref(), None)?;
    Ok((decided, host))
}

/// [`find_route`] for a request on hyper's path.
fn decide<'s>(
    ctx: &HttpCtx,
    snapshot: &'s Snapshot,
    req: &Request<Incoming>,
    host: Option<&str>,
    body: Option<&Peeked>,
) -> Result<Decided<'s>, Failure> {
    let target = Target {
        host,
        method: req.method().as_str(),
        path: req.uri().path(),
        query: req.uri().query(),
    };
    find_route(ctx, snapshot, req.headers(), target, body.map(Peeked::view))
}

/// The 404 of a request no route matches.
fn no_route(ctx: &HttpCtx, req: &Request<Incoming>, host: Option<&str>) -> Failure {
    let detail = format!(
        "no route on listener {} matches {} {}{}",
        ctx.listener.name,
        req.method(),
        host.unwrap_or(""),
        req.uri().path(),
    );
    (ProxyError::new(Kind::NoRoute, detail), DEFAULT_IDLE)
}

/// The 508 of a request that already passed through this router.
pub(crate) fn looped() -> Failure {
    let detail = format!(
        "request loop: it already passed through this router ({}) on its way here",
        via_id()
    );
    (ProxyError::new(Kind::Loop, detail), DEFAULT_IDLE)
}

/// What of a request's target routes match on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) host: Option<&'a str>,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
}

/// The first route of this listener whose match holds for the request (either path's), in the
/// filter table's order (priority, then file order), and under `routing = "all-matches"` the
/// other routes that match; or the body bytes a body filter needs first.
pub(crate) fn find_route<'s>(
    ctx: &HttpCtx,
    snapshot: &'s Snapshot,
    headers: &impl Headers,
    target: Target<'_>,
    body: Option<BodyPeek<'_>>,
) -> Result<Decided<'s>, Failure> {
    let lookup = |n: &str| headers.get_str(n);
    let present = |n: &str| headers.get(n).is_some();
    let Target { host, method, path, query } = target;
    let facts =
        RequestFacts { host, path, query, method, header: &lookup, present: &present, body };
    let listener = ctx.listener.name.as_str();
    let all = ctx.listener.routing == Routing::AllMatches;
    match snapshot.view.lookup(listener, &facts, all) {
        Lookup::Found(route) => {
            let also =
                if all { snapshot.view.also_matching(listener, route, &facts) } else { Vec::new() };
            Ok(Decided::Route(Routed { route, also }))
        }
        Lookup::NeedsBody(n) => Ok(Decided::NeedsBody(n)),
        Lookup::NoRoute => {
            let detail = format!(
                "no route on listener {} matches {method} {}{path}",
                ctx.listener.name,
                host.unwrap_or(""),
            );
            Err((ProxyError::new(Kind::NoRoute, detail), DEFAULT_IDLE))
        }
    }
}

/// Body bytes read before the request is forwarded (a body filter's peek, a multicast copy's
/// whole body); forwarded unchanged ahead of the rest.
pub(crate) struct Peeked {
    pub(crate) bytes: Bytes,
    pub(crate) trailers: Option<http::HeaderMap>,
    /// The whole body was read.
    pub(crate) complete: bool,
}

impl Peeked {
    fn view(&self) -> BodyPeek<'_> {
        BodyPeek { bytes: &self.bytes, complete: self.complete }
    }

    /// These bytes, then `more` (read after them).
    fn then(self, more: Peeked) -> Peeked {
        if self.complete {
            return self;
        }
        let mut all = bytes::BytesMut::with_capacity(self.bytes.len() + more.bytes.len());
        all.extend_from_slice(&self.bytes);
        all.extend_from_slice(&more.bytes);
        Peeked { bytes: all.freeze(), trailers: more.trailers, complete: more.complete }
    }
}

/// How long reading a body before routing it may take (the default request timeout: no route
/// is chosen yet).
const PEEK_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the request body's first bytes, until at least `want` are in or the body ends (the
/// listener's `max_body_bytes` holds: 413 past it). The rest stays in the request.
async fn peek_body(
    ctx: &HttpCtx,
    route: Option<&Route>,
    req: &mut Request<Incoming>,
    want: u64,
) -> Result<Peeked, Failure> {
    let limit = ctx.listener.max_body_bytes;
    let failure = |kind: Kind, detail: String| match route {
        Some(route) => on_route(route, kind, detail),
        None => (ProxyError::new(kind, detail), DEFAULT_IDLE),
    };
    if limit > 0 && req.body().size_hint().lower() > limit {
        return Err(failure(
            Kind::BodyTooLarge,
            format!("request body over the limit of {limit} bytes"),
        ));
    }
    let timeout = route.map_or(PEEK_TIMEOUT, |r| r.request_timeout);
    let stall = ctx.listener.body_read_timeout;
    let body = req.body_mut();
    let mut bytes = bytes::BytesMut::new();
    let mut trailers = None;
    let mut ended = false;
    let read = async {
        while (bytes.len() as u64) < want && !body.is_end_stream() {
            let Ok(frame) =
                tokio::time::timeout(stall, http_body_util::BodyExt::frame(&mut *body)).await
            else {
                return Err(Kind::ClientBodyTimeout);
            };
            match frame {
                None => {
                    ended = true;
                    break;
                }
                Some(Err(_)) => return Err(Kind::ClientBody),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        bytes.extend_from_slice(&data);
                        if limit > 0 && bytes.len() as u64 > limit {
                            return Err(Kind::BodyTooLarge);
                        }
                    }
                    Err(frame) => {
                        if let Ok(mut t) = frame.into_trailers() {
                            crate::headers::strip_reserved_trailers(&mut t);
                            trailers = Some(t);
                        }
                        break;
                    }
                },
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(())) => {}
        Ok(Err(Kind::BodyTooLarge)) => {
            let detail = format!("request body over the limit of {limit} bytes");
            return Err(failure(Kind::BodyTooLarge, detail));
        }
        Ok(Err(Kind::ClientBodyTimeout)) => {
            let detail = format!(
                "the request body did not arrive in time (no byte for body_read_timeout_ms, {} ms)",
                stall.as_millis()
            );
            return Err(failure(Kind::ClientBodyTimeout, detail));
        }
        Ok(Err(kind)) => {
            let detail = "the request body broke off before it was complete".to_owned();
            return Err(failure(kind, detail));
        }
        Err(_) => {
            let detail = "the request body did not arrive in time".to_owned();
            return Err(failure(Kind::ClientBodyTimeout, detail));
        }
    }
    let complete = ended || trailers.is_some() || body.is_end_stream();
    Ok(Peeked { bytes: bytes.freeze(), trailers, complete })
}

/// A request as every try sends it: its head with hop-by-hop headers gone and forwarding
/// headers added, and its body waiting in a slot until a try reads it.
struct Prepared {
    parts: Parts,
    path_and_query: PathAndQuery,
    slot: Option<BodySlot>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    idempotent: bool,
}

impl Prepared {
    /// Whether the request can still be sent again: no try has read from its body.
    fn replayable(&self) -> bool {
        self.slot.as_ref().is_none_or(BodySlot::is_untouched)
    }
}

/// Stage 2: the body limit, then the head as members get it.
fn prepare(
    ctx: &HttpCtx,
    conn: &ConnState,
    route: &Route,
    mut req: Request<Incoming>,
    host: Option<&str>,
    identity: Option<&crate::auth::Identity>,
    read: Option<Peeked>,
) -> Result<Prepared, Failure> {
    let limit = ctx.listener.max_body_bytes;
    if read.is_none() && limit > 0 && req.body().size_hint().lower() > limit {
        let detail = format!("request body over the limit of {limit} bytes");
        return Err(on_route(route, Kind::BodyTooLarge, detail));
    }
    let upgrade = req.version() == Version::HTTP_11 && is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let client_version = req.version();
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, upgrade);
    add_forwarded(
        &mut parts.headers,
        &conn.client_ip,
        host,
        client_version,
        ctx.listener.trust_forwarded_for,
    );
    crate::headers::add_client_cert(&mut parts.headers, conn.tls.as_ref());
    crate::auth::apply(&mut parts.headers, identity);
    if route.session_replay.is_some() {
        // Only the router marks a replay.
        parts.headers.remove(crate::session_replay::REPLAY_HEADER);
    }
    let path_and_query =
        parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    let slot = match read {
        Some(p) if p.complete => (!p.bytes.is_empty() || p.trailers.is_some())
            .then(|| BodySlot::whole(p.bytes, p.trailers)),
        Some(p) => Some(BodySlot::prefixed(p.bytes, body)),
        None => (!body.is_end_stream()).then(|| BodySlot::new(body)),
    };
    let idempotent = is_idempotent_method(parts.method.as_str());
    Ok(Prepared { parts, path_and_query, slot, client_upgrade, idempotent })
}

/// One path's way of trying a request on a member: hyper's ([`Prepared`]) or the router's own
/// HTTP/1 path's. The failover loop ([`forward`]) is written once over it.
pub(crate) trait Tries {
    /// What a successful try gives.
    type Response;
    /// The request's header fields (sessions, hash keys).
    type Headers: Headers;
    /// The request's header fields.
    fn headers(&self) -> &Self::Headers;
    /// Whether the request can still be sent again (no try has consumed its body).
    fn replayable(&self) -> bool;
    /// Now, on the core's clock: the wall clock for requests (a replay of recorded scenarios,
    /// [`crate::replay`], gives the scenario's time).
    fn now(&self) -> rondo_core::Instant {
        clock::now()
    }
    /// One try on the member `choice` placed it on, within the try's timeout from `failover`;
    /// the member's answer, or the failure classified.
    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> Result<Self::Response, Kind>;
}

/// Stage 3: the failover loop. The core's [`Failover`] decides where each try goes and whether
/// a failed one may go elsewhere; this only carries its decisions out.
pub(crate) async fn forward<T: Tries>(
    ctx: &HttpCtx,
    snapshot: &Snapshot,
    peer: SocketAddr,
    route: &Route,
    idempotent: bool,
    req: &mut T,
) -> Result<T::Response, Failure> {
    let clusters = 1 + route.backups.len();
    // One clock reading per turn of the loop: the request's start serves its first placement,
    // the reading after a failed try both that failure and the next placement (microseconds
    // apart, each was a reading of its own).
    let mut now = req.now();
    let mut failover = Failover::new(clusters, idempotent, now, route.request_timeout);
    let mut attempts: Vec<Attempt> = Vec::new();
    let metrics = &ctx.live.metrics;
    let stop = loop {
        let Some(i) = failover.cluster() else { break Stop::Exhausted };
        let cluster = if i == 0 { &route.cluster } else { &route.backups[i - 1] };
        let Some(rt) = snapshot.clusters.get(cluster) else {
            failover.none_eligible();
            continue;
        };
        let choice = match place(ctx, rt, &mut failover, req.headers(), peer, now) {
            Ok(choice) => choice,
            Err(Refused::Stop(stop)) => {
                tracing::warn!(route = %route.name, cluster = %cluster, "retry budget exhausted");
                metrics.budget_exhausted(&route.name, cluster);
                break stop;
            }
            Err(Refused::NoEligible(e)) => {
                tracing::debug!(route = %route.name, error = %e, "no member");
                let outcome = Kind::NoEligible;
                attempts.push(Attempt {
                    cluster: cluster.clone(),
                    member: None,
                    outcome,
                    expected: None,
                });
                failover.none_eligible();
                continue;
            }
        };
        if failover.tries() > 1 {
            metrics.retry(&route.name, cluster);
        }
        let member = choice.member;
        let kind = match req.attempt(rt, choice, &failover).await {
            Ok(resp) => return Ok(resp),
            Err(kind) => kind,
        };
        if kind.side() == Side::Client {
            // The request's own failure: no member is to blame and none can do better.
            let detail = match kind {
                Kind::BodyTooLarge => {
                    format!("request body over the limit of {} bytes", ctx.listener.max_body_bytes)
                }
                Kind::ClientBodyTimeout => format!(
                    "the request body did not arrive in time (no byte for body_read_timeout_ms, \
                     {} ms, or the route's request_timeout_ms ran out)",
                    ctx.listener.body_read_timeout.as_millis()
                ),
                _ => "the request body broke off before it was complete".to_owned(),
            };
            return Err(on_route(route, kind, detail));
        }
        let name = &rt.spec.members[member].name;
        tracing::debug!(route = %route.name, cluster = %cluster, member = %name, ?kind, "attempt failed");
        if let Kind::Tls(why) = kind {
            metrics.tls_member_failure(cluster, name, why);
        }
        attempts.push(Attempt {
            cluster: cluster.clone(),
            member: Some(name.clone()),
            outcome: kind,
            expected: crate::error::expected_name(kind, rt, member),
        });
        let failure = TryFailure {
            // A replay that failed sent the member the session's kept requests, not this one.
            reached: !matches!(kind, Kind::Connect | Kind::Resolve | Kind::Tls(_) | Kind::Replay),
            member_failed: kind.is_retryable(),
            replayable: req.replayable(),
        };
        now = req.now();
        if let Err(stop) = failover.failed(failure, now) {
            break stop;
        }
    };
    Err(gave_up(route, attempts, stop))
}

/// The error of a request that ran out of tries: the most telling failure among its attempts.
fn gave_up(route: &Route, attempts: Vec<Attempt>, stop: Stop) -> Failure {
    let tls = attempts.iter().find(|a| matches!(a.outcome, Kind::Tls(_))).map(|a| a.outcome);
    let kind = [
        Kind::Timeout,
        Kind::Reset,
        Kind::BadStatus,
        Kind::BadBody,
        Kind::Replay,
        Kind::Connect,
        Kind::Resolve,
    ]
    .into_iter()
    .find(|k| attempts.iter().any(|a| a.outcome == *k))
    .or(tls)
    .unwrap_or(Kind::NoEligible);
    let mut detail = match kind {
        Kind::Timeout => "member too slow: no response in time".to_owned(),
        Kind::NoEligible => "no eligible member to serve the request".to_owned(),
        Kind::Tls(_) => "bad gateway: tls to the member failed".to_owned(),
        _ => "bad gateway: no member answered".to_owned(),
    };
    if stop == Stop::Budget {
        detail.push_str(" (retry budget exhausted)");
    }
    let mut e = ProxyError::on_route(kind, &route.name, &route.cluster, detail);
    e.attempts = attempts;
    e.stop = Some(stop);
    (e, route.idle_timeout)
}

pub(crate) fn on_route(route: &Route, kind: Kind, detail: String) -> Failure {
    (ProxyError::on_route(kind, &route.name, &route.cluster, detail), route.idle_timeout)
}

/// A request on hyper's path, with what its tries need.
struct HyperTries<'a> {
    ctx: &'a HttpCtx,
    conn: &'a Arc<ConnState>,
    route: &'a Route,
    req: Prepared,
}

impl Tries for HyperTries<'_> {
    type Response = Response<ProxyBody>;
    type Headers = http::HeaderMap;

    fn headers(&self) -> &http::HeaderMap {
        &self.req.parts.headers
    }

    fn replayable(&self) -> bool {
        self.req.replayable()
    }

    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> Result<Response<ProxyBody>, Kind> {
        attempt(self.ctx, self.conn, self.route, rt, choice, &mut self.req, failover).await
    }
}

/// One try on the member `choice` placed it on: sent with the try's timeout, its outcome
/// recorded on the member; the member's answer goes on to [`respond`], a failure comes back
/// classified.
async fn attempt(
    ctx: &HttpCtx,
    conn: &Arc<ConnState>,
    route: &Route,
    rt: &Arc<ClusterRt>,
    choice: Choice,
    req: &mut Prepared,
    failover: &Failover,
) -> Result<Response<ProxyBody>, Kind> {
    let member = choice.member;
    // Ends the request on the member as cancelled if this future is dropped (the client went
    // away) before an outcome is recorded.
    let begun = Begun::new(rt, member);
    // Session replay: a session that moved to this member gets its kept requests first.
    let tls = ctx.listener.tls.is_some();
    let session = crate::session_replay::session_of(route, rt, &req.parts.headers, tls);
    let mut replayed = None;
    if let Some((key, _)) = &session {
        let store = &ctx.sessions.replay;
        let name = &rt.spec.members[member].name;
        match store.plan(&route.name, key, name) {
            crate::session_replay::Plan::Nothing => {}
            crate::session_replay::Plan::Skipped => {
                tracing::info!(route = %route.name, member = %name, "session over its replay limits: failed over without replay");
                ctx.live.metrics.replay(&route.name, "skipped");
                store.moved(&route.name, key, name);
                replayed = Some(None);
            }
            crate::session_replay::Plan::Replay(kept) => {
                let started = Instant::now();
                let timeout = failover.try_timeout(clock::from_std(started));
                match crate::session_replay::replay(ctx, rt, member, &kept, timeout).await {
                    Ok(n) => {
                        tracing::info!(route = %route.name, member = %name, replayed = n, "session replayed to the member taking it over");
                        ctx.live.metrics.replay(&route.name, "replayed");
                        store.moved(&route.name, key, name);
                        replayed = Some(Some(n));
                    }
                    Err(()) => {
                        tracing::info!(route = %route.name, member = %name, "session replay failed: trying the next member");
                        ctx.live.metrics.replay(&route.name, "failed");
                        let latency = started.elapsed();
                        begun.end(Outcome::Failure { kind: FailureKind::Reset, latency });
                        return Err(Kind::Replay);
                    }
                }
            }
        }
    }
    let body = match &req.slot {
        None => UpstreamBody::Empty,
        Some(slot) => {
            let (limit, stall) = (ctx.listener.max_body_bytes, ctx.listener.body_read_timeout);
            UpstreamBody::stream(slot.clone(), limit, Some(stall))
        }
    };
    let parts = &req.parts;
    let request =
        upstream_request(&parts.method, &parts.headers, rt, member, &req.path_and_query, body);
    // The try's time and its latency start as it is sent (the pick, a session sweep and a wait
    // for the cluster's lock are not the member's), and the try ends by the request's deadline.
    let started = Instant::now();
    let per_try = failover.try_timeout(clock::from_std(started));
    let failed = |kind: FailureKind| Outcome::Failure { kind, latency: started.elapsed() };
    let client = match ctx.clients.for_cluster(rt) {
        Ok(c) => c,
        Err(why) => {
            begun.end(failed(FailureKind::Connect));
            return Err(Kind::Tls(why));
        }
    };
    match tokio::time::timeout(per_try, client.request(request)).await {
        Ok(Ok(resp)) if resp.status().as_u16() > 599 => {
            // hyper reads any three digits; RFC 9110 section 15 knows 100-599 only. A member
            // that says otherwise is broken: a failure, never passed on.
            begun.end(failed(FailureKind::Reset));
            Err(Kind::BadStatus)
        }
        Ok(Ok(mut resp)) => {
            let latency = started.elapsed();
            let status = resp.status().as_u16();
            let tls = ctx.listener.tls.is_some();
            crate::auth::on_response(route, status, resp.headers_mut(), &ctx.live, tls);
            if let (Some((key, cookie)), Some(limits)) = (&session, route.session_replay) {
                keep_for_replay(ctx, route, rt, member, req, key, limits, resp.headers_mut());
                let h = resp.headers_mut();
                match replayed {
                    Some(Some(n)) => {
                        h.insert(crate::session_replay::REPLAYED_HEADER, HeaderValue::from(n));
                    }
                    Some(None) => {
                        let skipped = HeaderValue::from_static("skipped");
                        h.insert(crate::session_replay::REPLAY_HEADER, skipped);
                    }
                    None => {}
                }
                if let Some(cookie) = cookie {
                    h.append(header::SET_COOKIE, cookie.clone());
                }
            }
            let counted = record_response(rt, &route.name, member, status, latency.as_secs_f64());
            begun.disarm();
            let served = Served { counted, slot: req.slot.clone(), tries: failover.tries() };
            let upgrade = req.client_upgrade.take();
            Ok(respond(conn, route, rt, choice, upgrade, resp, latency, served))
        }
        Ok(Err(e)) if caused_by::<TooLarge>(&e) => {
            begun.end(Outcome::Cancelled);
            Err(Kind::BodyTooLarge)
        }
        Ok(Err(e))
            if caused_by::<BodyStalled>(&e) || req.slot.as_ref().is_some_and(BodySlot::stalled) =>
        {
            // No byte of the client's body for `body_read_timeout_ms`: 408, the member is not
            // charged.
            begun.end(Outcome::Cancelled);
            Err(Kind::ClientBodyTimeout)
        }
        Ok(Err(e))
            if caused_by::<ClientBodyError>(&e)
                || req.slot.as_ref().is_some_and(BodySlot::failed_by_client) =>
        {
            // The client's body failed (aborted mid-way): not the member's fault.
            begun.end(Outcome::Cancelled);
            Err(Kind::ClientBody)
        }
        Ok(Err(e)) if e.is_connect() => {
            begun.end(failed(FailureKind::Connect));
            Err(match crate::upstream::tls_failure(&e) {
                Some(why) => Kind::Tls(why),
                None if is_dns_failure(&e) => Kind::Resolve,
                None => Kind::Connect,
            })
        }
        Ok(Err(e)) => {
            begun.end(failed(FailureKind::Reset));
            // A TLS 1.3 member refuses the router's certificate (or its lack of one) only
            // after the handshake: the refusal arrives as the request's error.
            Err(crate::upstream::tls_failure(&e).map_or(Kind::Reset, Kind::Tls))
        }
        Err(_elapsed) if req.slot.as_ref().is_some_and(BodySlot::stalled_by_client) => {
            // The try waited on the client's body, not on the member: 408, and the member is
            // not charged.
            begun.end(Outcome::Cancelled);
            Err(Kind::ClientBodyTimeout)
        }
        Err(_elapsed) => {
            begun.end(failed(FailureKind::Timeout));
            Err(Kind::Timeout)
        }
    }
}

/// Keeps the request just answered by `member` in its session's log (`None` for a body that
/// was not read whole: too large to keep), or empties the log on the member's checkpoint (its
/// `x-rondo-checkpoint`, which goes no further).
#[allow(clippy::too_many_arguments)]
fn keep_for_replay(
    ctx: &HttpCtx,
    route: &Route,
    rt: &ClusterRt,
    member: usize,
    req: &Prepared,
    key: &str,
    limits: rondo_core::SessionReplay,
    response: &mut http::HeaderMap,
) {
    use crate::session_replay::{CHECKPOINT_HEADER, Kept, Recorded};
    let checkpoint = response.remove(CHECKPOINT_HEADER).is_some();
    let body = match &req.slot {
        None => Some((Bytes::new(), None)),
        Some(slot) => slot.whole_body().map(|(b, t)| (b.clone(), t.cloned())),
    };
    let kept = body.map(|(body, trailers)| {
        let mut headers = req.parts.headers.clone();
        headers.remove(crate::session_replay::REPLAY_HEADER);
        Kept::new(req.parts.method.clone(), req.path_and_query.clone(), headers, body, trailers)
    });
    let store = &ctx.sessions.replay;
    let name = &rt.spec.members[member].name;
    let idle = rt.spec.sticky.idle_timeout;
    if store.record(&route.name, limits, idle, key, name, kept, checkpoint) == Recorded::Over {
        tracing::debug!(route = %route.name, "session over its replay limits: no longer kept");
    }
    ctx.live.metrics.replay_bytes.set(store.bytes() as i64);
}

/// Stage 4: the member's answer on its way back: framing fixed, hop-by-hop headers gone (or a
/// protocol switch joined), `Via` and a new session cookie added; the member's request ends
/// (and its outcome is recorded) when the body's last frame has passed.
#[allow(clippy::too_many_arguments)]
fn respond(
    conn: &Arc<ConnState>,
    route: &Route,
    rt: &Arc<ClusterRt>,
    choice: Choice,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    mut resp: Response<Incoming>,
    latency: Duration,
    served: Served,
) -> Response<ProxyBody> {
    let member = choice.member;
    let outcome = if resp.status().is_server_error() {
        Outcome::Failure { kind: FailureKind::Status5xx, latency }
    } else {
        Outcome::Success { latency }
    };
    let member_upgrade =
        (resp.status() == StatusCode::SWITCHING_PROTOCOLS).then(|| hyper::upgrade::on(&mut resp));
    let (mut parts, body) = resp.into_parts();
    if parts.headers.contains_key(header::TRANSFER_ENCODING) {
        // RFC 9112 section 6.3: with both, the transfer coding frames the body and the length is
        // wrong. hyper decoded the chunks; the length must not reach the client, or it would
        // frame a truncated body with it.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    match (client_upgrade, member_upgrade) {
        (Some(c), Some(m)) => {
            conn.upgraded();
            tunnel(rt.clone(), member, c, m);
        }
        _ => strip_hop_by_hop(&mut parts.headers, false),
    }
    append_via(&mut parts.headers, parts.version);
    if let Some(cookie) = choice.set_cookie {
        parts.headers.append(header::SET_COOKIE, cookie);
    }
    let finish = Finish::default()
        .request(rt.clone(), member, outcome)
        .conn(conn.clone(), route.idle_timeout)
        .served(served.counted, served.slot, served.tries, choice.reason);
    Response::from_parts(parts, ProxyBody::upstream(body, finish))
}

/// Whether a connect failure was the member's host name not resolving (hyper-util's connector
/// says so only in its message).
fn is_dns_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.to_string().starts_with("dns error") {
            return true;
        }
        cur = err.source();
    }
    false
}

fn caused_by<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<T>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A request counted as begun on a member; ends it as cancelled when dropped unless an outcome
/// was recorded or the response body took over. The one guard of a try's accounting.
pub(crate) struct Begun {
    rt: Arc<ClusterRt>,
    member: usize,
    armed: bool,
}

impl Begun {
    /// Counts a try begun on `member` of `rt` (its request was begun by `place`).
    pub(crate) fn new(rt: &Arc<ClusterRt>, member: usize) -> Self {
        Begun { rt: rt.clone(), member, armed: true }
    }

    /// Ends the try with `outcome`.
    pub(crate) fn end(mut self, outcome: Outcome) {
        self.armed = false;
        self.rt.end_request(self.member, outcome);
    }

    /// The response's end will end the try.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        if self.armed {
            self.rt.end_request(self.member, Outcome::Cancelled);
        }
    }
}

/// What the router derives once from a view of a cluster and keeps beside it, in the cluster
/// runtime's `data_plane` slot (the runtime knows nothing of HTTP): each member's address as a
/// URI authority (`None`: not a valid one) for hyper's path, the own HTTP/1 path's idle
/// connections per member, indexed by member number, and each route's metric handles on the
/// cluster, resolved once per route and member rather than per response.
pub(crate) struct ClusterView {
    authorities: Box<[Option<uri::Authority>]>,
    /// Idle upstream connections of the own HTTP/1 path, per member.
    pub(crate) idle: Box<[crate::h1::pool::Idle]>,
    /// Per route (by name), its metrics on this cluster.
    routes: RwLock<Vec<(String, Arc<RouteMetrics>)>>,
}

impl ClusterView {
    /// `rt`'s, made at its first request (`None` only if another data plane filled the slot,
    /// which none does).
    pub(crate) fn of(rt: &ClusterRt) -> Option<&ClusterView> {
        let made = rt.data_plane.get_or_init(|| {
            let members = &rt.spec.members;
            let authorities =
                members.iter().map(|m| uri::Authority::try_from(m.address.as_str()).ok()).collect();
            let limits = rt.spec.policy.connections;
            let idle =
                members.iter().map(|m| crate::h1::pool::Idle::new(&m.address, limits)).collect();
            Arc::new(ClusterView { authorities, idle, routes: RwLock::default() })
        });
        made.downcast_ref::<ClusterView>()
    }

    /// `route`'s metrics on this cluster, created on first use.
    pub(crate) fn route_metrics(&self, rt: &ClusterRt, route: &str) -> Arc<RouteMetrics> {
        let find = |list: &[(String, Arc<RouteMetrics>)]| {
            list.iter().find(|(r, _)| r == route).map(|(_, per)| per.clone())
        };
        if let Some(per) = find(&self.routes.read().unwrap_or_else(|e| e.into_inner())) {
            return per;
        }
        let mut list = self.routes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(per) = find(&list) {
            return per;
        }
        let (name, members) = (&rt.spec.name, rt.spec.members.len());
        let per = Arc::new(RouteMetrics::new(rt.metrics(), route, name, members));
        list.push((route.to_owned(), per.clone()));
        per
    }
}

/// Counts `member`'s response on `route` (status, latency in seconds) in the process's metrics
/// and returns the route's metrics on `rt` (for its bytes).
pub(crate) fn record_response(
    rt: &ClusterRt,
    route: &str,
    member: usize,
    status: u16,
    latency: f64,
) -> Arc<RouteMetrics> {
    let handles = route_metrics(rt, route);
    handles.record(rt.metrics(), member, &rt.spec.members[member].name, status, latency);
    handles
}

/// `route`'s metrics on `rt`, kept in its [`ClusterView`].
pub(crate) fn route_metrics(rt: &ClusterRt, route: &str) -> Arc<RouteMetrics> {
    match ClusterView::of(rt) {
        Some(view) => view.route_metrics(rt, route),
        // Never: the slot is only ever filled with a `ClusterView`.
        None => Arc::new(RouteMetrics::new(rt.metrics(), route, &rt.spec.name, 0)),
    }
}

pub(crate) fn upstream_request(
    method: &http::Method,
    headers: &http::HeaderMap,
    rt: &ClusterRt,
    member: usize,
    path_and_query: &PathAndQuery,
    body: UpstreamBody,
) -> Request<UpstreamBody> {
    let mut uri = uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    // Parsed once per view of the cluster (`ClusterView`), not per request.
    uri.authority = ClusterView::of(rt).and_then(|v| v.authorities.get(member).cloned().flatten());
    uri.path_and_query = Some(path_and_query.clone());
    let uri = Uri::from_parts(uri).unwrap_or_default();
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers.clone();
    *req.version_mut() = match rt.spec.upstream_protocol {
        rondo_core::UpstreamProtocol::Http2 => Version::HTTP_2,
        _ => Version::HTTP_11,
    };
    req
}

/// Where a try went, and the session cookie its response must carry.
pub(crate) struct Choice {
    pub(crate) member: usize,
    pub(crate) set_cookie: Option<HeaderValue>,
    /// Why this member (for the access log).
    pub(crate) reason: Reason,
}

/// What a served response's end reports besides its outcome: the route's byte counters, the
/// request body (bytes in), the tries made.
struct Served {
    counted: Arc<RouteMetrics>,
    slot: Option<BodySlot>,
    tries: u32,
}

/// Places the next try (one lock hold, [`ClusterRt::place`]): on its session's member when it
/// has one that can keep it, else through the cluster's picker; a new placement of a session is
/// pinned (header sessions) or told to the client (cookie sessions).
pub(crate) fn place(
    ctx: &HttpCtx,
    rt: &Arc<ClusterRt>,
    failover: &mut Failover,
    headers: &impl Headers,
    peer: SocketAddr,
    now: rondo_core::Instant,
) -> Result<Choice, Refused> {
    let spec = &rt.spec;
    let session = spec.policy.granularity == Granularity::Session;
    let mut header_session = None;
    let mut held = None;
    // Only sessions sign or read cookies with the tier's key.
    let tier = if session { ctx.live.tier_key() } else { None };
    let tier = tier.as_deref();
    let tls = ctx.listener.tls.is_some();
    let mut renew = false;
    if session {
        held = match &spec.sticky.header {
            Some(h) => {
                let id = headers.get_str(h.as_str());
                header_session = id;
                id.and_then(|id| ctx.sessions.get(rt, id))
            }
            None => sticky::cookie(headers, &spec.sticky.cookie)
                .and_then(|t| sticky::held_by_cookie(spec, t, tier, sticky::unix_now()))
                .map(|(m, due)| {
                    renew = due;
                    m
                }),
        };
    }
    let hash = (spec.policy.algorithm == rondo_core::Algorithm::Hash)
        .then(|| hash_key(&spec.policy.hash.key, headers, peer))
        .flatten();
    let group = ctx.live.group.as_deref();
    let (member, reason) = match rt.place(failover, now, group, hash, held)? {
        Placed::Kept(m) => {
            // A signed cookie past half its life gets a new expiry.
            let set_cookie =
                renew.then(|| sticky::set_cookie(spec, m, tier, sticky::unix_now(), tls)).flatten();
            return Ok(Choice { member: m, set_cookie, reason: Reason::Session });
        }
        Placed::Picked(m, algorithm, why) => (m, Reason::Pick(algorithm, why)),
    };
    let mut set_cookie = None;
    if session {
        ctx.sessions.sweep();
        match header_session {
            Some(id) => ctx.sessions.pin(rt, id, member),
            None if spec.sticky.header.is_none() => {
                set_cookie = sticky::set_cookie(spec, member, tier, sticky::unix_now(), tls);
            }
            None => {}
        }
    }
    Ok(Choice { member, set_cookie, reason })
}

fn hash_key(source: &HashKeySource, headers: &impl Headers, peer: SocketAddr) -> Option<u64> {
    use rondo_core::hash::hash_key;
    match source {
        HashKeySource::ClientAddress => Some(match peer.ip() {
            std::net::IpAddr::V4(ip) => hash_key(&ip.octets()),
            std::net::IpAddr::V6(ip) => hash_key(&ip.octets()),
        }),
        HashKeySource::Header(h) => headers.get(h.as_str()).map(hash_key),
        HashKeySource::Cookie(c) => sticky::cookie(headers, c).map(|v| hash_key(v.as_bytes())),
    }
}

/// Joins the client's and the member's upgraded connections (WebSocket and other protocol
/// switches) and copies bytes both ways until either side closes; counted as a session.
fn tunnel(
    rt: Arc<ClusterRt>,
    member: usize,
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
) {
    rt.open_session(member);
    tokio::spawn(async move {
        if let (Ok(c), Ok(m)) = tokio::join!(client, upstream) {
            let (mut c, mut m) = (TokioIo::new(c), TokioIo::new(m));
            let _ = tokio::io::copy_bidirectional(&mut c, &mut m).await;
        }
        rt.close_session(member);
    });
}

#[cfg(test)]
mod tests {
    use rondo_core::{ClusterSpec, MemberSpec, Policy, UpstreamProtocol, View};
    use rondo_runtime::Live;

    use super::*;

    #[test]
    fn responses_are_counted_per_route_member_and_class() {
        let member = |n: &str| MemberSpec {
            name: n.into(),
            address: "127.0.0.1:1".into(),
            weight: 100,
            group: None,
            admin: Default::default(),
        };
        let spec = ClusterSpec {
            name: "c".into(),
            members: vec![member("a"), member("b")],
            policy: Policy::default(),
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: Default::default(),
            upstream_tls: None,
        };
        let view = View {
            id: 1,
            routes: vec![],
            clusters: [("c".to_owned(), Arc::new(spec))].into_iter().collect(),
        };
        let live = Live::new(view, None);
        let snap = live.load();
        let rt = &snap.clusters["c"];
        record_response(rt, "r1", 0, 200, 0.001);
        record_response(rt, "r1", 0, 204, 0.002);
        record_response(rt, "r2", 0, 503, 0.003);
        record_response(rt, "r1", 1, 404, 0.004);
        // One set of handles per route, kept beside the cluster's runtime.
        assert!(Arc::ptr_eq(&route_metrics(rt, "r1"), &route_metrics(rt, "r1")));
        let text = live.metrics.render(&snap);
        let line = |route: &str, member: &str, class: &str, n: u64| {
            format!(
                "rondo_requests_total{{route=\"{route}\",cluster=\"c\",member=\"{member}\",class=\"{class}\"}} {n}\n"
            )
        };
        for l in [line("r1", "a", "2xx", 2), line("r2", "a", "5xx", 1), line("r1", "b", "4xx", 1)] {
            assert!(text.contains(&l), "{l:?} missing from\n{text}");
        }
        // A class never seen is not shown.
        assert!(!text.contains("class=\"3xx\""), "{text}");
        let count =
            "rondo_request_duration_seconds_count{route=\"r1\",cluster=\"c\",member=\"a\"} 2";
        assert!(text.contains(count), "{text}");
    }
}
