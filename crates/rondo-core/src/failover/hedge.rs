//! Hedged requests (`retry.hedge`): when a request's first try has no answer after `after`, a
//! second try starts on another member of the same cluster, and the first answer wins (Dean
//! and Barroso, "The Tail at Scale", CACM 2013: "hedged requests"). Decided here, purely: which
//! requests may be hedged ([`Hedge::applies`]) and whether the engine lets another hedge go now
//! ([`Failover::may_hedge`], [`Failover::hedging`]); the caller races the tries.
//!
//! A hedge is a retry for the engine's accounting: it takes the retry budget (so hedging backs
//! off with it under overload), counts against the cluster's `attempts`, is placed by the same
//! pick excluding the members tried, and meets `max_requests` like any try.

use std::time::Duration;

use super::Failover;
use crate::Instant;

/// A cluster's `retry.hedge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Hedge {
    /// How long a try may go without an answer before the next hedge starts.
    #[cfg_attr(feature = "serde", serde(rename = "after_ms", with = "crate::wire::millis"))]
    pub after: Duration,
    /// Hedges per request at most (besides the first try).
    pub max: u32,
}

impl Hedge {
    /// Whether a request may be hedged: its method is idempotent (or the cluster sends requests
    /// that are not elsewhere, `retry_non_idempotent`), and it can be sent twice at once (no
    /// body, or one held whole: `replayable_at_once`).
    pub fn applies(
        &self,
        idempotent: bool,
        non_idempotent_ok: bool,
        replayable_at_once: bool,
    ) -> bool {
        self.max > 0 && (idempotent || non_idempotent_ok) && replayable_at_once
    }
}

impl Failover {
    /// Whether another hedge may start at `now`, `hedged` having started already: fewer than
    /// the policy's `max`, attempts left in the cluster, and the request's deadline ahead.
    pub fn may_hedge(&self, hedge: &Hedge, hedged: u32, now: Instant) -> bool {
        hedged < hedge.max
            && self.cluster().is_some()
            && self.here < self.max_here
            && now < self.deadline
    }

    /// The next try is a hedge: it is admitted as a retry (the retry budget is asked).
    pub fn hedging(&mut self) {
        self.sent = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failover::tests::balancer;
    use crate::{PickRequest, SplitMix64};

    const HEDGE: Hedge = Hedge { after: Duration::from_millis(50), max: 1 };

    #[test]
    fn only_idempotent_replayable_requests_are_hedged() {
        assert!(HEDGE.applies(true, false, true));
        assert!(!HEDGE.applies(false, false, true), "a POST without retry_non_idempotent");
        assert!(HEDGE.applies(false, true, true), "retry_non_idempotent");
        assert!(!HEDGE.applies(true, false, false), "a streamed body cannot be sent twice");
        assert!(!Hedge { max: 0, ..HEDGE }.applies(true, true, true));
    }

    /// Places a try on `b` as the router does: admit, pick excluding the tried, began.
    fn place(f: &mut Failover, b: &mut crate::Balancer, now: Instant) -> Option<usize> {
        f.admit(b, now).ok()?;
        let req = PickRequest { now, group: None, hash: None, context: None, exclude: f.tried() };
        let member = b.pick(&req, &mut SplitMix64::new(1)).ok()?.member;
        f.began(member);
        Some(member)
    }

    #[test]
    fn a_hedge_goes_to_another_member_within_attempts_and_the_budget() {
        let now = Instant::from_millis(1);
        let mut b = balancer(3, 2, 100);
        let mut f = Failover::new(1, true, now, Duration::from_secs(1));
        let first = place(&mut f, &mut b, now).expect("first");
        assert!(f.may_hedge(&HEDGE, 0, now));
        f.hedging();
        let second = place(&mut f, &mut b, now).expect("hedge");
        assert_ne!(first, second, "the hedge excludes the member tried");
        assert!(!f.may_hedge(&HEDGE, 1, now), "max 1");
        // Two attempts in the cluster: none left for a second hedge even if max allowed it.
        assert!(!f.may_hedge(&Hedge { max: 2, ..HEDGE }, 1, now));
        // Past the deadline: no hedge.
        let mut late = Failover::new(1, true, now, Duration::from_millis(10));
        place(&mut late, &mut b, now).expect("first");
        assert!(!late.may_hedge(&HEDGE, 0, now + Duration::from_millis(20)));
        // No retry budget: the hedge is refused as a retry would be.
        let mut broke = balancer(3, 3, 0);
        let mut f = Failover::new(1, true, now, Duration::from_secs(1));
        place(&mut f, &mut broke, now).expect("first");
        f.hedging();
        assert_eq!(f.admit(&mut broke, now), Err(crate::Stop::Budget));
    }
}
