//! One request on the own path, as the shared stages run it: [`OwnTries`] routes the parsed
//! head ([`crate::http::find_route`]), declines to hyper what is hyper's, gates it (`auth`),
//! prepares the head members get, and hands itself to the one failover loop
//! ([`crate::http::forward`]) as a [`Tries`]: each `attempt` places the try's accounting and its
//! timeout around an exchange with a member ([`super::exchange`]). A request the router answers
//! itself (no route, a refusal, tries run out) is answered here (`fail`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rondo_core::failover::is_idempotent_method;
use rondo_core::{Failover, FailureKind, Outcome, Route, UpstreamProtocol};
use rondo_runtime::metrics::Handoff;
use rondo_runtime::{ClusterRt, Snapshot, clock};
use tokio::io::AsyncWriteExt;

use super::chunked::Chunked;
use super::client::{Client, ClientStream, Next, ReqBody, wait_before};
use super::parse::{self, Field, Framing, RequestHead};
use super::pool;
use super::write::{self, local_head, write_request_head};
use crate::access::{self, Extra, Reason};
use crate::body::Finish;
use crate::chain::{Answer, Applied, Chain, Info, Stopped, gate};
use crate::error::Kind;
use crate::head::Headers;
use crate::headers::has_looped;
use crate::http::{
    Begun, Choice, ClusterView, Decided, Failure, HttpCtx, Target, Tries, find_route, forward,
    looped, needs_hyper, on_route, without_port,
};

/// A parsed request head over its buffer: the stages' view of its header fields.
struct OwnHead<'a> {
    buf: &'a [u8],
    fields: &'a [Field],
}

impl Headers for OwnHead<'_> {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |f| f.name.get(self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(self.buf))
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.name.get(self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(self.buf))
    }
}

/// A request on the own path, with what its tries need.
pub(super) struct OwnTries<'a, S> {
    pub(super) ctx: &'a Arc<HttpCtx>,
    pub(super) c: &'a mut Client<S>,
    /// The connection's timer, for the tries' timeouts (taken while a try runs).
    pub(super) timer: Option<std::pin::Pin<&'a mut tokio::time::Sleep>>,
    pub(super) buf: Vec<u8>,
    pub(super) head: RequestHead,
    pub(super) body: ReqBody,
    /// The head (and a body wholly in the buffer) as members get it.
    pub(super) out: Vec<u8>,
    /// Bytes read from the client past the end of the body (the next request's start).
    pub(super) extra: Vec<u8>,
    pub(super) route: Option<&'a Route>,
    pub(super) start: Option<access::Start>,
    /// When the request's head was read (`rondo_downstream_request_duration_seconds`).
    pub(super) arrived: Instant,
    /// Whether the connection must close after this request.
    pub(super) close: bool,
    /// The client closed its connection while its request was in flight.
    pub(super) gone: bool,
    /// Whether the method is idempotent (a pooled connection found closed may be replaced).
    pub(super) idempotent: bool,
    /// The request target with its path normalized, when that changed it (members get this).
    pub(super) target: Option<String>,
    /// The `Host` value without its port (members get it as `X-Forwarded-Host`).
    pub(super) host: parse::Span,
    /// What the route's filter chain made of the request.
    /// Boxed: a few hundred bytes that every request's future would carry (and move) even on
    /// routes without filters, and that pushed it past the allocator's small-block cache.
    pub(super) applied: Option<Box<Applied>>,
    /// The status of the last member answer a try passed on (for its span, `[tracing]`).
    pub(super) answered: u16,
}

impl<'a, S: ClientStream> OwnTries<'a, S> {
    pub(super) fn new(
        ctx: &'a Arc<HttpCtx>,
        c: &'a mut Client<S>,
        timer: std::pin::Pin<&'a mut tokio::time::Sleep>,
        buf: Vec<u8>,
        head: RequestHead,
    ) -> Self {
        let body = ReqBody {
            framing: head.framing,
            in_buf: 0,
            complete: true,
            touched: false,
            remaining: 0,
            chunked: None,
            received: 0,
        };
        let start = ctx.access.as_ref().map(|log| {
            let method = std::str::from_utf8(head.method.get(&buf)).unwrap_or("");
            let target = std::str::from_utf8(head.target.get(&buf)).unwrap_or("/");
            let extra = || {
                let headers = OwnHead { buf: &buf, fields: &head.fields };
                let host = Some(head.host.get(&buf)).filter(|h| !h.is_empty());
                let tls = c.tls.as_ref().map(|t| (t.version, t.sni.as_deref()));
                Extra::capture("HTTP/1.1", host, |n| headers.get(n), tls)
            };
            access::Start::from_head(c.peer, method, target).with_extra(extra, log)
        });
        c.served += 1;
        let close = head.close || c.spent(&ctx.listener.connections);
        OwnTries {
            ctx,
            c,
            timer: Some(timer),
            buf,
            head,
            body,
            out: pool::take(),
            extra: Vec::new(),
            route: None,
            target: None,
            host: parse::Span::default(),
            applied: None,
            start,
            arrived: Instant::now(),
            close,
            gone: false,
            idempotent: false,
            answered: 0,
        }
    }

