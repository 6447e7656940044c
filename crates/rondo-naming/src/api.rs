//! The naming HTTP API, on its own listener (`[naming] listen`). JSON bodies in the
//! `rondo_core::wire` format; every response carries the view id in the `rondo-view-id`
//! header; every error is `{"error": "..."}` naming what failed.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /v1/services` | `{"view_id", "services": [names]}` |
//! | `GET /v1/services/{service}` | [`Answer`](rondo_core::wire::Answer): eligible members, policy, view id |
//! | `GET /v1/lookup/{service}?key=&group=&exclude=` | [`Lookup`](rondo_core::wire::Lookup): one member picked by the policy |
//! | `GET /v1/lookup/{service}[/path]?redirect=1` | 307 to the picked member's URL (`redirect.rs`) |
//! | `PUT /v1/services/{service}/members/{member}` | [`Register`] (and an optional `policy`) in, [`Lease`](rondo_core::wire::Lease) and `"policy"` out |
//! | `POST /v1/leases/{lease}/keepalive` | [`Lease`](rondo_core::wire::Lease) |
//! | `DELETE /v1/services/{service}/members/{member}` | 204 |
//! | `GET /v1/watch?after=N&timeout_ms=T` | [`Watch`](rondo_core::wire::Watch), as soon as the view id passes N |
//! | `PUT /v1/config` | the tier's shared config (TOML; etcd registry only) |
//! | `GET /v1/status` | registry backend, connection, counts, view id |
//!
//! With `[naming] token` set, every call that changes something (PUT, POST, DELETE) needs
//! `Authorization: Bearer <token>` (401 otherwise); lookups, answers, watches and status stay
//! open so that any caller can balance.
//!
//! Every call is checked first for its `Host` ([`rondo_runtime::host`]): the loopback names,
//! the listener's own address and `[naming] allowed_hosts` are answered, any other host gets
//! 403 naming it, so that a web page cannot drive the API through a rebound DNS name. A
//! registration at one of the process's own addresses (a listener: a request loop; the admin or
//! naming API: that API served on the public listener; the agent receiver) is refused with 409.
//!
//! A registration's `policy` (the fields of a `[cluster.NAME]` table, compiled by the config
//! file's code: 400 naming the field when bad) creates a cluster the configuration lacks with
//! that policy when `[naming] allow_registered_clusters` is on; later registrations must
//! declare the same or none (409 naming the first differing field and both values), and a
//! configured cluster keeps its file's policy (`"policy": "configured"` in the answer).

// Handlers return a ready error response as `Err`; they are not on the data path.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use rondo_core::MemberSpec;
use rondo_core::wire::{self, Register, VIEW_ID_HEADER};
use rondo_runtime::Views;

use crate::NamingParts;
use serde_json::json;

use crate::Registry;
use crate::answer::{self, AnswerError, LookupFacts};
use crate::parent::Parent;
use crate::registry::{self, DEFAULT_TTL, Declared, PolicyClaim, Registration, RegistryError};
use crate::{hierarchy, redirect};

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
    views: Views,
    /// This router's locality group, the default of a lookup's.
    group: Option<Arc<str>>,
    registry: Registry,
    token: Option<Arc<Vec<u8>>>,
    /// The bound address (for the `Host` check).
    listen: SocketAddr,
    allowed_hosts: Arc<Vec<String>>,
    own: Arc<Vec<OwnAddress>>,
    allow_declared: bool,
    /// The parent naming service (`[naming] parent`), with its watch task.
    parent: Option<(Arc<Parent>, Arc<AbortOnDrop>)>,
}

/// Stops a task when the last holder goes.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One of the process's own bound sockets, which a registration must not point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnAddress {
    /// What it is, for the error (`listener web`, `admin API`, `naming API`, `agent receiver`).
    pub what: String,
    /// The bound address.
    pub addr: SocketAddr,
}

/// How the API is set up beyond its registry.
#[derive(Debug, Clone, Default)]
pub struct ApiOptions {
    /// Required on calls that change something (`[naming] token`).
    pub token: Option<Vec<u8>>,
    /// Host names answered besides the loopback ones and the bound address.
    pub allowed_hosts: Vec<String>,
    /// The process's other bound sockets (listeners, admin API, agent receiver); the naming
    /// API's own address is added by [`start_with`].
    pub own: Vec<OwnAddress>,
    /// TLS on the API (`[naming] tls`): HTTPS only, the files watched and reloaded like a
    /// listener's.
    pub tls: Option<rondo_config::tls::ListenerTls>,
    /// A registration may create a cluster the configuration lacks, with the policy it
    /// declares (`[naming] allow_registered_clusters`).
    pub allow_registered_clusters: bool,
    /// The parent naming service's endpoints (`[naming] parent`): names not held here are
    /// looked up there ([`crate::parent`]).
    pub parent: Vec<String>,
}

