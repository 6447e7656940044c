//! Retries on a member's HTTP status (`retry.retry_on`: `5xx`, `gateway-error`,
//! `retriable-status:N`) on hyper's path: an answer with such a status, before any byte of it
//! reached the client, is declined and the request goes to another member, as a retry within
//! the retry budget and `attempts`. The request's body is copied as it passes (up to
//! `retry_buffer_bytes`) so that it can be sent again; a longer one, or a request that is not
//! idempotent on a cluster without `retry_non_idempotent`, keeps its first answer. A declined
//! answer is kept (when it is small) so that a request that runs out of tries gets the last
//! member's own answer, not a router error: Envoy's behaviour.

use bytes::Bytes;
use http::Response;
use http_body::Body as _;
use http_body_util::BodyExt as _;
use rondo_runtime::{ClusterRt, clock};

use super::request::Prepared;
use crate::body::ProxyBody;
use crate::error::{Kind, ProxyError};

/// The largest declined answer kept (its head and body) to give the client if no other member
/// does better; a larger one is passed on rather than retried.
const MAX_KEPT: u64 = 64 * 1024;

/// A request's declined answers.
#[derive(Default)]
pub(super) struct StatusRetry {
    kept: Option<(http::response::Parts, Bytes)>,
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
    pub(super) async fn answered(
        &mut self,
        resp: Response<ProxyBody>,
        req: &mut Prepared,
        rt: &ClusterRt,
        failover: &rondo_core::Failover,
    ) -> Result<Response<ProxyBody>, Kind> {
        let r = &rt.spec.policy.retry;
        if !r.statuses.contains(resp.status().as_u16()) || !(req.idempotent || r.non_idempotent) {
            return Ok(resp);
        }
        let sendable = match &req.slot {
            None => true,
            Some(slot) => slot.copied().map(|whole| req.slot = Some(whole)).is_some(),
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
        self.kept = Some((parts, bytes));
        Err(Kind::Declined)
    }

    /// The last member's own answer, when the request ran out of tries (or members) just after
    /// a member's answer was declined.
    pub(super) fn declined_answer(&mut self, e: &ProxyError) -> Option<Response<ProxyBody>> {
        let last = e.attempts.iter().rev().find(|a| a.member.is_some())?;
        if last.outcome != Kind::Declined {
            return None;
        }
        let (parts, bytes) = self.kept.take()?;
        Some(Response::from_parts(parts, ProxyBody::local(bytes)))
    }
}
