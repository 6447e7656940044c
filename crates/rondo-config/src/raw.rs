//! The file's schema exactly as written: serde structs that reject unknown fields and leave
//! every default and every spelling (algorithm, protocol, state...) to the compiler, which checks
//! them all and reports every problem at once. Numbers are wide (`u64`) here so a value out of
//! range is a semantic error that names the allowed range, not a serde type error.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

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

/// `[[listener]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub name: String,
    pub listen: String,
    pub protocol: Option<String>,
    pub max_connections: Option<u64>,
    pub backlog: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "header_read_timeout")]
    pub header_read_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "body_read_timeout")]
    pub body_read_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_header_bytes: Option<u64>,
    pub max_headers: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_body_bytes: Option<u64>,
    pub trust_forwarded_for: Option<Trust>,
    pub proxy_protocol: Option<String>,
    pub trusted_sources: Option<OneOrMany>,
    pub error_detail: Option<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "h2_keepalive_interval")]
    pub h2_keepalive_interval_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "h2_keepalive_timeout")]
    pub h2_keepalive_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "h2_shutdown_timeout")]
    pub h2_shutdown_timeout_ms: Option<u64>,
    pub h2_max_resets: Option<u64>,
    pub h2_max_resets_per_address: Option<u64>,
    pub access_log: Option<RawAccessLog>,
    pub tls: Option<RawListenerTls>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "max_connection_age")]
    pub max_connection_age_ms: Option<u64>,
    pub max_requests_per_connection: Option<u64>,
    pub routing: Option<String>,
    pub filters: Option<Vec<RawFilter>>,
    pub http3: Option<bool>,
    pub http3_max_streams: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "http3_idle_timeout")]
    pub http3_idle_timeout_ms: Option<u64>,
    pub http3_retry_above: Option<u64>,
    pub http3_0rtt: Option<bool>,
    pub udp: Option<RawListenerUdp>,
    /// `splice = "auto" | "off"` (compile/splice.rs).
    pub splice: Option<String>,
}

/// A `udp` listener's `udp` table: its flows.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListenerUdp {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "idle_timeout")]
    pub idle_timeout_ms: Option<u64>,
    pub max_flows: Option<u64>,
    pub granularity: Option<String>,
}

/// A listener's `tls`: terminate TLS with these certificates.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListenerTls {
    #[serde(default)]
    pub certs: Vec<RawCertKey>,
    pub client_ca: Option<String>,
    pub client_auth: Option<String>,
}

/// One of a listener's `tls.certs`: a certificate chain and its private key (PEM files).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCertKey {
    pub cert: String,
    pub key: String,
    /// A DER OCSP response file to staple, or `"fetch"` (ocsp.rs).
    pub ocsp: Option<String>,
}

/// `[[route]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub name: Option<String>,
    pub listener: String,
    #[serde(rename = "match")]
    pub matcher: Option<RawMatch>,
    /// Empty when absent: a route whose filters answer every request needs none.
    #[serde(default)]
    pub cluster: String,
    /// A weighted split instead of `cluster`.
    pub clusters: Option<Vec<RawWeighted>>,
    #[serde(default)]
    pub backups: Vec<String>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "idle_timeout")]
    pub idle_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::millis", alias = "request_timeout")]
    pub request_timeout_ms: Option<u64>,
    pub auth: Option<RawAuth>,
    pub login: Option<RawLogin>,
    pub priority: Option<i64>,
    pub multicast: Option<Vec<RawBranch>>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub multicast_max_body_bytes: Option<u64>,
    pub session_replay: Option<RawSessionReplay>,
    pub filters: Option<Vec<RawFilter>>,
}

/// One of a route's (or a listener's) `filters`: an inline table with exactly one key, the
/// filter's name (a struct of options rather than an enum, so that an unknown name is an
/// unknown field with a suggestion, and the schema reaches every filter's fields).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFilter {
    pub request_id: Option<RawRequestId>,
    pub headers: Option<RawHeaders>,
    pub rewrite: Option<RawRewrite>,
    pub redirect: Option<RawRedirect>,
    pub respond: Option<RawRespond>,
    pub soap: Option<RawSoap>,
    pub rate_limit: Option<RawRateLimit>,
    pub fault: Option<RawFault>,
    pub mirror: Option<RawMirror>,
    pub cors: Option<RawCors>,
    pub compress: Option<RawCompress>,
    pub grpc_web: Option<RawGrpcWeb>,
    pub redirect_to_member: Option<RawRedirectToMember>,
}

