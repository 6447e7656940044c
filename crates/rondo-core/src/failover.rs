//! The failover engine: one request's tries, across its clusters and their members, under the
//! retry policy and the retry budget. The one loop over a request's tries is its driver,
//! [`drive()`] (in [`mod@drive`]): the router's HTTP and TCP paths, queue deliveries and the client
//! library run it (or, the client, step through its halves); none keeps a loop of its own.
//!
//! A caller asks [`Failover::cluster`] where the next try goes, and then, under that cluster's
//! lock, [`Failover::admit`] (which deposits into or withdraws from the cluster's retry budget in
//! the same lock hold as the pick that follows) and picks a member excluding
//! [`Failover::tried`]. It reports [`Failover::began`] with the member, or
//! [`Failover::none_eligible`] when the cluster had no one to offer. When a try fails, the caller
//! classifies the failure once ([`TryFailure`]) and [`Failover::failed`] decides whether the
//! request goes on, and where. Time is an argument, as everywhere in the core.
//!
//! The rules, which are the router's and the client's alike:
//! - up to `retry.attempts` tries per cluster, then the next cluster (the route's backups, in
//!   order); a cluster with no eligible member is skipped;
//! - never a member already tried in this cluster (the pick excludes them);
//! - a failure of the request itself (not of the member) ends the request;
//! - a request whose body can no longer be replayed is never sent again;
//! - a request whose bytes may have reached a member goes again only when it is idempotent;
//! - a try after a failure that reached a member (a reset, a timeout, a bad answer) is a retry:
//!   it must fit the retry budget of the cluster it goes to (Finagle's budget; a refused
//!   connection sent nothing and loaded nobody, so moving on after it is free); the request
//!   deposits into its first cluster's budget once;
//! - nothing starts after the request's deadline, and a try never runs past it.

use std::time::Duration;

use crate::{Balancer, Instant};

pub mod drive;
pub mod hedge;
pub use drive::{Placement, TryMaker, drive};

/// What one failed try was, as far as failing over is concerned; the caller classifies its
/// failure once, here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TryFailure {
    /// Whether any byte of the request may have reached the member (false for a refused
    /// connection, a host name that did not resolve, a try that never left).
    pub reached: bool,
    /// Whether another member might succeed where this one failed: true for the member's
    /// failures (connection, reset, timeout, a broken answer), false for the request's own (its
    /// body broke off or was too large).
    pub member_failed: bool,
    /// Whether the request can still be sent again (its body was not consumed).
    pub replayable: bool,
    /// Whether the member declined the request in a way its cluster's policy lets go elsewhere
    /// whatever the method (a gRPC trailers-only answer with a status in `retry.retry_on`): a
    /// retry, within the budget, even of a request that is not idempotent.
    pub declined: bool,
}

impl TryFailure {
    /// A failure before anything was sent (refused, unresolved, never left), the request intact.
    pub const NOTHING_SENT: TryFailure =
        TryFailure { reached: false, member_failed: true, replayable: true, declined: false };

    /// A member declined the call in a way its cluster retries elsewhere (a gRPC trailers-only
    /// answer whose status `retry.retry_on` names: [`crate::grpc::GrpcPolicy::retries`]).
    pub const DECLINED: TryFailure =
        TryFailure { reached: true, member_failed: true, replayable: true, declined: true };

    /// A member's failure after the request may have reached it.
    pub fn after_sending(replayable: bool) -> TryFailure {
        TryFailure { reached: true, member_failed: true, replayable, declined: false }
    }
}

/// Why a request stops trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Every cluster ran out of attempts or eligible members.
    Exhausted,
    /// The failure cannot be retried: the request's own, a body that cannot be replayed, or a
    /// non-idempotent request that may have reached its member.
    NotRetryable,
    /// The request's deadline passed.
    Deadline,
    /// The retry budget of the cluster the next try would go to is spent.
    Budget,
}

/// One request's tries; see the module docs.
#[derive(Debug, Clone)]
pub struct Failover {
    clusters: usize,
    cluster: usize,
    idempotent: bool,
    deadline: Instant,
    /// Tries begun in the current cluster, and its policy's limit (read by `admit` at its
    /// first try).
    here: u32,
    max_here: u32,
    per_try: Option<Duration>,
    /// Members tried in the current cluster.
    tried: Tried,
    total: u32,
    /// A try failed after reaching its member: later tries are retries.
    sent: bool,
    deposited: bool,
}

impl Failover {
    /// A request over `clusters` clusters (the primary, then backups), started at `now` with
    /// `timeout` for all of it.
    pub fn new(clusters: usize, idempotent: bool, now: Instant, timeout: Duration) -> Self {
        Failover {
            clusters,
            cluster: 0,
            idempotent,
            deadline: now + timeout,
            here: 0,
            max_here: 1,
            per_try: None,
            tried: Tried::Inline([0; TRIED_INLINE], 0),
            total: 0,
            sent: false,
            deposited: false,
        }
    }

