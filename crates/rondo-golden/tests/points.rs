//! Every golden vector replayed at every balancing point: the core alone (the reference that
//! records `expect`), the router's request path (`http::place`, the function each try of a
//! request runs, and `http::forward`, the router's failover loop, driven through
//! `rondo_proxy::replay` on a live view compiled from the scenario's config with a route to its
//! cluster and backups), and the naming service's lookup
//! (`answer::lookup_at` on the same kind of live view), and the client library (its call path's
//! pick, on a balancer built from the naming service's full answer for the scenario's config,
//! sent through JSON as on the wire).
//!
//! Requests with several tries (`tries = [...]`) go through the core's failover engine at each
//! point: the router runs them through its own failover loop (`forward`, the scenario's fates
//! in place of members), the client library with the engine's admission and its `State::pick_member`
//! (what `Inner::pick` runs under its lock), the naming service with lookups that exclude the
//! members already tried (`?exclude=`, the caller's failover engine admitting each try against
//! the cluster's retry budget). The naming service and the client library answer for one
//! service, so scenarios with backup clusters are the router's alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use rondo_core::{Balancer, Failover, HashKeySource, Instant, Outcome, Route};
use rondo_golden::{
    CLUSTER, Core, Placement, Point, Refusal, Request, Scenario, TryFate, bless, load_all,
    render_tries, replay,
};
use rondo_naming::answer::{LookupFacts, lookup_at};
use rondo_proxy::error::Kind;
use rondo_proxy::replay::Replayer;
use rondo_runtime::{ClusterRt, Live, Refused, clock};

/// The reference replay's clock at the start.
const BASE: Instant = Instant(1_000_000_000_000);

#[test]
fn the_vectors_are_recorded_and_the_core_replays_them() {
    let bless_mode = std::env::var_os("RONDO_BLESS").is_some();
    let all = load_all();
    assert!(all.len() >= 10, "scenarios in {}", rondo_golden::dir().display());
    for (file, s) in &all {
        let picked = replay(s, &mut Core::new(s, file, BASE), BASE);
        if bless_mode {
            bless(file, &picked);
            continue;
        }
        assert_eq!(s.expect.len(), s.pick.len(), "{}: one expect per pick", file.display());
        assert_eq!(picked, s.expect, "{}: {}", file.display(), s.description);
        assert!(!picked.iter().any(|p| p.starts_with('!')), "{}: a pick failed", file.display());
    }
}

/// A live view of the scenario, as `rondo serve` builds it, with cluster `c`'s generator
/// seeded; the clock reading just after.
fn live(s: &Scenario, file: &Path) -> (Arc<Live>, Arc<ClusterRt>, Instant) {
    let live = Arc::new(Live::new(s.view(file), s.group.clone()));
    let rt = live.load().clusters[CLUSTER].clone();
    rt.reseed(s.seed);
    (live, rt, clock::now())
}

/// Outcomes reach the balancer at the scenario's time (the runtime would stamp them with the
/// wall clock, which a replay cannot repeat).
fn end_at(rt: &ClusterRt, now: Instant, member: &str, outcome: Outcome) {
    rt.with(|b| {
        let m = b.member_index(member).expect("picked member");
        b.end_request(m, now, outcome);
    });
}

/// The router's request path: single picks through `http::place` (the function each try of
/// a request runs: sessions, hash keys read from the request's header fields, the cluster's
/// placement under the request's failover engine), and requests with several tries through
/// the router's own failover loop, `http::forward`, with the member replaced by the scenario's
/// fates (`rondo_proxy::replay`).
struct RouterPoint {
    replayer: Replayer,
    runtime: tokio::runtime::Runtime,
    /// The scenario's route: cluster `c`, then its backups.
    route: Route,
    /// Cluster `c`, then the scenario's backups (seeded like `c`).
    clusters: Vec<Arc<ClusterRt>>,
    now: Instant,
}

impl RouterPoint {
    /// The request's header fields: the hash key where the cluster's policy reads it.
    fn headers(&self, key: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        let Some(key) = key else { return h };
        match &self.clusters[0].spec.policy.hash.key {
            HashKeySource::Header(name) => {
                h.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), key.parse().unwrap());
            }
            HashKeySource::Cookie(name) => {
                h.insert(http::header::COOKIE, format!("{name}={key}").parse().unwrap());
            }
            HashKeySource::ClientAddress => panic!("a scenario key needs a header or cookie key"),
        }
        h
    }
}

impl Point for RouterPoint {
    fn with(&mut self, f: &mut dyn FnMut(&mut Balancer)) {
        self.clusters[0].with(|b| f(b));
    }

