//! The admin API's routes and handlers.
//!
//! Every change (member state, weight, algorithm, config) may name the view it was decided on
//! with `If-Match: "<view id>"` (the `ETag` of `GET /api/v1/status`): when the view in effect is
//! another one, nothing changes and the answer is 409 naming the current view. The check and the
//! change happen under the live state's replacement lock, so no view can slip in between.

// Handlers return a ready error response as `Err`; they are not on the data path.
#![allow(clippy::result_large_err)]

mod defaults;
mod explain;
mod revocations;
mod shadow;
mod status;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post, put};
use rondo_config::AdminSpec;
use rondo_core::{Actor, AdminState, Algorithm, View};
use rondo_runtime::{ClusterRt, Snapshot, probe};

use crate::AdminParts;
use serde::Deserialize;
use serde_json::{Value, json};

pub use crate::operator::OPERATOR_HEADER;
use crate::operator::operator;

/// A running admin API.
pub struct AdminServer {
    /// The bound address.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    tls: bool,
    /// The token, for the dashboard link only (kept out of `Debug`).
    token: Option<Arc<Vec<u8>>>,
    /// The probe listener of its own (`probe_listen`): its address and task.
    probes: Option<(SocketAddr, tokio::task::JoinHandle<()>)>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer").field("addr", &self.addr).field("tls", &self.tls).finish()
    }
}

impl AdminServer {
    /// `https` with `tls`, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The dashboard's address, carrying the token in the fragment when `with_token` and a token
    /// is configured (made by `dashboard::link`).
    pub fn dashboard_link(&self, with_token: bool) -> String {
        let token = self.token.as_deref().filter(|_| with_token).map(Vec::as_slice);
        crate::dashboard::link(self.scheme(), self.addr, token)
    }

    /// The address of the probe listener of its own (`probe_listen`), if any.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probes.as_ref().map(|(a, _)| *a)
    }

    /// Stops accepting connections.
    pub fn stop(&self) {
        self.task.abort();
        if let Some((_, t)) = &self.probes {
            t.abort();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Clone)]
struct AppState {
    parts: Arc<AdminParts>,
    token: Option<Arc<Vec<u8>>>,
}

/// Binds `[admin] listen` and serves the API on the current tokio runtime, over TLS when
/// `[admin] tls` is set (its files then watched and reloaded like a listener's).
pub async fn start(spec: &AdminSpec, parts: AdminParts) -> std::io::Result<AdminServer> {
    let parts = Arc::new(parts);
    let token = match &spec.token {
        Some(t) => Some(crate::read_token(t)?),
        None => None,
    };
    if token.is_none() {
        tracing::warn!(
            listen = %spec.listen,
            "admin API has no token configured: every call will be refused with 403"
        );
    }
    let listener = parts.sockets.tcp_listener("admin", spec.listen)?;
    let addr = listener.local_addr()?;
    let tls = rondo_runtime::http_api::tls("[admin]", spec.tls.as_ref(), &parts.metrics)?;
    let drain = parts.drain.clone();
    let mut app = router_of(parts.clone(), token.clone());
    let probes = match spec.probes.listen {
        None => {
            app = app.merge(crate::probes::routes(&parts, &spec.probes));
            None
        }
        Some(at) => {
            let listener = parts.sockets.tcp_listener("admin-probes", at).map_err(|e| {
                std::io::Error::new(e.kind(), format!("its probe listener on {at}: {e}"))
            })?;
            let addr = listener.local_addr()?;
            let own = crate::probes::own_listener(&parts, &spec.probes);
            let task = rondo_runtime::http_api::spawn(
                "probe listener",
                listener,
                None,
                own,
                drain.clone(),
            );
            Some((addr, task))
        }
    };
    let token = token.map(Arc::new);
    let task = rondo_runtime::http_api::spawn("admin API", listener, tls, app, drain);
    Ok(AdminServer { addr, task, tls: spec.tls.is_some(), token, probes })
}

