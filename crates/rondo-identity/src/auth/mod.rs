//! Sign-on tokens checked at the router (a route's `auth`, PKUAS single sign-on): the token a
//! request carries (`Authorization: Bearer`) is verified against the route's JWKS file (EdDSA,
//! ES256, RS256, HS256; reloaded when the file changes), its issuer, audience, time window and
//! required claims, before any member sees the request; the verified subject and the chosen
//! claims reach members in `x-rondo-subject` and `x-rondo-claim-<name>`, whose incoming copies
//! are stripped from every request on every route (a client must never be able to claim an
//! identity by sending the header itself).
//!
//! The API is free of hyper types and of any product's, so every request path (the router's
//! two HTTP paths, a queue listener's intake) makes the same three calls: [`Auth::gate`] with
//! the head's fields once the route is known (a refusal is a [`Refusal`], answered 401 with
//! `WWW-Authenticate`, or 400 for a request with two credentials; the router maps it to its
//! own error kind), then [`strip`] and [`Identity::headers`] on the head members get.
//!
//! The gate and what it gives are here; the token's own checks in `jwt`, tier sessions and
//! the login cookie in `session`.

mod jwt;
mod session;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use rondo_core::{Route, RouteAuth};
use rondo_runtime::TierKeys;
use rondo_runtime::metrics::Metrics;
use rondo_runtime::revoke::Revocations;
use rondo_runtime::secret::TierKey;

use crate::head::Headers;
use crate::names;
use jwt::{KeyFile, verify};
use session::session_identity;
pub use session::{issue_session, login_cookie};

/// The header members read the verified subject from.
pub const SUBJECT_HEADER: &str = "x-rondo-subject";
/// The prefix of the headers members read chosen claims from (`x-rondo-claim-email`).
pub const CLAIM_PREFIX: &str = "x-rondo-claim-";
/// The response header a login route's member names a signed-on user in; removed from every
/// response (only a login route's member can sign a user on, and only through the router).
pub const LOGIN_HEADER: &str = "x-rondo-login";
/// The cookie of tier-wide sessions (issued by login routes, accepted by `auth` routes).
pub const SESSION_COOKIE: &str = "rondo-session";
/// How far a token's `exp` and `nbf` may be off (clocks of issuer and router differ a little).
pub const LEEWAY: Duration = Duration::from_secs(30);
/// How often a route's JWKS file is looked at for a change (on a request; no timer).
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);
/// Tokens longer than this are refused unread (a header can be large; a JWT need not be).
pub const MAX_TOKEN: usize = 16 * 1024;
/// Longest subject (`sub`) and token id (`jti`) accepted: what a revocation can name.
pub const MAX_ID: usize = 256;

/// Why a token was refused; each is a metrics label (`rondo_auth_refusals_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` token.
    Missing,
    /// Not a JWT (three base64url parts, JSON header and claims), or a claim of the wrong type.
    Malformed,
    /// `alg = none`: an unsigned token.
    Unsigned,
    /// Signed with an algorithm no key of the file is for (or not one of the four supported).
    Algorithm,
    /// No key of the file has the token's `kid`.
    UnknownKey,
    /// The signature does not verify under the key.
    Signature,
    /// `exp` has passed (or is missing).
    Expired,
    /// `nbf` is still ahead.
    NotYetValid,
    /// `iss` is not the route's issuer.
    Issuer,
    /// `aud` does not name the route's audience.
    Audience,
    /// A `require` claim is missing or does not hold the value.
    Claim,
    /// The token's id or subject is revoked (admin API, shared by the tier).
    Revoked,
    /// The route's key file could not be read or holds no usable key.
    Keys,
    /// Two `Authorization` fields (not a list field, RFC 9110 section 11.6.2), or, without a
    /// bearer token, tier sessions that differ: which one the client meant is unknown, so none
    /// is checked and the request is refused as malformed (400, RFC 6750 `invalid_request`).
    Ambiguous,
}

