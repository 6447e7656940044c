//! The raw `[[listener]]` table: address, limits, `tls` with its certificates, `udp` flows, and
//! `trust_forwarded_for`.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use super::{OneOrMany, RawAccessLog, RawFilter};

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
