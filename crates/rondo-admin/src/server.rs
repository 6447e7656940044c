//! The admin API's routes and handlers.
//!
//! Every change (member state, weight, algorithm, config) may name the view it was decided on
//! with `If-Match: "<view id>"` (the `ETag` of `GET /api/v1/status`): when the view in effect is
//! another one, nothing changes and the answer is 409 naming the current view. The check and the
//! change happen under the live state's replacement lock, so no view can slip in between.

// Handlers return a ready error response as `Err`; they are not on the data path.
#![allow(clippy::result_large_err)]

mod defaults;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use rondo_config::AdminSpec;
use rondo_core::ShadowReport;
use rondo_core::{Actor, AdminState, Algorithm, View};
use rondo_runtime::{ClusterRt, Live, Snapshot, clock, probe};
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
    live: Arc<Live>,
    token: Option<Arc<Vec<u8>>>,
}

/// Binds `[admin] listen` and serves the API on the current tokio runtime, over TLS when
/// `[admin] tls` is set (its files then watched and reloaded like a listener's).
pub async fn start(spec: &AdminSpec, live: Arc<Live>) -> std::io::Result<AdminServer> {
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
    let listener = live.sockets.tcp_listener("admin", spec.listen)?;
    let addr = listener.local_addr()?;
    let tls = rondo_runtime::http_api::tls("[admin]", spec.tls.as_ref(), &live)?;
    let mut app = router(live.clone(), token.clone());
    let probes = match spec.probes.listen {
        None => {
            app = app.merge(crate::probes::routes(&live, &spec.probes));
            None
        }
        Some(at) => {
            let listener = live.sockets.tcp_listener("admin-probes", at).map_err(|e| {
                std::io::Error::new(e.kind(), format!("its probe listener on {at}: {e}"))
            })?;
            let addr = listener.local_addr()?;
            let own = crate::probes::own_listener(&live, &spec.probes);
            let task =
                rondo_runtime::http_api::spawn("probe listener", listener, None, own, live.clone());
            Some((addr, task))
        }
    };
    let token = token.map(Arc::new);
    let task = rondo_runtime::http_api::spawn("admin API", listener, tls, app, live);
    Ok(AdminServer { addr, task, tls: spec.tls.is_some(), token, probes })
}

/// The API as an axum router (for embedding); `token: None` refuses every call with 403.
pub fn router(live: Arc<Live>, token: Option<Vec<u8>>) -> Router {
    let state = AppState { live, token: token.map(Arc::new) };
    let member = "/api/v1/clusters/{cluster}/members/{member}";
    Router::new()
        .route("/api/v1/status", get(status))
        .route(&format!("{member}/drain"), post(drain))
        .route(&format!("{member}/undrain"), post(activate))
        .route(&format!("{member}/disable"), post(disable))
        .route(&format!("{member}/enable"), post(activate))
        .route(&format!("{member}/weight"), put(weight))
        .route("/api/v1/clusters/{cluster}/algorithm", put(algorithm))
        .route("/api/v1/clusters/{cluster}/explain", get(explain))
        .route(
            "/api/v1/clusters/{cluster}/shadow",
            get(shadow_report).put(shadow_start).delete(shadow_stop),
        )
        .route("/api/v1/config", post(config))
        .route(
            "/api/v1/defaults",
            get(defaults::show).put(defaults::put).delete(defaults::remove),
        )
        .route("/api/v1/revocations", get(revocations).post(revoke))
        .route("/api/v1/upgrade", post(upgrade))
        .merge(crate::metrics::routes(state.live.clone()))
        .merge(crate::queues::routes(state.live.clone()))
        .merge(crate::members::routes(state.live.clone()))
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

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

async fn status(State(st): State<AppState>) -> Response {
    let snap = st.live.load();
    let now = clock::now();
    let routes: Vec<Value> = snap
        .view
        .routes
        .iter()
        .map(|r| {
            let mut route = json!({ "name": r.name, "listener": r.listener, "cluster": r.cluster,
                    "backups": r.backups });
            if !r.split.is_empty() {
                // A weighted split (`clusters`): `cluster` is its first cluster of positive weight.
                let split =
                    r.split.iter().map(|w| json!({ "cluster": w.cluster, "weight": w.weight }));
                route["clusters"] = Value::Array(split.collect());
            }
            route
        })
        .collect();
    let clusters: Vec<Value> = snap
        .view
        .clusters
        .keys()
        .filter_map(|name| snap.clusters.get(name))
        .map(|rt| {
            let mut c = cluster_status(rt, now, st.live.group.as_deref());
            crate::members::note_shared(&st.live, &mut c);
            // Proxyless gRPC clients balancing by this cluster (the naming service's xDS server).
            c["xds_clients"] = json!(st.live.metrics.xds_clients_of(&rt.spec.name));
            c
        })
        .collect();
    let algorithms: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
    let pid = std::process::id();
    with_etag(
        snap.view.id,
        json!({ "view": snap.view.id, "pid": pid, "routes": routes, "clusters": clusters,
                "algorithms": algorithms }),
    )
}

/// What the health checks say of a member: `up`, `down`, or `unchecked` when nothing checks it
/// (no health checks configured and no registry verdict).
fn health_word(s: &rondo_core::MemberState, checked: bool) -> &'static str {
    if !s.healthy {
        "down"
    } else if checked || s.health_by != Actor::Config {
        "up"
    } else {
        "unchecked"
    }
}

