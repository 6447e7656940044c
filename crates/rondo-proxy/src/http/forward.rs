//! The forward stage ([`forward`]): a request's tries through the core's failover driver, made
//! by a codec's way of trying ([`Tries`]); placing each try on a member ([`place`]: session, hash key or the
//! cluster's picker); the guard of a try's accounting ([`Begun`]); and the error of a request
//! that ran out of tries.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use rondo_core::failover::{Placement, TryMaker, drive};
use rondo_core::{Failover, Granularity, HashKeySource, Outcome, Route, Stop, TryFailure};
use rondo_runtime::{ClusterRt, Placed, Refused, Snapshot, clock};

use super::{Failure, HttpCtx, on_route};
use crate::access::Reason;

use crate::error::{Attempt, Breaker, Kind, ProxyError, Side};
use crate::head::Headers;
use crate::sticky;

/// One path's way of trying a request on a member: hyper's ([`Prepared`]) or the router's own
/// HTTP/1 path's. [`forward`] runs the core's failover driver over it.
pub(crate) trait Tries {
    /// What a successful try gives.
    type Response;
    /// The request's header fields (sessions, hash keys).
    type Headers: Headers;
    /// The request's header fields.
    fn headers(&self) -> &Self::Headers;
    /// Whether the request can still be sent again (no try has consumed its body).
    fn replayable(&self) -> bool;
    /// The request's own deadline, when it sets one (gRPC's `grpc-timeout`): the route's
    /// `request_timeout` still bounds it.
    fn deadline(&self) -> Option<std::time::Duration> {
        None
    }
    /// Now, on the core's clock: the wall clock for requests (a replay of recorded scenarios,
    /// [`crate::replay`], gives the scenario's time).
    fn now(&self) -> rondo_core::Instant {
        clock::now()
    }
    /// Now, for the request's first placement: a path that read the clock as the request
    /// arrived gives that reading (microseconds earlier, and one reading fewer per request).
    fn first_now(&self) -> rondo_core::Instant {
        self.now()
    }
    /// The request as its server span names it, when its tries are traced (`[tracing]`); a
    /// multicast copy or a replayed scenario is not.
    fn about(&self) -> Option<crate::otel::About<'_>> {
        None
    }
    /// The status of a member's answer, for the try's span, when the path knows it.
    fn status(&self, _: &Self::Response) -> Option<u16> {
        None
    }
    /// One try on the member `choice` placed it on, within the try's timeout from `failover`;
    /// the member's answer, or the failure classified.
    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> Result<Self::Response, Kind>;
    /// Whether tries of this request can run side by side ([`Tries::attempt_shared`]), for
    /// hedging: `false` unless the codec says so.
    fn hedgeable(&self) -> bool {
        false
    }
    /// A try made through a shared borrow, so that hedged tries run side by side (called only
    /// when [`Tries::hedgeable`]).
    fn attempt_shared(
        &self,
        _rt: &Arc<ClusterRt>,
        _choice: Choice,
        _failover: &Failover,
    ) -> impl Future<Output = Result<Self::Response, Kind>> {
        std::future::ready(Err(Kind::NoEligible))
    }
}