/// Binds `listen` and serves the naming API on the current tokio runtime; `token`, when set,
/// guards the calls that change something.
pub async fn start(
    listen: SocketAddr,
    parts: &NamingParts,
    registry: Registry,
    token: Option<Vec<u8>>,
) -> std::io::Result<NamingServer> {
    start_with(listen, parts, registry, ApiOptions { token, ..ApiOptions::default() }).await
}

/// [`start`] with every option.
pub async fn start_with(
    listen: SocketAddr,
    parts: &NamingParts,
    registry: Registry,
    mut opts: ApiOptions,
) -> std::io::Result<NamingServer> {
    let listener = parts.sockets.tcp_listener("naming", listen)?;
    let addr = listener.local_addr()?;
    let tls = rondo_runtime::http_api::tls("[naming]", opts.tls.take().as_ref(), &parts.metrics)?;
    opts.own.push(OwnAddress { what: "naming API".to_owned(), addr });
    // Member state changes (drain, health, agent availability) become new view ids, so that
    // watchers refetch answers that changed.
    let touch = parts.views.spawn_touch();
    let app = router_with(addr, parts, registry, opts);
    let task =
        rondo_runtime::http_api::spawn("naming API", listener, tls, app, parts.drain.clone());
    Ok(NamingServer { addr, task, touch })
}

/// The API as an axum router (for embedding), answering loopback hosts only.
pub fn router(parts: &NamingParts, registry: Registry, token: Option<Vec<u8>>) -> Router {
    let listen = SocketAddr::from(([127, 0, 0, 1], 0));
    router_with(listen, parts, registry, ApiOptions { token, ..ApiOptions::default() })
}

/// The API bound at `listen` as an axum router, with every option.
pub fn router_with(
    listen: SocketAddr,
    parts: &NamingParts,
    registry: Registry,
    opts: ApiOptions,
) -> Router {
    let parent =
        Parent::start(&opts.parent, &parts.views).map(|(p, t)| (p, Arc::new(AbortOnDrop(t))));
    let state = AppState {
        parent,
        views: parts.views.clone(),
        group: parts.group.clone(),
        registry,
        token: opts.token.map(Arc::new),
        listen,
        allowed_hosts: Arc::new(opts.allowed_hosts),
        own: Arc::new(opts.own),
        allow_declared: opts.allow_registered_clusters,
    };
    Router::new()
        .route("/v1/services", get(services))
        .route("/v1/services/{service}", get(full_answer))
        .route("/v1/lookup/{service}", get(lookup))
        .route("/v1/lookup/{service}/{*rest}", get(lookup_at_path))
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
        .layer(middleware::from_fn_with_state(state.clone(), host_check))
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
        RegistryError::Full(_) => StatusCode::INSUFFICIENT_STORAGE,
        RegistryError::Conflict(_) => StatusCode::CONFLICT,
    };
    error(status, e.to_string())
}

