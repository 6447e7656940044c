//! Load estimators: how loaded is a member? They measure; the pickers in [`crate::balancer`]
//! choose. Each estimator takes the time as an argument (linkerd's `get_at` style), so it can be
//! driven by a test clock.

use std::time::Duration;

use crate::time::Instant;

/// Finagle's peak-EWMA latency estimate (also linkerd2's and tower's `PeakEwma`).
///
/// A sample above the estimate replaces it at once (the peak), so a member that turns slow is
/// avoided immediately; samples below it pull it down gradually with weight
/// `1 - exp(-elapsed / decay)`. Reading the estimate also decays it by the time since the last
/// sample, so a member that was briefly slow and then got no traffic drifts back toward zero and
/// is tried again: the exploration floor that stops power-of-two-choices starving it forever.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakEwma {
    estimate_ns: f64,
    stamp: Instant,
    /// Whether any round trip was folded in (or handed over by a previous process): before
    /// that the estimate is the configured default, which status pages should not show as a
    /// measurement.
    sampled: bool,
}

impl PeakEwma {
    /// An estimate that starts at `initial`.
    pub fn new(initial: Duration, now: Instant) -> Self {
        PeakEwma { estimate_ns: initial.as_nanos() as f64, stamp: now, sampled: false }
    }

    /// An estimate of `estimate_ns` last updated at `stamp` (a previous process's
    /// [`PeakEwma::last`], moved onto this process's clock).
    pub fn restore(estimate_ns: f64, stamp: Instant) -> Self {
        let estimate_ns = if estimate_ns.is_finite() { estimate_ns.max(0.0) } else { 0.0 };
        PeakEwma { estimate_ns, stamp, sampled: true }
    }

    /// Folds in one observed round trip.
    pub fn observe(&mut self, rtt: Duration, now: Instant, decay: Duration) {
        let rtt_ns = rtt.as_nanos() as f64;
        // One decay factor serves both the read of the current estimate and the new sample's
        // weight (the same value `get_at` computes).
        let w = exp_neg(now.0.saturating_sub(self.stamp.0) as f64 * inverse_nanos(decay));
        let current = self.estimate_ns * w;
        self.estimate_ns = if rtt_ns > current { rtt_ns } else { current * w + rtt_ns * (1.0 - w) };
        self.stamp = now;
        self.sampled = true;
    }

    /// Folds in a failure, counted as a round trip of at least `penalty` (and at least twice the
    /// current estimate), so failing members lose power-of-two comparisons.
    pub fn observe_failure(&mut self, now: Instant, decay: Duration, penalty: Duration) {
        let current = Duration::from_nanos(self.get_at(now, decay) as u64);
        self.observe(penalty.max(current * 2), now, decay);
    }

    /// The estimate at `now` in nanoseconds, decayed by the time since the last sample.
    pub fn get_at(&self, now: Instant, decay: Duration) -> f64 {
        self.get_at_inv(now, inverse_nanos(decay))
    }

    /// The estimate (nanoseconds) as of its last sample, and when that was.
    #[inline]
    pub fn last(&self) -> (f64, Instant) {
        (self.estimate_ns, self.stamp)
    }

    /// When the latest round trip was folded in; `None` while the estimate is still the
    /// configured default (no request to the member has ended yet).
    pub fn sampled_at(&self) -> Option<Instant> {
        self.sampled.then_some(self.stamp)
    }

    /// [`PeakEwma::get_at`] with `1 / decay_ns` computed once by the caller (saves a division
    /// per read on the `p2c-ewma` hot path).
    #[inline]
    pub fn get_at_inv(&self, now: Instant, inv_decay_ns: f64) -> f64 {
        self.estimate_ns * exp_neg(now.0.saturating_sub(self.stamp.0) as f64 * inv_decay_ns)
    }
}

