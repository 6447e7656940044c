//! Traffic policy as data: the filters a route (or a listener) names in its `filters` list,
//! validated by the configuration and run by the router's filter chain. Pure descriptions only:
//! what to set, rewrite, redirect or answer, never how a codec does it. (The route match's
//! own conditions, regular expressions and body paths, are [`crate::FilterRef`]s: they decide
//! whether a route matches, not what happens to its requests.)

use std::sync::Arc;

mod compress;
mod cors;

pub use compress::{Compress, Encoding};
pub use cors::{Cors, check_origin, origin_matches};

/// One filter of a route's or a listener's chain, in the order the configuration lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrafficFilter {
    /// Keep or make a request id and a W3C trace context.
    RequestId(RequestId),
    /// Set, add and remove header fields on the request and the response.
    Headers(HeaderEdits),
    /// Rewrite the path (and host) members see.
    Rewrite(Rewrite),
    /// Answer with a redirect.
    Redirect(Redirect),
    /// Answer directly.
    Respond(Respond),
    /// Convert SOAP messages between 1.1 and 1.2 (WCF's message transformation).
    Soap(Soap),
    /// Limit requests per key with a token bucket.
    RateLimit(RateLimit),
    /// Inject delays and aborts (fault injection).
    Fault(Fault),
    /// Copy a sampled share of requests to another cluster.
    Mirror(Mirror),
    /// Answer CORS preflights and mark responses for allowed origins.
    Cors(Cors),
    /// Compress responses (on hyper's path: see [`TrafficFilter::needs_whole_bodies`]).
    Compress(Compress),
    /// Translate gRPC-Web calls (browsers') to gRPC towards members, and their answers back.
    GrpcWeb(GrpcWeb),
    /// Answer with a redirect to the member the route's cluster picks (SGD's load-balancing
    /// page), instead of proxying.
    RedirectToMember(RedirectToMember),
}

impl TrafficFilter {
    /// The name it has in the configuration.
    pub fn name(&self) -> &'static str {
        match self {
            TrafficFilter::RequestId(_) => "request_id",
            TrafficFilter::Headers(_) => "headers",
            TrafficFilter::Rewrite(_) => "rewrite",
            TrafficFilter::Redirect(_) => "redirect",
            TrafficFilter::Respond(_) => "respond",
            TrafficFilter::Soap(_) => "soap",
            TrafficFilter::RateLimit(_) => "rate_limit",
            TrafficFilter::Fault(_) => "fault",
            TrafficFilter::Mirror(_) => "mirror",
            TrafficFilter::Cors(_) => "cors",
            TrafficFilter::Compress(_) => "compress",
            TrafficFilter::GrpcWeb(_) => "grpc_web",
            TrafficFilter::RedirectToMember(_) => "redirect_to_member",
        }
    }

    /// Whether it holds or rewrites a body (`compress`, `soap`, `grpc_web`) or copies the
    /// request (`mirror`), which only the router's hyper path does (its own HTTP/1 path passes
    /// bodies through as they come).
    pub fn needs_whole_bodies(&self) -> bool {
        matches!(
            self,
            TrafficFilter::Compress(_)
                | TrafficFilter::Soap(_)
                | TrafficFilter::Mirror(_)
                | TrafficFilter::GrpcWeb(_)
        )
    }

    /// Whether it answers every request itself, so that the route needs no cluster.
    pub fn always_answers(&self) -> bool {
        matches!(self, TrafficFilter::Redirect(_) | TrafficFilter::Respond(_))
    }
}

/// `request_id`: the request's id header (kept when the client sent a valid one, else made),
/// passed to members and echoed on the response; and, when `trace` is on, a W3C `traceparent`
/// kept or started, with a new span id for each try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    /// The id's header name, lower case (default `x-request-id`).
    pub header: String,
    /// Whether `traceparent` is kept or started (default on).
    pub trace: bool,
}

impl RequestId {
    /// The default header name.
    pub const DEFAULT_HEADER: &'static str = "x-request-id";
}

/// A value with variables (`${client_ip}`, ...), parsed once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Literal text and variables, in order.
    pub parts: Vec<Part>,
}

/// A piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text as written.
    Literal(String),
    /// A value of the request (or of the response).
    Var(Var),
}

/// The variables a header value may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Var {
    /// The client's address (the connection's peer), without port.
    ClientIp,
    /// The request's host, without port.
    Host,
    /// The request's path (after normalization and rewrites), without the query.
    Path,
    /// The request id (`request_id` filter); empty without one.
    RequestId,
    /// The verified identity's subject (`auth`); empty without one.
    IdentitySub,
    /// The name of the member that answered (response fields only).
    Member,
}

