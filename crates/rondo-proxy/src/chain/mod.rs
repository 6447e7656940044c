//! The filter chain: a route's traffic filters (`filters`, with its listener's before them),
//! compiled once per view into a [`Chain`] kept in the route's slot, and run in phases by both
//! codecs alike:
//!
//! ```text
//! request head → each try → response head → log
//! ```
//!
//! In the request phase ([`Chain::request`]) each filter continues, edits (header fields, the
//! path, the host: gathered in an [`Applied`]) or answers by itself (an [`Answer`]: a redirect,
//! a direct response). Each codec then writes the edits into the head members get, makes each
//! try's trace span ([`Applied::next_span`]) and edits the response head
//! ([`Applied::response`]) the client gets; the request id goes into the access log. A route
//! with no filter (and a listener without) has no chain: the codecs look at one `Option`.
//! Which fields the chain's steps drop and add is known when it is compiled (its table,
//! `table.rs`): a request carries only the values made for it, in one record, and the codecs
//! write the table's fields with them.
//!
//! The route's own features are steps too, after its filters: `auth` (among them, before the
//! route's filters), `multicast` (the copies, beside `mirror`'s), `session_replay` ([`replay`]:
//! before each try and at the member's answer) and `login` ([`login`]: at the response head).
//! The codecs hold the stages and ask the request's [`Applied`] what to do; none of them looks
//! at these route fields itself. A body filter's peek is not a step: it decides which route
//! (and so which chain) a request takes, so it belongs to the route stage.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use rondo_core::Route;
use rondo_core::traffic::{TrafficFilter, Var};

use crate::auth::Identity;
use crate::error::ProxyError;
use crate::head::Headers;
use crate::http::HttpCtx;

mod answer;
mod compress;
mod cors;
mod fault;
mod fields;
pub(crate) mod grpc_web;
mod headers;
mod limit;
pub(crate) mod login;
mod member;
mod mirror;
pub(crate) mod replay;
mod rewrite;
pub(crate) mod soap;
mod table;
mod trace;

pub(crate) use compress::respond as compress_response;
pub(crate) use fault::hold;
pub(crate) use fields::FieldOps;
pub use limit::Limits;
pub(crate) use table::ResponseEdits;

/// The W3C trace context's field, which each try gets anew ([`Applied::next_span`]).
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The port of a `Host` value (`host:port`, `[v6]:port`), if it names one. Looked for from
/// the end by hand (`rsplit_once` went through the generic searcher, for every request).
pub(crate) fn port_of(host: &str) -> Option<u16> {
    let colon = host.bytes().rposition(|b| b == b':' || b == b']')?;
    if host.as_bytes()[colon] == b']' { None } else { host[colon + 1..].parse().ok() }
}

/// A route's chain, compiled from its listener's filters and its own.
pub(crate) struct Chain {
    steps: Box<[Step]>,
    /// A filter transforms bodies: the request is hyper's path's.
    needs_hyper: bool,
    /// Each step's field edits, as compiled (most steps have none).
    edits: Box<[table::Edits]>,
    /// The steps' edits composed, for a request that stopped after `tables[i]` steps (the
    /// last: after all of them; `None`: no edits); `None` when the chain's edits are made per
    /// request ([`Chain::request`]).
    tables: Option<Box<[Option<Arc<table::Table>>]>>,
}

/// One compiled filter.
enum Step {
    /// The route's `auth`: the request's token checked, its identity kept for members.
    Auth,
    RequestId(trace::RequestIdStep),
    Headers(headers::HeaderStep),
    Rewrite(rewrite::RewriteStep),
    Redirect(rondo_core::traffic::Redirect),
    Respond(answer::RespondStep),
    Soap(rondo_core::traffic::Soap),
    RateLimit(limit::LimitStep),
    Fault(fault::FaultStep),
    Mirror(mirror::MirrorStep),
    Cors(cors::CorsStep),
    Compress(compress::CompressStep),
    GrpcWeb(rondo_core::traffic::GrpcWeb),
    /// The route's `multicast`: every request copied to its branches.
    Multicast(Box<[rondo_core::Branch]>),
    /// The route's `session_replay`: the request kept in its session's log ([`replay`]).
    SessionReplay(rondo_core::SessionReplay),
    /// The route's `login`: a member's `x-rondo-login` made a session cookie ([`login`]).
    Login,
    RedirectToMember(member::MemberRedirectStep),
}

