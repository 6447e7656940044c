//! `GET` and `POST /api/v1/revocations`: sign-on tokens refused by id or subject, on this router
//! at once and on the tier's others through the registry.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, body, error};

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
pub(super) async fn revoke(State(st): State<AppState>, bytes: Bytes) -> Response {
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
    let shared = match st.parts.revocations.revoke(r, now) {
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
pub(super) async fn list(State(st): State<AppState>) -> Response {
    let list: Vec<Value> = st
        .parts
        .revocations
        .list(unix_now())
        .into_iter()
        .map(|r| json!({ "kind": r.kind.as_str(), "value": r.value, "until": r.until }))
        .collect();
    axum::Json(json!({ "revocations": list })).into_response()
}