    fn pick(&mut self, now: Instant, key: Option<&str>) -> Result<String, String> {
        self.now = now;
        // A request's first try on this cluster, as the request path places it.
        let mut failover = Failover::new(1, true, now, Duration::from_secs(30));
        let rt = &self.clusters[0];
        let placed = self.replayer.place(rt, &mut failover, &self.headers(key), now);
        let member = placed.map_err(|e| match e {
            Refused::NoEligible(e) => e.to_string(),
            Refused::Stop(stop) => format!("{stop:?}"),
        })?;
        Ok(rt.spec.members[member].name.clone())
    }

    fn end(&mut self, member: &str, outcome: Outcome) {
        end_at(&self.clusters[0], self.now, member, outcome);
    }

    fn place(&mut self, failover: &mut Failover, now: Instant, key: Option<&str>) -> Placement {
        let i = failover.cluster().expect("a cluster to place in");
        let rt = &self.clusters[i];
        match self.replayer.place(rt, failover, &self.headers(key), now) {
            Ok(m) => Placement::Member { cluster: i, name: rt.spec.members[m].name.clone() },
            Err(Refused::Stop(stop)) => Placement::Refused(Refusal::Stop(stop)),
            Err(Refused::NoEligible(_)) => Placement::Refused(Refusal::NoEligible),
        }
    }

    fn end_try(&mut self, cluster: usize, member: &str, now: Instant, outcome: Outcome) {
        end_at(&self.clusters[cluster], now, member, outcome);
    }

    fn own_request(&mut self, clusters: &[String], r: Request<'_>) -> Option<String> {
        let mut fates = r.tries.iter();
        let mut script = |_: &Arc<ClusterRt>, _: usize| {
            let fate = fates.next().copied().unwrap_or(TryFate::Ok);
            let (outcome, failure) = fate.outcome(r.latency, &r.grpc);
            let kind = match fate {
                TryFate::Ok => None,
                TryFate::Refused => Some(Kind::Connect),
                TryFate::Reset => Some(Kind::Reset),
                TryFate::Timeout => Some(Kind::Timeout),
                // As `hyper_path::grpc` judges a trailers-only answer.
                TryFate::Grpc(code) => r.grpc.retries(code).then_some(Kind::Declined),
            };
            assert_eq!(kind.is_some(), failure.is_some());
            (outcome, kind)
        };
        let request = self.replayer.request(
            &self.route,
            r.idempotent,
            self.headers(r.key),
            r.now,
            &mut script,
        );
        let done = self.runtime.block_on(request);
        let tried: Vec<(usize, String)> = done
            .tries
            .into_iter()
            .map(|(c, m)| (clusters.iter().position(|n| *n == c).expect("a scenario cluster"), m))
            .collect();
        Some(render_tries(clusters, &tried, done.stop))
    }
}

struct NamingPoint {
    live: Arc<Live>,
    rt: Arc<ClusterRt>,
    group: Option<String>,
    now: Instant,
}

impl Point for NamingPoint {
    fn with(&mut self, f: &mut dyn FnMut(&mut Balancer)) {
        self.rt.with(|b| f(b));
    }

    fn pick(&mut self, now: Instant, key: Option<&str>) -> Result<String, String> {
        self.now = now;
        let facts = LookupFacts { group: self.group.as_deref(), key, exclude: &[] };
        let l = lookup_at(&self.live.load(), CLUSTER, facts, now).map_err(|e| e.to_string())?;
        // A lookup counts nothing by itself; the caller's call is counted as the router counts
        // its requests, so that load-based scenarios see the same load at every point.
        self.rt.with(|b| b.begin_request(b.member_index(&l.member.name).expect("member")));
        Ok(l.member.name)
    }

    fn end(&mut self, member: &str, outcome: Outcome) {
        end_at(&self.rt, self.now, member, outcome);
    }

    fn place(&mut self, failover: &mut Failover, now: Instant, key: Option<&str>) -> Placement {
        // A caller retrying over lookups: its failover engine admits the try against the
        // cluster's retry budget (the balancer the naming service shares with the router), and
        // the lookup excludes the members it already tried.
        if let Err(stop) = self.rt.with(|b| failover.admit(b, now)) {
            return Placement::Refused(Refusal::Stop(stop));
        }
        let tried: Vec<&str> =
            failover.tried().iter().map(|&m| self.rt.spec.members[m].name.as_str()).collect();
        let facts = LookupFacts { group: self.group.as_deref(), key, exclude: &tried };
        match lookup_at(&self.live.load(), CLUSTER, facts, now) {
            Ok(l) => {
                let m = self.rt.spec.members.iter().position(|m| m.name == l.member.name);
                let m = m.expect("the member is in the view");
                self.rt.with(|b| b.begin_request(m));
                failover.began(m);
                Placement::Member { cluster: 0, name: l.member.name }
            }
            Err(_) => Placement::Refused(Refusal::NoEligible),
        }
    }

