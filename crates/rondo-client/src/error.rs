//! Errors: what a call's closure reports ([`Failed`]), what a caller finally gets when every
//! option failed ([`CallError`], listing every [`Attempt`]), and the naming service's errors.

use std::fmt;
use std::time::Duration;

use rondo_core::PickError;

/// How one try of a call failed, as the caller's closure reports it to [`crate::Client::call`].
/// The variant decides whether the call goes to another member.
#[derive(Debug)]
pub enum Failed<E> {
    /// The member could not be reached (connection refused, unreachable): nothing was sent, so
    /// the call always goes to the next member, free of the retry budget.
    Connect(E),
    /// The member failed the call after it was sent (connection reset or closed, a server
    /// error): the call goes to another member only when it is idempotent
    /// (unless [`crate::CallOptions::not_idempotent`]) and the retry budget allows it.
    Member(E),
    /// Not the member's fault and not worth another member (a bad request, a refusal by the
    /// application): returned to the caller at once.
    Fatal(E),
}

impl<E: std::error::Error + 'static> Failed<E> {
    /// [`Failed::Connect`] when `error` (or an error it was caused by) is a failure to connect
    /// (an I/O error such as `ConnectionRefused`, or a hyper client's connect error), else
    /// [`Failed::Member`].
    pub fn classify(error: E) -> Failed<E> {
        if is_connect_error(&error) { Failed::Connect(error) } else { Failed::Member(error) }
    }
}

impl<E> Failed<E> {
    /// The same failure with the error converted (e.g. to a common error type).
    pub fn map<F>(self, f: impl FnOnce(E) -> F) -> Failed<F> {
        match self {
            Failed::Connect(e) => Failed::Connect(f(e)),
            Failed::Member(e) => Failed::Member(f(e)),
            Failed::Fatal(e) => Failed::Fatal(f(e)),
        }
    }

    /// The error inside.
    pub fn into_inner(self) -> E {
        match self {
            Failed::Connect(e) | Failed::Member(e) | Failed::Fatal(e) => e,
        }
    }
}

/// Whether `e` or one of its sources is a connect failure: a hyper-util client error that says
/// so, or an I/O error of a connect kind.
pub(crate) fn is_connect_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper_util::client::legacy::Error>()
            && h.is_connect()
        {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable
            ) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// What went wrong in one attempt.
#[derive(Debug)]
pub enum AttemptError<E> {
    /// The member could not be reached; nothing was sent.
    Connect(E),
    /// The member failed the call after it was sent.
    Member(E),
    /// The caller's closure said the failure was not worth another member.
    Fatal(E),
    /// No answer within the per-try timeout (or what was left of the call's time).
    Timeout(Duration),
    /// The member's address did not resolve.
    Resolve(String),
    /// No member could be picked (none eligible, or every eligible one already tried).
    NoMember(PickError),
}

impl<E: fmt::Display> fmt::Display for AttemptError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptError::Connect(e) => write!(f, "connect failed: {e}"),
            AttemptError::Member(e) => write!(f, "failed: {e}"),
            AttemptError::Fatal(e) => write!(f, "failed, not retried: {e}"),
            AttemptError::Timeout(d) => write!(f, "no answer within {d:?}"),
            AttemptError::Resolve(e) => write!(f, "address did not resolve: {e}"),
            AttemptError::NoMember(e) => write!(f, "{e}"),
        }
    }
}

/// One try of a call: which member and how it failed.
#[derive(Debug)]
pub struct Attempt<E> {
    member: Option<String>,
    address: Option<String>,
    error: AttemptError<E>,
}

impl<E> Attempt<E> {
    pub(crate) fn new(
        member: Option<String>,
        address: Option<String>,
        error: AttemptError<E>,
    ) -> Attempt<E> {
        Attempt { member, address, error }
    }

    /// The member's name (`None` when no member could be picked).
    pub fn member(&self) -> Option<&str> {
        self.member.as_deref()
    }

    /// The member's `host:port` (`None` when no member could be picked).
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// How it failed.
    pub fn error(&self) -> &AttemptError<E> {
        &self.error
    }

    fn map_err<F>(self, f: impl FnOnce(E) -> F) -> Attempt<F> {
        let error = match self.error {
            AttemptError::Connect(e) => AttemptError::Connect(f(e)),
            AttemptError::Member(e) => AttemptError::Member(f(e)),
            AttemptError::Fatal(e) => AttemptError::Fatal(f(e)),
            AttemptError::Timeout(d) => AttemptError::Timeout(d),
            AttemptError::Resolve(s) => AttemptError::Resolve(s),
            AttemptError::NoMember(p) => AttemptError::NoMember(p),
        };
        Attempt { member: self.member, address: self.address, error }
    }
}

