//! The intake of a `queue` listener: `POST /queues/{queue}[/more]` over HTTP/1.1 with any body
//! and header fields.
//!
//! | answer | when |
//! |---|---|
//! | `202 Accepted`, `{"id": "...", "queue": "..."}` and `X-Rondo-Message-Id` | the message is durable (its batch committed) |
//! | `400` | the body broke off |
//! | `408`, then the connection closes | no byte of the body arrived for the listener's `body_read_timeout_ms` |
//! | `401` with `WWW-Authenticate` | the matching route has `auth` and the message's sign-on token (or tier session) does not hold |
//! | `404` | no queue of that name, or no route of the listener matches the message |
//! | `405` with `Allow: POST` | another method |
//! | `413` | the body is over the queue's `max_message_bytes` |
//! | `503` with `Retry-After` | the queue is at `max_messages` or `max_bytes`, or its store failed (or is being reopened after an I/O error); or, as the connection's only answer, the listener is at `max_connections` |
//!
//! Routes match a message as they match a request (host, normalized path, method `POST`,
//! header fields), here to refuse what no route would deliver, and again at every delivery
//! attempt. Hop-by-hop header fields (and `Content-Length`, `Idempotency-Key`, `X-Rondo-*`,
//! which the delivery sets) are not kept. A route with `auth` checks the token at intake, as
//! the router's route stage does ([`rondo_identity::auth`]); the message then keeps the identity
//! it verified (`x-rondo-subject`, `x-rondo-claim-*`), which every attempt carries, however
//! much later. Identity headers a client sent, their underscore spellings and the tier session
//! cookie are never kept, on any route.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::QueueParts;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rondo_config::{ListenerSpec, QueueSpec};
use rondo_identity::auth::{self, Auth, Identity};
use rondo_runtime::reject::Rejecter;
use rondo_runtime::tls::server::{
    ALPN_HTTP1, CLIENT_CERT_SAN, CLIENT_CERT_SUBJECT, ClientCert, TlsServer, client_cert,
};
use tokio::sync::Semaphore;

use crate::store::{AppendError, Message, Store};

/// One queue as the intake sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its settings.
    pub spec: Arc<QueueSpec>,
    /// Its store.
    pub store: Arc<dyn Store>,
}

/// An answer of the intake.
type Answer = Response<Full<Bytes>>;
/// A refusal a step of the intake answers with (boxed: the request path carries only a pointer).
type Refusal = Box<Answer>;

struct Ctx {
    listener: ListenerSpec,
    queues: Arc<HashMap<String, Entry>>,
    parts: Arc<QueueParts>,
    auth: Auth,
}

/// Seconds a client is told to wait when a queue is full or its store failed.
pub const RETRY_AFTER_SECS: u32 = 1;

/// A running intake: its bound address, its connection slots and its accept loop.
#[derive(Debug)]
pub struct Intake {
    /// The bound address.
    pub addr: SocketAddr,
    slots: (Arc<Semaphore>, u32),
    accepting: tokio::task::JoinHandle<()>,
}

impl Intake {
    /// Resolves once the accept loop has ended (after the stop) and no connection is open.
    pub async fn drained(self) {
        let _ = self.accepting.await;
        let _ = self.slots.0.acquire_many(self.slots.1).await;
    }
}

