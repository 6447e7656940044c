//! gRPC as the balancer sees it: status codes ([`Code`], [`Codes`]), the `grpc-status` and
//! `grpc-timeout` fields parsed ([`parse_status`], [`parse_timeout`]) and written
//! ([`encode_timeout`], [`encode_message`]), and whether a call's status is the member's failure
//! under its cluster's [`GrpcPolicy`] ([`GrpcPolicy::is_failure`]; the member's outcome:
//! [`crate::Outcome::of_grpc`]).
//!
//! A gRPC call is answered HTTP 200 whatever became of it; its status is in `grpc-status`, in
//! the response head (a trailers-only response) or in the trailers. The codes a cluster names
//! as its members' failures (`grpc_failure_codes`) count exactly like a 5xx: passive ejection,
//! EWMA, the adaptive picker and the retry decision see the same outcome. The grammar and the
//! codes are gRPC's "gRPC over HTTP2" protocol document (`doc/PROTOCOL-HTTP2.md`) and
//! `doc/statuscodes.md`.

use std::time::Duration;

/// A gRPC status code (0-16; anything else a member sends is read as [`Code::UNKNOWN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Code(u8);

impl Code {
    /// The call succeeded.
    pub const OK: Code = Code(0);
    /// The caller cancelled the call.
    pub const CANCELLED: Code = Code(1);
    /// An error without a better code (and any code out of range).
    pub const UNKNOWN: Code = Code(2);
    /// The deadline ran out before the call completed.
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    /// A resource (a quota, the server's capacity) ran out.
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    /// The method is not implemented by the server.
    pub const UNIMPLEMENTED: Code = Code(12);
    /// An invariant of the server broke.
    pub const INTERNAL: Code = Code(13);
    /// The service is unavailable: transient, a retry may succeed.
    pub const UNAVAILABLE: Code = Code(14);

    /// Every code's name, by number: the config file's spelling (kebab-case).
    pub const NAMES: [&'static str; 17] = [
        "ok",
        "cancelled",
        "unknown",
        "invalid-argument",
        "deadline-exceeded",
        "not-found",
        "already-exists",
        "permission-denied",
        "resource-exhausted",
        "failed-precondition",
        "aborted",
        "out-of-range",
        "unimplemented",
        "internal",
        "unavailable",
        "data-loss",
        "unauthenticated",
    ];

    /// The code numbered `n`; a number gRPC does not define is [`Code::UNKNOWN`] (its spec's
    /// rule for codes a client does not know).
    pub fn from_number(n: u32) -> Code {
        if n < Code::NAMES.len() as u32 { Code(n as u8) } else { Code::UNKNOWN }
    }

    /// The code named `name` in the config file's spelling; `UNAVAILABLE` and `unavailable`
    /// (gRPC's own spelling, any case, `_` for `-`) are accepted too.
    pub fn parse(name: &str) -> Option<Code> {
        let wanted = name.to_ascii_lowercase().replace('_', "-");
        Code::NAMES.iter().position(|n| *n == wanted).map(|i| Code(i as u8))
    }

    /// The code's number, as `grpc-status` carries it.
    pub fn number(self) -> u32 {
        u32::from(self.0)
    }

    /// The code's name (kebab-case).
    pub fn name(self) -> &'static str {
        Code::NAMES[usize::from(self.0)]
    }
}

/// A set of codes (a cluster's failure codes, the codes a trailers-only answer is retried on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Codes(u32);

impl Codes {
    /// No code.
    pub const NONE: Codes = Codes(0);

    /// The set of `codes`.
    pub fn of(codes: &[Code]) -> Codes {
        Codes(codes.iter().fold(0, |bits, c| bits | 1 << c.0))
    }

    /// Whether `code` is in the set.
    pub fn contains(self, code: Code) -> bool {
        self.0 & (1 << code.0) != 0
    }

    /// The codes in the set, in number order.
    pub fn iter(self) -> impl Iterator<Item = Code> {
        (0..Code::NAMES.len() as u8).map(Code).filter(move |c| self.contains(*c))
    }
}