/// `redirect_to_member`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedirectToMember {
    pub status: Option<u64>,
    pub keep_query: Option<bool>,
}

/// `grpc_web`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGrpcWeb {
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_body_bytes: Option<u64>,
}

/// `soap`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSoap {
    pub to: String,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_body_bytes: Option<u64>,
}

/// `rate_limit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub key: Option<String>,
    pub rate: Option<String>,
    pub burst: Option<u64>,
    pub max_keys: Option<u64>,
    pub scope: Option<String>,
}

/// `fault`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFault {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "delay")]
    pub delay_ms: Option<u64>,
    pub delay_percent: Option<f64>,
    pub abort_status: Option<u64>,
    pub abort_percent: Option<f64>,
    pub header: Option<String>,
}

/// `mirror`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMirror {
    pub cluster: String,
    pub percent: Option<f64>,
    pub queue: Option<u64>,
}

/// `compress`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCompress {
    pub types: Option<Vec<String>>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub min_bytes: Option<u64>,
    pub level: Option<u64>,
    pub encodings: Option<Vec<String>>,
}

/// `cors`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCors {
    #[serde(default)]
    pub allow_origins: Vec<String>,
    pub allow_methods: Option<Vec<String>>,
    #[serde(default)]
    pub allow_headers: Vec<String>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    pub allow_credentials: Option<bool>,
    #[serde(default, deserialize_with = "crate::units::seconds", alias = "max_age")]
    pub max_age_s: Option<u64>,
}

/// `request_id`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRequestId {
    pub header: Option<String>,
    pub trace: Option<bool>,
}

/// `headers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeaders {
    pub request: Option<RawFieldEdits>,
    pub response: Option<RawFieldEdits>,
}

/// `headers.request` and `headers.response`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFieldEdits {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `rewrite`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRewrite {
    pub path_prefix: Option<String>,
    pub path_regex: Option<String>,
    pub to: Option<String>,
    pub host: Option<String>,
}

/// `redirect`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedirect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u64>,
    pub path: Option<String>,
    pub status: Option<u64>,
    pub keep_query: Option<bool>,
}

/// `respond`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub status: Option<u64>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub body: Option<String>,
    pub body_file: Option<String>,
}

/// One of a route's weighted `clusters`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWeighted {
    pub cluster: String,
    pub weight: Option<u64>,
}

/// One of a route's `multicast` branches.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBranch {
    pub cluster: String,
    #[serde(default)]
    pub backups: Vec<String>,
    pub queue: Option<u64>,
}

/// A route's `session_replay`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSessionReplay {
    pub max_messages: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_total_bytes: Option<u64>,
}

/// A route's `login`: members may sign users on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLogin {
    #[serde(default, deserialize_with = "crate::units::millis", alias = "ttl")]
    pub ttl_ms: Option<u64>,
}

/// A route's `auth`: the sign-on token it requires.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAuth {
    pub issuer: String,
    pub audience: String,
    pub keys: String,
    pub require: Option<BTreeMap<String, String>>,
    pub claims: Option<Vec<String>>,
}

/// A route's `match`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub host: Option<String>,
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    pub method: Option<OneOrMany>,
    pub headers: Option<BTreeMap<String, String>>,
    pub headers_present: Option<Vec<String>>,
    pub headers_absent: Option<Vec<String>>,
    pub headers_regex: Option<BTreeMap<String, String>>,
    pub path_regex: Option<String>,
    pub query: Option<BTreeMap<String, String>>,
    pub body_json: Option<BTreeMap<String, String>>,
    pub body_xml: Option<RawBodyXml>,
    #[serde(default, deserialize_with = "crate::units::bytes")]
    pub max_peek_bytes: Option<u64>,
    pub sni: Option<String>,
}

/// A match's `body_xml`: an element path in the body, with namespace prefixes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBodyXml {
    pub path: String,
    pub ns: Option<BTreeMap<String, String>>,
    pub equals: Option<String>,
}

/// `trust_forwarded_for`: `true`, `false`, or networks (a CIDR or an array of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Trust {
    All(bool),
    Networks(Vec<String>),
}

impl<'de> Deserialize<'de> for Trust {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Trust;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false, a CIDR or an array of CIDRs")
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Trust, E> {
                Ok(Trust::All(v))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Trust, E> {
                Ok(Trust::Networks(vec![v.to_owned()]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Trust, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(Trust::Networks(out))
            }
        }
        d.deserialize_any(V)
    }
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