/// The API as an axum router (for embedding); `token: None` refuses every call with 403.
pub fn router(parts: AdminParts, token: Option<Vec<u8>>) -> Router {
    router_of(Arc::new(parts), token)
}

fn router_of(parts: Arc<AdminParts>, token: Option<Vec<u8>>) -> Router {
    let state = AppState { parts, token: token.map(Arc::new) };
    let member = "/api/v1/clusters/{cluster}/members/{member}";
    Router::new()
        .route("/api/v1/status", get(status::status))
        .route(&format!("{member}/drain"), set_admin_to(AdminState::Draining))
        .route(&format!("{member}/undrain"), set_admin_to(AdminState::Active))
        .route(&format!("{member}/disable"), set_admin_to(AdminState::Disabled))
        .route(&format!("{member}/enable"), set_admin_to(AdminState::Active))
        .route(&format!("{member}/weight"), put(weight))
        .route("/api/v1/clusters/{cluster}/algorithm", put(algorithm))
        .route("/api/v1/clusters/{cluster}/explain", get(explain::explain))
        .route(
            "/api/v1/clusters/{cluster}/shadow",
            get(shadow::report).put(shadow::start).delete(shadow::stop),
        )
        .route("/api/v1/config", post(config))
        .route(
            "/api/v1/defaults",
            get(defaults::show).put(defaults::put).delete(defaults::remove),
        )
        .route("/api/v1/revocations", get(revocations::list).post(revocations::revoke))
        .route("/api/v1/upgrade", post(upgrade))
        .merge(crate::metrics::routes(state.parts.clone()))
        .merge(crate::queues::routes(state.parts.metrics.clone()))
        .merge(crate::members::routes(state.parts.views.clone()))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: mutations are POST or PUT (DELETE stops a shadow or removes the runtime defaults)",
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .merge(crate::dashboard::routes()) // after the auth layer: the page needs no token
        .with_state(state)
}

/// `{"error": message}` with `status`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

/// `body` as JSON with the `ETag` of view `view`.
fn with_etag(view: u64, body: Value) -> Response {
    let mut r = axum::Json(body).into_response();
    if let Ok(v) = format!("\"{view}\"").parse() {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

/// The view id a change's `If-Match` asks for: `None` without the header (or with `*`), a 400
/// when it is not one view id. Quotes and a weak `W/` prefix are accepted, so the `ETag` of a
/// status answer can be sent back as it is.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, Response> {
    let Some(value) = headers.get(header::IF_MATCH) else { return Ok(None) };
    let bad = |shown: &str| {
        error(
            StatusCode::BAD_REQUEST,
            format!(
                "If-Match must be one view id like \"7\" (the ETag of GET /api/v1/status), \
                 got `{shown}`"
            ),
        )
    };
    let Ok(text) = value.to_str() else { return Err(bad("(not ASCII)")) };
    let text = text.trim();
    if text == "*" {
        return Ok(None);
    }
    let id = text.strip_prefix("W/").unwrap_or(text);
    let id = id.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(id);
    id.parse().map(Some).map_err(|_| bad(&text.escape_debug().to_string()))
}

/// The 409 of a change decided on view `expected` while `current` is in effect.
fn conflict(current: u64, expected: u64) -> Response {
    let mut r = (
        StatusCode::CONFLICT,
        axum::Json(json!({
            "error": format!(
                "the view is {current}, not {expected} (If-Match): it changed since you read \
                 it; nothing was changed, read the status again and retry"
            ),
            "view": current,
        })),
    )
        .into_response();
    if let Ok(v) = format!("\"{current}\"").parse() {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &st.token else {
        return error(StatusCode::FORBIDDEN, "admin API has no token configured");
    };
    let given = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if !rondo_runtime::secret::bearer_matches(given, token) {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong admin token: send `Authorization: Bearer <token>`",
        );
        r.headers_mut().insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("valid header"));
        return r;
    }
    next.run(req).await
}