    /// The stages, then the response the client gets.
    pub(super) async fn serve(&mut self, snapshot: &'a Snapshot) -> Next {
        match self.stages(snapshot).await {
            Ok(next) => next,
            Err(Decline) => {
                pool::disown();
                Next::Decline(std::mem::take(&mut self.buf))
            }
        }
    }

    async fn stages(&mut self, snapshot: &'a Snapshot) -> Result<Next, Decline> {
        // Routing and the filters' request phase are plain calls: their locals, borrowed, would
        // otherwise stay in this future (and be moved with it) through the tries.
        let route = match self.routed(snapshot)? {
            Ok(route) => route,
            // The router's own answer, boxed as the rare path it is (one await for every such
            // case: a value live across two would take its room beside the tries').
            Err(early) => {
                let answer = Box::pin(self.early(early));
                return Ok(answer.await);
            }
        };
        if self.applied.as_ref().is_some_and(|a| a.delay.is_some()) {
            // An injected delay (`fault`) holds the request before its first try.
            Box::pin(crate::chain::hold(self.applied.as_deref(), route)).await;
        }
        let (idempotent, peer) = (self.idempotent, self.c.peer);
        // One await for the router's answer, whatever failed (the head, or every try): each
        // await of it took room of its own.
        // (`if let`: its scrutinee is gone before the `else`, a `match`'s would live through
        // the tries.)
        let failure = if let Err(failure) = self.prepare(route) {
            failure
        } else {
            match forward(self.ctx, snapshot, peer, route, idempotent, self).await {
                Ok(next) => return Ok(next),
                // Nobody is left to answer.
                Err(_) if self.gone => return Ok(Next::Close),
                Err(failure) => failure,
            }
        };
        Ok(self.fail(failure).await)
    }

