//! How a member is found down: active health checks ([`HealthCheck`]) and passive outlier
//! detection ([`OutlierDetection`]).

use std::time::Duration;

/// Active health checking (CLB's 200 ms poll).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct HealthCheck {
    /// What a probe does.
    pub kind: HealthCheckKind,
    /// Between probe rounds.
    #[cfg_attr(feature = "serde", serde(rename = "interval_ms", with = "crate::wire::millis"))]
    pub interval: Duration,
    /// A probe slower than this fails.
    #[cfg_attr(feature = "serde", serde(rename = "timeout_ms", with = "crate::wire::millis"))]
    pub timeout: Duration,
    /// Consecutive successes that bring a down member up.
    pub rise: u32,
    /// Consecutive failures that take an up member down.
    pub fall: u32,
    /// The port probed instead of the member's own (`health.port`): a TCP or HTTP check on a
    /// side port of a UDP member, say.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub port: Option<u16>,
}

/// The probe.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum HealthCheckKind {
    /// A TCP connect.
    Tcp,
    /// An HTTP GET of `path`; statuses in `expect_min..=expect_max` pass.
    Http {
        /// Request path.
        path: String,
        /// Lowest passing status.
        expect_min: u16,
        /// Highest passing status.
        expect_max: u16,
    },
    /// gRPC's health-checking protocol (`grpc.health.v1.Health/Check`) for `service` (empty:
    /// the server as a whole); only `SERVING` passes.
    Grpc {
        /// The service asked about.
        service: String,
    },
    /// A UDP datagram `send` to the member; an answer within the timeout passes when it
    /// contains `expect` (empty: any answer).
    Udp {
        /// The probe's payload.
        send: Vec<u8>,
        /// Bytes the answer must contain.
        expect: Vec<u8>,
    },
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: HealthCheckKind::Tcp,
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(1000),
            rise: 2,
            fall: 2,
            port: None,
        }
    }
}

/// Passive outlier detection (Envoy's consecutive-failure ejection).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct OutlierDetection {
    /// Consecutive connect failures, resets or counted 5xx that eject a member; 0 disables.
    pub consecutive_failures: u32,
    /// Whether 5xx answers count as failures (connect failures and resets always count).
    pub count_5xx: bool,
    /// Ejection time for the first ejection; the n-th consecutive ejection lasts n times this.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "base_ejection_ms", with = "crate::wire::millis")
    )]
    pub base_ejection: Duration,
    /// Upper bound on one ejection.
    #[cfg_attr(feature = "serde", serde(rename = "max_ejection_ms", with = "crate::wire::millis"))]
    pub max_ejection: Duration,
    /// At most this share of a cluster's members is ejected at once, percent.
    pub max_ejected_percent: u8,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_failures: 5,
            count_5xx: true,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}