fn answer_error(e: AnswerError) -> Response {
    match e {
        AnswerError::UnknownService { .. } => error(StatusCode::NOT_FOUND, e.to_string()),
        AnswerError::NoMember(_) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Only the names this listener is for (DNS rebinding); before the token, so that a page
/// learns nothing from the API.
async fn host_check(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| req.uri().authority().map(|a| a.as_str().as_bytes().to_vec()));
    match rondo_runtime::host::check_host(host.as_deref(), st.listen, &st.allowed_hosts) {
        Ok(()) => next.run(req).await,
        Err(e) => error(StatusCode::FORBIDDEN, e),
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
        let id = st.views.load().view.id;
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
    let snap = st.views.load();
    let names: Vec<&String> = snap.view.clusters.keys().collect();
    with_view(snap.view.id, json!({ "view_id": snap.view.id, "services": names }))
}

async fn full_answer(State(st): State<AppState>, Path(service): Path<String>) -> Response {
    let snap = st.views.load();
    match (answer::answer(&snap, &service), st.parent()) {
        (Ok(a), parent) => {
            let extra = hierarchy::local_fields(parent, &st.listen.to_string());
            hierarchy::marked(a.view_id, a, "local", extra)
        }
        (Err(AnswerError::UnknownService { .. }), Some(parent)) => {
            match hierarchy::entry(parent, &service).await {
                Ok(entry) => hierarchy::relayed_answer(parent, &entry, st.views.load().view.id),
                Err(resp) => resp,
            }
        }
        (Err(e), _) => answer_error(e),
    }
}

impl AppState {
    fn parent(&self) -> Option<&Parent> {
        self.parent.as_ref().map(|(p, _)| &**p)
    }
}

async fn lookup(
    State(st): State<AppState>,
    Path(service): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    RawQuery(raw): RawQuery,
) -> Response {
    lookup_with(&st, &service, "/", &q, raw.as_deref()).await
}

/// `GET /v1/lookup/{service}/{rest}?redirect=1`: the member's URL gets `/{rest}`.
async fn lookup_at_path(
    State(st): State<AppState>,
    Path((service, rest)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    RawQuery(raw): RawQuery,
) -> Response {
    if !matches!(redirect::wanted(q.get("redirect").map(String::as_str)), Ok(true)) {
        return bad_request(format!(
            "a path after the service name (`/{rest}`) is for redirect lookups: add `redirect=1`"
        ));
    }
    lookup_with(&st, &service, &format!("/{rest}"), &q, raw.as_deref()).await
}

/// A lookup, answered as JSON or, with `redirect=1`, as a 307 to the member at `rest`.
async fn lookup_with(
    st: &AppState,
    service: &str,
    rest: &str,
    q: &HashMap<String, String>,
    raw: Option<&str>,
) -> Response {
    let redirect = match redirect::wanted(q.get("redirect").map(String::as_str)) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let snap = st.views.load();
    let group = q.get("group").map(String::as_str).or(st.group.as_deref());
    // `exclude=a,b`: the members the caller already tried (at most the first 64 names count).
    let exclude: Vec<&str> = q
        .get("exclude")
        .map(|e| e.split(',').map(str::trim).filter(|n| !n.is_empty()).take(64).collect())
        .unwrap_or_default();
    let facts = LookupFacts { group, key: q.get("key").map(String::as_str), exclude: &exclude };
    let found = answer::lookup(&snap, service, facts);
    drop(snap);
    let query = || redirect::passed_query(raw);
    match (found, st.parent()) {
        (Ok(l), _) if redirect => {
            let mut resp = redirect::answer(&st.views.load(), &l, rest, query().as_deref());
            resp.headers_mut().insert(hierarchy::LEVEL_HEADER, HeaderValue::from_static("local"));
            resp
        }
        (Ok(l), parent) => {
            let extra = hierarchy::local_fields(parent, &st.listen.to_string());
            hierarchy::marked(l.view_id, l, "local", extra)
        }
        (Err(AnswerError::UnknownService { .. }), Some(parent)) => {
            let entry = match hierarchy::entry(parent, service).await {
                Ok(e) => e,
                Err(resp) => return resp,
            };
            let view_id = st.views.load().view.id;
            let key = q.get("key").map(String::as_str);
            match hierarchy::relayed_lookup(parent, &entry, view_id, group, key) {
                // The parent's cluster's TLS is not in its answer: its members are reached
                // with `http`.
                Ok((l, _)) if redirect => {
                    let mut resp = redirect::located("http", &l, rest, query().as_deref());
                    let level = HeaderValue::from_static("parent");
                    resp.headers_mut().insert(hierarchy::LEVEL_HEADER, level);
                    resp
                }
                Ok((_, resp)) | Err(resp) => resp,
            }
        }
        (Err(e), _) => answer_error(e),
    }
}

fn bad_request(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// Whether `address` reaches one of `own` (see [`rondo_config::address_reaches`]), also through
/// any local address when that socket is bound to all of them; the first one it reaches.
fn own_address<'a>(address: &str, own: &'a [OwnAddress]) -> Option<&'a OwnAddress> {
    own.iter().find(|o| {
        if rondo_config::address_reaches(address, o.addr) {
            return true;
        }
        if !o.addr.ip().is_unspecified() {
            return false;
        }
        // `0.0.0.0` or `[::]`: any address of this host with the port. An IP is this host's
        // when a socket can be bound to it.
        let Ok(a) = address.parse::<SocketAddr>() else { return false };
        a.port() == o.addr.port() && std::net::UdpSocket::bind((a.ip(), 0)).is_ok()
    })
}

fn registration(
    st: &AppState,
    service: &str,
    member: &str,
    bytes: &[u8],
) -> Result<Registration, Response> {
    let (spec, ttl) = check_registration(member, bytes)?;
    // A bad policy is refused wherever it goes (into a configured cluster it would be ignored,
    // but a deployment descriptor that does not compile is a mistake worth hearing about).
    let declared = declared_policy(service, bytes)?;
    if let Some(o) = own_address(&spec.address, &st.own) {
        return Err(error(
            StatusCode::CONFLICT,
            format!(
                "field `address`: `{}` is this router's own {} ({}): a member must be another \
                 server",
                spec.address, o.what, o.addr
            ),
        ));
    }
    // The view in effect, without the layers' lock (a batch being published holds it).
    let snap = st.views.load();
    let configured = snap.clusters.contains_key(service) && !snap.is_declared(service);
    let policy = if configured {
        PolicyClaim::Configured
    } else if st.allow_declared {
        registry::check_name("service", service).map_err(bad_request)?;
        match declared {
            Some(d) => PolicyClaim::Declare(Arc::new(d)),
            None => PolicyClaim::Join,
        }
    } else {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown service `{service}`: members register into a cluster of the configuration"
            ),
        ));
    };
    if configured && snap.is_configured(service, member) {
        return Err(error(
            StatusCode::CONFLICT,
            format!("member `{member}` of service `{service}` is configured, not registered"),
        ));
    }
    Ok(Registration { cluster: service.to_owned(), member: spec, ttl, policy })
}

