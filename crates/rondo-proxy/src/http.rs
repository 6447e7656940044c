//! The HTTP request path, top to bottom: route → (for the route's cluster, then each backup
//! cluster in order) pick a member (sticky session, hash key or the cluster's algorithm) → send
//! with a per-try timeout → on a failure that is safe to retry, the next member → the member's
//! response streamed back with header hygiene, or an error that explains itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::{self, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rondo_config::ListenerSpec;
use rondo_core::{
    FailureKind, Granularity, HashKeySource, Outcome, PickError, PickRequest, RequestFacts,
};
use rondo_runtime::metrics::ListenerMetrics;
use rondo_runtime::{ClusterRt, Live, Snapshot, clock};

use crate::access::{self, AccessLog, Reason};
use crate::body::{BodySlot, ClientBodyError, Finish, ProxyBody, TooLarge, UpstreamBody};
use crate::conn::ConnState;
use crate::error::{Attempt, Kind, ProxyError};
use crate::headers::{add_forwarded, append_via, is_upgrade, strip_hop_by_hop};
use crate::sticky::{self, Sessions};
use crate::upstream::Clients;

/// Idle timeout after a response that matched no route.
const DEFAULT_IDLE: Duration = Duration::from_secs(60);

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
}

/// Serves one request.
pub async fn handle(
    ctx: Arc<HttpCtx>,
    conn: Arc<ConnState>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    conn.request_started();
    let snapshot = ctx.live.load();
    let version = req.version();
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
            let mut resp = e.into_response();
            resp.body_mut().set_finish(Finish::default().conn(conn, idle).log(line));
            resp
        }
    };
    *resp.version_mut() =
        if version == Version::HTTP_2 { Version::HTTP_2 } else { Version::HTTP_11 };
    Ok(resp)
}

fn host_of(req: &Request<Incoming>) -> Option<&str> {
    let full = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))?;
    // Strip the port, minding IPv6 literals.
    Some(match full.rfind(':') {
        Some(i) if !full[i..].contains(']') => &full[..i],
        _ => full,
    })
}

type Failure = (ProxyError, Duration);

