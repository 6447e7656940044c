//! The one clock mapping of every balancing point: the pure core counts time as an
//! [`Instant`] of nanoseconds and never reads a clock, so whoever calls it maps
//! `std::time::Instant` onto that scale here, from one origin per process. The router
//! (`rondo-runtime`, `rondo-proxy`), the naming service and the client library then agree on
//! what a core instant means, also when one process holds several of them (a test, or a
//! service that embeds the client beside a router).
//!
//! Where a reading comes from is the caller's choice: the router reads the std clock
//! ([`now`]); the client library reads tokio's, so that a test that pauses tokio's time
//! pauses the core's too, and maps it with [`from_std`].

use std::sync::OnceLock;
use std::time::Duration;

use rondo_core::Instant;

fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Now, from the std clock, as the core counts time (nanoseconds since the process's first
/// reading).
pub fn now() -> Instant {
    from_std(std::time::Instant::now())
}

/// A `std` instant on the core's clock (instants before the origin map to zero).
pub fn from_std(t: std::time::Instant) -> Instant {
    Instant(u64::try_from(t.saturating_duration_since(origin()).as_nanos()).unwrap_or(u64::MAX))
}

/// A core instant as a `std` instant.
pub fn to_std(t: Instant) -> std::time::Instant {
    origin() + Duration::from_nanos(t.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_round_trip_and_only_move_forward() {
        let a = now();
        std::thread::sleep(Duration::from_millis(2));
        let b = now();
        assert!(b.since(a) >= Duration::from_millis(2));
        let t = std::time::Instant::now();
        let there_and_back = to_std(from_std(t));
        assert!(there_and_back.max(t) - there_and_back.min(t) < Duration::from_micros(1));
        // Before the origin: zero, not a wrap.
        let before = origin() - Duration::from_secs(1);
        assert_eq!(from_std(before), Instant::ZERO);
    }
}
