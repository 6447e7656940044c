//! A member across clusters (issue 37, item 2): `GET /api/v1/members/{member}` shows every
//! cluster a member serves with its state there; `POST .../drain`, `.../undrain` drain a
//! shared member (`[member.NAME]` listed by several clusters) everywhere at once. The
//! per-cluster endpoints (`/api/v1/clusters/{cluster}/members/{member}/drain`) stay scoped to
//! their cluster.

// Handlers return a ready error response as `Err`; they are not on the data path.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rondo_core::{Actor, AdminState};
use rondo_runtime::{ClusterRt, Snapshot, Views};
use serde_json::{Value, json};

/// The member routes, to merge into the API router before its auth layer.
pub(crate) fn routes<S>(views: Views) -> Router<S> {
    Router::new()
        .route("/api/v1/members/{member}", get(show))
        .route("/api/v1/members/{member}/drain", post(drain))
        .route("/api/v1/members/{member}/undrain", post(undrain))
        .with_state(views)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

/// Every cluster of the view in effect with a member named `member`, and its index there.
fn holding(snap: &Snapshot, member: &str) -> Vec<(Arc<ClusterRt>, usize)> {
    snap.view
        .clusters
        .keys()
        .filter_map(|c| snap.clusters.get(c))
        .filter_map(|rt| {
            rt.spec.members.iter().position(|m| m.name == member).map(|i| (rt.clone(), i))
        })
        .collect()
}

/// The clusters an unscoped change of `member` applies to: a shared member's every cluster;
/// else the one cluster with a member of that name. Members of the same name in several
/// clusters that do not share them are different servers: the caller must name the cluster.
fn targets(
    views: &Views,
    snap: &Snapshot,
    member: &str,
) -> Result<Vec<(Arc<ClusterRt>, usize)>, Response> {
    let all = holding(snap, member);
    let shared = views.shared_members().clusters_of(member);
    let names: Vec<&str> = all.iter().map(|(rt, _)| rt.spec.name.as_str()).collect();
    match all.len() {
        0 => Err(error(StatusCode::NOT_FOUND, format!("unknown member `{member}`"))),
        1 => Ok(all),
        _ if !shared.is_empty() => {
            Ok(all.into_iter().filter(|(rt, _)| shared.contains(&rt.spec.name)).collect())
        }
        _ => Err(error(
            StatusCode::CONFLICT,
            format!(
                "member `{member}` is in clusters {} without being shared ([member.{member}]): \
                 name the cluster (rondo ctl drain CLUSTER MEMBER)",
                names.join(", ")
            ),
        )),
    }
}

async fn show(State(views): State<Views>, UrlPath(member): UrlPath<String>) -> Response {
    let snap = views.load();
    let all = holding(&snap, &member);
    if all.is_empty() {
        return error(StatusCode::NOT_FOUND, format!("unknown member `{member}`"));
    }
    let shared = views.shared_members().clusters_of(&member);
    let clusters: Vec<Value> = all
        .iter()
        .map(|(rt, i)| {
            let spec = &rt.spec.members[*i];
            let st = rt.with(|b| b.states()[*i].clone());
            json!({
                "cluster": rt.spec.name,
                "address": spec.address,
                "weight": spec.weight,
                "admin": st.admin.as_str(),
                "admin_by": st.admin_by.to_string(),
                "healthy": st.healthy,
                "in_flight": st.load.in_flight,
                "sessions": st.load.sessions,
                "others_active": st.load.external,
                "shared": shared.contains(&rt.spec.name),
            })
        })
        .collect();
    let local = views.shared_members().get(&member).map(|s| s.local());
    axum::Json(json!({
        "member": member,
        "shared": !shared.is_empty(),
        "shared_clusters": shared,
        "active_in_process": local,
        "clusters": clusters,
        "view": snap.view.id,
    }))
    .into_response()
}

fn set_everywhere(views: &Views, headers: &HeaderMap, member: &str, to: AdminState) -> Response {
    let by = Actor::Operator(crate::operator::operator(headers));
    let by_text = by.to_string();
    // Set while no view can be swapped in, as the per-cluster endpoints do.
    let done = views.with_current(|snap| {
        let targets = targets(views, snap, member)?;
        for (rt, i) in &targets {
            rt.set_admin(*i, to, by.clone());
        }
        Ok((targets, snap.view.id))
    });
    let (targets, view) = match done {
        Ok(x) => x,
        Err(r) => return r,
    };
    let names: Vec<String> = targets.iter().map(|(rt, _)| rt.spec.name.clone()).collect();
    for (rt, _) in &targets {
        rt.state_changed();
    }
    tracing::info!(member, clusters = %names.join(","), state = to.as_str(), by = %by_text, "admin state set in every cluster of the member");
    axum::Json(json!({ "member": member, "clusters": names, "admin": to.as_str(),
                       "admin_by": by_text, "view": view }))
    .into_response()
}

async fn drain(
    State(views): State<Views>,
    headers: HeaderMap,
    UrlPath(member): UrlPath<String>,
) -> Response {
    set_everywhere(&views, &headers, &member, AdminState::Draining)
}

async fn undrain(
    State(views): State<Views>,
    headers: HeaderMap,
    UrlPath(member): UrlPath<String>,
) -> Response {
    set_everywhere(&views, &headers, &member, AdminState::Active)
}

/// Adds to each shared member of a cluster's status (`GET /api/v1/status`) the clusters it
/// serves (`clusters`), for the dashboard.
pub(crate) fn note_shared(views: &Views, cluster: &mut Value) {
    if views.shared_members().is_empty() {
        return;
    }
    let me = cluster.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let Some(members) = cluster.get_mut("members").and_then(Value::as_array_mut) else { return };
    for m in members {
        let Some(name) = m.get("name").and_then(Value::as_str) else { continue };
        let clusters = views.shared_members().clusters_of(name);
        if clusters.contains(&me) {
            m["clusters"] = json!(clusters);
        }
    }
}
