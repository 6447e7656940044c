//! Who is behind a mutation of the admin API: the `x-rondo-operator` header, shared by the
//! per-cluster endpoints (`server.rs`) and the member-wide ones (`members.rs`).

use axum::http::HeaderMap;

/// The header naming the operator behind a mutation (default `admin-api`).
pub const OPERATOR_HEADER: &str = "x-rondo-operator";

/// The operator a request names, or `admin-api`.
pub(crate) fn operator(headers: &HeaderMap) -> String {
    headers
        .get(OPERATOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("admin-api")
        .to_owned()
}
