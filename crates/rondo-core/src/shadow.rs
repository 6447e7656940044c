//! Shadow evaluation: what a candidate algorithm would have picked, request by request, beside
//! the live one, and how its picks would have fared. The balancer asks the shadow at each real
//! pick ([`crate::Balancer::shadow_pick`]); this module keeps the tally and turns it into a
//! [`ShadowReport`]. Pure, like the rest of the core: time is an argument.
//!
//! The report's three questions, each answered the same way for the live picks and the shadow's,
//! so the two columns compare like with like:
//!
//! - **Share**: how many of the compared picks went to each member.
//! - **Failed**: a pick of member `m` *went to a failed member* when the first request on `m`
//!   to end after the pick failed (a refused or reset connection, a timeout, a 5xx: any
//!   [`Outcome::Failure`]). For a live pick that is usually its own request; for a shadow pick
//!   that went elsewhere in reality, it is the member's next real outcome, the best evidence of
//!   what the pick would have met. Picks with no ending request on their member yet are
//!   *unresolved* (a cancelled request resolves nothing).
//! - **Slow**: time is cut into windows of [`SHADOW_WINDOW`] from the start. In a window, a
//!   member with at least [`SLOW_MIN_RESPONSES`] successful responses is judged: it is *slow*
//!   when its p90 latency in the window is above [`SLOW_FACTOR`] times the window's reference,
//!   the (lower) median of the judged members' p90s. A member not judged in a window (too few
//!   responses: a live algorithm may be starving it) keeps its last verdict. A pick *went to a
//!   slow member* when its member was slow in the window of the pick. The current window counts
//!   as it stands when the report is made.
//!
//! The latencies are the real requests' (whatever member the live algorithm sent them to):
//! neither side's latencies are invented. What a member would have answered under the shadow's
//! load is beyond observation; `rondo simulate` answers that question (docs/lab.md).

use std::time::Duration;

use crate::member::Outcome;
use crate::model::{Algorithm, MemberSpec};
use crate::time::Instant;

/// The length of the windows in which members are judged slow.
pub const SHADOW_WINDOW: Duration = Duration::from_secs(10);
/// A member is slow in a window when its p90 latency is above this factor times the median of
/// the members' p90s.
pub const SLOW_FACTOR: f64 = 2.0;
/// Successful responses a member needs in a window to be judged slow or not (fewer make a p90
/// that is little more than the slowest answer).
pub const SLOW_MIN_RESPONSES: u32 = 20;

/// Latency buckets: four per power of two of microseconds (each within 19 % of its upper edge),
/// from 1 µs to 2^36 µs (19 hours; longer latencies share the last bucket).
const BUCKETS: usize = 4 * 36;

/// One side's (live or shadow) picks of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SideCounts {
    /// Picks of the member.
    pub picks: u64,
    /// Of those, picks whose member's next request to end failed.
    pub failed: u64,
    /// Of those, picks made while the member was slow.
    pub slow: u64,
    /// Of those, picks not resolved yet (no request on the member has ended since).
    pub unresolved: u64,
}

impl SideCounts {
    fn add(&mut self, o: &SideCounts) {
        self.picks += o.picks;
        self.failed += o.failed;
        self.slow += o.slow;
        self.unresolved += o.unresolved;
    }
}

/// One member's line of a [`ShadowReport`].
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowMember {
    /// The member's name; empty for the members that left the cluster since the shadow
    /// started (their counts folded together).
    pub name: String,
    /// The live algorithm's picks.
    pub live: SideCounts,
    /// The shadow's picks.
    pub shadow: SideCounts,
    /// Picks in which both chose this member.
    pub agreed: u64,
    /// Its p90 latency in the current window, when it has enough responses there to be judged.
    pub window_p90: Option<Duration>,
    /// Whether it counts as slow now (the current window's verdict, else its last one).
    pub slow: bool,
    /// Windows (closed ones) in which it was judged slow.
    pub slow_windows: u64,
}

