//! A cluster's `max_connections` and `max_pending` ([`Gate`]): one count of the connections
//! open to its members, whichever pool opened them (the cluster's own, its TLS one, a client's
//! for `proxy_protocol`), and of the requests waiting for one while the count is at the cap.
//!
//! A connection holds a [`Permit`] for its whole life; a connector that finds none free fails at
//! once with [`AtCapacity`], and the request's side waits ([`Gate::wait`]) for a connection to
//! close or to come back idle to its pool, then asks its pool again. The wait is the request's,
//! not the connector's: hyper-util keeps a connect running after the request took an idle
//! connection instead, and such a connect must not hold a place among the waiting requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rondo_core::ConnectionCap;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// One cluster's connection count and waiting requests.
#[derive(Debug)]
pub struct Gate {
    cap: ConnectionCap,
    open: Arc<Semaphore>,
    pending: AtomicU32,
    /// Raised when a connection closes.
    freed: Notify,
}

/// A connection's place under its cluster's `max_connections`, given back when it closes.
#[derive(Debug)]
pub struct Permit {
    _held: OwnedSemaphorePermit,
    gate: Arc<Gate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The semaphore's permit is returned after this body: a waiter woken now finds it once
        // it asks its pool again (a miss waits only until its next look).
        self.gate.freed.notify_waiters();
    }
}

/// A new connection was refused: the cluster has `max_connections` open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtCapacity;

impl std::fmt::Display for AtCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the cluster is at its max_connections")
    }
}

impl std::error::Error for AtCapacity {}

/// A request's place among those waiting for a connection; given back when dropped.
#[derive(Debug)]
pub struct Waiting<'a>(&'a Gate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Gate {
    /// A gate for `cap`, with nothing open.
    pub fn new(cap: ConnectionCap) -> Arc<Gate> {
        let open = Arc::new(Semaphore::new(cap.connections as usize));
        Arc::new(Gate { cap, open, pending: AtomicU32::new(0), freed: Notify::new() })
    }

    /// The limits this gate was made with.
    pub fn cap(&self) -> ConnectionCap {
        self.cap
    }

    /// A place for a new connection, or [`AtCapacity`].
    pub fn try_open(self: &Arc<Self>) -> Result<Permit, AtCapacity> {
        let held = self.open.clone().try_acquire_owned().map_err(|_| AtCapacity)?;
        Ok(Permit { _held: held, gate: self.clone() })
    }

    /// Connections open now.
    pub fn open(&self) -> u32 {
        self.cap.connections.saturating_sub(self.open.available_permits() as u32)
    }

    /// Requests waiting now.
    pub fn pending(&self) -> u32 {
        self.pending.load(Ordering::Relaxed)
    }

    /// A place among the waiting requests; `None` when `max_pending` are waiting already.
    pub fn wait(&self) -> Option<Waiting<'_>> {
        let max = self.cap.pending;
        let taken = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1));
        taken.ok().map(|_| Waiting(self))
    }

    /// Resolves when a connection closes (or at a spurious wake: the caller looks again).
    pub async fn freed(&self) {
        self.freed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_and_waiting_requests_are_capped() {
        let gate = Gate::new(ConnectionCap { connections: 2, pending: 1 });
        let a = gate.try_open().expect("first");
        let _b = gate.try_open().expect("second");
        assert_eq!(gate.try_open().err(), Some(AtCapacity));
        assert_eq!(gate.open(), 2);
        let waiting = gate.wait().expect("one may wait");
        assert!(gate.wait().is_none(), "max_pending 1");
        drop(waiting);
        assert!(gate.wait().is_some());
        drop(a);
        assert_eq!(gate.open(), 1);
        assert!(gate.try_open().is_ok());
    }
}
