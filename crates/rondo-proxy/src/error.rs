//! Proxy failures, each tagged with its side (client, member, internal) and whether another
//! member may be tried, and rendered as text that never shows an internal address: with
//! the listener's `error_detail = "full"` it names the route, its cluster and every attempt by
//! member name; with `"brief"` (the default beyond loopback) only the status and a sentence
//! that says nothing of the routing inside.

use std::fmt;

use http::StatusCode;
use rondo_config::ErrorDetail;

/// Where a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something we refuse.
    Client,
    /// A member failed.
    Member,
    /// rondo itself (configuration, no eligible member).
    Internal,
}

/// A cluster's circuit breaker (one byte, so [`Kind`] stays small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    /// `max_requests`.
    MaxRequests,
    /// `max_requests_per_member`.
    MaxRequestsPerMember,
    /// `max_connections`: no connection to the cluster's members came free within its
    /// `connect_timeout`.
    MaxConnections,
    /// `max_pending`: as many requests were waiting for a connection already.
    MaxPending,
}

impl Breaker {
    /// The breaker of a pick the core refused, if a breaker refused it.
    pub fn of(e: &rondo_core::PickError) -> Option<Breaker> {
        match e {
            rondo_core::PickError::AtMaxRequests { .. } => Some(Breaker::MaxRequests),
            rondo_core::PickError::AtMaxPerMember { .. } => Some(Breaker::MaxRequestsPerMember),
            _ => None,
        }
    }

    /// The setting's name (and the metric's `limit` label).
    pub fn as_str(self) -> &'static str {
        match self {
            Breaker::MaxRequests => "max_requests",
            Breaker::MaxRequestsPerMember => "max_requests_per_member",
            Breaker::MaxConnections => "max_connections",
            Breaker::MaxPending => "max_pending",
        }
    }
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No route matches the request.
    NoRoute,
    /// No member of any cluster could be picked.
    NoEligible,
    /// A cluster's circuit breaker refused the request.
    Breaker(Breaker),
    /// A member refused or could not be reached.
    Connect,
    /// A member reset or closed the connection before answering, or spoke nonsense.
    Reset,
    /// A member did not answer in time.
    Timeout,
    /// The request body is over the listener's limit.
    BodyTooLarge,
    /// The client's request body broke off.
    ClientBody,
    /// The client's request body stalled: the try timed out waiting for it, not for the member.
    ClientBodyTimeout,
    /// The request is malformed in a way the HTTP parser lets through (no `Host`, two `Host`s).
    BadRequest,
    /// The request already passed through this router (its `Via` names this process).
    Loop,
    /// A member answered with a status outside 100-599.
    BadStatus,
    /// A member's response body broke its own framing (a chunk-size line that is not one)
    /// before any byte of the response reached the client.
    BadBody,
    /// A member's host name did not resolve.
    Resolve,
    /// TLS to a member failed (its certificate, or it refused the router's).
    Tls(rondo_core::TlsFailure),
    /// The route requires a sign-on token and the request's is missing or refused (`auth`).
    Unauthorized(crate::auth::Refusal),
    /// Replaying a session's kept requests to the member taking it over failed (the request
    /// itself was not sent there).
    Replay,
    /// A gRPC member answered trailers-only with a status of its cluster's `retry.retry_on`:
    /// the call may go to another member.
    Declined,
}

/// One try at one member.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Cluster.
    pub cluster: String,
    /// Member name (never its address).
    pub member: Option<String>,
    /// What happened.
    pub outcome: Kind,
    /// The name the member's certificate was checked for, when it was not valid for it
    /// ([`expected_name`]): the cluster's `server_name`, or the host of the member's address.
    pub expected: Option<String>,
}

/// The name a member's certificate had to be valid for, when `kind` says it was not: the
/// cluster's `upstream_tls.server_name`, else the host of the member's address. Named in the
/// 502, so an operator sees which name the router asked for without reading the config.
pub fn expected_name(kind: Kind, rt: &rondo_runtime::ClusterRt, member: usize) -> Option<String> {
    if kind != Kind::Tls(rondo_core::TlsFailure::NotValidForName) {
        return None;
    }
    let Some(Ok(tls)) = &rt.tls else { return None };
    tls.server_name_text.clone().or_else(|| {
        let address = &rt.spec.members.get(member)?.address;
        let host = rondo_runtime::tls::upstream::host_of(address);
        Some(host.trim_start_matches('[').trim_end_matches(']').to_owned())
    })
}