/// Binds `spec`'s address and serves it until `stop` turns true. On the stop, a connection
/// still gets [`rondo_runtime::sockets::drain::IDLE_GRACE`] to send its request (answered) before it is
/// closed, like the router's.
pub async fn start(
    spec: &ListenerSpec,
    queues: Arc<HashMap<String, Entry>>,
    parts: Arc<QueueParts>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<Intake> {
    let socket = parts.sockets.config_listener("queue listener", spec)?;
    let addr = socket.local_addr()?;
    // TLS termination (`tls`): HTTP/1.1 only (ALPN `http/1.1`), certificates chosen by SNI,
    // client certificates as `client_auth` says, files reloaded when they change.
    let tls = match &spec.tls {
        None => None,
        Some(t) => {
            let server = TlsServer::new(
                &spec.name,
                t,
                ALPN_HTTP1,
                spec.header_read_timeout,
                parts.metrics.clone(),
            )
            .map_err(|e| {
                std::io::Error::other(format!("queue listener {}: tls: {e}", spec.name))
            })?;
            server.clone().watch(stop.clone());
            Some(server)
        }
    };
    let metrics = parts.metrics.listener(&spec.name);
    let ctx = Arc::new(Ctx { listener: spec.clone(), queues, parts, auth: Auth::default() });
    let limit = Arc::new(Semaphore::new(spec.max_connections as usize));
    let slots = (limit.clone(), spec.max_connections);
    // Connections over the limit get a 503 from one task for the whole listener, as on `http`
    // listeners: accepted and told to come back, not left unanswered in the backlog.
    let rejecter = Rejecter::spawn(&spec.name, spec.max_connections);
    let accepting = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                biased;
                _ = stop.changed() => return,
                a = socket.accept() => a,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(listener = %ctx.listener.name, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                metrics.refused.inc();
                // A TLS client cannot read a plain-text 503: it is closed at once.
                if tls.is_none() && rejecter.reject(stream) {
                    metrics.router_response(503, None, None);
                }
                continue;
            };
            let _ = stream.set_nodelay(true);
            let ctx = ctx.clone();
            let stop = stop.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tls {
                    None => serve_connection(TokioIo::new(stream), ctx, peer, None, stop).await,
                    Some(t) => match t.accept(stream).await {
                        Ok(s) => {
                            let cert = s
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| client_cert(c))
                                .unwrap_or_default();
                            serve_connection(TokioIo::new(s), ctx, peer, Some(cert), stop).await
                        }
                        Err(e) => tracing::debug!(listener = %ctx.listener.name, %peer, "{e}"),
                    },
                }
            });
        }
    });
    tracing::info!(listener = %spec.name, %addr, protocol = "queue", "listening");
    Ok(Intake { addr, slots, accepting })
}

/// Serves one connection (plain or TLS; `cert`: the TLS client's certificate, empty when it
/// sent none) until it closes, or until the stop and [`rondo_runtime::sockets::drain::IDLE_GRACE`].
async fn serve_connection<I>(
    io: TokioIo<I>,
    ctx: Arc<Ctx>,
    peer: SocketAddr,
    cert: Option<ClientCert>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let cert = cert.map(Arc::new);
    let service = hyper::service::service_fn(|req| handle(req, ctx.clone(), peer, cert.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(ctx.listener.header_read_timeout)
        .max_buf_size(ctx.listener.max_header_bytes.max(8192) as usize)
        .serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = async {
            let _ = stop.wait_for(|s| *s).await;
            tokio::time::sleep(rondo_runtime::sockets::drain::IDLE_GRACE).await;
        } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into() + "\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn busy(body: String) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::SERVICE_UNAVAILABLE, body);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

/// Why a message body was not read.
enum BodyFailure {
    /// Over the queue's `max_message_bytes`.
    TooLarge,
    /// The connection failed or closed before the body's end.
    BrokeOff,
    /// No byte arrived for the listener's `body_read_timeout_ms`.
    Stalled,
}

/// Reads a message body of at most `max` bytes, waiting at most `stall` for each next part of
/// it: an inactivity limit, so a slow client that keeps sending is never cut, and one that
/// stops cannot hold its connection slot for ever.
async fn read_body(mut body: Incoming, max: u64, stall: Duration) -> Result<Bytes, BodyFailure> {
    let mut bytes = BytesMut::new();
    loop {
        match tokio::time::timeout(stall, body.frame()).await {
            Err(_) => return Err(BodyFailure::Stalled),
            Ok(None) => return Ok(bytes.freeze()),
            Ok(Some(Err(_))) => return Err(BodyFailure::BrokeOff),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if (bytes.len() + data.len()) as u64 > max {
                        return Err(BodyFailure::TooLarge);
                    }
                    bytes.extend_from_slice(&data);
                }
            }
        }
    }
}

/// Header fields a message does not keep: hop-by-hop ones, the ones the connection names, and
/// those the delivery sets itself.
fn kept(name: &str, connection_named: &[String]) -> bool {
    !matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "proxy-authenticate"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "expect"
            | "idempotency-key"
            | "x-forwarded-for"
    ) && !name.starts_with("x-rondo-")
        && !connection_named.iter().any(|c| c == name)
}

