//! rondo's pure balancing core.
//!
//! This crate holds the policy model ([`View`], [`ClusterSpec`], [`Policy`], [`MemberSpec`]),
//! the per-cluster run-time state and every picker ([`Balancer`]), and the load estimators the
//! pickers read ([`load`]). The router, the naming service and the client library all balance
//! through it, so a policy behaves identically wherever it is enforced.
//!
//! Architecture invariant: no I/O, no clock, no global random generator, no async runtime. Time
//! is an [`Instant`] argument and randomness an [`Entropy`] argument, so every decision can be
//! replayed exactly in a test.

pub mod hash;
pub mod member_url;
pub mod model;
pub mod path;
pub mod rng;
pub mod split;
pub mod time;
pub mod traffic;
#[cfg(feature = "serde")]
pub mod wire;

pub use model::*;
pub use rng::{Entropy, SplitMix64};
pub use time::Instant;

pub mod balancer;
pub mod bucket;
pub mod budget;
pub mod explain;
pub mod failover;
pub mod grpc;
mod ineligible;
pub mod load;
pub mod member;
pub mod shadow;
mod tree;

pub use balancer::handoff;
pub use balancer::{
    ADAPTIVE_EXPLORE_ONE_IN, ADAPTIVE_SCAN, ADAPTIVE_STALL, Balancer, Eligibility, Ineligible,
    PickError, PickRequest,
};
pub use budget::RetryBudget;
pub use explain::{CandidateInfo, Decision, Explanation, Scope, Why};
pub use failover::{Failover, Stop, TryFailure};
pub use member::{Ejection, FailureKind, MemberState, Outcome, ProbeFailure};
pub use shadow::{ShadowMember, ShadowReport};
