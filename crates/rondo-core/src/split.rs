//! Weighted clusters (`clusters` of a route): a route's primary cluster chosen per request by
//! weight, for canary releases and blue/green shifts. Pure: the draw takes its randomness as an
//! argument, and a session's earlier choice (a data plane reads it from the request) is kept
//! while its cluster is still in the split.

use crate::rng::Entropy;

/// One cluster of a route's split and its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedCluster {
    /// The cluster.
    pub cluster: String,
    /// Its share, relative to the other clusters' weights (0: none).
    pub weight: u32,
}

/// The index in `split` of the cluster a request goes to first: `held` (a session's earlier
/// choice) when it names a cluster with a positive weight, else one drawn by weight. The second
/// value says whether it was drawn (a new choice the data plane may tell the client). `None`
/// only for a split without a positive weight, which the configuration refuses.
pub fn pick(
    split: &[WeightedCluster],
    held: Option<&str>,
    entropy: &mut dyn Entropy,
) -> Option<(usize, bool)> {
    if let Some(held) = held
        && let Some(i) = split.iter().position(|w| w.cluster == held && w.weight > 0)
    {
        return Some((i, false));
    }
    let total: u64 = split.iter().map(|w| u64::from(w.weight)).sum();
    let total = usize::try_from(total).ok().filter(|t| *t > 0)?;
    let mut draw = entropy.below(total) as u64;
    for (i, w) in split.iter().enumerate() {
        let weight = u64::from(w.weight);
        if draw < weight {
            return Some((i, true));
        }
        draw -= weight;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;

    fn split(weights: &[(&str, u32)]) -> Vec<WeightedCluster> {
        weights.iter().map(|(c, w)| WeightedCluster { cluster: (*c).into(), weight: *w }).collect()
    }

    #[test]
    fn draws_follow_the_weights_and_skip_zero_weights() {
        let s = split(&[("v1", 90), ("off", 0), ("v2", 10)]);
        let mut rng = SplitMix64::new(7);
        let mut v2 = 0;
        for _ in 0..100_000 {
            let (i, drawn) = pick(&s, None, &mut rng).unwrap();
            assert!(drawn);
            assert_ne!(i, 1, "weight 0 is never drawn");
            v2 += usize::from(i == 2);
        }
        // Binomial(100000, 0.1): sd about 95, so 9,500..10,500 is over five deviations wide.
        assert!((9_500..10_500).contains(&v2), "{v2}");
    }

    #[test]
    fn a_held_cluster_is_kept_only_while_it_has_a_weight() {
        let s = split(&[("v1", 1), ("v2", 0), ("v3", 1)]);
        let mut rng = SplitMix64::new(1);
        assert_eq!(pick(&s, Some("v3"), &mut rng), Some((2, false)));
        let (i, drawn) = pick(&s, Some("v2"), &mut rng).unwrap();
        assert!(drawn && i != 1, "a cluster weighted 0 is out of the split: {i}");
        let (_, drawn) = pick(&s, Some("gone"), &mut rng).unwrap();
        assert!(drawn);
        assert_eq!(pick(&split(&[("v1", 0)]), None, &mut rng), None);
    }
}
