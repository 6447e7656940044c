//! Header hygiene (RFC 9110 section 7.6): hop-by-hop headers and every header named in
//! `Connection` are removed in both directions; `X-Forwarded-For`, `-Proto` and `-Host` and
//! `Via` are added on the way in, `Via` on the way out. `Host` is kept (even when `Connection`
//! names it). A client-sent `X-Forwarded-For` is replaced unless the listener trusts the client
//! (`trust_forwarded_for`), in which case the client's address is appended; a client-sent
//! `Forwarded` is removed unless trusted likewise.
//!
//! `Via` carries this process's own pseudonym (`rondo-` and 8 hex digits, random per process,
//! [`via_id`]): a request that arrives with it already in its `Via` has come back through this
//! router (a member registered or configured at one of its own listeners, or a ring of routers)
//! and is answered `508 Loop Detected` instead of nesting until descriptors run out.

use std::net::IpAddr;
use std::sync::OnceLock;

use http::Version;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop fields (RFC 9110 7.6.1), never forwarded either way: the one list of both paths,
/// lower case. The last, `Transfer-Encoding`, frames the body: the own HTTP/1 path passes
/// bodies through as they came and keeps it ([`HOP_BY_HOP_BUT_FRAMING`], compared as bytes on
/// every field of every head); hyper's decodes them and drops it ([`HOP_BY_HOP`]).
const HOP_BY_HOP_NAMES: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
    "proxy-authorization",
    "transfer-encoding",
];

/// [`HOP_BY_HOP_NAMES`] as hyper's header names.
static HOP_BY_HOP: [HeaderName; 7] = {
    let n = HOP_BY_HOP_NAMES;
    [
        HeaderName::from_static(n[0]),
        HeaderName::from_static(n[1]),
        HeaderName::from_static(n[2]),
        HeaderName::from_static(n[3]),
        HeaderName::from_static(n[4]),
        HeaderName::from_static(n[5]),
        HeaderName::from_static(n[6]),
    ]
};

/// [`HOP_BY_HOP_NAMES`] without `Transfer-Encoding`, for a path that forwards bodies with their
/// framing. (Split at compile time: the list is not empty.)
pub(crate) const HOP_BY_HOP_BUT_FRAMING: &[&str] = HOP_BY_HOP_NAMES.split_last().unwrap().1;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

// The names the router owns, and how a field name is compared with them, are the identity
// crate's (its identity headers are among them); the hygiene here and the own HTTP/1 path use
// them under these names.
pub use rondo_identity::names::{
    is_reserved, is_reserved_alias, name_is, name_starts_with, remove_names,
};

/// Removes every field the router owns from a trailer section (hyper's path; the own path's
/// chunked decoder refuses them instead).
pub fn strip_reserved_trailers(trailers: &mut HeaderMap) {
    remove_names(trailers, is_reserved);
}

/// Whether the request asks to switch protocols (WebSocket and friends).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers and those named in `Connection`. With `keep_upgrade` the
/// `Upgrade` header and a `Connection: upgrade` survive (they must reach the member for a
/// protocol switch). `TE: trailers` is kept: gRPC needs it end to end.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // The usual message has none of them (and without `Connection` none is named): one pass
    // over its names instead of a lookup per hop-by-hop name.
    if !keep_upgrade && !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        // `Connection: host` must not strip `Host` (RFC 9110 7.6.1: a proxy must not let
        // `Connection` remove end-to-end fields the message cannot do without).
        if (keep_upgrade && name == header::UPGRADE) || name == header::HOST {
            continue;
        }
        headers.remove(&name);
    }
    let te_trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("trailers")));
    for name in &HOP_BY_HOP {
        if keep_upgrade && (name == header::UPGRADE || name == header::CONNECTION) {
            continue;
        }
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// A client's address as the value of `X-Forwarded-For` (made once per connection).
pub fn client_ip_value(client: IpAddr) -> HeaderValue {
    // An IP address's text is always a valid header value.
    HeaderValue::from_str(&client.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Adds the forwarding headers to a request on its way to a member; `client` is the client's
/// address as [`client_ip_value`] gives it.
pub fn add_forwarded(
    headers: &mut HeaderMap,
    client: &HeaderValue,
    host: Option<&str>,
    version: Version,
    trust_forwarded_for: bool,
) {
    let prior = headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok());
    let xff = match (prior, client.to_str()) {
        (Some(prior), Ok(ip)) if trust_forwarded_for => {
            HeaderValue::from_str(&format!("{prior}, {ip}")).ok()
        }
        _ => Some(client.clone()),
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    // RFC 7239's field says the same as `X-Forwarded-For`: only a trusted peer's is passed on.
    if !trust_forwarded_for {
        headers.remove(header::FORWARDED);
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    if let Some(host) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
        headers.insert(X_FORWARDED_HOST.clone(), host);
    }
    append_via(headers, version);
}

/// The client-certificate headers on a request to a member: incoming copies are always removed
/// (a client must not be able to claim an identity), then, on a TLS listener, the verified
/// certificate's subject and SANs are added and `X-Forwarded-Proto` says `https`.
pub fn add_client_cert(headers: &mut HeaderMap, tls: Option<&crate::tls::ClientCert>) {
    // The usual request carries neither: one pass over its names instead of two hashed
    // removals per request (as for the hop-by-hop headers).
    if headers.keys().any(|k| *k == CERT_SUBJECT || *k == CERT_SAN) {
        headers.remove(&CERT_SUBJECT);
        headers.remove(&CERT_SAN);
    }
    let Some(tls) = tls else { return };
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("https"));
    if let Some(v) = &tls.subject {
        headers.insert(CERT_SUBJECT.clone(), v.clone());
    }
    if let Some(v) = &tls.san {
        headers.insert(CERT_SAN.clone(), v.clone());
    }
}

static CERT_SUBJECT: HeaderName = HeaderName::from_static(crate::tls::CLIENT_CERT_SUBJECT);
static CERT_SAN: HeaderName = HeaderName::from_static(crate::tls::CLIENT_CERT_SAN);

/// This process's `Via` pseudonym: `rondo-` and 8 random hex digits, fixed for the process's
/// life. Random rather than derived from the host name or listener address, so it tells a
/// client nothing about the router.
pub fn via_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // `RandomState` is seeded from the OS's randomness once per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        format!("rondo-{:08x}", h.finish() as u32)
    })
}