/// Stage 3: the failover. The core's driver ([`drive()`]) decides where each try goes and
/// whether a failed one may go elsewhere; [`Course`] only carries its decisions out.
///
/// The course is set up before the future is made, which holds only it and the driver (an
/// `async fn` would keep its arguments as well: room in every request's future).
pub(crate) fn forward<'a, T: Tries>(
    ctx: &'a HttpCtx,
    snapshot: &'a Snapshot,
    peer: SocketAddr,
    route: &'a Route,
    idempotent: bool,
    req: &'a mut T,
) -> impl Future<Output = Result<T::Response, Failure>> + 'a {
    // One clock reading per turn of the driver: the request's start serves its first
    // placement, the reading after a failed try both that failure and the next placement
    // (microseconds apart, each was a reading of its own).
    let now = req.first_now();
    let clusters = 1 + route.backups.len();
    let timeout = req.deadline().map_or(route.request_timeout, |d| d.min(route.request_timeout));
    let mut failover = Failover::new(clusters, idempotent, now, timeout);
    let primary = super::split::primary(ctx, snapshot, route, req.headers());
    // The one look at tracing a request of an untraced listener makes.
    let trace = match &ctx.tracer {
        None => None,
        Some(t) => req.about().map(|about| Box::new(t.request(req.headers(), about, route, peer))),
    };
    let mut course = Course {
        ctx,
        snapshot,
        peer,
        route,
        req,
        primary,
        attempts: Vec::new(),
        trace,
        idempotent,
    };
    async move {
        let ended = match drive(&mut course, &mut failover, now).await {
            Ok(ended) => ended,
            Err(stop) => Err(gave_up(course.route, std::mem::take(&mut course.attempts), stop)),
        };
        if let Some(trace) = course.trace.take() {
            match &ended {
                Ok(resp) => trace.end(course.req.status(resp), None),
                Err((e, _)) => trace.end(Some(e.kind.status().as_u16()), Some(e.kind)),
            }
        }
        ended
    }
}

/// One request's tries as the core's failover driver makes them: each placed by [`place`] in
/// the cluster the driver names (the first from the route's split, [`super::split`]) and made
/// by the path's [`Tries`], every failure recorded.
struct Course<'a, T> {
    ctx: &'a HttpCtx,
    snapshot: &'a Snapshot,
    peer: SocketAddr,
    route: &'a Route,
    req: &'a mut T,
    /// The request's primary cluster (drawn from the route's split, if it has one).
    primary: super::split::Primary<'a>,
    attempts: Vec<Attempt>,
    /// The request's spans, when it is traced (boxed: a pointer's room in untraced requests).
    trace: Option<Box<crate::otel::ReqTrace>>,
    /// Whether the request's method is idempotent (hedging).
    idempotent: bool,
}

/// A placed try: its cluster, by name and run-time state, and where in it the try went.
struct Underway<'a> {
    cluster: &'a String,
    rt: &'a Arc<ClusterRt>,
    choice: Choice,
}

impl<'a, T: Tries> TryMaker for Course<'a, T> {
    type Placed = Underway<'a>;
    /// The try's cluster, by name and run-time state, and its member.
    type Held = (&'a String, &'a Arc<ClusterRt>, usize);
    type Tried = Result<T::Response, Kind>;
    /// The member's answer, or the request's own failure (no member is to blame and none can
    /// do better: the request ends there).
    type Value = Result<T::Response, Failure>;

    fn now(&mut self) -> rondo_core::Instant {
        self.req.now()
    }

