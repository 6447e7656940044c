//! The naming HTTP API, on its own listener (`[naming] listen`). JSON bodies in the
//! `rondo_core::wire` format; every response carries the view id in the `rondo-view-id`
//! header; every error is `{"error": "..."}` naming what failed.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /v1/services` | `{"view_id", "services": [names]}` |
//! | `GET /v1/services/{service}` | [`Answer`](rondo_core::wire::Answer): eligible members, policy, view id |
//! | `GET /v1/lookup/{service}?key=&group=` | [`Lookup`](rondo_core::wire::Lookup): one member picked by the policy |
//! | `PUT /v1/services/{service}/members/{member}` | [`Register`] in, [`Lease`](rondo_core::wire::Lease) out |
//! | `POST /v1/leases/{lease}/keepalive` | [`Lease`](rondo_core::wire::Lease) |
//! | `DELETE /v1/services/{service}/members/{member}` | 204 |
//! | `GET /v1/watch?after=N&timeout_ms=T` | [`Watch`](rondo_core::wire::Watch), as soon as the view id passes N |
//! | `PUT /v1/config` | the tier's shared config (TOML; etcd registry only) |
//! | `GET /v1/status` | registry backend, connection, counts, view id |
//!
//! With `[naming] token` set, every call that changes something (PUT, POST, DELETE) needs
//! `Authorization: Bearer <token>` (401 otherwise); lookups, answers, watches and status stay
//! open so that any caller can balance.

// Handlers return a ready error response as `Err`; they are not on the data path.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use rondo_core::MemberSpec;
use rondo_core::wire::{self, Register, VIEW_ID_HEADER};
use rondo_runtime::Live;
use serde_json::json;

use crate::answer::{self, AnswerError, LookupFacts};
use crate::registry::{DEFAULT_TTL, MAX_TTL, MIN_TTL, Registration, Registry, RegistryError};

/// Default `timeout_ms` of a watch.
pub const DEFAULT_WATCH: Duration = Duration::from_secs(30);
/// Longest `timeout_ms` of a watch.
pub const MAX_WATCH: Duration = Duration::from_secs(300);
/// Default weight of a registered member.
pub const DEFAULT_WEIGHT: u32 = 100;

/// A running naming API.
#[derive(Debug)]
pub struct NamingServer {
    /// The bound address.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    touch: tokio::task::JoinHandle<()>,
}

impl NamingServer {
    /// Stops accepting connections.
    pub fn stop(&self) {
        self.task.abort();
        self.touch.abort();
    }
}

impl Drop for NamingServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone)]
struct AppState {
    live: Arc<Live>,
    registry: Registry,
    token: Option<Arc<Vec<u8>>>,
}

/// Binds `listen` and serves the naming API on the current tokio runtime; `token`, when set,
/// guards the calls that change something.
pub async fn start(
    listen: SocketAddr,
    live: Arc<Live>,
    registry: Registry,
    token: Option<Vec<u8>>,
) -> std::io::Result<NamingServer> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    // Member state changes (drain, health, agent availability) become new view ids, so that
    // watchers refetch answers that changed.
    let touch = Live::spawn_touch(&live);
    let app = router(live, registry, token);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "naming API stopped");
        }
    });
    Ok(NamingServer { addr, task, touch })
}

/// The API as an axum router (for embedding).
pub fn router(live: Arc<Live>, registry: Registry, token: Option<Vec<u8>>) -> Router {
    let state = AppState { live, registry, token: token.map(Arc::new) };
    Router::new()
        .route("/v1/services", get(services))
        .route("/v1/services/{service}", get(full_answer))
        .route("/v1/lookup/{service}", get(lookup))
        .route("/v1/services/{service}/members/{member}", put(register).delete(deregister))
        .route("/v1/leases/{lease}/keepalive", post(keepalive))
        .route("/v1/watch", get(watch))
        .route("/v1/config", put(put_config))
        .route("/v1/status", get(status))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
        })
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(state.clone(), view_id_header))
        .with_state(state)
}

/// `{"error": message}` with `status`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(wire::Error { error: message.into() })).into_response()
}

fn registry_error(e: RegistryError) -> Response {
    let status = match &e {
        RegistryError::NotFound(_) => StatusCode::NOT_FOUND,
        RegistryError::Invalid(_) => StatusCode::BAD_REQUEST,
        RegistryError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        RegistryError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
    };
    error(status, e.to_string())
}

