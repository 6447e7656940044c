//! The filters that answer by themselves: `redirect` (the request's own URL with the parts the
//! filter names changed, in `Location`) and `respond` (a fixed status, fields and body).

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use rondo_core::traffic::{Redirect, Respond};

use super::{Answer, Applied, Info};

/// The redirect of a request.
pub(super) fn redirect(r: &Redirect, info: &Info<'_>, applied: &Applied) -> Answer {
    let own = if info.tls { "https" } else { "http" };
    let scheme = r.scheme.as_deref().unwrap_or(own);
    let default_port = if scheme == "https" { 443 } else { 80 };
    // A scheme changed drops the request's port (it was the other scheme's) unless one is named.
    let port = r.port.or(if scheme == own { info.port() } else { None });
    let path = r.path.as_deref().or(applied.path.as_deref()).unwrap_or(info.path);
    let mut location = String::new();
    if let Some(host) = r.host.as_deref().or(info.host) {
        location.push_str(scheme);
        location.push_str("://");
        location.push_str(host);
        if let Some(p) = port.filter(|p| *p != default_port) {
            location.push(':');
            location.push_str(&p.to_string());
        }
    }
    location.push_str(path);
    if let Some(q) = info.query.filter(|_| r.keep_query) {
        location.push('?');
        location.push_str(q);
    }
    let headers = match HeaderValue::from_str(&location) {
        Ok(v) => vec![(http::header::LOCATION, v)],
        // Never: every part is visible ASCII (checked at load or by the parsers).
        Err(_) => Vec::new(),
    };
    Answer { status: r.status, headers, body: Bytes::new() }
}

/// A compiled `respond`.
pub(super) struct RespondStep {
    status: u16,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl RespondStep {
    pub(super) fn new(spec: &Respond) -> RespondStep {
        let headers = spec
            .headers
            .iter()
            .filter_map(|(n, v)| {
                Some((HeaderName::from_bytes(n.as_bytes()).ok()?, HeaderValue::from_str(v).ok()?))
            })
            .collect();
        RespondStep { status: spec.status, headers, body: Bytes::from(spec.body.to_vec()) }
    }

    pub(super) fn answer(&self) -> Answer {
        Answer { status: self.status, headers: self.headers.clone(), body: self.body.clone() }
    }
}