async fn proxy(
    ctx: &HttpCtx,
    snapshot: &Snapshot,
    conn: &Arc<ConnState>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Failure> {
    let host = host_of(&req).map(str::to_owned);
    let route_index = {
        let headers = req.headers();
        let lookup = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let facts = RequestFacts {
            host: host.as_deref(),
            path: req.uri().path(),
            method: req.method().as_str(),
            header: &lookup,
        };
        snapshot
            .view
            .routes
            .iter()
            .position(|r| r.listener == ctx.listener.name && r.matcher.matches(&facts))
    };
    let Some(route_index) = route_index else {
        let detail = format!(
            "no route on listener {} matches {} {}{}",
            ctx.listener.name,
            req.method(),
            host.as_deref().unwrap_or(""),
            req.uri().path()
        );
        return Err((ProxyError::new(Kind::NoRoute, detail), DEFAULT_IDLE));
    };
    let route = &snapshot.view.routes[route_index];
    let fail = |kind, detail: String| {
        (ProxyError::on_route(kind, &route.name, &route.cluster, detail), route.idle_timeout)
    };

    let limit = ctx.listener.max_body_bytes;
    if limit > 0 && req.body().size_hint().lower() > limit {
        return Err(fail(
            Kind::BodyTooLarge,
            format!("request body over the limit of {limit} bytes"),
        ));
    }

    let upgrade = req.version() == Version::HTTP_11 && is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let client_version = req.version();
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, upgrade);
    add_forwarded(
        &mut parts.headers,
        &conn.client_ip,
        host.as_deref(),
        client_version,
        ctx.listener.trust_forwarded_for,
    );
    if !parts.headers.contains_key(header::HOST)
        && let Some(v) = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(header::HOST, v);
    }
    let path_and_query =
        parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    let bodyless = body.is_end_stream();
    let slot = (!bodyless).then(|| BodySlot::new(body));
    let idempotent = is_idempotent(&parts.method);

    let deadline = Instant::now() + route.request_timeout;
    let mut attempts: Vec<Attempt> = Vec::new();
    let clusters = std::iter::once(&route.cluster).chain(route.backups.iter());
    // Whether the request already reached a member and failed there: later tries are retries
    // and must fit the retry budget of the cluster they go to. A refused connection sent
    // nothing and loaded nobody, so trying elsewhere after it is free.
    let mut sent = false;
    let mut deposited = false;
    let mut budget_exhausted = false;
    let mut tries = 0u32;
    let metrics = &ctx.live.metrics;
    'clusters: for cluster in clusters {
        let Some(rt) = snapshot.clusters.get(cluster) else { continue };
        let mut tried: Vec<usize> = Vec::new();
        for _ in 0..rt.spec.policy.retry.attempts.max(1) {
            // The core's time for the budget and the pick (one reading for both).
            let now = clock::now();
            let allowed = rt.with(|b| {
                if sent {
                    b.retry_allowed(now)
                } else {
                    // One deposit per request (not per try after a refused connection).
                    if !deposited {
                        b.note_request(now);
                    }
                    true
                }
            });
            deposited = true;
            if !allowed {
                tracing::warn!(route = %route.name, cluster = %cluster, "retry budget exhausted");
                budget_exhausted = true;
                metrics.budget_exhausted(&route.name, cluster);
                break 'clusters;
            }
            let choice = match choose(ctx, rt, &parts, peer, &tried, now) {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(route = %route.name, error = %e, "no member");
                    attempts.push(Attempt {
                        cluster: cluster.clone(),
                        member: None,
                        outcome: Kind::NoEligible,
                    });
                    continue 'clusters;
                }
            };
            let member = choice.member;
            tried.push(member);
            // Ends the request on the member as cancelled if this future is dropped (the
            // client went away) before an outcome is recorded.
            let begun = Begun { rt: rt.clone(), member, armed: true };
            tries += 1;
            if tries > 1 {
                metrics.retry(&route.name, cluster);
            }
            let upstream_body = match &slot {
                None => UpstreamBody::Empty,
                Some(slot) => UpstreamBody::stream(slot.clone(), limit),
            };
            let request = upstream_request(&parts, rt, member, &path_and_query, upstream_body);
            // The try's time and its latency start as it is sent (the pick, a session sweep
            // and a wait for the cluster's lock are not the member's).
            let started = Instant::now();
            let remaining = deadline.saturating_duration_since(started);
            let per_try =
                rt.spec.policy.retry.per_try_timeout.map_or(remaining, |t| t.min(remaining));
            let client = ctx.clients.for_protocol(rt.spec.upstream_protocol);
            let kind = match tokio::time::timeout(per_try, client.request(request)).await {
                Ok(Ok(mut resp)) => {
                    let latency = started.elapsed();
                    let status = resp.status().as_u16();
                    let counted =
                        rt.record_response(&route.name, member, status, latency.as_secs_f64());
                    let outcome = if resp.status().is_server_error() {
                        Outcome::Failure { kind: FailureKind::Status5xx, latency }
                    } else {
                        Outcome::Success { latency }
                    };
                    let member_upgrade = (resp.status() == StatusCode::SWITCHING_PROTOCOLS)
                        .then(|| hyper::upgrade::on(&mut resp));
                    let (mut rparts, rbody) = resp.into_parts();
                    match (client_upgrade, member_upgrade) {
                        (Some(c), Some(m)) => {
                            conn.upgraded();
                            tunnel(rt.clone(), member, c, m);
                        }
                        _ => strip_hop_by_hop(&mut rparts.headers, false),
                    }
                    append_via(&mut rparts.headers, rparts.version);
                    if let Some(cookie) = choice.set_cookie {
                        rparts.headers.append(header::SET_COOKIE, cookie);
                    }
                    // From here the response body's end reports the outcome.
                    begun.disarm();
                    let finish = Finish::default()
                        .request(rt.clone(), member, outcome)
                        .conn(conn.clone(), route.idle_timeout)
                        .served(counted, slot.clone(), tries, choice.reason);
                    return Ok(Response::from_parts(rparts, ProxyBody::upstream(rbody, finish)));
                }
                Ok(Err(e)) => {
                    if caused_by::<TooLarge>(&e) {
                        begun.end(Outcome::Cancelled);
                        return Err(fail(
                            Kind::BodyTooLarge,
                            format!("request body over the limit of {limit} bytes"),
                        ));
                    }
                    if caused_by::<ClientBodyError>(&e) {
                        // The client's body failed (aborted mid-way): not the member's fault.
                        begun.end(Outcome::Cancelled);
                        return Err(fail(
                            Kind::ClientBody,
                            "the request body broke off before it was complete".to_owned(),
                        ));
                    }
                    let (kind, failure) = if e.is_connect() {
                        (Kind::Connect, FailureKind::Connect)
                    } else {
                        (Kind::Reset, FailureKind::Reset)
                    };
                    begun.end(Outcome::Failure { kind: failure, latency: started.elapsed() });
                    kind
                }
                Err(_elapsed) => {
                    if slot.as_ref().is_some_and(BodySlot::stalled_by_client) {
                        // The try waited on the client's body, not on the member: 408, and the
                        // member is not charged.
                        begun.end(Outcome::Cancelled);
                        return Err(fail(
                            Kind::ClientBodyTimeout,
                            "the request body did not arrive in time".to_owned(),
                        ));
                    }
                    let latency = started.elapsed();
                    begun.end(Outcome::Failure { kind: FailureKind::Timeout, latency });
                    Kind::Timeout
                }
            };
            let name = &rt.spec.members[member].name;
            tracing::debug!(route = %route.name, cluster = %cluster, member = %name, ?kind, "attempt failed");
            let member = Some(name.clone());
            attempts.push(Attempt { cluster: cluster.clone(), member, outcome: kind });
            sent |= kind != Kind::Connect;
            // The body can be sent again only if no try has read from it. Then a connect failure
            // sent nothing, so any request may go elsewhere; after a reset or a timeout the
            // member may have acted on the head, so only idempotent requests go again.
            let untouched = slot.as_ref().is_none_or(BodySlot::is_untouched);
            let may_retry = untouched && (kind == Kind::Connect || idempotent);
            if !may_retry || Instant::now() >= deadline {
                break 'clusters;
            }
        }
    }
    let kind = [Kind::Timeout, Kind::Reset, Kind::Connect]
        .into_iter()
        .find(|k| attempts.iter().any(|a| a.outcome == *k))
        .unwrap_or(Kind::NoEligible);
    let mut detail = match kind {
        Kind::Timeout => "member too slow: no response in time".to_owned(),
        Kind::NoEligible => "no eligible member to serve the request".to_owned(),
        _ => "bad gateway: no member answered".to_owned(),
    };
    if budget_exhausted {
        detail.push_str(" (retry budget exhausted)");
    }
    let mut e = ProxyError::on_route(kind, &route.name, &route.cluster, detail);
    e.attempts = attempts;
    Err((e, route.idle_timeout))
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
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
/// was recorded or the response body took over.
struct Begun {
    rt: Arc<ClusterRt>,
    member: usize,
    armed: bool,
}