/// What the member's current health rests on. `health_by` names who last *changed* it, and a
/// member that health checks keep finding up was never changed: it still says `config` though
/// the checks have confirmed it since. So: `health-check` once a check has answered (passed or
/// failed short of `fall`), `assumed` while the checks run but none has answered yet, `null`
/// when nothing checks the member, and otherwise whoever set it (registry, operator, ...).
fn health_source(s: &rondo_core::MemberState, checked: bool) -> Option<String> {
    match &s.health_by {
        Actor::Config if !checked => None,
        Actor::Config if s.probe_streak == (0, 0) => Some("assumed".to_owned()),
        Actor::Config => Some(Actor::HealthCheck.to_string()),
        by => Some(by.to_string()),
    }
}

fn cluster_status(rt: &ClusterRt, now: rondo_core::Instant, group: Option<&str>) -> Value {
    let spec = &rt.spec;
    let policy = &spec.policy;
    rt.with(|b| {
        // The same rules and candidate set the next pick uses (rondo-core's candidates.rs).
        let (eligibility, panic) = b.eligibility(now, group);
        let states = b.states();
        let mut ranked: Vec<(std::time::Duration, usize)> =
            states.iter().enumerate().filter_map(|(i, s)| s.load.probe_rtt.map(|r| (r, i))).collect();
        ranked.sort();
        let members: Vec<Value> = spec
            .members
            .iter()
            .zip(states)
            .zip(&eligibility)
            .enumerate()
            .map(|(i, ((m, s), e))| {
                let agent = s.load.agent.map(|r| {
                    json!({ "cpu_percent": r.cpu_used * 100.0,
                            "free_mib": r.mem_free >> 20,
                            "age_ms": ms(now.since(r.at)) })
                });
                let checked = policy.health.is_some();
                let sampled = s.load.ewma.sampled_at();
                json!({
                    "name": m.name,
                    "address": m.address,
                    "weight": m.weight,
                    "group": m.group,
                    "admin": s.admin.as_str(),
                    "admin_by": s.admin_by.to_string(),
                    "healthy": s.healthy,
                    "health": health_word(s, checked),
                    "health_by": s.health_by.to_string(),
                    "health_source": health_source(s, checked),
                    "checks_in_a_row": {"passed": s.probe_streak.0, "failed": s.probe_streak.1},
                    "last_probe_failure": s.last_probe_failure.map(|(f, _)| f.to_string()),
                    "last_probe_failure_ago_ms": s.last_probe_failure.map(|(_, at)| ms(now.since(at))),
                    "eligible": e.eligible,
                    "reason": e.reason.map(|r| r.as_str()),
                    "ejected_until_ms": s.ejected_until.filter(|u| *u > now).map(|u| ms(u.since(now))),
                    "in_flight": s.load.in_flight,
                    "sessions": s.load.sessions,
                    "served": s.load.completed,
                    "ewma_us": (s.load.ewma.get_at(now, policy.ewma.decay) / 1000.0) as u64,
                    "ewma_sample_ago_ms": sampled.map(|at| ms(now.since(at))),
                    "ewma_at_sample_us": sampled.map(|_| (s.load.ewma.last().0 / 1000.0) as u64),
                    "probe_rtt_us": s.load.probe_rtt.map(|r| r.as_micros() as u64),
                    "rank": ranked.iter().position(|&(_, j)| j == i),
                    "agent": agent,
                })
            })
            .collect();
        json!({
            "name": spec.name,
            "algorithm": policy.algorithm.as_str(),
            "granularity": policy.granularity.as_str(),
            "panic": panic,
            "shadow": b.shadow().map(Algorithm::as_str),
            "members": members,
        })
    })
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
    let done = st.live.with_current(|snap| {
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

async fn drain(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath((c, m)): UrlPath<(String, String)>,
) -> Response {
    set_admin(&st, &headers, &c, &m, AdminState::Draining)
}

async fn disable(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath((c, m)): UrlPath<(String, String)>,
) -> Response {
    set_admin(&st, &headers, &c, &m, AdminState::Disabled)
}

async fn activate(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath((c, m)): UrlPath<(String, String)>,
) -> Response {
    set_admin(&st, &headers, &c, &m, AdminState::Active)
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
    let updated = st.live.update_configured(|view| {
        if let Some(e) = expected {
            let current = st.live.load().view.id;
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
        None => applied(&st.live.apply(view)),
        Some(e) => match st.live.apply_if(view, e) {
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

/// `POST /api/v1/revocations`: one of `token_id` or `subject`, and how long to keep it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokeBody {
    token_id: Option<String>,
    subject: Option<String>,
    ttl_ms: Option<u64>,
}

/// Default `ttl_ms` of a revocation: a day (longer than the tokens it refuses should live).
const DEFAULT_REVOCATION_TTL_MS: u64 = 86_400_000;
/// Longest `ttl_ms` of a revocation: thirty days.
const MAX_REVOCATION_TTL_MS: u64 = 30 * 86_400_000;

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Revokes sign-on tokens by id or subject: in force on this router at once, and on every
/// router of the tier as the registry shares it (etcd: within about a second).
async fn revoke(State(st): State<AppState>, bytes: Bytes) -> Response {
    use rondo_runtime::revoke::{Revocation, RevokeError, RevokeKind};
    let b: RevokeBody = match body(&bytes) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (kind, value) = match (b.token_id, b.subject) {
        (Some(t), None) => (RevokeKind::TokenId, t),
        (None, Some(s)) => (RevokeKind::Subject, s),
        _ => return error(StatusCode::BAD_REQUEST, "give one of `token_id` or `subject`"),
    };
    if !rondo_runtime::revoke::valid_value(&value) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("field `{}`: 1 to 256 characters, no control characters", kind.as_str()),
        );
    }
    let ttl_ms = b.ttl_ms.unwrap_or(DEFAULT_REVOCATION_TTL_MS);
    if !(1000..=MAX_REVOCATION_TTL_MS).contains(&ttl_ms) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("field `ttl_ms`: {ttl_ms} is out of range 1000..={MAX_REVOCATION_TTL_MS}"),
        );
    }
    let now = unix_now();
    let until = now + ttl_ms.div_ceil(1000);
    let r = Revocation { kind, value: value.clone(), until };
    let shared = match st.live.revocations.revoke(r, now) {
        Ok(shared) => shared,
        Err(e @ RevokeError::HandedOver) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
        }
        Err(RevokeError::Refused(e)) => return error(StatusCode::INSUFFICIENT_STORAGE, e),
    };
    // With a tier (etcd), answered once the tier has it: a 201 means every router will refuse
    // the token; otherwise the operator learns that only this router does.
    if let Some(answer) = shared {
        let waited = tokio::time::timeout(std::time::Duration::from_secs(5), answer).await;
        let failed = match waited {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(e))) => Some(e),
            Ok(Err(_)) => Some("the registry's publisher stopped".to_owned()),
            Err(_) => Some("etcd did not answer within 5 s".to_owned()),
        };
        if let Some(e) = failed {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "revoked on this router only: not shared with the tier ({e}); make the same \
                     revocation again once the registry is back"
                ),
            );
        }
    }
    tracing::info!(kind = kind.as_str(), value, until, "sign-on revoked");
    (
        StatusCode::CREATED,
        axum::Json(json!({ "kind": kind.as_str(), "value": value, "until": until })),
    )
        .into_response()
}

