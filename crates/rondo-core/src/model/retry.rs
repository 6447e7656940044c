//! Retries and failover ([`RetryPolicy`]): tries per request, backoff, the statuses that
//! send a request to another member.

use std::time::Duration;

/// Retries and failover.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct RetryPolicy {
    /// Total tries per request across members of one cluster (1 = no retry).
    pub attempts: u32,
    /// Timeout of one try; `None` leaves only the route's request timeout.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "per_try_timeout_ms", with = "crate::wire::millis_opt")
    )]
    pub per_try_timeout: Option<Duration>,
    /// Retries may add at most this share of extra load, percent (Finagle retry budget).
    pub budget_percent: u8,
    /// Retries always allowed per second regardless of the ratio.
    pub budget_min_per_sec: u32,
    /// HTTP statuses a member may answer that send the request to another member instead
    /// (`retry_on`: `5xx`, `gateway-error`, `retriable-status:N`); empty: none.
    pub statuses: StatusSet,
    /// A pause before each retry (`backoff`); `None`: retried at once.
    pub backoff: Option<Backoff>,
    /// Whether a request that is not idempotent (a POST) may go to another member after one
    /// failed with it (`retry_non_idempotent`, WCF's behaviour); its body is kept for that.
    pub non_idempotent: bool,
    /// The most request body bytes kept to send again (`retry_buffer_bytes`): a longer body is
    /// not retried once sent.
    pub buffer_bytes: u32,
    /// A second try for a slow answer (`hedge`); `None`: no hedging.
    pub hedge: Option<crate::failover::hedge::Hedge>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            per_try_timeout: None,
            budget_percent: 20,
            budget_min_per_sec: 10,
            statuses: StatusSet::EMPTY,
            backoff: None,
            non_idempotent: false,
            buffer_bytes: RetryPolicy::DEFAULT_BUFFER_BYTES,
            hedge: None,
        }
    }
}

impl RetryPolicy {
    /// [`RetryPolicy::buffer_bytes`]'s default: 64 KiB.
    pub const DEFAULT_BUFFER_BYTES: u32 = 64 * 1024;

    /// The pause before retry number `retry` (1 for the first retry): "full jitter", a uniform
    /// draw below `base · 2^(retry−1)` capped at `max`; zero without a backoff.
    pub fn backoff_delay(&self, retry: u32, rng: &mut dyn crate::Entropy) -> Duration {
        let Some(b) = self.backoff else { return Duration::ZERO };
        let doubled = b.base.saturating_mul(1 << retry.saturating_sub(1).min(20));
        let cap = doubled.min(b.max).as_micros().min(u128::from(u64::MAX)) as u64;
        if cap == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(rng.next_u64() % (cap + 1))
    }
}

/// Exponential backoff between retries (`retry.backoff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Backoff {
    /// The first retry's ceiling.
    pub base: Duration,
    /// The largest ceiling.
    pub max: Duration,
}

/// A set of HTTP statuses (100 to 611), for `retry_on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StatusSet {
    bits: [u64; 8],
    /// Whether any bit is set: the router asks on every request whether a route's clusters
    /// retry on statuses, and one byte answers it.
    any: bool,
}

impl StatusSet {
    /// No status.
    pub const EMPTY: StatusSet = StatusSet { bits: [0; 8], any: false };

    /// `self` with `status` added (one outside 100-611 is left out).
    pub fn with(mut self, status: u16) -> StatusSet {
        if let Some(i) = status.checked_sub(100).map(usize::from).filter(|i| *i < 512) {
            self.bits[i / 64] |= 1 << (i % 64);
            self.any = true;
        }
        self
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        self.any
            && status
                .checked_sub(100)
                .map(usize::from)
                .filter(|i| *i < 512)
                .is_some_and(|i| self.bits[i / 64] & (1 << (i % 64)) != 0)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        !self.any
    }
}
