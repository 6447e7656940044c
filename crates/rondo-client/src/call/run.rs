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
        #[pin]
        step: Step<C::Try>,
    }
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

impl<I, C> Run<I, C>
where
    I: Borrow<Arc<Inner>>,
    C: Tries,
{
    /// The call `call` on `inner`'s service as `plan` says.
    pub(crate) fn new(inner: I, plan: Plan, call: C) -> Self {
        Run {
            inner,
            plan,
            call: Some(call),
            failover: None,
            attempts: Vec::new(),
            tried: Vec::new(),
            context: None,
            step: Step::Pick,
        }
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
            match this.step.as_mut().project() {
                StepProj::Pick => {
                    let start = Instant::now();
                    let failover = this.failover.get_or_insert_with(|| {
                        let now = clock::from_std(start.into_std());
                        Failover::new(1, this.plan.idempotent, now, inner.call_timeout)
                    });
                    let (plan, context) = (&*this.plan, &mut *this.context);
                    let placed =
                        place(inner, plan, this.tried, context, failover, this.attempts, start);
                    let ticket = match placed {
                        Ok(ticket) => ticket,
                        Err(reason) => {
                            this.step.set(Step::Done);
                            return Poll::Ready(Err(give_up(inner, reason, this.attempts)));
                        }
                    };
                    let until = start + failover.try_timeout(clock::from_std(start.into_std()));
                    // Resolving a host name counts against the try's time, like connecting
                    // does; a literal address was parsed once per answer and needs nothing.
                    match ticket.member_ref().addr {
                        Some(addr) => {
                            let call = this.call.as_mut().expect("a call before its answer");
                            let call = timeout_at(until, call.start(ticket.member_ref(), addr));
                            this.step.set(Step::Try { call, ticket: Some(ticket), start, until });
                        }
                        None => {
                            let address = ticket.member_ref().address.clone();
                            let resolving = Box::pin(async move {
                                timeout_at(until, resolve(&address)).await.unwrap_or_else(|_| {
                                    Err(format!("{address}: not resolved in time"))
                                })
                            });
                            let ticket = Some(ticket);
                            this.step.set(Step::Resolve { ticket, start, until, resolving });
                        }
                    }
                }
                StepProj::Resolve { ticket, start, until, resolving } => {
                    let resolved = ready!(resolving.as_mut().poll(cx));
                    let (start, until) = (*start, *until);
                    let mut ticket = ticket.take().expect("a resolving try has its ticket");
                    match resolved {
                        Ok(addr) => {
                            let call = this.call.as_mut().expect("a call before its answer");
                            let call = timeout_at(until, call.start(ticket.member_ref(), addr));
                            this.step.set(Step::Try { call, ticket: Some(ticket), start, until });
                        }
                        Err(error) => {
                            // Nothing was sent: charged like a refused connection.
                            ticket.failed(FailureKind::Connect);
                            this.attempts.push(attempt(&ticket, AttemptError::Resolve(error)));
                            this.tried.push(ticket.member_ref().name.clone());
                            drop(ticket);
                            let failure = TryFailure::NOTHING_SENT;
                            let call = this.call.as_ref().expect("a call before its answer");
                            let failure = TryFailure { replayable: call.untouched(), ..failure };
                            let failover = this.failover.as_mut().expect("set by the pick");
                            if let Err(stop) = failover.failed(failure, clock::now()) {
                                this.step.set(Step::Done);
                                return Poll::Ready(Err(give_up(
                                    inner,
                                    gave_up(stop),
                                    this.attempts,
                                )));
                            }
                            this.step.set(Step::Pick);
                        }
                    }
                }
                StepProj::Try { call, ticket, start, until } => {
                    let result = ready!(call.poll(cx));
                    let (start, until) = (*start, *until);
                    let mut ticket = ticket.take().expect("a try has its ticket");
                    let (error, connect) = match result {
                        Ok(Ok(value)) => {
                            this.step.set(Step::Done);
                            let call = this.call.take().expect("one answer per call");
                            return Poll::Ready(Ok(call.finish(inner, value, ticket)));
                        }
                        Ok(Err(Failed::Connect(e))) => {
                            ticket.failed(FailureKind::Connect);
                            (AttemptError::Connect(e), true)
                        }
                        Ok(Err(Failed::Member(e))) => {
                            ticket.failed(FailureKind::Reset);
                            (AttemptError::Member(e), false)
                        }
                        Ok(Err(Failed::Fatal(e))) => {
                            this.attempts.push(attempt(&ticket, AttemptError::Fatal(e)));
                            ticket.end(Outcome::Cancelled);
                            this.step.set(Step::Done);
                            return Poll::Ready(Err(give_up(inner, GaveUp::Fatal, this.attempts)));
                        }
                        Err(_elapsed) => {
                            let limit = until.saturating_duration_since(start);
                            let call = this.call.as_ref().expect("a call before its answer");
                            if call.dispatched() {
                                ticket.failed(FailureKind::Timeout);
                                (AttemptError::Timeout(limit), false)
                            } else {
                                // Still waiting for the transport: the member never saw it.
                                ticket.not_charged();
                                (AttemptError::Timeout(limit), true)
                            }
                        }
                    };
                    let name = ticket.member_ref().name.clone();
                    tracing::debug!(service = %inner.service, member = %name, error = %DisplayKind(&error), "attempt failed");
                    this.attempts.push(attempt(&ticket, error));
                    this.tried.push(name);
                    // The member's request ends before the next pick.
                    drop(ticket);
                    let call = this.call.as_ref().expect("a call before its answer");
                    let failure = TryFailure {
                        reached: !connect,
                        member_failed: true,
                        replayable: call.untouched(),
                        declined: false,
                    };
                    let failover = this.failover.as_mut().expect("set by the pick");
                    if let Err(stop) = failover.failed(failure, clock::now()) {
                        this.step.set(Step::Done);
                        return Poll::Ready(Err(give_up(inner, gave_up(stop), this.attempts)));
                    }
                    this.step.set(Step::Pick);
                }
                StepProj::Done => panic!("a call's future polled after it completed"),
            }
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
