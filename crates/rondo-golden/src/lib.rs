//! Golden vectors: recorded scenarios (a cluster as configured, member states and loads, a
//! seed, a sequence of picks with their outcomes) that the core, the router's pick path, the
//! naming service's lookup and the client library all replay and must pick identically.
//!
//! Scenarios live in `testdata/golden/*.toml` at the repository root. Each has:
//!
//! ```toml
//! description = "what it exercises"
//! seed = 7                 # every point seeds its generator with this
//! group = "east"           # optional: the caller's locality group
//! config = """             # one cluster `c`, in the config file's schema
//! [cluster.c]
//! algorithm = "weighted"
//! members = [...]
//! """
//! expect = ["m1", "m2"]    # the recorded picks, one per [[pick]]
//!
//! [[setup]]                # applied in order before the picks, at time 0
//! member = "m2"
//! admin = "draining"       # optional: active | draining | disabled
//! healthy = false          # optional
//! in_flight = 3            # optional: requests begun and left open
//! sessions = 1             # optional
//! cpu_percent = 40.0       # optional agent report, with free_mib
//! free_mib = 512
//! probe_rtt_ms = 12        # optional: one probe round's result (response-time)
//! latencies_ms = [5, 9]    # optional: successful requests with these latencies
//!
//! [[pick]]
//! at_ms = 10               # time since the start
//! key = "user-1"           # optional: the request's hash key
//! latency_ms = 3           # outcome reported after the pick (default 1)
//! failed = false           # or a connect failure after latency_ms
//! hold = false             # true: the request stays in flight
//! tries = ["reset", "ok"]  # optional: a whole request through the failover engine, one
//!                          # outcome per try (ok, refused, reset, timeout, or a gRPC
//!                          # trailers-only answer `grpc:STATUS`, classified by the cluster's
//!                          # `grpc_failure_codes` and `retry.retry_on`); recorded as the
//!                          # members tried, `m1>m2`, backups as `b/m3`, and why it stopped
//!                          # when it did not succeed (`m1>m2!budget`)
//! method = "POST"          # optional, with `tries`: the request's method (default GET)
//! ```
//!
//! A scenario may name `backups = ["b"]`: further clusters of its config that requests with
//! `tries` fail over to after `c`, as a route's backups (only the router has backups; the client
//! library skips such scenarios).
//!
//! `RONDO_BLESS=1 cargo test -p rondo-golden --test points` rewrites each file's `expect` from
//! the core's replay (review the diff: a change is a behaviour change).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rondo_core::failover::{self, TryMaker, drive, is_idempotent_method};
use rondo_core::grpc::{Code, GrpcPolicy};
use rondo_core::load::AgentReport;
use rondo_core::{
    Actor, AdminState, Balancer, ClusterSpec, Failover, FailureKind, Instant, Outcome, PickRequest,
    SplitMix64, Stop, TryFailure,
};
use serde::Deserialize;

/// The cluster every scenario configures.
pub const CLUSTER: &str = "c";

/// One recorded scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What it exercises.
    pub description: String,
    /// The generator seed.
    pub seed: u64,
    /// The caller's locality group.
    #[serde(default)]
    pub group: Option<String>,
    /// The configuration (cluster `c`).
    pub config: String,
    /// State applied before the picks.
    #[serde(default)]
    pub setup: Vec<Setup>,
    /// The picks.
    pub pick: Vec<Pick>,
    /// The recorded member names, one per pick.
    #[serde(default)]
    pub expect: Vec<String>,
    /// Backup clusters of requests with `tries`, in order.
    #[serde(default)]
    pub backups: Vec<String>,
}

/// One member's state before the picks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// The member's name.
    pub member: String,
    /// Admin state.
    pub admin: Option<String>,
    /// Health.
    pub healthy: Option<bool>,
    /// Requests left open.
    #[serde(default)]
    pub in_flight: u32,
    /// Sessions opened.
    #[serde(default)]
    pub sessions: u32,
    /// Agent-reported CPU use, percent.
    pub cpu_percent: Option<f32>,
    /// Agent-reported free memory, MiB.
    pub free_mib: Option<u64>,
    /// One probe round trip, ms.
    pub probe_rtt_ms: Option<u64>,
    /// Completed requests' latencies, ms.
    #[serde(default)]
    pub latencies_ms: Vec<u64>,
}

