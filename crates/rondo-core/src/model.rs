//! The policy model: members, clusters, policies, routes and the immutable, versioned [`View`]
//! that holds them all. These are plain values compiled from configuration (or from the registry);
//! the run-time state of a member (health, load, admin changes) lives in [`crate::Balancer`].

mod algorithm;
mod cluster;
mod health;
mod matching;
mod members;
mod policy;
mod retry;
mod route;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use algorithm::{
    Algorithm, Granularity, HashKeySource, HashPolicy, HashTable, Locality, SlowStart,
};
pub use cluster::{ClusterSpec, StickySession, TlsFailure, UpstreamProtocol, UpstreamTls};
pub use health::{HealthCheck, HealthCheckKind, OutlierDetection};
pub use matching::{BodyPeek, Filter, FilterRef, RequestFacts, RouteMatch, query_has};
pub use members::{Actor, AdminState, MemberSpec};
pub use policy::{
    AgentPolicy, ConnectionCap, ConnectionLimits, EwmaPolicy, Policy, ProxyHeader, RequestLimits,
    XdsLb, XdsPolicy,
};
pub use retry::{Backoff, RetryPolicy, StatusSet};
pub use route::{Branch, Route, RouteAuth, RouteLogin, SessionReplay, Slot};

/// Where a request goes, as the filter table says.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'v> {
    /// The first matching route (by priority, then file order).
    Found(&'v Route),
    /// A route that matches the head reads the body: look up again with at least this many
    /// of its first bytes (or all of it, when shorter).
    NeedsBody(u64),
    /// No route matches.
    NoRoute,
}

/// An immutable, versioned snapshot of all routes and clusters (PKUAS view, WCF configuration).
/// Replaced as a whole; holders of an `Arc<View>` keep the one they started with.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// Grows with every change; clients that see a newer id refetch.
    pub id: u64,
    /// Routes in priority order: the first match wins.
    pub routes: Vec<Route>,
    /// Clusters by name.
    pub clusters: BTreeMap<String, Arc<ClusterSpec>>,
}

impl View {
    /// The first route of `listener` that matches `req`.
    pub fn route(&self, listener: &str, req: &RequestFacts<'_>) -> Option<&Route> {
        self.routes.iter().find(|r| r.listener == listener && r.matcher.matches(req))
    }

    /// The first route of `listener` that matches `req`, or the body bytes needed to decide:
    /// a route whose head conditions hold and that reads the body, met before any route that
    /// matches without it, needs `req.body`. With `all` (a listener's `routing =
    /// "all-matches"`), every route that matches must be decided, so any of them that reads
    /// the body needs it.
    pub fn lookup(&self, listener: &str, req: &RequestFacts<'_>, all: bool) -> Lookup<'_> {
        let mut first = None;
        let mut peek = 0;
        for r in self.routes.iter().filter(|r| r.listener == listener) {
            if !r.matcher.matches_head(req) {
                continue;
            }
            if r.matcher.reads_body() {
                match &req.body {
                    None => {
                        peek = peek.max(r.matcher.max_peek_bytes);
                        continue;
                    }
                    Some(body) if !r.matcher.body_matches(body) => continue,
                    Some(_) => {}
                }
            }
            if peek == 0 && first.is_none() {
                first = Some(r);
            }
            if !all && peek == 0 {
                break;
            }
        }
        match first {
            _ if peek > 0 => Lookup::NeedsBody(peek),
            Some(r) => Lookup::Found(r),
            None => Lookup::NoRoute,
        }
    }

    /// Every route of `listener` that matches `req` besides `first` (routing `all-matches`),
    /// in evaluation order.
    pub fn also_matching(
        &self,
        listener: &str,
        first: &Route,
        req: &RequestFacts<'_>,
    ) -> Vec<&Route> {
        self.routes
            .iter()
            .filter(|r| {
                r.listener == listener && !std::ptr::eq(*r, first) && r.matcher.matches(req)
            })
            .collect()
    }

    /// A cluster by name.
    pub fn cluster(&self, name: &str) -> Option<&Arc<ClusterSpec>> {
        self.clusters.get(name)
    }
}
