//! Hedged tries on the router ([`race`]): a cluster's `retry.hedge` starts a second try on
//! another member when the first has no answer after `after`, and the first answer wins. The
//! core decides (`rondo_core::failover::hedge`: which requests, whether the engine lets another
//! go); this file races the tries. The loser's future is dropped: its request is ended on its
//! member as cancelled (its in-flight count released), and hyper closes its member connection
//! rather than keep it for another request (an HTTP/1 exchange cut before its answer cannot be
//! reused; an HTTP/2 stream is reset). Only codecs whose tries can run side by side (the
//! forward stage's `Tries::attempt_shared`) hedge: hyper's path.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use rondo_core::Failover;
use rondo_core::failover::hedge::Hedge;
use rondo_runtime::ClusterRt;
use rondo_runtime::metrics::Metrics;

use crate::error::Kind;

pin_project! {
    /// A try's future: the codec's own, or a hedged race (boxed: rare, and large).
    #[project = OneOfProj]
    pub(super) enum OneOf<A, B> {
        Plain { #[pin] f: A },
        Hedged { f: Pin<Box<B>> },
    }
}

impl<A: Future, B: Future<Output = A::Output>> Future for OneOf<A, B> {
    type Output = A::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
        match self.project() {
            OneOfProj::Plain { f } => f.poll(cx),
            OneOfProj::Hedged { f } => f.as_mut().poll(cx),
        }
    }
}

/// The first try on `first`, and up to the policy's `max` hedges placed by `place` on other
/// members of the same cluster (`rt`), each `after` the one before while none has answered, all
/// made by `launch`: the first answer, or, when every try failed, the last failure; with the
/// number of the try that gave it (0 the first, then the hedges in the order they began).
pub(super) async fn race<C, F, R>(
    (rt, metrics): (&ClusterRt, &Metrics),
    first: C,
    failover: &mut Failover,
    hedge: Hedge,
    now: impl Fn() -> rondo_core::Instant,
    (mut place, launch): (
        impl FnMut(&mut Failover, rondo_core::Instant) -> Option<C>,
        impl Fn(C) -> F,
    ),
) -> (Result<R, Kind>, usize)
where
    F: Future<Output = Result<R, Kind>>,
{
    // Each try by its number (0: the first, not a hedge).
    let mut tries = vec![(0, Box::pin(launch(first)))];
    let mut timer = Some(Box::pin(tokio::time::sleep(hedge.after)));
    let mut hedged = 0u32;
    loop {
        let event = std::future::poll_fn(|cx| {
            for (i, (_, t)) in tries.iter_mut().enumerate() {
                if let Poll::Ready(r) = t.as_mut().poll(cx) {
                    return Poll::Ready(Some((i, r)));
                }
            }
            match timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(None),
                _ => Poll::Pending,
            }
        })
        .await;
        match event {
            Some((i, Ok(resp))) => {
                let (won, _) = tries.swap_remove(i);
                // The others are cancelled here: dropped before the answer goes on.
                let lost = tries.iter().filter(|(n, _)| *n > 0).count();
                drop(tries);
                if won > 0 {
                    metrics.hedge(&rt.spec.name, true);
                }
                for _ in 0..lost {
                    metrics.hedge(&rt.spec.name, false);
                }
                return (Ok(resp), won);
            }
            Some((i, Err(kind))) => {
                let (n, _) = tries.swap_remove(i);
                if n > 0 {
                    metrics.hedge(&rt.spec.name, false);
                }
                if tries.is_empty() {
                    return (Err(kind), n);
                }
            }
            None => {
                timer = None;
                let now = now();
                if !failover.may_hedge(&hedge, hedged, now) {
                    continue;
                }
                failover.hedging();
                // The same placement as any try: the budget, `max_requests`, the members
                // tried excluded. Refused, the first try goes on alone.
                let Some(choice) = place(failover, now) else { continue };
                hedged += 1;
                tries.push((hedged as usize, Box::pin(launch(choice))));
                if hedged < hedge.max {
                    timer = Some(Box::pin(tokio::time::sleep(hedge.after)));
                }
            }
        }
    }
}
