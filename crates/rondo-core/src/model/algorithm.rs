//! How a cluster chooses a member: the [`Algorithm`], when it chooses ([`Granularity`]),
//! consistent hashing's settings, slow start and locality.

use std::fmt;
use std::time::Duration;

/// How a cluster chooses a member. See `docs/algorithms.md` for each one's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Algorithm {
    /// Next member in order.
    #[default]
    RoundRobin,
    /// Uniformly random member (PKUAS).
    Random,
    /// Smooth weighted round robin over static weights (GlassFish lb-weight, nginx).
    Weighted,
    /// GlassFish RMI-IIOP: list randomized once, rotated per context, fail over down the list.
    Rotating,
    /// Ranked by the latest probe round (CLB's table), picks shared by smooth weighted round
    /// robin with weights inversely proportional to each member's probe round trip.
    ResponseTime,
    /// CLB exactly: ranked by the latest probe round, round robin down the ranked table from its
    /// top after each refresh (even shares when there are many picks per round).
    ResponseTimeClb,
    /// Fewest active sessions + in-flight requests per unit of weight (SGD, HAProxy leastconn).
    LeastSessions,
    /// Lowest agent-reported CPU use; least-sessions without fresh reports (SGD).
    LeastCpu,
    /// Most agent-reported free memory; least-sessions without fresh reports (SGD).
    MostFreeMemory,
    /// Power of two choices over peak-EWMA latency x in-flight (Mitzenmacher; Finagle).
    P2cEwma,
    /// Lowest expected delay over every candidate (sampled in large clusters): the higher of the
    /// passive peak-EWMA latency and the latest probe round trip, x (in-flight + 1) / weight,
    /// with a uniform exploration floor (CLB's probes and linkerd's EWMA together).
    Adaptive,
    /// Consistent hashing on a request key, with bounded load.
    Hash,
}

impl Algorithm {
    /// Every algorithm, in documentation order.
    pub const ALL: [Algorithm; 12] = [
        Algorithm::RoundRobin,
        Algorithm::Random,
        Algorithm::Weighted,
        Algorithm::Rotating,
        Algorithm::ResponseTime,
        Algorithm::ResponseTimeClb,
        Algorithm::LeastSessions,
        Algorithm::LeastCpu,
        Algorithm::MostFreeMemory,
        Algorithm::P2cEwma,
        Algorithm::Adaptive,
        Algorithm::Hash,
    ];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round-robin",
            Algorithm::Random => "random",
            Algorithm::Weighted => "weighted",
            Algorithm::Rotating => "rotating",
            Algorithm::ResponseTime => "response-time",
            Algorithm::ResponseTimeClb => "response-time-clb",
            Algorithm::LeastSessions => "least-sessions",
            Algorithm::LeastCpu => "least-cpu",
            Algorithm::MostFreeMemory => "most-free-memory",
            Algorithm::P2cEwma => "p2c-ewma",
            Algorithm::Adaptive => "adaptive",
            Algorithm::Hash => "hash",
        }
    }

    /// Whether picks follow the probe rounds' ranked table (`response-time`,
    /// `response-time-clb`): such a cluster is probed even without a health check.
    pub fn ranks_by_probes(self) -> bool {
        matches!(self, Algorithm::ResponseTime | Algorithm::ResponseTimeClb)
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Algorithm::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a balancing decision is made (PKUAS's three granularities).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Granularity {
    /// Every call is balanced.
    #[default]
    Request,
    /// The member chosen when the session is created keeps the session.
    Session,
    /// The naming service picks once per lookup; the caller keeps the answer.
    Lookup,
}

impl Granularity {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Request => "request",
            Granularity::Session => "session",
            Granularity::Lookup => "lookup",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "request" => Granularity::Request,
            "session" => Granularity::Session,
            "lookup" => Granularity::Lookup,
            _ => return None,
        })
    }
}

/// Which consistent-hashing table `hash` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum HashTable {
    /// Karger et al.'s ring with virtual nodes (ketama).
    #[default]
    Ring,
    /// Google's Maglev lookup table (Eisenbud et al., NSDI 2016).
    Maglev,
}

/// Where `hash` takes its key from (used by the data plane; the core hashes bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum HashKeySource {
    /// The client's IP address.
    #[default]
    ClientAddress,
    /// A request header, by name.
    Header(String),
    /// A cookie, by name.
    Cookie(String),
}

/// Consistent-hashing settings.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct HashPolicy {
    /// Ring or Maglev.
    pub table: HashTable,
    /// Where the key comes from.
    pub key: HashKeySource,
    /// Bounded-load factor `c >= 1` (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
    /// Bounded Loads", SODA 2018): no member takes more than `ceil(c * average)` active requests.
    /// `None` turns the bound off.
    pub bounded_load: Option<f64>,
    /// Virtual nodes per member of average weight on the ring.
    pub ring_vnodes: u32,
}

impl Default for HashPolicy {
    fn default() -> Self {
        HashPolicy {
            table: HashTable::Ring,
            key: HashKeySource::ClientAddress,
            bounded_load: Some(1.25),
            ring_vnodes: 160,
        }
    }
}

/// Ramp-up of members that just joined or recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct SlowStart {
    /// How long the ramp lasts; zero disables slow start.
    #[cfg_attr(feature = "serde", serde(rename = "duration_ms", with = "crate::wire::millis"))]
    pub duration: Duration,
    /// Share of the full weight at the start of the ramp, 1..=100 percent.
    pub initial_percent: u8,
}

impl Default for SlowStart {
    fn default() -> Self {
        SlowStart { duration: Duration::ZERO, initial_percent: 10 }
    }
}

/// Locality preference (SGD load-balancing groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct Locality {
    /// Prefer members of the caller's group while that group has a healthy member.
    pub prefer_local: bool,
}

impl Default for Locality {
    fn default() -> Self {
        Locality { prefer_local: true }
    }
}
