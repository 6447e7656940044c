//! The tower layer: [`BalanceLayer`] wraps an HTTP service (a hyper-util client, the transport
//! under `tonic::client::Grpc`) into [`Balanced`], which sends each request to a member picked
//! by the service's policy by rewriting the request's URI authority, and fails over like the
//! router does:
//!
//! - a connect failure goes to the next member, whatever the method, as long as the request's
//!   body is still in its [`SlotBody`] (the inner service takes it out on its first read, so a
//!   connection that failed first leaves it there);
//! - a reset or a per-try timeout goes to the next member only for idempotent methods (`GET`,
//!   `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) whose body was not consumed; a try whose time
//!   ran out while the inner service was still not ready to take it (a saturated concurrency
//!   limit) sent nothing: it goes on like a refused connection and its member is not charged;
//! - a response, whatever its status, goes back to the caller (a 5xx counts as a failure of
//!   the member for its estimators and outlier detection, and so does a gRPC trailers-only
//!   answer whose `grpc-status` the policy's `grpc_failure_codes` name; a status in the
//!   trailers is not read here).
//!
//! The member's in-flight count ends when the response body's last frame passes (a body error
//! counts as a reset). A response carrying a `rondo-view-id` header newer than the answer held
//! makes the client refetch.
//!
//! Laid out like tower's own middleware: `layer.rs` ([`BalanceLayer`], and [`Client::layer`] /
//! [`Session::layer`](crate::Session::layer)), `service.rs` ([`Balanced`]), `future.rs` (its
//! named [`ResponseFuture`] and one try's future), `body.rs` ([`SlotBody`], [`Tracked`]) and
//! `error.rs` ([`BoxError`], [`HttpError`], [`BalancedError`]). Each file only imports the ones
//! after it in that list; the call loop itself is `call/`'s.
//!
//! [`Client::layer`]: crate::Client::layer

mod body;
mod error;
mod future;
mod layer;
mod service;

pub use body::{SlotBody, Tracked};
pub use error::{BalancedError, BoxError, HttpError};
pub use future::ResponseFuture;
pub use layer::BalanceLayer;
pub use service::Balanced;

#[cfg(test)]
mod tests;