/// One pick and what happens after it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pick {
    /// Time since the start, ms.
    #[serde(default)]
    pub at_ms: u64,
    /// The request's hash key.
    pub key: Option<String>,
    /// The outcome's latency, ms (default 1).
    pub latency_ms: Option<u64>,
    /// A connect failure instead of a success.
    #[serde(default)]
    pub failed: bool,
    /// Leave the request in flight.
    #[serde(default)]
    pub hold: bool,
    /// A whole request: one outcome per try, through the failover engine.
    #[serde(default)]
    pub tries: Vec<TryFate>,
    /// The request's method (with `tries`).
    pub method: Option<String>,
}

/// What a try's member does, in a request with `tries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum TryFate {
    /// Answers.
    Ok,
    /// Refuses the connection (nothing sent).
    Refused,
    /// Resets it after the request went out.
    Reset,
    /// Does not answer in time.
    Timeout,
    /// Answers a gRPC call trailers-only with this status (`grpc:unavailable`).
    Grpc(Code),
}

impl TryFrom<String> for TryFate {
    type Error = String;

    fn try_from(s: String) -> Result<TryFate, String> {
        Ok(match s.as_str() {
            "ok" => TryFate::Ok,
            "refused" => TryFate::Refused,
            "reset" => TryFate::Reset,
            "timeout" => TryFate::Timeout,
            _ => match s.strip_prefix("grpc:").and_then(Code::parse) {
                Some(code) => TryFate::Grpc(code),
                None => return Err(format!("unknown try fate `{s}`")),
            },
        })
    }
}

impl TryFate {
    /// The outcome the member's state records, and what the failover engine is told; a gRPC
    /// answer is classified by the cluster's policy `grpc`, as every point classifies it.
    pub fn outcome(self, latency: Duration, grpc: &GrpcPolicy) -> (Outcome, Option<TryFailure>) {
        match self {
            TryFate::Grpc(code) => {
                let declined = grpc.retries(code).then_some(TryFailure::DECLINED);
                (Outcome::of_grpc(code, grpc, latency), declined)
            }
            TryFate::Ok => (Outcome::Success { latency }, None),
            TryFate::Refused => (
                Outcome::Failure { kind: FailureKind::Connect, latency },
                Some(TryFailure::NOTHING_SENT),
            ),
            TryFate::Reset => (
                Outcome::Failure { kind: FailureKind::Reset, latency },
                Some(TryFailure::after_sending(true)),
            ),
            TryFate::Timeout => (
                Outcome::Failure { kind: FailureKind::Timeout, latency },
                Some(TryFailure::after_sending(true)),
            ),
        }
    }
}

/// A request with `tries` as a point sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// When it starts.
    pub now: Instant,
    /// Its hash key.
    pub key: Option<&'a str>,
    /// Whether its method is idempotent.
    pub idempotent: bool,
    /// Its tries' fates, in order (the request ends at the first `ok`).
    pub tries: &'a [TryFate],
    /// Each try's latency.
    pub latency: Duration,
    /// The cluster's gRPC policy, which classifies `grpc:` fates.
    pub grpc: GrpcPolicy,
}

/// One placed try, as [`Point::place`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On this member (`cluster` is its index: 0 for `c`, then the backups).
    Member { cluster: usize, name: String },
    /// The engine or the cluster refused it.
    Refused(Refusal),
}

/// Why a try was not placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The engine stopped the request.
    Stop(Stop),
    /// The cluster had no eligible member.
    NoEligible,
}

impl Pick {
    /// The outcome reported after the pick, or `None` when the request is held.
    pub fn outcome(&self) -> Option<Outcome> {
        if self.hold {
            return None;
        }
        let latency = Duration::from_millis(self.latency_ms.unwrap_or(1));
        Some(if self.failed {
            Outcome::Failure { kind: FailureKind::Connect, latency }
        } else {
            Outcome::Success { latency }
        })
    }
}

