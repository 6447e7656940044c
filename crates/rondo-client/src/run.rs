//! The call loop as a named future, [`Run`], shared by [`crate::Client::call`], sessions and
//! the tower layer: pick with the core, try with a deadline, report the outcome to the core's
//! estimators, fail over to the next member under the same retry rules and budget as the router.
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
use rondo_core::{FailureKind, Outcome};
use tokio::time::{Instant, Timeout, timeout_at};

use crate::client::{Inner, Plan, Refused, Ticket, Tries};
use crate::error::{Attempt, AttemptError, CallError, Failed, GaveUp};

/// A host name being resolved for a try (a rare path: literal addresses are parsed once per
/// answer).
type Resolving = Pin<Box<dyn Future<Output = Result<SocketAddr, String>> + Send>>;

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
        // The call's deadline, set by the first try's clock reading.
        deadline: Option<Instant>,
        attempts: Vec<Attempt<C::Error>>,
        // Members whose try failed (filled only then: the common call never allocates it).
        tried: Vec<Arc<str>>,
        // Retries after a member failed a sent call must fit the retry budget; a refused
        // connection sent nothing and loaded nobody, so trying elsewhere after it is free.
        sent: bool,
        context: Option<u32>,
        // The retry policy, read under the first pick's lock and kept for the whole call.
        max_tries: u32,
        per_try: Option<Duration>,
        // Tries begun.
        n: u32,
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
            deadline: None,
            attempts: Vec::new(),
            tried: Vec::new(),
            sent: false,
            context: None,
            max_tries: 1,
            per_try: None,
            n: 0,
            step: Step::Pick,
        }
    }
}

/// The call's error: every attempt so far, and why it stopped.
fn give_up<E>(inner: &Inner, reason: GaveUp, attempts: &mut Vec<Attempt<E>>) -> CallError<E> {
    CallError { service: inner.service.clone(), reason, attempts: std::mem::take(attempts) }
}

/// The attempt record of a try on `ticket`'s member.
fn attempt<E>(ticket: &Ticket, error: AttemptError<E>) -> Attempt<E> {
    let m = ticket.member_ref();
    Attempt {
        member: Some(String::from(&*m.name)),
        address: Some(String::from(&*m.address)),
        error,
    }
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
                    if *this.n >= *this.max_tries {
                        this.step.set(Step::Done);
                        return Poll::Ready(Err(give_up(inner, GaveUp::AllFailed, this.attempts)));
                    }
                    let start = Instant::now();
                    let first = *this.n == 0;
                    let deadline = *this.deadline.get_or_insert(start + inner.call_timeout);
                    let picked = inner.pick(
                        this.plan,
                        this.tried,
                        *this.sent,
                        first,
                        this.context,
                        start.into_std(),
                    );
                    let ticket = match picked {
                        Ok((ticket, retry)) => {
                            if first {
                                *this.max_tries = retry.attempts.max(1);
                                *this.per_try = retry.per_try_timeout;
                            }
                            ticket
                        }
                        Err(Refused::Budget) => {
                            tracing::warn!(service = %inner.service, "retry budget exhausted");
                            this.step.set(Step::Done);
                            let e = give_up(inner, GaveUp::BudgetExhausted, this.attempts);
                            return Poll::Ready(Err(e));
                        }
                        Err(Refused::Pick(e)) => {
                            let reason = if this.tried.is_empty() {
                                GaveUp::NoMember
                            } else {
                                GaveUp::AllFailed
                            };
                            this.attempts.push(Attempt {
                                member: None,
                                address: None,
                                error: AttemptError::NoMember(e),
                            });
                            this.step.set(Step::Done);
                            return Poll::Ready(Err(give_up(inner, reason, this.attempts)));
                        }
                    };
                    *this.n += 1;
                    // Resolving a host name counts against the try's time, like connecting
                    // does; a literal address was parsed once per answer and needs nothing.
                    let until = this.per_try.map_or(deadline, |t| (start + t).min(deadline));
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
                    *this.sent |= !connect;
                    // The member's request ends before the next pick.
                    drop(ticket);
                    // The call can be sent again only if nothing of it was consumed; then a
                    // connect failure sent nothing, so any call may go elsewhere; after a reset
                    // or a timeout the member may have acted on it, so only idempotent calls go
                    // again.
                    let call = this.call.as_ref().expect("a call before its answer");
                    let reason = if !call.untouched() || !(connect || this.plan.idempotent) {
                        Some(GaveUp::NotRetryable)
                    } else if this.deadline.is_some_and(|d| Instant::now() >= d) {
                        Some(GaveUp::Deadline)
                    } else {
                        None
                    };
                    if let Some(reason) = reason {
                        this.step.set(Step::Done);
                        return Poll::Ready(Err(give_up(inner, reason, this.attempts)));
                    }
                    this.step.set(Step::Pick);
                }
                StepProj::Done => panic!("a call's future polled after it completed"),
            }
        }
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
