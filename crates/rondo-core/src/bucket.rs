//! Token buckets as pure arithmetic: the `rate_limit` filter's [`Rate`] (parsed from `N/s`,
//! `N/m`, `N/h`) and one key's [`Bucket`], which the caller hands the time (`now`) of each
//! request. Exact integer math: a token is `per` nanoseconds × `count` units, so no rate
//! rounds up and, over any window `w`, a bucket admits at most `burst + rate × w` requests.

use std::time::Duration;

use crate::time::Instant;

/// A sustained rate: `count` requests per `per_secs` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Requests per period (at least 1).
    pub count: u64,
    /// The period in seconds: 1, 60 or 3600.
    pub per_secs: u64,
}

impl Rate {
    /// The largest `count` a rate may have.
    pub const MAX_COUNT: u64 = 1_000_000_000;

    /// Parses `N/s`, `N/m` or `N/h` (`N` from 1 to [`Rate::MAX_COUNT`]).
    pub fn parse(text: &str) -> Result<Rate, String> {
        let expected = || format!("`{text}` is not a rate: expected `N/s`, `N/m` or `N/h`");
        let (n, unit) = text.trim().split_once('/').ok_or_else(expected)?;
        let per_secs = match unit.trim() {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            _ => return Err(expected()),
        };
        let n = n.trim();
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(expected());
        }
        match n.parse::<u64>() {
            Ok(0) => Err(format!("`{text}` admits nothing: a rate is at least 1")),
            Ok(count) if count <= Rate::MAX_COUNT => Ok(Rate { count, per_secs }),
            _ => Err(format!("`{text}`: a rate is at most {} per period", Rate::MAX_COUNT)),
        }
    }

    /// Requests per second, rounded up (at least 1): a bucket's default burst.
    pub fn per_second(&self) -> u64 {
        self.count.div_ceil(self.per_secs).max(1)
    }

    /// One token, in bucket units (the period in nanoseconds).
    fn token(&self) -> u128 {
        u128::from(self.per_secs) * 1_000_000_000
    }
}

/// What one request found in its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Whether the request may go on (it took a token).
    pub admitted: bool,
    /// Whole tokens left after it.
    pub remaining: u64,
    /// Time until the next token (zero while one is left).
    pub next_token: Duration,
    /// Time until `remaining` grows by one (a bucket is never full right after a take: it
    /// either gave a token or had less than one).
    pub more_in: Duration,
}

/// One key's bucket: its level (a token being the period in nanoseconds, refilled by `count` a
/// nanosecond) at the instant it was last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    level: u128,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `burst` tokens at `now`.
    pub fn full(rate: &Rate, burst: u64, now: Instant) -> Bucket {
        Bucket { level: rate.token() * u128::from(burst), at: now }
    }

    /// Refills the bucket for the time since it was last seen, then takes one token if there
    /// is one. `now` earlier than the last call counts as no time passed.
    pub fn take(&mut self, rate: &Rate, burst: u64, now: Instant) -> Taken {
        let token = rate.token();
        let capacity = token * u128::from(burst);
        let count = u128::from(rate.count);
        if now > self.at {
            let refill = u128::from(now.0 - self.at.0).saturating_mul(count);
            self.level = self.level.saturating_add(refill).min(capacity);
            self.at = now;
        }
        let admitted = self.level >= token;
        if admitted {
            self.level -= token;
        }
        // Nanoseconds until the level reaches `target`, rounded up.
        let until = |target: u128| {
            let nanos = divide(target.saturating_sub(self.level), count, true);
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        };
        let whole = divide(self.level, token, false);
        Taken {
            admitted,
            remaining: u64::try_from(whole).unwrap_or(u64::MAX),
            next_token: until(token),
            more_in: until((whole + 1) * token),
        }
    }
}