/// The revocations in force: `{"revocations": [{"kind", "value", "until"}]}`.
/// Starts a hitless upgrade (`rondo ctl upgrade`): a new `rondo serve --upgrade` with this
/// process's command line takes its sockets and state; 202 with the new process's pid.
async fn upgrade(State(st): State<AppState>) -> Response {
    match st.live.upgrader.start() {
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

async fn revocations(State(st): State<AppState>) -> Response {
    let list: Vec<Value> = st
        .live
        .revocations
        .list(unix_now())
        .into_iter()
        .map(|r| json!({ "kind": r.kind.as_str(), "value": r.value, "until": r.until }))
        .collect();
    axum::Json(json!({ "revocations": list })).into_response()
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

/// The 404 of a cluster without a shadow.
fn no_shadow(cluster: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "cluster `{cluster}` has no shadow algorithm: start one with \
             `PUT /api/v1/clusters/{cluster}/shadow` (`rondo ctl shadow {cluster} ALGORITHM`)"
        ),
    )
}

/// Runs `change` on `cluster`'s runtime while no view can be swapped in (so the change lands
/// on the runtime in effect, and a swap carries it over), after the `If-Match` check; its
/// result, the runtime and the view.
fn on_cluster<R>(
    st: &AppState,
    headers: &HeaderMap,
    cluster: &str,
    change: impl FnOnce(&ClusterRt) -> Result<R, Response>,
) -> Result<(R, Arc<ClusterRt>, u64), Response> {
    let expected = if_match(headers)?;
    st.live.with_current(|snap| {
        if let Some(e) = expected
            && snap.view.id != e
        {
            return Err(conflict(snap.view.id, e));
        }
        let (rt, _) = find(snap, cluster, None)?;
        Ok((change(&rt)?, rt, snap.view.id))
    })
}

/// `PUT /api/v1/clusters/{cluster}/shadow` `{"algorithm": NAME}`: evaluates NAME beside the
/// live algorithm from now on (a fresh report, replacing a running shadow); no traffic moves.
async fn shadow_start(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath(c): UrlPath<String>,
    bytes: Bytes,
) -> Response {
    let algorithm = match parse_algorithm(&bytes) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (was, rt, view) =
        match on_cluster(&st, &headers, &c, |rt| Ok(rt.set_shadow(Some(algorithm)))) {
            Ok(x) => x,
            Err(r) => return r,
        };
    let live = rt.spec.policy.algorithm;
    tracing::info!(
        cluster = c,
        shadow = algorithm.as_str(),
        live = live.as_str(),
        replaced = was.map(Algorithm::as_str),
        by = %Actor::Operator(operator(&headers)),
        "shadow evaluation started: the shadow algorithm is asked at every pick, no traffic moves"
    );
    with_etag(
        view,
        json!({ "cluster": c, "shadow": algorithm.as_str(), "live": live.as_str(),
                "replaced": was.map(Algorithm::as_str), "view": view }),
    )
}

/// `DELETE /api/v1/clusters/{cluster}/shadow`: stops the shadow; answers its last report.
async fn shadow_stop(
    State(st): State<AppState>,
    headers: HeaderMap,
    UrlPath(c): UrlPath<String>,
) -> Response {
    let stopped = on_cluster(&st, &headers, &c, |rt| rt.stop_shadow().ok_or_else(|| no_shadow(&c)));
    let ((r, since), _, view) = match stopped {
        Ok(x) => x,
        Err(r) => return r,
    };
    tracing::info!(
        cluster = c,
        shadow = r.algorithm.as_str(),
        live = r.live.as_str(),
        decisions = r.decisions,
        differed = r.differed(),
        by = %Actor::Operator(operator(&headers)),
        "shadow evaluation stopped"
    );
    let mut v = shadow_json(&c, view, &r, since);
    v["stopped"] = Value::Bool(true);
    with_etag(view, v)
}

/// `GET /api/v1/clusters/{cluster}/shadow`: the shadow's report (404 without one).
async fn shadow_report(State(st): State<AppState>, UrlPath(c): UrlPath<String>) -> Response {
    let snap = st.live.load();
    let (rt, _) = match find(&snap, &c, None) {
        Ok(x) => x,
        Err(r) => return r,
    };
    match rt.shadow_report() {
        Some((r, since)) => with_etag(snap.view.id, shadow_json(&c, snap.view.id, &r, since)),
        None => no_shadow(&c),
    }
}

/// A shadow report as the API answers it (docs/admin.md).
fn shadow_json(cluster: &str, view: u64, r: &ShadowReport, since_unix_ms: u64) -> Value {
    let us = |d: std::time::Duration| d.as_micros() as u64;
    let share = |n: u64| if r.decisions == 0 { 0.0 } else { n as f64 / r.decisions as f64 };
    let side = |c: rondo_core::shadow::SideCounts| {
        json!({ "picks": c.picks, "share": share(c.picks), "failed": c.failed, "slow": c.slow,
                "unresolved": c.unresolved })
    };
    let members: Vec<Value> = r
        .members
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "departed": m.name.is_empty(),
                "live": side(m.live),
                "shadow": side(m.shadow),
                "agreed": m.agreed,
                "window_p90_us": m.window_p90.map(us),
                "slow": m.slow,
                "slow_windows": m.slow_windows,
            })
        })
        .collect();
    json!({
        "cluster": cluster,
        "view": view,
        "shadow": r.algorithm.as_str(),
        "live": r.live.as_str(),
        "since_unix_ms": since_unix_ms,
        "decisions": r.decisions,
        "agreed": r.agreed,
        "differed": r.differed(),
        "no_pick": r.no_pick,
        "window_ms": rondo_core::shadow::SHADOW_WINDOW.as_millis() as u64,
        "slow_factor": rondo_core::shadow::SLOW_FACTOR,
        "slow_min_responses": rondo_core::shadow::SLOW_MIN_RESPONSES,
        "reference_p90_us": r.reference_p90.map(us),
        "live_total": side(r.live_total()),
        "shadow_total": side(r.shadow_total()),
        "members": members,
    })
}

