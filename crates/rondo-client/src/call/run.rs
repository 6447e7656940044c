//! The call loop as a named future, [`Run`], shared by [`crate::Client::call`], sessions and
//! the tower layer: pick with the core, try with a deadline, report the outcome to the core's
//! estimators, fail over to the next member. Where the next try may go, and whether it may go at
//! all, is the core's failover driver's decision, the same as the router's: the pick steps
//! through its first half ([`Failover::next_try`]), a failed try through its second
//! ([`Failover::failed`]); this future only carries them out and keeps no loop of its own
//! (its `poll` loops over the steps of one call, as any hand-written future does).
//!
//! It is written by hand rather than as an `async` block so that the tower layer can name its
//! response future (no box per request) and every call moves one compact state machine instead
//! of nested generators (profiles of the per-request path showed their copies, see
//! `docs/benchmarks.md`). The clock is read once at the start of each try (the pick's time, the
//! ticket's start and the base of the try's deadline; the call's deadline for the first) and
//! once when the try ends (in the ticket).

use std::borrow::Borrow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use rondo_core::failover::Placement;
use rondo_core::{Failover, FailureKind, Outcome, Stop, TryFailure};
use tokio::time::{Instant, Timeout, timeout_at};

use super::pick::{Plan, Refused, Ticket};
use crate::clock;
use crate::error::{Attempt, AttemptError, CallError, Failed, GaveUp};
use crate::inner::Inner;
use crate::state::MemberRef;

/// A host name being resolved for a try (a rare path: literal addresses are parsed once per
/// answer).
type Resolving = Pin<Box<dyn Future<Output = Result<SocketAddr, String>> + Send>>;

/// One call as the call loop drives it: how a try starts on a member, whether the call is
/// still whole, and what the caller gets from the try that answered.
pub(crate) trait Tries {
    /// What a try gives when the member answered.
    type Value;
    /// The transport's error.
    type Error;
    /// One try.
    type Try: Future<Output = Result<Self::Value, Failed<Self::Error>>>;
    /// What the caller gets.
    type Output;

    /// Starts a try on `member`, at `addr`.
    fn start(&mut self, member: &Arc<MemberRef>, addr: SocketAddr) -> Self::Try;

    /// Whether nothing of the call was consumed, so that it can still go to another member.
    fn untouched(&self) -> bool;

    /// Whether the latest try's request left for its member. A try whose time ran out while
    /// its transport was still not ready to take it (a saturated concurrency limit in a tower
    /// stack) sent nothing: its member is not charged, and the call may go elsewhere as after
    /// a refused connection.
    fn dispatched(&self) -> bool {
        true
    }

    /// What the caller gets from the try that answered; `ticket` is the member's in-flight
    /// request, ended when it is dropped.
    fn finish(self, inner: &Inner, value: Self::Value, ticket: Ticket) -> Self::Output;
}

pin_project! {
    /// One call through the call loop; see the module docs.
    pub(crate) struct Run<I, C>
    where
        C: Tries,
    {
        inner: I,
        state: CallState<C>,
        #[pin]
        step: Step<C::Try>,
    }
}

/// What a call carries from try to try: what it asks, its tries so far and their failover.
struct CallState<C: Tries> {
    plan: Plan,
    // Taken when a try answers (`Tries::finish` consumes it).
    call: Option<C>,
    // The call's tries, from the first try's clock reading (its deadline starts there).
    failover: Option<Failover>,
    attempts: Vec<Attempt<C::Error>>,
    // Members whose try failed, by name: an answer may change the member indexes between
    // tries (filled only then: the common call never allocates it).
    tried: Vec<Arc<str>>,
    context: Option<u32>,
}

