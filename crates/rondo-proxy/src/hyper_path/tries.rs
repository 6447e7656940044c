//! hyper's way of making a try ([`HyperTries`]): a moved session's kept requests replayed
//! first, the request sent through the pooled hyper client with the try's timeout, the outcome
//! recorded on the member, and a failure classified (connect, DNS, TLS, reset, timeout, or the
//! client's body).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{self, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use rondo_core::{Failover, FailureKind, Outcome, Route};
use rondo_runtime::{ClusterRt, clock};

use super::grpc::GrpcCall;
use super::request::Prepared;
use super::respond::{Served, respond};
use crate::chain::{Applied, TRACEPARENT};
use crate::http::{Begun, Choice, ClusterView, HttpCtx, Tries, record_response};

use crate::body::{BodySlot, BodyStalled, ClientBodyError, ProxyBody, TooLarge, UpstreamBody};
use crate::conn::ConnState;
use crate::error::Kind;

/// A request on hyper's path, with what its tries need.
pub(super) struct HyperTries<'a> {
    pub(super) ctx: &'a HttpCtx,
    pub(super) conn: &'a Arc<ConnState>,
    pub(super) route: &'a Route,
    pub(super) req: Prepared,
    /// A gRPC call's state, `None` for any other request.
    pub(super) grpc: Option<GrpcCall>,
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

    fn deadline(&self) -> Option<Duration> {
        self.grpc.as_ref().and_then(|g| g.deadline)
    }

    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> Result<Response<ProxyBody>, Kind> {
        let Some(grpc) = &mut self.grpc else {
            return attempt(self.ctx, self.conn, self.route, rt, choice, &mut self.req, failover)
                .await;
        };
        grpc.before(&mut self.req, rt, failover);
        let resp =
            attempt(self.ctx, self.conn, self.route, rt, choice, &mut self.req, failover).await?;
        grpc.answered(resp, &mut self.req, rt)
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
    let session = session_of(route, rt, &req.parts.headers, tls);
    let mut replayed = None;
    if let Some((key, _)) = &session {
        match replay_moved(ctx, route, rt, member, key, failover).await {
            Ok(r) => replayed = r,
            Err(latency) => {
                begun.end(Outcome::Failure { kind: FailureKind::Reset, latency });
                return Err(Kind::Replay);
            }
        }
    }
    let request = member_request(ctx, rt, member, req);
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
            if let (Some(session), Some(limits)) = (&session, route.session_replay) {
                let h = resp.headers_mut();
                session_answered(ctx, route, rt, member, req, session, limits, replayed, h);
            }
            let counted = record_response(rt, &route.name, member, status, latency.as_secs_f64());
            begun.disarm();
            let served = Served { counted, slot: req.slot.clone(), tries: failover.tries() };
            let upgrade = req.client_upgrade.take();
            let mut resp = respond(conn, route, rt, choice, upgrade, resp, latency, served);
            // A SOAP message is converted back first: compression then works on what the
            // client reads.
            if let Some(plan) = req.applied.as_ref().and_then(|a| a.soap) {
                resp = super::soap::response(resp, plan, route).await;
            }
            if let Some(applied) = req.applied.as_ref() {
                if applied.edits_response() {
                    applied.response(&rt.spec.members[member].name).apply(resp.headers_mut());
                }
                crate::chain::compress_response(applied, &route.name, &ctx.live.metrics, &mut resp);
            }
            Ok(resp)
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

/// The request as hyper's client sends it to `member`: the prepared head, and the body from its
/// slot under the listener's body limit and read timeout.
fn member_request(
    ctx: &HttpCtx,
    rt: &ClusterRt,
    member: usize,
    req: &Prepared,
) -> Request<UpstreamBody> {
    let body = match &req.slot {
        None => UpstreamBody::Empty,
        Some(slot) => {
            let (limit, stall) = (ctx.listener.max_body_bytes, ctx.listener.body_read_timeout);
            UpstreamBody::stream(slot.clone(), limit, Some(stall))
        }
    };
    let parts = &req.parts;
    let mut request =
        upstream_request(&parts.method, &parts.headers, rt, member, &req.path_and_query, body);
    // Each try is a span of its own in the request's trace.
    if let Some(span) = req.applied.as_ref().and_then(Applied::next_span) {
        request.headers_mut().insert(TRACEPARENT, span);
    }
    request
}

/// A kept session's side of its member's answer: the request kept for replay (or the log
/// emptied at the member's checkpoint), what a replay to the member did, and the session's
/// cookie.
#[allow(clippy::too_many_arguments)]
fn session_answered(
    ctx: &HttpCtx,
    route: &Route,
    rt: &ClusterRt,
    member: usize,
    req: &Prepared,
    (key, cookie): &(String, Option<HeaderValue>),
    limits: rondo_core::SessionReplay,
    replayed: Option<Option<usize>>,
    h: &mut http::HeaderMap,
) {
    keep_for_replay(ctx, route, rt, member, req, key, limits, h);
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

/// A session that moved to `member` gets its kept requests first. `Ok(None)`: nothing to
/// replay; `Ok(Some(None))`: skipped, the session is over its replay limits; `Ok(Some(Some(n)))`:
/// `n` requests replayed; `Err`: the replay failed after this long.
async fn replay_moved(
    ctx: &HttpCtx,
    route: &Route,
    rt: &Arc<ClusterRt>,
    member: usize,
    key: &str,
    failover: &Failover,
) -> Result<Option<Option<usize>>, Duration> {
    let store = &ctx.sessions.replay;
    let name = &rt.spec.members[member].name;
    match store.plan(&route.name, key, name) {
        crate::session_replay::Plan::Nothing => Ok(None),
        crate::session_replay::Plan::Skipped => {
            tracing::info!(route = %route.name, member = %name, "session over its replay limits: failed over without replay");
            ctx.live.metrics.replay(&route.name, "skipped");
            store.moved(&route.name, key, name);
            Ok(Some(None))
        }
        crate::session_replay::Plan::Replay(kept) => {
            let started = Instant::now();
            let timeout = failover.try_timeout(clock::from_std(started));
            match replay(ctx, rt, member, &kept, timeout).await {
                Ok(n) => {
                    tracing::info!(route = %route.name, member = %name, replayed = n, "session replayed to the member taking it over");
                    ctx.live.metrics.replay(&route.name, "replayed");
                    store.moved(&route.name, key, name);
                    Ok(Some(Some(n)))
                }
                Err(()) => {
                    tracing::info!(route = %route.name, member = %name, "session replay failed: trying the next member");
                    ctx.live.metrics.replay(&route.name, "failed");
                    Err(started.elapsed())
                }
            }
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

/// The request hyper's client sends to `member` of `rt` (the URI's authority from its
/// [`ClusterView`]).
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
        rondo_core::UpstreamProtocol::Http2 => {
            // HTTP/2 carries the authority as `:authority` (the member's address: the pools
            // and connectors key on it); a `Host` beside it that names another is a malformed
            // request to RFC 9113 8.3.1, and nginx answers it 400. The client's host goes on
            // in `X-Forwarded-Host`.
            req.headers_mut().remove(header::HOST);
            Version::HTTP_2
        }
        _ => Version::HTTP_11,
    };
    req
}

/// The session a request of `route` on cluster `rt` belongs to, for replay: its header
/// session's id, or its replay cookie's; a cookie session without one gets a new id and the
/// `Set-Cookie` that gives it to the client.
pub(crate) fn session_of(
    route: &rondo_core::Route,
    rt: &ClusterRt,
    headers: &http::HeaderMap,
    secure: bool,
) -> Option<(String, Option<http::HeaderValue>)> {
    route.session_replay?;
    let spec = &rt.spec;
    if spec.policy.granularity != rondo_core::Granularity::Session {
        return None;
    }
    if let Some(h) = &spec.sticky.header {
        let id = crate::head::Headers::get_str(headers, h.as_str())?;
        return (id.len() <= crate::session_replay::MAX_SESSION_ID).then(|| (id.to_owned(), None));
    }
    if let Some(id) = crate::sticky::cookie(headers, crate::session_replay::REPLAY_COOKIE)
        && id.len() == 32
        && id.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Some((id.to_owned(), None));
    }
    let id = crate::session_replay::new_id();
    let secure = if secure { "; Secure" } else { "" };
    let cookie = format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Lax{secure}",
        crate::session_replay::REPLAY_COOKIE
    );
    Some((id, http::HeaderValue::from_str(&cookie).ok()))
}

/// Replays `kept` to `member` of `rt`, in order, each within `timeout` (a request of its
/// own, marked `x-rondo-replay: 1`, its answer read and dropped): how many, or the failure
/// (no answer, or a 5xx: the member could not take the session over).
pub(crate) async fn replay(
    ctx: &HttpCtx,
    rt: &ClusterRt,
    member: usize,
    kept: &[Arc<crate::session_replay::Kept>],
    timeout: Duration,
) -> Result<usize, ()> {
    use http_body_util::BodyExt as _;
    let client = ctx.clients.for_cluster(rt).map_err(|_| ())?;
    for k in kept {
        let mut headers = k.headers();
        headers.insert(crate::session_replay::REPLAY_HEADER, http::HeaderValue::from_static("1"));
        let slot = crate::body::BodySlot::whole(k.body.clone(), k.trailers.clone());
        let body = crate::body::UpstreamBody::stream(slot, 0, None);
        let request = upstream_request(&k.method, &headers, rt, member, &k.path_and_query, body);
        let answer = async {
            let resp = client.request(request).await.map_err(|_| ())?;
            let status = resp.status().as_u16();
            resp.into_body().collect().await.map_err(|_| ())?;
            if status >= 500 { Err(()) } else { Ok(()) }
        };
        tokio::time::timeout(timeout, answer).await.map_err(|_| ())??;
    }
    Ok(kept.len())
}