/// A failure to serve a request.
#[derive(Debug, Clone)]
pub struct ProxyError {
    /// What went wrong (the deciding failure).
    pub kind: Kind,
    /// The route, when one matched.
    pub route: Option<String>,
    /// The route's primary cluster, when a route matched.
    pub cluster: Option<String>,
    /// A sentence for the client.
    pub detail: String,
    /// Every try, in order.
    pub attempts: Vec<Attempt>,
    /// Why the failover engine stopped trying, when it gave up on the request.
    pub stop: Option<rondo_core::Stop>,
}

impl Kind {
    /// The side a failure of this kind is on.
    pub fn side(self) -> Side {
        match self {
            Kind::NoRoute
            | Kind::BodyTooLarge
            | Kind::ClientBody
            | Kind::ClientBodyTimeout
            | Kind::BadRequest
            | Kind::Unauthorized(_) => Side::Client,
            Kind::NoEligible | Kind::Breaker(_) | Kind::Loop => Side::Internal,
            Kind::Connect
            | Kind::Reset
            | Kind::Timeout
            | Kind::BadStatus
            | Kind::BadBody
            | Kind::Resolve
            | Kind::Replay
            | Kind::Declined
            | Kind::Tls(_) => Side::Member,
        }
    }

    /// Whether another member may be tried (given the request can be sent again).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Kind::Connect
                | Kind::Reset
                | Kind::Timeout
                | Kind::NoEligible
                | Kind::Breaker(_)
                | Kind::BadStatus
                | Kind::BadBody
                | Kind::Resolve
                | Kind::Replay
                | Kind::Declined
                | Kind::Tls(_)
        )
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Kind::NoRoute => StatusCode::NOT_FOUND,
            Kind::NoEligible | Kind::Breaker(_) => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Connect
            | Kind::Reset
            | Kind::BadStatus
            | Kind::BadBody
            | Kind::Resolve
            | Kind::Replay
            | Kind::Declined
            | Kind::Tls(_) => StatusCode::BAD_GATEWAY,
            Kind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::ClientBody | Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::ClientBodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Kind::Loop => StatusCode::LOOP_DETECTED,
            Kind::Unauthorized(refusal) => refusal.status(),
        }
    }

    /// What a client of a `brief` listener is told: nothing of the routing inside.
    fn brief(self) -> &'static str {
        match self {
            Kind::NoRoute => "no route matches the request",
            Kind::NoEligible | Kind::Breaker(_) => "no server is available to serve the request",
            Kind::Connect
            | Kind::Reset
            | Kind::BadStatus
            | Kind::BadBody
            | Kind::Resolve
            | Kind::Replay
            | Kind::Declined
            | Kind::Tls(_) => "bad gateway: no server answered",
            Kind::Timeout => "gateway timeout: no response in time",
            Kind::Loop => "request loop detected",
            // About the client's own request: its detail is the client's to know.
            Kind::BodyTooLarge
            | Kind::ClientBody
            | Kind::ClientBodyTimeout
            | Kind::BadRequest
            | Kind::Unauthorized(_) => "",
        }
    }

    /// What went wrong, in a few words (`connection refused`).
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Tls(t) => match t {
                rondo_core::TlsFailure::NotValidForName => {
                    "tls: certificate not valid for the server name"
                }
                rondo_core::TlsFailure::Expired => "tls: certificate expired",
                rondo_core::TlsFailure::UnknownIssuer => {
                    "tls: certificate not signed by the cluster's ca"
                }
                rondo_core::TlsFailure::Refused => "tls: the member refused the router's handshake",
                rondo_core::TlsFailure::Handshake => "tls: handshake failed",
                rondo_core::TlsFailure::Config => {
                    "tls: the cluster's upstream_tls files could not be loaded"
                }
            },
            Kind::NoRoute => "no route",
            Kind::NoEligible => "no eligible member",
            Kind::Breaker(_) => "circuit breaker open",
            Kind::Connect => "connection refused",
            Kind::Reset => "connection reset before a response",
            Kind::Timeout => "timed out",
            Kind::BodyTooLarge => "request body too large",
            Kind::ClientBody => "request body broke off",
            Kind::ClientBodyTimeout => "request body did not arrive in time",
            Kind::BadRequest => "bad request",
            Kind::Loop => "request loop",
            Kind::BadStatus => "answered with a status outside 100-599",
            Kind::BadBody => "sent a malformed response body (broken chunked coding)",
            Kind::Resolve => "host name did not resolve",
            Kind::Unauthorized(_) => "sign-on token refused",
            Kind::Replay => "replaying the session's requests failed",
            Kind::Declined => "declined: a grpc status the cluster retries elsewhere",
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rondo: {} {}", self.kind.status().as_u16(), self.detail)?;
        if let Some(route) = &self.route {
            write!(f, " (route {route}")?;
            if let Some(cluster) = &self.cluster {
                write!(f, ", cluster {cluster}")?;
            }
            f.write_str(")")?;
        }
        for (i, a) in self.attempts.iter().enumerate() {
            f.write_str(if i == 0 { "; attempts: " } else { ", " })?;
            match &a.member {
                Some(m) => write!(f, "{}/{}: ", a.cluster, m)?,
                None => write!(f, "{}: ", a.cluster)?,
            }
            match &a.expected {
                Some(name) => write!(f, "tls: certificate not valid for {name}")?,
                None => f.write_str(a.outcome.describe())?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for ProxyError {}

impl ProxyError {
    /// A failure with no attempts, outside any route.
    pub fn new(kind: Kind, detail: impl Into<String>) -> Self {
        ProxyError {
            kind,
            route: None,
            cluster: None,
            detail: detail.into(),
            attempts: Vec::new(),
            stop: None,
        }
    }

    /// A failure on `route`, whose primary cluster is `cluster`.
    pub fn on_route(kind: Kind, route: &str, cluster: &str, detail: impl Into<String>) -> Self {
        ProxyError {
            kind,
            route: Some(route.to_owned()),
            cluster: Some(cluster.to_owned()),
            detail: detail.into(),
            attempts: Vec::new(),
            stop: None,
        }
    }

    /// A refused sign-on token on `route` (the identity crate's refusal, as this router's
    /// error): the refusal's status and, in the response, its challenge.
    pub fn unauthorized(e: crate::auth::AuthError, route: &str, cluster: &str) -> Self {
        ProxyError::on_route(Kind::Unauthorized(e.refusal), route, cluster, e.detail)
    }

    /// The text a client gets with `detail` (the `Display` form is the full one, for logs).
    pub fn render(&self, detail: ErrorDetail) -> String {
        let status = self.kind.status().as_u16();
        match (detail, self.kind.brief()) {
            (ErrorDetail::Full, _) => format!("{self}\n"),
            (ErrorDetail::Brief, "") => format!("rondo: {status} {}\n", self.detail),
            (ErrorDetail::Brief, brief) => format!("rondo: {status} {brief}\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> ProxyError {
        let mut e =
            ProxyError::on_route(Kind::Connect, "api", "app", "bad gateway: no member answered");
        for m in ["m1", "m2"] {
            e.attempts.push(Attempt {
                cluster: "app".into(),
                member: Some(m.into()),
                outcome: Kind::Connect,
                expected: None,
            });
        }
        e
    }

    #[test]
    fn full_detail_lists_attempts_without_a_stray_separator() {
        assert_eq!(
            failed().render(ErrorDetail::Full),
            "rondo: 502 bad gateway: no member answered (route api, cluster app); attempts: \
             app/m1: connection refused, app/m2: connection refused\n"
        );
    }

    #[test]
    fn a_wrong_name_names_the_name_expected() {
        let mut e = failed();
        e.attempts[1].outcome = Kind::Tls(rondo_core::TlsFailure::NotValidForName);
        e.attempts[1].expected = Some("api.internal".into());
        assert!(
            e.render(ErrorDetail::Full)
                .ends_with("app/m2: tls: certificate not valid for api.internal\n"),
            "{e}"
        );
        assert_eq!(e.render(ErrorDetail::Brief), "rondo: 502 bad gateway: no server answered\n");
    }

    #[test]
    fn brief_detail_names_no_route_cluster_or_member() {
        let text = failed().render(ErrorDetail::Brief);
        assert_eq!(text, "rondo: 502 bad gateway: no server answered\n");
        // About the client's own request, the detail stays.
        let e = ProxyError::on_route(Kind::BadRequest, "api", "app", "two Host headers");
        assert_eq!(e.render(ErrorDetail::Brief), "rondo: 400 two Host headers\n");
    }
}