impl Refusal {
    /// The metrics label and the short reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Unsigned => "alg_none",
            Refusal::Algorithm => "algorithm",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Signature => "bad_signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::Issuer => "wrong_issuer",
            Refusal::Audience => "wrong_audience",
            Refusal::Claim => "missing_claim",
            Refusal::Revoked => "revoked",
            Refusal::Keys => "keys_unavailable",
            Refusal::Ambiguous => "ambiguous",
        }
    }

    /// The status the client is answered with: 400 for a request that is malformed as a whole
    /// ([`Refusal::Ambiguous`]), 401 for a refused token (RFC 6750 section 3.1).
    pub fn status(self) -> http::StatusCode {
        match self {
            Refusal::Ambiguous => http::StatusCode::BAD_REQUEST,
            _ => http::StatusCode::UNAUTHORIZED,
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 section 3): no error code when the request
    /// carried no token, `invalid_token` when it did, `insufficient_scope` for a claim,
    /// `invalid_request` for an ambiguous request.
    pub fn challenge(self) -> HeaderValue {
        let v = match self {
            Refusal::Missing => "Bearer realm=\"rondo\"".to_owned(),
            Refusal::Claim => format!(
                "Bearer realm=\"rondo\", error=\"insufficient_scope\", error_description=\"{}\"",
                self.as_str()
            ),
            Refusal::Ambiguous => format!(
                "Bearer realm=\"rondo\", error=\"invalid_request\", error_description=\"{}\"",
                self.as_str()
            ),
            _ => format!(
                "Bearer realm=\"rondo\", error=\"invalid_token\", error_description=\"{}\"",
                self.as_str()
            ),
        };
        HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("Bearer realm=\"rondo\""))
    }
}

/// A refused token: the reason and a sentence for the client (the token's own fault, so it is
/// the client's to know; never the key file's path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    /// Why.
    pub refusal: Refusal,
    /// A sentence, lower case, no trailing period.
    pub detail: String,
}

impl AuthError {
    fn new(refusal: Refusal, detail: impl Into<String>) -> Self {
        AuthError { refusal, detail: detail.into() }
    }
}

/// Who a verified token says the caller is, as members are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The token's `sub`.
    pub subject: String,
    /// The token's id (`jti`), when it has one.
    pub token_id: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Identity {
    /// The headers members get: `x-rondo-subject` and one `x-rondo-claim-<name>` per chosen
    /// claim the token has (strings as they are, other values as JSON).
    pub fn headers(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        self.headers.iter().map(|(n, v)| (n, v))
    }
}

/// Whether `name` (lower case, as `http` keeps names) is an identity header: the router's to
/// set, never the client's.
pub fn is_identity_header(name: &[u8]) -> bool {
    // Any case, and `x_rondo_subject` too: CGI-style servers read it as `x-rondo-subject`.
    names::name_is(name, SUBJECT_HEADER) || names::name_starts_with(name, CLAIM_PREFIX)
}

/// Whether a request head's field `name` is one no member may get from a client: an identity
/// header, or an underscore spelling of a field the router owns.
fn stripped(name: &[u8]) -> bool {
    is_identity_header(name) || names::is_reserved_alias(name)
}

/// Removes every identity header (and underscore spelling of a field the router owns) from a
/// request head, on every route, with or without `auth`.
pub fn strip(headers: &mut HeaderMap) {
    names::remove_names(headers, stripped);
}

/// [`strip`], then the identity's headers (when the route verified one).
pub fn apply(headers: &mut HeaderMap, identity: Option<&Identity>) {
    strip(headers);
    strip_session_cookie(headers);
    for (n, v) in identity.into_iter().flat_map(Identity::headers) {
        headers.insert(n.clone(), v.clone());
    }
}

