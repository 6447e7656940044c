//! The numbers a run is judged by: percentiles of sorted latencies, Jain's fairness index and
//! the share each member took. Pure functions over the results, so tests can check them alone.

/// The `q`-quantile (0..=1) of sorted values by the nearest-rank method; `None` when empty.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// Jain's fairness index `(Σx)² / (n Σx²)`: 1 when every value is equal, `1/n` when one value
/// holds everything (Jain, Chiu and Hawe, 1984). `None` with fewer than two values or all zero.
pub fn jain(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let sum: f64 = values.iter().sum();
    let sq: f64 = values.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        return None;
    }
    Some(sum * sum / (values.len() as f64 * sq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 0.999), Some(100));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&[7], 0.5), Some(7));
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn thinning_keeps_quantiles_and_the_maximum() {
        let v: Vec<u64> = (1..=1_000_000).collect();
        let t = crate::sim::thin(v.clone(), 1000);
        assert_eq!(t.len(), 1000);
        assert_eq!(t.last(), Some(&1_000_000));
        for q in [0.5, 0.99, 0.999] {
            let (a, b) = (quantile(&v, q).unwrap_or(0), quantile(&t, q).unwrap_or(0));
            assert!(a.abs_diff(b) <= 1000, "q={q}: {a} vs {b}");
        }
        let short = vec![1, 2, 3];
        assert_eq!(crate::sim::thin(short.clone(), 1000), short);
    }

    #[test]
    fn jain_bounds() {
        assert_eq!(jain(&[3.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(jain(&[1.0, 0.0, 0.0, 0.0]), Some(0.25));
        assert_eq!(jain(&[0.0, 0.0]), None);
        assert_eq!(jain(&[1.0]), None);
    }
}
