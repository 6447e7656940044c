//! One try's member: [`Inner::pick`] takes the retry budget, picks a member (a session's while
//! it can keep it) and begins a request on it, all in one hold of the state's lock, as the
//! router's failover engine asks; the [`Ticket`] it gives is that request, ended in the core
//! with its outcome when the ticket is dropped. [`Plan`] is what the pick needs of a call.

use std::sync::Arc;

use rondo_core::{Algorithm, Failover, Granularity, Outcome};

use crate::clock;
use crate::inner::{Inner, SessionCell};
use crate::state::MemberRef;

/// How the call loop treats one call.
pub(crate) struct Plan {
    pub(crate) idempotent: bool,
    pub(crate) hash: Option<u64>,
    /// The session the call belongs to (`None`: the client's own when the granularity asks).
    pub(crate) session: Option<Arc<SessionCell>>,
}

/// Why no try could start.
pub(crate) enum Refused {
    Budget,
    Pick(rondo_core::PickError),
}

impl Inner {
    /// Takes the budget, picks a member (the session's while it can keep it) and begins a
    /// request on it, all under one lock hold.
    pub(crate) fn pick(
        self: &Arc<Self>,
        plan: &Plan,
        tried: &[Arc<str>],
        failover: &mut Failover,
        context: &mut Option<u32>,
        started: std::time::Instant,
    ) -> Result<Ticket, Refused> {
        let now = clock::from_std(started);
        let mut guard = self.lock();
        let st = &mut *guard;
        let b = &mut st.balancer;
        // The retry budget in the same lock hold as the pick (the engine's one rule for it).
        failover.admit(b, now).map_err(|_| Refused::Budget)?;
        let exclude: Vec<usize> = tried.iter().filter_map(|n| b.member_index(n)).collect();
        let policy = &b.spec().policy;
        let sessions = policy.granularity != Granularity::Request;
        let rotating = policy.algorithm == Algorithm::Rotating;
        let session = plan.session.as_deref().map(|c| &c.state).or(sessions.then_some(&self.own));
        let mut session = session.map(|s| s.lock().unwrap_or_else(|e| e.into_inner()));
        let member = 'pick: {
            if let Some(s) = session.as_deref_mut() {
                if rotating && s.context.is_none() {
                    s.context = Some(b.new_context());
                }
                *context = s.context;
                if let Some(i) = s.member.as_deref().and_then(|n| b.member_index(n))
                    && !exclude.contains(&i)
                    && b.can_keep_session(i, now)
                {
                    if st.counted_since(i, s.opened).is_none() {
                        // The member left the answers and came back: its fresh state does not
                        // count this session yet.
                        st.balancer.open_session(i);
                        s.opened = st.epoch;
                    }
                    break 'pick i;
                }
            }
            let picked = st.pick_member(now, self.group.as_deref(), plan.hash, context, &exclude);
            let member = picked.map_err(Refused::Pick)?;
            if let Some(s) = session.as_deref_mut() {
                let old = s.member.as_deref().and_then(|n| st.balancer.member_index(n));
                if old != Some(member) {
                    if let Some(o) = old.and_then(|o| st.counted_since(o, s.opened)) {
                        st.balancer.close_session(o);
                    }
                    st.balancer.open_session(member);
                    s.member = Some(st.balancer.spec().members[member].name.clone());
                    s.opened = st.epoch;
                }
            }
            member
        };
        st.balancer.begin_request(member);
        failover.began(member);
        let ticket = Ticket {
            inner: self.clone(),
            member: st.refs[member].clone(),
            index: member,
            epoch: st.epoch,
            started,
            ended: None,
            outcome: None,
        };
        Ok(ticket)
    }

    /// Ends a request begun on a member (found by name if the answer changed since), at `ended`
    /// (now when `None`).
    fn end_request(
        &self,
        name: &str,
        index: usize,
        epoch: u64,
        ended: Option<std::time::Instant>,
        outcome: Outcome,
    ) {
        let now = ended.map_or_else(clock::now, clock::from_std);
        if let Some(e) = self.lock().end_request(name, index, epoch, now, outcome) {
            tracing::info!(service = %self.service, member = %name, count = e.count, "member ejected");
        }
    }
}

/// A request begun on a member; ends it with its outcome when dropped (cancelled when no
/// outcome was recorded: the caller went away).
#[derive(Debug)]
pub(crate) struct Ticket {
    inner: Arc<Inner>,
    member: Arc<MemberRef>,
    index: usize,
    epoch: u64,
    started: std::time::Instant,
    /// When the outcome was recorded: the request ends in the core at that time (one clock
    /// reading for both); `None` ends it when the ticket is dropped.
    ended: Option<std::time::Instant>,
    outcome: Option<Outcome>,
}

impl Ticket {
    /// Records success with the latency so far.
    pub(crate) fn succeeded(&mut self) {
        let now = clock::instant();
        self.ended = Some(now);
        self.outcome =
            Some(Outcome::Success { latency: now.saturating_duration_since(self.started) });
    }

    /// Records a failure with the latency so far.
    pub(crate) fn failed(&mut self, kind: rondo_core::FailureKind) {
        let now = clock::instant();
        self.ended = Some(now);
        let latency = now.saturating_duration_since(self.started);
        self.outcome = Some(Outcome::Failure { kind, latency });
    }

    /// Keeps the outcome recorded but ends the request in the core only when the ticket is
    /// dropped, at that time (the tower layer: the request lasts as long as the response body).
    pub(crate) fn end_when_dropped(&mut self) {
        self.ended = None;
    }

    /// Records that the member had no part in the try's end (it never received the request):
    /// the request ends in the core as cancelled, when the ticket is dropped.
    pub(crate) fn not_charged(&mut self) {
        self.ended = None;
        self.outcome = Some(Outcome::Cancelled);
    }

    /// Ends the request now with `outcome`.
    pub(crate) fn end(mut self, outcome: Outcome) {
        self.ended = None;
        self.outcome = Some(outcome);
    }

    /// The member's name.
    pub(crate) fn member(&self) -> &str {
        &self.member.name
    }

    /// The member.
    pub(crate) fn member_ref(&self) -> &Arc<MemberRef> {
        &self.member
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or(Outcome::Cancelled);
        self.inner.end_request(&self.member.name, self.index, self.epoch, self.ended, outcome);
    }
}
