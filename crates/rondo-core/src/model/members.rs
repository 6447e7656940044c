//! A member as configured or registered, the operator's word on it ([`AdminState`]) and who
//! changed its state ([`Actor`]).

use std::fmt;

/// One server instance as configured or registered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberSpec {
    /// Unique within its cluster; state survives view swaps by name.
    pub name: String,
    /// `host:port` (resolved by the data plane, never by the core).
    pub address: String,
    /// Relative weight, 1..=1_000_000 (validated by the config layer; 0 is refused there).
    pub weight: u32,
    /// Locality group (SGD load-balancing group, a zone); `None` belongs to no group.
    pub group: Option<String>,
    /// The admin state the configuration asks for.
    pub admin: AdminState,
}

/// The operator's word on a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum AdminState {
    /// Takes new sessions and requests.
    #[default]
    Active,
    /// Takes no new sessions; sticky sessions and in-flight requests finish (SGD "can start
    /// applications" off).
    Draining,
    /// Takes nothing, not even in panic mode.
    Disabled,
}

impl AdminState {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Active => "active",
            AdminState::Draining => "draining",
            AdminState::Disabled => "disabled",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => AdminState::Active,
            "draining" => AdminState::Draining,
            "disabled" => AdminState::Disabled,
            _ => return None,
        })
    }
}

/// Who changed a member's state; shown wherever the state is shown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Actor {
    /// The configuration file or an applied config.
    Config,
    /// A named operator through the admin API or `rondo ctl`.
    Operator(String),
    /// The member's load agent (missed heartbeats).
    Agent,
    /// Active health checks.
    HealthCheck,
    /// Passive outlier detection.
    OutlierDetection,
    /// The naming service registry (lease lapsed, registration).
    Registry,
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Actor::Config => f.write_str("config"),
            Actor::Operator(who) => write!(f, "operator:{who}"),
            Actor::Agent => f.write_str("agent"),
            Actor::HealthCheck => f.write_str("health-check"),
            Actor::OutlierDetection => f.write_str("outlier-detection"),
            Actor::Registry => f.write_str("registry"),
        }
    }
}