impl Chain {
    /// `route`'s chain (its listener's filters first), compiled at its first request in this
    /// view and kept in the route's slot; `None` when neither has a filter.
    pub(crate) fn of<'r>(ctx: &HttpCtx, route: &'r Route) -> Option<&'r Chain> {
        if route.filters.is_empty()
            && ctx.listener.filters.is_empty()
            && route.auth.is_none()
            && !has_features(route)
        {
            return None;
        }
        let made = route.compiled.get_or_init(|| {
            let listener = ctx.listener.filters.iter().map(Some);
            // The route's `auth` gates its own filters; the listener's run first (a redirect
            // to https needs no token; a refused request's log line has its request id).
            let auth = route.auth.is_some().then_some(None);
            let own = route.filters.iter().map(Some);
            let limits = limit::Binder::new(&ctx.limits, &ctx.live, &ctx.listener, route);
            let mut chain =
                Chain::compile(listener.chain(auth).chain(own), route, &limits, &ctx.live);
            chain.bind(&ctx.live.metrics, &route.name);
            Arc::new(chain)
        });
        made.downcast_ref::<Chain>()
    }

    /// `None` among `filters` stands for the route's `auth`; a filter's position is its
    /// place among the listener's and the route's filters (what keeps a `rate_limit`'s buckets
    /// across views). The route's own features (`multicast`, `session_replay`, `login`) come
    /// last: none of them answers, and each acts on the request as the filters left it.
    fn compile<'f>(
        filters: impl Iterator<Item = Option<&'f TrafficFilter>>,
        route: &Route,
        limits: &limit::Binder<'_>,
        live: &Arc<rondo_runtime::Live>,
    ) -> Chain {
        let mut position = 0;
        let mut needs_hyper = false;
        let steps = filters
            .map(|f| match f {
                None => Step::Auth,
                Some(f) => {
                    position += 1;
                    needs_hyper |= f.needs_whole_bodies();
                    Self::step(f, route, limits, position - 1, live)
                }
            })
            .chain(features(route))
            .collect::<Box<[Step]>>();
        // Copies and replays hold the whole request as only hyper's path has it.
        needs_hyper |=
            steps.iter().any(|s| matches!(s, Step::Multicast(_) | Step::SessionReplay(_)));
        let mut next = 0;
        let edits = steps.iter().map(|s| s.edits(&mut next)).collect::<Box<[_]>>();
        // The steps that choose per request which fields they edit (`soap`, `grpc_web`,
        // `cors`) make a table impossible: then every step's edits are made per request.
        let per_request =
            steps.iter().any(|s| matches!(s, Step::Soap(_) | Step::GrpcWeb(_) | Step::Cors(_)));
        let tables = (!per_request).then(|| {
            let prefix = |i: usize| {
                let table = table::Table::of(edits[..i].iter());
                (!table.is_empty()).then(|| Arc::new(table))
            };
            (0..=steps.len()).map(prefix).collect()
        });
        Chain { steps, needs_hyper, edits, tables }
    }

    fn step(
        f: &TrafficFilter,
        route: &Route,
        limits: &limit::Binder<'_>,
        at: usize,
        live: &Arc<rondo_runtime::Live>,
    ) -> Step {
        match f {
            TrafficFilter::RequestId(r) => Step::RequestId(trace::RequestIdStep::new(r)),
            TrafficFilter::Headers(h) => Step::Headers(headers::HeaderStep::new(h)),
            TrafficFilter::Rewrite(r) => Step::Rewrite(rewrite::RewriteStep::new(r, route)),
            TrafficFilter::Redirect(r) => Step::Redirect(r.clone()),
            TrafficFilter::Respond(r) => Step::Respond(answer::RespondStep::new(r)),
            TrafficFilter::Soap(s) => Step::Soap(*s),
            TrafficFilter::RateLimit(r) => Step::RateLimit(limits.step(at, r)),
            TrafficFilter::Fault(f) => Step::Fault(fault::FaultStep::new(f)),
            TrafficFilter::Mirror(m) => Step::Mirror(mirror::MirrorStep::new(m)),
            TrafficFilter::Cors(c) => Step::Cors(cors::CorsStep::new(c)),
            TrafficFilter::Compress(c) => Step::Compress(compress::CompressStep::new(c)),
            TrafficFilter::GrpcWeb(g) => Step::GrpcWeb(*g),
            TrafficFilter::RedirectToMember(r) => {
                Step::RedirectToMember(member::MemberRedirectStep::new(r, live, &route.cluster))
            }
        }
    }

    /// Gives the steps that count what they do their route's metrics.
    fn bind(&mut self, metrics: &rondo_runtime::metrics::Metrics, route: &str) {
        for step in &mut self.steps {
            if let Step::Fault(s) = step {
                s.bind(metrics, route);
            }
        }
    }

    /// Whether a filter holds, rewrites or copies bodies (`compress`, `soap`, `mirror`), which
    /// only hyper's path does: the own path hands such a route's requests over.
    pub(crate) fn needs_hyper(&self) -> bool {
        self.needs_hyper
    }

    /// The request phase: every filter in order, until one answers or `auth` refuses. The
    /// edits gathered so far apply to an answer's head too (a request id, a response field).
    /// `auth` is the route's gate ([`gate`]).
    pub(crate) fn request<H: Headers>(
        &self,
        info: &Info<'_>,
        headers: &H,
        auth: impl Fn(&H) -> Result<Option<Identity>, ProxyError>,
    ) -> Result<Box<Applied>, Box<Stopped>> {
        let mut applied = Box::<Applied>::default();
        for (i, step) in self.steps.iter().enumerate() {
            let answer = match step {
                Step::Auth => match auth(headers) {
                    Ok(identity) => {
                        applied.identity = identity;
                        None
                    }
                    Err(e) => {
                        self.edited(i, &mut applied);
                        return Err(Box::new(Stopped::Refused(e, applied)));
                    }
                },
                Step::RequestId(s) => {
                    s.request(headers, &mut applied);
                    None
                }
                Step::Headers(s) => {
                    s.request(info, &mut applied);
                    None
                }
                Step::Rewrite(s) => {
                    s.request(info, &mut applied);
                    None
                }
                Step::Redirect(r) => Some(answer::redirect(r, info, &applied)),
                Step::Respond(s) => Some(s.answer()),
                Step::Soap(s) => {
                    soap::request(s, headers, &mut applied);
                    None
                }
                Step::RateLimit(s) => {
                    // Taken out for the call (the step edits `applied`), then put back.
                    let identity = applied.identity.take();
                    let subject = identity.as_ref().map(|i| i.subject.as_str());
                    let answer = s.request(info, subject, headers, &mut applied);
                    applied.identity = identity;
                    answer
                }
                Step::Fault(s) => s.request(headers, &mut applied),
                Step::Mirror(s) => {
                    s.request(&mut applied);
                    None
                }
                Step::Cors(s) => s.request(info, headers, &mut applied),
                Step::Compress(s) => {
                    s.request(info, headers, &mut applied);
                    None
                }
                Step::GrpcWeb(spec) => {
                    grpc_web::request(spec, headers, &mut applied);
                    None
                }
                Step::Multicast(branches) => {
                    applied.copies.extend(branches.iter().cloned());
                    applied.copies_whole = true;
                    None
                }
                Step::SessionReplay(limits) => {
                    applied.replay = Some(*limits);
                    None
                }
                Step::Login => {
                    applied.login = true;
                    None
                }
                Step::RedirectToMember(s) => Some(s.request(info, headers, &applied)),
            };
            if self.tables.is_none() && !self.edits[i].is_empty() {
                let Applied { record, request, response, .. } = &mut *applied;
                table::emit(&self.edits[i], record, request, response);
            }
            if let Some(answer) = answer {
                self.edited(i + 1, &mut applied);
                return Err(Box::new(Stopped::Answered(answer, applied)));
            }
        }
        self.edited(self.steps.len(), &mut applied);
        Ok(applied)
    }

    /// Gives a request that ran `steps` steps the table of their edits.
    fn edited(&self, steps: usize, applied: &mut Applied) {
        if let Some(tables) = &self.tables {
            applied.table = tables[steps].clone();
        }
    }
}

