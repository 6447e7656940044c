//! hyper's way of making a try ([`HyperTries`]): a moved session's kept requests replayed
//! first (`session_replay`'s step), the request sent through the pooled hyper client with the try's timeout, the outcome
//! recorded on the member, and a failure classified (connect, DNS, TLS, reset, timeout, or the
//! client's body).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use rondo_core::wire::VIEW_ID_HEADER;
use rondo_core::{Failover, FailureKind, Outcome, Route};
use rondo_runtime::pools::connect_time::ConnectTime;
use rondo_runtime::{ClusterRt, clock};

use super::grpc::GrpcCall;
use super::request::Prepared;
use super::respond::{Served, respond};
use super::retry::StatusRetry;
use super::send::Unsent;
use crate::chain::replay::{self, Sent};
use crate::chain::{Applied, TRACEPARENT};
use crate::http::{Begun, Choice, HttpCtx, Tries, record_response};

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
    /// Answers declined for their status (`retry_on`), for any other request.
    pub(super) status: StatusRetry,
    /// The access log's line, which notes each try's time.
    pub(super) start: &'a mut Option<crate::access::Start>,
}

impl Tries for HyperTries<'_> {
    /// A plain request without a body or with one read whole before the first try
    /// (`retry::hedged_body`); gRPC calls and upgrades are never hedged (they carry state of
    /// their own per try), nor a body that streams (it can be read once).
    fn hedgeable(&self) -> bool {
        self.grpc.is_none()
            && self.req.client_upgrade.is_none()
            && self.req.slot.as_ref().is_none_or(|s| s.whole_body().is_some())
    }

    fn attempt_shared(
        &self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> impl Future<Output = Result<Response<ProxyBody>, Kind>> {
        let on = (self.ctx, self.conn, self.route);
        async move {
            let tried = attempt(on, rt, choice, &self.req, &mut None, failover).await;
            // A whole body (or none): the slot stays as it is for every try.
            let mut slot = self.req.slot.clone();
            self.status.answered(tried?, (self.req.idempotent, &mut slot), rt, failover).await
        }
    }

    type Response = Response<ProxyBody>;
    type Headers = http::HeaderMap;

    fn headers(&self) -> &http::HeaderMap {
        &self.req.parts.headers
    }

    fn replayable(&self) -> bool {
        self.req.replayable()
    }

    fn about(&self) -> Option<crate::otel::About<'_>> {
        let parts = &self.req.parts;
        let host = parts.uri.authority().map(|a| a.as_str());
        let host = host.or_else(|| parts.headers.get(http::header::HOST)?.to_str().ok());
        // The head carries the filters' edits: a trace `request_id` started is no parent.
        let own_parent = self.req.applied.as_deref().is_some_and(Applied::trace_started);
        let method = parts.method.as_str();
        Some(crate::otel::About { method, path: parts.uri.path(), host, own_parent })
    }

    fn status(&self, resp: &Response<ProxyBody>) -> Option<u16> {
        Some(resp.status().as_u16())
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
        if failover.tries() > 1 {
            crate::http::pause(rt, failover).await;
        }
        let on = (self.ctx, self.conn, self.route);
        // The client's upgrade goes with the answer that takes it, and stays for a next try
        // otherwise.
        let mut upgrade = self.req.client_upgrade.take();
        let began = Instant::now();
        let Some(grpc) = &mut self.grpc else {
            StatusRetry::before(&mut self.req, rt);
            let tried = attempt(on, rt, choice, &self.req, &mut upgrade, failover).await;
            self.req.client_upgrade = upgrade;
            note_try(self.start, began, &tried);
            let req = (self.req.idempotent, &mut self.req.slot);
            return self.status.answered(tried?, req, rt, failover).await;
        };
        grpc.before(&mut self.req, rt, failover);
        let tried = attempt(on, rt, choice, &self.req, &mut upgrade, failover).await;
        self.req.client_upgrade = upgrade;
        note_try(self.start, began, &tried);
        let resp = tried?;
        let resp = grpc.answered(resp, &mut self.req, rt)?;
        // A call with a deadline ends by it, however far its answer has streamed.
        Ok(match grpc.deadline {
            Some(_) => {
                let left = failover.deadline().since(clock::now());
                resp.map(|body| body.deadline(left))
            }
            None => resp,
        })
    }
}

