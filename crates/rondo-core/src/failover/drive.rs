//! The failover driver: the one loop of a request's tries ([`drive()`]), written once over how a
//! caller places a try in a cluster and makes it ([`TryMaker`]). The router's HTTP and TCP paths
//! and queue deliveries run it. The client library's call future must have a name (a tower
//! service's response future, no box per call), so it cannot hold this `async fn`'s future: it
//! steps through the same two halves by hand, [`Failover::next_try`] to place the next try and
//! [`Failover::failed`] after one failed, and so keeps no loop of its own either.
//!
//! Pure like the rest of the core: the driver reads no clock (the caller's [`TryMaker::now`]
//! does) and needs no runtime (it only awaits the caller's tries).

use std::future::Future;

use super::{Failover, Stop, TryFailure};
use crate::Instant;

/// How the caller's placing of a try in one cluster ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<P> {
    /// The try was admitted ([`Failover::admit`]) and begun on a member ([`Failover::began`]);
    /// `P` is what the caller needs to make it.
    Placed(P),
    /// The cluster had no eligible member for it (or is not in the caller's view): the request
    /// moves on to the next cluster.
    NoEligible,
    /// The engine refused the try ([`Failover::admit`]: the retry budget is spent).
    Stop(Stop),
}

/// How a request's tries are placed and made: the one thing each caller of [`drive()`] writes.
pub trait TryMaker {
    /// What a placed try carries to [`TryMaker::attempt`] (its cluster and member).
    type Placed;
    /// What the caller keeps of a try while it runs, to judge it by (its member, say).
    type Held;
    /// What a try gives, for [`TryMaker::judge`].
    type Tried;
    /// What a try that ends the request gives (an answer, or the request's own failure).
    type Value;

    /// Now, on the core's clock: read once after each failed try, for the engine's verdict on
    /// it and for the next placement.
    fn now(&mut self) -> Instant;

    /// Places the next try in cluster `cluster` (0 the primary, then the backups in order) at
    /// `now`: under the cluster's lock, [`Failover::admit`], a pick excluding
    /// [`Failover::tried`], then [`Failover::began`].
    fn place(
        &mut self,
        cluster: usize,
        failover: &mut Failover,
        now: Instant,
    ) -> Placement<Self::Placed>;

    /// What to judge the placed try by, once it has run (its member, say).
    fn hold(&mut self, placed: &Self::Placed) -> Self::Held;

    /// Makes the placed try, within [`Failover::try_timeout`]. (The caller's own future for the
    /// try, awaited as it is: no future of the caller's wraps it, so the request path moves no
    /// extra state per try.) The engine is lent mutably so that a try may place hedges beside
    /// itself ([`super::hedge`]).
    fn attempt(
        &mut self,
        placed: Self::Placed,
        failover: &mut Failover,
    ) -> impl Future<Output = Self::Tried>;

    /// Judges the try `held` was kept for, which gave `tried`: the value that ends the request,
    /// or the try's failure, classified once.
    fn judge(&mut self, held: Self::Held, tried: Self::Tried) -> Result<Self::Value, TryFailure>;
}

/// Runs a request's tries: each placed where `failover` says (past clusters with no eligible
/// member), made and judged by `maker`, until one ends the request or the engine stops it.
/// `now` is the first placement's time (the reading the engine was started with).
pub async fn drive<T: TryMaker>(
    maker: &mut T,
    failover: &mut Failover,
    mut now: Instant,
) -> Result<T::Value, Stop> {
    loop {
        // The placed try is gone into its future before that is awaited: borrowed (by `hold`)
        // in the loop's scope, it would keep its room in the driver's state through every try.
        let (held, attempt) = {
            let placed = failover.next_try(now, |cluster, f, now| maker.place(cluster, f, now))?;
            let held = maker.hold(&placed);
            (held, maker.attempt(placed, failover))
        };
        let tried = attempt.await;
        let failure = match maker.judge(held, tried) {
            Ok(value) => return Ok(value),
            Err(failure) => failure,
        };
        now = maker.now();
        failover.failed(failure, now)?;
    }
}

