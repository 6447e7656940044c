//! A route's `match`: host and path, methods, headers, query, the conditions compiled into
//! filters (regexes, body fields) with how much body they may peek at, and the TLS server name.

use super::*;
use crate::raw::{OneOrMany, RawBodyXml};

pub(super) fn compile_match(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    m: Option<&RawMatch>,
) -> RouteMatch {
    let Some(m) = m else {
        return RouteMatch::default();
    };
    check_host_and_paths(c, path, m);
    let methods = compile_methods(c, path, m.method.as_ref());
    let headers = compile_headers(c, path, m.headers.as_ref());
    let headers_present = header_names(c, path, "headers_present", m.headers_present.as_ref());
    let headers_absent = header_names(c, path, "headers_absent", m.headers_absent.as_ref());
    for (j, name) in headers_absent.iter().enumerate() {
        if headers_present.contains(name) || headers.iter().any(|(n, _)| n == name) {
            c.err(
                path.key("headers_absent").index(j),
                format!("header `{name}` cannot be both required and absent: the route would never match"),
            );
        }
    }
    let mut filters: Vec<FilterRef> = Vec::new();
    compile_regexes(c, path, m, &mut filters);
    let query = compile_query(c, path, m.query.as_ref());
    let reads_body = compile_body_filters(c, path, m, &mut filters);
    let max_peek_bytes = max_peek_bytes(c, path, m.max_peek_bytes, reads_body);
    let sni = m.sni.as_ref().map(|n| compile_sni(c, path, n));
    RouteMatch {
        host: m.host.clone(),
        path_prefix: m.path_prefix.clone(),
        path: m.path.clone(),
        methods,
        headers,
        headers_present,
        headers_absent,
        query,
        filters,
        max_peek_bytes,
        sni,
    }
}

/// `host` a name or `*.` wildcard without a port; `path_prefix` and `path` start with `/`.
fn check_host_and_paths(c: &mut Compiler<'_>, path: &FieldPath, m: &RawMatch) {
    if let Some(h) = &m.host {
        let bare = h.strip_prefix("*.").unwrap_or(h);
        if bare.is_empty() || bare.contains('*') {
            c.err(path.key("host"), format!("`{h}` is not a host name or `*.` wildcard"));
        } else if bare.contains(':') && !bare.starts_with('[') {
            c.err(path.key("host"), format!("`{h}` must not include a port"));
        }
    }
    if let Some(p) = &m.path_prefix
        && !p.starts_with('/')
    {
        c.err(path.key("path_prefix"), format!("`{p}` must start with `/`"));
    }
    if let Some(p) = &m.path
        && (!p.starts_with('/') || p.contains('?'))
    {
        c.err(path.key("path"), format!("`{p}` must start with `/` and hold no query"));
    }
}

/// `method`: HTTP method tokens, upper-cased, each once.
fn compile_methods(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    list: Option<&OneOrMany>,
) -> Vec<String> {
    let mut methods: Vec<String> = Vec::new();
    let Some(list) = list else {
        return methods;
    };
    if list.0.is_empty() {
        c.err(path.key("method"), "must list at least one method (omit it to match every method)");
    }
    for (j, meth) in list.0.iter().enumerate() {
        if !is_token(meth) {
            let p =
                if list.0.len() == 1 { path.key("method") } else { path.key("method").index(j) };
            c.err(p, format!("`{meth}` is not an HTTP method"));
        }
        let up = meth.to_ascii_uppercase();
        if !methods.contains(&up) {
            methods.push(up);
        }
    }
    methods
}

/// `headers`: lower-cased names, each once, with the values they must have.
fn compile_headers(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    table: Option<&BTreeMap<String, String>>,
) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in table.into_iter().flatten() {
        let p = path.key("headers").key(name);
        let lower = name.to_ascii_lowercase();
        if !is_token(name) {
            c.err(p, format!("`{name}` is not a header name"));
        } else if headers.iter().any(|(n, _)| *n == lower) {
            c.err(p, format!("header `{lower}` is listed twice (names are case-insensitive)"));
        }
        headers.push((lower, value.clone()));
    }
    headers
}

/// `headers_present` or `headers_absent` (`key`): lower-cased header names, each once.
fn header_names(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    key: &str,
    list: Option<&Vec<String>>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (j, name) in list.into_iter().flatten().enumerate() {
        let lower = name.to_ascii_lowercase();
        if !is_token(name) {
            c.err(path.key(key).index(j), format!("`{name}` is not a header name"));
        } else if out.contains(&lower) {
            c.err(path.key(key).index(j), format!("header `{lower}` is listed twice"));
        } else {
            out.push(lower);
        }
    }
    out
}

