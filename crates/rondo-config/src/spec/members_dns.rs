//! A cluster's compiled `members_dns`: the DNS question that finds its members, and how often
//! it is asked again.

use std::net::SocketAddr;
use std::time::Duration;

/// A cluster's `members_dns`: members discovered through DNS, re-resolved by the answer's TTL
/// within [`MembersDnsSpec::MIN_REFRESH`] and `refresh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembersDnsSpec {
    /// What is asked.
    pub query: DnsQuery,
    /// The longest time an answer is kept before asking again (`refresh_ms`); a shorter TTL
    /// asks sooner.
    pub refresh: Duration,
    /// The DNS server asked (`resolver`); `None`: the system's (`/etc/resolv.conf`).
    pub resolver: Option<SocketAddr>,
    /// Most members taken from one answer (`max_members`); the rest are left out.
    pub max_members: u32,
}

impl MembersDnsSpec {
    /// Default `refresh_ms`.
    pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
    /// Shortest time between two resolutions, whatever the TTL (and the least `refresh_ms`).
    pub const MIN_REFRESH: Duration = Duration::from_secs(1);
    /// Largest `refresh_ms`.
    pub const MAX_REFRESH: Duration = Duration::from_secs(86_400);
    /// Default `max_members`.
    pub const DEFAULT_MAX_MEMBERS: u32 = 1_000;
    /// Largest `max_members`.
    pub const MAX_MAX_MEMBERS: u32 = 10_000;
}

/// The question a `members_dns` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsQuery {
    /// A and AAAA records of `name`; each address a member on `port`.
    Address {
        /// The name resolved (`name`).
        name: String,
        /// The members' port (`port`).
        port: u16,
    },
    /// SRV records of `name`; each target's addresses members on the record's port, weighted
    /// by its weight (only the records of the lowest priority).
    Srv {
        /// The SRV name (`srv`), e.g. `_http._tcp.api.internal`.
        name: String,
    },
}