/// The registration body's `policy` (the fields of a `[cluster.NAME]` table), compiled for
/// `service`; `None` when the body has none; the 400 answer naming the field when it is bad.
fn declared_policy(service: &str, bytes: &[u8]) -> Result<Option<Declared>, Response> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        policy: Option<serde_json::Value>,
    }
    let body: Body = serde_json::from_slice(bytes).map_err(|e| {
        error(StatusCode::BAD_REQUEST, format!("invalid registration body (JSON): {e}"))
    })?;
    body.policy.map(|raw| Declared::compile(service, raw).map_err(bad_request)).transpose()
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
    // Whose policy balances the member: the file's, or the one its registrations declared.
    let policy = match reg.policy {
        PolicyClaim::Configured => "configured",
        PolicyClaim::Join | PolicyClaim::Declare(_) => "declared",
    };
    match st.registry.register(reg).await {
        Ok(lease) => {
            axum::Json(json!({ "lease": lease.lease, "ttl_ms": lease.ttl_ms, "policy": policy }))
                .into_response()
        }
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
    let mut rx = st.views.subscribe();
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
    let view_id = st.views.load().view.id;
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
    registry::check_name("member", member).map_err(bad_request)?;
    registry::check_address(&body.address).map_err(bad_request)?;
    let weight = body.weight.unwrap_or(DEFAULT_WEIGHT);
    registry::check_weight(weight).map_err(bad_request)?;
    if let Some(g) = &body.group {
        registry::check_name("field `group`", g).map_err(bad_request)?;
    }
    let ttl = body.ttl_ms.map_or(DEFAULT_TTL, Duration::from_millis);
    registry::check_ttl(ttl).map_err(bad_request)?;
    let spec = MemberSpec {
        name: member.to_owned(),
        address: body.address,
        weight,
        group: body.group,
        admin: rondo_core::AdminState::Active,
    };
    Ok((spec, ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_bind_owns_every_local_address_with_its_port() {
        let own =
            [OwnAddress { what: "listener web".into(), addr: "0.0.0.0:18080".parse().unwrap() }];
        for a in [
            "127.0.0.1:18080",
            "localhost:18080",
            "127.0.0.9:18080",
            "[::1]:18080",
            "0.0.0.0:18080",
        ] {
            assert!(own_address(a, &own).is_some(), "{a}");
        }
        // Another port, a host name, an address that is not this host's (TEST-NET-1).
        for a in ["127.0.0.1:18081", "example.com:18080", "192.0.2.1:18080"] {
            assert!(own_address(a, &own).is_none(), "{a}");
        }
        let own =
            [OwnAddress { what: "admin API".into(), addr: "127.0.0.1:9900".parse().unwrap() }];
        assert!(own_address("127.0.0.1:9900", &own).is_some());
        assert!(own_address("127.0.0.2:9900", &own).is_none());
    }
}