/// Requests a member's [`LatencyMean`] averages over: each new latency weighs at least
/// `1 / LATENCY_WINDOW` (measured in the lab, issue 42: with 16 to 64 one heavy-tailed request
/// still moves the mean too far; 128 does not, and a member that turns slow is still seen at
/// once through [`LatencyMean::quiet_for`]).
pub const LATENCY_WINDOW: u32 = 128;
/// The short window of [`LatencyMean`]: the mean over about this many requests is taken
/// instead of the long one while it is below half of it (a member that got faster, its queue
/// drained or itself recovered, is believed within a few requests; one long request can only
/// raise the short mean, so it cannot make a member look faster). In the lab it took the
/// flash crowd with a late joiner from 1.14x the oracle's p99 to 1.07x.
pub const LATENCY_FAST_WINDOW: u32 = 16;

/// A member's mean latency over about its last [`LATENCY_WINDOW`] successful requests of this
/// balancer's (over fewer when the member just got faster), and how long it has gone without finishing one while some were in flight:
/// what `adaptive` estimates a member's delay from.
///
/// Unlike [`PeakEwma`], which takes any higher sample at once and lets lower ones pull it down
/// over seconds, so that it holds about the highest recent latency, a plain mean over many
/// requests is not moved far by one long request: under heavy-tailed service times (a
/// lognormal's one request in a hundred at ten times the mean) a peak estimate makes a member
/// that just served one long request look ten times slower than it is, and the picks follow
/// that noise. C3 (NSDI 2015) smooths its servers' feedback for the same reason.
///
/// Kept with the member's [`Load`] across view swaps; a hand-off to a new process starts it
/// afresh (`adaptive` uses the peak EWMA, which is handed over, until a request ends).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatencyMean {
    mean_ns: f64,
    fast_ns: f64,
    samples: u32,
    last_end: Option<Instant>,
    quiet_since: Instant,
}

impl LatencyMean {
    /// Folds in one successful request's `latency`, ended at `now`.
    pub fn observe(&mut self, latency: Duration, now: Instant) {
        self.samples = self.samples.saturating_add(1);
        // The plain mean until a window fills, so that the first sample does not linger.
        let latency = latency.as_nanos() as f64;
        self.mean_ns += (latency - self.mean_ns) / f64::from(self.samples.min(LATENCY_WINDOW));
        self.fast_ns += (latency - self.fast_ns) / f64::from(self.samples.min(LATENCY_FAST_WINDOW));
        self.last_end = Some(now);
        self.quiet_since = now;
    }

    /// A request is being placed on the member while none of this balancer's is in flight
    /// there: its quiet time ([`LatencyMean::quiet_for`]) starts now, not at its last end.
    pub fn start_idle(&mut self, now: Instant) {
        self.quiet_since = now;
    }

    /// The mean (ns): over the last [`LATENCY_WINDOW`] requests, or the last
    /// [`LATENCY_FAST_WINDOW`] while that is below half of it; and when its latest sample
    /// ended. `None` before any.
    #[inline]
    pub fn mean(&self) -> Option<(f64, Instant)> {
        let mean = if self.fast_ns < 0.5 * self.mean_ns { self.fast_ns } else { self.mean_ns };
        self.last_end.map(|at| (mean, at))
    }

    /// How long (ns) at `now` the member has gone without finishing a request of this
    /// balancer's since it last finished one or last got one while idle. Meaningful while
    /// requests are in flight: then the oldest of them has been out at least this long.
    #[inline]
    pub fn quiet_for(&self, now: Instant) -> u64 {
        now.0.saturating_sub(self.quiet_since.0)
    }
}

/// `1 / d` in nanoseconds, infinite for zero (everything decays at once).
pub fn inverse_nanos(d: Duration) -> f64 {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if ns == 0 { f64::INFINITY } else { 1.0 / ns as f64 }
}