/// Notes a try begun at `began` in the access log's line: its `try_ms`, and its `connect_ms`
/// when its answer came on a connection hyper's pool opened while the try waited.
fn note_try(
    start: &mut Option<crate::access::Start>,
    began: Instant,
    tried: &Result<Response<ProxyBody>, Kind>,
) {
    if let Some(start) = start {
        start.tried(began.elapsed());
        start.connected(None);
        let opened =
            tried.as_ref().ok().and_then(|r| ConnectTime::opened_during(r.extensions(), began));
        if opened.is_some() {
            start.connected(opened);
        }
    }
}

/// One try on the member `choice` placed it on: sent with the try's timeout, its outcome
/// recorded on the member; the member's answer goes on to [`respond`] (taking the client's
/// `upgrade`, if any), a failure comes back classified. Through a shared borrow of the request,
/// so that hedged tries run side by side.
async fn attempt(
    (ctx, conn, route): (&HttpCtx, &Arc<ConnState>, &Route),
    rt: &Arc<ClusterRt>,
    mut choice: Choice,
    req: &Prepared,
    upgrade: &mut Option<hyper::upgrade::OnUpgrade>,
    failover: &Failover,
) -> Result<Response<ProxyBody>, Kind> {
    let member = choice.member;
    // Ends the request on the member as cancelled if this future is dropped (the client went
    // away) before an outcome is recorded.
    let begun = Begun::new(rt, member);
    // Session replay: a session that moved to this member gets its kept requests first.
    let applied = req.applied.as_deref();
    let session =
        match replay::before_try(applied, ctx, route, rt, member, &req.parts.headers, failover)
            .await
        {
            Ok(session) => session,
            Err(latency) => {
                begun.end(Outcome::Failure { kind: FailureKind::Reset, latency });
                return Err(Kind::Replay);
            }
        };
    let traceparent = choice.traceparent.take();
    // The try's time and its latency start as it is sent (the pick, a session sweep and a wait
    // for the cluster's lock are not the member's), and the try ends by the request's deadline.
    let started = Instant::now();
    let per_try = failover.try_timeout(clock::from_std(started));
    let failed = |kind: FailureKind| Outcome::Failure { kind, latency: started.elapsed() };
    let make = |r: &Prepared| member_request(ctx, rt, member, r, traceparent.clone());
    let sent = super::send::send(ctx, conn, rt, req, make);
    let mut resp = match tokio::time::timeout(per_try, sent).await {
        // hyper reads any three digits; RFC 9110 section 15 knows 100-599 only. A member that
        // says otherwise is broken: a failure, never passed on.
        Ok(Ok(Ok(resp))) if resp.status().as_u16() <= 599 => resp,
        Ok(Ok(Ok(_))) => {
            begun.end(failed(FailureKind::Reset));
            return Err(Kind::BadStatus);
        }
        Ok(Err(Unsent::Tls(why))) => {
            begun.end(failed(FailureKind::Connect));
            return Err(Kind::Tls(why));
        }
        Ok(Err(Unsent::Breaker(b))) => {
            // The cluster's own limit, not the member's failure.
            begun.end(Outcome::Cancelled);
            return Err(Kind::Breaker(b));
        }
        Ok(Ok(Err(e))) => {
            let (charged, kind) = classify(&e, req.slot.as_ref());
            begun.end(charged.map_or(Outcome::Cancelled, failed));
            return Err(kind);
        }
        Err(_elapsed) if req.slot.as_ref().is_some_and(BodySlot::stalled_by_client) => {
            // The try waited on the client's body, not on the member: 408, and the member is
            // not charged.
            begun.end(Outcome::Cancelled);
            return Err(Kind::ClientBodyTimeout);
        }
        Err(_elapsed) => {
            begun.end(failed(FailureKind::Timeout));
            return Err(Kind::Timeout);
        }
    };
    let latency = started.elapsed();
    let status = resp.status().as_u16();
    let applied = req.applied.as_deref();
    crate::chain::login::on_response(applied, ctx, route, status, resp.headers_mut());
    if let Some(session) = session {
        let sent = Sent {
            parts: &req.parts,
            path_and_query: &req.path_and_query,
            slot: req.slot.as_ref(),
        };
        session.answered(ctx, route, rt, member, sent, resp.headers_mut());
    }
    let counted = record_response(rt, &route.name, member, status, latency.as_secs_f64());
    begun.disarm();
    let served = Served { counted, slot: req.slot.clone(), tries: failover.tries() };
    let mut resp = respond(conn, route, rt, choice, upgrade.take(), resp, latency, served);
    if let Some(id) = crate::http::view_id_of(&ctx.live, rt) {
        resp.headers_mut().insert(VIEW_ID_HEADER, http::HeaderValue::from(id));
    }
    // A SOAP message is converted back first: compression then works on what the client reads.
    // Boxed: a rare filter's conversion would take room in every try's future (and a request's
    // future past a few kilobytes is copied byte by byte into its box).
    if let Some(plan) = req.applied.as_ref().and_then(|a| a.soap) {
        resp = Box::pin(super::soap::response(resp, plan, route)).await;
    }
    if let Some(applied) = req.applied.as_deref() {
        edited((ctx, route, rt, member), applied, &mut resp);
    }
    Ok(resp)
}