    /// The request routed, declined to hyper, or stopped: what [`OwnTries::stages`] does
    /// before the tries.
    fn routed(&mut self, snapshot: &'a Snapshot) -> Result<Result<&'a Route, Early<'a>>, Decline> {
        // The request line and the host are made text once each (the method and the target
        // are parts of the line, the path is the target's start, the host without its port is
        // kept for the head members get): every conversion checks its UTF-8 again.
        let buf = &self.buf;
        let (method, target) = request_line(buf, &self.head);
        self.idempotent = is_idempotent_method(method);
        let path_len = (self.head.path.end - self.head.path.start) as usize;
        let path = target.get(..path_len).unwrap_or(target);
        // Routes match, and members get, the normalized path (`/%6Frders` is `/orders`).
        self.target = rondo_core::path::normalize(path).map(|path| match target.split_once('?') {
            Some((_, query)) => format!("{path}?{query}"),
            None => path,
        });
        let full_host = text(buf, self.head.host);
        let host = without_port(full_host);
        self.host = parse::Span {
            start: self.head.host.start,
            end: self.head.host.start + host.len() as u32,
        };
        let headers = OwnHead { buf: &self.buf, fields: &self.head.fields };
        let found = if has_looped(&headers) {
            Err(looped())
        } else {
            let target = self.target.as_deref().unwrap_or(target);
            let (path, query) = match target.split_once('?') {
                Some((path, query)) => (path, Some(query)),
                None => (target, None),
            };
            let target = Target { host: Some(host), method, path, query };
            // A body that came whole with the head is there for body filters to read; any
            // other body makes a route that reads it hyper's (which reads it before routing).
            let after = &self.buf[self.head.len..];
            let body = match self.head.framing {
                Framing::None | Framing::Length(0) => Some(&after[..0]),
                Framing::Length(n) => usize::try_from(n).ok().and_then(|n| after.get(..n)),
                _ => None,
            };
            let body = body.map(|bytes| rondo_core::BodyPeek { bytes, complete: true });
            find_route(self.ctx, snapshot, &headers, target, body)
        };
        let route = match found {
            Ok(Decided::Route(routed)) if !needs_hyper(self.ctx, &routed) => routed.route,
            // Body filters, multicast copies, session replay and `compress` are hyper's path's.
            Ok(_) => {
                self.ctx.metrics.handoffs.inc(Handoff::Route);
                return Err(Decline);
            }
            Err(failure) => return Ok(Err(Early::Failed(failure))),
        };
        self.route = Some(route);
        let chain = Chain::of(self.ctx, route);
        // Members spoken to over TLS or HTTP/2, clusters that retry on an answer's status or
        // retry what is not idempotent (both keep the body to send again), clusters with
        // `max_connections` (counted in hyper's pools, where a request can wait for one) and
        // clusters that hedge (tries side by side) are hyper's: the whole connection goes there
        // before anything is sent.
        let plain = |name: &String| {
            snapshot.clusters.get(name).is_none_or(|rt| {
                let retry = &rt.spec.policy.retry;
                rt.tls.is_none()
                    && rt.spec.upstream_protocol != UpstreamProtocol::Http2
                    && retry.statuses.is_empty()
                    && !retry.non_idempotent
                    && rt.spec.policy.limits.max_connections.is_none()
                    && retry.hedge.is_none()
            })
        };
        let split = route.split.iter().map(|w| &w.cluster);
        if !plain(&route.cluster) || !route.backups.iter().chain(split).all(plain) {
            self.ctx.metrics.handoffs.inc(Handoff::Upstream);
            return Err(Decline);
        }
        self.c.idle = route.idle_timeout;
        // The route's filters (its `auth` among them): edits for the tries and the response,
        // or an answer of their own; they read the text made above.
        if let Some(chain) = chain {
            let target = self.target.as_deref().unwrap_or(target);
            let (path, query) = match target.split_once('?') {
                Some((path, query)) => (path, Some(query)),
                None => (target, None),
            };
            let info = Info {
                client_ip: self.c.ip.as_bytes(),
                method,
                tls: self.c.tls.is_some(),
                host: Some(host),
                authority: full_host,
                path,
                query,
            };
            let headers = OwnHead { buf, fields: &self.head.fields };
            let applied = match filters(chain, &info, &headers, (self.ctx, route), &mut self.start)
            {
                Ok(applied) => applied,
                Err(stopped) => return Ok(Err(Early::Stopped(route, stopped))),
            };
            if let Some(rewritten) = applied.target(query) {
                self.target = Some(rewritten);
            }
            self.applied = Some(applied);
        }
        Ok(Ok(route))
    }

    /// The answer to a request stopped before its tries: the router's (no route, a loop), a
    /// filter's own (after its delay, if one was drawn), or `auth`'s refusal.
    async fn early(&mut self, early: Early<'_>) -> Next {
        match early {
            Early::Failed(failure) => self.answer_failure(failure).await,
            Early::Stopped(route, stopped) => match *stopped {
                Stopped::Answered(answer, applied) => {
                    crate::chain::hold(Some(&applied), route).await;
                    self.answer(route, answer, &applied).await
                }
                Stopped::Refused(e, applied) => {
                    // The edits of the filters before `auth` apply to its refusal.
                    self.applied = Some(applied);
                    self.answer_failure((e, route.idle_timeout)).await
                }
            },
        }
    }

    /// The body limit and the body's start; the head as members get it.
    fn prepare(&mut self, route: &Route) -> Result<(), Failure> {
        let limit = self.ctx.listener.max_body_bytes;
        let after = &self.buf[self.head.len..];
        match self.body.framing {
            Framing::Length(n) => {
                if limit > 0 && n > limit {
                    self.close = true;
                    let detail = format!("request body over the limit of {limit} bytes");
                    return Err(on_route(route, Kind::BodyTooLarge, detail));
                }
                let have = (after.len() as u64).min(n);
                self.body.in_buf = have as usize;
                self.body.remaining = n - have;
                self.body.complete = self.body.remaining == 0;
            }
            Framing::Chunked => {
                let mut chunked = Chunked::new(self.ctx.listener.max_header_bytes as usize);
                match chunked.feed(after) {
                    Ok(n) => self.body.in_buf = n,
                    Err(e) => {
                        self.close = true;
                        return Err(on_route(route, Kind::ClientBody, e.to_string()));
                    }
                }
                self.body.complete = chunked.is_done();
                self.body.chunked = Some(chunked);
            }
            Framing::None | Framing::Close => {}
        }
        self.body.received = self.body.in_buf as u64;
        if limit > 0 && self.body.received > limit {
            self.close = true;
            let detail = format!("request body over the limit of {limit} bytes");
            return Err(on_route(route, Kind::BodyTooLarge, detail));
        }
        let mut out = std::mem::take(&mut self.out);
        let host = self.host.get(&self.buf);
        out.clear();
        let client = (self.c.ip.as_bytes(), self.c.tls.as_deref(), self.c.trusted);
        let target = self.target.as_deref().map(str::as_bytes);
        let head = (&self.head, target);
        let applied = self.applied.as_deref();
        let added = (applied.and_then(|a| a.identity.as_ref()), applied);
        write_request_head(&mut out, &self.buf, head, client, host, added);
        if self.body.complete {
            let start = self.head.len;
            out.extend_from_slice(&self.buf[start..start + self.body.in_buf]);
        }
        self.out = out;
        Ok(())
    }

