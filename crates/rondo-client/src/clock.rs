//! The client's clock for the core: a monotonic origin taken once per process, so every
//! `std::time::Instant` maps onto the core's [`Instant`] the same way (as `rondo-runtime` does
//! for the router).
//!
//! Readings come from tokio's clock, which is the std clock unless a test paused tokio's time:
//! then the core, the tries' deadlines and the latencies all see the same paused time. A try
//! reads it once at its start (the pick's time, the ticket's start, the deadline's base) and
//! once at its end (the latency and the core's end of the request).

use std::sync::OnceLock;

use rondo_core::Instant;

fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Now, as the core counts time (nanoseconds since the process's first reading).
pub(crate) fn now() -> Instant {
    from_std(instant())
}

/// Now, as a std instant read from tokio's clock (the std clock outside a runtime).
pub(crate) fn instant() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A reading of the std clock, as the core counts time.
pub(crate) fn from_std(t: std::time::Instant) -> Instant {
    let since = t.saturating_duration_since(origin());
    Instant(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_only_moves_forward() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::now();
        assert!(b.since(a) >= std::time::Duration::from_millis(2));
    }
}
