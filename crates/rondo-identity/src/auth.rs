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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rondo_core::{Route, RouteAuth};
use rondo_runtime::Live;
use rondo_runtime::revoke::Revocations;
use rondo_runtime::secret::TierKey;
use serde_json::Value;

use crate::head::Headers;
use crate::names;

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
        live: &Live,
        headers: &impl Headers,
    ) -> Result<Option<Identity>, AuthError> {
        let Some(spec) = &route.auth else { return Ok(None) };
        let now = SystemTime::now();
        let tier = live.tier_key();
        let checked = Credentials::read(headers)
            .and_then(|c| self.check(spec, c, tier.as_deref(), &live.revocations, now));
        match checked {
            Ok(identity) => Ok(Some(identity)),
            Err(e) => {
                live.metrics.auth_refused(&route.name, e.refusal.as_str());
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

/// One usable key of a JWKS file.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// A JWKS file as last read.
struct Keys {
    keys: Vec<Key>,
    /// Why the file gave no keys (its path in it), if it did not.
    error: Option<String>,
    /// The modification time and length it was read at.
    stamp: Option<(SystemTime, u64)>,
}

/// A JWKS file and when it was last looked at.
struct KeyFile {
    path: PathBuf,
    keys: ArcSwap<Keys>,
    checked: Mutex<Instant>,
}

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl KeyFile {
    fn load(path: PathBuf) -> KeyFile {
        let keys = read_keys(&path);
        KeyFile { path, keys: ArcSwap::from_pointee(keys), checked: Mutex::new(Instant::now()) }
    }

    /// The keys, re-read first when the file changed (looked at once per [`RELOAD_CHECK`]; a
    /// request that finds another one looking goes on with the keys as they are).
    fn current(&self) -> Arc<Keys> {
        if let Ok(mut checked) = self.checked.try_lock()
            && checked.elapsed() >= RELOAD_CHECK
        {
            *checked = Instant::now();
            let stamp = stamp(&self.path);
            if stamp != self.keys.load().stamp {
                let keys = read_keys(&self.path);
                match &keys.error {
                    Some(e) => tracing::warn!(error = %e, "auth keys not reloaded"),
                    None => {
                        tracing::info!(path = %self.path.display(), keys = keys.keys.len(), "auth keys reloaded")
                    }
                }
                // A file broken mid-write keeps the keys it had (they are still the tier's).
                if keys.error.is_none() || self.keys.load().keys.is_empty() {
                    self.keys.store(Arc::new(keys));
                }
            }
        }
        self.keys.load_full()
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Reads a JWKS file ([`rondo_config::jwks::load`]); keys of other types or algorithms are
/// skipped (and logged).
fn read_keys(path: &Path) -> Keys {
    let stamp = stamp(path);
    match rondo_config::jwks::load(path) {
        Ok((keys, skipped)) => {
            for i in skipped {
                tracing::warn!(
                    path = %path.display(),
                    key = i,
                    "auth key skipped: not an Ed25519, P-256, RSA or HMAC key for EdDSA, ES256, RS256 or HS256"
                );
            }
            let keys =
                keys.into_iter().map(|k| Key { kid: k.kid, alg: k.alg, key: k.key }).collect();
            Keys { keys, error: None, stamp }
        }
        Err(e) => Keys { keys: Vec::new(), error: Some(e), stamp },
    }
}

/// The token's header `alg` and `kid`, read without trusting them (only to choose a key and to
/// name `alg = none` as what it is).
fn peek_header(token: &str) -> Result<(String, Option<String>), AuthError> {
    let malformed = || AuthError::new(Refusal::Malformed, "the bearer token is not a JWT");
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let bytes = URL_SAFE_NO_PAD.decode(head).map_err(|_| malformed())?;
    if let Some(name) = duplicate_name(&bytes) {
        return Err(AuthError::new(
            Refusal::Malformed,
            format!("the token's header names {name} twice"),
        ));
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| malformed())?;
    // RFC 7515 section 4.1.11: a token whose `crit` names extensions must be refused by a
    // verifier that does not understand them, and this one understands none.
    if v.get("crit").is_some() {
        return Err(AuthError::new(
            Refusal::Malformed,
            "the token has critical header parameters (crit) this router does not understand",
        ));
    }
    let alg = v.get("alg").and_then(Value::as_str).ok_or_else(malformed)?.to_owned();
    let kid = v.get("kid").and_then(Value::as_str).map(str::to_owned);
    Ok((alg, kid))
}

/// The first name an object of the JSON text `json` holds twice, at any depth (printable, at
/// most 64 characters), or `None`: none does, or the text is no JSON (which the reader of the
/// text then reports).
fn duplicate_name(json: &[u8]) -> Option<String> {
    let found = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(json);
    let _ = serde::de::DeserializeSeed::deserialize(Unique(&found), &mut de);
    found.into_inner().map(|n: String| printable(&n).chars().take(64).collect())
}

/// A JSON value walked (not kept) to find a duplicated object member name, which it records
/// before stopping the parse with an error.
#[derive(Clone, Copy)]
struct Unique<'a>(&'a std::cell::RefCell<Option<String>>);

impl<'de> serde::de::DeserializeSeed<'de> for Unique<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Unique<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut names = std::collections::HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            if !names.insert(name.clone()) {
                *self.0.borrow_mut() = Some(name);
                return Err(serde::de::Error::custom("duplicate name"));
            }
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

fn verify(
    spec: &RouteAuth,
    keys: &Keys,
    token: &str,
    now: SystemTime,
) -> Result<Identity, AuthError> {
    if token.len() > MAX_TOKEN {
        return Err(AuthError::new(Refusal::Malformed, "the bearer token is too long"));
    }
    let (alg_name, kid) = peek_header(token)?;
    // The claims the crate reads keep the last of a duplicated name (or refuse some with a
    // misleading error): one name must mean one value (RFC 7519 section 4), so refuse first.
    let payload = token.split('.').nth(1).and_then(|p| URL_SAFE_NO_PAD.decode(p).ok());
    if let Some(name) = payload.as_deref().and_then(duplicate_name) {
        return Err(AuthError::new(
            Refusal::Malformed,
            format!("the token's claims name {name} twice"),
        ));
    }
    if alg_name.eq_ignore_ascii_case("none") {
        return Err(AuthError::new(Refusal::Unsigned, "unsigned tokens (alg none) are refused"));
    }
    let alg = match alg_name.as_str() {
        "EdDSA" => Algorithm::EdDSA,
        "ES256" => Algorithm::ES256,
        "RS256" => Algorithm::RS256,
        "HS256" => Algorithm::HS256,
        other => {
            let other: String = other.chars().filter(char::is_ascii_graphic).take(16).collect();
            return Err(AuthError::new(
                Refusal::Algorithm,
                format!("token algorithm {other} is not one of EdDSA, ES256, RS256, HS256"),
            ));
        }
    };
    if keys.keys.is_empty() {
        if let Some(e) = &keys.error {
            tracing::warn!(error = %e, "token refused: no keys");
        }
        return Err(AuthError::new(Refusal::Keys, "the route's signing keys are unavailable"));
    }
    let candidates: Vec<&Key> = match &kid {
        Some(kid) => keys.keys.iter().filter(|k| k.kid.as_deref() == Some(kid)).collect(),
        None => keys.keys.iter().collect(),
    };
    if candidates.is_empty() {
        return Err(AuthError::new(Refusal::UnknownKey, "no key has the token's kid"));
    }
    let candidates: Vec<&Key> = candidates.into_iter().filter(|k| k.alg == alg).collect();
    if candidates.is_empty() {
        return Err(AuthError::new(
            Refusal::Algorithm,
            format!("no key is for the token's algorithm {alg_name}"),
        ));
    }
    let mut validation = Validation::new(alg);
    // The time window, issuer, audience and claims are checked below, against `now` and with
    // reasons of their own; the crate checks the signature and the algorithm only.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let mut claims = None;
    for key in candidates {
        match jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key.key, &validation) {
            Ok(data) => {
                claims = Some(data.claims);
                break;
            }
            Err(e) => {
                use jsonwebtoken::errors::ErrorKind as E;
                match e.kind() {
                    E::InvalidSignature | E::InvalidEcdsaKey | E::InvalidRsaKey(_) => continue,
                    E::InvalidAlgorithm => {
                        return Err(AuthError::new(Refusal::Algorithm, "token algorithm mismatch"));
                    }
                    _ => {
                        return Err(AuthError::new(
                            Refusal::Malformed,
                            "the bearer token's claims are not a JSON object",
                        ));
                    }
                }
            }
        }
    }
    let claims = claims.ok_or_else(|| {
        AuthError::new(Refusal::Signature, "the token's signature does not verify")
    })?;
    check_claims(spec, &claims, now)
}

/// What the MAC of a session token covers (the context keeps a sticky cookie's MAC, made with
/// the same key, from ever passing for one).
fn session_mac_input(payload: &str) -> String {
    format!("rondo-session-v1\n{payload}")
}

/// A tier session token for `subject`, good for `ttl` from `now` (Unix seconds):
/// `<base64url JSON {sub, jti, exp}>.<base64url MAC>`, the MAC an HMAC-SHA256 under the tier key.
pub fn issue_session(key: &TierKey, subject: &str, ttl: Duration, now: u64) -> String {
    let mut id = [0u8; 16];
    // ring's system randomness; a failure leaves a time-derived id (still unique per login).
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id).is_err() {
        id[..8].copy_from_slice(&now.to_be_bytes());
    }
    let jti: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let claims = serde_json::json!({ "sub": subject, "jti": jti, "exp": now + ttl.as_secs() });
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let tag = key.sign(session_mac_input(&payload).as_bytes());
    format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// The identity a session cookie stands for, when it verifies under the tier key and has not
/// expired; the route's `require` applies to its claims (`sub`, `jti`) like to a token's.
fn session_identity(
    spec: &RouteAuth,
    key: &TierKey,
    value: &str,
    now: SystemTime,
) -> Result<Identity, AuthError> {
    let bad = || AuthError::new(Refusal::Signature, "the session cookie does not verify");
    if value.len() > MAX_TOKEN {
        return Err(AuthError::new(Refusal::Malformed, "the session cookie is too long"));
    }
    let (payload, mac) = value.split_once('.').ok_or_else(bad)?;
    let tag = URL_SAFE_NO_PAD.decode(mac).map_err(|_| bad())?;
    if tag.len() != 32 || !key.verify_prefix(session_mac_input(payload).as_bytes(), &tag) {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(payload).map_err(|_| bad())?;
    let claims: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    match time_claim(&claims, "exp")? {
        Some(exp) if exp > now => identity_of(spec, &claims),
        _ => Err(AuthError::new(Refusal::Expired, "the session has expired")),
    }
}

/// The response stage's one call on hyper's path: removes `x-rondo-login` from a member's
/// response head and adds the session cookie [`login_cookie`] makes of it, if any.
pub fn on_response(route: &Route, status: u16, headers: &mut HeaderMap, live: &Live, secure: bool) {
    let Some(vouched) = headers.remove(LOGIN_HEADER) else { return };
    let (tier, now) = (live.tier_key(), SystemTime::now());
    if let Some(v) = login_cookie(route, status, vouched.as_bytes(), tier.as_deref(), secure, now) {
        headers.append(http::header::SET_COOKIE, v);
    }
}

/// The `Set-Cookie` of a new tier session for the subject a member vouched for in
/// `x-rondo-login` (`vouched`): only on a login route (with a tier key), in a response below 400,
/// for a subject of visible ASCII up to 256 bytes; `Secure` when the client came over TLS
/// (`secure`). Both HTTP paths call this; the header itself never reaches the client.
pub fn login_cookie(
    route: &Route,
    status: u16,
    vouched: &[u8],
    tier: Option<&TierKey>,
    secure: bool,
    now: SystemTime,
) -> Option<HeaderValue> {
    let (Some(login), Some(key)) = (&route.login, tier) else {
        tracing::debug!(route = %route.name, "x-rondo-login from a member of a route without login: dropped");
        return None;
    };
    let subject = match crate::head::visible_ascii(vouched) {
        Some(s) if status < 400 && !s.trim().is_empty() && s.len() <= 256 => s.trim(),
        _ => return None,
    };
    let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let token = issue_session(key, subject, login.ttl, secs);
    let cookie = format!(
        "{SESSION_COOKIE}={token}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{}",
        login.ttl.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    let value = HeaderValue::from_str(&cookie).ok()?;
    tracing::info!(route = %route.name, subject, "user signed on");
    Some(value)
}

/// Seconds since the Unix epoch of a numeric claim (`exp`, `nbf`).
fn time_claim(
    claims: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<f64>, AuthError> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            AuthError::new(Refusal::Malformed, format!("claim {name} is not a number"))
        }),
    }
}

fn check_claims(
    spec: &RouteAuth,
    claims: &serde_json::Map<String, Value>,
    now: SystemTime,
) -> Result<Identity, AuthError> {
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    let leeway = LEEWAY.as_secs_f64();
    match time_claim(claims, "exp")? {
        None => return Err(AuthError::new(Refusal::Expired, "the token has no expiry (exp)")),
        Some(exp) if exp + leeway <= now => {
            return Err(AuthError::new(Refusal::Expired, "the token has expired"));
        }
        Some(_) => {}
    }
    if let Some(nbf) = time_claim(claims, "nbf")?
        && nbf - leeway > now
    {
        return Err(AuthError::new(Refusal::NotYetValid, "the token is not valid yet (nbf)"));
    }
    let malformed = |what: &str| AuthError::new(Refusal::Malformed, format!("the token's {what}"));
    match claims.get("iss") {
        Some(Value::String(iss)) if *iss == spec.issuer => {}
        Some(Value::String(_)) | None => {
            return Err(AuthError::new(Refusal::Issuer, "the token is from another issuer"));
        }
        Some(_) => return Err(malformed("issuer (iss) is not a string")),
    }
    let aud_ok = match claims.get("aud") {
        Some(Value::String(a)) => *a == spec.audience,
        Some(Value::Array(list)) if list.iter().all(Value::is_string) => {
            list.iter().any(|a| a.as_str() == Some(&spec.audience))
        }
        Some(Value::Array(_) | Value::Number(_) | Value::Bool(_) | Value::Object(_)) => {
            return Err(malformed("audience (aud) is not a string or a list of strings"));
        }
        Some(Value::Null) | None => false,
    };
    if !aud_ok {
        return Err(AuthError::new(Refusal::Audience, "the token is for another audience"));
    }
    identity_of(spec, claims)
}

/// The identity a verified token's (or session's) claims give: every `require` claim holds, a
/// subject, and the headers members get.
fn identity_of(
    spec: &RouteAuth,
    claims: &serde_json::Map<String, Value>,
) -> Result<Identity, AuthError> {
    for (name, want) in &spec.require {
        if !claim_holds(claims.get(name), want) {
            return Err(AuthError::new(
                Refusal::Claim,
                format!("the token's {} claim does not grant {}", printable(name), printable(want)),
            ));
        }
    }
    let subject = match claims.get("sub") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(AuthError::new(Refusal::Malformed, "the token names no subject (sub)")),
    };
    // What a member reads and what a revocation names must be the same text: no white space a
    // header reader would trim, and short enough to be revoked (the admin API's limit).
    if subject.trim() != subject || subject.len() > MAX_ID {
        return Err(AuthError::new(
            Refusal::Malformed,
            format!("the token's subject has surrounding white space or is over {MAX_ID} bytes"),
        ));
    }
    let token_id = match claims.get("jti") {
        None => None,
        Some(Value::String(j)) if !j.is_empty() && j.len() <= MAX_ID => Some(j.clone()),
        Some(_) => {
            return Err(AuthError::new(
                Refusal::Malformed,
                format!("the token's id (jti) is not a string of 1 to {MAX_ID} bytes"),
            ));
        }
    };
    let mut headers = Vec::with_capacity(1 + spec.claims.len());
    let value = HeaderValue::from_str(&subject).map_err(|_| {
        AuthError::new(Refusal::Malformed, "the token's subject cannot be sent in a header")
    })?;
    headers.push((HeaderName::from_static(SUBJECT_HEADER), value));
    for name in &spec.claims {
        let Some(v) = claims.get(name) else { continue };
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        // Names were checked as header tokens when the configuration was compiled; a value a
        // header cannot carry (a control character) is left out rather than mangled.
        // The claim is looked up by its own name (claims are case-sensitive); its header is
        // the lower-case one.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(format!("{CLAIM_PREFIX}{name}").to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(&text),
        ) {
            headers.push((n, v));
        }
    }
    Ok(Identity { subject, token_id, headers })
}