    fn place(
        &mut self,
        i: usize,
        failover: &mut Failover,
        now: rondo_core::Instant,
    ) -> Placement<Underway<'a>> {
        let route = self.route;
        let cluster = self.primary.cluster(route, i);
        let Some(rt) = self.snapshot.clusters.get(cluster) else {
            return Placement::NoEligible;
        };
        let metrics = &self.ctx.live.metrics;
        match place(self.ctx, rt, failover, self.req.headers(), self.peer, now) {
            Ok(choice) => {
                if failover.tries() > 1 {
                    metrics.retry(&route.name, cluster);
                }
                let traceparent = match &mut self.trace {
                    None => None,
                    Some(t) => {
                        t.try_begins(cluster, &rt.spec.members[choice.member], failover.tries())
                    }
                };
                let split_cookie = self.primary.cookie(i);
                let choice = Choice { split_cookie, traceparent, ..choice };
                Placement::Placed(Underway { cluster, rt, choice })
            }
            Err(Refused::Stop(stop)) => {
                tracing::warn!(route = %route.name, cluster = %cluster, "retry budget exhausted");
                metrics.budget_exhausted(&route.name, cluster);
                Placement::Stop(stop)
            }
            Err(Refused::NoEligible(e)) => {
                tracing::debug!(route = %route.name, error = %e, "no member");
                let outcome = match crate::error::Breaker::of(&e) {
                    Some(b) => {
                        metrics.breaker(cluster, b.as_str());
                        Kind::Breaker(b)
                    }
                    None => Kind::NoEligible,
                };
                self.attempts.push(Attempt {
                    cluster: cluster.clone(),
                    member: None,
                    outcome,
                    expected: None,
                });
                Placement::NoEligible
            }
        }
    }

    fn hold(&mut self, placed: &Underway<'a>) -> Self::Held {
        (placed.cluster, placed.rt, placed.choice.member)
    }

    fn attempt(
        &mut self,
        placed: Underway<'a>,
        failover: &mut Failover,
    ) -> impl Future<Output = Result<T::Response, Kind>> {
        // A cluster with `retry.hedge`, for a request the core lets hedge, on its first try.
        let retry = &placed.rt.spec.policy.retry;
        let hedge = retry.hedge.filter(|h| {
            failover.tries() == 1
                && h.applies(self.idempotent, retry.non_idempotent, self.req.hedgeable())
        });
        match hedge {
            None => super::hedge::OneOf::Plain {
                f: self.req.attempt(placed.rt, placed.choice, failover),
            },
            Some(hedge) => {
                let (ctx, peer, rt, req) = (self.ctx, self.peer, placed.rt, &*self.req);
                let (first, cluster, trace) = (placed.choice, placed.cluster, &mut self.trace);
                super::hedge::OneOf::Hedged {
                    f: Box::pin(async move {
                        // What each try reads of the engine (its timeout): the first try's
                        // view, so that a hedge is not paused as a retry would be.
                        let view = failover.clone();
                        let launch = |c: Choice| req.attempt_shared(rt, c, &view);
                        // A traced request's hedge has a span of its own beside the first's.
                        let place = |f: &mut Failover, now| {
                            let c = place(ctx, rt, f, req.headers(), peer, now).ok()?;
                            let Some(t) = trace.as_deref_mut() else { return Some(c) };
                            let traceparent = t.hedge_begins(cluster, &rt.spec.members[c.member]);
                            Some(Choice { traceparent, ..c })
                        };
                        let on = (&**rt, &*ctx.live.metrics);
                        let now = || req.now();
                        let (tried, winner) =
                            super::hedge::race(on, first, failover, hedge, now, (place, launch))
                                .await;
                        if let Some(t) = trace.as_deref_mut() {
                            t.hedges_end(winner);
                        }
                        tried
                    }),
                }
            }
        }
    }

    fn judge(
        &mut self,
        (cluster, rt, member): Self::Held,
        tried: Result<T::Response, Kind>,
    ) -> Result<Self::Value, TryFailure> {
        let route = self.route;
        let kind = match tried {
            Ok(resp) => {
                if let Some(t) = &mut self.trace {
                    t.try_answered(self.req.status(&resp));
                }
                return Ok(Ok(resp));
            }
            Err(kind) => kind,
        };
        if let Some(t) = &mut self.trace {
            t.try_failed(kind);
        }
        if kind.side() == Side::Client {
            // The request's own failure: no member is to blame and none can do better.
            let listener = &self.ctx.listener;
            let detail = match kind {
                Kind::BodyTooLarge => {
                    format!("request body over the limit of {} bytes", listener.max_body_bytes)
                }
                Kind::ClientBodyTimeout => format!(
                    "the request body did not arrive in time (no byte for body_read_timeout_ms, \
                     {} ms, or the route's request_timeout_ms ran out)",
                    listener.body_read_timeout.as_millis()
                ),
                _ => "the request body broke off before it was complete".to_owned(),
            };
            return Ok(Err(on_route(route, kind, detail)));
        }
        let name = &rt.spec.members[member].name;
        tracing::debug!(route = %route.name, cluster = %cluster, member = %name, ?kind, "attempt failed");
        if let Kind::Tls(why) = kind {
            self.ctx.live.metrics.tls_member_failure(cluster, name, why);
        }
        if let Kind::Breaker(b) = kind {
            // `max_connections` or `max_pending`: the cluster's own limit, which another of its
            // members would meet as well.
            self.ctx.live.metrics.breaker(cluster, b.as_str());
        }
        self.attempts.push(Attempt {
            cluster: cluster.clone(),
            member: Some(name.clone()),
            outcome: kind,
            expected: crate::error::expected_name(kind, rt, member),
        });
        Err(TryFailure {
            // A replay that failed sent the member the session's kept requests, not this one.
            reached: !matches!(kind, Kind::Connect | Kind::Resolve | Kind::Tls(_) | Kind::Replay),
            member_failed: kind.is_retryable() && !matches!(kind, Kind::Breaker(_)),
            replayable: self.req.replayable(),
            // A cluster with `retry_non_idempotent` sends a request that reached a member on
            // as if its member had declined it (whatever the method; the body is kept for it).
            declined: kind == Kind::Declined || rt.spec.policy.retry.non_idempotent,
        })
    }
}

