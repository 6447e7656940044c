//! `request_id`: the request's id (the client's when it sent a fit one, else a new one), sent to
//! members and echoed to the client; and the W3C trace context (`traceparent`, version 00):
//! the client's trace kept or a new one started, with a new span id for each try, so that a
//! retried request shows as two spans of one trace. `tracestate` passes through untouched.

use http::{HeaderName, HeaderValue};
use rondo_core::traffic::RequestId;

use super::table::{Edit, Edits, Src, slot};
use super::{Applied, TRACEPARENT};
use crate::entropy::{random, random_pair};
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

    /// The id's field set on the request and the response, and `traceparent` on the request:
    /// the id's slot first, then the span's.
    pub(super) fn edits(&self, next: &mut u16) -> Edits {
        let id = Src::Slot(slot(next));
        let mut request = vec![Edit::Set(self.header.clone(), id.clone())];
        if self.trace {
            request.push(Edit::Set(TRACEPARENT, Src::Slot(slot(next))));
        }
        Edits { request, response: vec![Edit::Set(self.header.clone(), id)] }
    }

    /// Keeps or makes the id (and the trace), for members, the response and the log: into the
    /// request's record, in the order of [`RequestIdStep::edits`]' slots.
    pub(super) fn request(&self, headers: &impl Headers, applied: &mut Applied) {
        let kept = headers
            .get(self.header.as_str())
            .filter(|v| !v.is_empty() && v.len() <= MAX_ID)
            .filter(|v| v.iter().all(|b| b.is_ascii_graphic()));
        // Visible ASCII: always a valid value.
        let slot = match kept {
            Some(id) => applied.record.push(id),
            None => applied.record.push(&new_id()),
        };
        applied.id = Some(slot);
        if self.trace {
            let trace =
                headers.get(TRACEPARENT.as_str()).and_then(Trace::parse).unwrap_or_else(Trace::new);
            // The first try's span; each try after it gets its own ([`Applied::next_span`]).
            applied.record.push(&trace.span());
            applied.trace = Some(trace);
        }
    }
}

/// A trace a request belongs to: its id and flags (the parent span is the client's, replaced
/// by each try's own).
pub(super) struct Trace {
    id: [u8; 32],
    flags: [u8; 2],
    /// Started here, not the client's.
    pub(super) started: bool,
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
        Some(Trace { id: id.try_into().ok()?, flags: flags.try_into().ok()?, started: false })
    }

    /// A new trace, not sampled (the router records no spans of its own).
    fn new() -> Trace {
        let mut id = [0u8; 32];
        let (a, b) = random_pair();
        hex_into(&mut id[..16], a);
        hex_into(&mut id[16..], b | 1);
        Trace { id, flags: *b"00", started: true }
    }

    /// `traceparent` for a new span of this trace.
    pub(super) fn next_span(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.span()).unwrap_or(HeaderValue::from_static(""))
    }

    /// The same, as bytes.
    fn span(&self) -> [u8; 55] {
        let mut v = [0u8; 55];
        v[..3].copy_from_slice(b"00-");
        v[3..35].copy_from_slice(&self.id);
        v[35] = b'-';
        hex_into(&mut v[36..52], random() | 1);
        v[52] = b'-';
        v[53..].copy_from_slice(&self.flags);
        // Lower-case hex digits and dashes: a valid value.
        v
    }
}

/// The four `-`-separated parts of a version-00 `traceparent`.
fn split4(v: &[u8]) -> Option<[&[u8]; 4]> {
    let mut parts = v.split(|b| *b == b'-');
    let out = [parts.next()?, parts.next()?, parts.next()?, parts.next()?];
    parts.next().is_none().then_some(out)
}

/// A new request id: 128 random bits as a UUID (version 4 layout).
fn new_id() -> [u8; 36] {
    let (a, b) = random_pair();
    let a = (a & !0xf000) | 0x4000; // version 4
    let b = (b & !(0xc << 60)) | (0x8 << 60); // RFC 4122 variant
    // 32 hex digits written at once, then each group copied to its place (fixed ranges: plain
    // moves, no formatting machinery; this runs for every request of a `request_id` route).
    let mut hex = [0u8; 32];
    hex_into(&mut hex[..16], a);
    hex_into(&mut hex[16..], b);
    let mut id = [b'-'; 36];
    id[..8].copy_from_slice(&hex[..8]);
    id[9..13].copy_from_slice(&hex[8..12]);
    id[14..18].copy_from_slice(&hex[12..16]);
    id[19..23].copy_from_slice(&hex[16..20]);
    id[24..].copy_from_slice(&hex[20..]);
    id
}

/// 16 lower-case hex digits of `n` into `out`, eight at a time: each nibble spread into a byte
/// of its own, then turned into its digit with the same arithmetic for all eight.
fn hex_into(out: &mut [u8], n: u64) {
    fn eight(x: u32) -> [u8; 8] {
        let x = u64::from(x);
        let x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
        let x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
        let x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        // A nibble of 10 or more gets 0x27 more ('a' - '0' - 10).
        let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
        (x + 0x3030_3030_3030_3030 + letters * 0x27).to_be_bytes()
    }
    out[..8].copy_from_slice(&eight((n >> 32) as u32));
    out[8..16].copy_from_slice(&eight(n as u32));
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
    fn hex_digits_are_those_of_the_number() {
        for n in [0, 1, 0x0123_4567_89ab_cdef, u64::MAX, 0xa0b0_c0d0_e0f0_0909, random()] {
            let mut out = [0u8; 16];
            hex_into(&mut out, n);
            assert_eq!(std::str::from_utf8(&out).unwrap(), format!("{n:016x}"));
        }
    }

    #[test]
    fn new_ids_are_uuids_and_differ() {
        let (a, b) = (new_id(), new_id());
        let (a, b) = (std::str::from_utf8(&a).unwrap(), std::str::from_utf8(&b).unwrap());
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert!(a.bytes().all(|c| c == b'-' || c.is_ascii_hexdigit()), "{a}");
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
