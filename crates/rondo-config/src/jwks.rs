//! A route's `auth.keys` file: a JSON Web Key Set read into the keys a token can be verified
//! with. The configuration checks it when it compiles (so `rondo check`, a start and a reload
//! all refuse a file with no usable key, naming the field), and the router reads it again
//! whenever the file changes.

use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};

/// One usable key: its id, the one algorithm its type allows, and the key.
pub struct JwksKey {
    /// The key's `kid`, when it has one.
    pub kid: Option<String>,
    /// EdDSA (Ed25519), ES256 (P-256), RS256 (RSA) or HS256 (an octet key): fixed by the key's
    /// type, so a token cannot pick another (the HS256-with-an-RSA-modulus confusion).
    pub alg: Algorithm,
    /// The verification key.
    pub key: DecodingKey,
}

impl std::fmt::Debug for JwksKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksKey").field("kid", &self.kid).field("alg", &self.alg).finish()
    }
}

/// The usable keys of a JWKS file, and the positions of the keys skipped (other types or
/// curves, HMAC keys under [`MIN_HMAC_KEY`] bytes, or an `alg` that disagrees with the type); an error naming the file when it cannot
/// be read, is not a JWKS document or holds no usable key.
pub fn load(path: &Path) -> Result<(Vec<JwksKey>, Vec<usize>), String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("cannot read auth keys {}: {e}", path.display()))?;
    let set: JwkSet = serde_json::from_slice(&text)
        .map_err(|e| format!("auth keys {} are not a JWKS document: {e}", path.display()))?;
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        let by_type = match &jwk.algorithm {
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                Some(Algorithm::EdDSA)
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Some(Algorithm::ES256)
            }
            AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
            // RFC 7518 section 3.2: an HS256 key has at least 256 bits.
            AlgorithmParameters::OctetKey(p) if secret_len(&p.value) >= MIN_HMAC_KEY => {
                Some(Algorithm::HS256)
            }
            _ => None,
        };
        // A key's own `alg` must agree with its type: it can narrow, never widen.
        let alg = match (by_type, jwk.common.key_algorithm) {
            (Some(a), None) => Some(a),
            (Some(a), Some(k)) if key_alg(k) == Some(a) => Some(a),
            _ => None,
        };
        match (alg, DecodingKey::from_jwk(jwk)) {
            (Some(alg), Ok(key)) => keys.push(JwksKey { kid: jwk.common.key_id.clone(), alg, key }),
            _ => skipped.push(i),
        }
    }
    if keys.is_empty() {
        return Err(format!(
            "auth keys {} hold no usable key (Ed25519, P-256, RSA or HMAC for EdDSA, ES256, \
             RS256 or HS256)",
            path.display()
        ));
    }
    Ok((keys, skipped))
}

/// Bytes an HMAC key must have at least (RFC 7518 section 3.2, for HS256).
pub const MIN_HMAC_KEY: usize = 32;

/// The length of a base64url key value (0 when it is not base64url).
fn secret_len(k: &str) -> usize {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(k).map_or(0, |b| b.len())
}

fn key_alg(k: KeyAlgorithm) -> Option<Algorithm> {
    match k {
        KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
        KeyAlgorithm::ES256 => Some(Algorithm::ES256),
        KeyAlgorithm::RS256 => Some(Algorithm::RS256),
        KeyAlgorithm::HS256 => Some(Algorithm::HS256),
        _ => None,
    }
}
