//! The pure part of the client: a naming [`Answer`] turned into a core [`ClusterSpec`], and the
//! balancer held across answers (rebuilt with [`Balancer::carry_over`], so load, EWMA, sessions
//! and passive ejections of surviving members outlive every change). No I/O here: time is an
//! argument, like in the core.

use std::net::SocketAddr;
use std::sync::Arc;

use http::uri::Authority;
use rondo_core::wire::{Answer, Member};
use rondo_core::{
    Algorithm, Balancer, ClusterSpec, Ejection, Failover, Instant, MemberSpec, Outcome, PickError,
    PickRequest, SplitMix64, StickySession, UpstreamProtocol,
};

/// The core cluster an answer describes: the answer's policy and its members with their weight,
/// locality group and admin state (`active` or `draining`), in the answer's order.
///
/// The upstream protocol is left at its default: the client's transport (a hyper client, a
/// tonic channel, the caller's closure) decides how to talk to members.
pub fn cluster_spec(answer: &Answer) -> ClusterSpec {
    ClusterSpec {
        name: answer.service.clone(),
        members: answer.members.iter().map(member_spec).collect(),
        policy: answer.policy.clone(),
        upstream_protocol: UpstreamProtocol::default(),
        sticky: StickySession::default(),
        upstream_tls: None,
    }
}

fn member_spec(m: &Member) -> MemberSpec {
    MemberSpec {
        name: m.name.clone(),
        address: m.address.clone(),
        weight: m.weight.max(1),
        group: m.group.clone(),
        admin: m.state,
    }
}

/// A call's hash key as the core's `hash` algorithm takes it: the same stable hash the router
/// applies to a header or cookie value.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    rondo_core::hash::hash_key(key)
}

/// What a try needs of a member, built once per answer and shared without copying: its name and
/// address, the address parsed when it is a literal socket address (no resolution needed) and as
/// a URI authority (the tower layer's requests).
#[derive(Debug)]
pub(crate) struct MemberRef {
    pub(crate) name: Arc<str>,
    pub(crate) address: Arc<str>,
    /// The address as a socket address, when it is a literal one (`None`: a host name).
    pub(crate) addr: Option<SocketAddr>,
    /// The address as a URI authority, when it is a valid one.
    pub(crate) authority: Option<Authority>,
}

impl MemberRef {
    fn new(m: &MemberSpec) -> MemberRef {
        MemberRef {
            name: m.name.as_str().into(),
            address: m.address.as_str().into(),
            addr: m.address.parse().ok(),
            authority: Authority::try_from(m.address.as_str()).ok(),
        }
    }
}

/// The members of `b`'s cluster as tries take them, in the balancer's order.
fn member_refs(b: &Balancer) -> Vec<Arc<MemberRef>> {
    b.spec().members.iter().map(|m| Arc::new(MemberRef::new(m))).collect()
}

/// One service's balancing state: the latest answer, its balancer and the client's generator.
#[derive(Debug)]
pub(crate) struct State {
    /// The answer the balancer was built from.
    pub(crate) answer: Arc<Answer>,
    /// Members, run-time state, picker, retry budget.
    pub(crate) balancer: Balancer,
    /// The client's seeded generator (randomized pickers, `rotating`'s shuffle).
    pub(crate) rng: SplitMix64,
    /// Bumped by every applied answer: member indexes of an older epoch are looked up again by
    /// name.
    pub(crate) epoch: u64,
    /// Per member, in the balancer's order: what a try needs (see [`MemberRef`]).
    pub(crate) refs: Vec<Arc<MemberRef>>,
    /// Per member, in the balancer's order: the epoch since which it has been in every answer.
    joined: Vec<u64>,
}

