//! The one place that reads the wall of time for the core: a process-wide monotonic origin, so
//! every crate maps `std::time::Instant` to the core's `Instant` the same way.

use std::sync::OnceLock;

use rondo_core::Instant;

fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Now, as the core counts time (nanoseconds since the process's first reading).
pub fn now() -> Instant {
    from_std(std::time::Instant::now())
}

/// A `std` instant on the core's clock.
pub fn from_std(t: std::time::Instant) -> Instant {
    Instant(u64::try_from(t.saturating_duration_since(origin()).as_nanos()).unwrap_or(u64::MAX))
}

/// A core instant as a `std` instant.
pub fn to_std(t: Instant) -> std::time::Instant {
    origin() + std::time::Duration::from_nanos(t.0)
}
