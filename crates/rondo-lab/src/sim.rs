//! The discrete-event simulation of one queueing scenario, once per picker, in virtual time.
//!
//! Each member is a FIFO queue in front of `concurrency` servers. Requests arrive (Poisson,
//! bursts, a flash crowd), are placed by the picker under test exactly as the router places
//! them (`pick` with `PickRequest { now, group, hash, .. }`, `note_request`, `begin_request`,
//! `end_request` with the outcome and the latency the client saw), and health-check rounds and
//! agent reports reach the core through `set_health` / `record_probe_round` / `report_agent`
//! as the router's prober and agent listener would. Phases change members at set times; joins
//! and leaves rebuild the cluster spec and carry the balancer's state over with
//! `Balancer::carry_over`, as a registry change does in the router.
//!
//! With `routers = N` the tier has N balancers, one per router, and arrivals take the routers
//! in turn; each balancer is fed only by the requests its router placed (its own in-flight
//! counts and latencies, no shared view), while health-check and agent results, which every
//! router would see alike, reach all of them. With `shared_view_ms` the routers also share
//! their load (`shared_view.rs`), one period late, as `[tier]` does.
//!
//! Every picker sees the same arrivals and the same per-request random numbers (common random
//! numbers), so differences between rows come from the picks. A run is bounded by virtual time
//! (arrivals stop at `duration_s`; work in flight is followed for at most another `duration_s`)
//! and by `max_events`.

mod rounds;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rondo_core::{
    AdminState, Balancer, ClusterSpec, Entropy, FailureKind, HealthCheck, HealthCheckKind, Instant,
    MemberSpec, Outcome, PickRequest, Policy, SplitMix64, UpstreamProtocol,
};

use crate::scenario::{Picker, Queueing, Scenario};

/// Width of the time buckets that per-member load and reaction times are measured in, ns.
pub const BUCKET: u64 = 20_000_000;
/// At most this many bucket cells (buckets x members) are kept; past it, none are.
pub const MAX_BUCKET_CELLS: u64 = 20_000_000;
/// Above this many members no per-bucket load is kept (plots would be unreadable anyway).
pub const MAX_BUCKETED_MEMBERS: usize = 64;
/// A refused connection is seen after this long, ns.
const REFUSED_AFTER: u64 = 1_000_000;
/// Network part of a probe's round trip, ns.
const PROBE_NETWORK: u64 = 200_000;
/// Spreads the routers' generator seeds apart (the golden ratio in 64 bits).
const ROUTER_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// What one picker did over the scenario.
#[derive(Debug, Clone)]
pub struct PickerResult {
    /// The picker.
    pub picker: Picker,
    /// Latencies of successful requests that arrived after the warm-up, ns, sorted.
    pub latencies: Vec<u64>,
    /// Requests that arrived after the warm-up and failed (member failure, leave, or no
    /// eligible member).
    pub errors: u64,
    /// Requests that arrived after the warm-up and were still unfinished when the run ended
    /// (their age at the end is in `latencies` as a lower bound).
    pub unfinished: u64,
    /// `unfinished` per member: which members' queues the picker overloaded.
    pub unfinished_by_member: Vec<u64>,
    /// Requests that arrived after the warm-up.
    pub requests: u64,
    /// Picks per member over the whole run.
    pub picks: Vec<u64>,
    /// Picks per member per [`BUCKET`] (empty above [`MAX_BUCKETED_MEMBERS`] members).
    pub buckets: Vec<Vec<u32>>,
    /// Events processed.
    pub events: u64,
    /// The run hit `max_events` before its end.
    pub stopped_early: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrival,
    Burst,
    /// A request finished service at `member` (ignored if the member's epoch moved on).
    Done {
        member: u32,
        epoch: u32,
        arrival: u64,
        router: u16,
    },
    /// A request to a failing member failed.
    Fail {
        member: u32,
        epoch: u32,
        arrival: u64,
        timeout: bool,
        router: u16,
    },
    Probe,
    Agent,
    Phase(u32),
    /// The tier's shared view publishes (`shared_view_ms`).
    Publish,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Normal(f64),
    FailFast,
    FailSlow(u64),
}

