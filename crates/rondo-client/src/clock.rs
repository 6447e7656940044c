//! The client's clock for the core: a monotonic origin taken once per process, so every
//! `std::time::Instant` maps onto the core's [`Instant`] the same way (as `rondo-runtime` does
//! for the router).

use std::sync::OnceLock;

use rondo_core::Instant;

fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Now, as the core counts time (nanoseconds since the process's first reading).
pub(crate) fn now() -> Instant {
    let since = std::time::Instant::now().saturating_duration_since(origin());
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