/// Whether `route` has a feature that runs as a step of its chain (`multicast`,
/// `session_replay`, `login`).
fn has_features(route: &Route) -> bool {
    !route.multicast.is_empty() || route.session_replay.is_some() || route.login.is_some()
}

/// The steps of `route`'s own features, in the chain after its filters.
fn features(route: &Route) -> impl Iterator<Item = Step> + '_ {
    let multicast = (!route.multicast.is_empty())
        .then(|| Step::Multicast(route.multicast.clone().into_boxed_slice()));
    let replay = route.session_replay.map(Step::SessionReplay);
    let login = route.login.as_ref().map(|_| Step::Login);
    multicast.into_iter().chain(replay).chain(login)
}

impl Step {
    /// The fields the step edits whatever the request, their values made per request in
    /// slots of its record from `next` on (the other steps' edits are made per request).
    fn edits(&self, next: &mut u16) -> table::Edits {
        match self {
            Step::RequestId(s) => s.edits(next),
            Step::Headers(s) => s.edits(next),
            Step::RateLimit(s) => s.edits(next),
            _ => table::Edits::default(),
        }
    }
}

/// The route's `auth`: the request's token checked against the route's keys (counted in
/// `rondo_auth_refusals_total` when refused).
pub(crate) fn gate<'a, H: Headers>(
    ctx: &'a HttpCtx,
    route: &'a Route,
) -> impl Fn(&H) -> Result<Option<Identity>, ProxyError> + 'a {
    move |headers| {
        let live = &ctx.live;
        let parts = rondo_identity::auth::GateParts {
            tier_keys: &live.tier_keys,
            revocations: &live.revocations,
            metrics: &live.metrics,
        };
        ctx.auth
            .gate(route, parts, headers)
            .map_err(|e| ProxyError::unauthorized(e, &route.name, &route.cluster))
    }
}

