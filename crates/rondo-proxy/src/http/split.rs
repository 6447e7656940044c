//! A route's weighted split (`clusters`) on the request path: which cluster a request tries
//! first ([`primary`], drawn by the core's [`rondo_core::split::pick`] with the worker's
//! randomness), and the cookie that keeps a sticky session on the cluster it was first sent
//! to. The failover loop asks [`Primary::cluster`] for each try's cluster; backups follow the
//! drawn cluster as they follow `cluster`.
//!
//! The cookie (`rondo-split-<route>`, naming the cluster) is set on the response of a request
//! whose cluster was drawn and keeps sessions (`granularity = "session"`): the member's own
//! session cookie would mean nothing in the split's other cluster. It is honoured while the
//! cluster it names has a positive weight in the split. It is not signed: it can only name a
//! cluster the split already sends requests to.

use http::HeaderValue;
use rondo_core::{Granularity, Route};
use rondo_runtime::Snapshot;

use super::HttpCtx;
use crate::entropy::Local;
use crate::head::Headers;
use crate::sticky;

/// The cluster a request tries first, and the split cookie its response carries.
pub(crate) struct Primary<'r> {
    cluster: &'r String,
    cookie: Option<HeaderValue>,
}

/// The request's primary cluster: `route.cluster`, or with a split, the session's cluster (its
/// split cookie) or one drawn by weight.
pub(crate) fn primary<'r>(
    ctx: &HttpCtx,
    snapshot: &Snapshot,
    route: &'r Route,
    headers: &impl Headers,
) -> Primary<'r> {
    let plain = Primary { cluster: &route.cluster, cookie: None };
    if route.split.is_empty() {
        return plain;
    }
    let name = cookie_name(&route.name);
    let held = sticky::cookie(headers, &name);
    let Some((i, drawn)) = rondo_core::split::pick(&route.split, held, &mut Local) else {
        return plain;
    };
    let cluster = &route.split[i].cluster;
    let sessions = snapshot
        .clusters
        .get(cluster)
        .is_some_and(|rt| rt.spec.policy.granularity == Granularity::Session);
    let cookie = (drawn && sessions)
        .then(|| {
            let secure = if ctx.listener.tls.is_some() { "; Secure" } else { "" };
            let value = format!("{name}={cluster}; Path=/; HttpOnly; SameSite=Lax{secure}");
            HeaderValue::from_str(&value).ok()
        })
        .flatten();
    Primary { cluster, cookie }
}

impl<'r> Primary<'r> {
    /// The cluster of the failover's cluster index `i`: the primary, then the route's backups.
    pub(crate) fn cluster(&self, route: &'r Route, i: usize) -> &'r String {
        if i == 0 { self.cluster } else { &route.backups[i - 1] }
    }

    /// The split cookie a try in the failover's cluster `i` sets (any try on the primary: the
    /// one that answers tells the client).
    pub(crate) fn cookie(&self, i: usize) -> Option<HeaderValue> {
        if i == 0 { self.cookie.clone() } else { None }
    }
}

/// The split cookie's name: `rondo-split-<route>`, or with a route name that is no cookie
/// token, the name's hash in its place.
pub(crate) fn cookie_name(route: &str) -> String {
    let token = route.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if token {
        format!("rondo-split-{route}")
    } else {
        format!("rondo-split-{:016x}", rondo_core::hash::hash_key(route.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::cookie_name;

    #[test]
    fn cookie_names_are_tokens() {
        assert_eq!(cookie_name("shop"), "rondo-split-shop");
        let odd = cookie_name("a=b;c");
        assert!(odd.starts_with("rondo-split-") && odd.len() == 28, "{odd}");
    }
}