#[derive(Debug, Clone, Copy)]
struct Req {
    arrival: u64,
    /// The router that placed it (whose balancer hears its end).
    router: u16,
    u1: f64,
    u2: f64,
}

#[derive(Debug)]
struct MemberRun {
    present: bool,
    draining: bool,
    mode: Mode,
    epoch: u32,
    busy: u32,
    /// Requests hanging on or refused by a failing member, not yet failed.
    hanging: u32,
    queue: VecDeque<Req>,
    /// Arrival times of requests in service (to fail them if the member leaves).
    serving: Vec<u64>,
    /// Busy-server time accumulated since the last agent report, ns x servers.
    busy_acc: u128,
    busy_since: u64,
    probe_pass: u32,
    probe_fail: u32,
    healthy: bool,
}

/// Latencies kept per picker once its run is over: longer sorted lists are thinned to this many
/// evenly spaced ranks (quantiles move by at most 1 / this many), so memory across pickers
/// stays bounded whatever the scenario's length.
pub const KEPT_LATENCIES: usize = 200_000;

/// Runs every picker of `q` and returns one result each, in the scenario's order.
pub fn run_all(
    scenario: &Scenario,
    q: &Queueing,
    progress: &mut dyn FnMut(f64),
) -> Vec<PickerResult> {
    let n = q.pickers.len() as f64;
    q.pickers
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let mut r = run_one(q, p, scenario.seed, &mut |f| progress((i as f64 + f) / n));
            r.latencies = thin(std::mem::take(&mut r.latencies), KEPT_LATENCIES);
            r
        })
        .collect()
}

/// At most `keep` values of a sorted list at evenly spaced ranks, always keeping the maximum.
pub fn thin(sorted: Vec<u64>, keep: usize) -> Vec<u64> {
    let len = sorted.len();
    if len <= keep || keep < 2 {
        return sorted;
    }
    (0..keep).map(|k| sorted[((k as u128 + 1) * len as u128 / keep as u128) as usize - 1]).collect()
}

struct Sim<'a> {
    q: &'a Queueing,
    picker: Picker,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    members: Vec<MemberRun>,
    /// Balancer index of each simulated member (None when absent).
    to_bal: Vec<Option<usize>>,
    /// Simulated member of each balancer index.
    from_bal: Vec<usize>,
    /// One balancer per router of the tier, each fed only by the requests it placed.
    balancers: Vec<Balancer>,
    policy: Policy,
    work_rng: SplitMix64,
    burst_rng: SplitMix64,
    /// Each router's generator (router 0's is the single router's, so a tier of one picks as
    /// before); the oracle draws from router 0's.
    pick_rngs: Vec<SplitMix64>,
    probe_rng: SplitMix64,
    /// Each router's sticky sessions.
    sessions: Vec<Vec<Option<usize>>>,
    /// The router the next arrival reaches (arrivals take the routers in turn).
    next_router: u16,
    agent_seq: u64,
    pending: u64,
    res: PickerResult,
    /// The tier's shared load view, with `shared_view_ms`.
    shared: Option<crate::shared_view::SharedView>,
}

