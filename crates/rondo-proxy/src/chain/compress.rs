//! `compress`: in the request phase the encoding is chosen from `Accept-Encoding` (none for
//! `HEAD` and range requests); in the response phase ([`respond`], hyper's path only: the own
//! HTTP/1 path hands such routes over) a member's response that qualifies gets
//! `Content-Encoding`, loses `Content-Length`, has a strong `ETag` made weak (as nginx does: the
//! bytes differ, the meaning not) and its body encoded as it streams ([`crate::encode`]).
//! `Vary: Accept-Encoding` goes on every response that would have been compressed for another
//! `Accept-Encoding`.

use std::sync::Arc;

use http::{HeaderValue, Response, StatusCode, header};
use rondo_core::traffic::{Compress, Encoding};
use rondo_runtime::metrics::Metrics;

use super::{Applied, Info};
use crate::body::ProxyBody;
use crate::encode::Encoded;
use crate::head::{Headers, visible_ascii};

/// A compiled `compress`.
pub(super) struct CompressStep {
    spec: Arc<Compress>,
}

/// What the request phase decided: the filter's options and the client's encoding (`None`:
/// the client takes none of them, yet the response varies with `Accept-Encoding`).
pub(crate) struct Plan {
    spec: Arc<Compress>,
    encoding: Option<Encoding>,
}

impl CompressStep {
    pub(super) fn new(spec: &Compress) -> CompressStep {
        CompressStep { spec: Arc::new(spec.clone()) }
    }

    pub(super) fn request(&self, info: &Info<'_>, headers: &impl Headers, applied: &mut Applied) {
        // A HEAD's answer has no body to encode; a range names bytes of the unencoded body.
        if info.method == "HEAD" || headers.get("range").is_some() {
            applied.compress = None;
            return;
        }
        let accept = headers.values("accept-encoding").filter_map(visible_ascii);
        let encoding = self.spec.choose(accept);
        applied.compress = Some(Plan { spec: self.spec.clone(), encoding });
    }
}

/// Whether a member's response is one to compress: a status with a whole body, not encoded
/// already, no `no-transform`, a configured type, and not shorter than `min_bytes` by its
/// `Content-Length`.
fn qualifies(spec: &Compress, resp: &Response<ProxyBody>) -> bool {
    let status = resp.status();
    if status.is_informational()
        || matches!(
            status,
            StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED | StatusCode::PARTIAL_CONTENT
        )
    {
        return false;
    }
    let h = resp.headers();
    let text = |name| h.get_all(name).iter().filter_map(|v| v.to_str().ok());
    if text(header::CONTENT_ENCODING).any(|v| !v.trim().eq_ignore_ascii_case("identity")) {
        return false;
    }
    let no_transform = text(header::CACHE_CONTROL)
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("no-transform"));
    if no_transform || h.contains_key(header::CONTENT_RANGE) {
        return false;
    }
    if !text(header::CONTENT_TYPE).next().is_some_and(|t| spec.compresses_type(t)) {
        return false;
    }
    let length = text(header::CONTENT_LENGTH).next().and_then(|v| v.trim().parse::<u64>().ok());
    length.is_none_or(|n| n >= spec.min_bytes && n > 0)
}

/// The response phase on hyper's path: compresses `resp` when the plan and the response allow.
pub(crate) fn respond(
    applied: &Applied,
    route: &str,
    metrics: &Metrics,
    resp: &mut Response<ProxyBody>,
) {
    let Some(plan) = &applied.compress else { return };
    if !qualifies(&plan.spec, resp) {
        return;
    }
    let h = resp.headers_mut();
    let varies = h.get_all(header::VARY).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|n| n.trim() == "*" || n.trim().eq_ignore_ascii_case("accept-encoding"))
        })
    });
    if !varies {
        h.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    let Some(encoding) = plan.encoding else { return };
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::CONTENT_ENCODING);
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding.name()));
    if let Some(tag) = h.get(header::ETAG)
        && tag.as_bytes().starts_with(b"\"")
    {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(tag.as_bytes());
        if let Ok(weak) = HeaderValue::from_bytes(&weak) {
            h.insert(header::ETAG, weak);
        }
    }
    let counters = metrics.compress_counters(route, encoding.name());
    let level = plan.spec.level;
    let body = std::mem::replace(resp.body_mut(), ProxyBody::local(Default::default()));
    *resp.body_mut() = body.encoded(|b| Encoded::new(b, encoding, level, counters));
}