impl Var {
    /// Every variable with its name.
    pub const ALL: [(&'static str, Var); 6] = [
        ("client_ip", Var::ClientIp),
        ("host", Var::Host),
        ("path", Var::Path),
        ("request_id", Var::RequestId),
        ("identity.sub", Var::IdentitySub),
        ("member", Var::Member),
    ];
}

impl Template {
    /// Parses `text`: `${name}` is a variable, `$$` a literal `$`. `response` says whether the
    /// value goes on a response (where `${member}` is known).
    pub fn parse(text: &str, response: bool) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            literal.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            if let Some(after) = rest.strip_prefix('$') {
                literal.push('$');
                rest = after;
                continue;
            }
            let Some(body) = rest.strip_prefix('{') else {
                return Err("a `$` starts a variable, `${name}` (write `$$` for a `$`)".to_owned());
            };
            let Some(end) = body.find('}') else {
                return Err("a variable `${` has no closing `}`".to_owned());
            };
            let name = &body[..end];
            let Some(&(_, var)) = Var::ALL.iter().find(|(n, _)| *n == name) else {
                let known = Var::ALL.iter().map(|(n, _)| format!("${{{n}}}"));
                return Err(format!(
                    "unknown variable `${{{name}}}`, expected one of {}",
                    known.collect::<Vec<_>>().join(", ")
                ));
            };
            if var == Var::Member && !response {
                return Err("`${member}` is known only on the response".to_owned());
            }
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(Part::Var(var));
            rest = &body[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template { parts })
    }

    /// The text itself when it has no variable.
    pub fn as_literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Literal(s)] => Some(s),
            _ => None,
        }
    }

    /// The value, with each variable's value from `value`.
    pub fn render(&self, value: impl Fn(Var) -> String) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Literal(s) => out.push_str(s),
                Part::Var(v) => out.push_str(&value(*v)),
            }
        }
        out
    }
}

/// Header edits of one direction, in the order they apply: `remove` (every field of the name),
/// then `set` (replacing every field of the name), then `add` (another field).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldEdits {
    /// Names (lower case) whose fields go.
    pub remove: Vec<String>,
    /// Names (lower case) set to one value.
    pub set: Vec<(String, Template)>,
    /// Names (lower case) given one more field.
    pub add: Vec<(String, Template)>,
}

impl FieldEdits {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
}

/// `headers`: edits of the request members get and of the response the client gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderEdits {
    /// On the request.
    pub request: FieldEdits,
    /// On the response.
    pub response: FieldEdits,
}

/// `rewrite`: the path and host members see.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rewrite {
    /// Replaces the prefix the route's match named (`match.path_prefix`, or `/`).
    pub path_prefix: Option<String>,
    /// A regular expression over the path and its replacement (`$1` for captures); checked at
    /// load, compiled by the router.
    pub path_regex: Option<(String, String)>,
    /// The `Host` members see.
    pub host: Option<String>,
}

/// `redirect`: answers with a redirect to the request's own URL with the given parts changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https`; `None`: the request's own.
    pub scheme: Option<String>,
    /// `None`: the request's host.
    pub host: Option<String>,
    /// `None`: the scheme's default port when the scheme changed, else the request's port.
    pub port: Option<u16>,
    /// `None`: the request's path.
    pub path: Option<String>,
    /// 301, 302, 303, 307 or 308 (default 301).
    pub status: u16,
    /// Whether the query goes along (default true).
    pub keep_query: bool,
}

impl Redirect {
    /// The statuses a redirect may have.
    pub const STATUSES: [u16; 5] = [301, 302, 303, 307, 308];
}

/// `redirect_to_member`: answers with a redirect to the member the route's cluster picks, the
/// request's path and query kept ([`crate::member_url`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedirectToMember {
    /// 302, 303, 307 or 308 (default 307; never a permanent 301: the next pick may differ).
    pub status: u16,
    /// Whether the query goes along (default true).
    pub keep_query: bool,
}

impl RedirectToMember {
    /// The statuses it may have.
    pub const STATUSES: [u16; 4] = [302, 303, 307, 308];
}

/// `respond`: a direct answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Respond {
    /// The status (100–599, not 1xx: default 200).
    pub status: u16,
    /// Fields of the answer, names lower case.
    pub headers: Vec<(String, String)>,
    /// The body (inline, or read from a file at load).
    pub body: Arc<[u8]>,
}

/// `soap`: a client of one SOAP version reaches a service of the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Soap {
    /// The version the service speaks: requests of the other are converted to it, and its
    /// responses back.
    pub to: SoapVersion,
    /// The largest message converted, each way (the whole message is read first).
    pub max_body_bytes: u64,
}

impl Soap {
    /// Default `max_body_bytes`: 1 MiB.
    pub const DEFAULT_MAX_BODY: u64 = 1 << 20;
}

/// `grpc_web` (Envoy's `grpc_web` filter): a call in `application/grpc-web` or
/// `application/grpc-web-text` (the browser's gRPC) goes to members as gRPC over HTTP/2, and
/// their answer comes back with its trailers as the body's last frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcWeb {
    /// The largest `grpc-web-text` request body (base64, decoded whole before it is sent;
    /// binary bodies stream as they come).
    pub max_body_bytes: u64,
}

