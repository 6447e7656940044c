//! Field names the router owns in request heads (`x-rondo-*`, `x-forwarded-*`,
//! `x-client-cert-*`) and how a name is compared with them: in any case, and with `_` for `-`,
//! since CGI-style servers (WSGI, Rack, PHP) read both as `_`. A client must never get a member
//! to read one of them as the router's own.

use http::header::{HeaderMap, HeaderName};

/// Field names the router sets or strips in heads (identity, forwarding, client certificates,
/// a login), compared with `_` as `-`: a trailer section must carry none of them, either way.
const RESERVED_PREFIXES: [&str; 3] = ["x-rondo-", "x-forwarded-", "x-client-cert-"];

/// Whether field name byte `a` stands for `b` (lower case): ASCII case folded, and `_` for `-`,
/// as CGI-style servers (WSGI, Rack, PHP) read both as `_`.
fn same_byte(a: u8, b: u8) -> bool {
    a.to_ascii_lowercase() == b || (a == b'_' && b == b'-')
}

/// Whether field name `name` begins with `prefix` (lower case), in any case and with `_` for
/// `-`.
pub fn name_starts_with(name: &[u8], prefix: &str) -> bool {
    name.len() >= prefix.len() && name.iter().zip(prefix.bytes()).all(|(&a, b)| same_byte(a, b))
}

/// Whether field name `name` is `other` (lower case), in any case and with `_` for `-`.
pub fn name_is(name: &[u8], other: &str) -> bool {
    name.len() == other.len() && name_starts_with(name, other)
}

/// Whether field name `name` is one the router owns (`x-rondo-*`, `x-forwarded-*`, `x-client-cert-*`).
pub fn is_reserved(name: &[u8]) -> bool {
    RESERVED_PREFIXES.iter().any(|p| name_starts_with(name, p))
}

/// Whether a request head's field `name` is an underscore spelling of one the router owns
/// (`X_Forwarded_For`, `x_rondo_subject`): dropped from every request, since a CGI-style member
/// would read it as the router's own.
pub fn is_reserved_alias(name: &[u8]) -> bool {
    name.contains(&b'_') && is_reserved(name)
}

/// Removes every field whose name `drop` picks: one pass over the names, and no allocation
/// when there is none (the common case).
pub fn remove_names(headers: &mut HeaderMap, drop: impl Fn(&[u8]) -> bool) {
    if !headers.keys().any(|n| drop(n.as_str().as_bytes())) {
        return;
    }
    let names: Vec<HeaderName> =
        headers.keys().filter(|n| drop(n.as_str().as_bytes())).cloned().collect();
    for n in names {
        headers.remove(&n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_compare_in_any_case_and_with_underscores() {
        assert!(name_is(b"X_Rondo_Subject", "x-rondo-subject"));
        assert!(!name_is(b"x-rondo-subjects", "x-rondo-subject"));
        assert!(name_starts_with(b"X-RONDO-CLAIM-role", "x-rondo-claim-"));
        // `-` never stands for `_`: the router's names are written with `-`.
        assert!(!name_is(b"x-rondo-subject", "x_rondo_subject"));
        assert!(is_reserved(b"X-Client-Cert-San") && !is_reserved(b"x-rondox"));
        assert!(is_reserved_alias(b"x_forwarded_for") && !is_reserved_alias(b"x-forwarded-for"));
    }
}
