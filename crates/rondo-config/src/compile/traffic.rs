//! `filters` of a route or a listener: each inline table names exactly one filter, whose options
//! are checked here (header names and values, variables, regular expressions, statuses) and
//! compiled into the core's [`TrafficFilter`]s.

use std::collections::BTreeMap;
use std::sync::Arc;

use rondo_core::traffic::{
    FieldEdits, GrpcWeb, HeaderEdits, Redirect, RedirectToMember, RequestId, Respond, Rewrite,
    Soap, SoapVersion, Template, TrafficFilter,
};

use super::{Compiler, is_token};
use crate::path::FieldPath;
use crate::raw::{RawFieldEdits, RawFilter, RawRedirect, RawRespond, RawRewrite, RawSoap};

/// Compiles a `filters` list.
pub(super) fn compile_filters(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    raw: Option<&[RawFilter]>,
) -> Vec<TrafficFilter> {
    let mut out = Vec::new();
    for (i, f) in raw.unwrap_or_default().iter().enumerate() {
        let p = path.index(i);
        let named = [
            f.request_id.is_some(),
            f.headers.is_some(),
            f.rewrite.is_some(),
            f.redirect.is_some(),
            f.respond.is_some(),
            f.soap.is_some(),
            f.rate_limit.is_some(),
            f.fault.is_some(),
            f.mirror.is_some(),
            f.cors.is_some(),
            f.compress.is_some(),
            f.grpc_web.is_some(),
            f.redirect_to_member.is_some(),
        ];
        if named.iter().filter(|n| **n).count() != 1 {
            c.err(
                p,
                "each filter is an inline table with exactly one key, the filter's name: \
                 request_id, headers, rewrite, redirect, respond, soap, rate_limit, fault, \
                 mirror, cors, compress, grpc_web or redirect_to_member",
            );
            continue;
        }
        let filter = if let Some(r) = &f.request_id {
            let header = r.header.as_deref().unwrap_or(RequestId::DEFAULT_HEADER);
            let header = header_name(c, p.key("request_id").key("header"), header);
            Some(TrafficFilter::RequestId(RequestId { header, trace: r.trace.unwrap_or(true) }))
        } else if let Some(h) = &f.headers {
            let p = p.key("headers");
            let request = field_edits(c, &p.key("request"), h.request.as_ref(), false);
            let response = field_edits(c, &p.key("response"), h.response.as_ref(), true);
            Some(TrafficFilter::Headers(HeaderEdits { request, response }))
        } else if let Some(r) = &f.rewrite {
            rewrite(c, &p.key("rewrite"), r).map(TrafficFilter::Rewrite)
        } else if let Some(r) = &f.redirect {
            redirect(c, &p.key("redirect"), r).map(TrafficFilter::Redirect)
        } else if let Some(s) = &f.soap {
            soap(c, &p.key("soap"), s).map(TrafficFilter::Soap)
        } else if let Some(r) = &f.rate_limit {
            super::rate_limit::rate_limit(c, &p.key("rate_limit"), r).map(TrafficFilter::RateLimit)
        } else if let Some(r) = &f.respond {
            respond(c, &p.key("respond"), r)
        } else if let Some(r) = &f.fault {
            super::sampling::fault(c, &p.key("fault"), r, header_name).map(TrafficFilter::Fault)
        } else if let Some(r) = &f.cors {
            super::traffic_edge::cors(c, &p.key("cors"), r).map(TrafficFilter::Cors)
        } else if let Some(r) = &f.compress {
            super::traffic_edge::compress(c, &p.key("compress"), r).map(TrafficFilter::Compress)
        } else if let Some(r) = &f.redirect_to_member {
            let p = p.key("redirect_to_member");
            let status = c.int(p.key("status"), r.status, 307, 0, u64::from(u16::MAX)) as u16;
            if !RedirectToMember::STATUSES.contains(&status) {
                c.err(
                    p.key("status"),
                    format!("a redirect to a member is 302, 303, 307 or 308, got {status}"),
                );
            }
            let keep_query = r.keep_query.unwrap_or(true);
            Some(TrafficFilter::RedirectToMember(RedirectToMember { status, keep_query }))
        } else if let Some(g) = &f.grpc_web {
            let path = p.key("grpc_web").key("max_body_bytes");
            let max = c.int(path, g.max_body_bytes, GrpcWeb::DEFAULT_MAX_BODY, 1, 1 << 30);
            Some(TrafficFilter::GrpcWeb(GrpcWeb { max_body_bytes: max }))
        } else {
            f.mirror
                .as_ref()
                .map(|m| TrafficFilter::Mirror(super::sampling::mirror(c, &p.key("mirror"), m)))
        };
        out.extend(filter);
    }
    out
}