    /// The router's own answer to a request it could not serve. Boxed: a rare path, whose state
    /// would take room in every request's future.
    fn fail(&mut self, failure: Failure) -> impl Future<Output = Next> {
        Box::pin(self.answer_failure(failure))
    }

    async fn answer_failure(&mut self, (e, idle): Failure) -> Next {
        self.c.idle = idle;
        let ctx = self.ctx;
        let status = e.kind.status().as_u16();
        ctx.metrics.router_response(status, e.route.as_deref(), e.cluster.as_deref());
        tracing::debug!(listener = %ctx.listener.name, error = %e, "request failed");
        let text = e.render(ctx.listener.error_detail);
        // The connection can carry another request only when this one's body is behind us.
        let close = self.close
            || ctx.drain.is_on()
            || self.c.spent(&ctx.listener.connections)
            || !self.body.complete
            || matches!(
                e.kind,
                Kind::BodyTooLarge | Kind::ClientBody | Kind::ClientBodyTimeout | Kind::BadRequest
            );
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let challenge;
        let extra: &[&str] = match e.kind {
            Kind::NoEligible | Kind::Breaker(_) => &["retry-after: 1"],
            Kind::Unauthorized(refusal) => {
                let value = refusal.challenge();
                challenge = [format!("www-authenticate: {}", value.to_str().unwrap_or("Bearer"))];
                &[challenge[0].as_str()]
            }
            _ => &[],
        };
        // The filters' response edits (a request id, HSTS) apply to the router's own answer too.
        let edits = self.applied.as_deref().filter(|a| a.edits_response()).map(|a| a.response(""));
        let alt_svc = ctx.alt_svc.as_ref();
        local_head(&mut out, status, text.len(), extra, edits.as_ref(), alt_svc, close);
        if !self.is_head() {
            out.extend_from_slice(text.as_bytes());
        }
        let written = self.c.stream.write_all(&out).await.is_ok();
        self.out = out;
        let route = e.route.as_deref().unwrap_or("");
        self.timed(route, status);
        if let (Some(log), Some(start)) = (&ctx.access, self.start.take()) {
            let line = access::Pending::failed(log, start, &e);
            line.finish(None, 0, Reason::None, self.body.received, text.len() as u64);
        }
        if close || !written { Next::Close } else { Next::KeepAlive }
    }

    /// A filter's own answer (a redirect, a direct response).
    async fn answer(&mut self, route: &Route, answer: Answer, applied: &Applied) -> Next {
        let ctx = self.ctx;
        self.c.idle = route.idle_timeout;
        ctx.metrics.router_response(answer.status, Some(&route.name), Some(&route.cluster));
        // The request's body was not read: the connection can carry no other request.
        let close = self.close
            || !self.body.complete
            || !matches!(self.head.framing, Framing::None | Framing::Length(0))
            || ctx.drain.is_on()
            || self.c.spent(&ctx.listener.connections);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let (edits, alt_svc) = (applied.response_edits(""), self.ctx.alt_svc.as_ref());
        write::answer_head(&mut out, &answer, &edits, alt_svc, close);
        // A 204 has no body (nor a length that would frame one).
        if !self.is_head() && answer.status != 204 {
            out.extend_from_slice(&answer.body);
        }
        let written = self.c.stream.write_all(&out).await.is_ok();
        self.out = out;
        self.timed(&route.name, answer.status);
        if let (Some(log), Some(start)) = (&ctx.access, self.start.take()) {
            let line = access::Pending::served(log, start, answer.status);
            line.finish(None, 0, Reason::None, 0, answer.body.len() as u64);
        }
        if close || !written { Next::Close } else { Next::KeepAlive }
    }

