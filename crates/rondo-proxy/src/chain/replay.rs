//! `session_replay` (WCF's session recovery) in the request's walk: the step marks the
//! request ([`Applied::replay`]); before each try, a session that moved to the try's member gets
//! its kept requests replayed first ([`before_try`]); the member's answer keeps the request in
//! the session's log, or empties the log at the member's checkpoint ([`Session::answered`]).
//! The logs themselves, their limits and their hand-off are [`crate::session_replay`]'s. Only
//! hyper's path holds a request whole as a log keeps it, so the step sends its routes there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;
use http::header;
use http::request::Parts;
use http::uri::PathAndQuery;
use rondo_core::{Failover, Route, SessionReplay};
use rondo_runtime::{ClusterRt, clock};

use super::Applied;
use crate::body::BodySlot;
use crate::http::HttpCtx;
use crate::session_replay::{
    CHECKPOINT_HEADER, Kept, MAX_SESSION_ID, Plan, REPLAY_COOKIE, REPLAY_HEADER, REPLAYED_HEADER,
    Recorded,
};

/// The request as its try sent it: what a session's log keeps.
#[derive(Clone, Copy)]
pub(crate) struct Sent<'a> {
    pub(crate) parts: &'a Parts,
    pub(crate) path_and_query: &'a PathAndQuery,
    pub(crate) slot: Option<&'a BodySlot>,
}

/// A try's session: its id, the cookie that gives a new one to the client, the route's limits,
/// and what a replay before the try did.
pub(crate) struct Session {
    key: String,
    cookie: Option<HeaderValue>,
    limits: SessionReplay,
    /// `None`: nothing replayed; `Some(None)`: skipped (over its limits); `Some(Some(n))`.
    replayed: Option<Option<usize>>,
}

/// Before a try on `member`: the request's session (when its chain has `session_replay` and
/// the cluster keeps sessions), with its kept requests replayed first should it have moved to
/// this member. `Err`: the replay failed after this long (the try fails, and failover moves on).
pub(crate) async fn before_try(
    applied: Option<&Applied>,
    ctx: &HttpCtx,
    route: &Route,
    rt: &Arc<ClusterRt>,
    member: usize,
    headers: &http::HeaderMap,
    failover: &Failover,
) -> Result<Option<Session>, Duration> {
    let Some(limits) = applied.and_then(|a| a.replay) else { return Ok(None) };
    let Some((key, cookie)) = session_of(rt, headers, ctx.listener.tls.is_some()) else {
        return Ok(None);
    };
    let replayed = replay_moved(ctx, route, rt, member, &key, failover).await?;
    Ok(Some(Session { key, cookie, limits, replayed }))
}

impl Session {
    /// The session's side of its member's answer (`h`, its head): the request kept for replay
    /// (or the log emptied at the member's checkpoint), what a replay to the member did, and
    /// the session's cookie.
    pub(crate) fn answered(
        self,
        ctx: &HttpCtx,
        route: &Route,
        rt: &ClusterRt,
        member: usize,
        req: Sent<'_>,
        h: &mut http::HeaderMap,
    ) {
        keep_for_replay(ctx, route, rt, member, req, &self.key, self.limits, h);
        match self.replayed {
            Some(Some(n)) => {
                h.insert(REPLAYED_HEADER, HeaderValue::from(n));
            }
            Some(None) => {
                h.insert(REPLAY_HEADER, HeaderValue::from_static("skipped"));
            }
            None => {}
        }
        if let Some(cookie) = self.cookie {
            h.append(header::SET_COOKIE, cookie);
        }
    }
}

/// A session that moved to `member` gets its kept requests first. `Ok(None)`: nothing to
/// replay; `Ok(Some(None))`: skipped, the session is over its replay limits; `Ok(Some(Some(n)))`:
/// `n` requests replayed; `Err`: the replay failed after this long.
async fn replay_moved(
    ctx: &HttpCtx,
    route: &Route,
    rt: &Arc<ClusterRt>,
    member: usize,
    key: &str,
    failover: &Failover,
) -> Result<Option<Option<usize>>, Duration> {
    let store = &ctx.sessions.replay;
    let name = &rt.spec.members[member].name;
    match store.plan(&route.name, key, name) {
        Plan::Nothing => Ok(None),
        Plan::Skipped => {
            tracing::info!(route = %route.name, member = %name, "session over its replay limits: failed over without replay");
            ctx.live.metrics.replay(&route.name, "skipped");
            store.moved(&route.name, key, name);
            Ok(Some(None))
        }
        Plan::Replay(kept) => {
            let started = Instant::now();
            let timeout = failover.try_timeout(clock::from_std(started));
            match replay(ctx, rt, member, &kept, timeout).await {
                Ok(n) => {
                    tracing::info!(route = %route.name, member = %name, replayed = n, "session replayed to the member taking it over");
                    ctx.live.metrics.replay(&route.name, "replayed");
                    store.moved(&route.name, key, name);
                    Ok(Some(Some(n)))
                }
                Err(()) => {
                    tracing::info!(route = %route.name, member = %name, "session replay failed: trying the next member");
                    ctx.live.metrics.replay(&route.name, "failed");
                    Err(started.elapsed())
                }
            }
        }
    }
}

