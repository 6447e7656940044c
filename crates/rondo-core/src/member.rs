//! The run-time state of one member: the operator's admin state and who set it, health from
//! probes, passive ejection, slow-start origin and load. Kept by [`crate::Balancer`] and carried
//! across view swaps by member name, so nothing resets because a neighbour changed.

use std::time::Duration;

use crate::ineligible::Ineligible;
use crate::load::Load;
use crate::model::{Actor, AdminState, Policy};
use crate::time::Instant;

/// Everything that changes about a member while rondo runs.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberState {
    /// The operator's word.
    pub admin: AdminState,
    /// Who set `admin`.
    pub admin_by: Actor,
    /// Whether active health checks (or the registry) consider it up.
    pub healthy: bool,
    /// Who set `healthy` last.
    pub health_by: Actor,
    /// When `healthy` last changed.
    pub health_changed: Instant,
    /// Passively ejected until this instant.
    pub ejected_until: Option<Instant>,
    /// Consecutive ejections (each lasts longer); reset by a success after returning.
    pub ejections: u32,
    /// Start of the slow-start ramp; `None` means full weight.
    pub up_since: Option<Instant>,
    /// Counters and estimates.
    pub load: Load,
    /// Sequence number of the last pick that chose it (tie-breaker: least recently picked).
    pub last_pick: u64,
    /// Why its latest failed health check failed (kept after it passes again), and when.
    pub last_probe_failure: Option<(ProbeFailure, Instant)>,
    /// Health checks passed in a row (toward `rise`) and failed in a row (toward `fall`); one
    /// of the two is zero.
    pub probe_streak: (u32, u32),
}

/// Why one health check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeFailure {
    /// The member answered with a status outside the expected range.
    Status(u16),
    /// No connection and answer within the check's timeout.
    Timeout,
    /// Connection refused.
    Refused,
    /// Connection reset, or closed before a status line.
    Reset,
    /// The member's host name did not resolve.
    Dns,
    /// No route to the member (host or network unreachable), or another connect error.
    Unreachable,
    /// Something that is not an HTTP/1 status line.
    NotHttp,
    /// TLS to the member failed.
    Tls(crate::TlsFailure),
    /// A gRPC health check was answered with this non-OK gRPC status.
    Grpc(crate::grpc::Code),
    /// A gRPC health check was answered, but not `SERVING`.
    NotServing,
    /// A UDP health check was answered without its `expect` bytes.
    Unexpected,
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::Status(s) => write!(f, "status {s}"),
            ProbeFailure::Timeout => f.write_str("timeout"),
            ProbeFailure::Refused => f.write_str("refused"),
            ProbeFailure::Reset => f.write_str("reset"),
            ProbeFailure::Dns => f.write_str("dns"),
            ProbeFailure::Unreachable => f.write_str("unreachable"),
            ProbeFailure::NotHttp => f.write_str("not http"),
            ProbeFailure::Tls(t) => t.fmt(f),
            ProbeFailure::Grpc(code) => write!(f, "grpc status {}", code.name()),
            ProbeFailure::NotServing => f.write_str("not serving"),
            ProbeFailure::Unexpected => f.write_str("unexpected answer"),
        }
    }
}

impl MemberState {
    /// A member as configured, healthy, at full weight.
    pub fn new(admin: AdminState, policy: &Policy, now: Instant) -> Self {
        MemberState {
            admin,
            admin_by: Actor::Config,
            healthy: true,
            health_by: Actor::Config,
            health_changed: now,
            ejected_until: None,
            ejections: 0,
            up_since: None,
            load: Load::new(policy.ewma.default_rtt, now),
            last_pick: 0,
            last_probe_failure: None,
            probe_streak: (0, 0),
        }
    }

    /// Up by every measure at `now`: probes, passive ejection, and agent heartbeats (a member
    /// whose agent has reported once and then fell silent past the timeout is unavailable).
    /// The rules are [`health_reason`]'s.
    pub fn is_healthy(&self, now: Instant, policy: &Policy) -> bool {
        health_reason(self, now, policy).is_none()
    }

    /// Whether an existing (sticky) session may stay on this member: draining members keep their
    /// sessions, disabled or unhealthy ones lose them.
    pub fn can_keep_session(&self, now: Instant, policy: &Policy) -> bool {
        self.admin != AdminState::Disabled && self.is_healthy(now, policy)
    }

    /// Share of full weight under slow start, quantised to tenths of the ramp so that weight
    /// indexes are rebuilt at most ten times per ramp; returns the factor and when it next changes.
    pub fn ramp(&self, now: Instant, policy: &Policy) -> (f64, Option<Instant>) {
        let ss = policy.slow_start;
        let Some(since) = self.up_since else { return (1.0, None) };
        if ss.duration.is_zero() || now >= since + ss.duration {
            return (1.0, None);
        }
        if now < since {
            // Ejected members ramp from the moment they return.
            return (f64::from(ss.initial_percent) / 100.0, Some(since));
        }
        let progress = now.since(since).as_secs_f64() / ss.duration.as_secs_f64();
        let step = (progress * 10.0).floor().min(9.0);
        let initial = f64::from(ss.initial_percent.clamp(1, 100)) / 100.0;
        let factor = initial + (1.0 - initial) * step / 10.0;
        let next = since + ss.duration.mul_f64((step + 1.0) / 10.0);
        (factor, Some(next))
    }
}

/// How a request to a member ended, reported to [`crate::Balancer::end_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response arrived; `latency` to its head.
    Success {
        /// Time to response head.
        latency: Duration,
    },
    /// The member failed the request.
    Failure {
        /// How it failed.
        kind: FailureKind,
        /// Time until the failure was seen.
        latency: Duration,
    },
    /// The caller gave up or the request was abandoned for reasons not the member's fault.
    Cancelled,
}

impl Outcome {
    /// The outcome of a gRPC call answered with `code` after `latency` (to the answer's head):
    /// a failure counted like a 5xx when `policy` names the code as the member's
    /// (`grpc_failure_codes`), a success otherwise.
    pub fn of_grpc(
        code: crate::grpc::Code,
        policy: &crate::grpc::GrpcPolicy,
        latency: Duration,
    ) -> Outcome {
        if policy.is_failure(code) {
            Outcome::Failure { kind: FailureKind::Status5xx, latency }
        } else {
            Outcome::Success { latency }
        }
    }
}

/// What went wrong with a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Connection refused or unreachable.
    Connect,
    /// Reset or closed before a response.
    Reset,
    /// No answer in time.
    Timeout,
    /// Answered with a 5xx.
    Status5xx,
}

/// A passive ejection that just happened, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// The member.
    pub member: usize,
    /// Ejected until.
    pub until: Instant,
    /// Consecutive ejections including this one.
    pub count: u32,
}

/// Why the member's health keeps it out at `now`, or `None` when it is up by every measure:
/// probes (or the registry), passive ejection, and agent heartbeats (a member whose agent has
/// reported once and then fell silent past the timeout is unavailable).
/// [`MemberState::is_healthy`] is this returning `None`.
pub fn health_reason(st: &MemberState, now: Instant, policy: &Policy) -> Option<Ineligible> {
    if !st.healthy {
        Some(Ineligible::HealthCheck)
    } else if st.load.agent.is_some_and(|r| !r.is_fresh(now, policy.agent.timeout)) {
        Some(Ineligible::AgentSilent)
    } else if st.ejected_until.is_some_and(|until| now < until) {
        // Last: passive ejection is this router's own observation, which the naming service
        // leaves out of its answers; the reasons before it speak for every caller.
        Some(Ineligible::Ejected)
    } else {
        None
    }
}