    /// Counts the router's own answer with `status` on `route` (`""`: none) in the
    /// client-facing durations (a member's answer is counted when its body ends).
    fn timed(&self, route: &str, status: u16) {
        let handles = self.ctx.live.metrics.downstream(&self.ctx.listener.name, route);
        handles.observe(status, self.arrived.elapsed().as_secs_f64());
    }

    pub(super) fn is_head(&self) -> bool {
        self.head.method.get(&self.buf) == b"HEAD"
    }
}

/// `stages` gave the request to hyper.
struct Decline;

/// A request [`OwnTries::routed`] stopped before its tries.
enum Early<'a> {
    /// The router answers it (no route, a loop).
    Failed(Failure),
    /// The route's filters stopped it.
    Stopped(&'a Route, Box<Stopped>),
}

/// The text of a span of a head (empty if it is not UTF-8, which the parser already refused).
/// The request phase of the route's filter chain, its request id noted for the access log.
fn filters(
    chain: &Chain,
    info: &Info<'_>,
    headers: &OwnHead<'_>,
    (ctx, route): (&HttpCtx, &Route),
    start: &mut Option<access::Start>,
) -> Result<Box<Applied>, Box<Stopped>> {
    let outcome = chain.request(info, headers, gate(ctx, route));
    if let Some(start) = start.as_mut() {
        let applied = match &outcome {
            Ok(applied) => applied,
            Err(stopped) => stopped.applied(),
        };
        start.set_request_id(applied.request_id());
    }
    outcome
}

fn text(buf: &[u8], span: parse::Span) -> &str {
    std::str::from_utf8(span.get(buf)).unwrap_or("")
}

/// The method and the target of `head`, from one conversion of the request line's start (the
/// parser's spans of both, with the space between).
fn request_line<'b>(buf: &'b [u8], head: &RequestHead) -> (&'b str, &'b str) {
    let (method, target) = (head.method, head.target);
    let line = text(buf, parse::Span { start: method.start, end: target.end });
    let part = |span: parse::Span| {
        let (start, end) =
            ((span.start - method.start) as usize, (span.end - method.start) as usize);
        line.get(start..end).unwrap_or("")
    };
    (part(method), part(target))
}