/// Why the request phase stopped before the tries.
pub(crate) enum Stopped {
    /// A filter answered: its answer, and the edits of the filters before it.
    Answered(Answer, Box<Applied>),
    /// The route's `auth` refused the request (answered 401 or 400 as the router's errors are).
    Refused(ProxyError, Box<Applied>),
}

impl Stopped {
    /// What the filters before the stop made of the request.
    pub(crate) fn applied(&self) -> &Applied {
        match self {
            Stopped::Answered(_, applied) | Stopped::Refused(_, applied) => applied,
        }
    }
}

/// What of a request the filters read.
pub(crate) struct Info<'a> {
    /// The client's address, as text.
    pub(crate) client_ip: &'a [u8],
    /// The request's method.
    pub(crate) method: &'a str,
    /// Whether the client spoke TLS to the listener (the request's scheme is `https`).
    pub(crate) tls: bool,
    /// The request's host, without its port.
    pub(crate) host: Option<&'a str>,
    /// The whole `Host` value (or `:authority`), port and all.
    pub(crate) authority: &'a str,
    /// The path (normalized), without the query.
    pub(crate) path: &'a str,
    /// The query, without its `?`.
    pub(crate) query: Option<&'a str>,
}

impl Info<'_> {
    /// The port the client named in `Host` (or `:authority`), if any (looked for only by the
    /// filters that need it).
    pub(crate) fn port(&self) -> Option<u16> {
        port_of(self.authority)
    }

    /// A variable's value, given the request's rewritten `path` and verified `identity` so
    /// far (`${member}` is the response's: a placeholder here, [`MEMBER`]; `${request_id}` is
    /// in the request's record, not here).
    fn var<'v>(
        &'v self,
        path: Option<&'v str>,
        identity: Option<&Identity>,
        var: Var,
    ) -> std::borrow::Cow<'v, [u8]> {
        use std::borrow::Cow;
        match var {
            Var::ClientIp => Cow::Borrowed(self.client_ip),
            Var::Host => Cow::Borrowed(self.host.unwrap_or("").as_bytes()),
            Var::Path => Cow::Borrowed(path.unwrap_or(self.path).as_bytes()),
            Var::RequestId => Cow::Borrowed(b""),
            // Without control characters: one would end the field, and `\u{1}` stands for the
            // member.
            Var::IdentitySub => identity.map_or(Cow::Borrowed(&b""[..]), |i| {
                i.subject.replace(char::is_control, "").into_bytes().into()
            }),
            Var::Member => Cow::Borrowed(MEMBER.as_bytes()),
        }
    }
}

/// Where `${member}` goes in a response value rendered before the member is known: a
/// character no value holds otherwise (the configuration refuses control characters, and
/// variables' values lose theirs), replaced by the member's name in the response phase.
const MEMBER: &str = "\u{1}";

