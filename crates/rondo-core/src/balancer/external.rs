//! What a balancer is told about a member by others: the load other clusters of the process and
//! other routers of the tier have at it ([`crate::Load::external`]), and a passive ejection
//! another cluster holding the same shared member made. The runtime measures and relays; these
//! setters only store, so a pick never looks past its own balancer's lock.

use super::Balancer;
use crate::time::Instant;

impl Balancer {
    /// Sets what others have at `member` (in flight and in sessions); the load-counting
    /// pickers see it added to this balancer's own counts from the next pick. Returns whether
    /// it changed. An index past the members is ignored.
    pub fn set_external(&mut self, member: usize, external: u32) -> bool {
        let Some(st) = self.states.get_mut(member) else { return false };
        let was = st.load.external;
        if was == external {
            return false;
        }
        st.load.external = external;
        // The bounded-load cap of `hash` compares a member's share with the cluster's total.
        self.total_active =
            (self.total_active + u64::from(external)).saturating_sub(u64::from(was));
        self.load_changed(member);
        true
    }

    /// Another cluster holding the same shared member ejected it until `until` (its `count`th
    /// ejection in a row): one ejection state for every cluster the member serves. The
    /// ejecting cluster checked its own `max_ejected_percent`; this one takes the verdict as it
    /// takes a health check's. Returns whether anything changed.
    pub fn set_ejection(&mut self, member: usize, until: Instant, count: u32) -> bool {
        let Some(st) = self.states.get_mut(member) else { return false };
        if st.ejected_until == Some(until) {
            return false;
        }
        st.ejected_until = Some(until);
        st.ejections = count;
        st.up_since = Some(until);
        st.load.consecutive_failures = 0;
        self.invalidate();
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::model::{Algorithm, ClusterSpec, MemberSpec, Policy, UpstreamProtocol};
    use crate::{Balancer, Instant, PickRequest, SplitMix64};

    fn cluster(algorithm: Algorithm) -> Balancer {
        let member = |name: &str| MemberSpec {
            name: name.into(),
            address: format!("{name}:80"),
            weight: 100,
            group: None,
            admin: Default::default(),
        };
        let spec = ClusterSpec {
            name: "c".into(),
            members: vec![member("a"), member("b"), member("c")],
            policy: Policy { algorithm, ..Policy::default() },
            upstream_protocol: UpstreamProtocol::Http1,
            sticky: Default::default(),
            upstream_tls: None,
        };
        Balancer::new(Arc::new(spec), Instant::ZERO)
    }

    /// Least-sessions avoids a member others keep busy, and takes it again once they let go.
    #[test]
    fn least_sessions_counts_what_others_have_at_a_member() {
        let mut b = cluster(Algorithm::LeastSessions);
        let mut rng = SplitMix64::new(7);
        let req = PickRequest::default();
        assert!(b.set_external(0, 5));
        assert!(!b.set_external(0, 5), "unchanged");
        for _ in 0..10 {
            let d = b.pick(&req, &mut rng).expect("a member");
            assert_ne!(d.member, 0, "member a is busy through others");
            b.begin_request(d.member);
        }
        // Five each on b and c; others let go of one at a: a is the least loaded now.
        b.set_external(0, 4);
        assert_eq!(b.pick(&req, &mut rng).expect("a member").member, 0);
        b.set_external(0, 9);
        assert_ne!(b.pick(&req, &mut rng).expect("a member").member, 0);
        assert_eq!(b.states()[0].load.active(), 9);
        assert_eq!(b.states()[0].load.in_flight, 0, "its own count is untouched");
    }

    /// P2C weighs others' requests in flight like its own.
    #[test]
    fn p2c_weighs_others_in_flight() {
        let mut b = cluster(Algorithm::P2cEwma);
        let mut rng = SplitMix64::new(3);
        b.set_external(1, 1_000);
        let picks = (0..200)
            .filter(|_| b.pick(&PickRequest::default(), &mut rng).expect("a member").member == 1)
            .count();
        // Only its exploration picks (one in a few hundred) may land on it.
        assert!(picks <= 5, "{picks} picks on the busy member");
    }

    /// An ejection made elsewhere takes the member out here until it ends.
    #[test]
    fn an_ejection_from_another_cluster_applies_here() {
        let mut b = cluster(Algorithm::RoundRobin);
        let mut rng = SplitMix64::new(1);
        let until = Instant::from_millis(1_000);
        assert!(b.set_ejection(2, until, 1));
        assert!(!b.set_ejection(2, until, 1));
        for _ in 0..6 {
            let req = PickRequest { now: Instant::from_millis(10), ..PickRequest::default() };
            assert_ne!(b.pick(&req, &mut rng).expect("a member").member, 2);
        }
        let later = PickRequest { now: Instant::from_millis(1_001), ..PickRequest::default() };
        let back = (0..6).any(|_| b.pick(&later, &mut rng).expect("a member").member == 2);
        assert!(back, "back once the ejection ended");
    }
}
