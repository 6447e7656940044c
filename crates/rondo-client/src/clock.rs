//! The client's clock for the core: readings mapped with `rondo-clock`, the one mapping every
//! balancing point shares (one origin per process: a client beside a router in one process
//! agrees with it on what a core instant means).
//!
//! Readings come from tokio's clock, which is the std clock unless a test paused tokio's time:
//! then the core, the tries' deadlines and the latencies all see the same paused time. A try
//! reads it once at its start (the pick's time, the ticket's start, the deadline's base) and
//! once at its end (the latency and the core's end of the request).

use rondo_core::Instant;

pub(crate) use rondo_clock::from_std;

/// Now, as the core counts time (nanoseconds since the process's first reading).
pub(crate) fn now() -> Instant {
    from_std(instant())
}

/// Now, as a std instant read from tokio's clock (the std clock outside a runtime).
pub(crate) fn instant() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
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
