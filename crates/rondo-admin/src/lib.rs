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

/// Whether `a` equals `b`, in time that depends only on their lengths (every byte is compared,
/// differences are OR-ed together, and the result is read once at the end).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
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
