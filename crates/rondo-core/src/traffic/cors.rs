//! `cors`: which origins, methods and headers a route lets browsers use across origins, and
//! the pure decisions over them (does an origin match, is a preflight allowed). The router's
//! chain turns them into a preflight's answer and a response's fields.

/// `cors`: cross-origin resource sharing (the Fetch standard's CORS protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// Origins (`scheme://host[:port]`, lower case), `scheme://*.suffix` wildcards, or `*`.
    pub allow_origins: Vec<String>,
    /// Methods a preflight may ask for (tokens, as written: methods are case-sensitive).
    pub allow_methods: Vec<String>,
    /// Request header names (lower case) a preflight may ask for.
    pub allow_headers: Vec<String>,
    /// Response header names (lower case) scripts may read.
    pub expose_headers: Vec<String>,
    /// Whether credentials (cookies, `Authorization`) may go along.
    pub allow_credentials: bool,
    /// How long a browser may keep a preflight's answer; `None`: no `Access-Control-Max-Age`.
    pub max_age_s: Option<u64>,
}

impl Cors {
    /// The methods allowed when `allow_methods` is not given (the CORS-safelisted ones).
    pub const DEFAULT_METHODS: [&'static str; 3] = ["GET", "HEAD", "POST"];

    /// Whether `origin` (an `Origin` field's value) is one of the allowed origins.
    pub fn allows_origin(&self, origin: &str) -> bool {
        self.allow_origins.iter().any(|p| origin_matches(p, origin))
    }

    /// Whether every origin is allowed (`*`), so that answers need no `Vary: Origin`.
    pub fn any_origin(&self) -> bool {
        self.allow_origins.iter().any(|p| p == "*")
    }

    /// Whether a preflight from an allowed origin for `method` with the request header names
    /// `headers` (an `Access-Control-Request-Headers` value) is allowed.
    pub fn allows_preflight(&self, method: &str, headers: &str) -> bool {
        self.allow_methods.iter().any(|m| m == method)
            && headers
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .all(|h| self.allow_headers.iter().any(|a| a.eq_ignore_ascii_case(h)))
    }
}

/// Whether `origin` matches `pattern`: equal (ASCII case aside), `*`, or for
/// `scheme://*.suffix` the same scheme and a host of one or more labels before `.suffix`.
pub fn origin_matches(pattern: &str, origin: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let Some((scheme, rest)) = pattern.split_once("://*.") else {
        return pattern.eq_ignore_ascii_case(origin);
    };
    let Some((o_scheme, o_rest)) = origin.split_once("://") else { return false };
    if !o_scheme.eq_ignore_ascii_case(scheme) || o_rest.len() <= rest.len() + 1 {
        return false;
    }
    let (labels, suffix) = o_rest.split_at(o_rest.len() - rest.len());
    let Some(labels) = labels.strip_suffix('.') else { return false };
    suffix.eq_ignore_ascii_case(rest) && labels.split('.').all(is_label)
}

/// A DNS label: letters, digits and hyphens.
fn is_label(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Checks an `allow_origins` entry: `*`, or `scheme://host[:port]` where the host may start
/// with `*.` (one or more labels). Nothing else: no path, no trailing `/`, no user.
pub fn check_origin(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    let bad = || format!("`{pattern}` is not an origin, `scheme://host[:port]` (no path)");
    let (scheme, authority) = pattern.split_once("://").ok_or_else(bad)?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if !scheme_ok {
        return Err(bad());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (authority, None),
    };
    if let Some(p) = port
        && !p.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(bad());
    }
    let (wild, host) = match host.strip_prefix("*.") {
        Some(h) => (true, h),
        None => (false, host),
    };
    let ipv6 = !wild
        && host.starts_with('[')
        && host.len() >= 2
        && host.ends_with(']')
        && host[1..host.len() - 1].parse::<core::net::Ipv6Addr>().is_ok();
    if !(ipv6 || host.split('.').all(is_label)) {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_exactly_or_by_suffix_with_one_or_more_labels() {
        let p = "https://*.example.org";
        assert!(origin_matches(p, "https://a.example.org"));
        assert!(origin_matches(p, "https://a.b.example.org"));
        assert!(origin_matches(p, "HTTPS://A.Example.org"));
        assert!(!origin_matches(p, "https://example.org"), "no label");
        assert!(!origin_matches(p, "https://.example.org"), "an empty label");
        assert!(!origin_matches(p, "http://a.example.org"), "another scheme");
        assert!(!origin_matches(p, "https://aexample.org"), "not a label boundary");
        assert!(!origin_matches(p, "https://a.example.org:8443"), "another port");
        assert!(!origin_matches(p, "https://a.example.org.evil.com"));
        assert!(!origin_matches(p, "https://evil.com/.example.org"));
        assert!(origin_matches("https://*.example.org:8443", "https://x.example.org:8443"));
        assert!(origin_matches("https://app.example.com", "https://app.example.com"));
        assert!(!origin_matches("https://app.example.com", "https://app.example.com:444"));
        assert!(origin_matches("*", "null"));
    }

    #[test]
    fn origin_patterns_are_scheme_host_and_port_only() {
        for ok in
            ["*", "https://a.com", "http://localhost:8080", "https://*.a.org", "http://[::1]:80"]
        {
            assert_eq!(check_origin(ok), Ok(()), "{ok}");
        }
        for bad in [
            "a.com",
            "https://a.com/",
            "https://a.com/x",
            "https://a.com:0",
            "https://a.com:99999",
            "https://",
            "https://a..com",
            "https://*",
            "https://a.*.com",
            "https://u@a.com",
            "null",
            "1http://a.com",
        ] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_preflight_needs_an_allowed_method_and_allowed_headers() {
        let cors = Cors {
            allow_origins: vec!["*".into()],
            allow_methods: vec!["GET".into(), "POST".into()],
            allow_headers: vec!["content-type".into()],
            expose_headers: vec![],
            allow_credentials: false,
            max_age_s: None,
        };
        assert!(cors.allows_preflight("POST", ""));
        assert!(cors.allows_preflight("POST", "Content-Type"));
        assert!(!cors.allows_preflight("PUT", ""));
        assert!(!cors.allows_preflight("post", ""), "methods are case-sensitive");
        assert!(!cors.allows_preflight("POST", "content-type, x-secret"));
    }
}
