//! `cors`: a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is the
//! router's to answer, 204 with the `Access-Control-Allow-*` fields when its origin, method and
//! headers are allowed, and 204 without them when not (the browser then refuses the request it
//! asked for; no member is bothered). Other requests from an allowed origin get the
//! `Access-Control-Allow-Origin` (the origin itself, `*` only for `allow_origins = ["*"]`
//! without credentials), `-Allow-Credentials` and `-Expose-Headers` fields on their response.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, header};
use rondo_core::traffic::Cors;

use super::fields::Pending;
use super::{Answer, Applied, Info};
use crate::head::{Headers, visible_ascii};

/// A compiled `cors`: its fixed answer fields made once.
pub(super) struct CorsStep {
    spec: Cors,
    /// The preflight's `Access-Control-Allow-Methods`, `-Headers`, `-Max-Age` fields.
    preflight: Vec<(HeaderName, HeaderValue)>,
    /// `Access-Control-Expose-Headers`, when any.
    expose: Option<String>,
}

impl CorsStep {
    pub(super) fn new(spec: &Cors) -> CorsStep {
        let join = |l: &[String]| HeaderValue::from_str(&l.join(", ")).ok();
        let mut preflight = Vec::new();
        preflight
            .extend(join(&spec.allow_methods).map(|v| (header::ACCESS_CONTROL_ALLOW_METHODS, v)));
        if !spec.allow_headers.is_empty() {
            preflight.extend(
                join(&spec.allow_headers).map(|v| (header::ACCESS_CONTROL_ALLOW_HEADERS, v)),
            );
        }
        if let Some(s) = spec.max_age_s {
            preflight.push((header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(s)));
        }
        let expose = (!spec.expose_headers.is_empty()).then(|| spec.expose_headers.join(", "));
        CorsStep { spec: spec.clone(), preflight, expose }
    }

    /// The value of `Access-Control-Allow-Origin` for `origin`, when it is allowed.
    fn allow_origin<'o>(&self, origin: &'o str) -> Option<&'o str> {
        if !self.spec.allows_origin(origin) {
            None
        } else if self.spec.any_origin() && !self.spec.allow_credentials {
            Some("*")
        } else {
            Some(origin)
        }
    }

    /// A preflight's answer, or the response fields of any other request.
    pub(super) fn request(
        &self,
        info: &Info<'_>,
        headers: &impl Headers,
        applied: &mut Applied,
    ) -> Option<Answer> {
        let origin = headers.get_str("origin").map(str::trim);
        let asked = headers.get_str("access-control-request-method");
        let vary = !self.spec.any_origin();
        if let (true, Some(origin), Some(method)) = (info.method == "OPTIONS", origin, asked) {
            let mut fields = Vec::new();
            if vary {
                fields.push((header::VARY, HeaderValue::from_static("origin")));
            }
            let asked_headers: Vec<&str> = headers
                .values("access-control-request-headers")
                .filter_map(visible_ascii)
                .collect();
            let allowed = self
                .allow_origin(origin)
                .filter(|_| self.spec.allows_preflight(method.trim(), &asked_headers.join(",")))
                .and_then(|o| HeaderValue::from_str(o).ok());
            if let Some(value) = allowed {
                fields.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, value));
                if self.spec.allow_credentials {
                    let yes = HeaderValue::from_static("true");
                    fields.push((header::ACCESS_CONTROL_ALLOW_CREDENTIALS, yes));
                }
                fields.extend(self.preflight.iter().cloned());
            }
            return Some(Answer { status: 204, headers: fields, body: Bytes::new() });
        }
        if vary {
            applied.response.push(Pending::Add(header::VARY, "origin".to_owned()));
        }
        // Only an origin that matched goes back: its characters are a pattern's (no control
        // character, so never the `${member}` placeholder).
        if let Some(value) = origin.and_then(|o| self.allow_origin(o)) {
            let set = |n: HeaderName, v: String| Pending::Set(n, v);
            applied.response.push(set(header::ACCESS_CONTROL_ALLOW_ORIGIN, value.to_owned()));
            if self.spec.allow_credentials {
                applied.response.push(set(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, "true".into()));
            }
            if let Some(e) = &self.expose {
                applied.response.push(set(header::ACCESS_CONTROL_EXPOSE_HEADERS, e.clone()));
            }
        }
        None
    }
}