impl Failover {
    /// Places the next try at `now` with `place` in the cluster the engine names, moving past
    /// clusters that have no eligible member; why the request stops when none takes it (every
    /// cluster done, or the engine refused the try).
    pub fn next_try<P>(
        &mut self,
        now: Instant,
        mut place: impl FnMut(usize, &mut Failover, Instant) -> Placement<P>,
    ) -> Result<P, Stop> {
        while let Some(cluster) = self.cluster() {
            match place(cluster, self, now) {
                Placement::Placed(p) => return Ok(p),
                Placement::NoEligible => self.none_eligible(),
                Placement::Stop(stop) => return Err(stop),
            }
        }
        Err(Stop::Exhausted)
    }
}

#[cfg(test)]
mod tests {
    use std::future::ready;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::*;
    use crate::failover::tests::balancer;
    use crate::{Balancer, PickRequest, SplitMix64};

    /// A fake try-maker over real balancers: each cluster's picker places the try, and each
    /// try's fate comes from a script (`None` answers).
    struct Fake {
        clusters: Vec<Balancer>,
        rng: SplitMix64,
        fates: std::vec::IntoIter<Option<TryFailure>>,
        /// The tries made, as (cluster, member).
        made: Vec<(usize, usize)>,
        /// Clusters that had no one to offer, in the order asked.
        none: Vec<usize>,
        now: Instant,
    }

    impl Fake {
        fn new(clusters: Vec<Balancer>, fates: Vec<Option<TryFailure>>) -> Self {
            Fake {
                clusters,
                rng: SplitMix64::new(7),
                fates: fates.into_iter(),
                made: Vec::new(),
                none: Vec::new(),
                now: Instant::from_millis(1),
            }
        }

