//! A shadow algorithm on a [`Balancer`]: a candidate evaluated beside the live one at every
//! pick, over the same candidates and member state, moving no traffic ([`crate::shadow`] holds
//! its tally and report).

use std::collections::HashMap;

use super::pickers::AlgoState;
use super::{Balancer, PickRequest, slow_start_holds_back};
use crate::member::Outcome;
use crate::model::Algorithm;
use crate::rng::Entropy;
use crate::time::Instant;

/// A shadow: a candidate algorithm asked at every real pick what it would have picked, over the
/// same candidates (the same eligibility, exclusions and slow start) and the same member state
/// (load, latency estimates, probe round trips, agent reports: fed by the same request starts
/// and ends, so the same numbers), with its own algorithm state (cursors, schedules, indexes,
/// tables, rotation list, least-recently-picked order, rotating contexts) and the caller's
/// separate generator. It moves no traffic: nothing it does reaches the live picks.
#[derive(Debug)]
pub(super) struct Shadow {
    pub(super) algorithm: Algorithm,
    pub(super) algo: AlgoState,
    /// Picks it made so far, and each member's last (its least-recently-picked order).
    pub(super) seq: u64,
    pub(super) last_pick: Vec<u64>,
    pub(super) next_context: u32,
    pub(super) tally: crate::shadow::Tally,
}

impl Balancer {
    /// `old`'s shadow in this new version of its cluster: algorithm state kept as the live
    /// one's is (by member name), the tally too, restarted when the live algorithm changed
    /// (its live side would mix two algorithms).
    pub(super) fn carry_shadow(
        &self,
        sh: &Shadow,
        old: &Balancer,
        previous: &HashMap<&str, usize>,
        now: Instant,
    ) -> Shadow {
        let old_of: Vec<Option<usize>> =
            self.spec.members.iter().map(|m| previous.get(m.name.as_str()).copied()).collect();
        let index = self.index_by_name();
        let algo = AlgoState::carry_over(sh.algorithm, &sh.algo, |m| {
            index.get(old.spec.members[m as usize].name.as_str()).copied()
        });
        let tally = if old.spec.policy.algorithm == self.spec.policy.algorithm {
            sh.tally.carry_over(self.states.len(), |i| old_of[i])
        } else {
            crate::shadow::Tally::new(self.states.len(), now)
        };
        Shadow {
            algorithm: sh.algorithm,
            algo,
            seq: sh.seq,
            last_pick: old_of.iter().map(|o| o.map_or(0, |j| sh.last_pick[j])).collect(),
            next_context: sh.next_context,
            tally,
        }
    }

    /// Starts evaluating `algorithm` beside the live one from `now` (a fresh tally; replacing
    /// a running shadow), or with `None` stops. See [`Balancer::shadow_pick`].
    pub fn set_shadow(&mut self, algorithm: Option<Algorithm>, now: Instant) {
        self.shadow = algorithm.map(|algorithm| {
            let mut algo = AlgoState::new(algorithm);
            // `response-time`'s table from the latest probe round, as a view change keeps it.
            algo.rerank(&self.states);
            Box::new(Shadow {
                algorithm,
                algo,
                seq: 0,
                last_pick: vec![0; self.states.len()],
                next_context: 0,
                tally: crate::shadow::Tally::new(self.states.len(), now),
            })
        });
    }

    /// The shadow algorithm being evaluated, if any.
    pub fn shadow(&self) -> Option<Algorithm> {
        self.shadow.as_ref().map(|s| s.algorithm)
    }

    #[inline(never)]
    pub(super) fn shadow_pick_inner(
        &mut self,
        req: &PickRequest<'_>,
        live: Option<usize>,
        rng: &mut dyn Entropy,
    ) -> Option<usize> {
        // Current already: the live pick just refreshed the candidates for this request.
        self.refresh(req.now, req.group);
        let Balancer { spec, states, cands, shadow, total_active, .. } = self;
        let sh = shadow.as_deref_mut()?;
        if !sh.algo.is_built() {
            sh.algo.rebuild(spec, cands, states);
        }
        let picked = (!cands.slots.is_empty()).then(|| {
            let context = match req.context {
                Some(c) => c,
                None if sh.algorithm == Algorithm::Rotating => {
                    let c = sh.next_context;
                    sh.next_context = c.wrapping_add(1);
                    c
                }
                None => 0,
            };
            let recency = &sh.last_pick[..];
            let (slot, _) = sh.algo.pick(
                cands,
                states,
                &spec.policy,
                *total_active,
                req,
                context,
                rng,
                recency,
            );
            let member = cands.slots[slot as usize] as usize;
            let excluded = req.exclude.contains(&member);
            let held_back = !excluded
                && slow_start_holds_back(sh.algorithm, &states[member], &spec.policy, req.now, rng);
            if excluded || held_back {
                let skip = |m| req.exclude.contains(&m);
                match sh.algo.next_after(cands, states, slot, context, &skip, recency) {
                    Some(other) => Some(other),
                    None if held_back => Some(member),
                    None => None,
                }
            } else {
                Some(member)
            }
        });
        let picked = picked.flatten();
        if let Some(m) = picked {
            sh.seq += 1;
            sh.last_pick[m] = sh.seq;
            sh.algo.picked(cands, m);
        }
        // A request the live algorithm placed nowhere is no decision to compare (and the
        // shadow, over the same candidates and exclusions, found none either).
        if let Some(live) = live {
            sh.tally.picked(live, picked, req.now);
        }
        picked
    }

    /// The shadow's report at `now` ([`crate::shadow`] says what each number means), or `None`
    /// without a shadow.
    pub fn shadow_report(&mut self, now: Instant) -> Option<crate::shadow::ShadowReport> {
        let live = self.spec.policy.algorithm;
        let sh = self.shadow.as_deref_mut()?;
        Some(sh.tally.report(now, sh.algorithm, live, &self.spec.members))
    }

    #[cold]
    #[inline(never)]
    pub(super) fn load_changed_shadowed(&mut self, member: usize) {
        self.algo.load_changed(&self.cands, &self.states, member);
        if let Some(sh) = self.shadow.as_deref_mut() {
            sh.algo.load_changed(&self.cands, &self.states, member);
        }
    }

    /// The shadow's side of a request's end on `member`.
    #[cold]
    #[inline(never)]
    pub(super) fn shadow_ended(&mut self, member: usize, now: Instant, outcome: Outcome) {
        if let Some(sh) = self.shadow.as_deref_mut() {
            sh.algo.load_changed(&self.cands, &self.states, member);
            sh.tally.ended(member, now, outcome);
        }
    }
}
