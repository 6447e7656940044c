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

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use rondo_core::Route;
use rondo_core::traffic::{TrafficFilter, Var};

use crate::head::Headers;
use crate::http::HttpCtx;

mod answer;
mod compress;
mod cors;
mod fields;
mod rewrite;
mod trace;

pub(crate) use compress::respond as compress_response;
pub(crate) use fields::FieldOps;

/// The W3C trace context's field, which each try gets anew ([`Applied::next_span`]).
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The port of a `Host` value (`host:port`, `[v6]:port`), if it names one.
pub(crate) fn port_of(host: &str) -> Option<u16> {
    let (_, port) = host.rsplit_once(':')?;
    if port.contains(']') { None } else { port.parse().ok() }
}

/// A route's chain, compiled from its listener's filters and its own.
pub(crate) struct Chain {
    steps: Box<[Step]>,
}

/// One compiled filter.
enum Step {
    RequestId(trace::RequestIdStep),
    Headers(fields::HeaderStep),
    Rewrite(rewrite::RewriteStep),
    Redirect(rondo_core::traffic::Redirect),
    Respond(answer::RespondStep),
    Cors(cors::CorsStep),
    Compress(compress::CompressStep),
}

impl Chain {
    /// `route`'s chain (its listener's filters first), compiled at its first request in this
    /// view and kept in the route's slot; `None` when neither has a filter.
    pub(crate) fn of<'r>(ctx: &HttpCtx, route: &'r Route) -> Option<&'r Chain> {
        if route.filters.is_empty() && ctx.listener.filters.is_empty() {
            return None;
        }
        let made = route.compiled.get_or_init(|| {
            let filters = ctx.listener.filters.iter().chain(&route.filters);
            Arc::new(Chain::compile(filters, route))
        });
        made.downcast_ref::<Chain>()
    }

    fn compile<'f>(filters: impl Iterator<Item = &'f TrafficFilter>, route: &Route) -> Chain {
        let steps = filters
            .map(|f| match f {
                TrafficFilter::RequestId(r) => Step::RequestId(trace::RequestIdStep::new(r)),
                TrafficFilter::Headers(h) => Step::Headers(fields::HeaderStep::new(h)),
                TrafficFilter::Rewrite(r) => Step::Rewrite(rewrite::RewriteStep::new(r, route)),
                TrafficFilter::Redirect(r) => Step::Redirect(r.clone()),
                TrafficFilter::Respond(r) => Step::Respond(answer::RespondStep::new(r)),
                TrafficFilter::Cors(c) => Step::Cors(cors::CorsStep::new(c)),
                TrafficFilter::Compress(c) => Step::Compress(compress::CompressStep::new(c)),
            })
            .collect();
        Chain { steps }
    }

    /// The request phase: every filter in order, until one answers. The edits gathered so far
    /// apply to an answer's head too (a request id, a response field).
    pub(crate) fn request(
        &self,
        info: &Info<'_>,
        headers: &impl Headers,
    ) -> Result<Applied, Box<(Answer, Applied)>> {
        let mut applied = Applied::default();
        for step in &self.steps {
            let answer = match step {
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
                Step::Cors(s) => s.request(info, headers, &mut applied),
                Step::Compress(s) => {
                    s.request(info, headers, &mut applied);
                    None
                }
            };
            if let Some(answer) = answer {
                return Err(Box::new((answer, applied)));
            }
        }
        Ok(applied)
    }
}

/// What of a request the filters read.
pub(crate) struct Info<'a> {
    /// The client's address, as text.
    pub(crate) client_ip: &'a str,
    /// The request's method.
    pub(crate) method: &'a str,
    /// Whether the client spoke TLS to the listener (the request's scheme is `https`).
    pub(crate) tls: bool,
    /// The request's host, without its port.
    pub(crate) host: Option<&'a str>,
    /// The port the client named in `Host` (or `:authority`), if any.
    pub(crate) port: Option<u16>,
    /// The path (normalized), without the query.
    pub(crate) path: &'a str,
    /// The query, without its `?`.
    pub(crate) query: Option<&'a str>,
    /// The verified identity's subject.
    pub(crate) subject: Option<&'a str>,
}

impl Info<'_> {
    /// A variable's value (`${member}` is the response's: a placeholder here, [`MEMBER`]).
    fn var(&self, applied: &Applied, var: Var) -> String {
        match var {
            Var::ClientIp => self.client_ip.to_owned(),
            Var::Host => self.host.unwrap_or("").to_owned(),
            Var::Path => applied.path.as_deref().unwrap_or(self.path).to_owned(),
            Var::RequestId => applied.request_id.clone().unwrap_or_default(),
            // Without control characters: one would end the field, and `\u{1}` stands for the
            // member.
            Var::IdentitySub => self.subject.unwrap_or("").replace(char::is_control, ""),
            Var::Member => MEMBER.to_owned(),
        }
    }
}

/// Where `${member}` goes in a response value rendered before the member is known: a
/// character no value holds otherwise (the configuration refuses control characters, and
/// variables' values lose theirs), replaced by the member's name in the response phase.
const MEMBER: &str = "\u{1}";

/// What the request phase made of a request: the edits of the head members get, those of the
/// response, the request id and the trace.
#[derive(Default)]
pub(crate) struct Applied {
    /// Edits of the request's fields.
    pub(crate) request: FieldOps,
    /// The path members get (without the query), when rewritten.
    pub(crate) path: Option<String>,
    /// The `Host` members get, when rewritten.
    pub(crate) host: Option<HeaderValue>,
    /// Edits of the response's fields (`${member}` still to fill in).
    response: Vec<fields::Pending>,
    /// The request id (`request_id`).
    pub(crate) request_id: Option<String>,
    /// The trace this request belongs to (`request_id` with `trace`).
    trace: Option<trace::Trace>,
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

    /// The response edits, `${member}` filled in with `member` (empty for the router's own
    /// answers).
    pub(crate) fn response(&self, member: &str) -> FieldOps {
        fields::response_ops(&self.response, member)
    }

    /// Whether any response field is edited.
    pub(crate) fn edits_response(&self) -> bool {
        !self.response.is_empty()
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
