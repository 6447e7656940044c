//! `PUT`, `GET` and `DELETE /api/v1/clusters/{cluster}/shadow`: a shadow algorithm evaluated
//! beside the live one (no traffic moves), and its report.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use rondo_core::{Actor, Algorithm, ShadowReport};
use rondo_runtime::ClusterRt;
use serde_json::{Value, json};

use super::{AppState, conflict, error, find, if_match, parse_algorithm, with_etag};
use crate::operator::operator;

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
    st.parts.views.with_current(|snap| {
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
pub(super) async fn start(
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
pub(super) async fn stop(
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
pub(super) async fn report(State(st): State<AppState>, UrlPath(c): UrlPath<String>) -> Response {
    let snap = st.parts.views.load();
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