/// How a cluster's gRPC answers count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct GrpcPolicy {
    /// Statuses that are the member's failure (`grpc_failure_codes`): counted as a 5xx is.
    pub failure_codes: Codes,
    /// Statuses of a trailers-only answer that send the call to another member
    /// (`retry.retry_on`), as a retry within the retry budget.
    pub retry_on: Codes,
}

impl GrpcPolicy {
    /// Whether `code` is the member's failure (counted like a 5xx), not an answer: an
    /// application's own error, such as `not-found`, is an answer.
    pub fn is_failure(&self, code: Code) -> bool {
        self.failure_codes.contains(code)
    }

    /// Whether a trailers-only answer with `code` sends the call to another member
    /// (`retry.retry_on`): the try then fails as [`crate::TryFailure::DECLINED`].
    pub fn retries(&self, code: Code) -> bool {
        self.retry_on.contains(code)
    }

    /// The default failure codes: the server could not serve the call (`unavailable`,
    /// `unimplemented`), or broke while serving it (`internal`, `unknown`).
    pub const DEFAULT_FAILURE_CODES: [Code; 4] =
        [Code::UNAVAILABLE, Code::UNIMPLEMENTED, Code::INTERNAL, Code::UNKNOWN];
}

impl Default for GrpcPolicy {
    fn default() -> Self {
        GrpcPolicy {
            failure_codes: Codes::of(&GrpcPolicy::DEFAULT_FAILURE_CODES),
            retry_on: Codes::NONE,
        }
    }
}

/// Whether a request (or response) with this `content-type` is gRPC: `application/grpc`,
/// alone or with a suffix (`+proto`, `+json`, `;charset=...`). The one check a non-gRPC request
/// pays.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    value.starts_with(b"application/grpc")
}

/// A `grpc-status` value: a decimal number (leading and trailing spaces allowed); `None` when
/// it is not one. A number gRPC does not define reads as [`Code::UNKNOWN`].
pub fn parse_status(value: &[u8]) -> Option<Code> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(Code::from_number(u32::try_from(n).unwrap_or(u32::MAX)))
}

/// The most digits a `grpc-timeout` value has (gRPC's `TimeoutValue → {positive integer as
/// ASCII string of at most 8 digits}`).
pub const TIMEOUT_DIGITS: usize = 8;

/// A `grpc-timeout` value: 1 to 8 digits and a unit, `H` hours, `M` minutes, `S` seconds, `m`
/// milliseconds, `u` microseconds, `n` nanoseconds; `None` for anything else.
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > TIMEOUT_DIGITS || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    // At most 99,999,999: every unit's product fits a u64 of nanoseconds or seconds.
    let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `d` as a `grpc-timeout` value: the finest unit whose count fits 8 digits, rounded down (a
/// member is never given more time than is left).
pub fn encode_timeout(d: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = d.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per, unit) in units {
        if nanos / per <= MAX {
            return format!("{}{unit}", nanos / per);
        }
    }
    format!("{MAX}H")
}

