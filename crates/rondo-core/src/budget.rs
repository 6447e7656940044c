//! The retry budget (Finagle's `RetryBudget`): retries may add at most `percent` % extra load on
//! top of a small floor of `min_per_sec` retries per second, so that when a whole cluster fails,
//! retries cannot multiply the load on it (a retry storm).
//!
//! Every request deposits `percent / 100` of a token; every retry withdraws one. Deposits fade
//! with a 10 s time constant (Finagle keeps them for a 10 s TTL), so a quiet minute does not
//! bank a burst of retries. The floor refills continuously at `min_per_sec` up to one second's
//! worth. Time is an argument, like everywhere in the core.

use std::time::Duration;

use crate::load::exp_neg;
use crate::time::Instant;

/// How long deposits last (as an exponential time constant).
const MEMORY: Duration = Duration::from_secs(10);
/// `1 / MEMORY` in 1/s.
const INV_MEMORY_S: f64 = 1.0 / MEMORY.as_secs_f64();

/// A retry budget; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryBudget {
    ratio: f64,
    min_per_sec: f64,
    balance: f64,
    floor: f64,
    stamp: Instant,
}

impl RetryBudget {
    /// A budget allowing `percent` % extra load plus `min_per_sec` retries per second.
    pub fn new(percent: u8, min_per_sec: u32, now: Instant) -> Self {
        RetryBudget {
            ratio: f64::from(percent) / 100.0,
            min_per_sec: f64::from(min_per_sec),
            balance: 0.0,
            floor: f64::from(min_per_sec),
            stamp: now,
        }
    }

    fn advance(&mut self, now: Instant) {
        // Nanoseconds as a float and multiplications by constants: no integer division into a
        // `Duration` and no float division on every request.
        let elapsed_ns = now.0.saturating_sub(self.stamp.0);
        if elapsed_ns == 0 {
            return;
        }
        self.stamp = now;
        let elapsed_s = elapsed_ns as f64 * 1e-9;
        self.balance *= exp_neg(elapsed_s * INV_MEMORY_S);
        self.floor = (self.floor + self.min_per_sec * elapsed_s).min(self.min_per_sec);
    }

    /// A request (not a retry) was made.
    pub fn deposit(&mut self, now: Instant) {
        self.advance(now);
        self.balance += self.ratio;
    }

    /// The banked deposits and the floor at `now`, for the process that takes over
    /// ([`crate::handoff`]).
    pub fn banked(&mut self, now: Instant) -> (f64, f64) {
        self.advance(now);
        (self.balance, self.floor)
    }

    /// Takes over `banked` deposits and floor (a previous process's [`RetryBudget::banked`]),
    /// each bounded by what this budget could hold, at `now`.
    pub fn restore(&mut self, (balance, floor): (f64, f64), now: Instant) {
        self.stamp = now;
        self.balance = if balance.is_finite() { balance.max(0.0) } else { 0.0 };
        self.floor = if floor.is_finite() { floor.clamp(0.0, self.min_per_sec) } else { 0.0 };
    }

    /// Whether one retry may be made now; if so it is withdrawn.
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        self.advance(now);
        if self.floor >= 1.0 {
            self.floor -= 1.0;
            true
        } else if self.balance >= 1.0 {
            self.balance -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_cluster_gets_at_most_the_ratio_plus_the_floor() {
        // 1,000 requests/s for 10 s, every one failing and wanting to retry once.
        let mut b = RetryBudget::new(20, 10, Instant::ZERO);
        let mut retries = 0u32;
        for i in 0..10_000u64 {
            let now = Instant(i * 1_000_000);
            b.deposit(now);
            if b.try_withdraw(now) {
                retries += 1;
            }
        }
        // 20 % of 10,000 plus 10 per second for 10 s plus the initial second's floor.
        assert!(retries <= 2_000 + 100 + 10, "{retries} retries");
        assert!(retries >= 1_800, "the budget should be usable: {retries}");
    }

    #[test]
    fn the_floor_allows_retries_at_low_rates() {
        let mut b = RetryBudget::new(20, 10, Instant::ZERO);
        // One request per second, each retried: the floor covers it.
        for s in 0..20u64 {
            let now = Instant::from_millis(s * 1000);
            b.deposit(now);
            assert!(b.try_withdraw(now), "second {s}");
        }
    }

    #[test]
    fn without_floor_or_deposits_nothing_is_allowed() {
        let mut b = RetryBudget::new(0, 0, Instant::ZERO);
        b.deposit(Instant::ZERO);
        assert!(!b.try_withdraw(Instant::ZERO));
    }

    #[test]
    fn old_deposits_fade() {
        let mut b = RetryBudget::new(100, 0, Instant::ZERO);
        for _ in 0..50 {
            b.deposit(Instant::ZERO);
        }
        // A minute later almost nothing is left of 50 tokens.
        let later = Instant::from_millis(60_000);
        let mut n = 0;
        while b.try_withdraw(later) {
            n += 1;
        }
        assert!(n <= 1, "{n}");
    }
}
