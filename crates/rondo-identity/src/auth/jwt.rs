//! A sign-on token's own checks: the route's JWKS file (loaded once, re-read when it changes),
//! the token's header and signature, its time window, issuer, audience and required claims,
//! and the identity its claims give (also a tier session's, whose claims are read the same way).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::header::{HeaderName, HeaderValue};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rondo_core::RouteAuth;
use serde_json::Value;

use super::{
    AuthError, CLAIM_PREFIX, Identity, LEEWAY, MAX_ID, MAX_TOKEN, RELOAD_CHECK, Refusal,
    SUBJECT_HEADER,
};

/// One usable key of a JWKS file.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// A JWKS file as last read.
pub(super) struct Keys {
    keys: Vec<Key>,
    /// Why the file gave no keys (its path in it), if it did not.
    pub(super) error: Option<String>,
    /// The modification time and length it was read at.
    stamp: Option<(SystemTime, u64)>,
}

/// A JWKS file and when it was last looked at.
pub(super) struct KeyFile {
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
    pub(super) fn load(path: PathBuf) -> KeyFile {
        let keys = read_keys(&path);
        KeyFile { path, keys: ArcSwap::from_pointee(keys), checked: Mutex::new(Instant::now()) }
    }

    /// The keys, re-read first when the file changed (looked at once per [`RELOAD_CHECK`]; a
    /// request that finds another one looking goes on with the keys as they are).
    pub(super) fn current(&self) -> Arc<Keys> {
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

pub(super) fn verify(
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

/// Seconds since the Unix epoch of a numeric claim (`exp`, `nbf`).
pub(super) fn time_claim(
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
pub(super) fn identity_of(
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
    use std::time::Duration;

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
}