    /// The index of the cluster the next try goes to; `None` when every cluster is done.
    pub fn cluster(&self) -> Option<usize> {
        (self.cluster < self.clusters).then_some(self.cluster)
    }

    /// Members already tried in the current cluster: the pick must exclude them.
    pub fn tried(&self) -> &[usize] {
        match &self.tried {
            Tried::Inline(members, n) => &members[..usize::from(*n)],
            Tried::Heap(members) => members,
        }
    }

    /// Tries begun so far, over all clusters.
    pub fn tries(&self) -> u32 {
        self.total
    }

    /// Whether a try failed after reaching its member (later tries are retries).
    pub fn retrying(&self) -> bool {
        self.sent
    }

    /// Admits the next try into the current cluster, whose balancer `b` the caller holds locked
    /// for the pick that follows: the request's one deposit into the retry budget, or, for a
    /// retry, a withdrawal from it. `Err(Stop::Budget)` when the budget is spent (the request
    /// stops there: it is not sent to a backup either, whose budget would hide the overload).
    pub fn admit(&mut self, b: &mut Balancer, now: Instant) -> Result<(), Stop> {
        if self.here == 0 {
            let retry = &b.spec().policy.retry;
            self.max_here = retry.attempts.max(1);
            self.per_try = retry.per_try_timeout;
        }
        if self.sent {
            if !b.retry_allowed(now) {
                return Err(Stop::Budget);
            }
        } else if !self.deposited {
            b.note_request(now);
            self.deposited = true;
        }
        Ok(())
    }

    /// The admitted try was placed on `member`.
    pub fn began(&mut self, member: usize) {
        match &mut self.tried {
            Tried::Inline(members, n) if usize::from(*n) < TRIED_INLINE => {
                members[usize::from(*n)] = member;
                *n += 1;
            }
            Tried::Inline(members, _) => {
                let mut heap = members.to_vec();
                heap.push(member);
                self.tried = Tried::Heap(heap);
            }
            Tried::Heap(members) => members.push(member),
        }
        self.here += 1;
        self.total += 1;
    }

    /// The current cluster had no eligible member for the admitted try: on to the next cluster.
    pub fn none_eligible(&mut self) {
        self.next_cluster();
    }

    /// How long the try begun at `now` may take: the cluster's per-try timeout, within the
    /// request's deadline.
    pub fn try_timeout(&self, now: Instant) -> Duration {
        let remaining = self.deadline.since(now);
        self.per_try.map_or(remaining, |t| t.min(remaining))
    }

    /// The request's deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The try begun last failed as `failure`, seen at `now`: `Ok` when the request goes on
    /// (ask [`Failover::cluster`] where), or why it stops.
    pub fn failed(&mut self, failure: TryFailure, now: Instant) -> Result<(), Stop> {
        self.sent |= failure.reached;
        let unsafe_again = failure.reached && !self.idempotent && !failure.declined;
        if !failure.member_failed || !failure.replayable || unsafe_again {
            return Err(Stop::NotRetryable);
        }
        if now >= self.deadline {
            return Err(Stop::Deadline);
        }
        if self.here >= self.max_here {
            self.next_cluster();
        }
        if self.cluster().is_none() {
            return Err(Stop::Exhausted);
        }
        Ok(())
    }

    fn next_cluster(&mut self) {
        self.cluster += 1;
        self.here = 0;
        match &mut self.tried {
            Tried::Inline(_, n) => *n = 0,
            Tried::Heap(members) => members.clear(),
        }
    }
}

/// Members tried in a cluster held inline up to this many (a request rarely tries more).
const TRIED_INLINE: usize = 4;

/// The members tried in the current cluster: inline for the first [`TRIED_INLINE`], on the heap
/// past them. A `Vec` allocated on every request's first try (its `push`), on every path that
/// drives the engine.
#[derive(Debug, Clone)]
enum Tried {
    Inline([usize; TRIED_INLINE], u8),
    Heap(Vec<usize>),
}

