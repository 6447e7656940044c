//! Property tests of the failover engine and its driver over real balancers: whatever the failures, no try
//! goes to a member already tried in its cluster while another is eligible, a non-idempotent
//! request whose bytes reached a member is never sent again, and the tries never exceed the
//! policy's attempts per cluster nor the retry budget.

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use rondo_core::failover::{self, Placement, TryMaker};
use rondo_core::{
    Algorithm, Balancer, Failover, Instant, PickRequest, Policy, RetryPolicy, Stop, TryFailure,
};

use super::support::{cluster_with, named, rng};

/// What a try's member does, drawn by the test.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Answer,
    Refuse,
    Reset,
    RequestOwn,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![Just(Fate::Answer), Just(Fate::Refuse), Just(Fate::Reset), Just(Fate::RequestOwn)]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::RoundRobin),
        Just(Algorithm::Random),
        Just(Algorithm::LeastSessions),
        Just(Algorithm::P2cEwma),
        Just(Algorithm::Weighted),
    ]
}

struct Run {
    /// (cluster, member) of every try, in order.
    tries: Vec<(usize, usize)>,
    /// Whether each try's request reached its member.
    reached: Vec<bool>,
    stop: Option<Stop>,
    /// Retries admitted, per cluster (each cluster has its own budget).
    retries_admitted: Vec<u32>,
}

/// A request's tries through the core's failover driver, placed by real balancers and made by
/// the drawn fates (a try past the last fate answers).
struct Scripted<'a> {
    balancers: &'a mut [Balancer],
    rng: rondo_core::SplitMix64,
    fates: std::slice::Iter<'a, Fate>,
    now: Instant,
    run: Run,
}

impl TryMaker for Scripted<'_> {
    type Placed = (usize, usize);
    type Held = ();
    type Tried = Result<(), TryFailure>;
    type Value = ();

    fn now(&mut self) -> Instant {
        self.now
    }

    fn place(&mut self, c: usize, f: &mut Failover, now: Instant) -> Placement<(usize, usize)> {
        let b = &mut self.balancers[c];
        let retry = f.retrying();
        if let Err(stop) = f.admit(b, now) {
            return Placement::Stop(stop);
        }
        if retry {
            self.run.retries_admitted[c] += 1;
        }
        let req = PickRequest { now, exclude: f.tried(), ..PickRequest::default() };
        match b.pick(&req, &mut self.rng) {
            Ok(d) => {
                f.began(d.member);
                Placement::Placed((c, d.member))
            }
            Err(_) => Placement::NoEligible,
        }
    }

    fn hold(&mut self, _: &(usize, usize)) {}

    fn attempt(
        &mut self,
        placed: (usize, usize),
        _: &mut Failover,
    ) -> impl Future<Output = Result<(), TryFailure>> {
        self.run.tries.push(placed);
        let failure = match self.fates.next() {
            None | Some(Fate::Answer) => return std::future::ready(Ok(())),
            Some(Fate::Refuse) => TryFailure::NOTHING_SENT,
            Some(Fate::Reset) => TryFailure::after_sending(true),
            Some(Fate::RequestOwn) => {
                TryFailure { member_failed: false, ..TryFailure::NOTHING_SENT }
            }
        };
        self.run.reached.push(failure.reached);
        std::future::ready(Err(failure))
    }

    fn judge(&mut self, _: (), tried: Result<(), TryFailure>) -> Result<(), TryFailure> {
        tried
    }
}

fn drive(balancers: &mut [Balancer], idempotent: bool, fates: &[Fate], seed: u64) -> Run {
    let now = Instant::from_millis(1);
    let mut f = Failover::new(balancers.len(), idempotent, now, Duration::from_secs(10));
    let run = Run {
        tries: Vec::new(),
        reached: Vec::new(),
        stop: None,
        retries_admitted: vec![0; balancers.len()],
    };
    let mut scripted = Scripted { balancers, rng: rng(seed), fates: fates.iter(), now, run };
    // Bounded: every try uses up a fate or answers, and each cluster's attempts are finite.
    let ended = {
        let driven = std::pin::pin!(failover::drive(&mut scripted, &mut f, now));
        match driven.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(ended) => ended,
            Poll::Pending => unreachable!("scripted tries never wait"),
        }
    };
    let mut run = scripted.run;
    run.stop = ended.err();
    run
}

