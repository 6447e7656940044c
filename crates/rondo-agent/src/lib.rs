//! SGD Advanced Load Management for rondo: the load agent that runs beside a member and reports
//! its CPU use, free memory and sessions ([`agent`]), the router's receiver that checks those
//! reports and feeds them to the balancers ([`receiver`]), and the authenticated datagram format
//! between them ([`wire`]). See `docs/agent.md`.

pub mod agent;
pub mod receiver;
pub mod wire;

pub use agent::{AgentError, AgentOpts};
pub use receiver::{Receiver, ReceiverOpts, ReceiverStats, Resume};
pub use wire::Key;