/// `e^-x` for `x >= 0`, to within 0.3 % — plenty for a load estimate, and several times cheaper
/// than `f64::exp` on the `p2c-ewma` hot path (two estimates read per pick). Splits
/// `x * log2(e)` into an integer part, applied to the exponent bits, and a fraction, by a
/// fourth-order polynomial for `2^-f`.
#[inline]
pub fn exp_neg(x: f64) -> f64 {
    let y = x * std::f64::consts::LOG2_E;
    if y.is_nan() {
        return 1.0;
    }
    if y >= 1000.0 {
        return 0.0;
    }
    let y = y.max(0.0);
    // `y` is non-negative, so truncation is floor (and avoids a libm call without SSE4.1).
    let n = y as u64;
    let f = y - n as f64;
    let l = std::f64::consts::LN_2 * f;
    let frac = 1.0 - l + l * l / 2.0 - l * l * l / 6.0 + l * l * l * l / 24.0;
    frac * f64::from_bits((1023 - n) << 52)
}

/// What a member's load agent last said (SGD Advanced Load Management).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentReport {
    /// CPU in use, 0.0..=1.0.
    pub cpu_used: f32,
    /// Free memory in bytes.
    pub mem_free: u64,
    /// Sessions the member counts itself.
    pub sessions: u32,
    /// The heartbeat's sequence number.
    pub seq: u64,
    /// When the router received it.
    pub at: Instant,
}

impl AgentReport {
    /// Whether the report is still current under `timeout`.
    pub fn is_fresh(&self, now: Instant, timeout: Duration) -> bool {
        now.since(self.at) <= timeout
    }
}

/// Counters the data plane keeps per member.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Requests sent and not yet finished.
    pub in_flight: u32,
    /// Sessions (sticky HTTP sessions, TCP connections) pinned to the member.
    pub sessions: u32,
    /// Latency estimate.
    pub ewma: PeakEwma,
    /// Latest agent report.
    pub agent: Option<AgentReport>,
    /// Round trip of the member's probe in the latest probe round (CLB's response-time table).
    pub probe_rtt: Option<Duration>,
    /// Requests completed in total (for status and explain).
    pub completed: u64,
    /// Failures in a row (passive outlier detection reads this).
    pub consecutive_failures: u32,
    /// Mean latency of this balancer's own requests (`adaptive` reads it).
    pub latency: LatencyMean,
    /// What others have at this member, in flight and in sessions: the other clusters of this
    /// process that list the same shared member, and the other routers of the tier. Set by
    /// the runtime ([`crate::Balancer::set_external`]), never measured here; the pickers that
    /// count load (`least-sessions`, `least-connections`, `p2c-ewma`, `adaptive`, bounded-load
    /// hashing) add it to this balancer's own counts.
    pub external: u32,
}

impl Load {
    /// Fresh counters with the EWMA at `initial`.
    pub fn new(initial: Duration, now: Instant) -> Self {
        Load {
            in_flight: 0,
            sessions: 0,
            ewma: PeakEwma::new(initial, now),
            agent: None,
            probe_rtt: None,
            completed: 0,
            consecutive_failures: 0,
            latency: LatencyMean::default(),
            external: 0,
        }
    }

    /// Sessions plus in-flight requests, this balancer's and others' ([`Load::external`]):
    /// what `least-sessions` minimises.
    #[inline]
    pub fn active(&self) -> u64 {
        u64::from(self.in_flight) + u64::from(self.sessions) + u64::from(self.external)
    }

