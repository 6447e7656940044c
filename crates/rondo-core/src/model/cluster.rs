//! A cluster ([`ClusterSpec`]): its members and policy, how the data plane speaks to them
//! (protocol, TLS) and how a session sticks to one.

use std::time::Duration;

use super::members::MemberSpec;
use super::policy::Policy;

/// Upstream protocol for a cluster's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive.
    #[default]
    Http1,
    /// HTTP/2 prior knowledge (gRPC).
    Http2,
    /// Raw TCP (for `tcp` listeners).
    Tcp,
    /// UDP datagrams (for `udp` listeners).
    Udp,
}

/// A named set of members with a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// Unique name.
    pub name: String,
    /// Members in configuration order (the order `round-robin` walks).
    pub members: Vec<MemberSpec>,
    /// How the cluster is balanced.
    pub policy: Policy,
    /// How the data plane talks to members.
    pub upstream_protocol: UpstreamProtocol,
    /// How `session` granularity pins a client to its member.
    pub sticky: StickySession,
    /// TLS to the members (`upstream_tls`), when set: requests, TCP sessions and health checks
    /// go over TLS, members verified against `ca`.
    pub upstream_tls: Option<UpstreamTls>,
}

/// A cluster's `upstream_tls`: what the router trusts and presents when it speaks TLS to the
/// members (paths resolved against the configuration file's directory; the files are read by
/// the runtime, never here).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// PEM roots members' certificates are verified against.
    pub ca: std::path::PathBuf,
    /// The name members' certificates must be valid for; `None`: each member's host.
    pub server_name: Option<String>,
    /// The router's certificate chain (PEM), presented to members that ask (mTLS).
    pub cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `cert`.
    pub key: Option<std::path::PathBuf>,
}

/// Why TLS to a member failed (a request's 502 and a health check say it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsFailure {
    /// The member's certificate is not valid for the name the router asked for.
    NotValidForName,
    /// The member's certificate has expired (or is not valid yet).
    Expired,
    /// The member's certificate is not signed by the cluster's `ca`.
    UnknownIssuer,
    /// The member refused the router (an alert during the handshake: its certificate, or none).
    Refused,
    /// The member spoke no TLS, or another handshake failure.
    Handshake,
    /// The cluster's TLS files could not be loaded.
    Config,
}

impl TlsFailure {
    /// A label for metrics (`not_valid_for_name`, `expired`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TlsFailure::NotValidForName => "not_valid_for_name",
            TlsFailure::Expired => "expired",
            TlsFailure::UnknownIssuer => "unknown_issuer",
            TlsFailure::Refused => "refused",
            TlsFailure::Handshake => "handshake",
            TlsFailure::Config => "config",
        }
    }
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsFailure::NotValidForName => "tls: certificate not valid for the server name",
            TlsFailure::Expired => "tls: certificate expired",
            TlsFailure::UnknownIssuer => "tls: certificate not signed by the cluster's ca",
            TlsFailure::Refused => "tls: the member refused the router's handshake",
            TlsFailure::Handshake => "tls: handshake failed",
            TlsFailure::Config => "tls: the cluster's upstream_tls files could not be loaded",
        })
    }
}

/// How the data plane recognises a session (granularity `session`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct StickySession {
    /// Cookie carrying the session's member; set by the router on the first response.
    pub cookie: String,
    /// Alternatively a request header whose value identifies the session (hashed to pin it).
    pub header: Option<String>,
    /// A session unused this long is forgotten.
    #[cfg_attr(feature = "serde", serde(rename = "idle_timeout_ms", with = "crate::wire::millis"))]
    pub idle_timeout: Duration,
}

impl Default for StickySession {
    fn default() -> Self {
        StickySession {
            cookie: "rondo-member".to_owned(),
            header: None,
            idle_timeout: Duration::from_secs(600),
        }
    }
}