/// Whether a claim holds `want`: equal to it, one of its space-separated words (`scope`), or an
/// element of its array; numbers and booleans compare by their JSON text.
fn claim_holds(v: Option<&Value>, want: &str) -> bool {
    match v {
        Some(Value::String(s)) => s == want || s.split(' ').any(|w| w == want),
        Some(Value::Array(list)) => list.iter().any(|e| claim_holds(Some(e), want)),
        Some(Value::Number(n)) => n.to_string() == want,
        Some(Value::Bool(b)) => b.to_string() == want,
        _ => false,
    }
}

/// A configured name or value for a client-facing sentence, without control characters.
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const SECRET: &[u8] = b"a development secret of 32 bytes";

    fn spec() -> RouteAuth {
        RouteAuth {
            issuer: "https://issuer.test".into(),
            audience: "orders".into(),
            keys: PathBuf::from("unused"),
            require: vec![("scope".into(), "orders:read".into())],
            claims: vec!["email".into()],
        }
    }

    fn keys() -> Keys {
        let k = URL_SAFE_NO_PAD.encode(SECRET);
        let set: jsonwebtoken::jwk::JwkSet =
            serde_json::from_value(json!({"keys": [{"kty": "oct", "k": k, "kid": "h1"}]})).unwrap();
        let jwk = &set.keys[0];
        let key = DecodingKey::from_jwk(jwk).unwrap();
        Keys {
            keys: vec![Key { kid: Some("h1".into()), alg: Algorithm::HS256, key }],
            error: None,
            stamp: None,
        }
    }

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn claims() -> Value {
        json!({
            "iss": "https://issuer.test", "aud": "orders", "sub": "alice",
            "exp": 1_800_000_600u64, "nbf": 1_799_999_000u64,
            "scope": "orders:read orders:write", "email": "alice@example.test", "jti": "t1"
        })
    }

    fn token(claims: &Value, secret: &[u8]) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("h1".into());
        encode(&h, claims, &EncodingKey::from_secret(secret)).unwrap()
    }

    fn refusal(t: &str) -> Refusal {
        verify(&spec(), &keys(), t, now()).unwrap_err().refusal
    }

    #[test]
    fn a_good_token_gives_the_subject_and_chosen_claims() {
        let id = verify(&spec(), &keys(), &token(&claims(), SECRET), now()).unwrap();
        assert_eq!(id.subject, "alice");
        assert_eq!(id.token_id.as_deref(), Some("t1"));
        let hs: Vec<(String, String)> =
            id.headers().map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned())).collect();
        assert_eq!(
            hs,
            vec![
                ("x-rondo-subject".to_owned(), "alice".to_owned()),
                ("x-rondo-claim-email".to_owned(), "alice@example.test".to_owned())
            ]
        );
    }

    #[test]
    fn each_fault_has_its_reason() {
        let with = |k: &str, v: Value| {
            let mut c = claims();
            c[k] = v;
            token(&c, SECRET)
        };
        assert_eq!(
            refusal(&token(&claims(), b"another secret of 32 bytes......")),
            Refusal::Signature
        );
        assert_eq!(refusal(&with("exp", json!(1_799_999_000u64))), Refusal::Expired);
        assert_eq!(refusal(&with("nbf", json!(1_800_000_300u64))), Refusal::NotYetValid);
        assert_eq!(refusal(&with("aud", json!("billing"))), Refusal::Audience);
        assert_eq!(refusal(&with("aud", json!(["billing", "shipping"]))), Refusal::Audience);
        // A list naming the route's audience is accepted.
        assert!(
            verify(&spec(), &keys(), &with("aud", json!(["billing", "orders"])), now()).is_ok()
        );
        assert_eq!(refusal(&with("iss", json!("https://evil.test"))), Refusal::Issuer);
        assert_eq!(refusal(&with("scope", json!("orders:write"))), Refusal::Claim);
        assert_eq!(refusal("not-a-token"), Refusal::Malformed);
        // alg none: a header {"alg":"none"} and an empty signature.
        let head = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let body = URL_SAFE_NO_PAD.encode(claims().to_string());
        assert_eq!(refusal(&format!("{head}.{body}.")), Refusal::Unsigned);
        // Within the leeway an expiry still holds.
        assert!(verify(&spec(), &keys(), &with("exp", json!(1_799_999_990u64)), now()).is_ok());
        // Claims of the wrong type, and subjects or ids a revocation could not name.
        assert_eq!(refusal(&with("iss", json!(7))), Refusal::Malformed);
        assert_eq!(refusal(&with("aud", json!(7))), Refusal::Malformed);
        assert_eq!(refusal(&with("aud", json!(["orders", 7]))), Refusal::Malformed);
        assert_eq!(refusal(&with("jti", json!(7))), Refusal::Malformed);
        assert_eq!(refusal(&with("jti", json!("j".repeat(257)))), Refusal::Malformed);
        assert_eq!(refusal(&with("sub", json!("admin "))), Refusal::Malformed);
        assert_eq!(refusal(&with("sub", json!(" admin"))), Refusal::Malformed);
        assert_eq!(refusal(&with("sub", json!("s".repeat(257)))), Refusal::Malformed);
        // A header with `crit` (extensions this router does not understand): RFC 7515 4.1.11.
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("h1".into());
        let crit = serde_json::to_value(&h).unwrap();
        let mut crit = crit.as_object().unwrap().clone();
        crit.insert("crit".into(), json!(["exp"]));
        let head = URL_SAFE_NO_PAD.encode(Value::Object(crit).to_string());
        let good = token(&claims(), SECRET);
        let rest = good.split_once('.').unwrap().1;
        assert_eq!(refusal(&format!("{head}.{rest}")), Refusal::Malformed);
    }

    /// A token of raw header and claims JSON text, signed (HS256 with the test key) so that the
    /// text is the only fault.
    fn raw_token(header: &str, claims: &str) -> String {
        let msg = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
        let key = EncodingKey::from_secret(SECRET);
        let sig = jsonwebtoken::crypto::sign(msg.as_bytes(), &key, Algorithm::HS256).unwrap();
        format!("{msg}.{sig}")
    }

    /// Issue 41 item 9: one claim (or header parameter) name, one value. A duplicate is refused
    /// with a message that names it, whichever claim it is, however it is spelled.
    #[test]
    fn a_name_given_twice_is_refused_and_named() {
        const HEAD: &str = r#"{"alg":"HS256","typ":"JWT","kid":"h1"}"#;
        let good = claims().to_string();
        assert!(verify(&spec(), &keys(), &raw_token(HEAD, &good), now()).is_ok());
        let cases = [
            (r#""scope":"orders:read""#, "scope"),
            (r#""sub":"mallory""#, "sub"),
            (r#""iss":"https://issuer.test""#, "iss"),
            (r#""aud":"orders""#, "aud"),
            (r#""exp":1800000600"#, "exp"),
            // The same name in another spelling of the same JSON string.
            (r#""s\u0075b":"mallory""#, "sub"),
            // Inside a claim's value (what a member would read in its claim header).
            (r#""address":{"a":1,"a":2}"#, "a"),
        ];
        for (extra, name) in cases {
            let text = format!("{},{extra}}}", good.strip_suffix('}').unwrap());
            let e = verify(&spec(), &keys(), &raw_token(HEAD, &text), now()).unwrap_err();
            assert_eq!(e.refusal, Refusal::Malformed, "{text}");
            assert_eq!(e.detail, format!("the token's claims name {name} twice"), "{text}");
        }
        for head in [
            r#"{"alg":"HS256","typ":"JWT","kid":"h1","alg":"HS256"}"#,
            r#"{"alg":"HS256","typ":"JWT","kid":"h1","kid":"h2"}"#,
        ] {
            let e = verify(&spec(), &keys(), &raw_token(head, &good), now()).unwrap_err();
            assert_eq!(e.refusal, Refusal::Malformed, "{head}");
            assert!(e.detail.starts_with("the token's header names "), "{head}: {}", e.detail);
            assert!(e.detail.ends_with(" twice"), "{head}: {}", e.detail);
        }
        // Not JSON at all is still the malformed token it was.
        let e = verify(&spec(), &keys(), &raw_token(HEAD, "{\"sub\":"), now()).unwrap_err();
        assert_eq!(e.detail, "the bearer token's claims are not a JSON object");
    }

    #[test]
    fn claims_are_looked_up_by_their_own_case() {
        let mut s = spec();
        s.claims = vec!["userId".into()];
        let mut c = claims();
        c["userId"] = json!("u-7");
        let id = verify(&s, &keys(), &token(&c, SECRET), now()).unwrap();
        let hs: Vec<String> =
            id.headers().map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())).collect();
        assert!(hs.contains(&"x-rondo-claim-userid: u-7".to_owned()), "{hs:?}");
    }

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
