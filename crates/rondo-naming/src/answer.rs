//! Naming answers computed from the live snapshot: the same balancers, the same eligibility.

use rondo_core::balancer::health_reason;
use rondo_core::wire::{Answer, Lookup, Member, Source};
use rondo_core::{AdminState, Ineligible, PickError, PickRequest};
use rondo_runtime::{Snapshot, clock};

/// Why a service has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No cluster of that name in the view.
    #[error("unknown service `{service}` in view {view_id}")]
    UnknownService {
        /// The name asked for.
        service: String,
        /// The view looked in.
        view_id: u64,
    },
    /// The cluster exists but nothing may take work.
    #[error("{0}")]
    NoMember(#[from] PickError),
}

/// Every member of `service` that may take work now (up by health checks and agents; not
/// disabled; passively ejected members stay listed, since ejection is this router's own
/// observation of its traffic), with its admin state (`draining` members are listed so clients can
/// keep their sessions), in configuration order, with the policy and the view id.
pub fn answer(snapshot: &Snapshot, service: &str) -> Result<Answer, AnswerError> {
    let rt = snapshot.clusters.get(service).ok_or_else(|| AnswerError::UnknownService {
        service: service.to_owned(),
        view_id: snapshot.view.id,
    })?;
    let now = clock::now();
    let members = rt.with(|b| {
        let policy = &b.spec().policy;
        b.spec()
            .members
            .iter()
            .zip(b.states())
            // Health checks and agents speak for every caller; passive ejection is this
            // router's own observation of its own traffic (a client ejects on its own), so an
            // ejected member stays listed.
            // The core's health rules (rondo-core's candidates.rs), less passive ejection.
            .filter(|(_, s)| {
                s.admin != AdminState::Disabled
                    && matches!(health_reason(s, now, policy), None | Some(Ineligible::Ejected))
            })
            .map(|(m, s)| Member {
                name: m.name.clone(),
                address: m.address.clone(),
                weight: m.weight,
                group: m.group.clone(),
                state: s.admin,
                source: source(snapshot, service, &m.name),
            })
            .collect()
    });
    Ok(Answer {
        service: service.to_owned(),
        view_id: snapshot.view.id,
        policy: rt.spec.policy.clone(),
        members,
    })
}

/// What a lookup is for: the caller's locality group and hash key.
#[derive(Debug, Clone, Copy, Default)]
pub struct LookupFacts<'a> {
    /// The caller's locality group (default: this router's).
    pub group: Option<&'a str>,
    /// The request key for `hash` clusters.
    pub key: Option<&'a str>,
    /// Members the caller already tried for this call (by name): a retry's lookup picks among
    /// the others while any is eligible, as the router's next try does.
    pub exclude: &'a [&'a str],
}

/// One member of `service` chosen by its policy (per-lookup granularity): the same pick the
/// router makes for a request, without counting a request on the member (a lookup does not
/// know when the caller's calls end).
pub fn lookup(
    snapshot: &Snapshot,
    service: &str,
    facts: LookupFacts<'_>,
) -> Result<Lookup, AnswerError> {
    lookup_at(snapshot, service, facts, clock::now())
}

/// [`lookup`] at a given instant (replays of recorded scenarios).
pub fn lookup_at(
    snapshot: &Snapshot,
    service: &str,
    facts: LookupFacts<'_>,
    now: rondo_core::Instant,
) -> Result<Lookup, AnswerError> {
    let rt = snapshot.clusters.get(service).ok_or_else(|| AnswerError::UnknownService {
        service: service.to_owned(),
        view_id: snapshot.view.id,
    })?;
    let exclude: Vec<usize> = facts
        .exclude
        .iter()
        .filter_map(|name| rt.spec.members.iter().position(|m| m.name == *name))
        .collect();
    let req = PickRequest {
        now,
        group: facts.group,
        hash: facts.key.map(|k| rondo_core::hash::hash_key(k.as_bytes())),
        context: None,
        exclude: &exclude,
    };
    let d = rt.pick(&req)?;
    let (spec, admin) =
        rt.with(|b| (b.spec().members[d.member].clone(), b.states()[d.member].admin));
    let why = format!("{}: {}", d.algorithm, d.why);
    Ok(Lookup {
        service: service.to_owned(),
        view_id: snapshot.view.id,
        member: Member {
            source: source(snapshot, service, &spec.name),
            name: spec.name,
            address: spec.address,
            weight: spec.weight,
            group: spec.group,
            state: admin,
        },
        why,
    })
}

fn source(snapshot: &Snapshot, service: &str, member: &str) -> Source {
    if snapshot.is_registered(service, member) { Source::Registry } else { Source::Config }
}
