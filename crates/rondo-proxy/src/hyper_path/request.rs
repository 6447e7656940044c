//! A request on hyper's path before its first try: its host (RFC 9112 3.2, HTTP/2's
//! `:authority`), the route stage on hyper's request (with a body filter's peek at the body),
//! and `prepare`: the head as members get it and the body in a replay slot.

use std::time::Duration;

use crate::client_body::ClientBody;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Request, Version};
use http_body::Body as _;
use rondo_core::failover::is_idempotent_method;
use rondo_core::{BodyPeek, Route};
use rondo_runtime::Snapshot;

use crate::http::{
    DEFAULT_IDLE, Decided, Failure, HttpCtx, Target, find_route, looped, on_route, without_port,
};

use crate::body::BodySlot;
use crate::chain::{Applied, Info};
use crate::conn::ConnState;
use crate::error::{Kind, ProxyError};
use crate::headers::{add_forwarded, has_looped, is_upgrade, strip_hop_by_hop};

/// The host a request is for, without its port, as RFC 9112 section 3.2 has it: an
/// absolute-form target's authority wins over `Host` (which is then replaced by it); an HTTP/1.1
/// request must carry exactly one `Host`; HTTP/2's `:authority` (which hyper puts in the URI)
/// becomes the `Host`, and a `Host` header naming something else is refused. Errors are the
/// client's, answered 400.
fn request_host(req: &mut Request<ClientBody>) -> Result<Option<String>, String> {
    let from_uri = req.uri().authority().map(|a| a.as_str().to_owned());
    let full = if let Some(authority) = from_uri {
        // RFC 9113 8.3.1 (and RFC 9114 4.3.1 for HTTP/3): a Host naming another authority
        // than `:authority` is malformed.
        if matches!(req.version(), Version::HTTP_2 | Version::HTTP_3)
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

/// Stage 1: refuse what must not be forwarded (a loop, a malformed `Host`), then the first route
/// of this listener whose match holds. Returns the route and the request's host.
pub(super) fn route<'s>(
    ctx: &HttpCtx,
    snapshot: &'s Snapshot,
    req: &mut Request<ClientBody>,
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
pub(super) fn decide<'s>(
    ctx: &HttpCtx,
    snapshot: &'s Snapshot,
    req: &Request<ClientBody>,
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
pub(super) fn no_route(ctx: &HttpCtx, req: &Request<ClientBody>, host: Option<&str>) -> Failure {
    let detail = format!(
        "no route on listener {} matches {} {}{}",
        ctx.listener.name,
        req.method(),
        host.unwrap_or(""),
        req.uri().path(),
    );
    (ProxyError::new(Kind::NoRoute, detail), DEFAULT_IDLE)
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
    pub(super) fn then(self, more: Peeked) -> Peeked {
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

/// The request's whole body (after the bytes already `read`), for a filter that converts it
/// (`soap`, `grpc_web`): at most `limit` bytes, or a 413 that names `what` and the filter's
/// limit.
pub(super) async fn whole_body(
    ctx: &HttpCtx,
    route: &Route,
    req: &mut Request<ClientBody>,
    read: Option<Peeked>,
    limit: u64,
    what: &str,
) -> Result<Peeked, Failure> {
    let whole = match read {
        Some(first) if first.complete => first,
        first => {
            let more = peek_body(ctx, Some(route), req, limit.saturating_add(1)).await?;
            match first {
                Some(first) => first.then(more),
                None => more,
            }
        }
    };
    if whole.bytes.len() as u64 > limit || !whole.complete {
        let detail = format!("{what} is over the filter's limit of {limit} bytes");
        return Err(on_route(route, Kind::BodyTooLarge, detail));
    }
    Ok(whole)
}

/// Reads the request body's first bytes, until at least `want` are in or the body ends (the
/// listener's `max_body_bytes` holds: 413 past it). The rest stays in the request.
pub(super) async fn peek_body(
    ctx: &HttpCtx,
    route: Option<&Route>,
    req: &mut Request<ClientBody>,
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
pub(super) struct Prepared {
    pub(super) parts: Parts,
    pub(super) path_and_query: PathAndQuery,
    pub(super) slot: Option<BodySlot>,
    pub(super) client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    pub(super) idempotent: bool,
    /// What the route's filter chain made of the request (its tries' trace spans, the
    /// response's edits).
    pub(super) applied: Option<Box<Applied>>,
}

impl Prepared {
    /// Whether the request can still be sent again: no try has read from its body.
    pub(super) fn replayable(&self) -> bool {
        self.slot.as_ref().is_none_or(BodySlot::is_untouched)
    }
}

/// What of `req` the route's filters read.
pub(super) fn info<'a>(
    ctx: &HttpCtx,
    conn: &'a ConnState,
    req: &'a Request<ClientBody>,
    host: Option<&'a str>,
) -> Info<'a> {
    // `request_host` left exactly one `Host`, the `:authority`'s on HTTP/2.
    let full = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    Info {
        client_ip: conn.client_ip.as_bytes(),
        method: req.method().as_str(),
        tls: ctx.listener.tls.is_some(),
        host,
        authority: full,
        path: req.uri().path(),
        query: req.uri().query(),
    }
}

/// Stage 2: the body limit, then the head as members get it.
pub(super) fn prepare(
    ctx: &HttpCtx,
    conn: &ConnState,
    route: &Route,
    mut req: Request<ClientBody>,
    host: Option<&str>,
    read: Option<Peeked>,
    applied: &mut Option<Box<Applied>>,
) -> Result<Prepared, Failure> {
    let limit = ctx.listener.max_body_bytes;
    if read.is_none() && limit > 0 && req.body().size_hint().lower() > limit {
        let detail = format!("request body over the limit of {limit} bytes");
        return Err(on_route(route, Kind::BodyTooLarge, detail));
    }
    // Taken only now: a refused request keeps its filters' edits for the router's answer.
    let applied = applied.take();
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
        conn.forwarded_trusted,
    );
    crate::headers::add_client_cert(&mut parts.headers, conn.tls.as_ref());
    crate::auth::apply(&mut parts.headers, applied.as_ref().and_then(|a| a.identity.as_ref()));
    if applied.as_ref().is_some_and(|a| a.replay.is_some()) {
        // Only the router marks a replay.
        parts.headers.remove(crate::session_replay::REPLAY_HEADER);
    }
    let mut path_and_query =
        parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    if let Some(a) = &applied {
        a.apply_request(&mut parts.headers);
        if let Some(host) = &a.host {
            parts.headers.insert(header::HOST, host.clone());
        }
        // A rewritten path is visible ASCII already (the chain refuses any other).
        if let Some(pq) = a.target(parts.uri.query()).and_then(|t| PathAndQuery::try_from(t).ok()) {
            path_and_query = pq;
        }
    }
    let slot = match read {
        Some(p) if p.complete => (!p.bytes.is_empty() || p.trailers.is_some())
            .then(|| BodySlot::whole(p.bytes, p.trailers)),
        Some(p) => Some(BodySlot::prefixed(p.bytes, body)),
        None => (!body.is_end_stream()).then(|| BodySlot::new(body)),
    };
    let idempotent = is_idempotent_method(parts.method.as_str());
    Ok(Prepared { parts, path_and_query, slot, client_upgrade, idempotent, applied })
}
