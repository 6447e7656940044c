//! `GET /metrics`: every metric of `rondo_runtime::metrics` in the Prometheus text format
//! (version 0.0.4), behind the same bearer token as the rest of the API (Prometheus sends it
//! with `authorization: {credentials: ...}` or `credentials_file`). See `docs/admin.md`.

use std::sync::Arc;

use crate::AdminParts;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use rondo_runtime::metrics::CONTENT_TYPE;

/// The `/metrics` route, to merge into the API router before its auth layer.
pub(crate) fn routes<S>(parts: Arc<AdminParts>) -> Router<S> {
    Router::new().route("/metrics", get(metrics)).with_state(parts)
}

async fn metrics(State(parts): State<Arc<AdminParts>>) -> impl IntoResponse {
    let text = parts.metrics.render(&parts.views.load());
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text)
}