/// A balancing point under replay.
pub trait Point {
    /// Runs `f` on the point's balancer for cluster `c` (to apply the setup).
    fn with(&mut self, f: &mut dyn FnMut(&mut Balancer));
    /// Picks through the point's own path at `now`; the chosen member's name.
    fn pick(&mut self, now: Instant, key: Option<&str>) -> Result<String, String>;
    /// Reports `outcome` for a pick of `member` through the point's own path.
    fn end(&mut self, member: &str, outcome: Outcome);
    /// Places the next try of a request driven by `failover` (in cluster `failover.cluster()`)
    /// through the point's own path, with the request's hash key, at `now`.
    fn place(&mut self, failover: &mut Failover, now: Instant, key: Option<&str>) -> Placement;
    /// Reports `outcome` for a try placed on `member` of cluster index `cluster`.
    fn end_try(&mut self, cluster: usize, member: &str, now: Instant, outcome: Outcome);
    /// Runs a request with tries through the point's own failover loop, when it has one that
    /// can be driven (the router's request path); `None` leaves it to [`request`], which drives
    /// the core's engine over [`Point::place`] (the naming service's caller, the client).
    fn own_request(&mut self, _clusters: &[String], _r: Request<'_>) -> Option<String> {
        None
    }
}

/// A request's tries as the vectors record them: `m1>b/m2` (a backup cluster's members behind
/// its name), then `!why` when the engine stopped it.
pub fn render_tries(clusters: &[String], tried: &[(usize, String)], stop: Option<Stop>) -> String {
    let names: Vec<String> = tried
        .iter()
        .map(|(c, name)| if *c == 0 { name.clone() } else { format!("{}/{name}", clusters[*c]) })
        .collect();
    let Some(stop) = stop else { return names.join(">") };
    let why = match stop {
        Stop::Exhausted => "exhausted",
        Stop::NotRetryable => "not-retryable",
        Stop::Deadline => "deadline",
        Stop::Budget => "budget",
    };
    format!("{}!{why}", names.join(">"))
}

/// Runs one request with `tries` at `point` through the core's failover driver over `clusters`
/// clusters (`c`, then the backups); the members tried, `m1>b/m2`, and `!why` when it failed.
pub fn request(point: &mut dyn Point, clusters: &[String], r: Request<'_>) -> String {
    let mut f = Failover::new(clusters.len(), r.idempotent, r.now, Duration::from_secs(30));
    let mut scripted = Scripted { point, r, fates: r.tries.iter(), tried: Vec::new() };
    // The scripted tries are ready at once: one poll runs the request to its end.
    let ended = {
        let run = std::pin::pin!(drive(&mut scripted, &mut f, r.now));
        let waker = std::task::Waker::noop();
        match run.poll(&mut std::task::Context::from_waker(waker)) {
            std::task::Poll::Ready(ended) => ended,
            std::task::Poll::Pending => unreachable!("scripted tries never wait"),
        }
    };
    render_tries(clusters, &scripted.tried, ended.err())
}

/// A request's tries placed through a point and made by the scenario's fates.
struct Scripted<'p, 'r> {
    point: &'p mut dyn Point,
    r: Request<'r>,
    fates: std::slice::Iter<'r, TryFate>,
    /// The tries made, as (cluster index, member name).
    tried: Vec<(usize, String)>,
}

impl TryMaker for Scripted<'_, '_> {
    type Placed = (usize, String);
    type Held = ();
    type Tried = Option<TryFailure>;
    type Value = ();

    fn now(&mut self) -> Instant {
        self.r.now
    }

    fn place(
        &mut self,
        cluster: usize,
        f: &mut Failover,
        now: Instant,
    ) -> failover::Placement<(usize, String)> {
        match self.point.place(f, now, self.r.key) {
            Placement::Member { name, .. } => failover::Placement::Placed((cluster, name)),
            Placement::Refused(Refusal::NoEligible) => failover::Placement::NoEligible,
            Placement::Refused(Refusal::Stop(stop)) => failover::Placement::Stop(stop),
        }
    }