/// `headers_regex` and `path_regex`, compiled into filters.
fn compile_regexes(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    m: &RawMatch,
    filters: &mut Vec<FilterRef>,
) {
    for (name, pattern) in m.headers_regex.iter().flatten() {
        let p = path.key("headers_regex").key(name);
        if !is_token(name) {
            c.err(p, format!("`{name}` is not a header name"));
            continue;
        }
        match crate::filter::HeaderRegex::new(name, pattern) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err(e) => c.err(p, e),
        }
    }
    if let Some(pattern) = &m.path_regex {
        match crate::filter::PathRegex::new(pattern) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err(e) => c.err(path.key("path_regex"), e),
        }
    }
}

/// `query`: parameter names and the values they must have.
fn compile_query(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    table: Option<&BTreeMap<String, String>>,
) -> Vec<(String, String)> {
    let mut query = Vec::new();
    for (name, value) in table.into_iter().flatten() {
        if name.is_empty() {
            c.err(path.key("query"), "query parameter names must not be empty");
        }
        query.push((name.clone(), value.clone()));
    }
    query
}

/// `body_json` and `body_xml`, compiled into filters; whether either reads the body.
fn compile_body_filters(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    m: &RawMatch,
    filters: &mut Vec<FilterRef>,
) -> bool {
    if let Some(fields) = &m.body_json {
        if fields.is_empty() {
            c.err(path.key("body_json"), "must name at least one field (`\"$.a.b\" = \"value\"`)");
        }
        match crate::filter::BodyJson::new(fields.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            Ok(f) => filters.push(FilterRef(Arc::new(f))),
            Err((field, e)) => c.err(path.key("body_json").key(&field), e),
        }
    }
    if let Some(x) = &m.body_xml {
        compile_body_xml(c, &path.key("body_xml"), x, filters);
    }
    m.body_json.is_some() || m.body_xml.is_some()
}

/// `body_xml` at `p`: its namespace prefixes and its element path.
fn compile_body_xml(
    c: &mut Compiler<'_>,
    p: &FieldPath,
    x: &RawBodyXml,
    filters: &mut Vec<FilterRef>,
) {
    let mut ns = Vec::new();
    for (prefix, uri) in x.ns.iter().flatten() {
        if prefix.is_empty() || prefix.contains(':') || uri.is_empty() {
            c.err(p.key("ns").key(prefix), "a prefix and a namespace URI, both non-empty");
        }
        ns.push((prefix.clone(), uri.clone()));
    }
    match crate::filter::BodyXml::new(&x.path, &ns, x.equals.as_deref()) {
        Ok(f) => filters.push(FilterRef(Arc::new(f))),
        Err(e) => c.err(p.key("path"), e),
    }
}

/// `max_peek_bytes`: only with a body filter, which gets the default without it.
fn max_peek_bytes(c: &mut Compiler<'_>, path: &FieldPath, v: Option<u64>, reads_body: bool) -> u64 {
    match v {
        Some(_) if !reads_body => {
            c.err(
                path.key("max_peek_bytes"),
                "only body filters read the body: set `body_json` or `body_xml`, or drop it",
            );
            0
        }
        v if reads_body => {
            c.int(path.key("max_peek_bytes"), v, DEFAULT_MAX_PEEK_BYTES, 1, MAX_PEEK_BYTES)
        }
        _ => 0,
    }
}

/// `sni`: a DNS name or `*.` wildcard, lower-cased.
fn compile_sni(c: &mut Compiler<'_>, path: &FieldPath, n: &str) -> String {
    let bare = n.strip_prefix("*.").unwrap_or(n);
    let ok = !bare.is_empty()
        && bare.split('.').all(|l| {
            !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !ok {
        c.err(path.key("sni"), format!("`{n}` is not a DNS name or `*.` wildcard"));
    }
    n.to_ascii_lowercase()
}

/// The conditions of `m` that need an HTTP request (which a `tcp` listener has not), by name.
pub(super) fn http_conditions(m: &RawMatch) -> Vec<&'static str> {
    [
        (m.host.is_some(), "host"),
        (m.path_prefix.is_some(), "path_prefix"),
        (m.path.is_some(), "path"),
        (m.method.is_some(), "method"),
        (m.headers.is_some(), "headers"),
        (m.headers_present.is_some(), "headers_present"),
        (m.headers_absent.is_some(), "headers_absent"),
        (m.headers_regex.is_some(), "headers_regex"),
        (m.path_regex.is_some(), "path_regex"),
        (m.query.is_some(), "query"),
        (m.body_json.is_some(), "body_json"),
        (m.body_xml.is_some(), "body_xml"),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect()
}