impl<E: fmt::Display> fmt::Display for Attempt<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.member, &self.address) {
            (Some(m), Some(a)) => write!(f, "{m} at {a}: {}", self.error),
            (Some(m), None) => write!(f, "{m}: {}", self.error),
            _ => write!(f, "{}", self.error),
        }
    }
}

/// Why a call gave up (asked with [`CallError`]'s `is_*` methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GaveUp {
    /// No member could take the call at all (none listed, none eligible).
    NoMember,
    /// Every member that could be tried failed, or the policy's attempts were used up.
    AllFailed,
    /// The last failure happened after the call was sent and the call is not idempotent (or
    /// its body was already consumed), so it was not sent again.
    NotRetryable,
    /// The caller's closure returned [`Failed::Fatal`].
    Fatal,
    /// The retry budget of the service was exhausted (a retry storm is being prevented).
    BudgetExhausted,
    /// The call's overall time ran out.
    Deadline,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GaveUp::NoMember => "no member can take it",
            GaveUp::AllFailed => "every member tried failed",
            GaveUp::NotRetryable => "failed after it was sent and cannot be sent again",
            GaveUp::Fatal => "failed",
            GaveUp::BudgetExhausted => "retry budget exhausted",
            GaveUp::Deadline => "out of time",
        })
    }
}

/// A call that failed on every option it had: the service called, why the call stopped (ask
/// with the `is_*` methods; exactly one of them is true) and every attempt in order
/// ([`CallError::attempts`]).
#[derive(Debug)]
pub struct CallError<E> {
    service: String,
    reason: GaveUp,
    attempts: Vec<Attempt<E>>,
}

impl<E> CallError<E> {
    pub(crate) fn new(service: String, reason: GaveUp, attempts: Vec<Attempt<E>>) -> Self {
        CallError { service, reason, attempts }
    }

    /// The service called.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Whether no member could take the call at all (none listed, none eligible).
    pub fn is_no_member(&self) -> bool {
        self.reason == GaveUp::NoMember
    }

    /// Whether every member that could be tried failed, or the policy's attempts were used up.
    pub fn is_all_failed(&self) -> bool {
        self.reason == GaveUp::AllFailed
    }

    /// Whether the last failure happened after the call was sent and the call is not
    /// idempotent (or its body was already consumed), so that it was not sent again.
    pub fn is_not_retryable(&self) -> bool {
        self.reason == GaveUp::NotRetryable
    }

    /// Whether the caller's closure (or the transport, for a request it could not even build)
    /// said the failure was not worth another member ([`Failed::Fatal`]).
    pub fn is_fatal(&self) -> bool {
        self.reason == GaveUp::Fatal
    }

    /// Whether the service's retry budget was exhausted (a retry storm is being prevented).
    pub fn is_budget_exhausted(&self) -> bool {
        self.reason == GaveUp::BudgetExhausted
    }

    /// Whether the call's overall time ran out ([`crate::Builder::call_timeout`]).
    pub fn is_deadline(&self) -> bool {
        self.reason == GaveUp::Deadline
    }

    /// Every try, in order (the last one may be a pick that found no member).
    pub fn attempts(&self) -> Attempts<'_, E> {
        Attempts(self.attempts.iter())
    }

    /// The last attempt's error from the caller's closure or transport, if any.
    pub fn last_error(&self) -> Option<&E> {
        self.attempts.iter().rev().find_map(|a| match &a.error {
            AttemptError::Connect(e) | AttemptError::Member(e) | AttemptError::Fatal(e) => Some(e),
            _ => None,
        })
    }

    /// Converts the closure's errors, e.g. into a boxed error.
    pub fn map_err<F>(self, mut f: impl FnMut(E) -> F) -> CallError<F> {
        let attempts = self.attempts.into_iter().map(|a| a.map_err(&mut f)).collect();
        CallError { service: self.service, reason: self.reason, attempts }
    }
}

/// The attempts of a [`CallError`], in order; see [`CallError::attempts`].
#[derive(Debug)]
pub struct Attempts<'a, E>(std::slice::Iter<'a, Attempt<E>>);

impl<E> Clone for Attempts<'_, E> {
    fn clone(&self) -> Self {
        Attempts(self.0.clone())
    }
}

