//! The heads the own path writes: the request head as members get it
//! ([`write_request_head`]), the member's response head as the client gets it
//! ([`write_response_head`]), both without hop-by-hop fields and with this hop in `Via`, and
//! the head of a response the router makes itself ([`local_head`]).

use http::HeaderValue;
use rondo_core::wire::VIEW_ID_HEADER;

use super::parse::{self, Field, RequestHead, ResponseHead};
use crate::auth::{self, Identity, LOGIN_HEADER};
use crate::chain::{Answer, Applied, FieldOps, ResponseEdits};
use crate::headers::{HOP_BY_HOP_BUT_FRAMING, via_id};

/// The head of a response the router makes itself.
pub(super) fn local_head(
    out: &mut Vec<u8>,
    status: u16,
    len: usize,
    extra: &[&str],
    edits: Option<&FieldOps>,
    alt_svc: Option<&HeaderValue>,
    close: bool,
) {
    use std::io::Write as _;
    let reason =
        http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    let _ = write!(
        out,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {len}\r\ndate: {}\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    for h in extra {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(edits) = edits {
        edited(out, edits);
    }
    if let Some(alt) = alt_svc {
        field(out, b"alt-svc", alt.as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether `name` (as sent) is `lower` (lower case), ignoring case.
pub(super) fn is(name: &[u8], lower: &[u8]) -> bool {
    name.eq_ignore_ascii_case(lower)
}

/// Hop-by-hop fields (RFC 9110 7.6.1), never forwarded either way; the transfer coding stays,
/// as the body passes through with its framing.
fn hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP_BUT_FRAMING.iter().any(|h| is(name, h.as_bytes()))
}

/// The fields `Connection` names in `fields` (never `Host`, nor the framing fields: bodies pass
/// through as they came, so the fields that delimit them must too, or a member reads the body
/// of `Connection: Content-Length` as a request of its own).
fn connection_named<'b>(buf: &'b [u8], fields: &[Field]) -> Vec<&'b [u8]> {
    let mut named = Vec::new();
    for f in fields.iter().filter(|f| is(f.name.get(buf), b"connection")) {
        named.extend(parse::tokens(f.value.get(buf)).filter(|t| {
            !is(t, b"host") && !is(t, b"content-length") && !is(t, b"transfer-encoding")
        }));
    }
    named
}

/// Whether a client's field `name` never reaches a member: an identity header
/// (`x-rondo-subject`, `x-rondo-claim-*`, in any spelling), the router's to set, or an
/// underscore spelling of a field the router owns (`X_Forwarded_For`).
fn is_identity_header(name: &[u8]) -> bool {
    auth::is_identity_header(name) || crate::headers::is_reserved_alias(name)
}

/// The request head as members get it: the request line and fields as the client sent them,
/// minus hop-by-hop fields, those `Connection` names, incoming forwarding, certificate and
/// identity fields; plus `X-Forwarded-*`, the identity the route verified and this hop in
/// `Via`. The target is `target` when the path was normalized.
pub(super) fn write_request_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    (head, target): (&RequestHead, Option<&[u8]>),
    (ip, tls, trusted): (&[u8], Option<&crate::tls::ClientCert>, bool),
    host: &[u8],
    (identity, applied): (Option<&Identity>, Option<&Applied>),
) {
    out.extend_from_slice(head.method.get(buf));
    out.push(b' ');
    out.extend_from_slice(target.unwrap_or_else(|| head.target.get(buf)));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let named = connection_named(buf, &head.fields);
    let mut te_trailers = false;
    let mut prior_xff: Option<&[u8]> = None;
    let mut vias: Vec<&[u8]> = Vec::new();
    for f in &head.fields {
        let (name, value) = (f.name.get(buf), f.value.get(buf));
        // One look at the name's length picks the one field of these it could be (most fields
        // a client sends are none of them); the checks below still see every other name.
        let dropped = match name.len() {
            2 if is(name, b"te") => {
                te_trailers |= parse::tokens(value).any(|t| is(t, b"trailers"));
                true
            }
            3 if is(name, b"via") => {
                vias.push(value);
                true
            }
            6 => is(name, b"expect"),
            9 => !trusted && is(name, b"forwarded"),
            15 if is(name, b"x-forwarded-for") => {
                prior_xff.get_or_insert(value);
                true
            }
            16 => is(name, b"x-forwarded-host"),
            17 => is(name, b"x-forwarded-proto"),
            _ => false,
        };
        if dropped {
            continue;
        }
        if hop_by_hop(name)
            || is(name, crate::tls::CLIENT_CERT_SUBJECT.as_bytes())
            || is(name, crate::tls::CLIENT_CERT_SAN.as_bytes())
            || is_identity_header(name)
            || named.iter().any(|n| is(name, n))
        {
            continue;
        }
        if let Some(a) = applied
            && (a.drops_request(name) || (a.host.is_some() && is(name, b"host")))
        {
            continue;
        }
        if is(name, b"cookie")
            && let Some(rest) = auth::cookie_without_session(value)
        {
            // The tier session's cookie is no member's to see.
            if !rest.is_empty() {
                field(out, name, &rest);
            }
            continue;
        }
        field(out, name, value);
    }
    for (name, value) in identity.into_iter().flat_map(Identity::headers) {
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if let Some(a) = applied {
        if let Some(host) = &a.host {
            field(out, b"host", host.as_bytes());
        }
        a.write_request_fields(out);
    }
    if te_trailers {
        out.extend_from_slice(b"te: trailers\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if let Some(prior) = prior_xff.filter(|_| trusted) {
        out.extend_from_slice(prior);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(ip);
    out.extend_from_slice(b"\r\n");
    match tls {
        None => out.extend_from_slice(b"x-forwarded-proto: http\r\n"),
        Some(cert) => {
            out.extend_from_slice(b"x-forwarded-proto: https\r\n");
            let names = [crate::tls::CLIENT_CERT_SUBJECT, crate::tls::CLIENT_CERT_SAN];
            for (name, value) in names.into_iter().zip([&cert.subject, &cert.san]) {
                if let Some(v) = value {
                    field(out, name.as_bytes(), v.as_bytes());
                }
            }
        }
    }
    if !host.is_empty() {
        field(out, b"x-forwarded-host", host);
    }
    write_via(out, &vias);
    out.extend_from_slice(b"\r\n");
}

/// The member's response head as the client gets it: status line in HTTP/1.1, fields minus
/// hop-by-hop ones (the transfer coding stays: the body passes through as it came), this hop
/// in `Via`, a new session cookie, the listener's `Alt-Svc` (when it serves HTTP/3 too), and
/// `Connection: close` when the connection ends after it.
pub(super) fn write_response_head(
    out: &mut Vec<u8>,
    rbuf: &[u8],
    head: &ResponseHead,
    cookies: [Option<&HeaderValue>; 3],
    edits: Option<&ResponseEdits<'_>>,
    (alt_svc, view_id): (Option<&HeaderValue>, Option<u64>),
    close: bool,
) {
    // The status has three digits (the parser reads exactly three).
    let s = head.status;
    let digits = [b'0' + (s / 100 % 10) as u8, b'0' + (s / 10 % 10) as u8, b'0' + (s % 10) as u8];
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&digits);
    out.push(b' ');
    out.extend_from_slice(head.reason.get(rbuf));
    out.extend_from_slice(b"\r\n");
    let named = connection_named(rbuf, &head.fields);
    let has_te = head.fields.iter().any(|f| is(f.name.get(rbuf), b"transfer-encoding"));
    let mut vias: Vec<&[u8]> = Vec::new();
    for f in &head.fields {
        let (name, value) = (f.name.get(rbuf), f.value.get(rbuf));
        if is(name, b"via") {
            vias.push(value);
            continue;
        }
        // RFC 9112 6.3: with both, the transfer coding frames the body and the length is wrong.
        if hop_by_hop(name)
            || (has_te && is(name, b"content-length"))
            || is(name, LOGIN_HEADER.as_bytes())
            || named.iter().any(|n| is(name, n))
            || edits.is_some_and(|e| e.drops(name))
            || (view_id.is_some() && is(name, VIEW_ID_HEADER.as_bytes()))
        {
            continue;
        }
        field(out, name, value);
    }
    if let Some(id) = view_id {
        field(out, VIEW_ID_HEADER.as_bytes(), id.to_string().as_bytes());
    }
    write_via(out, &vias);
    if let Some(edits) = edits {
        edits.write(out);
    }
    for cookie in cookies.into_iter().flatten() {
        field(out, b"set-cookie", cookie.as_bytes());
    }
    if let Some(alt) = alt_svc {
        field(out, b"alt-svc", alt.as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The head of a filter's own answer (a redirect, a direct response): its fields, then the
/// response edits of the filters before it.
pub(super) fn answer_head(
    out: &mut Vec<u8>,
    answer: &Answer,
    edits: &ResponseEdits<'_>,
    alt_svc: Option<&HeaderValue>,
    close: bool,
) {
    use std::io::Write as _;
    let reason = http::StatusCode::from_u16(answer.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let _ = write!(out, "HTTP/1.1 {} {reason}\r\ndate: {date}\r\n", answer.status);
    // RFC 9110 section 8.6: a 204 has no `Content-Length` (a CORS preflight's answer).
    if answer.status != 204 {
        let _ = write!(out, "content-length: {}\r\n", answer.body.len());
    }
    for (name, value) in &answer.headers {
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    edits.write(out);
    if let Some(alt) = alt_svc {
        field(out, b"alt-svc", alt.as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Puts `span` (a whole `traceparent` value, as long as every version-00 one) in place of the
/// one in the request head at the start of `out`.
pub(super) fn replace_traceparent(out: &mut [u8], span: &[u8]) {
    const NAME: &[u8] = b"\r\ntraceparent: ";
    let head_end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(out.len());
    let Some(at) = out[..head_end].windows(NAME.len()).position(|w| w == NAME) else { return };
    let start = at + NAME.len();
    if let Some(old) = out.get_mut(start..start + span.len())
        && old.iter().all(|b| *b != b'\r')
    {
        old.copy_from_slice(span);
    }
}

/// Puts `span` as the one `traceparent` of the request head at the start of `out` (a traced
/// request, `[tracing]`): every `traceparent` field the head has (the client's, or the one
/// `request_id` wrote) goes, and this one is added at the head's end. The body after the head
/// moves along.
pub(super) fn set_traceparent(out: &mut Vec<u8>, span: &[u8]) {
    let Some(blank) = out.windows(4).position(|w| w == b"\r\n\r\n") else { return };
    // The fields end with the last one's CRLF, before the blank line.
    let end = blank + 2;
    let mut head = Vec::with_capacity(end + span.len() + 16);
    for line in out[..end].split_inclusive(|b| *b == b'\n') {
        let name = line.split(|b| *b == b':').next().unwrap_or(line);
        if !is(name, b"traceparent") {
            head.extend_from_slice(line);
        }
    }
    field(&mut head, b"traceparent", span);
    out.splice(..end, head);
}

/// The fields the filters added.
fn edited(out: &mut Vec<u8>, edits: &FieldOps) {
    for (name, value) in &edits.append {
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `Via` with the prior hops, then this one.
fn write_via(out: &mut Vec<u8>, prior: &[&[u8]]) {
    out.extend_from_slice(b"via: ");
    for v in prior {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(b"1.1 ");
    out.extend_from_slice(via_id().as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A traced try's `traceparent` replaces the client's (in any spelling) and keeps the
    /// body after the head.
    #[test]
    fn a_traced_head_has_one_traceparent_the_try_s() {
        let mut out = b"GET / HTTP/1.1\r\nhost: a\r\nTraceParent: 00-x\r\nx-b: 1\r\n\
            traceparent: 00-y\r\n\r\nbody"
            .to_vec();
        set_traceparent(&mut out, b"00-new");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nhost: a\r\nx-b: 1\r\ntraceparent: 00-new\r\n\r\nbody"
        );
    }

    /// The own path drops the hop-by-hop fields hyper's path drops ([`crate::headers`]' one
    /// list), except the transfer coding, which frames the body it passes through as it came.
    #[test]
    fn a_response_head_loses_every_hop_by_hop_field_but_its_framing() {
        let rbuf = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
            Proxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: h2c\r\n\
            Proxy-Authorization: Basic eA==\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n\
            0\r\n\r\n";
        let head = parse::response(rbuf, false).expect("parses").expect("whole");
        let mut out = Vec::new();
        write_response_head(&mut out, rbuf, &head, [None, None, None], None, (None, None), false);
        let out = String::from_utf8(out).expect("text").to_ascii_lowercase();
        for gone in crate::headers::HOP_BY_HOP_BUT_FRAMING {
            assert!(!out.contains(&format!("\n{gone}:")), "{gone} was forwarded:\n{out}");
        }
        assert!(out.contains("\ntransfer-encoding: chunked\r\n"), "{out}");
        assert!(out.contains("\nx-kept: 1\r\n"), "{out}");
    }
}