pin_project! {
    #[project = StepProj]
    enum Step<F> {
        // The next try is to be picked.
        Pick,
        // A try waits for its member's host name.
        Resolve { ticket: Option<Ticket>, start: Instant, until: Instant, resolving: Resolving },
        // A try is under way, until `until`. (`call` before `ticket`: dropped mid-try, the
        // try's future goes first, then its request ends in the core as cancelled.)
        Try { #[pin] call: Timeout<F>, ticket: Option<Ticket>, start: Instant, until: Instant },
        // The call has its result.
        Done,
    }
}

/// Where a step of the call leads: the next step, or the call's result.
enum Next<C: Tries> {
    Step(Step<C::Try>),
    Ready(Result<C::Output, CallError<C::Error>>),
}

impl<I, C> Run<I, C>
where
    I: Borrow<Arc<Inner>>,
    C: Tries,
{
    /// The call `call` on `inner`'s service as `plan` says.
    pub(crate) fn new(inner: I, plan: Plan, call: C) -> Self {
        let state = CallState {
            plan,
            call: Some(call),
            failover: None,
            attempts: Vec::new(),
            tried: Vec::new(),
            context: None,
        };
        Run { inner, state, step: Step::Pick }
    }
}

/// The call's error: every attempt so far, and why it stopped.
fn give_up<E>(inner: &Inner, reason: GaveUp, attempts: &mut Vec<Attempt<E>>) -> CallError<E> {
    CallError::new(inner.service.clone(), reason, std::mem::take(attempts))
}

/// The attempt record of a try on `ticket`'s member.
fn attempt<E>(ticket: &Ticket, error: AttemptError<E>) -> Attempt<E> {
    let m = ticket.member_ref();
    Attempt::new(Some(String::from(&*m.name)), Some(String::from(&*m.address)), error)
}

impl<I, C> Future for Run<I, C>
where
    I: Borrow<Arc<Inner>>,
    C: Tries,
{
    type Output = Result<C::Output, CallError<C::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let inner: &Arc<Inner> = (*this.inner).borrow();
        loop {
            let next = match this.step.as_mut().project() {
                StepProj::Pick => this.state.start_try(inner),
                StepProj::Resolve { ticket, start, until, resolving } => {
                    let resolved = ready!(resolving.as_mut().poll(cx));
                    let ticket = ticket.take().expect("a resolving try has its ticket");
                    this.state.resolved(inner, ticket, *start, *until, resolved)
                }
                StepProj::Try { call, ticket, start, until } => {
                    let result = ready!(call.poll(cx));
                    let ticket = ticket.take().expect("a try has its ticket");
                    match result {
                        Ok(Ok(value)) => {
                            // The try's future goes before the caller gets the answer.
                            this.step.set(Step::Done);
                            let call = this.state.call.take().expect("one answer per call");
                            return Poll::Ready(Ok(call.finish(inner, value, ticket)));
                        }
                        Ok(Err(failed)) => this.state.try_failed(inner, ticket, failed),
                        Err(_elapsed) => {
                            let limit = until.saturating_duration_since(*start);
                            this.state.timed_out(inner, ticket, limit)
                        }
                    }
                }
                StepProj::Done => panic!("a call's future polled after it completed"),
            };
            match next {
                Next::Step(step) => this.step.set(step),
                Next::Ready(result) => {
                    this.step.set(Step::Done);
                    return Poll::Ready(result);
                }
            }
        }
    }
}

impl<C: Tries> CallState<C> {
    /// Places the next try, now: on its member's address, or resolving its host name first.
    fn start_try(&mut self, inner: &Arc<Inner>) -> Next<C> {
        let start = Instant::now();
        let failover = self.failover.get_or_insert_with(|| {
            let now = clock::from_std(start.into_std());
            Failover::new(1, self.plan.idempotent, now, inner.call_timeout)
        });
        let (plan, context) = (&self.plan, &mut self.context);
        let placed = place(inner, plan, &self.tried, context, failover, &mut self.attempts, start);
        let ticket = match placed {
            Ok(ticket) => ticket,
            Err(reason) => return Next::Ready(Err(give_up(inner, reason, &mut self.attempts))),
        };
        let until = start + failover.try_timeout(clock::from_std(start.into_std()));
        // Resolving a host name counts against the try's time, like connecting does; a
        // literal address was parsed once per answer and needs nothing.
        Next::Step(match ticket.member_ref().addr {
            Some(addr) => self.send(ticket, addr, start, until),
            None => {
                let address = ticket.member_ref().address.clone();
                let resolving = Box::pin(async move {
                    timeout_at(until, resolve(&address))
                        .await
                        .unwrap_or_else(|_| Err(format!("{address}: not resolved in time")))
                });
                Step::Resolve { ticket: Some(ticket), start, until, resolving }
            }
        })
    }

    /// The try on `ticket`'s member, at `addr`, under way until `until`.
    fn send(
        &mut self,
        ticket: Ticket,
        addr: SocketAddr,
        start: Instant,
        until: Instant,
    ) -> Step<C::Try> {
        let call = self.call.as_mut().expect("a call before its answer");
        let call = timeout_at(until, call.start(ticket.member_ref(), addr));
        Step::Try { call, ticket: Some(ticket), start, until }
    }

    /// A try's host name resolved, or failed to.
    fn resolved(
        &mut self,
        inner: &Inner,
        mut ticket: Ticket,
        start: Instant,
        until: Instant,
        resolved: Result<SocketAddr, String>,
    ) -> Next<C> {
        let error = match resolved {
            Ok(addr) => return Next::Step(self.send(ticket, addr, start, until)),
            Err(error) => error,
        };
        // Nothing was sent: charged like a refused connection.
        ticket.failed(FailureKind::Connect);
        self.attempts.push(attempt(&ticket, AttemptError::Resolve(error)));
        self.tried.push(ticket.member_ref().name.clone());
        drop(ticket);
        let call = self.call.as_ref().expect("a call before its answer");
        let failure = TryFailure { replayable: call.untouched(), ..TryFailure::NOTHING_SENT };
        self.fail_over(inner, failure)
    }