/// What a shadow algorithm would have done since it started, against what the live one did.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowReport {
    /// The shadow (candidate) algorithm.
    pub algorithm: Algorithm,
    /// The live algorithm.
    pub live: Algorithm,
    /// When the shadow started (or its tally restarted: the live algorithm changed).
    pub since: Instant,
    /// Picks compared: every pick the live algorithm made since.
    pub decisions: u64,
    /// Picks in which the shadow chose the live pick's member.
    pub agreed: u64,
    /// Picks for which the shadow found no member (the live algorithm did).
    pub no_pick: u64,
    /// The current window's reference latency: the median of the judged members' p90s.
    pub reference_p90: Option<Duration>,
    /// Per member, in member order; the departed members' counts last, folded, when any.
    pub members: Vec<ShadowMember>,
}

impl ShadowReport {
    /// Picks in which the shadow chose another member than the live algorithm (or none).
    pub fn differed(&self) -> u64 {
        self.decisions - self.agreed
    }

    /// The live side's counts over every member.
    pub fn live_total(&self) -> SideCounts {
        let mut t = SideCounts::default();
        self.members.iter().for_each(|m| t.add(&m.live));
        t
    }

    /// The shadow side's counts over every member.
    pub fn shadow_total(&self) -> SideCounts {
        let mut t = SideCounts::default();
        self.members.iter().for_each(|m| t.add(&m.shadow));
        t
    }
}

/// A member's running tally.
#[derive(Debug, Clone, Default)]
struct MemberTally {
    live: SideCounts,
    shadow: SideCounts,
    agreed: u64,
    /// The last verdict: slow in the last window it was judged in.
    slow: bool,
    slow_windows: u64,
    /// The current window.
    window: Window,
}

#[derive(Debug, Clone, Default)]
struct Window {
    live: u64,
    shadow: u64,
    responses: u32,
    /// Successful responses' latencies ([`BUCKETS`]), allocated at the first.
    hist: Vec<u32>,
}

impl Window {
    fn record(&mut self, latency: Duration) {
        if self.hist.is_empty() {
            self.hist = vec![0; BUCKETS];
        }
        self.hist[bucket(latency)] += 1;
        self.responses += 1;
    }

    /// The p90 latency, when the window has enough responses to judge.
    fn p90(&self) -> Option<Duration> {
        if self.responses < SLOW_MIN_RESPONSES {
            return None;
        }
        let rank = (u64::from(self.responses) * 9).div_ceil(10);
        let mut seen = 0u64;
        for (b, &n) in self.hist.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return Some(bucket_upper(b));
            }
        }
        None
    }

    fn is_idle(&self) -> bool {
        self.live == 0 && self.shadow == 0 && self.responses == 0
    }

    fn clear(&mut self) {
        self.live = 0;
        self.shadow = 0;
        self.responses = 0;
        self.hist.iter_mut().for_each(|n| *n = 0);
    }
}

/// The bucket of `latency`: `4 * floor(log2(us)) + the next two bits`.
fn bucket(latency: Duration) -> usize {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1);
    let e = 63 - us.leading_zeros() as usize;
    let frac = if e >= 2 { (us >> (e - 2)) & 3 } else { (us << (2 - e)) & 3 } as usize;
    (e * 4 + frac).min(BUCKETS - 1)
}

/// The upper edge of bucket `b`.
fn bucket_upper(b: usize) -> Duration {
    let (e, f) = (b / 4, b % 4);
    Duration::from_secs_f64((4 + f + 1) as f64 * (1u64 << e) as f64 / 4.0 / 1e6)
}

/// The running tally of a shadow: every pick compared, every outcome seen.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    since: Instant,
    window_start: Instant,
    decisions: u64,
    agreed: u64,
    no_pick: u64,
    /// By member index.
    members: Vec<MemberTally>,
    /// Members that left the cluster since, folded.
    departed: Option<MemberTally>,
}

impl Tally {
    /// A tally for `members` members starting at `now`.
    pub(crate) fn new(members: usize, now: Instant) -> Tally {
        Tally {
            since: now,
            window_start: now,
            decisions: 0,
            agreed: 0,
            no_pick: 0,
            members: vec![MemberTally::default(); members],
            departed: None,
        }
    }

