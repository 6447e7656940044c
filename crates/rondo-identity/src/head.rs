//! A request's header fields as the request stages read them, whichever path parsed the
//! request: hyper's `HeaderMap`, or the spans of the router's own HTTP/1 parser (rondo-proxy's
//! `h1`). Routing, loop detection, sign-on, sticky sessions and hash keys are written once
//! against this, and so are the cookies read from it ([`cookie`], [`cookies`]).

use http::HeaderMap;

/// Header fields, looked up by lower-case name.
pub trait Headers {
    /// The values of field `name` (lower case), in order.
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a;

    /// The first value of `name`.
    fn get(&self, name: &str) -> Option<&[u8]>;

    /// The first value of `name` when it is visible ASCII (as `HeaderValue::to_str` has it).
    fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(visible_ascii)
    }
}

/// `v` as text when every byte is visible ASCII, space or tab.
pub fn visible_ascii(v: &[u8]) -> Option<&str> {
    if v.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

impl Headers for HeaderMap {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.get_all(name).into_iter().map(|v| v.as_bytes())
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        HeaderMap::get(self, name).map(|v| v.as_bytes())
    }
}

/// A cookie's value from the request (the first, when it has several).
pub fn cookie<'a>(headers: &'a impl Headers, name: &str) -> Option<&'a str> {
    cookies(headers, name).next()
}

/// Every value of cookie `name` in the request's `Cookie` fields, in order (a browser sends one
/// per path and domain it was set for).
pub fn cookies<'a>(headers: &'a impl Headers, name: &str) -> impl Iterator<Item = &'a str> {
    headers.values("cookie").filter_map(visible_ascii).flat_map(|v| v.split(';')).filter_map(
        move |kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then_some(v.trim_matches('"'))
        },
    )
}