/// Runs one picker over the scenario with the given seed.
pub fn run_one(
    q: &Queueing,
    picker: Picker,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> PickerResult {
    let mut sim = Sim::new(q, picker, seed);
    sim.schedule_start();
    sim.run(progress);
    sim.finish();
    progress(1.0);
    sim.res.latencies.sort_unstable();
    sim.res
}

/// The cluster's policy for `picker` under `q`: its algorithm (the oracle keeps a balancer
/// with `round-robin`), `q`'s health checks, and session granularity with sessions.
fn policy(q: &Queueing, picker: Picker) -> Policy {
    let algorithm = match picker {
        Picker::Core(a) => a,
        // The oracle does not use the balancer, but one is kept so the code path stays the same.
        Picker::Oracle => rondo_core::Algorithm::RoundRobin,
    };
    let mut policy = Policy { algorithm, ..Policy::default() };
    if let Some(h) = q.health {
        policy.health = Some(HealthCheck {
            kind: HealthCheckKind::Tcp,
            interval: Duration::from_nanos(h.interval),
            timeout: Duration::from_nanos(h.timeout),
            rise: h.rise,
            fall: h.fall,
            port: None,
        });
    }
    if q.sessions.is_some() {
        policy.granularity = rondo_core::Granularity::Session;
    }
    policy
}

impl MemberRun {
    /// A member at the start of a run, idle and healthy.
    fn new(present: bool) -> Self {
        MemberRun {
            present,
            draining: false,
            mode: Mode::Normal(1.0),
            epoch: 0,
            busy: 0,
            hanging: 0,
            queue: VecDeque::new(),
            serving: Vec::new(),
            busy_acc: 0,
            busy_since: 0,
            probe_pass: 0,
            probe_fail: 0,
            healthy: true,
        }
    }
}

impl PickerResult {
    /// Nothing counted yet; per-bucket picks kept when `q` is small enough.
    fn empty(q: &Queueing, picker: Picker) -> Self {
        let bucketed = q.members.len() <= MAX_BUCKETED_MEMBERS
            && (q.duration / BUCKET + 1) * q.members.len() as u64 <= MAX_BUCKET_CELLS;
        PickerResult {
            picker,
            latencies: Vec::new(),
            errors: 0,
            unfinished: 0,
            unfinished_by_member: vec![0; q.members.len()],
            requests: 0,
            picks: vec![0; q.members.len()],
            buckets: if bucketed {
                vec![vec![0; q.members.len()]; (q.duration / BUCKET + 1) as usize]
            } else {
                Vec::new()
            },
            events: 0,
            stopped_early: false,
        }
    }
}

impl<'a> Sim<'a> {
    /// A run of `picker` over `q` at time zero, one balancer per router, nothing scheduled.
    fn new(q: &'a Queueing, picker: Picker, seed: u64) -> Self {
        let policy = policy(q, picker);
        let members: Vec<MemberRun> =
            q.members.iter().map(|m| MemberRun::new(m.initially_present)).collect();
        let spec = cluster_spec(q, &members, &policy);
        let mut sim = Sim {
            q,
            picker,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            to_bal: Vec::new(),
            from_bal: Vec::new(),
            balancers: (0..q.routers).map(|_| Balancer::new(spec.clone(), Instant::ZERO)).collect(),
            members,
            policy,
            // Independent streams, the same for every picker.
            work_rng: SplitMix64::new(seed ^ 0x5EED_0000_0000_0001),
            burst_rng: SplitMix64::new(seed ^ 0x5EED_0000_0000_0002),
            pick_rngs: (0..u64::from(q.routers))
                .map(|r| {
                    SplitMix64::new(seed ^ 0x5EED_0000_0000_0003 ^ r.wrapping_mul(ROUTER_SEED))
                })
                .collect(),
            probe_rng: SplitMix64::new(seed ^ 0x5EED_0000_0000_0004),
            sessions: vec![vec![None; q.sessions.unwrap_or(0) as usize]; q.routers as usize],
            next_router: 0,
            agent_seq: 0,
            pending: 0,
            shared: q.shared_view.map(|_| crate::shared_view::SharedView::default()),
            res: PickerResult::empty(q, picker),
        };
        sim.remap();
        sim
    }

    /// The first of each recurring event: an arrival, a burst, a probe round, an agent
    /// report, a shared-view publication, and every phase.
    fn schedule_start(&mut self) {
        let q = self.q;
        let first = self.next_arrival(0);
        self.push(first, Ev::Arrival);
        if let Some((_, every)) = q.arrivals.burst {
            self.push(every, Ev::Burst);
        }
        if let Some(h) = q.health {
            self.push(h.interval, Ev::Probe);
        }
        if let Some(a) = q.agent_interval {
            self.push(a, Ev::Agent);
        }
        if let Some(p) = q.shared_view {
            self.push(p, Ev::Publish);
        }
        for (i, p) in q.phases.iter().enumerate() {
            self.push(p.at, Ev::Phase(i as u32));
        }
    }

    /// Handles events in time order until the arrivals stopped and the work in flight ended
    /// (or another `duration_s` passed), or `max_events`.
    fn run(&mut self, progress: &mut dyn FnMut(f64)) {
        let q = self.q;
        let horizon = q.duration.saturating_mul(2);
        while let Some(Reverse((t, _, ev))) = self.heap.pop() {
            if self.res.events >= q.max_events {
                self.res.stopped_early = true;
                break;
            }
            // After the arrivals stop, only work in flight is followed.
            if t > q.duration && (self.pending == 0 || t > horizon) {
                break;
            }
            self.now = t;
            self.res.events += 1;
            if self.res.events.is_multiple_of(65_536) {
                progress((t as f64 / q.duration as f64).min(1.0));
            }
            self.handle(ev);
        }
    }
}

fn cluster_spec(q: &Queueing, members: &[MemberRun], policy: &Policy) -> Arc<ClusterSpec> {
    let specs = q
        .members
        .iter()
        .zip(members)
        .filter(|(_, r)| r.present)
        .map(|(m, _)| MemberSpec {
            name: m.name.clone(),
            address: format!("{}.lab:80", m.name),
            weight: m.weight,
            group: m.group.clone(),
            admin: AdminState::Active,
        })
        .collect();
    Arc::new(ClusterSpec {
        name: "lab".to_owned(),
        members: specs,
        policy: policy.clone(),
        upstream_protocol: UpstreamProtocol::Http1,
        sticky: Default::default(),
        upstream_tls: None,
    })
}

impl Sim<'_> {
    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    fn remap(&mut self) {
        self.to_bal = vec![None; self.members.len()];
        self.from_bal.clear();
        for (i, m) in self.members.iter().enumerate() {
            if m.present {
                self.to_bal[i] = Some(self.from_bal.len());
                self.from_bal.push(i);
            }
        }
    }

    fn rate_at(&self, t: u64) -> (f64, u64) {
        let a = self.q.arrivals;
        match a.flash {
            Some((at, len, mult)) if t >= at && t < at + len => (a.rate * mult, at + len),
            Some((at, _, _)) if t < at => (a.rate, at),
            _ => (a.rate, u64::MAX),
        }
    }

    /// The next Poisson arrival after `t` under a piecewise-constant rate (memoryless: a draw
    /// that crosses a rate change restarts at the change).
    fn next_arrival(&mut self, mut t: u64) -> u64 {
        loop {
            let (rate, boundary) = self.rate_at(t);
            let gap = -(1.0 - self.work_rng.unit()).ln() / rate * 1e9;
            let next = t.saturating_add(gap.max(1.0) as u64);
            if next < boundary {
                return next;
            }
            t = boundary;
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrival => {
                let rng_req = self.draw_request(false);
                self.arrive(rng_req);
                let next = self.next_arrival(self.now);
                if next <= self.q.duration {
                    self.push(next, Ev::Arrival);
                }
            }
            Ev::Burst => {
                let (size, every) = self.q.arrivals.burst.unwrap_or((0, u64::MAX));
                for _ in 0..size {
                    let r = self.draw_request(true);
                    self.arrive(r);
                }
                let next = self.now.saturating_add(every);
                if next <= self.q.duration {
                    self.push(next, Ev::Burst);
                }
            }
            Ev::Done { member, epoch, arrival, router } => {
                let m = member as usize;
                if self.members[m].epoch != epoch {
                    return;
                }
                self.set_busy(m, -1);
                if let Some(p) = self.members[m].serving.iter().position(|&a| a == arrival) {
                    self.members[m].serving.swap_remove(p);
                }
                self.pending -= 1;
                let latency = self.now - arrival;
                if arrival >= self.q.warmup {
                    self.res.latencies.push(latency);
                }
                if let (Picker::Core(_), Some(b)) = (self.picker, self.to_bal[m]) {
                    let outcome = Outcome::Success { latency: Duration::from_nanos(latency) };
                    self.balancers[usize::from(router)].end_request(b, Instant(self.now), outcome);
                }
                if let Some(next) = self.members[m].queue.pop_front() {
                    self.start(m, next);
                }
            }
            Ev::Fail { member, epoch, arrival, timeout, router } => {
                let m = member as usize;
                if self.members[m].epoch != epoch {
                    return;
                }
                self.members[m].hanging -= 1;
                self.pending -= 1;
                if arrival >= self.q.warmup {
                    self.res.errors += 1;
                }
                if let (Picker::Core(_), Some(b)) = (self.picker, self.to_bal[m]) {
                    let kind = if timeout { FailureKind::Timeout } else { FailureKind::Connect };
                    let latency = Duration::from_nanos(self.now - arrival);
                    self.balancers[usize::from(router)].end_request(
                        b,
                        Instant(self.now),
                        Outcome::Failure { kind, latency },
                    );
                }
            }
            Ev::Probe => {
                self.probe_round();
                if let Some(h) = self.q.health
                    && self.now + h.interval <= self.q.duration
                {
                    self.push(self.now + h.interval, Ev::Probe);
                }
            }
            Ev::Agent => {
                self.agent_round();
                if let Some(a) = self.q.agent_interval
                    && self.now + a <= self.q.duration
                {
                    self.push(self.now + a, Ev::Agent);
                }
            }
            Ev::Phase(i) => self.phase(i as usize),
            Ev::Publish => {
                if let Some(v) = &mut self.shared {
                    v.tick(&mut self.balancers);
                }
                if let Some(p) = self.q.shared_view
                    && self.now + p <= self.q.duration
                {
                    self.push(self.now + p, Ev::Publish);
                }
            }
        }
    }

    fn draw_request(&mut self, burst: bool) -> (Req, u64, u64) {
        let rng = if burst { &mut self.burst_rng } else { &mut self.work_rng };
        let u1 = rng.unit();
        let u2 = rng.unit();
        let key =
            self.q.keys.map_or(0, |k| ((u128::from(rng.next_u64()) * u128::from(k)) >> 64) as u64);
        let session = self
            .q
            .sessions
            .map_or(0, |s| ((u128::from(rng.next_u64()) * u128::from(s)) >> 64) as u64);
        let router = self.next_router;
        self.next_router = (router + 1) % self.q.routers as u16;
        (Req { arrival: self.now, router, u1, u2 }, key, session)
    }

    fn set_busy(&mut self, m: usize, delta: i32) {
        let now = self.now;
        let r = &mut self.members[m];
        r.busy_acc += u128::from(r.busy) * u128::from(now - r.busy_since);
        r.busy_since = now;
        r.busy = r.busy.saturating_add_signed(delta);
    }

    fn arrive(&mut self, (req, key, session): (Req, u64, u64)) {
        let counted = req.arrival >= self.q.warmup;
        if counted {
            self.res.requests += 1;
        }
        let chosen = match self.picker {
            Picker::Oracle => self.oracle_pick(),
            Picker::Core(_) => self.core_pick(usize::from(req.router), key, session),
        };
        let Some(m) = chosen else {
            if counted {
                self.res.errors += 1;
            }
            return;
        };
        self.res.picks[m] += 1;
        let bucket = (self.now / BUCKET) as usize;
        if let Some(b) = self.res.buckets.get_mut(bucket) {
            b[m] += 1;
        }
        if let (Picker::Core(_), Some(b)) = (self.picker, self.to_bal[m]) {
            self.balancers[usize::from(req.router)].begin_request(b);
        }
        self.pending += 1;
        let epoch = self.members[m].epoch;
        match self.members[m].mode {
            Mode::FailFast => {
                self.members[m].hanging += 1;
                let ev = Ev::Fail {
                    member: m as u32,
                    epoch,
                    arrival: req.arrival,
                    timeout: false,
                    router: req.router,
                };
                self.push(self.now + REFUSED_AFTER, ev);
            }
            Mode::FailSlow(t) => {
                self.members[m].hanging += 1;
                let ev = Ev::Fail {
                    member: m as u32,
                    epoch,
                    arrival: req.arrival,
                    timeout: true,
                    router: req.router,
                };
                self.push(self.now + t, ev);
            }
            Mode::Normal(_) => {
                if self.members[m].busy < self.q.members[m].concurrency {
                    self.start(m, req);
                } else {
                    self.members[m].queue.push_back(req);
                }
            }
        }
    }

    fn start(&mut self, m: usize, req: Req) {
        let factor = match self.members[m].mode {
            Mode::Normal(f) => f,
            _ => 1.0,
        };
        let service = self.q.members[m].service.sample(req.u1, req.u2) * factor;
        self.set_busy(m, 1);
        self.members[m].serving.push(req.arrival);
        let epoch = self.members[m].epoch;
        let ev = Ev::Done { member: m as u32, epoch, arrival: req.arrival, router: req.router };
        self.push(self.now + (service.max(1.0) as u64), ev);
    }

    fn core_pick(&mut self, router: usize, key: u64, session: u64) -> Option<usize> {
        let now = Instant(self.now);
        let balancer = &mut self.balancers[router];
        let sessions = &mut self.sessions[router];
        if self.q.sessions.is_some()
            && let Some(m) = sessions[session as usize]
        {
            if let Some(b) = self.to_bal[m]
                && balancer.can_keep_session(b, now)
            {
                balancer.note_request(now);
                return Some(m);
            }
            if let Some(b) = self.to_bal[m] {
                balancer.close_session(b);
            }
            sessions[session as usize] = None;
        }
        let hash = self.q.keys.map(|_| rondo_core::hash::hash_key(&key.to_le_bytes()));
        let req = PickRequest {
            now,
            group: self.q.caller_group.as_deref(),
            hash,
            context: None,
            exclude: &[],
        };
        balancer.note_request(now);
        let d = balancer.pick(&req, &mut self.pick_rngs[router]).ok()?;
        let m = self.from_bal[d.member];
        if self.q.sessions.is_some() {
            sessions[session as usize] = Some(m);
            balancer.open_session(d.member);
        }
        Some(m)
    }

    /// Shortest expected delay with the true service times: the member where a new request
    /// would finish soonest on average, `(in system + 1) x true mean / servers`, among members
    /// that are present, not draining and not failing. Ties go to the first from a random start.
    fn oracle_pick(&mut self) -> Option<usize> {
        let n = self.members.len();
        let start = self.pick_rngs[0].below(n);
        let mut best: Option<(f64, usize)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let r = &self.members[i];
            let Mode::Normal(factor) = r.mode else { continue };
            if !r.present || r.draining {
                continue;
            }
            let spec = &self.q.members[i];
            let in_system = f64::from(r.busy) + r.queue.len() as f64;
            let cost =
                (in_system + 1.0) * spec.service.mean() * factor / f64::from(spec.concurrency);
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Requests still in flight when the run ends count with their age as a lower bound.
    fn finish(&mut self) {
        let warmup = self.q.warmup;
        let now = self.now;
        for (m, r) in self.members.iter().enumerate() {
            for a in r.queue.iter().map(|q| q.arrival).chain(r.serving.iter().copied()) {
                if a >= warmup {
                    self.res.unfinished += 1;
                    self.res.unfinished_by_member[m] += 1;
                    self.res.latencies.push(now.saturating_sub(a));
                }
            }
        }
    }
}
