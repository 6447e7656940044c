//! What reaches a run's balancers besides requests: health-check rounds, load-agent reports,
//! and the phases that change members (a join or a leave rebuilds the cluster).

use std::time::Duration;

use rondo_core::load::AgentReport;
use rondo_core::{Actor, AdminState, Balancer, Entropy, Instant, ProbeFailure};

use super::{Mode, PROBE_NETWORK, Sim, cluster_spec};
use crate::scenario::PhaseKind;

impl Sim<'_> {
    /// A health-check round: each present member probed as the router's prober would, its
    /// health and round trip told to every router's balancer.
    pub(super) fn probe_round(&mut self) {
        let Some(h) = self.q.health else { return };
        let now = Instant(self.now);
        let mut round = Vec::new();
        for i in 0..self.members.len() {
            let Some(b) = self.to_bal[i] else { continue };
            let (u1, u2) = (self.probe_rng.unit(), self.probe_rng.unit());
            // A probe is a small request: the network round trip plus one service time at the
            // member's current speed (it does not wait in the member's queue).
            let result = match self.members[i].mode {
                Mode::FailFast => Err(ProbeFailure::Refused),
                Mode::FailSlow(_) => Err(ProbeFailure::Timeout),
                Mode::Normal(f) => {
                    let rtt = PROBE_NETWORK + (self.q.members[i].service.sample(u1, u2) * f) as u64;
                    if rtt > h.timeout { Err(ProbeFailure::Timeout) } else { Ok(rtt) }
                }
            };
            let r = &mut self.members[i];
            match result {
                Ok(rtt) => {
                    r.probe_pass += 1;
                    r.probe_fail = 0;
                    if !r.healthy && r.probe_pass >= h.rise {
                        r.healthy = true;
                        for bal in &mut self.balancers {
                            bal.set_health(b, true, Actor::HealthCheck, now);
                        }
                    }
                    round.push((b, Some(Duration::from_nanos(rtt))));
                }
                Err(why) => {
                    r.probe_fail += 1;
                    r.probe_pass = 0;
                    if r.healthy && r.probe_fail >= h.fall {
                        r.healthy = false;
                        for bal in &mut self.balancers {
                            bal.set_health(b, false, Actor::HealthCheck, now);
                        }
                    }
                    for bal in &mut self.balancers {
                        bal.note_probe_failure(b, why, now);
                    }
                    round.push((b, None));
                }
            }
        }
        for bal in &mut self.balancers {
            bal.record_probe_round(&round);
        }
    }

    /// Every present member's load agent reports its busy share since the last report.
    pub(super) fn agent_round(&mut self) {
        let Some(interval) = self.q.agent_interval else { return };
        self.agent_seq += 1;
        for i in 0..self.members.len() {
            let Some(b) = self.to_bal[i] else { continue };
            self.set_busy(i, 0);
            let r = &mut self.members[i];
            let servers = u128::from(self.q.members[i].concurrency);
            let cpu = (r.busy_acc as f64 / (interval as f64 * servers as f64)).clamp(0.0, 1.0);
            r.busy_acc = 0;
            let sessions = self.balancers.iter().map(|bal| bal.states()[b].load.sessions).sum();
            let report = AgentReport {
                cpu_used: cpu as f32,
                mem_free: 1 << 30,
                sessions,
                seq: self.agent_seq,
                at: Instant(self.now),
            };
            for bal in &mut self.balancers {
                bal.report_agent(b, report);
            }
        }
    }

    /// Phase `i` of the scenario happens to its member.
    pub(super) fn phase(&mut self, i: usize) {
        let p = self.q.phases[i];
        let m = p.member;
        match p.kind {
            PhaseKind::Slow(f) => self.members[m].mode = Mode::Normal(f),
            PhaseKind::FailFast => self.members[m].mode = Mode::FailFast,
            PhaseKind::FailSlow(t) => self.members[m].mode = Mode::FailSlow(t),
            PhaseKind::Recover => self.members[m].mode = Mode::Normal(1.0),
            PhaseKind::Drain => {
                self.members[m].draining = true;
                if let Some(b) = self.to_bal[m] {
                    for bal in &mut self.balancers {
                        bal.set_admin(b, AdminState::Draining, Actor::Operator("lab".into()));
                    }
                }
            }
            PhaseKind::Join => {
                if !self.members[m].present {
                    self.members[m].present = true;
                    self.rebuild();
                }
            }
            PhaseKind::Leave => {
                if self.members[m].present {
                    // The member is gone: what it held fails now.
                    let warmup = self.q.warmup;
                    let r = &mut self.members[m];
                    let lost: Vec<u64> =
                        r.queue.drain(..).map(|q| q.arrival).chain(r.serving.drain(..)).collect();
                    let hanging = u64::from(r.hanging);
                    r.hanging = 0;
                    r.present = false;
                    r.epoch += 1;
                    self.set_busy(m, -(self.members[m].busy as i32));
                    self.pending -= lost.len() as u64 + hanging;
                    self.res.errors +=
                        lost.iter().filter(|&&a| a >= warmup).count() as u64 + hanging;
                    self.rebuild();
                }
            }
        }
    }

    /// The cluster after a join or a leave: every balancer carries its state over, as a
    /// registry change does in the router.
    fn rebuild(&mut self) {
        let spec = cluster_spec(self.q, &self.members, &self.policy);
        for bal in &mut self.balancers {
            *bal = Balancer::carry_over(spec.clone(), bal, Instant(self.now));
        }
        if let Some(v) = &mut self.shared {
            v.reset();
        }
        self.remap();
    }
}