/// `a / b` (`b > 0`), rounded up when `up`: in 64 bits when both fit, as they do but for
/// bursts of billions (one machine division rather than the 128-bit routine, for every
/// rate-limited request).
fn divide(a: u128, b: u128, up: bool) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) if up => u128::from(a.div_ceil(b)),
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ if up => a.div_ceil(b),
        _ => a / b,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const R100: Rate = Rate { count: 100, per_secs: 1 };

    #[test]
    fn rates_parse_and_refuse_garbage() {
        assert_eq!(Rate::parse("100/s"), Ok(R100));
        assert_eq!(Rate::parse("7/m"), Ok(Rate { count: 7, per_secs: 60 }));
        assert_eq!(Rate::parse("1/h"), Ok(Rate { count: 1, per_secs: 3600 }));
        assert!(Rate::parse("0/s").unwrap_err().contains("at least 1"));
        for bad in ["100", "100/", "/s", "x/s", "-1/s", "1.5/s", "100/d", "1e3/s", ""] {
            assert!(Rate::parse(bad).unwrap_err().contains("not a rate"), "{bad}");
        }
        assert!(Rate::parse("1000000001/s").unwrap_err().contains("at most"));
        assert_eq!(R100.per_second(), 100);
        assert_eq!(Rate { count: 7, per_secs: 60 }.per_second(), 1);
        assert_eq!(Rate { count: 90, per_secs: 60 }.per_second(), 2);
    }

    #[test]
    fn a_full_bucket_admits_its_burst_then_one_token_per_interval() {
        let t0 = Instant::from_millis(1000);
        let mut b = Bucket::full(&R100, 200, t0);
        for i in 0..200 {
            let t = b.take(&R100, 200, t0);
            assert!(t.admitted, "request {i}");
            assert_eq!(t.remaining, 199 - i);
        }
        let refused = b.take(&R100, 200, t0);
        assert!(!refused.admitted);
        assert_eq!(refused.next_token, Duration::from_millis(10));
        assert_eq!(refused.more_in, Duration::from_millis(10));
        // 9 ms later there is still no token; at 10 ms there is one.
        assert!(!b.take(&R100, 200, t0 + Duration::from_millis(9)).admitted);
        let t = b.take(&R100, 200, t0 + Duration::from_millis(10));
        assert!(t.admitted);
        assert_eq!(t.remaining, 0);
        // A clock that goes back is no time at all.
        assert!(!b.take(&R100, 200, t0).admitted);
        // Long idle fills it to the burst, no further.
        let t = b.take(&R100, 200, t0 + Duration::from_secs(3600));
        assert_eq!((t.admitted, t.remaining, t.more_in), (true, 199, Duration::from_millis(10)));
        // Between whole tokens, the next one is nearer.
        let mut two = Bucket::full(&R100, 2, t0);
        assert!(two.take(&R100, 2, t0).admitted);
        let t = two.take(&R100, 2, t0 + Duration::from_millis(4));
        assert_eq!((t.admitted, t.remaining, t.more_in), (true, 0, Duration::from_millis(6)));
        assert_eq!(t.next_token, Duration::from_millis(6));
    }

    #[test]
    fn divisions_in_64_bits_are_those_in_128() {
        let big = u128::from(u64::MAX);
        for (a, b) in
            [(0, 1), (7, 2), (big, 3), (big + 5, 7), (u128::MAX, 1_000_000_000), (10, big + 1)]
        {
            assert_eq!(divide(a, b, false), a / b, "{a} / {b}");
            assert_eq!(divide(a, b, true), a.div_ceil(b), "{a} / {b} up");
        }
    }

    #[test]
    fn slow_rates_refill_exactly() {
        let r = Rate { count: 1, per_secs: 3600 };
        let mut b = Bucket::full(&r, 1, Instant::ZERO);
        assert!(b.take(&r, 1, Instant::ZERO).admitted);
        let t = b.take(&r, 1, Instant::from_millis(1000));
        assert!(!t.admitted);
        assert_eq!(t.next_token, Duration::from_secs(3599));
        assert!(b.take(&r, 1, Instant::from_millis(3_600_000)).admitted);
    }

    proptest! {
        /// Over every window of a request sequence, admitted ≤ burst + rate × window, exactly
        /// (in bucket units); and a bucket that refuses admits again once `next_token` passed.
        #[test]
        fn admitted_never_exceeds_burst_plus_rate_times_window(
            count in 1u64..2000,
            per in prop_oneof![Just(1u64), Just(60), Just(3600)],
            burst in 1u64..300,
            gaps in proptest::collection::vec(0u64..20_000_000, 1..400),
        ) {
            let rate = Rate { count, per_secs: per };
            let mut now = Instant::from_millis(5);
            let mut b = Bucket::full(&rate, burst, now);
            let mut admitted_at = Vec::new();
            for gap in gaps {
                now = Instant(now.0 + gap);
                let t = b.take(&rate, burst, now);
                if t.admitted {
                    admitted_at.push(now.0);
                } else {
                    let mut later = b;
                    prop_assert!(later.take(&rate, burst, now + t.next_token).admitted);
                }
            }
            let token = u128::from(per) * 1_000_000_000;
            for i in 0..admitted_at.len() {
                for j in i..admitted_at.len() {
                    let n = (j - i + 1) as u128;
                    let window = u128::from(admitted_at[j] - admitted_at[i]);
                    prop_assert!(
                        n * token <= u128::from(burst) * token + window * u128::from(count),
                        "{n} admitted within {window} ns"
                    );
                }
            }
        }
    }
}