    /// A try's transport failed: the member is charged as the failure says, and the call goes
    /// on unless it was fatal.
    fn try_failed(
        &mut self,
        inner: &Inner,
        mut ticket: Ticket,
        failed: Failed<C::Error>,
    ) -> Next<C> {
        let (error, connect) = match failed {
            Failed::Connect(e) => {
                ticket.failed(FailureKind::Connect);
                (AttemptError::Connect(e), true)
            }
            Failed::Member(e) => {
                ticket.failed(FailureKind::Reset);
                (AttemptError::Member(e), false)
            }
            Failed::Fatal(e) => {
                self.attempts.push(attempt(&ticket, AttemptError::Fatal(e)));
                ticket.end(Outcome::Cancelled);
                return Next::Ready(Err(give_up(inner, GaveUp::Fatal, &mut self.attempts)));
            }
        };
        self.next_after(inner, ticket, error, connect)
    }

    /// A try ran out of its time `limit`.
    fn timed_out(&mut self, inner: &Inner, mut ticket: Ticket, limit: Duration) -> Next<C> {
        let call = self.call.as_ref().expect("a call before its answer");
        let connect = if call.dispatched() {
            ticket.failed(FailureKind::Timeout);
            false
        } else {
            // Still waiting for the transport: the member never saw it.
            ticket.not_charged();
            true
        };
        self.next_after(inner, ticket, AttemptError::Timeout(limit), connect)
    }

    /// Records a failed try (`connect`: it never reached its member) and fails over.
    fn next_after(
        &mut self,
        inner: &Inner,
        ticket: Ticket,
        error: AttemptError<C::Error>,
        connect: bool,
    ) -> Next<C> {
        let name = ticket.member_ref().name.clone();
        tracing::debug!(service = %inner.service, member = %name, error = %DisplayKind(&error), "attempt failed");
        self.attempts.push(attempt(&ticket, error));
        self.tried.push(name);
        // The member's request ends before the next pick.
        drop(ticket);
        let call = self.call.as_ref().expect("a call before its answer");
        let failure = TryFailure {
            reached: !connect,
            member_failed: true,
            replayable: call.untouched(),
            declined: false,
        };
        self.fail_over(inner, failure)
    }

    /// The core driver's second half ([`Failover::failed`]): another pick, or the call's end.
    fn fail_over(&mut self, inner: &Inner, failure: TryFailure) -> Next<C> {
        let failover = self.failover.as_mut().expect("set by the pick");
        match failover.failed(failure, clock::now()) {
            Ok(()) => Next::Step(Step::Pick),
            Err(stop) => Next::Ready(Err(give_up(inner, gave_up(stop), &mut self.attempts))),
        }
    }
}

/// Places the call's next try, at `start`, through the core driver's first half
/// ([`Failover::next_try`]; the service is the one cluster, [`Inner::pick`] the placing): the
/// try's ticket, or why the call gives up (a pick's refusal recorded in `attempts`).
fn place<E>(
    inner: &Arc<Inner>,
    plan: &Plan,
    tried: &[Arc<str>],
    context: &mut Option<u32>,
    failover: &mut Failover,
    attempts: &mut Vec<Attempt<E>>,
    start: Instant,
) -> Result<Ticket, GaveUp> {
    let now = clock::from_std(start.into_std());
    let mut no_member = None;
    let placed = failover.next_try(now, |_, failover, _| {
        match inner.pick(plan, tried, failover, context, start.into_std()) {
            Ok(ticket) => Placement::Placed(ticket),
            Err(Refused::Budget) => Placement::Stop(Stop::Budget),
            Err(Refused::Pick(e)) => {
                no_member = Some(e);
                Placement::NoEligible
            }
        }
    });
    placed.map_err(|stop| match no_member {
        Some(e) => {
            attempts.push(Attempt::new(None, None, AttemptError::NoMember(e)));
            if tried.is_empty() { GaveUp::NoMember } else { GaveUp::AllFailed }
        }
        None => {
            tracing::warn!(service = %inner.service, "retry budget exhausted");
            gave_up(stop)
        }
    })
}

/// Why the call gave up, from why its failover engine stopped.
fn gave_up(stop: Stop) -> GaveUp {
    match stop {
        Stop::Exhausted => GaveUp::AllFailed,
        Stop::NotRetryable => GaveUp::NotRetryable,
        Stop::Deadline => GaveUp::Deadline,
        Stop::Budget => GaveUp::BudgetExhausted,
    }
}

/// Names an attempt error's kind for logs without requiring `E: Display`.
struct DisplayKind<'a, E>(&'a AttemptError<E>);

impl<E> std::fmt::Display for DisplayKind<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            AttemptError::Connect(_) => "connect",
            AttemptError::Member(_) => "member",
            AttemptError::Fatal(_) => "fatal",
            AttemptError::Timeout(_) => "timeout",
            AttemptError::Resolve(_) => "resolve",
            AttemptError::NoMember(_) => "no member",
        })
    }
}

/// Resolves `host:port`: literal socket addresses directly, host names through tokio's
/// resolver (the first address wins).
async fn resolve(address: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = address.parse() {
        return Ok(a);
    }
    match tokio::net::lookup_host(address).await {
        Ok(mut it) => it.next().ok_or_else(|| format!("{address}: no address")),
        Err(e) => Err(format!("{address}: {e}")),
    }
}
