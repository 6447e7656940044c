//! Time as a value. The core never reads a clock: every operation that depends on time takes an
//! [`Instant`] from the caller, so a test can replay any sequence of decisions exactly.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on the caller's monotonic clock, in nanoseconds since an arbitrary origin.
///
/// The runtime maps `std::time::Instant` onto it (nanoseconds since process start); tests count
/// from zero.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);
    /// Later than every real instant; used for "never expires".
    pub const NEVER: Instant = Instant(u64::MAX);

    /// An instant `ms` milliseconds after the origin (handy in tests).
    pub const fn from_millis(ms: u64) -> Instant {
        Instant(ms.saturating_mul(1_000_000))
    }

    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_sub(nanos))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:?}", Duration::from_nanos(self.0))
    }
}
