//! The call internals, shared by every way to call (a closure through [`crate::Client::call`]
//! or a session, an HTTP request through the tower layer) and knowing none of them:
//!
//! - `pick.rs`: what a call asks of the pick ([`Plan`]), the pick of one try's member with the
//!   retry budget in the same lock hold ([`crate::inner::Inner::pick`]), and the member's
//!   request it begins ([`Ticket`], ended in the core when dropped);
//! - `run.rs`: the call loop, one hand-written future ([`Run`]) driving the core's failover
//!   engine over the [`Tries`] of one call (how a try starts, whether the call is still whole,
//!   what the caller gets from the try that answered).
//!
//! The facade (`client/`) and the tower layer (`tower/`) each implement [`Tries`] and start a
//! [`Run`]; nothing here imports either of them.

mod pick;
mod run;

pub(crate) use pick::{Plan, Ticket};
pub(crate) use run::{Run, Tries};
