//! Shared secrets: bearer tokens read from the configuration (the admin API's and the naming
//! service's) and a comparison whose time does not depend on the secret.

use rondo_config::AdminToken;

/// The token bytes from a token setting (`token` inline, or `token_file`'s content without its
/// trailing newline); the error names the file or says the token is empty.
pub fn read_token(token: &AdminToken) -> std::io::Result<Vec<u8>> {
    let bytes = match token {
        AdminToken::Inline(t) => t.as_bytes().to_vec(),
        AdminToken::File(path) => {
            let mut b = std::fs::read(path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot read token file {}: {e}", path.display()),
                )
            })?;
            while matches!(b.last(), Some(b'\n' | b'\r')) {
                b.pop();
            }
            b
        }
    };
    if bytes.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the token is empty"));
    }
    Ok(bytes)
}

/// The key every router of a tier shares (`[router] tier_key`): it signs what one router hands
/// a client and another must trust (sticky session cookies). HMAC-SHA256.
pub struct TierKey(ring::hmac::Key);

impl std::fmt::Debug for TierKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TierKey(..)")
    }
}

impl TierKey {
    /// The key from its bytes.
    pub fn new(bytes: &[u8]) -> TierKey {
        TierKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes))
    }

    /// The MAC of `msg`.
    pub fn sign(&self, msg: &[u8]) -> ring::hmac::Tag {
        ring::hmac::sign(&self.0, msg)
    }

    /// Whether `tag` is a prefix of at least 16 bytes of `msg`'s MAC (constant time).
    pub fn verify_prefix(&self, msg: &[u8], tag: &[u8]) -> bool {
        let full = self.sign(msg);
        let full = full.as_ref();
        tag.len() >= 16 && tag.len() <= full.len() && constant_time_eq(&full[..tag.len()], tag)
    }
}

/// Whether `a` equals `b`, in time that does not depend on where they differ nor on their
/// lengths: both are hashed to SHA-256 digests of equal size first, and the digests are
/// compared byte by byte with the differences OR-ed together and read once at the end.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (da, db) = (
        ring::digest::digest(&ring::digest::SHA256, a),
        ring::digest::digest(&ring::digest::SHA256, b),
    );
    let diff = da.as_ref().iter().zip(db.as_ref()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether `Authorization: Bearer <token>` in `authorization` (the header's bytes) carries
/// `token`; the scheme name is case-insensitive (RFC 9110 section 11.1).
pub fn bearer_matches(authorization: Option<&[u8]>, token: &[u8]) -> bool {
    let given = authorization
        .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        .map(|v| &v[7..])
        .unwrap_or_default();
    !given.is_empty() && constant_time_eq(given, token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_tokens() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn bearer_needs_the_scheme_and_the_token() {
        assert!(bearer_matches(Some(b"Bearer s3"), b"s3"));
        assert!(bearer_matches(Some(b"bearer s3"), b"s3"));
        assert!(bearer_matches(Some(b"BEARER s3"), b"s3"));
        assert!(!bearer_matches(Some(b"Basic s3"), b"s3"));
        assert!(!bearer_matches(Some(b"Bearer "), b"s3"));
        assert!(!bearer_matches(Some(b"s3"), b"s3"));
        assert!(!bearer_matches(None, b"s3"));
    }
}