fn answer_error(e: AnswerError) -> Response {
    match e {
        AnswerError::UnknownService { .. } => error(StatusCode::NOT_FOUND, e.to_string()),
        AnswerError::NoMember(_) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// With a token configured, calls other than GET need it.
async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &st.token
        && !matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD)
    {
        let given = req.headers().get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
        if !rondo_runtime::secret::bearer_matches(given, token) {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong naming token: send `Authorization: Bearer <token>`",
            );
            r.headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

/// Errors produced by axum itself (a path that is not UTF-8, a body over the 2 MiB limit) come
/// as plain text: reshaped into `{"error": ...}` like every other error.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(resp.status().is_client_error() || resp.status().is_server_error()) {
        return resp;
    }
    let status = resp.status();
    let text = match axum::body::to_bytes(resp.into_body(), 64 * 1024).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).trim().to_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    error(status, text)
}

/// Sets `rondo-view-id` on every response that did not set it (to the current view).
async fn view_id_header(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if !resp.headers().contains_key(VIEW_ID_HEADER) {
        let id = st.live.load().view.id;
        resp.headers_mut().insert(VIEW_ID_HEADER, HeaderValue::from(id));
    }
    resp
}

fn with_view(view_id: u64, body: impl serde::Serialize) -> Response {
    let mut resp = axum::Json(body).into_response();
    resp.headers_mut().insert(VIEW_ID_HEADER, HeaderValue::from(view_id));
    resp
}

async fn services(State(st): State<AppState>) -> Response {
    let snap = st.live.load();
    let names: Vec<&String> = snap.view.clusters.keys().collect();
    with_view(snap.view.id, json!({ "view_id": snap.view.id, "services": names }))
}

async fn full_answer(State(st): State<AppState>, Path(service): Path<String>) -> Response {
    let snap = st.live.load();
    match answer::answer(&snap, &service) {
        Ok(a) => with_view(a.view_id, a),
        Err(e) => answer_error(e),
    }
}

async fn lookup(
    State(st): State<AppState>,
    Path(service): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let snap = st.live.load();
    let group = q.get("group").map(String::as_str).or(st.live.group.as_deref());
    let facts = LookupFacts { group, key: q.get("key").map(String::as_str) };
    match answer::lookup(&snap, &service, facts) {
        Ok(l) => with_view(l.view_id, l),
        Err(e) => answer_error(e),
    }
}

/// Member names: what the config file allows (letters, digits, `.`, `_`, `-`; 1 to 128).
fn check_name(what: &str, name: &str) -> Result<(), Response> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(error(
            StatusCode::BAD_REQUEST,
            format!("{what} `{name}`: use 1 to 128 letters, digits, `.`, `_` or `-`"),
        ))
    }
}

/// `host:port` with a port in 1..=65535.
fn check_address(address: &str) -> Result<(), Response> {
    let bad = || {
        error(
            StatusCode::BAD_REQUEST,
            format!("field `address`: `{address}` is not host:port (e.g. 127.0.0.1:8001)"),
        )
    };
    if address.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0) {
        return Ok(());
    }
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'));
    if port_ok && host_ok { Ok(()) } else { Err(bad()) }
}

fn registration(
    st: &AppState,
    service: &str,
    member: &str,
    bytes: &[u8],
) -> Result<Registration, Response> {
    let body: Register = serde_json::from_slice(bytes).map_err(|e| {
        error(StatusCode::BAD_REQUEST, format!("invalid registration body (JSON): {e}"))
    })?;
    check_name("member", member)?;
    check_address(&body.address)?;
    let weight = body.weight.unwrap_or(DEFAULT_WEIGHT);
    if !(1..=rondo_config::MAX_WEIGHT).contains(&u64::from(weight)) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("field `weight`: {weight} is out of range 1..={}", rondo_config::MAX_WEIGHT),
        ));
    }
    if let Some(g) = &body.group {
        check_name("field `group`", g)?;
    }
    let ttl = body.ttl_ms.map_or(DEFAULT_TTL, Duration::from_millis);
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "field `ttl_ms`: {} is out of range {}..={}",
                ttl.as_millis(),
                MIN_TTL.as_millis(),
                MAX_TTL.as_millis()
            ),
        ));
    }
    let configured = st.live.configured();
    let Some(cluster) = configured.clusters.get(service) else {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown service `{service}`: members register into a cluster of the configuration"
            ),
        ));
    };
    if cluster.members.iter().any(|m| m.name == member) {
        return Err(error(
            StatusCode::CONFLICT,
            format!("member `{member}` of service `{service}` is configured, not registered"),
        ));
    }
    Ok(Registration {
        cluster: service.to_owned(),
        member: MemberSpec {
            name: member.to_owned(),
            address: body.address,
            weight,
            group: body.group,
            admin: rondo_core::AdminState::Active,
        },
        ttl,
    })
}

