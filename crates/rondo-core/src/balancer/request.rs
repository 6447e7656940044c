//! What a pick is asked ([`PickRequest`]) and why it may find no member ([`PickError`]).

use crate::time::Instant;

/// What the caller knows about the request being placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickRequest<'a> {
    /// Now, on the caller's monotonic clock.
    pub now: Instant,
    /// The caller's locality group (the router's, or the client's).
    pub group: Option<&'a str>,
    /// Hash of the request key for `hash` ([`crate::hash::hash_key`]).
    pub hash: Option<u64>,
    /// A `rotating` context from [`crate::Balancer::new_context`]; `None` starts a new one per pick.
    pub context: Option<u32>,
    /// Members already tried for this request (retries go elsewhere).
    pub exclude: &'a [usize],
}

/// Why no member could be picked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// Nothing is eligible.
    #[error(
        "cluster {cluster}: no eligible member ({members} members: {active} active, {healthy} healthy)"
    )]
    NoEligible {
        /// Cluster name.
        cluster: String,
        /// Members configured.
        members: usize,
        /// Active (not draining or disabled).
        active: usize,
        /// Healthy among the active.
        healthy: usize,
    },
    /// Every eligible member was already tried.
    #[error("cluster {cluster}: all {tried} eligible member(s) already tried")]
    AllTried {
        /// Cluster name.
        cluster: String,
        /// How many were excluded.
        tried: usize,
    },
    /// The cluster has `max_requests` requests in flight.
    #[error("cluster {cluster}: {limit} requests in flight, its max_requests")]
    AtMaxRequests {
        /// Cluster name.
        cluster: String,
        /// The cap.
        limit: u32,
    },
    /// Every eligible member not yet tried has `max_requests_per_member` requests in flight.
    #[error(
        "cluster {cluster}: every eligible member has {limit} requests in flight, its max_requests_per_member"
    )]
    AtMaxPerMember {
        /// Cluster name.
        cluster: String,
        /// The cap.
        limit: u32,
    },
}

impl PickError {
    /// The circuit breaker that refused the pick (`max_requests`, `max_requests_per_member`),
    /// if one did.
    pub fn breaker(&self) -> Option<&'static str> {
        match self {
            PickError::AtMaxRequests { .. } => Some("max_requests"),
            PickError::AtMaxPerMember { .. } => Some("max_requests_per_member"),
            _ => None,
        }
    }
}