/// The cluster runtime and member index named in the URL, or a 404 naming what is unknown.
fn find(
    snap: &Snapshot,
    cluster: &str,
    member: Option<&str>,
) -> Result<(Arc<ClusterRt>, usize), Response> {
    let Some(rt) = snap.clusters.get(cluster) else {
        return Err(error(StatusCode::NOT_FOUND, format!("unknown cluster `{cluster}`")));
    };
    let Some(member) = member else { return Ok((rt.clone(), 0)) };
    match rt.spec.members.iter().position(|m| m.name == member) {
        Some(i) => Ok((rt.clone(), i)),
        None => Err(error(
            StatusCode::NOT_FOUND,
            format!("unknown member `{member}` in cluster `{cluster}`"),
        )),
    }
}

fn set_admin(
    st: &AppState,
    headers: &HeaderMap,
    cluster: &str,
    member: &str,
    to: AdminState,
) -> Response {
    let expected = match if_match(headers) {
        Ok(e) => e,
        Err(r) => return r,
    };
    let by = Actor::Operator(operator(headers));
    let by_text = by.to_string();
    // Checked and set while no view can be swapped in.
    let done = st.parts.views.with_current(|snap| {
        if let Some(e) = expected
            && snap.view.id != e
        {
            return Err(conflict(snap.view.id, e));
        }
        let (rt, idx) = find(snap, cluster, Some(member))?;
        rt.set_admin(idx, to, by);
        Ok((rt, snap.view.id))
    });
    let (rt, view) = match done {
        Ok(x) => x,
        Err(r) => return r,
    };
    rt.state_changed();
    tracing::info!(cluster, member, state = to.as_str(), by = %by_text, "admin state set");
    with_etag(
        view,
        json!({ "cluster": cluster, "member": member, "admin": to.as_str(),
                "admin_by": by_text, "view": view }),
    )
}

/// The handler of `POST .../members/{member}/{drain,undrain,disable,enable}`: sets the
/// member's admin state to `to`.
fn set_admin_to(to: AdminState) -> MethodRouter<AppState> {
    post(
        move |State(st): State<AppState>,
              headers: HeaderMap,
              UrlPath((c, m)): UrlPath<(String, String)>| async move {
            set_admin(&st, &headers, &c, &m, to)
        },
    )
}

/// A JSON body, or a 400 saying what is wrong with it.
fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

/// Applies a copy of the current view with `cluster` changed by `change`, id + 1; responds with
/// the new view id.
fn change_cluster(
    st: &AppState,
    headers: &HeaderMap,
    cluster: &str,
    change: impl FnOnce(&mut rondo_core::ClusterSpec) -> Result<(), Response>,
) -> Response {
    let expected = match if_match(headers) {
        Ok(e) => e,
        Err(r) => return r,
    };
    // Built on the configuration in effect, not the composed view, so registered members stay
    // the registry's; read, changed and swapped under one lock, so concurrent changes all land
    // (and an `If-Match` is checked against the view no other change can replace meanwhile).
    let updated = st.parts.views.update_configured(|view| {
        if let Some(e) = expected {
            let current = st.parts.views.load().view.id;
            if current != e {
                return Err(conflict(current, e));
            }
        }
        let Some(spec) = view.clusters.get(cluster) else {
            return Err(error(StatusCode::NOT_FOUND, format!("unknown cluster `{cluster}`")));
        };
        let mut spec = (**spec).clone();
        change(&mut spec)?;
        view.clusters.insert(cluster.to_owned(), Arc::new(spec));
        Ok(())
    });
    let snap = match updated {
        Ok(s) => s,
        Err(r) => return r,
    };
    applied(&snap)
}

