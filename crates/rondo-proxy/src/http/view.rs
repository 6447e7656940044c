//! What the router derives once per view of a cluster, for both codecs ([`ClusterView`], in the
//! cluster runtime's opaque `data_plane` slot), and the per-route response metrics kept there.

use std::sync::{Arc, RwLock};

use http::uri;
use rondo_runtime::ClusterRt;
use rondo_runtime::metrics::RouteMetrics;

/// What the router derives once from a view of a cluster and keeps beside it, in the cluster
/// runtime's `data_plane` slot (the runtime knows nothing of HTTP): each member's address as a
/// URI authority (`None`: not a valid one) for hyper's path, the own HTTP/1 path's idle
/// connections per member, indexed by member number, and each route's metric handles on the
/// cluster, resolved once per route and member rather than per response.
pub(crate) struct ClusterView {
    pub(crate) authorities: Box<[Option<uri::Authority>]>,
    /// Idle upstream connections of the own HTTP/1 path, per member.
    pub(crate) idle: Box<[crate::h1::pool::Idle]>,
    /// Per route (by name), its metrics on this cluster.
    routes: RwLock<Vec<(String, Arc<RouteMetrics>)>>,
}

impl ClusterView {
    /// `rt`'s, made at its first request (`None` only if another data plane filled the slot,
    /// which none does).
    pub(crate) fn of(rt: &ClusterRt) -> Option<&ClusterView> {
        let made = rt.data_plane.get_or_init(|| {
            let members = &rt.spec.members;
            let authorities =
                members.iter().map(|m| uri::Authority::try_from(m.address.as_str()).ok()).collect();
            let (limits, timeout) = (rt.spec.policy.connections, rt.spec.policy.connect_timeout);
            let proxy = rt.spec.policy.send_proxy;
            let idle = members
                .iter()
                .map(|m| {
                    let idle = crate::h1::pool::Idle::new(&m.address, limits, timeout);
                    idle.sending(proxy, &m.address)
                })
                .collect();
            Arc::new(ClusterView { authorities, idle, routes: RwLock::default() })
        });
        made.downcast_ref::<ClusterView>()
    }

    /// `route`'s metrics on this cluster, created on first use.
    pub(crate) fn route_metrics(&self, rt: &ClusterRt, route: &str) -> Arc<RouteMetrics> {
        let find = |list: &[(String, Arc<RouteMetrics>)]| {
            list.iter().find(|(r, _)| r == route).map(|(_, per)| per.clone())
        };
        if let Some(per) = find(&self.routes.read().unwrap_or_else(|e| e.into_inner())) {
            return per;
        }
        let mut list = self.routes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(per) = find(&list) {
            return per;
        }
        let (name, members) = (&rt.spec.name, rt.spec.members.len());
        let per = Arc::new(RouteMetrics::new(rt.metrics(), route, name, members));
        list.push((route.to_owned(), per.clone()));
        per
    }
}

/// Counts `member`'s response on `route` (status, latency in seconds) in the process's metrics
/// and returns the route's metrics on `rt` (for its bytes).
pub(crate) fn record_response(
    rt: &ClusterRt,
    route: &str,
    member: usize,
    status: u16,
    latency: f64,
) -> Arc<RouteMetrics> {
    let handles = route_metrics(rt, route);
    handles.record(rt.metrics(), member, &rt.spec.members[member].name, status, latency);
    handles
}

/// `route`'s metrics on `rt`, kept in its [`ClusterView`].
pub(crate) fn route_metrics(rt: &ClusterRt, route: &str) -> Arc<RouteMetrics> {
    match ClusterView::of(rt) {
        Some(view) => view.route_metrics(rt, route),
        // Never: the slot is only ever filled with a `ClusterView`.
        None => Arc::new(RouteMetrics::new(rt.metrics(), route, &rt.spec.name, 0)),
    }
}

#[cfg(test)]
mod tests {
    use rondo_core::{ClusterSpec, MemberSpec, Policy, UpstreamProtocol, View};
    use rondo_runtime::Live;

    use super::*;

    #[test]
    fn responses_are_counted_per_route_member_and_class() {
        let member = |n: &str| MemberSpec {
            name: n.into(),
            address: "127.0.0.1:1".into(),
            weight: 100,
            group: None,
            admin: Default::default(),
        };
        let spec = ClusterSpec {
            name: "c".into(),
            members: vec![member("a"), member("b")],
            policy: Policy::default(),
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: Default::default(),
            upstream_tls: None,
        };
        let view = View {
            id: 1,
            routes: vec![],
            clusters: [("c".to_owned(), Arc::new(spec))].into_iter().collect(),
        };
        let live = Live::new(view, None);
        let snap = live.load();
        let rt = &snap.clusters["c"];
        record_response(rt, "r1", 0, 200, 0.001);
        record_response(rt, "r1", 0, 204, 0.002);
        record_response(rt, "r2", 0, 503, 0.003);
        record_response(rt, "r1", 1, 404, 0.004);
        // One set of handles per route, kept beside the cluster's runtime.
        assert!(Arc::ptr_eq(&route_metrics(rt, "r1"), &route_metrics(rt, "r1")));
        let text = live.metrics.render(&snap);
        let line = |route: &str, member: &str, class: &str, n: u64| {
            format!(
                "rondo_requests_total{{route=\"{route}\",cluster=\"c\",member=\"{member}\",class=\"{class}\"}} {n}\n"
            )
        };
        for l in [line("r1", "a", "2xx", 2), line("r2", "a", "5xx", 1), line("r1", "b", "4xx", 1)] {
            assert!(text.contains(&l), "{l:?} missing from\n{text}");
        }
        // A class never seen is not shown.
        assert!(!text.contains("class=\"3xx\""), "{text}");
        let count =
            "rondo_request_duration_seconds_count{route=\"r1\",cluster=\"c\",member=\"a\"} 2";
        assert!(text.contains(count), "{text}");
    }
}