    /// The live algorithm picked `live` and the shadow `shadow` (`None`: nothing) at `now`.
    pub(crate) fn picked(&mut self, live: usize, shadow: Option<usize>, now: Instant) {
        self.roll(now);
        self.decisions += 1;
        if let Some(l) = self.members.get_mut(live) {
            l.live.picks += 1;
            l.live.unresolved += 1;
            l.window.live += 1;
        }
        match shadow.and_then(|s| self.members.get_mut(s).map(|t| (s, t))) {
            Some((s, t)) => {
                t.shadow.picks += 1;
                t.shadow.unresolved += 1;
                t.window.shadow += 1;
                if s == live {
                    t.agreed += 1;
                    self.agreed += 1;
                }
            }
            None => self.no_pick += 1,
        }
    }

    /// A request on `member` ended at `now` with `outcome`: the picks of `member` waiting for
    /// an outcome are resolved by it.
    pub(crate) fn ended(&mut self, member: usize, now: Instant, outcome: Outcome) {
        self.roll(now);
        let Some(t) = self.members.get_mut(member) else { return };
        match outcome {
            Outcome::Success { latency } => {
                t.live.unresolved = 0;
                t.shadow.unresolved = 0;
                t.window.record(latency);
            }
            Outcome::Failure { .. } => {
                t.live.failed += std::mem::take(&mut t.live.unresolved);
                t.shadow.failed += std::mem::take(&mut t.shadow.unresolved);
            }
            Outcome::Cancelled => {}
        }
    }

    /// Closes the windows that ended by `now`.
    fn roll(&mut self, now: Instant) {
        let elapsed = now.since(self.window_start);
        if elapsed < SHADOW_WINDOW {
            return;
        }
        let (verdicts, _) = self.judge();
        for (t, verdict) in self.members.iter_mut().zip(verdicts) {
            if let Some(slow) = verdict {
                t.slow = slow;
                t.slow_windows += u64::from(slow);
            }
            if t.slow {
                t.live.slow += t.window.live;
                t.shadow.slow += t.window.shadow;
            }
            if !t.window.is_idle() {
                t.window.clear();
            }
        }
        // The window `now` falls in (windows without a pick or an outcome are skipped).
        let into = elapsed.as_nanos() % SHADOW_WINDOW.as_nanos();
        self.window_start = now - Duration::from_nanos(into as u64);
    }

    /// Each member's verdict in the current window (`None`: not judged), and the reference.
    fn judge(&self) -> (Vec<Option<bool>>, Option<Duration>) {
        let p90s: Vec<Option<Duration>> = self.members.iter().map(|t| t.window.p90()).collect();
        let mut judged: Vec<Duration> = p90s.iter().flatten().copied().collect();
        if judged.is_empty() {
            return (vec![None; p90s.len()], None);
        }
        judged.sort_unstable();
        let reference = judged[(judged.len() - 1) / 2];
        let verdicts = p90s
            .iter()
            .map(|p| p.map(|p| p.as_secs_f64() > SLOW_FACTOR * reference.as_secs_f64()))
            .collect();
        (verdicts, Some(reference))
    }

    /// The tally for a new version of the cluster: member `i` of the new one was `old_of(i)`
    /// of this one (by name); the members that left are folded together.
    pub(crate) fn carry_over(
        &self,
        members: usize,
        old_of: impl Fn(usize) -> Option<usize>,
    ) -> Tally {
        let mut kept = vec![false; self.members.len()];
        let new = (0..members)
            .map(|i| match old_of(i) {
                Some(j) if j < self.members.len() => {
                    kept[j] = true;
                    self.members[j].clone()
                }
                _ => MemberTally::default(),
            })
            .collect();
        let mut departed = self.departed.clone();
        for (t, _) in self.members.iter().zip(&kept).filter(|(_, k)| !**k) {
            let d = departed.get_or_insert_with(MemberTally::default);
            d.live.add(&t.live);
            d.shadow.add(&t.shadow);
            d.agreed += t.agreed;
            d.slow_windows += t.slow_windows;
        }
        Tally { members: new, departed, ..self.clone_counts() }
    }

