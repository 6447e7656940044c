//! The tower layer's errors: the boxed error its service returns ([`BoxError`]), a transport
//! error from the inner service ([`HttpError`]), the call error inside the box when every
//! option failed ([`BalancedError`]), and how a transport error is classified for failover.

use std::fmt;

use crate::error::{CallError, Failed, is_connect_error};

/// The boxed error of the tower service.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A transport error from the inner service, inside a [`CallError`] of
/// [`Balanced`](super::Balanced).
#[derive(Debug)]
pub struct HttpError(pub BoxError);

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(s) = cur {
            write!(f, ": {s}")?;
            cur = s.source();
        }
        Ok(())
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// The error of a [`Balanced`](super::Balanced) service when every option failed (boxed as
/// [`BoxError`]; downcast to read the attempts: [`CallError::attempts`]).
pub type BalancedError = CallError<HttpError>;

/// A transport error as a failed try: a connect failure (nothing sent) or the member's.
pub(crate) fn classify<E: Into<BoxError>>(e: E) -> Failed<HttpError> {
    let e: BoxError = e.into();
    if is_connect_error(e.as_ref()) {
        Failed::Connect(HttpError(e))
    } else {
        Failed::Member(HttpError(e))
    }
}
