//! The edge filters of `filters`: `cors` (origins, methods, header names) and `compress`
//! (media types, sizes, levels, encodings), checked with their field paths and compiled into
//! the core's specs.

use rondo_core::traffic::{Compress, Cors, Encoding, check_origin};

use super::{Compiler, is_token};
use crate::path::FieldPath;
use crate::raw::{RawCompress, RawCors};

/// The methods a `cors` filter may name (RFC 9110 section 9 and PATCH, RFC 5789).
const METHODS: [&str; 9] =
    ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// A `cors` filter.
pub(super) fn cors(c: &mut Compiler<'_>, path: &FieldPath, r: &RawCors) -> Option<Cors> {
    let allow_credentials = r.allow_credentials.unwrap_or(false);
    if r.allow_origins.is_empty() {
        c.err(path.key("allow_origins"), "`cors` needs `allow_origins`, one origin at least");
        return None;
    }
    let mut allow_origins = Vec::new();
    for (i, o) in r.allow_origins.iter().enumerate() {
        let p = path.key("allow_origins").index(i);
        if let Err(e) = check_origin(o) {
            c.err(p, e);
        } else if o == "*" && allow_credentials {
            c.err(
                p,
                "`*` with `allow_credentials = true` is refused by browsers: name the origins",
            );
        } else {
            allow_origins.push(o.to_ascii_lowercase());
        }
    }
    let methods = match &r.allow_methods {
        Some(m) => m.clone(),
        None => Cors::DEFAULT_METHODS.map(str::to_owned).to_vec(),
    };
    for (i, m) in methods.iter().enumerate() {
        if !METHODS.contains(&m.as_str()) {
            c.err(
                path.key("allow_methods").index(i),
                format!("unknown method `{m}`, expected one of {}", METHODS.join(", ")),
            );
        }
    }
    let names = |c: &mut Compiler<'_>, key: &str, list: &[String]| {
        let mut out = Vec::new();
        for (i, n) in list.iter().enumerate() {
            if is_token(n) && n != "*" {
                out.push(n.to_ascii_lowercase());
            } else {
                c.err(path.key(key).index(i), format!("`{n}` is not a header name"));
            }
        }
        out
    };
    let allow_headers = names(c, "allow_headers", &r.allow_headers);
    let expose_headers = names(c, "expose_headers", &r.expose_headers);
    let max_age_s = r.max_age_s.map(|s| c.int(path.key("max_age_s"), Some(s), 0, 0, 86_400));
    Some(Cors {
        allow_origins,
        allow_methods: methods,
        allow_headers,
        expose_headers,
        allow_credentials,
        max_age_s,
    })
}

/// A `compress` filter.
pub(super) fn compress(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawCompress,
) -> Option<Compress> {
    let mut types = Vec::new();
    match &r.types {
        None => types.extend(Compress::DEFAULT_TYPES.map(str::to_owned)),
        Some(list) if list.is_empty() => {
            c.err(path.key("types"), "`types` needs one media type at least (`text/*`)");
        }
        Some(list) => {
            for (i, t) in list.iter().enumerate() {
                let ok = t.split_once('/').is_some_and(|(top, sub)| {
                    is_token(top) && top != "*" && (sub == "*" || is_token(sub))
                });
                if ok {
                    types.push(t.to_ascii_lowercase());
                } else {
                    c.err(
                        path.key("types").index(i),
                        format!(
                            "`{t}` is not a media type (`type/subtype` or `type/*`, no parameters)"
                        ),
                    );
                }
            }
        }
    }
    let min_bytes = r.min_bytes.unwrap_or(Compress::DEFAULT_MIN_BYTES);
    let level = c.int(path.key("level"), r.level, u64::from(Compress::DEFAULT_LEVEL), 1, 9) as u32;
    let mut encodings = Vec::new();
    match &r.encodings {
        None => encodings.extend(Encoding::ALL),
        Some(list) if list.is_empty() => {
            c.err(path.key("encodings"), "`encodings` needs one encoding at least (`gzip`)");
        }
        Some(list) => {
            for (i, name) in list.iter().enumerate() {
                let p = path.key("encodings").index(i);
                match Encoding::ALL.into_iter().find(|e| e.name() == name) {
                    Some(e) if encodings.contains(&e) => {
                        c.err(p, format!("`{name}` is named twice"))
                    }
                    Some(e) => encodings.push(e),
                    None => {
                        c.err(p, format!("unknown encoding `{name}`, expected br, zstd or gzip"))
                    }
                }
            }
        }
    }
    Some(Compress { types, min_bytes, level, encodings })
}
