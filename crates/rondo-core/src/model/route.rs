//! A [`Route`]: a match sent to a cluster with its backups, and what rides on it (sign-on,
//! multicast branches, session replay, traffic filters).

use std::sync::Arc;
use std::time::Duration;

use super::matching::RouteMatch;

/// A route's sign-on requirement (`auth`, PKUAS single sign-on): every request must carry a
/// token from `issuer` for `audience`, signed by a key of the `keys` file (JWKS), whose claims
/// hold each `require` pair; the router checks it before any member sees the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAuth {
    /// The `iss` a token must name.
    pub issuer: String,
    /// The `aud` a token must name (or list).
    pub audience: String,
    /// The JWKS file (resolved against the configuration file's directory); reloaded when it
    /// changes.
    pub keys: std::path::PathBuf,
    /// Claim name and a value the claim must hold (equal, one of its space-separated words, or
    /// an element of its array).
    pub require: Vec<(String, String)>,
    /// Claims passed on to members (their names as in the token), each in
    /// `x-rondo-claim-<name>` (the name in lower case).
    pub claims: Vec<String>,
}

/// A login route's sign-on (`login`): a member's response naming a subject in `x-rondo-login`
/// makes the router issue a tier-wide session cookie for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLogin {
    /// How long the session token is good for.
    pub ttl: Duration,
}

impl RouteLogin {
    /// Default `ttl_ms`: eight hours (a working day's sign-on).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(8 * 3600);
}

/// A match → a cluster, plus ordered backups (WCF filter table and backup lists).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Name (generated `route-N` when the config gives none).
    pub name: String,
    /// The listener it belongs to.
    pub listener: String,
    /// The condition.
    pub matcher: RouteMatch,
    /// Primary cluster (with a split: its first cluster of positive weight, which names the
    /// route in errors and labels).
    pub cluster: String,
    /// The weighted clusters each request picks its primary from (`clusters`); empty: the
    /// primary is always `cluster`.
    pub split: Vec<crate::split::WeightedCluster>,
    /// Tried in order when the primary cannot serve.
    pub backups: Vec<String>,
    /// Idle timeout of a client connection on this route.
    pub idle_timeout: Duration,
    /// Whole-request timeout (first byte to last response byte header).
    pub request_timeout: Duration,
    /// The sign-on token the route requires (`auth`), if any.
    pub auth: Option<Arc<RouteAuth>>,
    /// Whether (and how) members of this route may sign users on (`login`).
    pub login: Option<RouteLogin>,
    /// Routes of a listener are evaluated by priority, higher first, then in file order.
    pub priority: i32,
    /// The route's place in the file (0-based): the tie-break after `priority`, and where
    /// diagnostics point.
    pub position: usize,
    /// Other clusters that get a copy of every request the route matches (WCF multicast);
    /// their answers never reach the client.
    pub multicast: Vec<Branch>,
    /// A request with a multicast branch and a body larger than this is answered 413 before
    /// anything is sent (the body is held for every branch).
    pub multicast_max_body_bytes: u64,
    /// The requests of each sticky session kept for replay to the member that takes the
    /// session over (WCF session recovery), when set.
    pub session_replay: Option<SessionReplay>,
    /// The route's traffic filters, in order (`filters`): edits, answers and limits.
    pub filters: Vec<crate::traffic::TrafficFilter>,
    /// What the router compiles from `filters`, once per view.
    pub compiled: Slot,
}

/// A slot the core carries for a data plane and never looks into: what a data plane derives
/// once from a part of the view (a route's compiled filter chain) lives beside it, made at first
/// use. Clones share it; it compares equal to every other slot (it is derived, not policy).
#[derive(Clone, Default)]
pub struct Slot(Arc<std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>>);

impl Slot {
    /// The value, made by `make` at the first call.
    pub fn get_or_init(
        &self,
        make: impl FnOnce() -> Arc<dyn std::any::Any + Send + Sync>,
    ) -> &Arc<dyn std::any::Any + Send + Sync> {
        self.0.get_or_init(make)
    }
}

impl PartialEq for Slot {
    fn eq(&self, _: &Slot) -> bool {
        true
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Slot(made)" } else { "Slot(empty)" })
    }
}

impl Route {
    /// Default `multicast_max_body_bytes`: 1 MiB.
    pub const DEFAULT_MULTICAST_MAX_BODY: u64 = 1 << 20;
}

/// One multicast branch of a route: a cluster with its own backups, tried with its own
/// failover, under a bounded queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    /// The cluster that gets the copy.
    pub cluster: String,
    /// Tried in order when it cannot serve the copy.
    pub backups: Vec<String>,
    /// Copies waiting or in flight on this branch at most; one more is dropped and counted.
    pub queue: u32,
}

impl Branch {
    /// Default `queue`.
    pub const DEFAULT_QUEUE: u32 = 1024;
}

/// A route's `session_replay`: how much of each session is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionReplay {
    /// Requests kept per session, at most.
    pub max_messages: u32,
    /// Bytes (heads and bodies) kept per session, at most.
    pub max_bytes: u64,
    /// Bytes kept over every session of the route, at most.
    pub max_total_bytes: u64,
}

impl SessionReplay {
    /// Default `max_messages`.
    pub const DEFAULT_MAX_MESSAGES: u32 = 64;
    /// Default `max_bytes`: 1 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
    /// Default `max_total_bytes`: 64 MiB.
    pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 64 << 20;
}
