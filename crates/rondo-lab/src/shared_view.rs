//! The tier's shared load view in the lab (`shared_view_ms`, issue 37 item 9): every period
//! each router publishes its own requests in flight and sessions per member, and each router
//! counts the others' as its members' external addend ([`rondo_core::Balancer::set_external`]),
//! as `[tier]` does over NATS. A report is applied one period after it was taken (published at
//! a router's tick, counted at the receivers' next one), so the view is always one period old.

use rondo_core::Balancer;

/// The reports taken at the last tick, applied at the next.
#[derive(Debug, Default)]
pub(crate) struct SharedView {
    /// Per router, per balancer member: in flight plus sessions at the last tick.
    published: Vec<Vec<u32>>,
}

impl SharedView {
    /// One tick: the reports taken a period ago are counted (each router's addend is the sum
    /// of the others' reports), then new ones are taken.
    pub(crate) fn tick(&mut self, balancers: &mut [Balancer]) {
        let members = balancers.first().map_or(0, |b| b.states().len());
        let fits = self.published.len() == balancers.len()
            && self.published.iter().all(|p| p.len() == members);
        if fits {
            let total: Vec<u32> = (0..members)
                .map(|m| self.published.iter().map(|p| p[m]).fold(0u32, u32::saturating_add))
                .collect();
            for (r, bal) in balancers.iter_mut().enumerate() {
                for (m, &all) in total.iter().enumerate() {
                    bal.set_external(m, all.saturating_sub(self.published[r][m]));
                }
            }
        }
        self.published = balancers
            .iter()
            .map(|b| {
                b.states()
                    .iter()
                    .map(|s| s.load.in_flight.saturating_add(s.load.sessions))
                    .collect()
            })
            .collect();
    }

    /// The members changed (a join or a leave): reports of the old list are dropped.
    pub(crate) fn reset(&mut self) {
        self.published.clear();
    }
}
