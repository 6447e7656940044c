//! [`Inner`]: what every clone of a [`crate::Client`], its calls, its sessions and its
//! background task share: the service's balancing state ([`State`]) under one lock, the view
//! id held and the wake-up for a refetch, the naming endpoints, and the sessions' pins
//! ([`SessionState`], [`SessionCell`]). It takes new answers and drops session pins; the call
//! path's pick and end of a request are in `call/pick.rs`, the background task in `watch.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rondo_core::Algorithm;
use rondo_core::wire::Answer;
use tokio::sync::{Notify, watch};

use crate::clock;
use crate::naming::NamingClient;
use crate::state::State;

/// Shared by every clone of a client and its background task.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) service: String,
    /// Whether the policy held is `hash` (read without the lock by the tower layer, which
    /// looks for a key only then); set with every answer, under the state's lock.
    pub(crate) hash_policy: AtomicBool,
    pub(crate) group: Option<String>,
    pub(crate) state: Mutex<State>,
    /// The view id of the answer held.
    pub(crate) view: watch::Sender<u64>,
    /// The newest view id seen in a response, when newer than the one held (0: none).
    pub(crate) wanted: AtomicU64,
    /// Wakes the background task to refetch.
    pub(crate) wake: Notify,
    /// Index of the endpoint in use.
    pub(crate) endpoint: AtomicU64,
    pub(crate) naming: Vec<NamingClient>,
    pub(crate) call_timeout: Duration,
    /// The client's own session when the policy's granularity is `session` or `lookup`.
    pub(crate) own: Mutex<SessionState>,
}

/// A session's pinned member and `rotating` context.
#[derive(Debug, Default)]
pub(crate) struct SessionState {
    pub(crate) context: Option<u32>,
    pub(crate) member: Option<String>,
    /// The answer epoch in which the session was counted on its member.
    pub(crate) opened: u64,
}

/// The shared part of a session: closes the member's session count when the last holder goes.
#[derive(Debug)]
pub(crate) struct SessionCell {
    pub(crate) inner: Arc<Inner>,
    pub(crate) state: Mutex<SessionState>,
}

impl Drop for SessionCell {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        self.inner.close_session(state);
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`crate::Client::observe_view_id`].
    pub(crate) fn observe_view_id(&self, view_id: u64) {
        if view_id > *self.view.borrow() {
            self.wanted.fetch_max(view_id, Ordering::Relaxed);
            self.wake.notify_one();
        }
    }

    /// Drops a session's pin.
    fn close_session(&self, s: &mut SessionState) {
        if let Some(name) = s.member.take() {
            let mut st = self.lock();
            let counted =
                st.balancer.member_index(&name).and_then(|i| st.counted_since(i, s.opened));
            if let Some(i) = counted {
                st.balancer.close_session(i);
            }
        }
    }

    /// Takes a new answer.
    pub(crate) fn apply(&self, answer: Answer) {
        let id = answer.view_id;
        let members = answer.members.len();
        let hash = answer.policy.algorithm == Algorithm::Hash;
        {
            let mut st = self.lock();
            st.apply(answer, clock::now());
            self.hash_policy.store(hash, Ordering::Relaxed);
        }
        self.view.send_replace(id);
        tracing::debug!(service = %self.service, view_id = id, members, "answer applied");
    }
}
