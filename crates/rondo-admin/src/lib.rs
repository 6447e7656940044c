//! rondo's admin HTTP API (`[admin]`) and the client side of `rondo ctl` ([`client`]).
//!
//! Every call needs `Authorization: Bearer <token>` (compared in constant time); with no token
//! configured every call is refused with 403. GETs never change anything; mutations are POST and
//! PUT, JSON in and out. The dashboard page (`GET /`, `dashboard.rs`) is the one thing served
//! without the token: it holds no data and asks for the token itself. See `docs/admin.md`.

pub mod client;
mod dashboard;
mod metrics;
mod server;

pub use server::{AdminServer, router, start};

/// The token bytes from an `[admin]` token setting: inline, or a file's content without its
/// trailing newline.
pub fn read_token(token: &rondo_config::AdminToken) -> std::io::Result<Vec<u8>> {
    let bytes = match token {
        rondo_config::AdminToken::Inline(t) => t.as_bytes().to_vec(),
        rondo_config::AdminToken::File(path) => {
            let mut b = std::fs::read(path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot read admin token file {}: {e}", path.display()),
                )
            })?;
            while matches!(b.last(), Some(b'\n' | b'\r')) {
                b.pop();
            }
            b
        }
    };
    if bytes.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the admin token is empty",
        ));
    }
    Ok(bytes)
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

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_tokens() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
