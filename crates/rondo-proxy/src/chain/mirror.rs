//! `mirror`: a sampled share of a route's requests copied to another cluster, fire and forget.
//! The request phase only draws ([`crate::entropy::chance`]) and names the branch in
//! [`Applied::copies`]; the copying is multicast's ([`crate::multicast`]: a mirror is a
//! sampled multicast branch, with its bounded queue, its failover and its outcome counter), on
//! hyper's path, which holds the body a copy needs (`needs_hyper`).

use rondo_core::Branch;
use rondo_core::traffic::Mirror;

use super::Applied;
use crate::entropy::chance;

/// A compiled `mirror`.
pub(super) struct MirrorStep {
    branch: Branch,
    ppm: u32,
}

impl MirrorStep {
    pub(super) fn new(spec: &Mirror) -> MirrorStep {
        let branch =
            Branch { cluster: spec.cluster.clone(), backups: Vec::new(), queue: spec.queue };
        MirrorStep { branch, ppm: spec.ppm }
    }

    /// Draws whether this request is mirrored.
    pub(super) fn request(&self, applied: &mut Applied) {
        if chance(self.ppm) {
            applied.copies.push(self.branch.clone());
        }
    }
}
