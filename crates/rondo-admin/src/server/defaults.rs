//! `GET`, `PUT` and `DELETE /api/v1/defaults`: the defaults set at runtime over the file's
//! `[defaults]` ([`rondo_runtime::defaults`]). A change recompiles the configuration in force
//! with them and swaps the result in as one view (under `If-Match`, like every change), so every
//! cluster that did not set a field changes at once; an invalid one changes nothing.

use std::path::Path;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rondo_config::{ConfigErrors, DefaultsOverride};
use serde_json::{Value, json};

use super::{AppState, applied, conflict, error, if_match};

/// The runtime defaults as TOML (empty when none are set).
pub(super) async fn show(State(st): State<AppState>) -> Response {
    let text = st.parts.defaults.over().map(|o| o.to_string()).unwrap_or_default();
    axum::Json(json!({ "defaults": text })).into_response()
}

/// Sets the runtime defaults to the TOML body (`algorithm = "p2c-ewma"`, `[health] ...`).
pub(super) async fn put(State(st): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Response {
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return error(StatusCode::BAD_REQUEST, "the defaults are not UTF-8");
    };
    match DefaultsOverride::parse(text, Path::new("defaults")) {
        Ok(over) => change(&st, &headers, Some(over).filter(|o| !o.is_empty())),
        Err(errors) => invalid(&errors, "the defaults are invalid"),
    }
}

/// Removes the runtime defaults: the file's are in force again.
pub(super) async fn remove(State(st): State<AppState>, headers: HeaderMap) -> Response {
    change(&st, &headers, None)
}

fn change(st: &AppState, headers: &HeaderMap, over: Option<DefaultsOverride>) -> Response {
    let expected = match if_match(headers) {
        Ok(e) => e,
        Err(r) => return r,
    };
    if st.parts.views.has_shared() {
        return error(
            StatusCode::CONFLICT,
            "the tier's shared configuration (etcd) is in effect: set [defaults] in it",
        );
    }
    let next = st.parts.views.load().view.id + 1;
    let outcome = st.parts.defaults.change(over, next, |config| {
        // Before the swap, which attaches the clusters' runtimes to the shared members.
        st.parts.views.shared_members().set(config.shared_members);
        match expected {
            None => Ok(applied(&st.parts.views.apply(config.view))),
            Some(e) => match st.parts.views.apply_if(config.view, e) {
                Ok(snap) => Ok(applied(&snap)),
                Err(current) => Err(conflict(current, e)),
            },
        }
    });
    match outcome {
        Ok(Ok(r) | Err(r)) => r,
        Err(errors) => invalid(&errors, "the defaults are invalid"),
    }
}

/// 400 with every error at its file, line and field.
pub(super) fn invalid(errors: &ConfigErrors, what: &str) -> Response {
    let list: Vec<Value> = errors
        .iter()
        .map(|e| {
            json!({ "file": e.file.display().to_string(), "line": e.line, "column": e.column,
                    "field": e.field, "message": e.message, "text": e.to_string() })
        })
        .collect();
    let body = json!({ "error": what, "errors": list });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}
