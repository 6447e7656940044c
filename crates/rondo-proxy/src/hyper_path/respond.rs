//! The respond stage on hyper's path: the member's answer on its way back with header hygiene,
//! `Via` and a session cookie, its end reported to the member and the connection; a protocol
//! switch joins the two upgraded connections ([`tunnel`]). A failure's own answer is
//! [`failure`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rondo_config::ErrorDetail;
use rondo_core::{FailureKind, Outcome, Route};
use rondo_runtime::ClusterRt;
use rondo_runtime::metrics::RouteMetrics;

use crate::chain::{Answer, Applied};
use crate::http::Choice;

use crate::body::{BodySlot, Finish, ProxyBody};
use crate::conn::ConnState;
use crate::error::{Kind, ProxyError};
use crate::headers::{append_via, strip_hop_by_hop};

/// Stage 4: the member's answer on its way back: framing fixed, hop-by-hop headers gone (or a
/// protocol switch joined), `Via` and a new session cookie added; the member's request ends
/// (and its outcome is recorded) when the body's last frame has passed.
#[allow(clippy::too_many_arguments)]
pub(super) fn respond(
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
    for cookie in [choice.set_cookie, choice.split_cookie].into_iter().flatten() {
        parts.headers.append(header::SET_COOKIE, cookie);
    }
    let finish = Finish::default()
        .request(rt.clone(), member, outcome)
        .conn(conn.clone(), route.idle_timeout)
        .served(served.counted, served.slot, served.tries, choice.reason);
    Response::from_parts(parts, ProxyBody::upstream(body, finish))
}

/// What a served response's end reports besides its outcome: the route's byte counters, the
/// request body (bytes in), the tries made.
pub(super) struct Served {
    pub(super) counted: Arc<RouteMetrics>,
    pub(super) slot: Option<BodySlot>,
    pub(super) tries: u32,
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

/// The answer a route's filter made (a redirect, a direct response), with the response edits
/// the filters before it made; counted as the router's own response.
pub(super) fn answered(
    ctx: &crate::http::HttpCtx,
    conn: &Arc<ConnState>,
    route: &Route,
    answer: Answer,
    applied: &Applied,
) -> Response<ProxyBody> {
    ctx.metrics.router_response(answer.status, Some(&route.name), Some(&route.cluster));
    let mut resp = Response::new(ProxyBody::local(answer.body));
    *resp.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let headers = resp.headers_mut();
    for (name, value) in answer.headers {
        headers.append(name, value);
    }
    applied.response("").apply(headers);
    resp.body_mut().set_finish(Finish::default().conn(conn.clone(), route.idle_timeout));
    resp
}

/// The response the client gets for failure `e`, as much explained as the listener's `detail`
/// allows ([`ProxyError::render`]).
pub(super) fn failure(e: ProxyError, detail: ErrorDetail) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::local(Bytes::from(e.render(detail))));
    *resp.status_mut() = e.kind.status();
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Kind::Unauthorized(refusal) = e.kind {
        headers.insert(header::WWW_AUTHENTICATE, refusal.challenge());
    }
    if matches!(e.kind, Kind::NoEligible | Kind::Breaker(_)) {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if matches!(
        e.kind,
        Kind::BodyTooLarge | Kind::ClientBody | Kind::ClientBodyTimeout | Kind::BadRequest
    ) {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
