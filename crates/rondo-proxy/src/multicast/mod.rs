//! Multicast (WCF's multicast over the filter table): a route's `multicast` branches, and under
//! a listener's `routing = "all-matches"` the clusters of every other matching route, each get
//! a copy of the request (method, path, headers as members get them, and the whole body, read
//! before anything is sent). The client's answer comes from the route's own cluster and its
//! backups exactly as without multicast; a copy is sent from a task of its own and never
//! delays, changes or fails that answer.
//!
//! Each copy runs the router's one failover loop (`http::forward`) over its branch's
//! cluster and backups, with their retry rules and budgets (a `Tries` that sends a held
//! body and drains the answer); there is no second loop. Each branch has a bounded queue (the
//! copies waiting or in flight on it, per listener, route and branch): a copy past the bound
//! is dropped, counted (`rondo_multicast_copies_total{outcome="overflow"}`) and logged (the
//! first, then every 100th). Every copy's outcome is counted by route, branch and outcome
//! (`answered`, `5xx`, `failed`, `overflow`) and logged when it failed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use http::request::Parts;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method};
use http_body_util::BodyExt as _;
use rondo_core::failover::is_idempotent_method;
use rondo_core::{Branch, Failover, FailureKind, Outcome, Route};
use rondo_runtime::{ClusterRt, Snapshot, clock};

use crate::body::{BodySlot, UpstreamBody};
use crate::error::Kind;
use crate::http::{Begun, Choice, HttpCtx, Tries, forward, record_response};

use queues::Held;
pub use queues::Queues;

pub(crate) mod queues;

/// One branch a request is copied to: a route like the one that matched, but for the branch's
/// cluster and backups (its name, timeouts and metrics labels are the route's), and the
/// branch's queue bound.
#[derive(Debug)]
pub(crate) struct Plan {
    route: Route,
    queue: u32,
}

/// The branches a request routed to `route` is copied to: its chain's copies (the route's
/// `multicast` list, the `mirror`s drawn for this request), then (routing `all-matches`) each
/// other matching route's cluster with its backups and its own branches; a cluster that
/// already gets the request is not given a second copy.
pub(crate) fn branches(route: &Route, also: &[&Route], copies: &[Branch]) -> Vec<Plan> {
    if also.is_empty() && copies.is_empty() {
        return Vec::new();
    }
    let mut served: Vec<&str> = std::iter::once(route.cluster.as_str())
        .chain(route.split.iter().map(|w| w.cluster.as_str()))
        .chain(route.backups.iter().map(String::as_str))
        .collect();
    let mut out = Vec::new();
    let mut add = |from: &Route, b: &Branch, served: &mut Vec<&str>| {
        if served.contains(&b.cluster.as_str()) {
            return;
        }
        out.push(Plan {
            route: Route {
                cluster: b.cluster.clone(),
                split: Vec::new(),
                backups: b.backups.clone(),
                multicast: Vec::new(),
                session_replay: None,
                filters: Vec::new(),
                compiled: Default::default(),
                auth: None,
                login: None,
                ..from.clone()
            },
            queue: b.queue,
        });
    };
    for b in copies {
        add(route, b, &mut served);
        served.push(b.cluster.as_str());
    }
    for other in also {
        let own = Branch {
            cluster: other.cluster.clone(),
            backups: other.backups.clone(),
            queue: Branch::DEFAULT_QUEUE,
        };
        add(other, &own, &mut served);
        served.push(other.cluster.as_str());
        for b in &other.multicast {
            add(other, b, &mut served);
            served.push(b.cluster.as_str());
        }
    }
    out
}

/// Sends a copy of the prepared request (`parts`, `path_and_query`, the whole body in `slot`)
/// to each branch from a task of its own, unless the branch's queue is full.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn(
    ctx: &Arc<HttpCtx>,
    snapshot: &Arc<Snapshot>,
    peer: SocketAddr,
    route: &Route,
    plans: Vec<Plan>,
    parts: &Parts,
    path_and_query: &PathAndQuery,
    slot: Option<&BodySlot>,
) {
    let metrics = &ctx.live.metrics;
    // The body was read whole before anything was sent (multicast_max_body_bytes).
    let body = slot.and_then(|s| s.whole_body()).map(|(b, t)| (b.clone(), t.cloned()));
    for plan in plans {
        let cluster = plan.route.cluster.clone();
        let queue = ctx.copies.of(&plan.route.name, &cluster);
        let pending = queue.pending.fetch_add(1, Ordering::AcqRel);
        if pending >= plan.queue {
            queue.pending.fetch_sub(1, Ordering::AcqRel);
            let n = queue.overflowed.fetch_add(1, Ordering::Relaxed) + 1;
            metrics.multicast(&plan.route.name, &cluster, "overflow");
            if n == 1 || n.is_multiple_of(100) {
                tracing::warn!(
                    route = %route.name, branch = %cluster, queue = plan.queue, dropped = n,
                    "multicast branch queue full: copy dropped"
                );
            }
            continue;
        }
        let held = Held(queue);
        let copy = Copy {
            ctx: ctx.clone(),
            route: plan.route.name.clone(),
            method: parts.method.clone(),
            headers: parts.headers.clone(),
            path_and_query: path_and_query.clone(),
            slot: body.clone().map(|(b, t)| BodySlot::whole(b, t)),
        };
        let snapshot = snapshot.clone();
        tokio::spawn(async move {
            let _held = held;
            copy.run(&snapshot, peer, &plan.route).await;
        });
    }
}