/// A `Cookie` field's value without the tier session's cookie ([`SESSION_COOKIE`]): `None`
/// when it has none (the usual case, found without an allocation), else the other cookies
/// (empty when there are none). The session stands for its user on every `auth` route of the
/// tier, so no member, of any route, is given it.
pub fn cookie_without_session(value: &[u8]) -> Option<Vec<u8>> {
    let name = SESSION_COOKIE.as_bytes();
    if !value.windows(name.len()).any(|w| w == name) {
        return None;
    }
    let mut out = Vec::with_capacity(value.len());
    let mut dropped = false;
    for pair in value.split(|&b| b == b';') {
        let trimmed = pair.trim_ascii();
        if trimmed.is_empty() {
            continue;
        }
        let n = trimmed.split(|&b| b == b'=').next().unwrap_or_default().trim_ascii();
        if n == name {
            dropped = true;
            continue;
        }
        if !out.is_empty() {
            out.extend_from_slice(b"; ");
        }
        out.extend_from_slice(trimmed);
    }
    dropped.then_some(out)
}

/// [`cookie_without_session`] on every `Cookie` field of a head (fields left empty removed).
fn strip_session_cookie(headers: &mut HeaderMap) {
    let cookie = http::header::COOKIE;
    let changed: Vec<Option<Vec<u8>>> =
        headers.get_all(&cookie).iter().map(|v| cookie_without_session(v.as_bytes())).collect();
    if changed.iter().all(Option::is_none) {
        return;
    }
    let kept: Vec<HeaderValue> = headers
        .get_all(&cookie)
        .iter()
        .zip(changed)
        .filter_map(|(v, c)| match c {
            None => Some(v.clone()),
            Some(c) if c.is_empty() => None,
            Some(c) => HeaderValue::from_bytes(&c).ok(),
        })
        .collect();
    headers.remove(&cookie);
    for v in kept {
        headers.append(cookie.clone(), v);
    }
}

/// A request's sign-on credentials as the route stage reads them: its one `Authorization` field
/// and its tier session cookie. Read once, from every field, so that a second field cannot
/// hide behind the first (only the first would be checked, and both would reach the member).
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'h> {
    authorization: Option<&'h str>,
    session: Option<&'h str>,
    sessions_differ: bool,
}

impl<'h> Credentials<'h> {
    /// The credentials of a request head; a second `Authorization` field is refused here
    /// ([`Refusal::Ambiguous`]), sessions that differ only when one would be checked.
    pub fn read(headers: &'h impl Headers) -> Result<Self, AuthError> {
        let mut fields = headers.values("authorization");
        let authorization = fields.next();
        if fields.next().is_some() {
            return Err(AuthError::new(
                Refusal::Ambiguous,
                "the request has more than one Authorization field",
            ));
        }
        let mut sessions = crate::head::cookies(headers, SESSION_COOKIE);
        let session = sessions.next();
        let sessions_differ = sessions.any(|other| Some(other) != session);
        Ok(Credentials {
            authorization: authorization.and_then(crate::head::visible_ascii),
            session,
            sessions_differ,
        })
    }
}

/// The token checker of a router: the routes' key files, each loaded once and reloaded when it
/// What [`Auth::gate`] reads beyond the request: the tier's key, the revocations, and where a
/// refusal is counted (borrowed from the caller's handles, nothing cloned per request).
#[derive(Debug, Clone, Copy)]
pub struct GateParts<'a> {
    /// The tier's key in force (sessions, sign-on tokens).
    pub tier_keys: &'a TierKeys,
    /// The revoked tokens.
    pub revocations: &'a Revocations,
    /// Where refusals are counted.
    pub metrics: &'a Metrics,
}

/// changes. Shared by every listener.
#[derive(Debug, Default)]
pub struct Auth {
    files: Mutex<HashMap<PathBuf, Arc<KeyFile>>>,
}

impl Auth {
    /// Verifies the request's credentials for `spec`; `now` is the wall clock (tokens carry
    /// Unix times). A bearer token is checked against the route's keys; without one, a tier
    /// session cookie (when the tier has a key) stands for its subject. Either is refused when
    /// revoked.
    pub fn check(
        &self,
        spec: &RouteAuth,
        credentials: Credentials<'_>,
        tier: Option<&TierKey>,
        revoked: &Revocations,
        now: SystemTime,
    ) -> Result<Identity, AuthError> {
        let identity = match bearer(credentials.authorization) {
            Some(token) => {
                let keys = self.file(&spec.keys).current();
                verify(spec, &keys, token, now)?
            }
            None if credentials.sessions_differ => {
                return Err(AuthError::new(
                    Refusal::Ambiguous,
                    "the request has more than one tier session (rondo-session cookies that differ)",
                ));
            }
            None => match (tier, credentials.session) {
                (Some(key), Some(value)) => session_identity(spec, key, value, now)?,
                _ => return Err(AuthError::new(Refusal::Missing, "a bearer token is required")),
            },
        };
        let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if revoked.is_revoked(identity.token_id.as_deref(), &identity.subject, secs) {
            return Err(AuthError::new(Refusal::Revoked, "the token has been revoked"));
        }
        Ok(identity)
    }