/// This hop's `Via` element for `version`, made once per process.
fn via_hop(version: Version) -> &'static HeaderValue {
    static HOPS: OnceLock<[HeaderValue; 4]> = OnceLock::new();
    let hops = HOPS.get_or_init(|| {
        let id = via_id();
        [format!("1.0 {id}"), format!("1.1 {id}"), format!("2 {id}"), format!("3 {id}")].map(|v| {
            HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("1.1 rondo"))
        })
    });
    match version {
        Version::HTTP_10 => &hops[0],
        Version::HTTP_2 => &hops[2],
        Version::HTTP_3 => &hops[3],
        _ => &hops[1],
    }
}

/// Whether `Via` already names this process: the request went through this router before and
/// came back (a forwarding loop).
pub fn has_looped(headers: &impl crate::head::Headers) -> bool {
    let id = via_id();
    headers
        .values("via")
        .flat_map(|v| v.split(|b| *b == b','))
        // Each element is `protocol received-by [comment]`: the second word is the hop's name.
        .filter_map(|e| e.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty()).nth(1))
        .any(|by| by == id.as_bytes())
}

/// Appends this hop to `Via`.
pub fn append_via(headers: &mut HeaderMap, version: Version) {
    let hop = via_hop(version);
    let value = match headers.get(header::VIA).and_then(|v| v.to_str().ok()) {
        Some(prior) => {
            HeaderValue::from_str(&format!("{prior}, {}", hop.to_str().unwrap_or("rondo"))).ok()
        }
        None => Some(hop.clone()),
    };
    if let Some(v) = value {
        headers.insert(header::VIA, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_lose_every_field_the_router_owns() {
        let mut t = HeaderMap::new();
        for name in ["x-rondo-subject", "x_rondo_login", "x-forwarded-for", "x-client-cert-san"] {
            t.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t.insert("x-rondox", HeaderValue::from_static("1"));
        strip_reserved_trailers(&mut t);
        let mut left: Vec<&str> = t.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["grpc-status", "x-rondox"]);
        assert!(is_reserved_alias(b"X_Forwarded_For") && !is_reserved_alias(b"X-Forwarded-For"));
    }

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.get("x-secret").is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert_eq!(h.get(header::TE).unwrap(), "trailers");
        assert_eq!(h.get(header::HOST).unwrap(), "example.com");
    }

    #[test]
    fn a_message_without_hop_by_hop_headers_is_left_as_it_is() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        let before = h.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h, before);
        // One hop-by-hop header anywhere takes the full path.
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h, before);
        // An upgrade keeps (and sets) `Connection: upgrade` even when none was there.
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
    }

    #[test]
    fn forwarded_for_is_replaced_unless_trusted() {
        let ip: IpAddr = "127.0.0.9".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.insert("forwarded", HeaderValue::from_static("for=6.6.6.6"));
        add_forwarded(&mut h, &client_ip_value(ip), Some("a.test"), Version::HTTP_11, false);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.9");
        assert_eq!(h.get("forwarded"), None);
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("forwarded", HeaderValue::from_static("for=10.0.0.1"));
        add_forwarded(&mut h, &client_ip_value(ip), Some("a.test"), Version::HTTP_11, true);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.9");
        assert_eq!(h.get("forwarded").unwrap(), "for=10.0.0.1");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "a.test");
        assert_eq!(h.get("via").unwrap().to_str().unwrap(), format!("1.1 {}", via_id()));
    }

    #[test]
    fn connection_cannot_strip_host() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("host, x-a"));
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        h.insert("x-a", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.get(header::HOST).unwrap(), "example.com");
        assert!(h.get("x-a").is_none());
    }

    #[test]
    fn a_via_naming_this_process_is_a_loop() {
        let mut h = HeaderMap::new();
        assert!(!has_looped(&h));
        h.insert(header::VIA, HeaderValue::from_static("1.1 proxy-a, 1.1 rondo, 2 rondo-00000000"));
        assert!(!has_looped(&h) || via_id() == "rondo-00000000");
        append_via(&mut h, Version::HTTP_2);
        assert!(has_looped(&h));
        // In a second header line too, and with a comment after the name.
        let mut h = HeaderMap::new();
        h.append(header::VIA, HeaderValue::from_static("1.0 fred"));
        let mine = format!("1.1 {} (rondo)", via_id());
        h.append(header::VIA, HeaderValue::from_str(&mine).unwrap());
        assert!(has_looped(&h));
        assert!(via_id().starts_with("rondo-") && via_id().len() == 14);
    }
}
