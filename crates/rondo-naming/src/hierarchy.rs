//! How the HTTP API answers in a naming hierarchy ([`crate::parent`]): every lookup and full
//! answer says which level answered (`rondo-naming-level: local` or `parent`), and with a
//! parent configured the JSON says it too (`level`, `answered_by`: the naming service that
//! holds the name, `stale`: a cached answer the parent could not confirm, with
//! `rondo-naming-stale: true`; `parent_view_id`: the parent's view the cached answer is from).
//! An answer relayed from the parent carries this service's own view id, which moves whenever
//! a relayed answer changes, so that a client watching here compares like with like.

// Helpers return a ready error response as `Err`, as the handlers do; not on the data path.
#![allow(clippy::result_large_err)]

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rondo_core::wire::{self, Answer, VIEW_ID_HEADER};
use serde_json::{Value, json};

use crate::parent::{Entry, Parent, ParentError};

/// The header naming the level that answered.
pub const LEVEL_HEADER: &str = "rondo-naming-level";
/// The header set on a cached answer the parent could not confirm.
pub const STALE_HEADER: &str = "rondo-naming-stale";

/// `body` as JSON with `view_id`'s header, marked as answered at `level`; with `extra` (a
/// hierarchy's fields) merged into the object.
pub(crate) fn marked(
    view_id: u64,
    body: impl serde::Serialize,
    level: &'static str,
    extra: Option<Value>,
) -> Response {
    let mut value = serde_json::to_value(body).unwrap_or(Value::Null);
    let stale = extra.as_ref().and_then(|e| e.get("stale")).and_then(Value::as_bool) == Some(true);
    if let (Value::Object(fields), Some(Value::Object(more))) = (&mut value, extra) {
        fields.extend(more);
    }
    let mut resp = axum::Json(value).into_response();
    let h = resp.headers_mut();
    h.insert(VIEW_ID_HEADER, HeaderValue::from(view_id));
    h.insert(LEVEL_HEADER, HeaderValue::from_static(level));
    if stale {
        h.insert(STALE_HEADER, HeaderValue::from_static("true"));
    }
    resp
}

/// The hierarchy's fields of a local answer (`None` without a parent: the JSON stays as it
/// always was).
pub(crate) fn local_fields(parent: Option<&Parent>, own: &str) -> Option<Value> {
    parent.map(|_| json!({ "level": "local", "answered_by": own, "stale": false }))
}

fn relayed_fields(parent: &Parent, entry: &Entry) -> Value {
    json!({
        "level": "parent",
        "answered_by": entry.answered_by,
        "parent_view_id": entry.answer.view_id,
        "stale": parent.is_stale(entry),
    })
}

/// The parent's entry for `service`, or the error answer (404 when the parent does not hold
/// it either, 503 when it cannot be asked and nothing is cached).
pub(crate) async fn entry(
    parent: &Parent,
    service: &str,
) -> Result<std::sync::Arc<Entry>, Response> {
    parent.answer(service).await.map_err(|e| match e {
        ParentError::NotFound(why) => error(
            StatusCode::NOT_FOUND,
            format!("unknown service `{service}` here and at the parent ({why})"),
        ),
        ParentError::Unavailable(why) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("service `{service}` is not held here and the parent did not answer: {why}"),
        ),
    })
}

/// The full answer relayed from the parent, with this service's view id.
pub(crate) fn relayed_answer(parent: &Parent, entry: &Entry, view_id: u64) -> Response {
    let answer = Answer { view_id, ..entry.answer.clone() };
    marked(view_id, answer, "parent", Some(relayed_fields(parent, entry)))
}

/// A lookup picked here from the parent's answer, or `None` when no member is eligible.
pub(crate) fn relayed_lookup(
    parent: &Parent,
    entry: &Entry,
    view_id: u64,
    group: Option<&str>,
    key: Option<&str>,
) -> Result<(wire::Lookup, Response), Response> {
    let Some((mut lookup, _)) = entry.pick(group, key) else {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "service `{}`: no member of the parent's answer may take work",
                entry.answer.service
            ),
        ));
    };
    lookup.view_id = view_id;
    let resp = marked(view_id, &lookup, "parent", Some(relayed_fields(parent, entry)));
    Ok((lookup, resp))
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(wire::Error { error: message })).into_response()
}