impl State {
    /// The state for a first answer.
    pub(crate) fn new(answer: Answer, seed: u64, now: Instant) -> State {
        let balancer = Balancer::new(Arc::new(cluster_spec(&answer)), now);
        let refs = member_refs(&balancer);
        let joined = vec![0; refs.len()];
        let rng = SplitMix64::new(seed);
        State { answer: Arc::new(answer), balancer, rng, epoch: 0, refs, joined }
    }

    /// Takes a newer answer, carrying every surviving member's state over by name.
    pub(crate) fn apply(&mut self, answer: Answer, now: Instant) {
        let spec = Arc::new(cluster_spec(&answer));
        let epoch = self.epoch + 1;
        let joined = spec
            .members
            .iter()
            .map(|m| self.balancer.member_index(&m.name).map_or(epoch, |i| self.joined[i]))
            .collect();
        self.balancer = Balancer::carry_over(spec, &self.balancer, now);
        self.refs = member_refs(&self.balancer);
        self.joined = joined;
        self.answer = Arc::new(answer);
        self.epoch = epoch;
    }

    /// The core pick for one try of a call, the one every call path makes (and the golden
    /// vectors replay): the client's locality group, the call's hash key, the call's `rotating`
    /// context (a new one on the first try, kept for the failover tries so they go down the
    /// same list), members already tried excluded. Counts nothing.
    pub(crate) fn pick_member(
        &mut self,
        now: Instant,
        group: Option<&str>,
        hash: Option<u64>,
        context: &mut Option<u32>,
        exclude: &[usize],
    ) -> Result<usize, PickError> {
        if self.balancer.spec().policy.algorithm == Algorithm::Rotating && context.is_none() {
            *context = Some(self.balancer.new_context());
        }
        let req = PickRequest { now, group, hash, context: *context, exclude };
        Ok(self.balancer.pick(&req, &mut self.rng)?.member)
    }

    /// `member` (an index now) if it has been in every answer since `epoch`, so that what was
    /// counted on it then is still in its state.
    pub(crate) fn counted_since(&self, member: usize, epoch: u64) -> Option<usize> {
        (self.joined[member] <= epoch).then_some(member)
    }

    /// The index now of a member seen as `index` in `epoch` under `name`; `None` when it is
    /// gone, or left and came back since (a fresh state that the old request never counted on).
    pub(crate) fn resolve(&self, name: &str, index: usize, epoch: u64) -> Option<usize> {
        if epoch == self.epoch {
            return Some(index);
        }
        self.balancer.member_index(name).and_then(|i| self.counted_since(i, epoch))
    }

    /// Ends a request begun in `epoch` on the member `name` (index `index` then).
    pub(crate) fn end_request(
        &mut self,
        name: &str,
        index: usize,
        epoch: u64,
        now: Instant,
        outcome: Outcome,
    ) -> Option<Ejection> {
        let i = self.resolve(name, index, epoch)?;
        self.balancer.end_request(i, now, outcome)
    }
}

/// Why [`Replay::place`] placed no try.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayRefusal {
    /// The failover engine stopped the call.
    Stop(rondo_core::Stop),
    /// No eligible member.
    Pick(PickError),
}

/// The client's balancing state driven by hand, for the golden vectors that every balancing
/// point replays (`crates/rondo-golden`); applications use [`crate::Client`].
#[doc(hidden)]
#[derive(Debug)]
pub struct Replay {
    state: State,
    group: Option<String>,
}

impl Replay {
    /// The state a client builds from its first answer, with generator seed `seed`, in
    /// locality group `group`, at `now`.
    pub fn new(answer: Answer, seed: u64, group: Option<String>, now: Instant) -> Replay {
        Replay { state: State::new(answer, seed, now), group }
    }

    /// The balancer (to set member states before a replay).
    pub fn balancer(&mut self) -> &mut Balancer {
        &mut self.state.balancer
    }