/// What the request phase made of a request: the edits of the head members get, those of the
/// response, the request id and the trace. The chain's edits are its table's, with the values
/// made for this request in `record`; those made per request (by steps that choose per
/// request, and the codecs' own) are in `request` and `response`, after the table's.
#[derive(Default)]
pub(crate) struct Applied {
    /// The chain's edits, when it has a table.
    table: Option<Arc<table::Table>>,
    /// The values made for this request (the id, the span, rendered `${…}` values).
    record: table::Record,
    /// Where the request id is in `record` (`request_id`).
    id: Option<u16>,
    /// Edits of the request's fields made per request, after the table's.
    pub(crate) request: FieldOps,
    /// The path members get (without the query), when rewritten.
    pub(crate) path: Option<String>,
    /// The `Host` members get, when rewritten.
    pub(crate) host: Option<HeaderValue>,
    /// Edits of the response's fields made per request, after the table's (`${member}` still
    /// to fill in).
    response: Vec<fields::Pending>,
    /// The trace this request belongs to (`request_id` with `trace`).
    trace: Option<trace::Trace>,
    /// The request's message is converted to another SOAP version, and its response back.
    pub(crate) soap: Option<soap::Plan>,
    /// Who the request is, as the route's `auth` verified it (members get it).
    pub(crate) identity: Option<Identity>,
    /// How long to hold the request before its first try (`fault`): [`hold`].
    pub(crate) delay: Option<std::time::Duration>,
    /// The branches copies of this request go to: the `mirror`s it was drawn for, the route's
    /// `multicast` ([`crate::multicast`] sends them).
    pub(crate) copies: Vec<rondo_core::Branch>,
    /// A copy must have the whole body (`multicast`): a body too large for the copies is
    /// refused. Mirrors alone skip their copies instead.
    pub(crate) copies_whole: bool,
    /// The route's session-replay limits (`session_replay`): the request is kept for replay.
    pub(crate) replay: Option<rondo_core::SessionReplay>,
    /// The route signs users on (`login`).
    pub(crate) login: bool,
    /// The request is a gRPC-Web call translated to gRPC (`grpc_web`).
    pub(crate) grpc_web: Option<grpc_web::Plan>,
    /// The response's compression (`compress`), decided in the response phase.
    compress: Option<compress::Plan>,
}

impl Applied {
    /// The request target members get: the rewritten path with the query, when the path was
    /// rewritten.
    pub(crate) fn target(&self, query: Option<&str>) -> Option<String> {
        let path = self.path.as_deref()?;
        Some(match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        })
    }

    /// The `traceparent` of the next try: the request's trace with a new span id; `None`
    /// without a trace.
    pub(crate) fn next_span(&self) -> Option<HeaderValue> {
        self.trace.as_ref().map(trace::Trace::next_span)
    }

    /// Whether the request's `traceparent` is one `request_id` started (the client sent no
    /// valid one): no parent for `[tracing]`'s spans, which then sample it as a new trace.
    pub(crate) fn trace_started(&self) -> bool {
        self.trace.as_ref().is_some_and(|t| t.started)
    }

    /// The request id (`request_id`).
    pub(crate) fn request_id(&self) -> Option<&str> {
        // Visible ASCII, so always UTF-8.
        self.id.and_then(|slot| std::str::from_utf8(self.record.get(slot)?).ok())
    }

    /// The request's edits, all of them (the table's with this request's values, then those
    /// made per request).
    #[cfg(test)]
    pub(crate) fn request_ops(&self) -> FieldOps {
        let table = self.table.as_ref().map(|t| t.request_ops(&self.record));
        table.unwrap_or_default().then(&self.request)
    }

    /// Applies the request's edits to hyper's head.
    pub(crate) fn apply_request(&self, headers: &mut http::HeaderMap) {
        if let Some(table) = &self.table {
            table.apply_request(&self.record, headers);
        }
        self.request.apply(headers);
    }

    /// Whether a field of the request head named `name` (as sent, any case) goes.
    pub(crate) fn drops_request(&self, name: &[u8]) -> bool {
        self.table.as_ref().is_some_and(|t| t.drops_request(name)) || self.request.drops(name)
    }

    /// Writes the fields the request gains as `name: value\r\n` lines (the own path).
    pub(crate) fn write_request_fields(&self, out: &mut Vec<u8>) {
        if let Some(table) = &self.table {
            table.write_request(&self.record, &self.request, out);
        }
        for (name, value) in &self.request.append {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The response edits, `${member}` filled in with `member` (empty for the router's own
    /// answers).
    pub(crate) fn response(&self, member: &str) -> FieldOps {
        let table = self.table.as_ref().map(|t| t.response_ops(&self.record, member));
        fields::response_ops(table.unwrap_or_default(), &self.response, member)
    }

    /// The same edits as the own path writes them into the head (nothing made in between).
    pub(crate) fn response_edits<'a>(&'a self, member: &'a str) -> ResponseEdits<'a> {
        let table = self.table.as_deref().map(|t| (t, &self.record));
        ResponseEdits { table, pending: &self.response, member }
    }

    /// Whether any response field is edited.
    pub(crate) fn edits_response(&self) -> bool {
        !self.response.is_empty() || self.table.as_ref().is_some_and(|t| !t.response.is_empty())
    }
}

/// A filter's own answer.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
}

#[cfg(test)]
mod tests;