    /// Requests in flight at the member as the latency-aware pickers weigh them: this
    /// balancer's and others' ([`Load::external`]).
    #[inline]
    pub fn seen_in_flight(&self) -> u32 {
        self.in_flight.saturating_add(self.external)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECAY: Duration = Duration::from_secs(10);

    #[test]
    fn peak_is_taken_at_once_and_decays_gradually() {
        let mut e = PeakEwma::new(Duration::from_millis(10), Instant::ZERO);
        e.observe(Duration::from_millis(100), Instant::from_millis(1), DECAY);
        let peak = e.get_at(Instant::from_millis(1), DECAY);
        assert!((peak - 100e6).abs() < 1.0, "peak {peak}");
        // A fast sample one second later only pulls the estimate part of the way down.
        e.observe(Duration::from_millis(10), Instant::from_millis(1001), DECAY);
        let after = e.get_at(Instant::from_millis(1001), DECAY);
        assert!(after > 10e6 && after < 100e6, "after {after}");
    }

    #[test]
    fn the_default_estimate_is_no_sample() {
        let mut e = PeakEwma::new(Duration::from_millis(30), Instant::from_millis(5));
        assert_eq!(e.sampled_at(), None);
        e.observe(Duration::from_millis(2), Instant::from_millis(9), DECAY);
        assert_eq!(e.sampled_at(), Some(Instant::from_millis(9)));
        // Handed over by a previous process: that process measured it.
        let restored = PeakEwma::restore(2e6, Instant::from_millis(3));
        assert_eq!(restored.sampled_at(), Some(Instant::from_millis(3)));
    }

    #[test]
    fn idle_estimate_decays_toward_zero() {
        let mut e = PeakEwma::new(Duration::from_millis(10), Instant::ZERO);
        e.observe(Duration::from_secs(1), Instant::ZERO, DECAY);
        let later = e.get_at(Instant::from_millis(60_000), DECAY);
        assert!(later < 1e9 * 0.01, "later {later}");
    }

    #[test]
    fn failure_counts_as_at_least_the_penalty() {
        let mut e = PeakEwma::new(Duration::from_millis(10), Instant::ZERO);
        e.observe_failure(Instant::ZERO, DECAY, Duration::from_secs(1));
        assert!(e.get_at(Instant::ZERO, DECAY) >= 1e9);
    }

    #[test]
    fn the_latency_mean_shrugs_off_one_long_request_and_believes_a_faster_member() {
        let ms = Duration::from_millis;
        let mut m = LatencyMean::default();
        assert_eq!(m.mean(), None);
        for k in 0..200 {
            m.observe(ms(10), Instant::from_millis(k));
        }
        m.observe(ms(1000), Instant::from_millis(200));
        let (mean, at) = m.mean().expect("a mean");
        assert_eq!(at, Instant::from_millis(200));
        // A peak EWMA would now read 1000 ms; the mean moves by 1/128 of the gap.
        assert!(mean < 20e6, "mean {mean}");
        // A member that was slow and got faster: 32 fast requests after 200 slow ones (the
        // long window alone would still read about 80 ms).
        let mut m = LatencyMean::default();
        for k in 0..200 {
            m.observe(ms(100), Instant::from_millis(k));
        }
        for k in 0..32 {
            m.observe(ms(10), Instant::from_millis(200 + k));
        }
        let (mean, _) = m.mean().expect("a mean");
        assert!(mean < 25e6, "the short window is believed: {mean}");
        // Quiet time runs from the last end, or from a pick that found the member idle.
        assert_eq!(m.quiet_for(Instant::from_millis(300)), 69_000_000);
        m.start_idle(Instant::from_millis(290));
        assert_eq!(m.quiet_for(Instant::from_millis(300)), 10_000_000);
    }

    #[test]
    fn exp_neg_is_close_to_exp() {
        let mut x = 0.0;
        while x < 50.0 {
            let (fast, exact) = (exp_neg(x), (-x).exp());
            assert!((fast - exact).abs() <= exact * 0.003 + 1e-300, "x={x}: {fast} vs {exact}");
            x += 0.0137;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(1e9), 0.0);
        assert_eq!(exp_neg(f64::INFINITY), 0.0);
    }

    #[test]
    fn agent_report_expires() {
        let r = AgentReport { cpu_used: 0.5, mem_free: 1, sessions: 0, seq: 1, at: Instant::ZERO };
        assert!(r.is_fresh(Instant::from_millis(600), Duration::from_millis(600)));
        assert!(!r.is_fresh(Instant::from_millis(601), Duration::from_millis(600)));
    }
}
