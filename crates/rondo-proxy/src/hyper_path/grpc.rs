//! gRPC calls on hyper's path ([`GrpcCall`]): a request is one when its `content-type` starts
//! with `application/grpc` (the one check every request pays). Its `grpc-timeout` bounds the
//! request's deadline, and each try tells the member the time that is left; the member's status
//! (in a trailers-only head, or in the trailers: [`crate::body::Finish`]) decides the try's
//! outcome under the cluster's `grpc_failure_codes`; a trailers-only answer with a status of
//! the cluster's `retry.retry_on` goes to another member through the failover loop while no
//! byte of it reached the client; and the router's own failures reach a gRPC client as
//! trailers-only gRPC errors ([`failure`]), never an HTTP error page.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use rondo_config::ErrorDetail;
use rondo_core::Failover;
use rondo_core::grpc::{self, Code};
use rondo_runtime::metrics::{GrpcLabels, Metrics};
use rondo_runtime::{ClusterRt, clock};

use super::request::Prepared;
use crate::body::ProxyBody;
use crate::error::{Kind, ProxyError};

/// The most request body bytes kept so that a declined call can be sent to another member; a
/// larger body streams on, and its call is not retried.
pub(crate) const RETRY_COPY_LIMIT: u64 = 64 * 1024;

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
const GRPC_TIMEOUT: &str = "grpc-timeout";
/// The fields of a member's trailers-only answer a declined call keeps for the client.
const KEPT: [&str; 3] = [GRPC_STATUS, GRPC_MESSAGE, "grpc-status-details-bin"];

/// Whether the request is a gRPC call.
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| grpc::is_grpc_content_type(v.as_bytes()))
}

/// What the tries of one gRPC call share.
#[derive(Debug, Default)]
pub(super) struct GrpcCall {
    /// The client's `grpc-timeout` (a malformed one is ignored, as gRPC servers do).
    pub(super) deadline: Option<Duration>,
    /// The last try's trailers-only answer, when the member declined the call: what the client
    /// gets if no other member answers.
    declined: Option<HeaderMap>,
}

impl GrpcCall {
    /// The call whose request head is `headers`.
    pub(super) fn of(headers: &HeaderMap) -> GrpcCall {
        let deadline = headers.get(GRPC_TIMEOUT).and_then(|v| grpc::parse_timeout(v.as_bytes()));
        GrpcCall { deadline, declined: None }
    }

    /// Before a try on `rt`: the member is told the time left (a smaller `grpc-timeout`), and
    /// the body is copied as it passes when the cluster retries declined calls.
    pub(super) fn before(&self, req: &mut Prepared, rt: &ClusterRt, failover: &Failover) {
        if self.deadline.is_some() {
            let left = failover.try_timeout(clock::now());
            if let Ok(v) = HeaderValue::from_str(&grpc::encode_timeout(left)) {
                req.parts.headers.insert(GRPC_TIMEOUT, v);
            }
        }
        if rt.spec.policy.grpc.retry_on != grpc::Codes::NONE
            && let Some(slot) = &req.slot
        {
            slot.keep_copy(RETRY_COPY_LIMIT);
        }
    }

    /// The member's answer to a try on `rt`: its status decides the outcome (a trailers-only
    /// head now, trailers when they pass); a trailers-only answer with a status the cluster
    /// retries is declined (`Err(Kind::Declined)`) when the request can be sent again.
    pub(super) fn answered(
        &mut self,
        mut resp: Response<ProxyBody>,
        req: &mut Prepared,
        rt: &ClusterRt,
    ) -> Result<Response<ProxyBody>, Kind> {
        let (mut parts, mut body) = resp.into_parts();
        let status = head_status(&parts.headers);
        body.grpc(status);
        resp = Response::from_parts(parts, body);
        let Some(code) = status.filter(|c| rt.spec.policy.grpc.retries(*c)) else {
            return Ok(resp);
        };
        let again = match &req.slot {
            None => true,
            Some(slot) => match slot.copied() {
                Some(whole) => {
                    req.slot = Some(whole);
                    true
                }
                None => false,
            },
        };
        if !again {
            return Ok(resp);
        }
        tracing::debug!(cluster = %rt.spec.name, status = code.name(), "grpc call declined: trying elsewhere");
        (parts, _) = resp.into_parts();
        let mut kept = HeaderMap::new();
        for name in KEPT {
            if let Some(v) = parts.headers.remove(name) {
                kept.insert(name, v);
            }
        }
        self.declined = Some(kept);
        Err(Kind::Declined)
    }

    /// The member's own answer, when the call ran out of tries (or members) just after a member
    /// declined it (its status and message mean more than the router's "no eligible member").
    pub(super) fn declined_answer(&mut self, e: &ProxyError) -> Option<Response<ProxyBody>> {
        let last = e.attempts.iter().rev().find(|a| a.member.is_some())?;
        (last.outcome == Kind::Declined).then(|| self.declined.take()).flatten().map(trailers_only)
    }
}

/// A trailers-only answer's status (`None` without one: the status comes with the trailers).
fn head_status(headers: &HeaderMap) -> Option<Code> {
    headers.get(GRPC_STATUS).map(|v| grpc::parse_status(v.as_bytes()).unwrap_or(Code::UNKNOWN))
}

/// The gRPC status the router answers a call with when it fails with `kind`: deadline for the
/// timeouts, the statuses gRPC maps HTTP's to for the client's own failures, unavailable for
/// the rest (no member, none answered).
pub(super) fn code_of(kind: Kind) -> Code {
    match kind {
        Kind::Timeout | Kind::ClientBodyTimeout => Code::DEADLINE_EXCEEDED,
        Kind::NoRoute => Code::UNIMPLEMENTED,
        Kind::BodyTooLarge => Code::RESOURCE_EXHAUSTED,
        Kind::ClientBody | Kind::BadRequest => Code::INTERNAL,
        Kind::Unauthorized(r) if r.status() == StatusCode::FORBIDDEN => Code::from_number(7),
        Kind::Unauthorized(_) => Code::from_number(16),
        _ => Code::UNAVAILABLE,
    }
}

/// The answer a gRPC client gets for failure `e`: trailers-only (HTTP 200, `application/grpc`),
/// its status from [`code_of`], its message the text an HTTP client would get, percent-encoded;
/// counted by status on the route and cluster.
pub(super) fn failure(
    e: &ProxyError,
    detail: ErrorDetail,
    metrics: &Metrics,
) -> Response<ProxyBody> {
    let code = code_of(e.kind);
    let text = e.render(detail);
    let mut headers = HeaderMap::new();
    headers.insert(GRPC_STATUS, HeaderValue::from(code.number()));
    if let Ok(v) = HeaderValue::from_str(&grpc::encode_message(text.trim_end())) {
        headers.insert(GRPC_MESSAGE, v);
    }
    if let Kind::Unauthorized(refusal) = e.kind {
        headers.insert(header::WWW_AUTHENTICATE, refusal.challenge());
    }
    let labels = GrpcLabels {
        route: e.route.clone().unwrap_or_default(),
        cluster: e.cluster.clone().unwrap_or_default(),
        grpc_status: code.name(),
    };
    metrics.grpc_responses.get_or_create(&labels).inc();
    trailers_only(headers)
}

/// A trailers-only response carrying `status` fields (`grpc-status`, `grpc-message`).
fn trailers_only(status: HeaderMap) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::local(bytes::Bytes::new()));
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.extend(status);
    resp
}