proptest! {
    #[test]
    fn failover_keeps_its_rules(
        algorithm in algorithm(),
        sizes in proptest::collection::vec(1usize..5, 1..4),
        attempts in 1u32..5,
        budget_min in 0u32..3,
        idempotent in any::<bool>(),
        fates in proptest::collection::vec(fate(), 1..20),
        seed in any::<u64>(),
    ) {
        let retry = RetryPolicy { attempts, budget_min_per_sec: budget_min, budget_percent: 0, ..RetryPolicy::default() };
        let policy = Policy { algorithm, retry, ..Policy::default() };
        let mut balancers: Vec<Balancer> = sizes
            .iter()
            .map(|&n| Balancer::new(cluster_with(policy.clone(), named(n)), Instant::ZERO))
            .collect();
        let run = drive(&mut balancers, idempotent, &fates, seed);

        for (i, &(c, m)) in run.tries.iter().enumerate() {
            // Never a member already tried in the same cluster (every member is eligible here).
            let again = run.tries[..i].iter().any(|&(c2, m2)| c2 == c && m2 == m);
            prop_assert!(!again, "member {m} of cluster {c} tried twice: {:?}", run.tries);
            // Never more tries in a cluster than its attempts.
            let here = run.tries[..=i].iter().filter(|&&(c2, _)| c2 == c).count();
            prop_assert!(here as u32 <= attempts, "{here} tries in cluster {c}");
        }
        // A non-idempotent request that reached a member is never sent again.
        if !idempotent
            && let Some(first) = run.reached.iter().position(|r| *r)
        {
            prop_assert_eq!(run.tries.len(), first + 1, "sent again after reaching a member");
        }
        // Retries never exceed the budget: with no ratio, at most the floor per second in each
        // cluster (all tries happen at one instant).
        for (c, n) in run.retries_admitted.iter().enumerate() {
            prop_assert!(*n <= budget_min, "{n} retries in cluster {c} over a floor of {budget_min}");
        }
        if run.stop == Some(Stop::Budget) {
            prop_assert!(run.retries_admitted.contains(&budget_min));
        }
        let total = sizes.len() as u32 * attempts;
        prop_assert!(run.tries.len() as u32 <= total);
    }
}

/// `retry.backoff` (issue 38): full jitter below `base · 2^(n−1)`, capped at `max`, and no
/// pause without a backoff.
#[test]
fn backoff_draws_full_jitter_under_a_doubling_capped_ceiling() {
    use rondo_core::{Backoff, RetryPolicy};
    let base = Duration::from_millis(10);
    let policy = RetryPolicy {
        backoff: Some(Backoff { base, max: Duration::from_millis(35) }),
        ..RetryPolicy::default()
    };
    let mut r = super::support::rng(3);
    for (retry, ceiling) in [(1, 10), (2, 20), (3, 35), (9, 35)] {
        let draws: Vec<Duration> = (0..2000).map(|_| policy.backoff_delay(retry, &mut r)).collect();
        let max = draws.iter().max().unwrap();
        assert!(*max <= Duration::from_millis(ceiling), "retry {retry}: {max:?}");
        // Spread over the whole range, not bunched at either end.
        assert!(*max > Duration::from_millis(ceiling) * 9 / 10, "retry {retry}: {max:?}");
        assert!(draws.iter().min().unwrap() < &Duration::from_millis(ceiling / 10 + 1));
    }
    assert_eq!(RetryPolicy::default().backoff_delay(1, &mut r), Duration::ZERO);
}