    fn hold(&mut self, _: &(usize, String)) {}

    fn attempt(
        &mut self,
        (cluster, name): (usize, String),
        _: &mut Failover,
    ) -> impl std::future::Future<Output = Option<TryFailure>> {
        let fate = self.fates.next().copied().unwrap_or(TryFate::Ok);
        let (outcome, failure) = fate.outcome(self.r.latency, &self.r.grpc);
        self.point.end_try(cluster, &name, self.r.now, outcome);
        self.tried.push((cluster, name));
        std::future::ready(failure)
    }

    fn judge(&mut self, _: (), failure: Option<TryFailure>) -> Result<(), TryFailure> {
        failure.map_or(Ok(()), Err)
    }
}

/// The scenarios in `testdata/golden`, by file, sorted.
pub fn load_all() -> Vec<(PathBuf, Scenario)> {
    let dir = dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read scenario");
            let s: Scenario =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, s)
        })
        .collect()
}

/// `testdata/golden` at the repository root.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden")
}

impl Scenario {
    /// The compiled configuration's view (id 1).
    pub fn view(&self, file: &Path) -> rondo_core::View {
        rondo_config::parse_str(&self.config, file, 1)
            .unwrap_or_else(|e| panic!("{}: config: {e}", file.display()))
            .view
    }

    /// Cluster `c` as compiled.
    pub fn cluster(&self, file: &Path) -> Arc<ClusterSpec> {
        self.view(file).clusters.get(CLUSTER).cloned().expect("scenario configures cluster `c`")
    }
}

/// Replays `s` on `point`, whose clock reads `base` at the start: applies the setup, then makes
/// every pick and reports its outcome; returns the picked names (`!error` for a failed pick).
pub fn replay(s: &Scenario, point: &mut dyn Point, base: Instant) -> Vec<String> {
    for st in &s.setup {
        apply(st, point, base);
    }
    let mut picked = Vec::new();
    let clusters: Vec<String> =
        std::iter::once(CLUSTER.to_owned()).chain(s.backups.iter().cloned()).collect();
    let grpc = s.cluster(Path::new("scenario")).policy.grpc;
    for p in &s.pick {
        let now = base + Duration::from_millis(p.at_ms);
        if !p.tries.is_empty() {
            let idempotent = p.method.as_deref().is_none_or(is_idempotent_method);
            let latency = Duration::from_millis(p.latency_ms.unwrap_or(1));
            let (key, tries) = (p.key.as_deref(), &p.tries[..]);
            let r = Request { now, key, idempotent, tries, latency, grpc };
            let own = point.own_request(&clusters, r);
            picked.push(own.unwrap_or_else(|| request(point, &clusters, r)));
            continue;
        }
        match point.pick(now, p.key.as_deref()) {
            Ok(name) => {
                if let Some(outcome) = p.outcome() {
                    point.end(&name, outcome);
                }
                picked.push(name);
            }
            Err(e) => picked.push(format!("!{e}")),
        }
    }
    picked
}

fn apply(st: &Setup, point: &mut dyn Point, base: Instant) {
    let mut f = |b: &mut Balancer| {
        let m = b.member_index(&st.member).unwrap_or_else(|| panic!("no member {}", st.member));
        if let Some(a) = &st.admin {
            let admin = AdminState::parse(a).unwrap_or_else(|| panic!("admin state {a}"));
            b.set_admin(m, admin, Actor::Operator("golden".into()));
        }
        if let Some(h) = st.healthy {
            b.set_health(m, h, Actor::HealthCheck, base);
        }
        for _ in 0..st.in_flight {
            b.begin_request(m);
        }
        for _ in 0..st.sessions {
            b.open_session(m);
        }
        if st.cpu_percent.is_some() || st.free_mib.is_some() {
            let report = AgentReport {
                cpu_used: st.cpu_percent.unwrap_or(0.0) / 100.0,
                mem_free: st.free_mib.unwrap_or(0) << 20,
                sessions: 0,
                seq: 1,
                at: base,
            };
            b.report_agent(m, report);
        }
        if let Some(rtt) = st.probe_rtt_ms {
            b.record_probe_round(&[(m, Some(Duration::from_millis(rtt)))]);
        }
        for &l in &st.latencies_ms {
            b.begin_request(m);
            b.end_request(m, base, Outcome::Success { latency: Duration::from_millis(l) });
        }
    };
    point.with(&mut f);
}

