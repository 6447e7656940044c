//! [`Ineligible`]: the names of the rules that keep a member from new requests. A leaf, so that
//! the member's own health ([`crate::member::health_reason`]) and the balancer's eligibility
//! rules ([`crate::balancer`]) both speak it without depending on each other.

/// Why a member takes no new requests or sessions, in the order the rules are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ineligible {
    /// The operator (or config) disabled it.
    Disabled,
    /// The operator (or config) is draining it: sticky sessions stay, nothing new.
    Draining,
    /// Its health checks (or the registry) say it is down.
    HealthCheck,
    /// Its load agent reported once and has been silent past the agent timeout.
    AgentSilent,
    /// Passive outlier detection ejected it for a while.
    Ejected,
    /// Up, but the cluster prefers the caller's locality group and this member is in another.
    OtherGroup,
}

impl Ineligible {
    /// The reason as status pages, metrics and logs show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Ineligible::Disabled => "disabled",
            Ineligible::Draining => "draining",
            Ineligible::HealthCheck => "health_check",
            Ineligible::Ejected => "ejected",
            Ineligible::AgentSilent => "agent_silent",
            Ineligible::OtherGroup => "other_group",
        }
    }

    /// Whether the reason is the member's health (probes, ejection, agent), which panic mode
    /// overrides, rather than the operator's word or locality.
    pub fn is_health(self) -> bool {
        matches!(self, Ineligible::HealthCheck | Ineligible::Ejected | Ineligible::AgentSilent)
    }
}

impl std::fmt::Display for Ineligible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