/// The filters' response edits and compression on the member's answer.
fn edited(
    (ctx, route, rt, member): (&HttpCtx, &Route, &ClusterRt, usize),
    applied: &Applied,
    resp: &mut Response<ProxyBody>,
) {
    if applied.edits_response() {
        applied.response(&rt.spec.members[member].name).apply(resp.headers_mut());
    }
    crate::chain::compress_response(applied, &route.name, &ctx.live.metrics, resp);
}

/// Whose fault hyper's error `e` for a try was, given the request's body `slot`: the failure
/// the member is charged with (`None`: not charged, the client's body or the router's limit
/// failed), and the try's failure.
fn classify(
    e: &rondo_runtime::pools::SendError,
    slot: Option<&BodySlot>,
) -> (Option<FailureKind>, Kind) {
    if caused_by::<TooLarge>(e) {
        return (None, Kind::BodyTooLarge);
    }
    if caused_by::<BodyStalled>(e) || slot.is_some_and(BodySlot::stalled) {
        // No byte of the client's body for `body_read_timeout_ms`: 408.
        return (None, Kind::ClientBodyTimeout);
    }
    if caused_by::<ClientBodyError>(e) || slot.is_some_and(BodySlot::failed_by_client) {
        // The client's body failed (aborted mid-way): not the member's fault.
        return (None, Kind::ClientBody);
    }
    if e.is_connect() {
        let kind = match crate::upstream::tls_failure(e) {
            Some(why) => Kind::Tls(why),
            None if is_dns_failure(e) => Kind::Resolve,
            None => Kind::Connect,
        };
        return (Some(FailureKind::Connect), kind);
    }
    // A TLS 1.3 member refuses the router's certificate (or its lack of one) only after the
    // handshake: the refusal arrives as the request's error.
    (Some(FailureKind::Reset), crate::upstream::tls_failure(e).map_or(Kind::Reset, Kind::Tls))
}

/// The request as hyper's client sends it to `member`: the prepared head, and the body from its
/// slot under the listener's body limit and read timeout.
fn member_request(
    ctx: &HttpCtx,
    rt: &ClusterRt,
    member: usize,
    req: &Prepared,
    traceparent: Option<http::HeaderValue>,
) -> Request<UpstreamBody> {
    let body = match &req.slot {
        None => UpstreamBody::Empty,
        Some(slot) => {
            let (limit, stall) = (ctx.listener.max_body_bytes, ctx.listener.body_read_timeout);
            UpstreamBody::stream(slot.clone(), limit, Some(stall))
        }
    };
    let parts = &req.parts;
    let mut request = crate::upstream::request(
        &parts.method,
        &parts.headers,
        rt,
        member,
        &req.path_and_query,
        body,
    );
    // Each try is a span of its own in the request's trace (the traced try's, `[tracing]`, else
    // `request_id`'s).
    let span = traceparent.or_else(|| req.applied.as_deref().and_then(Applied::next_span));
    if let Some(span) = span {
        request.headers_mut().insert(TRACEPARENT, span);
    }
    request
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
