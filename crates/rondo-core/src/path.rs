//! A request path as routes see it (RFC 3986 section 6.2.2): percent-escapes of unreserved
//! characters decoded, runs of `/` merged into one, and dot segments removed (section 5.2.4).
//! Routes match the normalized path and members get it, so the router and a member can never
//! read one request as two different paths (`/%6Frders`, `//orders`, `/x/../orders` are all
//! `/orders`, and so match the route for `/orders`, with its `auth`). Escapes of reserved
//! characters (`%2F`, `%3F`, ...) stay as they are: decoding them would change the path's
//! meaning.

/// The normalized form of `path` (an origin-form path, without its query), or `None` when it
/// is normal already (the usual case, found in one pass without an allocation).
pub fn normalize(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let needs = b.contains(&b'%') || b.windows(2).any(|w| w == b"//") || has_dot_segment(b);
    if !needs {
        return None;
    }
    // Unreserved escapes decoded (`%41` is `A`); other escapes and bytes kept.
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex_digit(b[i + 1]), hex_digit(b[i + 2]))
        {
            let c = h << 4 | l;
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                decoded.push(c);
            } else {
                decoded.extend_from_slice(&b[i..i + 3]);
            }
            i += 3;
            continue;
        }
        // Runs of `/` become one.
        if b[i] == b'/' && decoded.last() == Some(&b'/') {
            i += 1;
            continue;
        }
        decoded.push(b[i]);
        i += 1;
    }
    // A decoded unreserved character is ASCII and every other byte is as it came: still UTF-8
    // when the path was.
    let decoded = String::from_utf8(decoded).ok()?;
    let absolute = decoded.starts_with('/');
    let segments: Vec<&str> = decoded.split('/').skip(usize::from(absolute)).collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    let mut trailing = false;
    for (k, s) in segments.iter().enumerate() {
        let last = k + 1 == segments.len();
        match *s {
            "." => trailing = last,
            ".." => {
                out.pop();
                trailing = last;
            }
            _ => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut normal = String::with_capacity(decoded.len());
    if absolute {
        normal.push('/');
    }
    normal.push_str(&out.join("/"));
    if trailing && !out.is_empty() {
        normal.push('/');
    }
    (normal != path).then_some(normal)
}

/// The value of one hex digit of a percent-escape (either case); also the query matcher's
/// (`model::matching`).
pub(crate) fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether a segment of `b` is `.` or `..`.
fn has_dot_segment(b: &[u8]) -> bool {
    b.split(|&c| c == b'/').any(|s| s == b"." || s == b"..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> String {
        normalize(p).unwrap_or_else(|| p.to_owned())
    }

    #[test]
    fn normal_paths_are_left_alone_without_a_copy() {
        for p in ["/", "/orders", "/orders/1", "/a/b/", "/a.b/c..d/.e", "/%2F", "/a%3Fb"] {
            if p.contains('%') {
                assert_eq!(n(p), p);
            } else {
                assert_eq!(normalize(p), None, "{p}");
            }
        }
    }

    #[test]
    fn spellings_of_one_path_become_that_path() {
        for (raw, normal) in [
            ("/%6Frders/1", "/orders/1"),
            ("/%6frders/1", "/orders/1"),
            ("//orders/1", "/orders/1"),
            ("/orders//1", "/orders/1"),
            ("/x/../orders/1", "/orders/1"),
            ("/./orders", "/orders"),
            ("/orders/.", "/orders/"),
            ("/orders/1/..", "/orders/"),
            ("/..", "/"),
            ("/../../orders", "/orders"),
            ("/%2E%2E/orders", "/orders"),
            ("/%2e/orders", "/orders"),
            ("/a/%7Euser", "/a/~user"),
            // Reserved escapes keep their meaning.
            ("/a%2Fb/../c", "/c"),
            ("/a/%2F/..", "/a/"),
            ("/a%", "/a%"),
            ("/a%4", "/a%4"),
            ("/a%zz", "/a%zz"),
        ] {
            assert_eq!(n(raw), normal, "{raw}");
            // Normal forms are fixed points.
            assert_eq!(normalize(normal), None, "{normal} is not a fixed point");
        }
    }
}