    fn clone_counts(&self) -> Tally {
        Tally {
            since: self.since,
            window_start: self.window_start,
            decisions: self.decisions,
            agreed: self.agreed,
            no_pick: self.no_pick,
            members: Vec::new(),
            departed: None,
        }
    }

    /// The report at `now` of a shadow running `algorithm` beside `live` over `members`
    /// (the cluster's members, parallel to the tally's).
    pub(crate) fn report(
        &mut self,
        now: Instant,
        algorithm: Algorithm,
        live: Algorithm,
        members: &[MemberSpec],
    ) -> ShadowReport {
        self.roll(now);
        let (verdicts, reference_p90) = self.judge();
        let line = |name: &str, t: &MemberTally, verdict: Option<bool>| {
            let slow = verdict.unwrap_or(t.slow);
            let (mut l, mut s) = (t.live, t.shadow);
            if slow {
                l.slow += t.window.live;
                s.slow += t.window.shadow;
            }
            ShadowMember {
                name: name.to_owned(),
                live: l,
                shadow: s,
                agreed: t.agreed,
                window_p90: t.window.p90(),
                slow,
                slow_windows: t.slow_windows,
            }
        };
        let mut lines: Vec<ShadowMember> = self
            .members
            .iter()
            .zip(&verdicts)
            .enumerate()
            .map(|(i, (t, v))| line(members.get(i).map_or("", |m| m.name.as_str()), t, *v))
            .collect();
        if let Some(d) = &self.departed {
            lines.push(line("", d, Some(false)));
        }
        ShadowReport {
            algorithm,
            live,
            since: self.since,
            decisions: self.decisions,
            agreed: self.agreed,
            no_pick: self.no_pick,
            reference_p90,
            members: lines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::FailureKind;

    fn specs(n: usize) -> Vec<MemberSpec> {
        (0..n)
            .map(|i| MemberSpec {
                name: format!("m{i}"),
                address: String::new(),
                weight: 100,
                group: None,
                admin: Default::default(),
            })
            .collect()
    }

    fn report(t: &mut Tally, now: Instant) -> ShadowReport {
        t.report(now, Algorithm::Random, Algorithm::RoundRobin, &specs(t.members.len()))
    }

    const OK: fn(u64) -> Outcome = |ms| Outcome::Success { latency: Duration::from_millis(ms) };
    const FAIL: Outcome = Outcome::Failure { kind: FailureKind::Connect, latency: Duration::ZERO };

    #[test]
    fn buckets_are_ordered_and_within_a_fifth_of_their_edge() {
        let mut last = 0;
        for us in [1u64, 2, 3, 4, 5, 7, 8, 100, 1_000, 1_500, 65_535, 1 << 30] {
            let d = Duration::from_micros(us);
            let b = bucket(d);
            assert!(b >= last, "{us}");
            last = b;
            let upper = bucket_upper(b).as_secs_f64() * 1e6;
            assert!(upper >= us as f64 && upper <= us as f64 * 1.25 + 1.0, "{us}: {upper}");
        }
        assert_eq!(bucket(Duration::from_secs(1 << 40)), BUCKETS - 1);
    }

    #[test]
    fn picks_are_resolved_by_the_members_next_outcome() {
        let mut t = Tally::new(3, Instant::ZERO);
        let now = Instant::from_millis(1);
        // Live on 0 twice, shadow on 2 then 0.
        t.picked(0, Some(2), now);
        t.picked(0, Some(0), now);
        t.ended(0, now, OK(1));
        let r = report(&mut t, now);
        assert_eq!((r.decisions, r.agreed, r.differed(), r.no_pick), (2, 1, 1, 0));
        assert_eq!(r.members[0].live, SideCounts { picks: 2, ..SideCounts::default() });
        assert_eq!(r.members[0].shadow.picks, 1);
        assert_eq!(
            r.members[2].shadow,
            SideCounts { picks: 1, unresolved: 1, ..SideCounts::default() }
        );
        // Member 2's next request fails: the shadow's pick of it went to a failed member.
        t.ended(2, now, FAIL);
        t.ended(2, now, FAIL);
        let r = report(&mut t, now);
        assert_eq!(
            r.members[2].shadow,
            SideCounts { picks: 1, failed: 1, ..SideCounts::default() }
        );
        assert_eq!(r.members[2].live, SideCounts::default());
        // A cancelled request resolves nothing.
        t.picked(1, None, now);
        t.ended(1, now, Outcome::Cancelled);
        let r = report(&mut t, now);
        assert_eq!(r.members[1].live.unresolved, 1);
        assert_eq!(r.no_pick, 1);
        assert_eq!(r.shadow_total().picks + r.no_pick, r.decisions);
        assert_eq!(r.live_total().picks, r.decisions);
    }

    /// Members 0 and 1 answer in 1 ms, member 2 in 10 ms: member 2 is slow, in the current
    /// window at once and in the closed window after it.
    #[test]
    fn a_member_whose_p90_is_over_twice_the_median_is_slow() {
        let mut t = Tally::new(3, Instant::ZERO);
        let mut now = Instant::from_millis(1);
        for k in 0..90 {
            let m = k % 3;
            t.picked(m, Some(2 - m), now);
            t.ended(m, now, OK(if m == 2 { 10 } else { 1 }));
        }
        let r = report(&mut t, now);
        assert!(r.members[2].slow && !r.members[0].slow && !r.members[1].slow, "{r:?}");
        let p90 = r.members[2].window_p90.unwrap();
        assert!(p90 >= Duration::from_millis(10) && p90 <= Duration::from_micros(12_500));
        let reference = r.reference_p90.unwrap();
        assert!(reference >= Duration::from_millis(1) && reference <= Duration::from_micros(1_250));
        assert_eq!((r.members[2].live.slow, r.members[2].shadow.slow), (30, 30));
        assert_eq!(r.live_total().slow, 30);
        assert_eq!(r.members[2].slow_windows, 0, "the window is still open");

        // The window closes; member 2 gets no more responses but keeps its verdict, so a pick
        // of it in the next window counts as slow too.
        now = now + SHADOW_WINDOW;
        t.picked(0, Some(2), now);
        let r = report(&mut t, now);
        assert_eq!(r.members[2].slow_windows, 1);
        assert!(r.members[2].slow && r.members[2].window_p90.is_none());
        assert_eq!(r.members[2].shadow.slow, 31);
        assert_eq!(r.members[0].live.slow, 0);
    }

    #[test]
    fn too_few_responses_are_not_judged() {
        let mut t = Tally::new(2, Instant::ZERO);
        let now = Instant::from_millis(1);
        for _ in 0..SLOW_MIN_RESPONSES {
            t.picked(0, Some(0), now);
            t.ended(0, now, OK(1));
        }
        for _ in 0..SLOW_MIN_RESPONSES - 1 {
            t.picked(1, Some(1), now);
            t.ended(1, now, OK(100));
        }
        let r = report(&mut t, now);
        assert!(r.members[0].window_p90.is_some() && r.members[1].window_p90.is_none());
        assert!(!r.members[1].slow, "{r:?}");
    }

    #[test]
    fn carried_over_tallies_keep_survivors_and_fold_departed_members() {
        let mut t = Tally::new(3, Instant::ZERO);
        let now = Instant::from_millis(1);
        for m in 0..3 {
            t.picked(m, Some((m + 1) % 3), now);
        }
        // New cluster: old 2, a new member, old 0 (old 1 left).
        let old = [Some(2), None, Some(0)];
        let mut c = t.carry_over(3, |i| old[i]);
        let r = c.report(now, Algorithm::Random, Algorithm::RoundRobin, &specs(3));
        assert_eq!(r.decisions, 3);
        assert_eq!(r.members.len(), 4);
        assert_eq!((r.members[0].live.picks, r.members[0].shadow.picks), (1, 1));
        assert_eq!((r.members[1].live.picks, r.members[1].shadow.picks), (0, 0));
        let departed = &r.members[3];
        assert_eq!(departed.name, "");
        assert_eq!((departed.live.picks, departed.shadow.picks), (1, 1));
        assert_eq!(r.live_total().picks, 3);
        assert_eq!(r.shadow_total().picks, 3);
    }
}
