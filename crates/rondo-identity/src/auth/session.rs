//! Tier sessions: the `rondo-session` cookie a login route's member signs a user on with
//! (`x-rondo-login`), made and checked under the tier key, so that any router of the tier
//! accepts it on an `auth` route.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::header::HeaderValue;
use rondo_core::{Route, RouteAuth};
use rondo_runtime::secret::TierKey;
use serde_json::Value;

use super::jwt::{identity_of, time_claim};
use super::{AuthError, Identity, MAX_TOKEN, Refusal, SESSION_COOKIE};

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
pub(super) fn session_identity(
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

/// The `Set-Cookie` of a new tier session for the subject a member vouched for in
/// `x-rondo-login` (`vouched`): only on a login route (with a tier key), in a response below 400,
/// for a subject of visible ASCII up to 256 bytes; `Secure` when the client came over TLS
/// (`secure`). The router's `login` step calls this; the header itself never reaches the client.
pub fn login_cookie(
    route: &Route,
    status: u16,
    vouched: &[u8],
    tier: Option<&TierKey>,
    secure: bool,
    now: SystemTime,
) -> Option<HeaderValue> {
    let (Some(login), Some(key)) = (&route.login, tier) else { return None };
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