impl<'a, E> Iterator for Attempts<'a, E> {
    type Item = &'a Attempt<E>;

    fn next(&mut self) -> Option<&'a Attempt<E>> {
        self.0.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl<E> DoubleEndedIterator for Attempts<'_, E> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back()
    }
}

impl<E> ExactSizeIterator for Attempts<'_, E> {}

impl<E> std::iter::FusedIterator for Attempts<'_, E> {}

impl<E: fmt::Display> fmt::Display for CallError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call to {}: {}", self.service, self.reason)?;
        if !self.attempts.is_empty() {
            write!(f, " ({} attempt", self.attempts.len())?;
            if self.attempts.len() != 1 {
                f.write_str("s")?;
            }
            f.write_str(": ")?;
            for (i, a) in self.attempts.iter().enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{a}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl<E: std::error::Error + 'static> std::error::Error for CallError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last_error().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A request to a naming endpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("naming endpoint {endpoint}: {what}")]
pub struct NamingError {
    /// The endpoint asked.
    pub endpoint: String,
    /// What failed, in words.
    pub what: String,
    /// The HTTP status when the endpoint answered with an error.
    pub status: Option<u16>,
}

/// No naming endpoint gave the service's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    /// The builder was given no endpoint and `RONDO_NAMING_ENDPOINTS` is unset.
    #[error(
        "no naming endpoint given (Builder::endpoint, or RONDO_NAMING_ENDPOINTS=host:port,host:port)"
    )]
    NoEndpoint,
    /// `RONDO_NAMING_ENDPOINTS`, read because the builder was given no endpoint, is malformed:
    /// the variable, its value and what is wrong.
    #[error("{0}")]
    BadEnv(String),
    /// An endpoint is not `host:port` or `http://host:port`.
    #[error("bad naming endpoint `{0}`")]
    BadEndpoint(String),
    /// An `https://` endpoint without [`crate::Builder::tls`].
    #[error(
        "naming endpoint `{0}` is https: give the roots its certificate is checked against with Builder::tls"
    )]
    NeedsTls(String),
    /// Every endpoint failed.
    #[error("service {service}: no naming endpoint answered: {}", list(.failures))]
    NoAnswer {
        /// The service asked for.
        service: String,
        /// Each endpoint's failure, in order.
        failures: Vec<NamingError>,
    },
}

fn list(failures: &[NamingError]) -> String {
    failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_error_lists_every_attempt() {
        let e: CallError<std::io::Error> = CallError {
            service: "web".into(),
            reason: GaveUp::AllFailed,
            attempts: vec![
                Attempt {
                    member: Some("m1".into()),
                    address: Some("127.0.0.1:1".into()),
                    error: AttemptError::Connect(std::io::ErrorKind::ConnectionRefused.into()),
                },
                Attempt {
                    member: Some("m2".into()),
                    address: Some("127.0.0.1:2".into()),
                    error: AttemptError::Timeout(Duration::from_millis(250)),
                },
                Attempt {
                    member: None,
                    address: None,
                    error: AttemptError::NoMember(PickError::AllTried {
                        cluster: "web".into(),
                        tried: 2,
                    }),
                },
            ],
        };
        let text = e.to_string();
        assert_eq!(
            text,
            "call to web: every member tried failed (3 attempts: m1 at 127.0.0.1:1: connect \
             failed: connection refused; m2 at 127.0.0.1:2: no answer within 250ms; cluster \
             web: all 2 eligible member(s) already tried)"
        );
        assert_eq!(
            e.last_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        assert!(e.is_all_failed() && !e.is_no_member() && !e.is_deadline());
        assert_eq!(e.service(), "web");
        let members: Vec<_> = e.attempts().map(Attempt::member).collect();
        assert_eq!(members, [Some("m1"), Some("m2"), None]);
        assert_eq!(e.attempts().rev().nth(1).and_then(Attempt::address), Some("127.0.0.1:2"));
        let boxed = e.map_err(|e| e.to_string());
        assert_eq!(boxed.attempts().len(), 3);
        assert!(boxed.is_all_failed());
        let first = boxed.attempts().next().map(Attempt::error);
        assert!(matches!(first, Some(AttemptError::Connect(m)) if m == "connection refused"));
    }

    #[test]
    fn connect_failures_are_told_from_member_failures() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(matches!(Failed::classify(refused), Failed::Connect(_)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(matches!(Failed::classify(reset), Failed::Member(_)));
    }
}