impl<S: ClientStream> Tries for OwnTries<'_, S> {
    type Response = Next;
    type Headers = Self;

    fn headers(&self) -> &Self {
        self
    }

    fn first_now(&self) -> rondo_core::Instant {
        clock::from_std(self.arrived)
    }

    fn about(&self) -> Option<crate::otel::About<'_>> {
        let method = std::str::from_utf8(self.head.method.get(&self.buf)).unwrap_or("");
        let target = std::str::from_utf8(self.head.target.get(&self.buf)).unwrap_or("/");
        let path = target.split_once('?').map_or(target, |(path, _)| path);
        // The client's own head: `request_id`'s trace is written into `out` only.
        Some(crate::otel::About { method, path, host: self.get_str("host"), own_parent: false })
    }

    fn status(&self, _: &Next) -> Option<u16> {
        (self.answered != 0).then_some(self.answered)
    }

    fn replayable(&self) -> bool {
        // A body streamed from the client (touched) is gone once sent, complete or not: only
        // one that came whole with the head is in the request buffer to send again.
        !self.body.touched
    }

    /// Boxed, once per try: a try's state (the exchange's and the respond stage's) is the bulk
    /// of a request's, and inline it made every request's future (boxed per request by
    /// [`super::conn`]) too large for the allocator's cache of small blocks, and moved with the
    /// failover driver's state. An `async` block, not an `async fn`: that keeps its arguments
    /// twice.
    #[allow(refining_impl_trait)]
    fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> std::pin::Pin<Box<impl Future<Output = Result<Next, Kind>>>> {
        let Choice { member, set_cookie, split_cookie, reason, traceparent } = choice;
        let cookies = [set_cookie, split_cookie];
        // The try's `traceparent` goes into the head now: held in the future across the pause,
        // it would take its room in every try's box.
        if let Some(span) = traceparent {
            // A traced request: this try's span, in place of whatever the head carried.
            write::set_traceparent(&mut self.out, span.as_bytes());
        } else if failover.tries() > 1
            && let Some(span) = self.applied.as_deref().and_then(Applied::next_span)
        {
            // Each try is a span of its own: the head's `traceparent` (of a fixed length) gets
            // this try's.
            write::replace_traceparent(&mut self.out, span.as_bytes());
        }
        Box::pin(async move {
            if failover.tries() > 1 {
                crate::http::pause(rt, failover).await;
            }
            let begun = Begun::new(rt, member);
            let started = Instant::now();
            let per_try = failover.try_timeout(clock::from_std(started));
            let Some(view) = ClusterView::of(rt) else {
                begun.end(Outcome::Cancelled);
                return Err(Kind::Connect);
            };
            let idle = &view.idle[member];
            let address = &rt.spec.members[member].address;
            // The exchange's state ends with this block: what it borrows would otherwise keep
            // its room beside the respond stage's.
            let (upstream, rbuf, rhead, early) = {
                let waiting_client = AtomicBool::new(false);
                // On the connection's timer (no `Timeout` of its own): taken, as the exchange borrows
                // all of `self`.
                let mut timer = self.timer.take();
                let end = tokio::time::Instant::from_std(started).checked_add(per_try);
                let exchange = self.exchange(idle, address, started, &waiting_client);
                let exchanged = match (timer.as_mut(), end) {
                    (Some(timer), Some(end)) => {
                        wait_before(timer.as_mut(), end, std::pin::pin!(exchange)).await
                    }
                    // Only if an earlier try of this request was dropped while it held the timer.
                    (None, Some(_)) => tokio::time::timeout(per_try, exchange).await.ok(),
                    (_, None) => Some(exchange.await),
                };
                self.timer = timer;
                // The try is over, failed or answered (its head arrived): its time is noted.
                if let Some(start) = self.start.as_mut() {
                    start.tried(started.elapsed());
                }
                let failed =
                    |kind: FailureKind| Outcome::Failure { kind, latency: started.elapsed() };
                match exchanged {
                    Some(Ok(x)) => x,
                    Some(Err(kind)) => {
                        begun.end(match kind {
                            Kind::Connect | Kind::Resolve => failed(FailureKind::Connect),
                            Kind::Reset | Kind::BadStatus => failed(FailureKind::Reset),
                            _ => Outcome::Cancelled,
                        });
                        return Err(kind);
                    }
                    None if waiting_client.load(Ordering::Relaxed) => {
                        // The try waited on the client's body, not on the member: 408, and the member
                        // is not charged.
                        begun.end(Outcome::Cancelled);
                        return Err(Kind::ClientBodyTimeout);
                    }
                    None => {
                        begun.end(failed(FailureKind::Timeout));
                        return Err(Kind::Timeout);
                    }
                }
            };
            let latency = started.elapsed();
            self.answered = rhead.status;
            let route = self.route.map_or("", |r| r.name.as_str());
            let latency_s = latency.as_secs_f64();
            let counted = crate::http::record_response(rt, route, member, rhead.status, latency_s);
            begun.disarm();
            let outcome = if rhead.status >= 500 {
                Outcome::Failure { kind: FailureKind::Status5xx, latency }
            } else {
                Outcome::Success { latency }
            };
            let (metrics, listener) = (&self.ctx.live.metrics, &self.ctx.listener.name);
            let histogram = counted.downstream(metrics, listener).class(rhead.status);
            let finish = Finish::default().request(rt.clone(), member, outcome);
            let finish = finish.downstream(histogram, self.arrived);
            let mut finish = finish.served(counted, None, failover.tries(), reason);
            if let (Some(log), Some(start)) = (&self.ctx.access, self.start.take()) {
                finish = finish.log(Some(access::Pending::served(log, start, rhead.status)));
            }
            if early {
                // The member answered before the whole body arrived: the rest is never read.
                self.close = true;
            }
            // The response's edits are written into its head as they are (taken out for the
            // respond stage, which borrows all of `self`, and put back for a next try).
            let applied = self.applied.take();
            let name = &rt.spec.members[member].name;
            let edits = applied.as_deref().filter(|a| a.edits_response());
            let edits = edits.map(|a| a.response_edits(name));
            let login = applied.as_deref().is_some_and(|a| a.login);
            let view_id = crate::http::view_id_of(&self.ctx.live, rt);
            let marks = (&cookies, login, view_id);
            let responded = self.respond(upstream, idle, rbuf, rhead, marks, edits, finish).await;
            self.applied = applied;
            responded
        })
    }
}

impl<S> Headers for OwnTries<'_, S> {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.head
            .fields
            .iter()
            .filter(move |f| f.name.get(&self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(&self.buf))
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.head
            .fields
            .iter()
            .find(|f| f.name.get(&self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(&self.buf))
    }
}
