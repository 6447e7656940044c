//! What a route matches ([`RouteMatch`]) and the request facts it is matched against,
//! including conditions the core holds but the data plane evaluates ([`Filter`]).

use std::fmt;
use std::sync::Arc;

/// A condition of a route's match that the core holds but does not evaluate itself: a regular
/// expression on the path or a header, a JSON or XML body path. Such conditions are compiled
/// outside the core (by `rondo-config`, once per view, so a bad pattern is a configuration
/// error) and evaluated by the data plane through this trait; the core stays free of the
/// regular-expression and parser crates.
pub trait Filter: fmt::Debug + Send + Sync {
    /// The condition as written (`path_regex = "^/a"`); views compare filters by it.
    fn describe(&self) -> &str;
    /// Whether the request's head satisfies the condition (a body filter: always).
    fn matches_head(&self, req: &RequestFacts<'_>) -> bool;
    /// Whether the condition reads the request's body.
    fn reads_body(&self) -> bool {
        false
    }
    /// Whether `body` satisfies the condition (only asked of filters that read the body).
    fn matches_body(&self, body: &BodyPeek<'_>) -> bool {
        let _ = body;
        true
    }
}

/// A shared [`Filter`], compared by what it says ([`Filter::describe`]).
#[derive(Debug, Clone)]
pub struct FilterRef(pub Arc<dyn Filter>);

impl PartialEq for FilterRef {
    fn eq(&self, other: &Self) -> bool {
        self.0.describe() == other.0.describe()
    }
}

impl Eq for FilterRef {}

/// The first bytes of a request body, as body filters see them.
#[derive(Debug, Clone, Copy)]
pub struct BodyPeek<'a> {
    /// The bytes read (at most the route's `max_peek_bytes`).
    pub bytes: &'a [u8],
    /// Whether `bytes` is the whole body.
    pub complete: bool,
}

/// What a route matches; every present condition must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteMatch {
    /// `Host` without port, compared case-insensitively; a leading `*.` matches any subdomain.
    pub host: Option<String>,
    /// Path prefix, compared on the raw path.
    pub path_prefix: Option<String>,
    /// The whole path (without the query), compared exactly.
    pub path: Option<String>,
    /// Method, upper case.
    pub methods: Vec<String>,
    /// Header name (lower case) and exact value.
    pub headers: Vec<(String, String)>,
    /// Header names (lower case) that must be present (any value).
    pub headers_present: Vec<String>,
    /// Header names (lower case) that must be absent.
    pub headers_absent: Vec<String>,
    /// Query parameters (name, value), both percent-decoded (`+` is a space): some parameter
    /// of the name must have exactly the value.
    pub query: Vec<(String, String)>,
    /// Conditions evaluated outside the core (regular expressions, body paths).
    pub filters: Vec<FilterRef>,
    /// The most body bytes a body filter reads (0: no filter reads the body).
    pub max_peek_bytes: u64,
    /// `tcp` listeners only: the TLS server name (SNI) the client's ClientHello asks for,
    /// lower case; a leading `*.` matches one more label. A client that sends no SNI matches
    /// only routes without one.
    pub sni: Option<String>,
}

impl RouteMatch {
    /// Whether a connection whose ClientHello named `sni` (if any) satisfies `sni`.
    pub fn matches_sni(&self, sni: Option<&str>) -> bool {
        let Some(want) = &self.sni else { return true };
        let Some(host) = sni else { return false };
        let host = host.trim_end_matches('.');
        match want.strip_prefix("*.") {
            Some(suffix) => host.split_once('.').is_some_and(|(first, rest)| {
                !first.is_empty() && rest.eq_ignore_ascii_case(suffix)
            }),
            None => host.eq_ignore_ascii_case(want),
        }
    }
}

