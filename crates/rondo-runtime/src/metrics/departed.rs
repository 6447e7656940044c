//! Series of members that left: a member's per-route response counters and latency histograms
//! and its TLS failure counters are forgotten once it has been out of its cluster for
//! [`DEPARTED_GRACE`], so that a registry with churn (members registered and removed all day)
//! does not grow `/metrics` without bound. A member back within the grace keeps its series.
//!
//! Each series is noted when it is created (off the request path: the router keeps the handles
//! it made), so what to remove is known without scanning the families. Departures are seen
//! when a view is swapped in (for `update_registered`, in the clusters it changed) and at every
//! scrape; the series go at the first of those after the grace.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{MemberRouteLabels, Metrics, ResponseLabels, TlsMemberLabels};

/// How long a departed member's series stay (a member removed and registered again, or
/// drained out and back, within it keeps its counts).
pub const DEPARTED_GRACE: Duration = Duration::from_secs(300);

/// The status classes a member's response counters may have.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What series a member has, and whether it has left.
#[derive(Debug, Default)]
struct Series {
    routes: Vec<String>,
    tls: Vec<&'static str>,
    gone: bool,
}

#[derive(Debug, Default)]
struct Inner {
    /// Cluster → member → its series.
    clusters: HashMap<String, HashMap<String, Series>>,
    /// Members that left, and when: forgotten after the grace unless back by then.
    gone: Vec<(String, String, Instant)>,
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct Departed {
    inner: Mutex<Inner>,
    grace: Mutex<Duration>,
}

impl Default for Departed {
    fn default() -> Self {
        Departed { inner: Mutex::default(), grace: Mutex::new(DEPARTED_GRACE) }
    }
}

impl Departed {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `member` of `cluster` got response series on `route`.
    pub(super) fn route(&self, cluster: &str, member: &str, route: &str) {
        let mut inner = self.inner();
        let s = inner.clusters.entry(cluster.to_owned()).or_default();
        let s = s.entry(member.to_owned()).or_default();
        if !s.routes.iter().any(|r| r == route) {
            s.routes.push(route.to_owned());
        }
    }

    /// `member` of `cluster` got a TLS failure series for `reason`.
    pub(super) fn tls(&self, cluster: &str, member: &str, reason: &'static str) {
        let mut inner = self.inner();
        let s = inner.clusters.entry(cluster.to_owned()).or_default();
        let s = s.entry(member.to_owned()).or_default();
        if !s.tls.contains(&reason) {
            s.tls.push(reason);
        }
    }
}

impl Metrics {
    /// Sets how long a departed member's series stay (default [`DEPARTED_GRACE`]).
    pub fn set_departed_grace(&self, grace: Duration) {
        *self.departed.grace.lock().unwrap_or_else(|e| e.into_inner()) = grace;
    }

    /// Members of `view` (of `only` these clusters, else of every cluster) that left or came
    /// back are noted, and the series of those gone for the grace are removed.
    pub fn members_changed(&self, view: &rondo_core::View, only: Option<&[String]>) {
        let now = Instant::now();
        let mut inner = self.departed.inner();
        let Inner { clusters, gone } = &mut *inner;
        for (name, members) in clusters.iter_mut() {
            if only.is_some_and(|o| !o.contains(name)) {
                continue;
            }
            let spec = view.clusters.get(name);
            let present = |m: &str| spec.is_some_and(|s| s.members.iter().any(|x| x.name == m));
            // One pass over the spec's members when many series exist, else a look-up each.
            let names: Option<std::collections::HashSet<&str>> = (members.len() > 8)
                .then(|| spec.map(|s| s.members.iter().map(|m| m.name.as_str()).collect()))
                .flatten();
            for (member, series) in members.iter_mut() {
                let here = match &names {
                    Some(set) => set.contains(member.as_str()),
                    None => present(member),
                };
                if !here && !series.gone {
                    series.gone = true;
                    gone.push((name.clone(), member.clone(), now));
                } else if here {
                    series.gone = false;
                }
            }
        }
        let grace = *self.departed.grace.lock().unwrap_or_else(|e| e.into_inner());
        let mut expired = Vec::new();
        gone.retain(|(cluster, member, at)| {
            if now.duration_since(*at) < grace {
                return true;
            }
            expired.push((cluster.clone(), member.clone()));
            false
        });
        for (cluster, member) in expired {
            let Some(members) = clusters.get_mut(&cluster) else { continue };
            // Back since (or gone again later, with a newer entry): kept.
            if members.get(&member).is_none_or(|s| !s.gone) {
                continue;
            }
            let still_listed = gone.iter().any(|(c, m, _)| *c == cluster && *m == member);
            if still_listed {
                continue;
            }
            if let Some(series) = members.remove(&member) {
                self.forget(&cluster, &member, &series);
            }
            if members.is_empty() {
                clusters.remove(&cluster);
            }
        }
    }

