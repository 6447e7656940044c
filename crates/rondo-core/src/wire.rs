//! The naming service's wire format (JSON), shared by the naming service (`rondo-naming`) and
//! the client library (`rondo-client`) so both sides agree by construction. Durations travel as
//! whole milliseconds in fields named `*_ms`. Only with the `serde` feature.
//!
//! Every naming response also carries the view id in the [`VIEW_ID_HEADER`] header.

use serde::{Deserialize, Serialize};

use crate::{AdminState, Policy};

/// Response header carrying the view id the answer was computed from.
pub const VIEW_ID_HEADER: &str = "rondo-view-id";

/// Where a member comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The configuration (file, admin API or the shared config in etcd).
    Config,
    /// A registration with a lease.
    Registry,
}

/// One member in a naming answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Unique within the service.
    pub name: String,
    /// `host:port`.
    pub address: String,
    /// Relative weight.
    pub weight: u32,
    /// Locality group.
    #[serde(default)]
    pub group: Option<String>,
    /// `active` or `draining` (draining members take no new sessions; disabled and down
    /// members are never listed).
    pub state: AdminState,
    /// Configured or registered.
    pub source: Source,
}

/// `GET /v1/services/{service}`: everything a client needs to balance by itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The service (cluster) name.
    pub service: String,
    /// The view the answer was computed from; grows with every change.
    pub view_id: u64,
    /// The cluster's policy (algorithm, granularity, retry rules, ...).
    pub policy: Policy,
    /// The members that may take work now (up, not disabled, not ejected), in configuration
    /// order.
    pub members: Vec<Member>,
}

/// `GET /v1/lookup/{service}`: one member chosen by the cluster's policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lookup {
    /// The service (cluster) name.
    pub service: String,
    /// The view the pick was made in.
    pub view_id: u64,
    /// The chosen member.
    pub member: Member,
    /// Why it was chosen, e.g. `round-robin: next in order`.
    pub why: String,
}

/// `PUT /v1/services/{service}/members/{member}`: register a member with a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    /// `host:port`.
    pub address: String,
    /// Relative weight (default 100).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Locality group.
    #[serde(default)]
    pub group: Option<String>,
    /// Lease time to live in milliseconds (default 10,000; 1,000 to 3,600,000).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// A lease granted by a registration or renewed by a keepalive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease id (decimal); keep it alive with `POST /v1/leases/{lease}/keepalive`.
    pub lease: String,
    /// Time to live from now, in milliseconds.
    pub ttl_ms: u64,
}

/// `GET /v1/watch?after=N&timeout_ms=T`: returns as soon as the view id passes `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    /// The current view id.
    pub view_id: u64,
    /// Whether it passed `after` (false: the wait timed out).
    pub changed: bool,
}

/// Every error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Error {
    /// What failed, in words.
    pub error: String,
}

/// `Duration` as whole milliseconds.
pub mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes whole milliseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Deserializes whole milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// `Option<Duration>` as whole milliseconds or `null`.
pub mod millis_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes whole milliseconds or `null`.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    /// Deserializes whole milliseconds or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Algorithm, Granularity, HashKeySource};

    #[test]
    fn a_policy_survives_the_wire() {
        let mut policy = Policy {
            algorithm: Algorithm::P2cEwma,
            granularity: Granularity::Session,
            ..Policy::default()
        };
        policy.retry.per_try_timeout = Some(Duration::from_millis(250));
        policy.hash.key = HashKeySource::Header("x-user".into());
        policy.slow_start.duration = Duration::from_secs(3);
        let answer = Answer { service: "web".into(), view_id: 7, policy, members: vec![] };
        let text = serde_json::to_string(&answer).unwrap();
        assert!(text.contains(r#""algorithm":"p2c-ewma""#), "{text}");
        assert!(text.contains(r#""per_try_timeout_ms":250"#), "{text}");
        let back: Answer = serde_json::from_str(&text).unwrap();
        assert_eq!(back, answer);
    }

    #[test]
    fn missing_policy_fields_take_their_defaults() {
        let back: Policy = serde_json::from_str(r#"{"algorithm":"weighted"}"#).unwrap();
        assert_eq!(back, Policy { algorithm: Algorithm::Weighted, ..Policy::default() });
    }
}