async fn register(
    State(st): State<AppState>,
    Path((service, member)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let reg = match registration(&st, &service, &member, &bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match st.registry.register(reg).await {
        Ok(lease) => axum::Json(lease).into_response(),
        Err(e) => registry_error(e),
    }
}

async fn keepalive(State(st): State<AppState>, Path(lease): Path<String>) -> Response {
    match st.registry.keepalive(&lease).await {
        Ok(lease) => axum::Json(lease).into_response(),
        Err(e) => registry_error(e),
    }
}

async fn deregister(
    State(st): State<AppState>,
    Path((service, member)): Path<(String, String)>,
) -> Response {
    match st.registry.deregister(&service, &member).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => registry_error(e),
    }
}

fn query_u64(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, Response> {
    q.get(name)
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                error(
                    StatusCode::BAD_REQUEST,
                    format!("query parameter `{name}`: `{v}` is not a whole number"),
                )
            })
        })
        .transpose()
}

async fn watch(State(st): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let (after, timeout) = match (query_u64(&q, "after"), query_u64(&q, "timeout_ms")) {
        (Ok(a), Ok(t)) => (a, t.map_or(DEFAULT_WATCH, Duration::from_millis)),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    if timeout > MAX_WATCH {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "query parameter `timeout_ms`: {} is above the maximum {}",
                timeout.as_millis(),
                MAX_WATCH.as_millis()
            ),
        );
    }
    let after = after.unwrap_or(0);
    let mut rx = st.live.subscribe();
    let changed =
        matches!(tokio::time::timeout(timeout, rx.wait_for(|id| *id > after)).await, Ok(Ok(_)));
    let view_id = *rx.borrow();
    with_view(view_id, wire::Watch { view_id, changed })
}

async fn put_config(State(st): State<AppState>, bytes: Bytes) -> Response {
    let text = match String::from_utf8(bytes.to_vec()) {
        Ok(t) => t,
        Err(_) => return error(StatusCode::BAD_REQUEST, "the config body is not UTF-8"),
    };
    match st.registry.put_config(text).await {
        Ok(()) => axum::Json(json!({ "stored": true })).into_response(),
        Err(e) => registry_error(e),
    }
}

async fn status(State(st): State<AppState>) -> Response {
    let s = st.registry.status();
    let view_id = st.live.load().view.id;
    with_view(
        view_id,
        json!({
            "view_id": view_id,
            "registry": {
                "backend": s.backend,
                "connected": s.connected,
                "detail": s.detail,
                "last_error": s.last_error,
                "registrations": s.registrations,
                "resyncs": s.resyncs,
            },
        }),
    )
}

/// A registration body (`PUT /v1/services/{service}/members/{member}`) parsed and checked as
/// that call does before it looks the service up: the member to register and its lease's time
/// to live, or the 400 answer naming what is wrong. A plain function over bytes, for the fuzz
/// target `naming_register` (`fuzz/`) and the tests that replay its corpus; never panics.
pub fn check_registration(member: &str, body: &[u8]) -> Result<(MemberSpec, Duration), Response> {
    let body: Register = serde_json::from_slice(body).map_err(|e| {
        error(StatusCode::BAD_REQUEST, format!("invalid registration body (JSON): {e}"))
    })?;
    check_name("member", member)?;
    check_address(&body.address)?;
    let weight = body.weight.unwrap_or(DEFAULT_WEIGHT);
    if !(1..=rondo_config::MAX_WEIGHT).contains(&u64::from(weight)) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("field `weight`: {weight} is out of range 1..={}", rondo_config::MAX_WEIGHT),
        ));
    }
    if let Some(g) = &body.group {
        check_name("field `group`", g)?;
    }
    let ttl = body.ttl_ms.map_or(DEFAULT_TTL, Duration::from_millis);
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "field `ttl_ms`: {} is out of range {}..={}",
                ttl.as_millis(),
                MIN_TTL.as_millis(),
                MAX_TTL.as_millis()
            ),
        ));
    }
    let spec = MemberSpec {
        name: member.to_owned(),
        address: body.address,
        weight,
        group: body.group,
        admin: rondo_core::AdminState::Active,
    };
    Ok((spec, ttl))
}