/// Keeps the request just answered by `member` in its session's log (`None` for a body that
/// was not read whole: too large to keep), or empties the log on the member's checkpoint (its
/// `x-rondo-checkpoint`, which goes no further).
#[allow(clippy::too_many_arguments)]
fn keep_for_replay(
    ctx: &HttpCtx,
    route: &Route,
    rt: &ClusterRt,
    member: usize,
    req: Sent<'_>,
    key: &str,
    limits: SessionReplay,
    response: &mut http::HeaderMap,
) {
    let checkpoint = response.remove(CHECKPOINT_HEADER).is_some();
    let body = match req.slot {
        None => Some((Bytes::new(), None)),
        Some(slot) => slot.whole_body().map(|(b, t)| (b.clone(), t.cloned())),
    };
    let kept = body.map(|(body, trailers)| {
        let mut headers = req.parts.headers.clone();
        headers.remove(REPLAY_HEADER);
        Kept::new(req.parts.method.clone(), req.path_and_query.clone(), headers, body, trailers)
    });
    let store = &ctx.sessions.replay;
    let name = &rt.spec.members[member].name;
    let idle = rt.spec.sticky.idle_timeout;
    if store.record(&route.name, limits, idle, key, name, kept, checkpoint) == Recorded::Over {
        tracing::debug!(route = %route.name, "session over its replay limits: no longer kept");
    }
    ctx.live.metrics.replay_bytes.set(store.bytes() as i64);
}

/// The session a request of `route` on cluster `rt` belongs to, for replay: its header
/// session's id, or its replay cookie's; a cookie session without one gets a new id and the
/// `Set-Cookie` that gives it to the client.
fn session_of(
    rt: &ClusterRt,
    headers: &http::HeaderMap,
    secure: bool,
) -> Option<(String, Option<http::HeaderValue>)> {
    let spec = &rt.spec;
    if spec.policy.granularity != rondo_core::Granularity::Session {
        return None;
    }
    if let Some(h) = &spec.sticky.header {
        let id = crate::head::Headers::get_str(headers, h.as_str())?;
        return (id.len() <= MAX_SESSION_ID).then(|| (id.to_owned(), None));
    }
    if let Some(id) = crate::sticky::cookie(headers, REPLAY_COOKIE)
        && id.len() == 32
        && id.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Some((id.to_owned(), None));
    }
    let id = crate::session_replay::new_id();
    let secure = if secure { "; Secure" } else { "" };
    let cookie = format!("{}={id}; Path=/; HttpOnly; SameSite=Lax{secure}", REPLAY_COOKIE);
    Some((id, http::HeaderValue::from_str(&cookie).ok()))
}

/// Replays `kept` to `member` of `rt`, in order, each within `timeout` (a request of its
/// own, marked `x-rondo-replay: 1`, its answer read and dropped): how many, or the failure
/// (no answer, or a 5xx: the member could not take the session over).
async fn replay(
    ctx: &HttpCtx,
    rt: &ClusterRt,
    member: usize,
    kept: &[Arc<Kept>],
    timeout: Duration,
) -> Result<usize, ()> {
    use http_body_util::BodyExt as _;
    let client = ctx.clients.for_cluster(rt).map_err(|_| ())?;
    for k in kept {
        let mut headers = k.headers();
        headers.insert(REPLAY_HEADER, http::HeaderValue::from_static("1"));
        let slot = crate::body::BodySlot::whole(k.body.clone(), k.trailers.clone());
        let body = crate::body::UpstreamBody::stream(slot, 0, None);
        let request =
            crate::upstream::request(&k.method, &headers, rt, member, &k.path_and_query, body);
        let answer = async {
            let resp = client.request(request).await.map_err(|_| ())?;
            let status = resp.status().as_u16();
            resp.into_body().collect().await.map_err(|_| ())?;
            if status >= 500 { Err(()) } else { Ok(()) }
        };
        tokio::time::timeout(timeout, answer).await.map_err(|_| ())??;
    }
    Ok(kept.len())
}