impl GrpcWeb {
    /// Default `max_body_bytes`: 4 MiB, gRPC's default largest message.
    pub const DEFAULT_MAX_BODY: u64 = 4 << 20;
}

/// A SOAP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoapVersion {
    /// SOAP 1.1 (`text/xml`, `SOAPAction`).
    V11,
    /// SOAP 1.2 (`application/soap+xml`, its `action` parameter).
    V12,
}

/// `rate_limit`: a token bucket per key; a request finding its bucket empty is answered 429.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// What a bucket is per (default the client's address).
    pub key: LimitKey,
    /// The sustained rate.
    pub rate: crate::bucket::Rate,
    /// The bucket's size: requests admitted at once after a quiet spell.
    pub burst: u64,
    /// Buckets kept at most; past it the least recently used goes.
    pub max_keys: u64,
    /// `scope = "tier"`: the rate and burst are shared among the tier's routers present in the
    /// etcd registry, each router taking an equal share.
    pub tier: bool,
}

impl RateLimit {
    /// The default `max_keys`.
    pub const DEFAULT_MAX_KEYS: u64 = 100_000;

    /// This router's share of the rate and the burst when `routers` share them (`tier`): the
    /// rate's period stretched `routers` times (exact: no rounding), the burst divided and
    /// rounded up (at least 1).
    pub fn share(&self, routers: u64) -> (crate::bucket::Rate, u64) {
        if !self.tier || routers <= 1 {
            return (self.rate, self.burst);
        }
        let rate = crate::bucket::Rate {
            count: self.rate.count,
            per_secs: self.rate.per_secs.saturating_mul(routers),
        };
        (rate, self.burst.div_ceil(routers).max(1))
    }
}

/// What a `rate_limit` bucket is per.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitKey {
    /// The client's address.
    ClientIp,
    /// A request header's value (name lower case); requests without it share one bucket.
    Header(String),
    /// The verified identity's subject (`auth`); requests without one share one bucket.
    Identity,
    /// One bucket for the whole route.
    Route,
}

impl LimitKey {
    /// The key as the configuration writes it (`client_ip`, `header:x-api-key`, ...).
    pub fn name(&self) -> String {
        match self {
            LimitKey::ClientIp => "client_ip".into(),
            LimitKey::Header(h) => format!("header:{h}"),
            LimitKey::Identity => "identity".into(),
            LimitKey::Route => "route".into(),
        }
    }
}

/// Parts per million: a percentage kept exact (and comparable) as an integer.
pub const PPM: u32 = 1_000_000;

/// `fault`: delay and abort a share of requests (or, with `header`, only requests carrying it),
/// to test how clients cope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The delay before the request is forwarded.
    pub delay: Option<std::time::Duration>,
    /// The share of requests delayed, in parts per million.
    pub delay_ppm: u32,
    /// The status of an aborted request.
    pub abort_status: Option<u16>,
    /// The share of requests aborted, in parts per million.
    pub abort_ppm: u32,
    /// Only requests carrying this header (lower case) are subject to faults; its value may
    /// name the fault (`abort=503`, `delay=200`).
    pub header: Option<String>,
}

/// `mirror`: a sampled share of requests copied to another cluster, fire and forget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The cluster that gets the copies.
    pub cluster: String,
    /// The share of requests copied, in parts per million.
    pub ppm: u32,
    /// Copies waiting or in flight at most; one more is dropped and counted.
    pub queue: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_share_stretches_the_period_and_divides_the_burst() {
        let r = RateLimit {
            key: LimitKey::Route,
            rate: crate::bucket::Rate { count: 100, per_secs: 1 },
            burst: 5,
            max_keys: 1,
            tier: true,
        };
        let (rate, burst) = r.share(4);
        assert_eq!((rate.count, rate.per_secs, burst), (100, 4, 2));
        assert_eq!(r.share(1), (r.rate, 5));
        assert_eq!(r.share(0), (r.rate, 5), "an unknown count is this router alone");
        assert_eq!(r.share(10).1, 1, "at least one");
        let local = RateLimit { tier: false, ..r };
        assert_eq!(local.share(4), (local.rate, 5), "a router's own limit is never shared");
    }

    #[test]
    fn templates_parse_variables_and_refuse_unknown_ones() {
        let t = Template::parse("for ${client_ip} at ${host}$$", false).unwrap();
        let v = t.render(|v| match v {
            Var::ClientIp => "10.0.0.1".into(),
            Var::Host => "h".into(),
            _ => String::new(),
        });
        assert_eq!(v, "for 10.0.0.1 at h$");
        assert_eq!(Template::parse("plain", false).unwrap().as_literal(), Some("plain"));
        assert!(Template::parse("${nope}", false).unwrap_err().contains("unknown variable"));
        assert!(Template::parse("${member}", false).unwrap_err().contains("response"));
        assert!(Template::parse("${member}", true).is_ok());
        assert!(Template::parse("${host", false).is_err());
        assert!(Template::parse("$host", false).is_err());
    }
}
