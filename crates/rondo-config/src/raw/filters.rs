//! The raw `filters` of a route or listener: one inline table per filter, keyed by its name, with
//! each filter's options.

use std::collections::BTreeMap;

use serde::Deserialize;

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
