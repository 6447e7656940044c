//! The router's request path with the member replaced by a script: the golden vectors
//! (`crates/rondo-golden`) replay recorded scenarios through the very `http::place` and
//! `http::forward` that every HTTP request runs (the route's cluster and backups, the request's
//! failover engine, sessions and hash keys read from the request's header fields), at the
//! scenario's time, with each try's fate given by the script instead of a member. Nothing here
//! opens a socket.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::HeaderMap;
use rondo_config::ListenerSpec;
use rondo_core::{Failover, Instant, Outcome, Route, Stop};
use rondo_runtime::{ClusterRt, Live, Refused};

use crate::error::Kind;
use crate::http::{Choice, HttpCtx, Tries, forward, place};

/// A router over `live` for replays: one listener's settings and the data-plane state a request
/// path keeps (sessions, pools), none of them used for I/O.
pub struct Replayer {
    ctx: HttpCtx,
}

impl std::fmt::Debug for Replayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer").field("listener", &self.ctx.listener.name).finish()
    }
}

/// The peer a replayed request comes from.
const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 40_000);

/// A try's fate, as the script tells it: the outcome the member's balancer records, and the
/// failure the request path sees (`None`: the member answered).
pub type Fate = (Outcome, Option<Kind>);

/// What a replayed request did: every try (the cluster's name and the member's), and why the
/// failover engine stopped when no try succeeded (`None` when one did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The tries, in order: (cluster, member).
    pub tries: Vec<(String, String)>,
    /// Why the request failed, or `None`.
    pub stop: Option<Stop>,
}

impl Replayer {
    /// A replayer for `listener` over `live`.
    pub fn new(listener: ListenerSpec, live: Arc<Live>) -> Replayer {
        let ctx = HttpCtx::detached(listener, live);
        Replayer { ctx }
    }

    /// Places one try of a request driven by `failover` on `rt` as the request path does
    /// (`http::place`), with the request's `headers`, at `now`; the member's index.
    pub fn place(
        &self,
        rt: &Arc<ClusterRt>,
        failover: &mut Failover,
        headers: &HeaderMap,
        now: Instant,
    ) -> Result<usize, Refused> {
        place(&self.ctx, rt, failover, headers, PEER, now).map(|c| c.member)
    }

    /// Runs one request on `route` through the router's failover loop (`http::forward`) at `now`:
    /// each try's fate comes from `script` (given the cluster runtime and the member's index),
    /// and its outcome is recorded on the member's balancer at `now`.
    pub async fn request(
        &self,
        route: &Route,
        idempotent: bool,
        headers: HeaderMap,
        now: Instant,
        script: &mut dyn FnMut(&Arc<ClusterRt>, usize) -> Fate,
    ) -> Replayed {
        let snapshot = self.ctx.views.load();
        let mut tries = Scripted { headers, now, script, tried: Vec::new() };
        let stop = match forward(&self.ctx, &snapshot, PEER, route, idempotent, &mut tries).await {
            Ok(()) => None,
            Err((e, _)) => Some(e.stop.unwrap_or(Stop::Exhausted)),
        };
        Replayed { tries: tries.tried, stop }
    }
}

/// A request whose tries the script answers.
struct Scripted<'s> {
    headers: HeaderMap,
    now: Instant,
    script: &'s mut dyn FnMut(&Arc<ClusterRt>, usize) -> Fate,
    tried: Vec<(String, String)>,
}

impl Tries for Scripted<'_> {
    type Response = ();
    type Headers = HeaderMap;

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    fn replayable(&self) -> bool {
        true
    }

    fn now(&self) -> Instant {
        self.now
    }

    async fn attempt(
        &mut self,
        rt: &Arc<ClusterRt>,
        choice: Choice,
        _: &Failover,
    ) -> Result<(), Kind> {
        let member = choice.member;
        self.tried.push((rt.spec.name.clone(), rt.spec.members[member].name.clone()));
        let (outcome, failure) = (self.script)(rt, member);
        rt.with(|b| b.end_request(member, self.now, outcome));
        failure.map_or(Ok(()), Err)
    }
}
