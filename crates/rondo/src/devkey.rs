//! `rondo auth dev-key DIR` and `rondo auth token`: a development Ed25519 signing key and the
//! JWKS file a route's `auth.keys` reads, and tokens signed with that key, for trying sign-on
//! through the router locally (docs/identity.md). DEVELOPMENT ONLY: the private key sits
//! unprotected in DIR, and a real deployment gets its tokens from its identity provider.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{KeyPair, PKCS_ED25519};
use serde_json::{Map, Value, json};

/// Writes `dev-key.pem` (PKCS#8, mode 0600) and `jwks.json` (its public half, `kid`) into
/// `dir`; refuses to overwrite either. Returns the two paths, key first.
pub fn write(dir: &Path, kid: &str) -> anyhow::Result<Vec<PathBuf>> {
    if kid.is_empty() {
        bail!("--kid must not be empty");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (key, jwks) = (dir.join("dev-key.pem"), dir.join("jwks.json"));
    for f in [&key, &jwks] {
        if f.exists() {
            bail!("{} already exists (never overwritten)", f.display());
        }
    }
    let pair = KeyPair::generate_for(&PKCS_ED25519).context("cannot generate an Ed25519 key")?;
    let x = URL_SAFE_NO_PAD.encode(pair.public_key_raw());
    let set = json!({"keys": [{
        "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"
    }]});
    crate::devca::write_new(&key, &pair.serialize_pem(), true)?;
    crate::devca::write_new(&jwks, &format!("{set:#}\n"), false)?;
    Ok(vec![key, jwks])
}

/// What `rondo auth token` puts in a token.
#[derive(Debug, Clone)]
pub struct Mint {
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audience: String,
    /// `sub`.
    pub subject: String,
    /// Seconds from now to `exp`.
    pub ttl: u64,
    /// `NAME=VALUE` claims.
    pub claims: Vec<String>,
    /// The `kid` header.
    pub kid: Option<String>,
}

/// A token signed with the key in `key` (a PEM file `rondo auth dev-key` wrote).
pub fn token(key: &Path, m: &Mint) -> anyhow::Result<String> {
    let pem = std::fs::read_to_string(key)
        .with_context(|| format!("cannot read key {}", key.display()))?;
    let pair = KeyPair::from_pem(&pem)
        .with_context(|| format!("{} is not a PKCS#8 private key", key.display()))?;
    if pair.algorithm() != &PKCS_ED25519 {
        bail!("{} is not an Ed25519 key (rondo auth dev-key writes one)", key.display());
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut claims = Map::new();
    claims.insert("iss".into(), Value::from(m.issuer.clone()));
    claims.insert("aud".into(), Value::from(m.audience.clone()));
    claims.insert("sub".into(), Value::from(m.subject.clone()));
    claims.insert("iat".into(), Value::from(now));
    claims.insert("exp".into(), Value::from(now.saturating_add(m.ttl)));
    let mut id = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id)
        .map_err(|_| anyhow::anyhow!("no system randomness for the token id"))?;
    claims.insert(
        "jti".into(),
        Value::from(id.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    );
    for c in &m.claims {
        let Some((k, v)) = c.split_once('=') else {
            bail!("--claim {c:?} is not NAME=VALUE");
        };
        if k.is_empty() {
            bail!("--claim {c:?} has an empty name");
        }
        claims.insert(k.to_owned(), Value::from(v.to_owned()));
    }
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = m.kid.clone();
    let key = EncodingKey::from_ed_der(&pair.serialize_der());
    jsonwebtoken::encode(&header, &claims, &key).context("cannot sign the token")
}