/// A header name, lower case; refused when it is not a token or is one the router owns
/// (hop-by-hop and framing fields: editing them would break the exchange).
fn header_name(c: &mut Compiler<'_>, path: FieldPath, name: &str) -> String {
    const OWNED: [&str; 9] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "upgrade",
        "content-length",
        "trailer",
        "host",
    ];
    let lower = name.to_ascii_lowercase();
    if !is_token(name) {
        c.err(path, format!("`{name}` is not a valid header name"));
    } else if OWNED.contains(&lower.as_str()) {
        c.err(
            path,
            format!(
                "`{name}` frames or routes the exchange and is the router's to write \
                 (a host is changed with `rewrite = {{ host = ... }}`)"
            ),
        );
    }
    lower
}

/// A header value: visible ASCII, spaces and tabs (no line breaks, which would split a field).
fn header_value(c: &mut Compiler<'_>, path: FieldPath, value: &str) -> bool {
    let ok = value.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
    if !ok {
        c.err(path, "a header value holds visible ASCII, spaces and tabs only");
    }
    ok
}

fn field_edits(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    raw: Option<&RawFieldEdits>,
    response: bool,
) -> FieldEdits {
    let Some(raw) = raw else { return FieldEdits::default() };
    let templates = |c: &mut Compiler<'_>, key: &str, map: &BTreeMap<String, String>| {
        let mut out = Vec::new();
        for (name, value) in map {
            let p = path.key(key).key(name);
            let lower = header_name(c, p.clone(), name);
            if !header_value(c, p.clone(), value) {
                continue;
            }
            match Template::parse(value, response) {
                Ok(t) => out.push((lower, t)),
                Err(e) => c.err(p, e),
            }
        }
        out
    };
    let set = templates(c, "set", &raw.set);
    let add = templates(c, "add", &raw.add);
    let remove = raw
        .remove
        .iter()
        .enumerate()
        .map(|(i, n)| header_name(c, path.key("remove").index(i), n))
        .collect();
    FieldEdits { remove, set, add }
}

/// A path a rewrite or redirect writes: absolute, without a query or fragment.
fn check_path(c: &mut Compiler<'_>, path: FieldPath, p: &str) -> bool {
    let ok = p.starts_with('/')
        && !p.contains(['?', '#'])
        && p.bytes().all(|b| (0x21..0x7f).contains(&b));
    if !ok {
        c.err(path, format!("`{p}` is not an absolute path (`/...`, no query, no spaces)"));
    }
    ok
}

/// A rewrite; its `path_prefix` replaces the match's prefix (or `/` without one) at run time.
fn rewrite(c: &mut Compiler<'_>, path: &FieldPath, r: &RawRewrite) -> Option<Rewrite> {
    let mut out = Rewrite::default();
    if let Some(p) = &r.path_prefix
        && check_path(c, path.key("path_prefix"), p)
    {
        out.path_prefix = Some(p.clone());
    }
    match (&r.path_regex, &r.to) {
        (Some(re), Some(to)) => match regex::Regex::new(re) {
            Ok(compiled) => {
                let groups = compiled.captures_len() - 1;
                if let Some(n) = highest_capture(to).filter(|n| *n > groups) {
                    c.err(
                        path.key("to"),
                        format!("`${n}` names a capture the expression does not have ({groups})"),
                    );
                } else {
                    out.path_regex = Some((re.clone(), to.clone()));
                }
            }
            Err(e) => c.err(path.key("path_regex"), format!("invalid regular expression: {e}")),
        },
        (Some(_), None) => c.err(path.key("to"), "`path_regex` needs `to`, its replacement"),
        (None, Some(_)) => c.err(path.key("path_regex"), "`to` needs `path_regex`"),
        (None, None) => {}
    }
    if out.path_prefix.is_some() && out.path_regex.is_some() {
        c.err(path.clone(), "`path_prefix` and `path_regex` both rewrite the path: keep one");
        return None;
    }
    if let Some(h) = &r.host {
        if super::check_host_port(h).is_ok() || is_token(h) {
            out.host = Some(h.clone());
        } else {
            c.err(path.key("host"), format!("`{h}` is not a host name"));
        }
    }
    if out == Rewrite::default() {
        c.err(path.clone(), "a rewrite needs `path_prefix`, `path_regex` with `to`, or `host`");
        return None;
    }
    Some(out)
}