#[derive(Deserialize)]
struct ExplainQuery {
    n: Option<usize>,
}

async fn explain(
    State(st): State<AppState>,
    UrlPath(c): UrlPath<String>,
    Query(q): Query<ExplainQuery>,
) -> Response {
    let snap = st.live.load();
    let (rt, _) = match find(&snap, &c, None) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let n = q.n.unwrap_or(20).min(256);
    let now = clock::now();
    let group = st.live.group.as_deref();
    let picks: Vec<Value> = rt
        .recent_decisions(n)
        .into_iter()
        .map(|(at, d)| {
            let e = rt.with(|b| b.explain(&d, now, group));
            let candidates: Vec<Value> = e
                .candidates
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name, "weight": c.weight,
                        "effective_weight": c.effective_weight, "in_flight": c.in_flight,
                        "sessions": c.sessions, "ewma_us": c.ewma_us,
                        "probe_rtt_us": c.probe_rtt_us, "cpu_percent": c.cpu_percent,
                        "free_mib": c.free_mib,
                    })
                })
                .collect();
            json!({
                "at_unix_ms": at,
                "member": e.chosen,
                "algorithm": d.algorithm.as_str(),
                "scope": d.scope.to_string(),
                "why": d.why.to_string(),
                "summary": e.summary,
                "candidates": candidates,
            })
        })
        .collect();
    // Tries that failed in TLS to a member (its certificate, or it refused the router's), which
    // no pick shows: the member was picked, the failure came after.
    let tls_failures: Vec<Value> = st
        .live
        .metrics
        .tls_failures_of(&c)
        .into_iter()
        .map(|(member, reason, count, at)| {
            json!({ "member": member, "reason": reason, "count": count, "last_unix_ms": at })
        })
        .collect();
    axum::Json(json!({ "cluster": c, "view": snap.view.id, "picks": picks,
                       "tls_failures": tls_failures }))
    .into_response()
}

async fn config(State(st): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Response {
    let expected = match if_match(&headers) {
        Ok(e) => e,
        Err(r) => return r,
    };
    if st.live.has_shared() {
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
    let next = st.live.load().view.id + 1;
    let over = st.live.defaults.over();
    match rondo_config::parse_str_over(text, Path::new("admin-api"), next, over.as_ref()) {
        Ok(config) => {
            // Before the swap, which attaches the clusters' runtimes to the shared members.
            st.live.shared_members.set(config.shared_members);
            let r = apply(&st, config.view, expected);
            if r.status().is_success() {
                st.live.defaults.from_text(text);
            }
            r
        }
        Err(errors) => defaults::invalid(&errors, "the configuration is invalid"),
    }
}
