//! The raw `[cluster.NAME]` table (also a registration's declared `policy`) and its parts:
//! members (inline or `[member.NAME]`), health, outlier, retry, slow start, hashing, agents,
//! EWMA, sessions, upstream TLS, xDS and `members_dns`.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// `[cluster.NAME]`, or a registration's declared `policy` (without `members` and
/// `upstream_tls`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub algorithm: Option<String>,
    pub granularity: Option<String>,
    pub upstream_protocol: Option<String>,
    pub panic_threshold_percent: Option<u64>,
    #[serde(default)]
    pub members: Vec<RawMemberEntry>,
    pub health: Option<RawHealth>,
    pub outlier: Option<RawOutlier>,
    pub retry: Option<RawRetry>,
    pub slow_start: Option<RawSlowStart>,
    pub locality: Option<RawLocality>,
    pub hash: Option<RawHash>,
    pub agent: Option<RawAgent>,
    pub ewma: Option<RawEwma>,
    pub session: Option<RawSession>,
    pub upstream_tls: Option<RawUpstreamTls>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "max_connection_age")]
    pub max_connection_age_ms: Option<u64>,
    pub max_requests_per_connection: Option<u64>,
    pub grpc_failure_codes: Option<Vec<String>>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "connect_timeout")]
    pub connect_timeout_ms: Option<u64>,
    pub max_requests: Option<u64>,
    pub max_requests_per_member: Option<u64>,
    pub max_connections: Option<u64>,
    pub max_pending: Option<u64>,
    pub proxy_protocol: Option<String>,
    pub xds: Option<RawClusterXds>,
    pub members_dns: Option<RawMembersDns>,
    pub view_id_header: Option<bool>,
}

/// A cluster's `xds`: how proxyless gRPC clients balance it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClusterXds {
    pub lb: Option<String>,
}

/// A cluster's `members_dns`: members discovered by resolving a name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMembersDns {
    pub name: Option<String>,
    pub srv: Option<String>,
    pub port: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "refresh")]
    pub refresh_ms: Option<u64>,
    pub resolver: Option<String>,
    pub max_members: Option<u64>,
}

/// A cluster's `upstream_tls`: TLS (and mTLS) to its members.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamTls {
    pub ca: String,
    pub server_name: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// One of a cluster's `members`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMember {
    pub name: String,
    pub address: String,
    pub weight: Option<u64>,
    pub group: Option<String>,
    pub state: Option<String>,
}

/// `[member.NAME]`: a member defined once, listed by name in the clusters it serves; its
/// health, ejection, agent reports, drain and load are one state in all of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSharedMember {
    pub address: String,
    pub weight: Option<u64>,
    pub group: Option<String>,
    pub state: Option<String>,
}

/// One entry of a cluster's `members`: a table (`{ name = ..., address = ... }`), or the
/// name of a `[member.NAME]`.
#[derive(Debug)]
pub(crate) enum RawMemberEntry {
    Inline(RawMember),
    Shared(String),
}

impl<'de> Deserialize<'de> for RawMemberEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawMemberEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member table or the name of a [member.NAME]")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawMemberEntry, E> {
                Ok(RawMemberEntry::Shared(v.to_owned()))
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawMemberEntry, A::Error> {
                RawMember::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawMemberEntry::Inline)
            }
        }
        d.deserialize_any(V)
    }
}

/// A cluster's `health`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealth {
    pub kind: Option<String>,
    pub path: Option<String>,
    pub expect_status: Option<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "interval")]
    pub interval_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "timeout")]
    pub timeout_ms: Option<u64>,
    pub rise: Option<u64>,
    pub fall: Option<u64>,
    pub grpc: Option<RawGrpcHealth>,
    pub port: Option<u64>,
    pub udp: Option<RawUdpHealth>,
}

/// A cluster's `health.udp`: a datagram sent, an answer expected (text, or hex with `*_hex`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUdpHealth {
    pub send: Option<String>,
    pub send_hex: Option<String>,
    pub expect: Option<String>,
    pub expect_hex: Option<String>,
}

/// A cluster's `health.grpc`: gRPC's health-checking protocol.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGrpcHealth {
    pub service: Option<String>,
}

/// A cluster's `outlier`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOutlier {
    pub consecutive_failures: Option<u64>,
    pub count_5xx: Option<bool>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "base_ejection")]
    pub base_ejection_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "max_ejection")]
    pub max_ejection_ms: Option<u64>,
    pub max_ejected_percent: Option<u64>,
}

/// A cluster's `retry`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    pub attempts: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "per_try_timeout")]
    pub per_try_timeout_ms: Option<u64>,
    pub budget_percent: Option<u64>,
    pub budget_min_per_sec: Option<u64>,
    pub retry_on: Option<Vec<String>>,
    pub backoff: Option<RawBackoff>,
    pub retry_non_idempotent: Option<bool>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub retry_buffer_bytes: Option<u64>,
    pub hedge: Option<RawHedge>,
}

/// A cluster's `retry.hedge`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHedge {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "after")]
    pub after_ms: Option<u64>,
    pub max: Option<u64>,
}

/// A cluster's `retry.backoff`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackoff {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "base")]
    pub base_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "max")]
    pub max_ms: Option<u64>,
}

/// A cluster's `slow_start`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSlowStart {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "duration")]
    pub duration_ms: Option<u64>,
    pub initial_percent: Option<u64>,
}

/// A cluster's `locality`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLocality {
    pub prefer_local: Option<bool>,
}

/// A cluster's `hash`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHash {
    pub table: Option<String>,
    pub key: Option<String>,
    pub bounded_load: Option<f64>,
    pub ring_vnodes: Option<u64>,
}

/// A cluster's `agent`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "timeout")]
    pub timeout_ms: Option<u64>,
    pub misses: Option<u64>,
}

/// A cluster's `ewma`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEwma {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "decay")]
    pub decay_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "default_rtt")]
    pub default_rtt_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "failure_penalty")]
    pub failure_penalty_ms: Option<u64>,
}

/// A cluster's `session`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSession {
    pub cookie: Option<String>,
    pub header: Option<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "idle_timeout")]
    pub idle_timeout_ms: Option<u64>,
}