/// Facts about a request that routes match on.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// Host without port.
    pub host: Option<&'a str>,
    /// The path, normalized ([`crate::path::normalize`]).
    pub path: &'a str,
    /// The query, without its `?` (`None`: the target has none).
    pub query: Option<&'a str>,
    /// Method.
    pub method: &'a str,
    /// Header lookup by lower-case name (the first value, when it is visible ASCII).
    pub header: &'a dyn Fn(&str) -> Option<&'a str>,
    /// Whether a header of the lower-case name is present (whatever its value).
    pub present: &'a dyn Fn(&str) -> bool,
    /// The body's first bytes, once read (routes with body filters need them).
    pub body: Option<BodyPeek<'a>>,
}

impl fmt::Debug for RequestFacts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestFacts")
            .field("host", &self.host)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl RouteMatch {
    /// Whether the request satisfies every condition; a route with a body filter matches only
    /// once the body's first bytes are among the facts.
    pub fn matches(&self, req: &RequestFacts<'_>) -> bool {
        self.matches_head(req)
            && (!self.reads_body() || req.body.is_some_and(|b| self.body_matches(&b)))
    }

    /// Whether any condition reads the body.
    pub fn reads_body(&self) -> bool {
        self.max_peek_bytes > 0
    }

    /// Whether the body conditions hold for `body` (read up to at least this route's
    /// `max_peek_bytes`, or complete): each body filter sees at most `max_peek_bytes` of it.
    pub fn body_matches(&self, body: &BodyPeek<'_>) -> bool {
        let limit = usize::try_from(self.max_peek_bytes).unwrap_or(usize::MAX);
        let seen = if body.bytes.len() > limit {
            BodyPeek { bytes: &body.bytes[..limit], complete: false }
        } else {
            *body
        };
        self.filters.iter().filter(|f| f.0.reads_body()).all(|f| f.0.matches_body(&seen))
    }

    /// Whether the request's head satisfies every condition that does not read the body.
    pub fn matches_head(&self, req: &RequestFacts<'_>) -> bool {
        if let Some(want) = &self.host {
            let Some(host) = req.host else { return false };
            // `orders.example.` is `orders.example` (the root's empty label).
            let host = host.strip_suffix('.').unwrap_or(host);
            let ok = match want.strip_prefix("*.") {
                Some(suffix) => {
                    host.len() > suffix.len() + 1
                        && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
                }
                None => host.eq_ignore_ascii_case(want),
            };
            if !ok {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix
            && !req.path.starts_with(prefix.as_str())
        {
            return false;
        }
        if let Some(path) = &self.path
            && req.path != path
        {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == req.method) {
            return false;
        }
        if !self.headers.iter().all(|(name, value)| (req.header)(name) == Some(value.as_str())) {
            return false;
        }
        if !self.headers_present.iter().all(|name| (req.present)(name))
            || self.headers_absent.iter().any(|name| (req.present)(name))
        {
            return false;
        }
        if !self.query.iter().all(|(name, value)| query_has(req.query, name, value)) {
            return false;
        }
        self.filters.iter().all(|f| f.0.matches_head(req))
    }
}

/// Whether `query` (`a=1&b=2`, without the `?`) has a parameter `name` whose value is `value`,
/// both compared percent-decoded with `+` as a space (as HTML forms send them). A parameter
/// without `=` has the empty value.
pub fn query_has(query: Option<&str>, name: &str, value: &str) -> bool {
    let Some(query) = query else { return false };
    query.split('&').filter(|p| !p.is_empty()).any(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        decoded_eq(k, name) && decoded_eq(v, value)
    })
}

/// Whether the query component `raw` decodes to `want`.
fn decoded_eq(raw: &str, want: &str) -> bool {
    let (raw, want) = (raw.as_bytes(), want.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < raw.len() {
        let b = match raw[i] {
            b'+' => b' ',
            b'%' => {
                let digit = |k: usize| raw.get(k).copied().and_then(crate::path::hex_digit);
                match (digit(i + 1), digit(i + 2)) {
                    (Some(h), Some(l)) => {
                        i += 2;
                        h << 4 | l
                    }
                    _ => b'%',
                }
            }
            b => b,
        };
        if want.get(j) != Some(&b) {
            return false;
        }
        i += 1;
        j += 1;
    }
    j == want.len()
}