async fn handle(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
    peer: SocketAddr,
    cert: Option<Arc<ClientCert>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(intake(req, &ctx, peer, cert.as_deref()).await)
}

async fn intake(
    mut req: Request<Incoming>,
    ctx: &Ctx,
    peer: SocketAddr,
    cert: Option<&ClientCert>,
) -> Answer {
    set_client_cert(req.headers_mut(), cert);
    // Routes match, and members get, the normalized path (`/queues/%6Frders` is `/queues/orders`).
    let path = rondo_core::path::normalize(req.uri().path())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let (name, entry) = match queue_of(ctx, &path, req.method()) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    let (mut parts, body) = match read_message(req, ctx, name, entry).await {
        Ok(m) => m,
        Err(r) => return *r,
    };
    let (identity, branches) = match route_message(ctx, &parts, &path, &body) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    // Identity headers (any spelling) and the tier session cookie never reach a member.
    auth::apply(&mut parts.headers, None);
    let session = entry.spec.session_header.as_deref().and_then(|h| {
        parts.headers.get(h).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    });
    let message = message(ctx, &parts, &path, body, identity, peer);
    match entry.store.append_all(copies(message, session, &branches)).await {
        Ok(ids) => accepted(name, &ids, &branches),
        Err(e @ AppendError::Full { .. }) => busy(e.to_string()),
        Err(e @ AppendError::Store { .. }) => {
            tracing::warn!(queue = %name, "message refused: {e}");
            busy(e.to_string())
        }
    }
}

/// What the client's TLS certificate says, and only that: copies a client sent are dropped
/// (on plain listeners too), and a TLS listener's messages say they came over https. Routes
/// match on them like on any header field.
fn set_client_cert(h: &mut http::HeaderMap, cert: Option<&ClientCert>) {
    h.remove(CLIENT_CERT_SUBJECT);
    h.remove(CLIENT_CERT_SAN);
    if let Some(cert) = cert {
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        if let Some(v) = &cert.subject {
            h.insert(CLIENT_CERT_SUBJECT, v.clone());
        }
        if let Some(v) = &cert.san {
            h.insert(CLIENT_CERT_SAN, v.clone());
        }
    }
}

/// The queue the (normalized) `path` names and its entry, or the 404 or 405 answer.
fn queue_of<'a>(
    ctx: &'a Ctx,
    path: &'a str,
    method: &http::Method,
) -> Result<(&'a str, &'a Entry), Refusal> {
    let Some(name) = path.strip_prefix("/queues/").map(|r| r.split('/').next().unwrap_or(r)) else {
        return Err(Box::new(text(
            StatusCode::NOT_FOUND,
            "messages are posted to /queues/{queue}",
        )));
    };
    let Some(entry) = ctx.queues.get(name) else {
        return Err(Box::new(text(StatusCode::NOT_FOUND, format!("no queue named `{name}`"))));
    };
    if method != http::Method::POST {
        let mut r =
            text(StatusCode::METHOD_NOT_ALLOWED, "messages are posted: POST /queues/{queue}");
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(Box::new(r));
    }
    Ok((name, entry))
}

/// The message's head and its whole body, or the answer: 413 over the queue's
/// `max_message_bytes` (declared or read), 400 when the body broke off, 408 when it stalled.
async fn read_message(
    req: Request<Incoming>,
    ctx: &Ctx,
    name: &str,
    entry: &Entry,
) -> Result<(http::request::Parts, Bytes), Refusal> {
    let max = entry.spec.max_message_bytes;
    let too_large = || {
        entry.store.count_too_large();
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the message is larger than queue {name}'s max_message_bytes ({max})"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(Box::new(too_large()));
    }
    let (parts, body) = req.into_parts();
    let stall = ctx.listener.body_read_timeout;
    match read_body(body, max, stall).await {
        Ok(b) => Ok((parts, b)),
        Err(BodyFailure::TooLarge) => Err(Box::new(too_large())),
        Err(BodyFailure::BrokeOff) => {
            Err(Box::new(text(StatusCode::BAD_REQUEST, "the message body broke off")))
        }
        Err(BodyFailure::Stalled) => {
            // The rest of the body may still come: the connection cannot carry another
            // request, and closing it frees its slot.
            let detail = format!(
                "no byte of the message body arrived for {} ms (body_read_timeout_ms)",
                stall.as_millis()
            );
            let mut r = text(StatusCode::REQUEST_TIMEOUT, detail);
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(Box::new(r))
        }
    }
}