    /// One call's first pick at `now` with hash key `key`, through the path every call takes;
    /// the request is begun on the member, whose name is returned.
    pub fn pick(&mut self, now: Instant, key: Option<&str>) -> Result<String, PickError> {
        let hash = key.map(|k| key_hash(k.as_bytes()));
        let mut context = None;
        let m = self.state.pick_member(now, self.group.as_deref(), hash, &mut context, &[])?;
        self.state.balancer.begin_request(m);
        Ok(self.state.balancer.spec().members[m].name.clone())
    }

    /// A try of a call driven by `failover`, at `now` with hash key `key`, as the call loop
    /// places it: the engine admits it (the retry budget) and the pick excludes the members
    /// already tried; the request is begun on the member, whose name is returned.
    pub fn place(
        &mut self,
        failover: &mut Failover,
        now: Instant,
        key: Option<&str>,
    ) -> Result<String, ReplayRefusal> {
        failover.admit(&mut self.state.balancer, now).map_err(ReplayRefusal::Stop)?;
        let hash = key.map(|k| key_hash(k.as_bytes()));
        let mut context = None;
        let group = self.group.as_deref();
        let m = self
            .state
            .pick_member(now, group, hash, &mut context, failover.tried())
            .map_err(ReplayRefusal::Pick)?;
        self.state.balancer.begin_request(m);
        failover.began(m);
        Ok(self.state.balancer.spec().members[m].name.clone())
    }