    fn end_try(&mut self, _: usize, member: &str, now: Instant, outcome: Outcome) {
        end_at(&self.rt, now, member, outcome);
    }
}

#[test]
fn the_router_request_path_replays_every_vector() {
    for (file, s) in &load_all() {
        // The scenario's clusters behind one listener and one route (`c`, then the backups),
        // as `rondo serve` builds them.
        let backups: Vec<String> = s.backups.iter().map(|b| format!("\"{b}\"")).collect();
        let text = format!(
            "{}\n[[listener]]\nname = \"golden\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nname = \"golden\"\nlistener = \"golden\"\ncluster = \"{CLUSTER}\"\n\
             backups = [{}]\nrequest_timeout_ms = 30000\n",
            s.config,
            backups.join(", ")
        );
        let config = rondo_config::parse_str(&text, file, 1)
            .unwrap_or_else(|e| panic!("{}: config: {e}", file.display()));
        let live = Arc::new(Live::new(config.view.clone(), s.group.clone()));
        let snapshot = live.load();
        let clusters: Vec<Arc<ClusterRt>> = std::iter::once(CLUSTER)
            .chain(s.backups.iter().map(String::as_str))
            .map(|c| {
                let rt = snapshot.clusters[c].clone();
                rt.reseed(s.seed);
                rt
            })
            .collect();
        let base = clock::now();
        let route = config.view.routes[0].clone();
        let replayer = Replayer::new(config.listeners[0].clone(), live);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut point = RouterPoint { replayer, runtime, route, clusters, now: base };
        assert_eq!(replay(s, &mut point, base), s.expect, "{}: {}", file.display(), s.description);
    }
}

#[test]
fn the_naming_lookup_replays_every_vector() {
    // A caller's retries are lookups that exclude the members it tried; the naming service
    // answers for one service, so scenarios with backup clusters are the router's.
    for (file, s) in load_all().iter().filter(|(_, s)| s.backups.is_empty()) {
        let (live, rt, base) = live(s, file);
        let mut point = NamingPoint { live, rt, group: s.group.clone(), now: base };
        assert_eq!(replay(s, &mut point, base), s.expect, "{}: {}", file.display(), s.description);
    }
}

struct ClientPoint {
    replay: rondo_client::Replay,
    now: Instant,
}

impl Point for ClientPoint {
    fn with(&mut self, f: &mut dyn FnMut(&mut Balancer)) {
        f(self.replay.balancer());
    }

    fn pick(&mut self, now: Instant, key: Option<&str>) -> Result<String, String> {
        self.now = now;
        self.replay.pick(now, key).map_err(|e| e.to_string())
    }

    fn end(&mut self, member: &str, outcome: Outcome) {
        self.replay.end(member, self.now, outcome);
    }

    fn place(&mut self, failover: &mut Failover, now: Instant, key: Option<&str>) -> Placement {
        match self.replay.place(failover, now, key) {
            Ok(name) => Placement::Member { cluster: 0, name },
            Err(rondo_client::ReplayRefusal::Stop(stop)) => Placement::Refused(Refusal::Stop(stop)),
            Err(rondo_client::ReplayRefusal::Pick(_)) => Placement::Refused(Refusal::NoEligible),
        }
    }

    fn end_try(&mut self, _: usize, member: &str, now: Instant, outcome: Outcome) {
        self.replay.end(member, now, outcome);
    }
}

#[test]
fn the_client_library_replays_every_vector_from_the_naming_answer() {
    // The client library calls one service: scenarios with backup clusters are the router's.
    for (file, s) in load_all().iter().filter(|(_, s)| s.backups.is_empty()) {
        // The naming service's full answer for the scenario's config, through JSON.
        let live = Live::new(s.view(file), None);
        let answer = rondo_naming::answer::answer(&live.load(), CLUSTER).expect("an answer");
        let json = serde_json::to_string(&answer).expect("serialises");
        let answer: rondo_core::wire::Answer = serde_json::from_str(&json).expect("parses");
        let client = rondo_client::Replay::new(answer, s.seed, s.group.clone(), BASE);
        let mut point = ClientPoint { replay: client, now: BASE };
        assert_eq!(replay(s, &mut point, BASE), s.expect, "{}: {}", file.display(), s.description);
    }
}