/// Routes match the message as they would a request (body filters read its body); none: it
/// would never be delivered (404). A route with `auth` admits only a message whose token holds
/// (else 401). Returns the identity the route verified and the route's multicast branches.
fn route_message(
    ctx: &Ctx,
    parts: &http::request::Parts,
    path: &str,
    body: &Bytes,
) -> Result<(Option<Identity>, Vec<String>), Refusal> {
    let snapshot = ctx.parts.views.load();
    let headers = &parts.headers;
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let present = |n: &str| headers.contains_key(n);
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()))
        .map(|h| h.rsplit_once(':').map_or(h, |(h, _)| h));
    let facts = rondo_core::RequestFacts {
        host,
        path,
        query: parts.uri.query(),
        method: "POST",
        header: &header,
        present: &present,
        body: Some(rondo_core::BodyPeek { bytes: body, complete: true }),
    };
    let Some(route) = snapshot.view.route(&ctx.listener.name, &facts) else {
        return Err(Box::new(text(
            StatusCode::NOT_FOUND,
            format!("no route of listener {} matches the message", ctx.listener.name),
        )));
    };
    // A multicast route's message is kept once per branch, all copies or none.
    let branches = route.multicast.iter().map(|b| b.cluster.clone()).collect();
    match ctx.auth.gate(route, ctx.parts.gate(), headers) {
        Ok(identity) => Ok((identity, branches)),
        Err(e) => {
            let mut r = text(e.refusal.status(), format!("route {}: {}", route.name, e.detail));
            r.headers_mut().insert(header::WWW_AUTHENTICATE, e.refusal.challenge());
            Err(Box::new(r))
        }
    }
}

/// The message as it is kept: the header fields a member may get ([`kept`]) and the identity
/// the route verified, the path with its query, the body and the client's address.
fn message(
    ctx: &Ctx,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
    identity: Option<Identity>,
    peer: SocketAddr,
) -> Message {
    let connection_named: Vec<String> = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    let headers: Vec<(String, Bytes)> = parts
        .headers
        .iter()
        .filter(|(n, _)| kept(n.as_str(), &connection_named))
        .chain(identity.iter().flat_map(Identity::headers))
        .map(|(n, v)| (n.as_str().to_owned(), Bytes::copy_from_slice(v.as_bytes())))
        .collect();
    let full_path = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    Message {
        listener: ctx.listener.name.clone(),
        path: full_path,
        headers,
        body,
        peer: Some(peer.ip()),
        branch: None,
    }
}

/// The 202 of a durable message: its id (and each multicast branch's copy's id).
fn accepted(name: &str, ids: &[String], branches: &[String]) -> Answer {
    let id = ids.first().cloned().unwrap_or_default();
    let listed: Vec<String> = branches
        .iter()
        .zip(ids.iter().skip(1))
        .map(|(b, id)| format!("\"{b}\":\"{id}\""))
        .collect();
    let body = match listed.is_empty() {
        true => format!("{{\"id\":\"{id}\",\"queue\":\"{name}\"}}\n"),
        false => format!(
            "{{\"id\":\"{id}\",\"queue\":\"{name}\",\"branches\":{{{}}}}}\n",
            listed.join(",")
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::ACCEPTED;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert("x-rondo-message-id", v);
    }
    r
}

/// The copies a message is kept as: itself for the route's cluster, then one per multicast
/// branch. Each branch orders its own session (its key gets ` @BRANCH`), so a branch that
/// cannot deliver holds back only its own copies.
fn copies(
    message: Message,
    session: Option<String>,
    branches: &[String],
) -> Vec<(Message, Option<String>)> {
    let mut out = Vec::with_capacity(1 + branches.len());
    for b in branches {
        let copy = Message { branch: Some(b.clone()), ..message.clone() };
        out.push((copy, session.as_ref().map(|s| format!("{s} @{b}"))));
    }
    out.insert(0, (message, session));
    out
}