/// The reference point: the core's balancer alone, seeded with the scenario's seed (and one
/// per backup cluster, each seeded alike).
#[derive(Debug)]
pub struct Core {
    balancer: Balancer,
    rng: SplitMix64,
    backups: Vec<(Balancer, SplitMix64)>,
    group: Option<String>,
    now: Instant,
}

impl Core {
    /// The core's balancer for `s` at `base`.
    pub fn new(s: &Scenario, file: &Path, base: Instant) -> Core {
        let view = s.view(file);
        let backups = s
            .backups
            .iter()
            .map(|b| {
                let spec =
                    view.clusters.get(b).cloned().unwrap_or_else(|| panic!("no cluster {b}"));
                (Balancer::new(spec, base), SplitMix64::new(s.seed))
            })
            .collect();
        Core {
            balancer: Balancer::new(s.cluster(file), base),
            rng: SplitMix64::new(s.seed),
            backups,
            group: s.group.clone(),
            now: base,
        }
    }

    fn cluster(&mut self, i: usize) -> (&mut Balancer, &mut SplitMix64) {
        match i {
            0 => (&mut self.balancer, &mut self.rng),
            _ => {
                let (b, r) = &mut self.backups[i - 1];
                (b, r)
            }
        }
    }
}

impl Point for Core {
    fn with(&mut self, f: &mut dyn FnMut(&mut Balancer)) {
        f(&mut self.balancer);
    }

    fn pick(&mut self, now: Instant, key: Option<&str>) -> Result<String, String> {
        self.now = now;
        let req = PickRequest {
            now,
            group: self.group.as_deref(),
            hash: key.map(|k| rondo_core::hash::hash_key(k.as_bytes())),
            context: None,
            exclude: &[],
        };
        let d = self.balancer.pick(&req, &mut self.rng).map_err(|e| e.to_string())?;
        self.balancer.begin_request(d.member);
        Ok(self.balancer.spec().members[d.member].name.clone())
    }

    fn end(&mut self, member: &str, outcome: Outcome) {
        let m = self.balancer.member_index(member).expect("picked member");
        self.balancer.end_request(m, self.now, outcome);
    }

    fn place(&mut self, failover: &mut Failover, now: Instant, key: Option<&str>) -> Placement {
        let group = self.group.clone();
        let i = failover.cluster().expect("a cluster to place in");
        let (b, rng) = self.cluster(i);
        if let Err(stop) = failover.admit(b, now) {
            return Placement::Refused(Refusal::Stop(stop));
        }
        let req = PickRequest {
            now,
            group: group.as_deref(),
            hash: key.map(|k| rondo_core::hash::hash_key(k.as_bytes())),
            context: None,
            exclude: failover.tried(),
        };
        match b.pick(&req, rng) {
            Ok(d) => {
                b.begin_request(d.member);
                failover.began(d.member);
                Placement::Member { cluster: i, name: b.spec().members[d.member].name.clone() }
            }
            Err(_) => Placement::Refused(Refusal::NoEligible),
        }
    }

    fn end_try(&mut self, cluster: usize, member: &str, now: Instant, outcome: Outcome) {
        let (b, _) = self.cluster(cluster);
        let m = b.member_index(member).expect("placed member");
        b.end_request(m, now, outcome);
    }
}

/// Rewrites `file`'s `expect` with `picked` (keeping the rest of the file as written).
pub fn bless(file: &Path, picked: &[String]) {
    let text = std::fs::read_to_string(file).expect("read scenario");
    let mut doc: toml_edit::DocumentMut = text.parse().expect("scenario parses");
    let mut arr = toml_edit::Array::new();
    for p in picked {
        arr.push(p.as_str());
    }
    doc["expect"] = toml_edit::value(arr);
    std::fs::write(file, doc.to_string()).expect("write scenario");
}
