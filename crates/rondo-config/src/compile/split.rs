//! A route's weighted clusters (`clusters`): the split its requests' primary cluster is drawn
//! from, exclusive with `cluster`; each cluster known (as `cluster` must be), listed once, not
//! also a backup, weighted 0 to [`MAX_SPLIT_WEIGHT`] with a positive sum.

use rondo_core::split::WeightedCluster;

use super::*;

/// Largest weight of a split cluster.
pub const MAX_SPLIT_WEIGHT: u64 = 1_000_000;

/// The route's split and the cluster that names it (its first of positive weight); `None` when
/// the route has no `clusters`.
pub(super) fn compile_split(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) -> Option<(String, Vec<WeightedCluster>)> {
    let raw = r.clusters.as_ref()?;
    if !r.cluster.is_empty() {
        c.err(
            path.key("clusters"),
            "a route has either `cluster` or `clusters` (a weighted split), not both",
        );
    }
    if raw.is_empty() {
        c.err(path.key("clusters"), "a split needs at least one cluster");
        return Some((String::new(), Vec::new()));
    }
    let mut out: Vec<WeightedCluster> = Vec::with_capacity(raw.len());
    for (j, w) in raw.iter().enumerate() {
        let p = path.key("clusters").index(j);
        if out.iter().any(|o| o.cluster == w.cluster) {
            c.err(p.key("cluster"), format!("cluster `{}` is listed twice", w.cluster));
        } else if r.backups.contains(&w.cluster) {
            c.err(
                p.key("cluster"),
                format!("cluster `{}` is in the split and also a backup", w.cluster),
            );
        } else if !clusters.contains_key(&w.cluster) && !declared_ok {
            c.err(p.key("cluster"), super::unknown_cluster(&w.cluster, clusters));
        }
        let weight = match w.weight {
            None => {
                c.err(p.clone(), "each cluster of a split needs a `weight` (0 or more)");
                0
            }
            Some(v) => c.int(p.key("weight"), Some(v), 0, 0, MAX_SPLIT_WEIGHT),
        };
        out.push(WeightedCluster { cluster: w.cluster.clone(), weight: weight as u32 });
    }
    let primary = out.iter().find(|w| w.weight > 0).map(|w| w.cluster.clone());
    // Only weights all given and in range can be found wanting together.
    let valid = raw.iter().all(|w| w.weight.is_some_and(|v| v <= MAX_SPLIT_WEIGHT));
    if primary.is_none() && valid {
        c.err(path.key("clusters"), "the weights of a split must not all be 0");
    }
    Some((primary.unwrap_or_default(), out))
}

/// The split's clusters with their field paths (for the checks every target of a route gets).
pub(super) fn targets<'r>(
    path: &FieldPath,
    route: &'r Route,
) -> impl Iterator<Item = (FieldPath, &'r String)> {
    let path = path.clone();
    route
        .split
        .iter()
        .enumerate()
        .map(move |(j, w)| (path.key("clusters").index(j).key("cluster"), &w.cluster))
}
