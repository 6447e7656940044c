//! Redirect lookups (SGD's load-balancing page): `GET /v1/lookup/NAME?redirect=1` answers 307
//! with `Location` set to the picked member's URL instead of the JSON answer, so that a browser
//! or `curl -L` goes straight to the member. The URL is built by `rondo_core::member_url`, as
//! the router's `redirect_to_member` filter builds its own: `https` for a cluster with
//! `upstream_tls`, else `http` (a `tcp` cluster has no URL: 409); whatever path follows the
//! name (`/v1/lookup/NAME/a/b`) becomes the member's path, and the query goes along without
//! the lookup's own parameters (`redirect`, `key`, `group`, `exclude`).
//!
//! A redirect is a lookup: it moves the picker on and charges the member nothing (no request
//! in flight, no session), since the caller's request goes to the member directly.

// Helpers return a ready error response as `Err`, as the handlers do; not on the data path.
#![allow(clippy::result_large_err)]

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rondo_core::wire::{self, Lookup, VIEW_ID_HEADER};
use rondo_runtime::Snapshot;

/// The lookup's own query parameters, which the member's URL does not get.
const OWN: [&str; 4] = ["redirect", "key", "group", "exclude"];

/// Whether the query asks for a redirect (`redirect=1` or `true`; `0`, `false` or absent: no),
/// or the 400 answer for another value.
pub(crate) fn wanted(value: Option<&str>) -> Result<bool, Response> {
    match value {
        None | Some("0" | "false") => Ok(false),
        Some("1" | "true") => Ok(true),
        Some(v) => Err(error(
            StatusCode::BAD_REQUEST,
            format!("query parameter `redirect`: `{v}` is not 1, true, 0 or false"),
        )),
    }
}

/// The raw query without the lookup's own parameters, in its order.
pub(crate) fn passed_query(raw: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = raw?
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(n, _)| n);
            !pair.is_empty() && !OWN.contains(&name)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The 307 to `lookup`'s member, at `rest` (the path after the name) with `query`.
pub(crate) fn answer(
    snapshot: &Snapshot,
    lookup: &Lookup,
    rest: &str,
    query: Option<&str>,
) -> Response {
    let spec = snapshot.clusters.get(&lookup.service).map(|rt| rt.spec.clone());
    let Some(scheme) = spec.as_deref().and_then(rondo_core::member_url::scheme) else {
        return error(
            StatusCode::CONFLICT,
            format!(
                "service `{}` speaks tcp: its members have no URL to redirect to",
                lookup.service
            ),
        );
    };
    located(scheme, lookup, rest, query)
}

/// The 307 to `lookup`'s member reached with `scheme`.
pub(crate) fn located(scheme: &str, lookup: &Lookup, rest: &str, query: Option<&str>) -> Response {
    let url = rondo_core::member_url::location(scheme, &lookup.member.address, rest, query);
    let Ok(location) = HeaderValue::from_str(&url) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("member `{}`: its address and the path make no URL", lookup.member.name),
        );
    };
    let mut resp = StatusCode::TEMPORARY_REDIRECT.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, location);
    h.insert(VIEW_ID_HEADER, HeaderValue::from(lookup.view_id));
    if let Ok(name) = HeaderValue::from_str(&lookup.member.name) {
        h.insert("rondo-member", name);
    }
    resp
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(wire::Error { error: message })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookups_own_parameters_stay_behind() {
        assert_eq!(passed_query(Some("redirect=1&a=1&key=u&b&exclude=m1")), Some("a=1&b".into()));
        assert_eq!(passed_query(Some("redirect=1&group=g")), None);
        assert_eq!(passed_query(None), None);
        assert!(wanted(Some("yes")).is_err());
        assert_eq!(wanted(Some("1")).ok(), Some(true));
    }
}
