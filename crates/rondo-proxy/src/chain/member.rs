//! `redirect_to_member`: instead of carrying the request, the router answers with a redirect to
//! the member the route's cluster picks (SGD's load-balancing page), the request's path (as
//! rewritten so far) and query kept; the URL is built by `rondo_core::member_url`, as the naming
//! service's redirect lookups build theirs.
//!
//! The pick is a lookup's: it moves the picker on (round-robin's turn, the weighted schedule,
//! the random draws) but charges the member no request in flight and no session, since the
//! client's request goes to the member directly and the router never sees it end.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, header};
use rondo_core::traffic::RedirectToMember;
use rondo_core::{Algorithm, PickRequest};
use rondo_runtime::{Live, Views, clock};

use super::{Answer, Applied, Info};
use crate::head::Headers;

/// A compiled `redirect_to_member`: the route's cluster, picked from the view in effect at
/// each request (a registration changes the members without recompiling the route).
pub(super) struct MemberRedirectStep {
    spec: RedirectToMember,
    live: Arc<Live>,
    /// The view a redirect picks from (as many pointer hops as through `live` before).
    views: Views,
    cluster: Arc<str>,
}

impl MemberRedirectStep {
    pub(super) fn new(spec: &RedirectToMember, live: &Arc<Live>, cluster: &str) -> Self {
        MemberRedirectStep {
            spec: *spec,
            live: live.clone(),
            views: live.views.clone(),
            cluster: cluster.into(),
        }
    }

    /// The redirect to the picked member, or a 503 saying why none could be picked.
    pub(super) fn request(
        &self,
        info: &Info<'_>,
        headers: &impl Headers,
        applied: &Applied,
    ) -> Answer {
        let snap = self.views.load();
        let Some(rt) = snap.clusters.get(&*self.cluster) else {
            return unavailable(format!("cluster `{}` is not in the view", self.cluster));
        };
        let Some(scheme) = rondo_core::member_url::scheme(&rt.spec) else {
            return unavailable(format!(
                "cluster `{}` speaks tcp: its members have no URL",
                self.cluster
            ));
        };
        let hash = (rt.spec.policy.algorithm == Algorithm::Hash)
            .then(|| {
                let ip = std::str::from_utf8(info.client_ip).ok()?.parse::<IpAddr>().ok()?;
                crate::http::forward::hash_key(
                    &rt.spec.policy.hash.key,
                    headers,
                    SocketAddr::new(ip, 0),
                )
            })
            .flatten();
        let req = PickRequest {
            now: clock::now(),
            group: self.live.group.as_deref(),
            hash,
            context: None,
            exclude: &[],
        };
        let member = match rt.pick(&req) {
            Ok(d) => d.member,
            Err(e) => return unavailable(format!("cluster `{}`: {e}", self.cluster)),
        };
        let Some(m) = rt.spec.members.get(member) else {
            return unavailable(format!("cluster `{}`: the picked member left", self.cluster));
        };
        let path = applied.path.as_deref().unwrap_or(info.path);
        let query = info.query.filter(|_| self.spec.keep_query);
        let url = rondo_core::member_url::location(scheme, &m.address, path, query);
        match HeaderValue::from_str(&url) {
            Ok(v) => Answer {
                status: self.spec.status,
                headers: vec![(header::LOCATION, v)],
                body: Bytes::new(),
            },
            Err(_) => unavailable(format!("member `{}`: its address makes no URL", m.name)),
        }
    }
}

/// 503 with the reason as text.
fn unavailable(why: String) -> Answer {
    let headers = vec![(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))];
    Answer { status: 503, headers, body: Bytes::from(format!("no member to redirect to: {why}\n")) }
}