/// Counts the copies `plans` would have made of a request whose body is over the route's
/// `multicast_max_body_bytes` (only mirrors skip such a request rather than refuse it).
pub(crate) fn too_large(ctx: &HttpCtx, route: &Route, plans: Vec<Plan>) {
    for plan in plans {
        tracing::debug!(route = %route.name, branch = %plan.route.cluster, "mirror skipped: body too large");
        ctx.live.metrics.multicast(&route.name, &plan.route.cluster, "too_large");
    }
}

/// One copy of a request on its way to a branch.
struct Copy {
    ctx: Arc<HttpCtx>,
    /// The route's name (metrics labels).
    route: String,
    method: Method,
    headers: HeaderMap,
    path_and_query: PathAndQuery,
    slot: Option<BodySlot>,
}

impl Copy {
    async fn run(mut self, snapshot: &Snapshot, peer: SocketAddr, route: &Route) {
        let idempotent = is_idempotent_method(self.method.as_str());
        let ctx = self.ctx.clone();
        let outcome = match forward(&ctx, snapshot, peer, route, idempotent, &mut self).await {
            Ok(status) if status >= 500 => {
                tracing::info!(route = %route.name, branch = %route.cluster, status, "multicast copy answered 5xx");
                "5xx"
            }
            Ok(status) => {
                tracing::debug!(route = %route.name, branch = %route.cluster, status, "multicast copy answered");
                "answered"
            }
            Err((e, _)) => {
                tracing::warn!(route = %route.name, branch = %route.cluster, error = %e, "multicast copy failed");
                "failed"
            }
        };
        ctx.live.metrics.multicast(&route.name, &route.cluster, outcome);
    }
}

impl Tries for Copy {
    type Response = u16;
    type Headers = HeaderMap;

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    fn replayable(&self) -> bool {
        // The whole body is held: every try can send it.
        true
    }

    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        failover: &Failover,
    ) -> Result<u16, Kind> {
        let member = choice.member;
        let begun = Begun::new(rt, member);
        let body = match &self.slot {
            None => UpstreamBody::Empty,
            Some(slot) => UpstreamBody::stream(slot.clone(), 0, None),
        };
        let request = crate::upstream::request(
            &self.method,
            &self.headers,
            rt,
            member,
            &self.path_and_query,
            body,
        );
        let started = Instant::now();
        let per_try = failover.try_timeout(clock::from_std(started));
        let failed = |kind: FailureKind| Outcome::Failure { kind, latency: started.elapsed() };
        let client = match self.ctx.clients.for_cluster(rt) {
            Ok(c) => c,
            Err(why) => {
                begun.end(failed(FailureKind::Connect));
                return Err(Kind::Tls(why));
            }
        };
        let answer = async {
            let resp = client.request(request).await?;
            let status = resp.status().as_u16();
            let latency = started.elapsed();
            // The answer is nobody's: read and dropped, so the connection goes back to its pool.
            let drained = resp.into_body().collect().await.is_ok();
            Ok::<_, rondo_runtime::pools::SendError>((status, latency, drained))
        };
        match tokio::time::timeout(per_try, answer).await {
            Ok(Ok((status, _, _))) if !(100..=599).contains(&status) => {
                begun.end(failed(FailureKind::Reset));
                Err(Kind::BadStatus)
            }
            Ok(Ok((status, latency, drained))) => {
                record_response(rt, &self.route, member, status, latency.as_secs_f64());
                begun.end(if !drained {
                    failed(FailureKind::Reset)
                } else if status >= 500 {
                    Outcome::Failure { kind: FailureKind::Status5xx, latency }
                } else {
                    Outcome::Success { latency }
                });
                Ok(status)
            }
            Ok(Err(e)) if e.is_connect() => {
                begun.end(failed(FailureKind::Connect));
                Err(Kind::Connect)
            }
            Ok(Err(_)) => {
                begun.end(failed(FailureKind::Reset));
                Err(Kind::Reset)
            }
            Err(_elapsed) => {
                begun.end(failed(FailureKind::Timeout));
                Err(Kind::Timeout)
            }
        }
    }
}