        /// Drives a request over the fake's clusters to its end (the fake's tries are ready at
        /// once: one poll does it).
        fn run(&mut self, idempotent: bool) -> Result<(usize, usize), Stop> {
            let now = self.now;
            let mut f = Failover::new(self.clusters.len(), idempotent, now, Duration::from_secs(1));
            let mut run = pin!(drive(self, &mut f, now));
            match run.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(r) => r,
                Poll::Pending => panic!("the fake's tries are ready at once"),
            }
        }
    }

    impl TryMaker for Fake {
        type Placed = (usize, usize);
        type Held = (usize, usize);
        type Tried = Option<TryFailure>;
        type Value = (usize, usize);

        fn now(&mut self) -> Instant {
            self.now = self.now + Duration::from_millis(1);
            self.now
        }

        fn place(
            &mut self,
            cluster: usize,
            f: &mut Failover,
            now: Instant,
        ) -> Placement<(usize, usize)> {
            let b = &mut self.clusters[cluster];
            if let Err(stop) = f.admit(b, now) {
                return Placement::Stop(stop);
            }
            let req =
                PickRequest { now, group: None, hash: None, context: None, exclude: f.tried() };
            match b.pick(&req, &mut self.rng) {
                Ok(d) => {
                    f.began(d.member);
                    Placement::Placed((cluster, d.member))
                }
                Err(_) => {
                    self.none.push(cluster);
                    Placement::NoEligible
                }
            }
        }

        fn hold(&mut self, placed: &(usize, usize)) -> (usize, usize) {
            *placed
        }

        fn attempt(
            &mut self,
            placed: (usize, usize),
            _: &mut Failover,
        ) -> impl Future<Output = Option<TryFailure>> {
            self.made.push(placed);
            ready(self.fates.next().flatten())
        }

        fn judge(
            &mut self,
            placed: (usize, usize),
            failed: Option<TryFailure>,
        ) -> Result<(usize, usize), TryFailure> {
            failed.map_or(Ok(placed), Err)
        }
    }

    const REFUSED: Option<TryFailure> = Some(TryFailure::NOTHING_SENT);
    const RESET: Option<TryFailure> =
        Some(TryFailure { reached: true, member_failed: true, replayable: true, declined: false });

    fn clusters(each: &[(usize, u32)]) -> Vec<Balancer> {
        each.iter().map(|&(members, attempts)| balancer(members, attempts, 100)).collect()
    }

    #[test]
    fn tries_go_to_the_backups_in_order_each_member_once() {
        // Two attempts in the primary, three in each backup: every refusal moves on.
        let mut fake = Fake::new(clusters(&[(3, 2), (2, 3), (2, 3)]), vec![REFUSED; 5]);
        let (cluster, _) = fake.run(true).unwrap();
        assert_eq!(cluster, 2);
        let by_cluster: Vec<usize> = fake.made.iter().map(|&(c, _)| c).collect();
        assert_eq!(by_cluster, [0, 0, 1, 1, 2, 2]);
        for c in 0..3 {
            let mut members: Vec<usize> =
                fake.made.iter().filter(|&&(at, _)| at == c).map(|&(_, m)| m).collect();
            members.dedup();
            assert_eq!(members.len(), 2, "no member of cluster {c} tried twice: {:?}", fake.made);
        }
        // The first backup's two members ran out before its three attempts did.
        assert_eq!(fake.none, [1]);
        // Every cluster done: the request is exhausted.
        let mut fake = Fake::new(clusters(&[(1, 1), (1, 1)]), vec![REFUSED; 2]);
        assert_eq!(fake.run(true), Err(Stop::Exhausted));
        assert_eq!(fake.made, [(0, 0), (1, 0)]);
    }

    #[test]
    fn a_failure_that_cannot_be_retried_stops_the_request() {
        // A body consumed by the try: never sent again, though members and backups are left.
        let consumed = Some(TryFailure { replayable: false, ..TryFailure::NOTHING_SENT });
        let mut fake = Fake::new(clusters(&[(3, 3), (3, 3)]), vec![consumed]);
        assert_eq!(fake.run(true), Err(Stop::NotRetryable));
        assert_eq!(fake.made.len(), 1);
        // A non-idempotent request that may have reached its member.
        let mut fake = Fake::new(clusters(&[(3, 3)]), vec![RESET]);
        assert_eq!(fake.run(false), Err(Stop::NotRetryable));
        assert_eq!(fake.made.len(), 1);
        // The same request refused before anything was sent goes on.
        let mut fake = Fake::new(clusters(&[(3, 3)]), vec![REFUSED]);
        assert!(fake.run(false).is_ok());
        assert_eq!(fake.made.len(), 2);
    }

    #[test]
    fn a_spent_retry_budget_stops_the_request_without_a_backup() {
        // No budget (no floor, no ratio) in the primary: a reset's retry is refused there, and
        // the backup (which has budget) is not asked.
        let mut fake = Fake::new(vec![balancer(3, 3, 0), balancer(3, 3, 100)], vec![RESET]);
        assert_eq!(fake.run(true), Err(Stop::Budget));
        assert_eq!(fake.made.len(), 1);
        assert_eq!(fake.made[0].0, 0);
        // A refused connection is free: the same cluster takes the next try.
        let mut fake = Fake::new(vec![balancer(3, 3, 0)], vec![REFUSED, REFUSED]);
        assert!(fake.run(true).is_ok());
        assert_eq!(fake.made.len(), 3);
    }

    #[test]
    fn a_cluster_with_no_eligible_member_is_passed_over() {
        // The primary's only member is disabled: the first try goes to the backup.
        let mut primary = balancer(1, 3, 100);
        primary.set_admin(0, crate::AdminState::Disabled, crate::Actor::Config);
        let mut fake = Fake::new(vec![primary, balancer(2, 3, 100)], vec![]);
        assert_eq!(fake.run(true).map(|(c, _)| c), Ok(1));
        assert_eq!(fake.none, [0]);
        assert_eq!(fake.made.len(), 1);
        // No cluster has anyone: exhausted, with no try made.
        let mut none = balancer(1, 3, 100);
        none.set_admin(0, crate::AdminState::Disabled, crate::Actor::Config);
        let mut fake = Fake::new(vec![none], vec![]);
        assert_eq!(fake.run(true), Err(Stop::Exhausted));
        assert!(fake.made.is_empty());
    }
}