/// The answer to a change that made view `snap`.
fn applied(snap: &Arc<Snapshot>) -> Response {
    probe::spawn(snap);
    let id = snap.view.id;
    tracing::info!(view = id, "view applied through the admin API");
    with_etag(id, json!({ "view": id }))
}

fn apply(st: &AppState, view: View, expected: Option<u64>) -> Response {
    match expected {
        None => applied(&st.parts.views.apply(view)),
        Some(e) => match st.parts.views.apply_if(view, e) {
            Ok(snap) => applied(&snap),
            Err(current) => conflict(current, e),
        },
    }
}

#[derive(Deserialize)]
struct WeightBody {
    weight: u64,
}

async fn weight(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath((c, m)): UrlPath<(String, String)>,
    bytes: Bytes,
) -> Response {
    let w: WeightBody = match body(&bytes) {
        Ok(w) => w,
        Err(r) => return r,
    };
    if !(1..=1_000_000).contains(&w.weight) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("weight {} is out of range 1..=1000000", w.weight),
        );
    }
    change_cluster(&st, &headers, &c, |spec| {
        let Some(member) = spec.members.iter_mut().find(|x| x.name == m) else {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("unknown member `{m}` in cluster `{c}`"),
            ));
        };
        member.weight = w.weight as u32;
        Ok(())
    })
}

/// Starts a hitless upgrade (`rondo ctl upgrade`): a new `rondo serve --upgrade` with this
/// process's command line takes its sockets and state; 202 with the new process's pid.
async fn upgrade(State(st): State<AppState>) -> Response {
    match st.parts.upgrader.start() {
        None => error(
            StatusCode::CONFLICT,
            "this router cannot be upgraded: its configuration has no [router] upgrade_socket",
        ),
        Some(Err(e)) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, format!("upgrade not started: {e}"))
        }
        Some(Ok(pid)) => (StatusCode::ACCEPTED, axum::Json(json!({ "pid": pid }))).into_response(),
    }
}

#[derive(Deserialize)]
struct AlgorithmBody {
    algorithm: String,
}

async fn algorithm(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath(c): UrlPath<String>,
    bytes: Bytes,
) -> Response {
    let algorithm = match parse_algorithm(&bytes) {
        Ok(a) => a,
        Err(r) => return r,
    };
    change_cluster(&st, &headers, &c, |spec| {
        spec.policy.algorithm = algorithm;
        Ok(())
    })
}

/// `{"algorithm": NAME}` as an algorithm, or the 400 listing the valid names.
fn parse_algorithm(bytes: &[u8]) -> Result<Algorithm, Response> {
    let a: AlgorithmBody = body(bytes)?;
    Algorithm::parse(&a.algorithm).ok_or_else(|| {
        let valid: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
        error(
            StatusCode::BAD_REQUEST,
            format!("unknown algorithm `{}`; valid: {}", a.algorithm, valid.join(", ")),
        )
    })
}

async fn config(State(st): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Response {
    let expected = match if_match(&headers) {
        Ok(e) => e,
        Err(r) => return r,
    };
    if st.parts.views.has_shared() {
        // It would replace the file's layer, which the shared one hides: a silent no-op.
        return error(
            StatusCode::CONFLICT,
            "the tier's shared configuration (etcd) is in effect: put the new one with \
             `PUT /v1/config` on the naming API",
        );
    }
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return error(StatusCode::BAD_REQUEST, "the configuration is not UTF-8");
    };
    let next = st.parts.views.load().view.id + 1;
    let over = st.parts.defaults.over();
    match rondo_config::parse_str_over(text, Path::new("admin-api"), next, over.as_ref()) {
        Ok(config) => {
            // Before the swap, which attaches the clusters' runtimes to the shared members.
            st.parts.views.shared_members().set(config.shared_members);
            let r = apply(&st, config.view, expected);
            if r.status().is_success() {
                st.parts.defaults.from_text(text);
            }
            r
        }
        Err(errors) => defaults::invalid(&errors, "the configuration is invalid"),
    }
}
