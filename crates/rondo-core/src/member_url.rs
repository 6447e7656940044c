//! A picked member's URL, for the answers that send a caller to the member itself instead of
//! carrying its request (SGD's load-balancing page): the naming service's redirect lookups
//! (`GET /v1/lookup/NAME?redirect=1`) and the router's `redirect_to_member` filter. One place
//! decides the scheme and how the path and query go along, so both agree.

use crate::{ClusterSpec, UpstreamProtocol};

/// The status of a redirect to a member unless configured otherwise: 307 keeps the method and
/// body, and says the move is for this request only (the next one may be picked elsewhere).
pub const DEFAULT_STATUS: u16 = 307;

/// The scheme members of `spec` are reached with: `https` with `upstream_tls`, else `http`;
/// `None` for `tcp` clusters, whose members have no URL.
pub fn scheme(spec: &ClusterSpec) -> Option<&'static str> {
    match (spec.upstream_protocol, spec.upstream_tls.is_some()) {
        (UpstreamProtocol::Tcp, _) => None,
        (_, true) => Some("https"),
        (_, false) => Some("http"),
    }
}

/// `scheme://address` followed by `path` (made to start with `/`) and `?query` when there is
/// one: the member's URL for the caller's own path and query.
pub fn location(scheme: &str, address: &str, path: &str, query: Option<&str>) -> String {
    let mut url = String::with_capacity(scheme.len() + address.len() + path.len() + 8);
    url.push_str(scheme);
    url.push_str("://");
    url.push_str(address);
    if !path.starts_with('/') {
        url.push('/');
    }
    url.push_str(path);
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        url.push('?');
        url.push_str(q);
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_and_query_follow_the_member_address() {
        assert_eq!(
            location("http", "10.0.0.1:80", "/a/b", Some("x=1")),
            "http://10.0.0.1:80/a/b?x=1"
        );
        assert_eq!(location("https", "[::1]:443", "", None), "https://[::1]:443/");
        assert_eq!(location("http", "m:1", "rest", Some("")), "http://m:1/rest");
    }
}
