//! The raw `[[route]]` table: its clusters, split, multicast, session replay, login and auth, and
//! its `match`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{OneOrMany, RawFilter};

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