    /// Removes a member's series from their families.
    fn forget(&self, cluster: &str, member: &str, series: &Series) {
        for route in &series.routes {
            let labels = MemberRouteLabels {
                route: route.clone(),
                cluster: cluster.to_owned(),
                member: member.to_owned(),
            };
            self.latency.remove(&labels);
            for class in CLASSES {
                self.requests.remove(&ResponseLabels {
                    route: route.clone(),
                    cluster: cluster.to_owned(),
                    member: member.to_owned(),
                    class,
                });
            }
        }
        for &reason in &series.tls {
            let labels =
                TlsMemberLabels { cluster: cluster.to_owned(), member: member.to_owned(), reason };
            self.tls_member_failures.remove(&labels);
        }
        self.forget_tls_rows(cluster, member);
    }
}

#[cfg(test)]
mod tests {
    use crate::Live;
    use crate::live::RegisteredCluster;
    use crate::live::tests::{live, member};

    /// The series of the metrics text: its lines that are not comments.
    fn series(live: &Live) -> usize {
        let text = live.metrics.render(&live.load());
        text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count()
    }

    fn register(live: &Live, names: impl Iterator<Item = String>) {
        let members = names.map(|n| member(&n)).collect();
        let _ = live
            .registrations
            .update_registered(vec![("c".into(), RegisteredCluster { members, declared: None })]);
    }

    #[test]
    fn ten_thousand_members_registered_and_removed_leave_the_series_where_they_started() {
        let live = live();
        live.metrics.response("r", "c", "a", 200, 0.001);
        let start = series(&live);
        register(&live, (0..10_000).map(|i| format!("r{i}")));
        for i in 0..10_000 {
            live.metrics.response("r", "c", &format!("r{i}"), 200, 0.001);
            if i % 10 == 0 {
                live.metrics.tls_member_failure(
                    "c",
                    &format!("r{i}"),
                    rondo_core::TlsFailure::Refused,
                );
            }
        }
        let full = series(&live);
        assert!(full > start + 10_000 * 10, "{full} series with 10,000 members serving");
        // All removed: their state gauges go at once, their counts stay for the grace (a
        // member back soon keeps them)...
        register(&live, std::iter::empty());
        let kept = series(&live);
        assert!(kept < full && kept > start + 10_000 * 10, "{start} {kept} {full}");
        // ...and forgotten after it.
        live.metrics.set_departed_grace(std::time::Duration::ZERO);
        assert_eq!(series(&live), start);
        assert_eq!(live.metrics.tls_failures_of("c"), vec![]);
        // The configured member that stayed kept its counts.
        let text = live.metrics.render(&live.load());
        assert!(text.contains("member=\"a\""), "{text}");
    }

    #[test]
    fn a_member_back_within_the_grace_keeps_its_series() {
        let live = live();
        register(&live, ["x".to_owned()].into_iter());
        live.metrics.response("r", "c", "x", 503, 0.001);
        let with_a = series(&live);
        register(&live, std::iter::empty());
        register(&live, ["x".to_owned()].into_iter());
        live.metrics.set_departed_grace(std::time::Duration::ZERO);
        assert_eq!(series(&live), with_a);
        let text = live.metrics.render(&live.load());
        assert!(
            text.contains(
                "rondo_requests_total{route=\"r\",cluster=\"c\",member=\"x\",class=\"5xx\"} 1"
            ),
            "{text}"
        );
    }
}