    /// The route stage's one call (the router's and a queue listener's), given the request's
    /// header fields: `Ok(None)` on a route without `auth`, the verified identity on one with
    /// it, or the refusal the client is answered 401 (or 400) for (counted in
    /// `rondo_auth_refusals_total`).
    pub fn gate(
        &self,
        route: &Route,
        parts: GateParts<'_>,
        headers: &impl Headers,
    ) -> Result<Option<Identity>, AuthError> {
        let Some(spec) = &route.auth else { return Ok(None) };
        let now = SystemTime::now();
        let tier = parts.tier_keys.get();
        let checked = Credentials::read(headers)
            .and_then(|c| self.check(spec, c, tier.as_deref(), parts.revocations, now));
        match checked {
            Ok(identity) => Ok(Some(identity)),
            Err(e) => {
                parts.metrics.auth_refused(&route.name, e.refusal.as_str());
                Err(e)
            }
        }
    }

    /// Loads a key file now (at start and reload, so a broken file is reported at once rather
    /// than at the first request); the error names the file.
    pub fn preload(&self, path: &Path) -> Result<(), String> {
        match &self.file(path).current().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn file(&self, path: &Path) -> Arc<KeyFile> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files
            .entry(path.to_owned())
            .or_insert_with(|| Arc::new(KeyFile::load(path.to_owned())))
            .clone()
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 9110 11.1).
fn bearer(v: Option<&str>) -> Option<&str> {
    let v = v?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert("x-rondo-subject", HeaderValue::from_static("root"));
        h.insert("x-rondo-claim-role", HeaderValue::from_static("admin"));
        // Underscore spellings, which CGI-style servers read as the router's own.
        h.insert("x_rondo_subject", HeaderValue::from_static("root"));
        h.insert("x_rondo-claim_role", HeaderValue::from_static("admin"));
        h.insert("x_forwarded_for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x_client_cert_subject", HeaderValue::from_static("CN=root"));
        h.insert("x-other", HeaderValue::from_static("kept"));
        h.insert("x_other", HeaderValue::from_static("kept too"));
        strip(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-other", "x_other"]);
    }

    #[test]
    fn the_tier_session_cookie_is_no_members_to_see() {
        assert_eq!(cookie_without_session(b"a=1; b=2"), None);
        let cases: [(&[u8], &[u8]); 5] = [
            (b"rondo-session=abc.def", b""),
            (b"a=1; rondo-session=abc.def; b=2", b"a=1; b=2"),
            (b"rondo-session=x;a=1", b"a=1"),
            (b"a=1;  rondo-session = x ", b"a=1"),
            (b"a=1; rondo-session=x; rondo-session=y", b"a=1"),
        ];
        for (raw, kept) in cases {
            assert_eq!(cookie_without_session(raw).as_deref(), Some(kept), "{raw:?}");
        }
        // A cookie whose name only contains the session's is no session: nothing changes.
        assert_eq!(cookie_without_session(b"my-rondo-session-x=1; a=2"), None);
        let mut h = HeaderMap::new();
        h.append(http::header::COOKIE, HeaderValue::from_static("rondo-session=s"));
        h.append(http::header::COOKIE, HeaderValue::from_static("a=1; rondo-session=s"));
        h.append(http::header::COOKIE, HeaderValue::from_static("b=2"));
        apply(&mut h, None);
        let left: Vec<&str> =
            h.get_all(http::header::COOKIE).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(left, ["a=1", "b=2"]);
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer(Some("bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }
}
