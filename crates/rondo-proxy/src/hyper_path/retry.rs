//! Retries on a member's HTTP status (`retry.retry_on`: `5xx`, `gateway-error`,
//! `retriable-status:N`) on hyper's path: an answer with such a status, before any byte of it
//! reached the client, is declined and the request goes to another member, as a retry within
//! the retry budget and `attempts`. The request's body is copied as it passes (up to
//! `retry_buffer_bytes`) so that it can be sent again; a longer one, or a request that is not
//! idempotent on a cluster without `retry_non_idempotent`, keeps its first answer. A declined
//! answer is kept (when it is small) so that a request that runs out of tries gets the last
//! member's own answer, not a router error: Envoy's behaviour. Hedged tries are declined alike,
//! and a request its cluster hedges has its body read whole first ([`hedged_body`]).

use bytes::Bytes;
use http::Response;
use http_body::Body as _;
use http_body_util::BodyExt as _;
use rondo_runtime::{ClusterRt, clock};

use std::sync::Mutex;

use rondo_core::Route;
use rondo_core::failover::is_idempotent_method;
use rondo_runtime::Snapshot;

use super::request::Prepared;
use crate::body::{BodySlot, ProxyBody};
use crate::client_body::ClientBody;
use crate::error::{Kind, ProxyError};

/// The largest declined answer kept (its head and body) to give the client if no other member
/// does better; a larger one is passed on rather than retried.
const MAX_KEPT: u64 = 64 * 1024;

/// A request's declined answers (behind a lock: hedged tries decline side by side).
#[derive(Default)]
pub(super) struct StatusRetry {
    kept: Mutex<Option<(http::response::Parts, Bytes)>>,
}

/// How much of the body of `req` to read before its first try, when a cluster of `route` may
/// hedge it (`retry.hedge`): its `retry_buffer_bytes`, for an idempotent method (or any, with
/// `retry_non_idempotent`) and a body not known to be longer. gRPC calls are never hedged.
pub(super) fn hedged_body(
    snapshot: &Snapshot,
    route: &Route,
    req: &http::Request<ClientBody>,
    grpc: bool,
) -> Option<u64> {
    if grpc || req.body().is_end_stream() {
        return None;
    }
    let idempotent = is_idempotent_method(req.method().as_str());
    let names = std::iter::once(&route.cluster).chain(route.split.iter().map(|w| &w.cluster));
    let limit = names.filter_map(|name| snapshot.clusters.get(name)).find_map(|rt| {
        let r = &rt.spec.policy.retry;
        let hedges = r.hedge.is_some_and(|h| h.max > 0) && (idempotent || r.non_idempotent);
        hedges.then_some(u64::from(r.buffer_bytes))
    })?;
    (req.body().size_hint().lower() <= limit).then_some(limit)
}

impl StatusRetry {
    /// Before a try on `rt`: the body is copied as it passes when the cluster may send it again.
    pub(super) fn before(req: &mut Prepared, rt: &ClusterRt) {
        let r = &rt.spec.policy.retry;
        if (!r.statuses.is_empty() || r.non_idempotent)
            && let Some(slot) = &req.slot
        {
            slot.keep_copy(u64::from(r.buffer_bytes));
        }
    }

    /// The member's answer to a try on `rt`: one with a status the cluster retries is declined
    /// (`Err(Kind::Declined)`) when the request may be sent again and the answer is small
    /// enough to keep; otherwise it is the answer.
    /// `slot` is the request's body, which becomes the copy the next try sends.
    pub(super) async fn answered(
        &self,
        resp: Response<ProxyBody>,
        (idempotent, slot): (bool, &mut Option<BodySlot>),
        rt: &ClusterRt,
        failover: &rondo_core::Failover,
    ) -> Result<Response<ProxyBody>, Kind> {
        let r = &rt.spec.policy.retry;
        if !r.statuses.contains(resp.status().as_u16()) || !(idempotent || r.non_idempotent) {
            return Ok(resp);
        }
        let sendable = match slot {
            None => true,
            Some(s) => s.copied().map(|whole| *s = whole).is_some(),
        };
        if !sendable || resp.body().size_hint().upper().is_none_or(|n| n > MAX_KEPT) {
            return Ok(resp);
        }
        let (parts, mut body) = resp.into_parts();
        body.detach_conn();
        let left = failover.try_timeout(clock::now());
        let bytes = match tokio::time::timeout(left, body.collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            // The member broke off its own answer: a failure like any other.
            _ => return Err(Kind::Reset),
        };
        tracing::debug!(cluster = %rt.spec.name, status = parts.status.as_u16(), "answer declined: trying elsewhere");
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((parts, bytes));
        Err(Kind::Declined)
    }

    /// The last member's own answer, when the request ran out of tries (or members) just after
    /// a member's answer was declined.
    pub(super) fn declined_answer(&mut self, e: &ProxyError) -> Option<Response<ProxyBody>> {
        let last = e.attempts.iter().rev().find(|a| a.member.is_some())?;
        if last.outcome != Kind::Declined {
            return None;
        }
        let (parts, bytes) = self.kept.get_mut().unwrap_or_else(|e| e.into_inner()).take()?;
        Some(Response::from_parts(parts, ProxyBody::local(bytes)))
    }
}