/// The pause before the try `failover` is about to make on `rt`, when it is a retry and the
/// cluster has a `backoff`.
pub(crate) fn backoff(rt: &ClusterRt, failover: &Failover) -> Option<std::time::Duration> {
    let retry = failover.tries().checked_sub(1).filter(|n| *n > 0)?;
    let policy = &rt.spec.policy.retry;
    policy.backoff?;
    let d = policy.backoff_delay(retry, &mut crate::entropy::Local);
    (!d.is_zero()).then_some(d)
}

/// Waits out `rt`'s backoff before a retry, at the start of a codec's try (called only for a
/// request's later tries; boxed, so a try's future keeps a pointer's room for it, not a timer's).
pub(crate) async fn pause(rt: &ClusterRt, failover: &Failover) {
    if let Some(d) = backoff(rt, failover) {
        Box::pin(tokio::time::sleep(d)).await;
    }
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
    .or_else(|| attempts.iter().map(|a| a.outcome).find(|k| matches!(k, Kind::Breaker(_))))
    .unwrap_or(Kind::NoEligible);
    let mut detail = match kind {
        Kind::Timeout => "member too slow: no response in time".to_owned(),
        Kind::NoEligible => "no eligible member to serve the request".to_owned(),
        Kind::Breaker(b) => format!(
            "circuit breaker open: the cluster is at its {} ({})",
            b.as_str(),
            match b {
                Breaker::MaxRequests | Breaker::MaxRequestsPerMember => "requests in flight",
                Breaker::MaxConnections => "no member connection came free within connect_timeout",
                Breaker::MaxPending => "requests waiting for a member connection",
            }
        ),
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

/// Where a try went, and the session cookie its response must carry.
pub(crate) struct Choice {
    pub(crate) member: usize,
    pub(crate) set_cookie: Option<HeaderValue>,
    /// The route's split cookie, when this try's cluster was drawn for a session
    /// ([`super::split`]).
    pub(crate) split_cookie: Option<HeaderValue>,
    /// Why this member (for the access log).
    pub(crate) reason: Reason,
    /// The `traceparent` naming this try's span, when the request is traced (`[tracing]`).
    pub(crate) traceparent: Option<HeaderValue>,
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
            return Ok(Choice {
                member: m,
                set_cookie,
                split_cookie: None,
                reason: Reason::Session,
                traceparent: None,
            });
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
    Ok(Choice { member, set_cookie, split_cookie: None, reason, traceparent: None })
}

pub(crate) fn hash_key(
    source: &HashKeySource,
    headers: &impl Headers,
    peer: SocketAddr,
) -> Option<u64> {
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
