//! The queue endpoints (`rondo ctl queue ...`, docs/admin.md): figures of every queue, and the
//! dead letters of one (list, show with tries, requeue, purge). The queues are the process's
//! `rondo-queue` set, reached through `rondo_runtime::queues::QueueOps`; a router without
//! queues answers 404.

// Handlers return a ready error response as `Err`; they are not on the data path.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rondo_runtime::metrics::Metrics;
use rondo_runtime::queues::{DeadLetterSummary, QueueError, QueueOps, QueueStats};
use serde::Deserialize;
use serde_json::{Value, json};

/// The queue routes, to merge into the API router before its auth layer.
pub(crate) fn routes<S>(metrics: Arc<Metrics>) -> Router<S> {
    let dead = "/api/v1/queues/{queue}/dead";
    Router::new()
        .route("/api/v1/queues", get(list))
        .route(dead, get(dead_list))
        .route(&format!("{dead}/requeue"), post(requeue_all))
        .route(&format!("{dead}/purge"), post(purge_all))
        .route(&format!("{dead}/{{id}}"), get(dead_show))
        .route(&format!("{dead}/{{id}}/requeue"), post(requeue_one))
        .route(&format!("{dead}/{{id}}/purge"), post(purge_one))
        .with_state(metrics)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

fn ops(metrics: &Metrics) -> Result<Arc<dyn QueueOps>, Response> {
    metrics
        .queues
        .get()
        .cloned()
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "this router has no queues ([[queue]])"))
}

fn failed(e: QueueError) -> Response {
    let status = match e {
        QueueError::UnknownQueue(_) | QueueError::UnknownMessage(_) => StatusCode::NOT_FOUND,
        QueueError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

/// A queue's figures as JSON.
pub(crate) fn stats_json(s: &QueueStats) -> Value {
    json!({
        "name": s.name,
        "backend": s.backend,
        "depth": s.depth,
        "in_delivery": s.in_delivery,
        "dead_letters": s.dead_letters,
        "bytes": s.bytes,
        "oldest_age_ms": s.oldest_age.map(|d| d.as_millis() as u64),
        "accepted": s.accepted,
        "delivered": s.delivered,
        "retried": s.retried,
        "dead_lettered": s.dead_lettered,
        "rejected_full": s.rejected_full,
        "rejected_too_large": s.rejected_too_large,
        "max_messages": s.max_messages,
        "max_bytes": s.max_bytes,
    })
}

fn summary_json(d: &DeadLetterSummary) -> Value {
    json!({
        "id": d.id,
        "accepted_ms": d.accepted_ms,
        "dead_ms": d.dead_ms,
        "attempts": d.attempts,
        "bytes": d.bytes,
        "last_reason": d.last_reason,
        "session": d.session,
    })
}

async fn list(State(metrics): State<Arc<Metrics>>) -> Response {
    let queues: Vec<Value> = match metrics.queues.get() {
        Some(q) => q.stats().iter().map(stats_json).collect(),
        None => Vec::new(),
    };
    axum::Json(json!({ "queues": queues })).into_response()
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

async fn dead_list(
    State(metrics): State<Arc<Metrics>>,
    UrlPath(queue): UrlPath<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    let ops = match ops(&metrics) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let limit = q.limit.unwrap_or(100).min(10_000);
    match ops.dead_letters(&queue, limit).await {
        Ok(list) => {
            let list: Vec<Value> = list.iter().map(summary_json).collect();
            axum::Json(json!({ "queue": queue, "dead_letters": list })).into_response()
        }
        Err(e) => failed(e),
    }
}

async fn dead_show(
    State(metrics): State<Arc<Metrics>>,
    UrlPath((queue, id)): UrlPath<(String, String)>,
) -> Response {
    let ops = match ops(&metrics) {
        Ok(o) => o,
        Err(r) => return r,
    };
    match ops.dead_letter(&queue, &id).await {
        Ok(d) => {
            let mut v = summary_json(&d.summary);
            let tries: Vec<Value> = d
                .tries
                .iter()
                .map(|t| json!({ "attempt": t.attempt, "at_ms": t.at_ms, "reason": t.reason }))
                .collect();
            let headers: Vec<Value> = d.headers.iter().map(|(n, v)| json!([n, v])).collect();
            v["queue"] = json!(queue);
            v["tries"] = json!(tries);
            v["path"] = json!(d.path);
            v["headers"] = json!(headers);
            v["body"] = json!(String::from_utf8_lossy(&d.body));
            axum::Json(v).into_response()
        }
        Err(e) => failed(e),
    }
}

async fn change(metrics: &Metrics, queue: &str, id: Option<&str>, requeue: bool) -> Response {
    let ops = match ops(metrics) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let done = if requeue { ops.requeue(queue, id).await } else { ops.purge(queue, id).await };
    let what = if requeue { "requeued" } else { "purged" };
    match done {
        Ok(n) => {
            tracing::info!(queue, id = id.unwrap_or("(all)"), count = n, "dead letters {what}");
            axum::Json(json!({ "queue": queue, what: n })).into_response()
        }
        Err(e) => failed(e),
    }
}

async fn requeue_all(
    State(metrics): State<Arc<Metrics>>,
    UrlPath(queue): UrlPath<String>,
) -> Response {
    change(&metrics, &queue, None, true).await
}

async fn purge_all(
    State(metrics): State<Arc<Metrics>>,
    UrlPath(queue): UrlPath<String>,
) -> Response {
    change(&metrics, &queue, None, false).await
}

async fn requeue_one(
    State(metrics): State<Arc<Metrics>>,
    UrlPath((queue, id)): UrlPath<(String, String)>,
) -> Response {
    change(&metrics, &queue, Some(&id), true).await
}

async fn purge_one(
    State(metrics): State<Arc<Metrics>>,
    UrlPath((queue, id)): UrlPath<(String, String)>,
) -> Response {
    change(&metrics, &queue, Some(&id), false).await
}