/// Whether a request with this method may be sent twice with the same effect (RFC 9110
/// section 9.2.2), so that it may go to another member after one may have acted on it.
pub fn is_idempotent_method(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterSpec, MemberSpec, Policy, RetryPolicy, UpstreamProtocol};

    pub(super) fn balancer(members: usize, attempts: u32, budget_min_per_sec: u32) -> Balancer {
        let members = (0..members)
            .map(|i| MemberSpec {
                name: format!("m{i}"),
                address: format!("127.0.0.1:{}", 9000 + i),
                weight: 100,
                group: None,
                admin: Default::default(),
            })
            .collect();
        let retry = RetryPolicy {
            attempts,
            budget_min_per_sec,
            budget_percent: 0,
            ..RetryPolicy::default()
        };
        let spec = ClusterSpec {
            name: "c".to_owned(),
            members,
            policy: Policy { retry, ..Policy::default() },
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: Default::default(),
            upstream_tls: None,
        };
        Balancer::new(std::sync::Arc::new(spec), Instant::ZERO)
    }

    #[test]
    fn a_refused_connection_moves_on_for_free_and_a_reset_is_a_retry() {
        let mut b = balancer(3, 3, 0);
        let t = Instant::from_millis(1);
        let mut f = Failover::new(1, true, t, Duration::from_secs(1));
        f.admit(&mut b, t).unwrap();
        f.began(0);
        f.failed(TryFailure::NOTHING_SENT, t).unwrap();
        assert!(!f.retrying());
        f.admit(&mut b, t).unwrap();
        f.began(1);
        f.failed(TryFailure::after_sending(true), t).unwrap();
        assert!(f.retrying());
        // A budget of nothing (no floor, no ratio): the retry is refused.
        assert_eq!(f.admit(&mut b, t), Err(Stop::Budget));
        assert_eq!(f.tried(), &[0, 1]);
    }

    #[test]
    fn tried_members_are_kept_in_order_past_the_inline_ones() {
        let mut f = Failover::new(2, true, Instant::ZERO, Duration::from_secs(1));
        let members: Vec<usize> = (0..TRIED_INLINE + 3).map(|m| m * 7).collect();
        for (i, m) in members.iter().enumerate() {
            f.began(*m);
            assert_eq!(f.tried(), &members[..=i]);
        }
        // The next cluster starts with none tried, inline or not.
        f.none_eligible();
        assert_eq!(f.tried(), &[] as &[usize]);
        f.began(3);
        assert_eq!(f.tried(), &[3]);
    }

    #[test]
    fn attempts_run_out_per_cluster_then_the_next_cluster_starts_afresh() {
        let mut b = balancer(3, 2, 100);
        let t = Instant::from_millis(1);
        let mut f = Failover::new(2, true, t, Duration::from_secs(1));
        for (cluster, member) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            assert_eq!(f.cluster(), Some(cluster));
            f.admit(&mut b, t).unwrap();
            f.began(member);
            let r = f.failed(TryFailure::NOTHING_SENT, t);
            if (cluster, member) == (1, 1) {
                assert_eq!(r, Err(Stop::Exhausted));
            } else {
                r.unwrap();
            }
        }
        assert_eq!(f.tries(), 4);
    }

    #[test]
    fn what_stops_a_request() {
        let t = Instant::from_millis(1);
        let mut b = balancer(3, 3, 100);
        let run = |idempotent: bool, failure: TryFailure, now: Instant| {
            let mut b = balancer(3, 3, 100);
            let mut f = Failover::new(1, idempotent, t, Duration::from_millis(10));
            f.admit(&mut b, t).unwrap();
            f.began(0);
            f.failed(failure, now)
        };
        assert_eq!(run(false, TryFailure::after_sending(true), t), Err(Stop::NotRetryable));
        assert_eq!(run(false, TryFailure::NOTHING_SENT, t), Ok(()));
        assert_eq!(run(true, TryFailure::after_sending(false), t), Err(Stop::NotRetryable));
        // A declined answer goes elsewhere whatever the method, as a retry...
        let declined = TryFailure { declined: true, ..TryFailure::after_sending(true) };
        assert_eq!(run(false, declined, t), Ok(()));
        // ...but only with a body that can be sent again.
        let spent = TryFailure { declined: true, ..TryFailure::after_sending(false) };
        assert_eq!(run(false, spent, t), Err(Stop::NotRetryable));
        let own = TryFailure { member_failed: false, ..TryFailure::NOTHING_SENT };
        assert_eq!(run(true, own, t), Err(Stop::NotRetryable));
        assert_eq!(
            run(true, TryFailure::NOTHING_SENT, Instant::from_millis(11)),
            Err(Stop::Deadline)
        );
        // The per-try timeout stays within the deadline.
        let mut f = Failover::new(1, true, t, Duration::from_millis(10));
        f.admit(&mut b, t).unwrap();
        assert_eq!(f.try_timeout(Instant::from_millis(5)), Duration::from_millis(6));
        assert_eq!(f.try_timeout(Instant::from_millis(50)), Duration::ZERO);
    }

    #[test]
    fn idempotent_methods() {
        for m in ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"] {
            assert!(is_idempotent_method(m), "{m}");
        }
        for m in ["POST", "PATCH", "CONNECT", "get"] {
            assert!(!is_idempotent_method(m), "{m}");
        }
    }
}