impl Begun {
    fn end(mut self, outcome: Outcome) {
        self.armed = false;
        self.rt.end_request(self.member, outcome);
    }

    fn disarm(mut self) {
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

fn upstream_request(
    parts: &Parts,
    rt: &ClusterRt,
    member: usize,
    path_and_query: &PathAndQuery,
    body: UpstreamBody,
) -> Request<UpstreamBody> {
    let mut uri = uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    // Parsed once per view (`ClusterRt::authorities`), not per request.
    uri.authority = rt.authorities[member].clone();
    uri.path_and_query = Some(path_and_query.clone());
    let uri = Uri::from_parts(uri).unwrap_or_default();
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = parts.headers.clone();
    *req.version_mut() = match rt.spec.upstream_protocol {
        rondo_core::UpstreamProtocol::Http2 => Version::HTTP_2,
        _ => Version::HTTP_11,
    };
    req
}

struct Choice {
    member: usize,
    set_cookie: Option<HeaderValue>,
    /// Why this member (for the access log).
    reason: Reason,
}

/// Places a request: on its session's member when it has one that can keep it, else through
/// the cluster's picker (which also counts the request as begun).
fn choose(
    ctx: &HttpCtx,
    rt: &Arc<ClusterRt>,
    parts: &Parts,
    peer: SocketAddr,
    tried: &[usize],
    now: rondo_core::Instant,
) -> Result<Choice, PickError> {
    let spec = &rt.spec;
    let session = spec.policy.granularity == Granularity::Session;
    let mut header_session = None;
    if session {
        let held = match &spec.sticky.header {
            Some(h) => {
                let id = parts.headers.get(h.as_str()).and_then(|v| v.to_str().ok());
                header_session = id;
                id.and_then(|id| ctx.sessions.get(rt, id))
            }
            None => sticky::cookie(&parts.headers, &spec.sticky.cookie)
                .and_then(|t| sticky::member_by_token(spec, t)),
        };
        if let Some(m) = held
            && !tried.contains(&m)
            && rt.keep_and_begin(m, now)
        {
            return Ok(Choice { member: m, set_cookie: None, reason: Reason::Session });
        }
        ctx.sessions.sweep();
    }
    let hash = (spec.policy.algorithm == rondo_core::Algorithm::Hash)
        .then(|| hash_key(&spec.policy.hash.key, parts, peer))
        .flatten();
    let group = ctx.live.group.as_deref();
    let d = rt.pick_and_begin(&PickRequest { now, group, hash, context: None, exclude: tried })?;
    let mut set_cookie = None;
    if session {
        match header_session {
            Some(id) => ctx.sessions.pin(rt, id, d.member),
            None if spec.sticky.header.is_none() => {
                let token = sticky::token(&spec.members[d.member].name);
                let cookie =
                    format!("{}={token}; Path=/; HttpOnly; SameSite=Lax", spec.sticky.cookie);
                set_cookie = HeaderValue::from_str(&cookie).ok();
            }
            None => {}
        }
    }
    Ok(Choice { member: d.member, set_cookie, reason: Reason::Pick(d.algorithm, d.why) })
}

fn hash_key(source: &HashKeySource, parts: &Parts, peer: SocketAddr) -> Option<u64> {
    use rondo_core::hash::hash_key;
    match source {
        HashKeySource::ClientAddress => Some(match peer.ip() {
            std::net::IpAddr::V4(ip) => hash_key(&ip.octets()),
            std::net::IpAddr::V6(ip) => hash_key(&ip.octets()),
        }),
        HashKeySource::Header(h) => parts.headers.get(h.as_str()).map(|v| hash_key(v.as_bytes())),
        HashKeySource::Cookie(c) => {
            sticky::cookie(&parts.headers, c).map(|v| hash_key(v.as_bytes()))
        }
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