    /// Ends a request on `member` at `now`, as a call's end does.
    pub fn end(&mut self, member: &str, now: Instant, outcome: Outcome) {
        let index = self.state.balancer.member_index(member).unwrap_or(usize::MAX);
        let epoch = self.state.epoch;
        self.state.end_request(member, index, epoch, now, outcome);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rondo_core::wire::Source;
    use rondo_core::{AdminState, Algorithm, FailureKind, Granularity, PickRequest, Policy};

    use super::*;

    fn member(name: &str, port: u16, weight: u32, group: Option<&str>) -> Member {
        Member {
            name: name.into(),
            address: format!("127.0.0.1:{port}"),
            weight,
            group: group.map(Into::into),
            state: AdminState::Active,
            source: Source::Config,
        }
    }

    fn answer(view_id: u64, policy: Policy, members: Vec<Member>) -> Answer {
        Answer { service: "web".into(), view_id, policy, members }
    }

    #[test]
    fn an_answer_becomes_a_cluster_with_its_policy_and_members() {
        let mut policy = Policy {
            algorithm: Algorithm::P2cEwma,
            granularity: Granularity::Session,
            ..Policy::default()
        };
        policy.retry.attempts = 4;
        let mut drained = member("b", 2, 50, Some("eu"));
        drained.state = AdminState::Draining;
        let a = answer(9, policy.clone(), vec![member("a", 1, 100, None), drained]);
        let spec = cluster_spec(&a);
        assert_eq!(spec.name, "web");
        assert_eq!(spec.policy, policy);
        assert_eq!(
            spec.members,
            vec![
                MemberSpec {
                    name: "a".into(),
                    address: "127.0.0.1:1".into(),
                    weight: 100,
                    group: None,
                    admin: AdminState::Active,
                },
                MemberSpec {
                    name: "b".into(),
                    address: "127.0.0.1:2".into(),
                    weight: 50,
                    group: Some("eu".into()),
                    admin: AdminState::Draining,
                },
            ]
        );
    }

    #[test]
    fn a_zero_weight_on_the_wire_is_taken_as_one() {
        let a = answer(1, Policy::default(), vec![member("a", 1, 0, None)]);
        assert_eq!(cluster_spec(&a).members[0].weight, 1);
    }

    #[test]
    fn load_ewma_and_ejections_survive_a_new_answer() {
        let mut policy = Policy { algorithm: Algorithm::LeastSessions, ..Policy::default() };
        policy.outlier.consecutive_failures = 2;
        let first =
            answer(1, policy.clone(), vec![member("a", 1, 100, None), member("b", 2, 100, None)]);
        let t0 = Instant::from_millis(1_000);
        let mut st = State::new(first, 7, t0);
        // `a` gets two requests in flight; `b` fails twice and is ejected.
        st.balancer.begin_request(0);
        st.balancer.begin_request(0);
        st.balancer.begin_request(1);
        st.balancer.begin_request(1);
        let fail = Outcome::Failure { kind: FailureKind::Connect, latency: Duration::ZERO };
        assert!(st.end_request("b", 1, 0, t0, fail).is_none());
        let ejected = st.end_request("b", 1, 0, t0, fail).expect("b ejected");
        assert_eq!(ejected.member, 1);

        // A new answer puts `c` first and keeps `a` and `b` (in another order).
        let second = answer(
            2,
            policy,
            vec![member("c", 3, 100, None), member("b", 2, 100, None), member("a", 1, 100, None)],
        );
        let t1 = t0 + Duration::from_millis(10);
        st.apply(second, t1);
        assert_eq!(st.epoch, 1);
        assert_eq!(st.answer.view_id, 2);
        let a = st.balancer.member_index("a").expect("a");
        let b = st.balancer.member_index("b").expect("b");
        assert_eq!(st.balancer.states()[a].load.in_flight, 2, "a's load carried over");
        assert!(st.balancer.states()[b].ejected_until.is_some_and(|u| u > t1), "b still ejected");

        // A request begun before the swap ends on `a` by name, not by its old index (0 = `c`).
        let ok = Outcome::Success { latency: Duration::from_millis(3) };
        st.end_request("a", 0, 0, t1, ok);
        assert_eq!(st.balancer.states()[a].load.in_flight, 1);
        assert_eq!(st.balancer.states()[0].load.in_flight, 0, "c untouched");

        // Least-sessions now prefers `c` (idle, fresh) over `a` (one in flight); `b` is out.
        let mut rng = SplitMix64::new(1);
        let req = PickRequest { now: t1, ..PickRequest::default() };
        let d = st.balancer.pick(&req, &mut rng).expect("pick");
        assert_eq!(st.balancer.spec().members[d.member].name, "c");
    }

    #[test]
    fn a_member_gone_from_the_answer_ends_nothing() {
        let first = answer(
            1,
            Policy::default(),
            vec![member("a", 1, 100, None), member("b", 2, 100, None)],
        );
        let mut st = State::new(first, 7, Instant::ZERO);
        st.balancer.begin_request(1);
        st.apply(answer(2, Policy::default(), vec![member("a", 1, 100, None)]), Instant::ZERO);
        let ok = Outcome::Success { latency: Duration::ZERO };
        assert!(st.end_request("b", 1, 0, Instant::ZERO, ok).is_none());
        assert_eq!(st.balancer.states()[0].load.in_flight, 0);
    }

    // Regression: a request begun on a member that then left the answers and came back ended
    // on the returned member's fresh state, undercounting its load.
    #[test]
    fn a_request_from_before_a_member_left_does_not_end_on_its_return() {
        let policy = Policy { algorithm: Algorithm::LeastSessions, ..Policy::default() };
        let both = vec![member("a", 1, 100, None), member("b", 2, 100, None)];
        let mut st = State::new(answer(1, policy.clone(), both.clone()), 1, Instant::ZERO);
        let b = st.balancer.member_index("b").unwrap();
        st.balancer.begin_request(b);
        let old_epoch = st.epoch;
        st.apply(answer(2, policy.clone(), vec![member("a", 1, 100, None)]), Instant::ZERO);
        st.apply(answer(3, policy, both), Instant::ZERO);
        let b = st.balancer.member_index("b").unwrap();
        st.balancer.begin_request(b);
        let latency = Duration::from_millis(1);
        st.end_request("b", 1, old_epoch, Instant::ZERO, Outcome::Success { latency });
        assert_eq!(st.balancer.states()[b].load.in_flight, 1, "the new request is still counted");
    }
}
