//! Latency percentiles over recorded samples (by [`quantile`], the lab's nearest rank).

use std::time::Duration;

/// Percentiles of a set of latency samples, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
}

/// The `q`-quantile of sorted samples by the nearest-rank method: the lab's, so that a
/// benchmark and `rondo simulate` report the same percentile of the same samples.
pub use rondo_lab::stats::quantile;

/// Summarises latency samples given in nanoseconds (sorts them in place).
pub fn summarize(samples: &mut [u64]) -> Summary {
    samples.sort_unstable();
    let us = |q: f64| quantile(samples, q).map_or(0.0, |ns| ns as f64 / 1000.0);
    let mean_us = if samples.is_empty() {
        0.0
    } else {
        samples.iter().map(|&n| n as f64).sum::<f64>() / samples.len() as f64 / 1000.0
    };
    Summary {
        count: samples.len(),
        p50_us: us(0.50),
        p90_us: us(0.90),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: samples.last().map_or(0.0, |&n| n as f64 / 1000.0),
        mean_us,
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX`.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_in_microseconds() {
        let mut v = vec![3_000, 1_000, 2_000, 4_000];
        let s = summarize(&mut v);
        assert_eq!(s.count, 4);
        assert_eq!(s.p50_us, 2.0);
        assert_eq!(s.max_us, 4.0);
        assert_eq!(s.mean_us, 2.5);
    }
}
