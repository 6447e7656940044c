//! `request_id`: the request's id (the client's when it sent a fit one, else a new one), sent to
//! members and echoed to the client; and the W3C trace context (`traceparent`, version 00):
//! the client's trace kept or a new one started, with a new span id for each try, so that a
//! retried request shows as two spans of one trace. `tracestate` passes through untouched.

use http::{HeaderName, HeaderValue};
use rondo_core::traffic::RequestId;

use super::fields::Pending;
use super::{Applied, TRACEPARENT};
use crate::entropy::random;
use crate::head::Headers;

/// The longest request id kept from a client; a longer one is replaced.
const MAX_ID: usize = 128;

/// A compiled `request_id`.
pub(super) struct RequestIdStep {
    header: HeaderName,
    trace: bool,
}

impl RequestIdStep {
    pub(super) fn new(spec: &RequestId) -> RequestIdStep {
        let header = HeaderName::from_bytes(spec.header.as_bytes())
            .unwrap_or(HeaderName::from_static(RequestId::DEFAULT_HEADER));
        RequestIdStep { header, trace: spec.trace }
    }

    /// Keeps or makes the id (and the trace), for members, the response and the log.
    pub(super) fn request(&self, headers: &impl Headers, applied: &mut Applied) {
        let kept = headers
            .get(self.header.as_str())
            .filter(|v| !v.is_empty() && v.len() <= MAX_ID)
            .filter(|v| v.iter().all(|b| b.is_ascii_graphic()))
            .and_then(|v| std::str::from_utf8(v).ok());
        let id = match kept {
            Some(id) => id.to_owned(),
            None => new_id(),
        };
        if let Ok(value) = HeaderValue::from_str(&id) {
            applied.request.set(&self.header, value.clone());
            applied.response.push(Pending::SetValue(self.header.clone(), value));
        }
        applied.request_id = Some(id);
        if self.trace {
            let trace =
                headers.get(TRACEPARENT.as_str()).and_then(Trace::parse).unwrap_or_else(Trace::new);
            // The first try's span; each try after it gets its own ([`Applied::next_span`]).
            applied.request.set(&TRACEPARENT, trace.next_span());
            applied.trace = Some(trace);
        }
    }
}

/// A trace a request belongs to: its id and flags (the parent span is the client's, replaced
/// by each try's own).
pub(super) struct Trace {
    id: [u8; 32],
    flags: [u8; 2],
}

impl Trace {
    /// A client's `traceparent`, when it is a valid version-00 one (W3C Trace Context 3.2):
    /// lower-case hex, neither id all zeros.
    fn parse(value: &[u8]) -> Option<Trace> {
        let hex = |s: &[u8]| s.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
        let zero = |s: &[u8]| s.iter().all(|b| *b == b'0');
        let [v, id, parent, flags] = split4(value)?;
        if v != b"00" || id.len() != 32 || parent.len() != 16 || flags.len() != 2 {
            return None;
        }
        if !(hex(id) && hex(parent) && hex(flags)) || zero(id) || zero(parent) {
            return None;
        }
        Some(Trace { id: id.try_into().ok()?, flags: flags.try_into().ok()? })
    }

    /// A new trace, not sampled (the router records no spans of its own).
    fn new() -> Trace {
        let mut id = [0u8; 32];
        hex_into(&mut id[..16], random());
        hex_into(&mut id[16..], random() | 1);
        Trace { id, flags: *b"00" }
    }

    /// `traceparent` for a new span of this trace.
    pub(super) fn next_span(&self) -> HeaderValue {
        let mut v = Vec::with_capacity(55);
        v.extend_from_slice(b"00-");
        v.extend_from_slice(&self.id);
        v.push(b'-');
        let mut span = [0u8; 16];
        hex_into(&mut span, random() | 1);
        v.extend_from_slice(&span);
        v.push(b'-');
        v.extend_from_slice(&self.flags);
        HeaderValue::from_bytes(&v).unwrap_or(HeaderValue::from_static(""))
    }
}

/// The four `-`-separated parts of a version-00 `traceparent`.
fn split4(v: &[u8]) -> Option<[&[u8]; 4]> {
    let mut parts = v.split(|b| *b == b'-');
    let out = [parts.next()?, parts.next()?, parts.next()?, parts.next()?];
    parts.next().is_none().then_some(out)
}

/// A new request id: 128 random bits as a UUID (version 4 layout).
fn new_id() -> String {
    let (a, b) = (random(), random());
    let a = (a & !0xf000) | 0x4000; // version 4
    let b = (b & !(0xc << 60)) | (0x8 << 60); // RFC 4122 variant
    // 32 hex digits written at once, then the dashes put in (no formatting machinery: this
    // runs for every request of a `request_id` route).
    let mut hex = [0u8; 32];
    hex_into(&mut hex[..16], a);
    hex_into(&mut hex[16..], b);
    let mut id = String::with_capacity(36);
    for (i, part) in
        [&hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]].into_iter().enumerate()
    {
        if i > 0 {
            id.push('-');
        }
        // Hex digits are ASCII.
        id.push_str(std::str::from_utf8(part).unwrap_or(""));
    }
    id
}

/// 16 lower-case hex digits of `n` into `out`.
fn hex_into(out: &mut [u8], n: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, o) in out.iter_mut().enumerate().take(16) {
        *o = DIGITS[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_kept_and_a_bad_one_replaced() {
        let good = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = Trace::parse(good).expect("valid");
        let span = t.next_span();
        let s = span.to_str().unwrap();
        assert!(s.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{s}");
        assert!(s.ends_with("-01") && s.len() == 55, "{s}");
        assert_ne!(&s[36..52], "00f067aa0ba902b7", "a try gets a span of its own");
        assert_ne!(t.next_span(), span, "each try gets a new span");
        for bad in [
            &b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"garbage",
        ] {
            assert!(Trace::parse(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn new_ids_are_uuids_and_differ() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
