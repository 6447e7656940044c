//! The router's connections to members: rondo-runtime's pools ([`rondo_runtime::pools`]) with
//! the request path's body, and the request as hyper's client sends it to a member
//! (`request`: tries, multicast copies and session replays alike).

use http::uri::{self, PathAndQuery, Scheme};
use http::{Request, Uri, Version};
use rondo_runtime::ClusterRt;

use crate::body::UpstreamBody;
use crate::http::ClusterView;

/// The router's pools.
pub type Clients = rondo_runtime::pools::Clients<crate::body::UpstreamBody>;

pub use rondo_runtime::pools::tls_failure;

/// The request hyper's client sends to `member` of `rt` (the URI's authority from its
/// [`ClusterView`]).
pub(crate) fn request(
    method: &http::Method,
    headers: &http::HeaderMap,
    rt: &ClusterRt,
    member: usize,
    path_and_query: &PathAndQuery,
    body: UpstreamBody,
) -> Request<UpstreamBody> {
    let mut uri = uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    // Parsed once per view of the cluster (`ClusterView`), not per request.
    uri.authority = ClusterView::of(rt).and_then(|v| v.authorities.get(member).cloned().flatten());
    uri.path_and_query = Some(path_and_query.clone());
    let uri = Uri::from_parts(uri).unwrap_or_default();
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers.clone();
    *req.version_mut() = match rt.spec.upstream_protocol {
        // The HTTP/2 pool keys on the URI's member address and sends the `Host` as
        // `:authority` (`rondo_runtime::pools::h2`).
        rondo_core::UpstreamProtocol::Http2 => Version::HTTP_2,
        _ => Version::HTTP_11,
    };
    req
}