/// `message` as `grpc-message` carries it: percent-encoded, every byte outside printable ASCII
/// (0x20-0x7E) and `%` itself as `%XX` (gRPC's `Percent-Byte-Unencoded`).
pub fn encode_message(message: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codes_by_name_and_number() {
        assert_eq!(Code::parse("unavailable"), Some(Code::UNAVAILABLE));
        assert_eq!(Code::parse("UNAVAILABLE"), Some(Code::UNAVAILABLE));
        assert_eq!(Code::parse("resource_exhausted"), Some(Code::RESOURCE_EXHAUSTED));
        assert_eq!(Code::parse("unavailible"), None);
        assert_eq!(Code::from_number(14), Code::UNAVAILABLE);
        assert_eq!(Code::from_number(17), Code::UNKNOWN);
        for (i, name) in Code::NAMES.iter().enumerate() {
            let code = Code::parse(name).unwrap();
            assert_eq!((code.number(), code.name()), (i as u32, *name));
        }
    }

    #[test]
    fn status_values() {
        assert_eq!(parse_status(b"0"), Some(Code::OK));
        assert_eq!(parse_status(b" 14 "), Some(Code::UNAVAILABLE));
        assert_eq!(parse_status(b"99"), Some(Code::UNKNOWN));
        assert_eq!(parse_status(b"99999999999999999999"), None);
        for bad in [&b""[..], b"-1", b"1 4", b"x", b"14a"] {
            assert_eq!(parse_status(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn timeout_values() {
        assert_eq!(parse_timeout(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_timeout(b"5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_timeout(b"7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_timeout(b"99999999H"), Some(Duration::from_secs(99_999_999 * 3600)));
        for bad in [&b""[..], b"m", b"100", b"123456789m", b"10s", b"1.5S", b" 1S", b"-1S"] {
            assert_eq!(parse_timeout(bad), None, "{bad:?}");
        }
        assert_eq!(encode_timeout(Duration::from_millis(100)), "100000u");
        assert_eq!(encode_timeout(Duration::from_millis(99)), "99000000n");
        assert_eq!(encode_timeout(Duration::ZERO), "0n");
        assert_eq!(encode_timeout(Duration::from_secs(u64::MAX)), "99999999H");
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(encode_message("no member: 100% down"), "no member: 100%25 down");
        assert_eq!(encode_message("café\n"), "caf%C3%A9%0A");
    }

    #[test]
    fn default_failure_codes_are_the_servers_and_others_are_answers() {
        let p = GrpcPolicy::default();
        for code in ["unavailable", "unimplemented", "internal", "unknown"] {
            assert!(p.is_failure(Code::parse(code).unwrap()), "{code}");
        }
        for code in ["ok", "not-found", "cancelled", "deadline-exceeded", "resource-exhausted"] {
            assert!(!p.is_failure(Code::parse(code).unwrap()), "{code}");
        }
        let only_internal = GrpcPolicy { failure_codes: Codes::of(&[Code::INTERNAL]), ..p };
        assert!(!only_internal.is_failure(Code::UNAVAILABLE));
        assert!(only_internal.is_failure(Code::INTERNAL));
        assert_eq!(Codes::of(&GrpcPolicy::DEFAULT_FAILURE_CODES).iter().count(), 4);
    }

    #[test]
    fn content_types() {
        assert!(is_grpc_content_type(b"application/grpc"));
        assert!(is_grpc_content_type(b"application/grpc+proto"));
        assert!(!is_grpc_content_type(b"application/json"));
        assert!(!is_grpc_content_type(b"application/grp"));
    }

    proptest! {
        /// Every duration encodes to a value that parses back within the encoding's unit,
        /// never above the duration.
        #[test]
        fn timeouts_round_trip(nanos in 0u64..u64::MAX) {
            let d = Duration::from_nanos(nanos);
            let encoded = encode_timeout(d);
            let back = parse_timeout(encoded.as_bytes()).unwrap();
            prop_assert!(back <= d);
            let unit = parse_timeout(format!("1{}", encoded.chars().last().unwrap()).as_bytes())
                .unwrap();
            prop_assert!(d - back < unit);
        }

        /// Whatever bytes arrive, the parser answers without panicking, and only for 1-8 digits
        /// and a known unit.
        #[test]
        fn any_timeout_bytes(value in proptest::collection::vec(any::<u8>(), 0..12)) {
            let parsed = parse_timeout(&value);
            let shaped = value.len() >= 2
                && value.len() <= TIMEOUT_DIGITS + 1
                && value[..value.len() - 1].iter().all(u8::is_ascii_digit)
                && b"HMSmun".contains(&value[value.len() - 1]);
            prop_assert_eq!(parsed.is_some(), shaped);
        }

        /// Numbers with a unit parse to exactly that many units.
        #[test]
        fn timeout_numbers(n in 0u64..=99_999_999, unit in 0usize..6) {
            let (c, per) = [
                ('n', 1u128), ('u', 1_000), ('m', 1_000_000), ('S', 1_000_000_000),
                ('M', 60_000_000_000), ('H', 3_600_000_000_000),
            ][unit];
            let d = parse_timeout(format!("{n}{c}").as_bytes()).unwrap();
            prop_assert_eq!(d.as_nanos(), u128::from(n) * per);
        }
    }
}
