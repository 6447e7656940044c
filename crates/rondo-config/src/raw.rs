//! The file's schema exactly as written: serde structs that reject unknown fields and leave
//! every default and every spelling (algorithm, protocol, state...) to the compiler, which checks
//! them all and reports every problem at once. Numbers are wide (`u64`) here so a value out of
//! range is a semantic error that names the allowed range, not a serde type error.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

mod cluster;
mod filters;
mod listener;
mod route;

pub(crate) use cluster::*;
pub(crate) use filters::*;
pub(crate) use listener::*;
pub(crate) use route::*;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    /// Read by `include.rs` before the schema: the files read after this one.
    #[serde(rename = "include")]
    pub _include: Option<Vec<String>>,
    pub router: Option<RawRouter>,
    pub admin: Option<RawAdmin>,
    pub naming: Option<RawNaming>,
    pub agent: Option<RawAgentReceiver>,
    pub log: Option<RawLog>,
    pub metrics: Option<RawMetrics>,
    #[serde(default)]
    pub listener: Vec<RawListener>,
    #[serde(default)]
    pub route: Vec<RawRoute>,
    #[serde(default)]
    pub cluster: BTreeMap<String, RawCluster>,
    #[serde(default)]
    pub queue: Vec<RawQueue>,
    /// Checked here with its spans; merged into every cluster and route by `defaults.rs`.
    pub defaults: Option<RawDefaults>,
    /// `[member.NAME]`: members defined once and listed by name in several clusters.
    #[serde(default)]
    pub member: BTreeMap<String, RawSharedMember>,
    /// `[tier]`: the load view the routers of a tier share.
    pub tier: Option<RawTier>,
    pub tracing: Option<RawTracing>,
}

/// `[tracing]`: spans exported over OTLP/HTTP (cargo feature `otel`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    pub otlp_endpoint: String,
    pub service_name: Option<String>,
    pub sample_ratio: Option<f64>,
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "export_timeout")]
    pub export_timeout_ms: Option<u64>,
    pub max_queue: Option<u64>,
}

/// `[tier]`: the routers of a tier publish the load they measure per member and count the
/// others'.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTier {
    pub nats: String,
    pub name: Option<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "interval")]
    pub interval_ms: Option<u64>,
}

/// `[defaults]`: what every `[cluster.NAME]` (the cluster fields) and every `[[route]]` (the
/// route fields) inherits, field by field, unless it sets the field itself. The types are the
/// cluster's and the route's own, so a default is checked as the field would be.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "read only to check the fields; `defaults.rs` merges the text")]
pub(crate) struct RawDefaults {
    pub algorithm: Option<String>,
    pub granularity: Option<String>,
    pub upstream_protocol: Option<String>,
    pub panic_threshold_percent: Option<u64>,
    pub health: Option<RawHealth>,
    pub outlier: Option<RawOutlier>,
    pub retry: Option<RawRetry>,
    pub slow_start: Option<RawSlowStart>,
    pub locality: Option<RawLocality>,
    pub hash: Option<RawHash>,
    pub ewma: Option<RawEwma>,
    pub session: Option<RawSession>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "max_connection_age")]
    pub max_connection_age_ms: Option<u64>,
    pub max_requests_per_connection: Option<u64>,
    pub grpc_failure_codes: Option<Vec<String>>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "connect_timeout")]
    pub connect_timeout_ms: Option<u64>,
    pub max_requests: Option<u64>,
    pub max_requests_per_member: Option<u64>,
    /// The routes' fields.
    #[serde(default, deserialize_with = "crate::units::millis", alias = "idle_timeout")]
    pub idle_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "request_timeout")]
    pub request_timeout_ms: Option<u64>,
    pub filters: Option<Vec<RawFilter>>,
}

/// `[[queue]]`: a durable queue that `queue` listeners accept messages into.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    pub name: String,
    pub backend: Option<String>,
    pub directory: Option<String>,
    pub nats_url: Option<String>,
    pub max_messages: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_message_bytes: Option<u64>,
    pub max_attempts: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "backoff_initial")]
    pub backoff_initial_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "backoff_max")]
    pub backoff_max_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "lease")]
    pub lease_ms: Option<u64>,
    pub concurrency: Option<u64>,
    pub session_header: Option<String>,
    pub session_partitions: Option<u64>,
}

/// `[router]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouter {
    pub group: Option<String>,
    pub tier_key: Option<String>,
    pub tier_key_file: Option<String>,
    pub upgrade_socket: Option<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "drain_timeout")]
    pub drain_timeout_ms: Option<u64>,
    pub revocations_file: Option<String>,
    pub watch_config: Option<bool>,
}

/// `[admin]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<String>,
    pub tls: Option<RawListenerTls>,
    pub ready_path: Option<String>,
    pub live_path: Option<String>,
    pub probe_listen: Option<String>,
    pub ready_clusters: Option<Vec<String>>,
}

/// `[naming]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNaming {
    pub listen: Option<String>,
    pub registry: Option<String>,
    pub snapshot: Option<String>,
    pub etcd_endpoints: Option<Vec<String>>,
    pub etcd_prefix: Option<String>,
    pub dns_listen: Option<String>,
    pub dns_zone: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<String>,
    pub max_registrations_per_service: Option<u64>,
    pub max_registrations: Option<u64>,
    pub allowed_hosts: Option<Vec<String>>,
    pub allow_registered_clusters: Option<bool>,
    pub tls: Option<RawListenerTls>,
    pub xds: Option<RawXds>,
    pub parent: Option<Vec<String>>,
}

/// `[naming] xds`: the xDS (ADS) server for proxyless gRPC clients.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawXds {
    pub listen: Option<String>,
    pub max_clients: Option<u64>,
}

/// `[agent]`: the router's receiver of load-agent heartbeats.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgentReceiver {
    pub listen: Option<String>,
    pub key: Option<String>,
    pub key_file: Option<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "interval")]
    pub interval_ms: Option<u64>,
    pub tls: Option<RawListenerTls>,
}

/// `[log]`: the process's log (stderr).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    pub format: Option<String>,
    pub level: Option<String>,
}

/// A listener's `access_log`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccessLog {
    pub path: String,
    pub format: Option<String>,
    pub fields: Option<Vec<String>>,
}

/// `[metrics]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "departed_grace")]
    pub departed_grace_ms: Option<u64>,
}

/// A string or an array of strings (`method = "GET"` or `method = ["GET", "POST"]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OneOrMany(pub Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_owned()]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany(out))
            }
        }
        d.deserialize_any(V)
    }
}