/// The highest `$N` (or `${N}`) in a replacement.
fn highest_capture(to: &str) -> Option<usize> {
    let re = regex::Regex::new(r"\$\{?([0-9]+)").ok()?;
    re.captures_iter(to).filter_map(|c| c[1].parse().ok()).max()
}

fn redirect(c: &mut Compiler<'_>, path: &FieldPath, r: &RawRedirect) -> Option<Redirect> {
    let status = c.int(path.key("status"), r.status, 301, 0, u64::from(u16::MAX)) as u16;
    if !Redirect::STATUSES.contains(&status) {
        c.err(
            path.key("status"),
            format!("a redirect's status is 301, 302, 303, 307 or 308, got {status}"),
        );
    }
    let scheme = r.scheme.as_ref().map(|s| s.to_ascii_lowercase());
    if let Some(s) = &scheme
        && s != "http"
        && s != "https"
    {
        c.err(path.key("scheme"), format!("`{s}` is not `http` or `https`"));
    }
    if let Some(h) = &r.host
        && !is_token(h)
    {
        c.err(path.key("host"), format!("`{h}` is not a host name (no port: `port` sets it)"));
    }
    let port = match r.port {
        Some(p) if (1..=65535).contains(&p) => Some(p as u16),
        Some(p) => {
            c.err(path.key("port"), format!("must be between 1 and 65535, got {p}"));
            None
        }
        None => None,
    };
    if let Some(p) = &r.path {
        check_path(c, path.key("path"), p);
    }
    Some(Redirect {
        scheme,
        host: r.host.clone(),
        port,
        path: r.path.clone(),
        status,
        keep_query: r.keep_query.unwrap_or(true),
    })
}

fn respond(c: &mut Compiler<'_>, path: &FieldPath, r: &RawRespond) -> Option<TrafficFilter> {
    let status = c.int(path.key("status"), r.status, 200, 200, 599) as u16;
    let mut headers = Vec::new();
    for (name, value) in &r.headers {
        let p = path.key("headers").key(name);
        let lower = header_name(c, p.clone(), name);
        if header_value(c, p, value) {
            headers.push((lower, value.clone()));
        }
    }
    let body: Arc<[u8]> = match (&r.body, &r.body_file) {
        (Some(_), Some(_)) => {
            c.err(path.key("body_file"), "`body` and `body_file` both give the body: keep one");
            return None;
        }
        (Some(b), None) => b.as_bytes().into(),
        (None, Some(f)) => {
            let file = c.file_path(path.key("body_file"), f)?;
            match std::fs::read(&file) {
                Ok(bytes) => bytes.into(),
                Err(e) => {
                    c.err(path.key("body_file"), format!("cannot read {}: {e}", file.display()));
                    return None;
                }
            }
        }
        (None, None) => Arc::from(&b""[..]),
    };
    Some(TrafficFilter::Respond(Respond { status, headers, body }))
}

fn soap(c: &mut Compiler<'_>, path: &FieldPath, s: &RawSoap) -> Option<Soap> {
    let to = match s.to.as_str() {
        "1.1" => SoapVersion::V11,
        "1.2" => SoapVersion::V12,
        other => {
            c.err(path.key("to"), format!("`{other}` is not a SOAP version: `1.1` or `1.2`"));
            return None;
        }
    };
    let max = (1 << 30) as u64;
    let max_body_bytes =
        c.int(path.key("max_body_bytes"), s.max_body_bytes, Soap::DEFAULT_MAX_BODY, 1, max);
    Some(Soap { to, max_body_bytes })
}
