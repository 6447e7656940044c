//! The HTTP request path's shared stages, which both codecs run in the same order: the router's
//! own HTTP/1 path (`crate::h1`) and hyper's (`crate::hyper_path`), each with its own
//! accept/connection loop and its own way of making a try.
//!
//! 1. accept/connection: `crate::h1::conn` (and `lib.rs`'s hyper server, whose requests enter
//!    at `crate::hyper_path::handle`);
//! 2. `route`: refuse loops and malformed `Host`s, find the first matching route in the filter
//!    table (priority, then file order); on hyper's path, when a route that reads the body
//!    (`body_json`, `body_xml`) could match, its first bytes are read and the table looked at
//!    again;
//! 3. filters: the route's gate (`auth`), then the request as members get it (each codec's
//!    `prepare`; multicast copies leave here, `crate::multicast`);
//! 4. `forward`: the one failover loop, over a `Tries`. The core's `Failover`
//!    engine says which cluster the next try goes to and whether a failed try may go elsewhere;
//!    `place` puts the try on a member (sticky session, hash key or the cluster's algorithm)
//!    in the same lock hold as the retry budget; each codec's `attempt` sends the try with its
//!    timeout and classifies a failure;
//! 5. respond: the member's answer streamed back with header hygiene (each codec's `respond`);
//!    or, when the tries ran out, an error that explains itself (`gave_up`).
//!
//! What the router keeps per view of a cluster for both codecs is in `view`.

use std::sync::Arc;
use std::time::Duration;

use rondo_config::ListenerSpec;
use rondo_core::Route;
use rondo_runtime::Live;
use rondo_runtime::metrics::ListenerMetrics;

use crate::access::AccessLog;

use crate::error::{Kind, ProxyError};
use crate::sticky::Sessions;
use crate::upstream::Clients;

/// Idle timeout after a response that matched no route.
pub(crate) const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// Everything a listener's requests share.
#[derive(Debug)]
pub struct HttpCtx {
    /// The listener's settings.
    pub listener: ListenerSpec,
    /// The process's live state, for what a request reaches rarely (metrics, the tier key,
    /// the group); the view and the drain, read at every request, through their own handles.
    pub live: Arc<Live>,
    /// The view in effect (loaded once per request: as many pointer hops as through `live`).
    pub views: rondo_runtime::Views,
    /// The process's drain (checked at every request).
    pub drain: Arc<rondo_runtime::sockets::drain::Drain>,
    /// Upstream pools.
    pub clients: Clients,
    /// Header-identified sessions.
    pub sessions: Sessions,
    /// The listener's connection and own-response metrics.
    pub metrics: Arc<ListenerMetrics>,
    /// The listener's access log, when configured.
    pub access: Option<AccessLog>,
    /// Sign-on token checks (routes' `auth`), shared by every listener.
    pub auth: Arc<crate::auth::Auth>,
    /// The multicast branches' queues.
    pub copies: crate::multicast::queues::Queues,
    /// The `rate_limit` filters' buckets, kept across views.
    pub limits: crate::chain::Limits,
    /// `Alt-Svc: h3=":PORT"` for the TCP responses of a listener that also serves HTTP/3.
    pub alt_svc: Option<http::HeaderValue>,
    /// Spans of this listener's requests (`[tracing]`); `None`, the request path's one look
    /// at tracing, without it.
    pub tracer: Option<Arc<crate::otel::Tracer>>,
}

impl HttpCtx {
    /// A context for `listener` over `live` that serves no socket of its own (a replay of
    /// recorded scenarios, a test): its own pools, sessions and buckets, no access log, no
    /// `Alt-Svc`.
    pub fn detached(listener: ListenerSpec, live: Arc<Live>) -> HttpCtx {
        HttpCtx {
            metrics: live.metrics.listener(&listener.name),
            listener,
            views: live.views.clone(),
            drain: live.drain.clone(),
            live,
            clients: Clients::new(Duration::from_secs(1)),
            sessions: Default::default(),
            access: None,
            auth: Default::default(),
            copies: Default::default(),
            limits: Default::default(),
            alt_svc: None,
            tracer: None,
        }
    }

    /// A detached context for one plain listener, `web` on 127.0.0.1 (the size tests).
    #[cfg(test)]
    pub(crate) fn plain_for_tests() -> Arc<HttpCtx> {
        let config = rondo_config::parse_str(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n",
            std::path::Path::new("t.toml"),
            1,
        )
        .expect("config");
        let live = Arc::new(Live::new(config.view.clone(), None));
        Arc::new(HttpCtx::detached(config.listeners[0].clone(), live))
    }
}

/// A failure the client is answered with, and the idle timeout its connection keeps.
pub(crate) type Failure = (ProxyError, Duration);

pub(crate) fn on_route(route: &Route, kind: Kind, detail: String) -> Failure {
    (ProxyError::on_route(kind, &route.name, &route.cluster, detail), route.idle_timeout)
}

pub(crate) mod forward;
mod hedge;
pub(crate) mod route;
pub(crate) mod split;
pub(crate) mod view;

#[cfg(feature = "replay")]
pub(crate) use forward::place;
pub(crate) use forward::{Begun, Choice, Tries, backoff, forward, pause};
pub(crate) use route::{Decided, Target, find_route, looped, needs_hyper, without_port};
pub(crate) use view::{ClusterView, record_response, route_metrics};

/// The view id a response proxied from `rt`'s members carries (`rondo-view-id`), when the
/// cluster asks for it (`view_id_header`): the view this process serves, as its naming API
/// tells it. Off, one flag read.
pub(crate) fn view_id_of(live: &rondo_runtime::Live, rt: &rondo_runtime::ClusterRt) -> Option<u64> {
    rt.spec.policy.view_id_header.then(|| live.load().view.id)
}
