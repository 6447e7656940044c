//! rondo's admin HTTP API (`[admin]`) and the client side of `rondo ctl` ([`client`]).
//!
//! Every call needs `Authorization: Bearer <token>` (compared in constant time); with no token
//! configured every call is refused with 403. GETs never change anything; mutations are POST and
//! PUT, JSON in and out. The dashboard page (`GET /`, `dashboard.rs`) is the one thing served
//! without the token: it holds no data and asks for the token itself. See `docs/admin.md`.

pub mod client;
mod dashboard;
mod members;
mod metrics;
mod operator;
mod parts;
mod probes;
mod queues;
mod server;

pub use parts::AdminParts;
pub use server::{AdminServer, router, start};

pub use rondo_runtime::secret::{constant_time_eq, read_token};
