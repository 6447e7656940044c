//! Proxy failures, each tagged with its side (client, member, internal) and whether another
//! member may be tried, and rendered as a response that names the route and cluster but never an
//! internal address.

use std::fmt;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::body::ProxyBody;

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

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No route matches the request.
    NoRoute,
    /// No member of any cluster could be picked.
    NoEligible,
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
}

impl Kind {
    /// The side a failure of this kind is on.
    pub fn side(self) -> Side {
        match self {
            Kind::NoRoute | Kind::BodyTooLarge | Kind::ClientBody | Kind::ClientBodyTimeout => {
                Side::Client
            }
            Kind::NoEligible => Side::Internal,
            Kind::Connect | Kind::Reset | Kind::Timeout => Side::Member,
        }
    }

    /// Whether another member may be tried (given the request can be sent again).
    pub fn is_retryable(self) -> bool {
        matches!(self, Kind::Connect | Kind::Reset | Kind::Timeout | Kind::NoEligible)
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Kind::NoRoute => StatusCode::NOT_FOUND,
            Kind::NoEligible => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Connect | Kind::Reset => StatusCode::BAD_GATEWAY,
            Kind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::ClientBody => StatusCode::BAD_REQUEST,
            Kind::ClientBodyTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// What went wrong, in a few words (`connection refused`).
    pub fn describe(self) -> &'static str {
        match self {
            Kind::NoRoute => "no route",
            Kind::NoEligible => "no eligible member",
            Kind::Connect => "connection refused",
            Kind::Reset => "connection reset before a response",
            Kind::Timeout => "timed out",
            Kind::BodyTooLarge => "request body too large",
            Kind::ClientBody => "request body broke off",
            Kind::ClientBodyTimeout => "request body did not arrive in time",
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
        if !self.attempts.is_empty() {
            f.write_str("; attempts:")?;
            for a in &self.attempts {
                match &a.member {
                    Some(m) => write!(f, " {}/{}: {};", a.cluster, m, a.outcome.describe())?,
                    None => write!(f, " {}: {};", a.cluster, a.outcome.describe())?,
                }
            }
        }
        Ok(())
    }
}

impl ProxyError {
    /// A failure with no attempts, outside any route.
    pub fn new(kind: Kind, detail: impl Into<String>) -> Self {
        ProxyError { kind, route: None, cluster: None, detail: detail.into(), attempts: Vec::new() }
    }

    /// A failure on `route`, whose primary cluster is `cluster`.
    pub fn on_route(kind: Kind, route: &str, cluster: &str, detail: impl Into<String>) -> Self {
        ProxyError {
            kind,
            route: Some(route.to_owned()),
            cluster: Some(cluster.to_owned()),
            detail: detail.into(),
            attempts: Vec::new(),
        }
    }

    /// The response the client gets.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.kind.status();
        let mut body = self.to_string();
        body.push('\n');
        let mut resp = local(status, body);
        if self.kind == Kind::NoEligible {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self.kind, Kind::BodyTooLarge | Kind::ClientBody | Kind::ClientBodyTimeout) {
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// A plain-text response generated by rondo itself.
pub fn local(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::local(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}
