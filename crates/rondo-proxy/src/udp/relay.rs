//! A flow's relay task: the member's answers, read from the flow's connected socket, sent to
//! the flow's client from the listener's socket, until the flow is idle for the listener's
//! `idle_timeout` (or [`super::DRAIN_IDLE`] once the listener stopped), its member refuses a
//! datagram, or it is evicted. However it ends, [`Ending`] gives the flow's in-flight count back
//! to its member with the outcome: a failure when refused, a success (latency: to the first
//! answer) when the member answered, cancelled otherwise (UDP cannot tell a member that never
//! answers from a client that wants no answer).
//!
//! Answers are read into a buffer per worker thread, not per flow: an idle flow holds its socket
//! and its task, never a 64 KiB buffer.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rondo_core::{FailureKind, Outcome};
use tokio::sync::OwnedSemaphorePermit;

use super::flows::Flow;
use super::{MAX_DATAGRAM, Shared};

thread_local! {
    static BUF: RefCell<Vec<u8>> = RefCell::new(vec![0u8; MAX_DATAGRAM]);
}

/// What became of one read of the flow's socket.
enum Read {
    /// An answer sent on to the client.
    Sent,
    /// An answer the listener's socket could not take at once: sent after a wait.
    Queued(Vec<u8>),
    /// Nothing more to read now.
    Empty,
    /// The member refused a datagram (ICMP port unreachable).
    Refused,
    /// An answer dropped (the send to the client failed), or a read error.
    Dropped,
}

/// A flow's end, whenever its task ends: taken out of the table, its in-flight count given
/// back, its permit freed. Built before the task starts, so an aborted task that never ran ends
/// its flow too.
pub(super) struct Ending {
    shared: Arc<Shared>,
    flow: Arc<Flow>,
    started: Instant,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Ending {
    pub fn new(shared: Arc<Shared>, flow: Arc<Flow>, permit: Option<OwnedSemaphorePermit>) -> Self {
        Ending { shared, flow, started: Instant::now(), _permit: permit }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        let f = &self.flow;
        self.shared.table().remove(&f.key, f.id);
        f.metrics.flows.dec();
        let outcome = if f.refused.load(Ordering::Relaxed) {
            f.metrics.member_errors.inc();
            Outcome::Failure { kind: FailureKind::Connect, latency: self.started.elapsed() }
        } else {
            match f.first_answer_us.load(Ordering::Relaxed) {
                0 => Outcome::Cancelled,
                us => Outcome::Success { latency: Duration::from_micros(us) },
            }
        };
        f.rt.end_request(f.member, outcome);
    }
}

/// Ends `flow` now: its member refused a datagram.
pub(super) fn fail(shared: &Shared, flow: &Flow) {
    flow.refused.store(true, Ordering::Relaxed);
    shared.table().remove(&flow.key, flow.id);
    stop(flow);
}

/// Ends `flow`'s task (its [`Ending`] runs where the task is dropped).
pub(super) fn stop(flow: &Flow) {
    if let Some(t) = flow.task.get() {
        t.abort();
    }
}

/// The relay task of `ending`'s flow.
pub(super) async fn run(ending: Ending) {
    let (shared, flow) = (ending.shared.clone(), ending.flow.clone());
    let mut idle = shared.spec.idle_timeout;
    let mut stopped = shared.stopped.clone();
    let sleep = tokio::time::sleep(idle);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            r = flow.socket.readable() => {
                if r.is_err() {
                    return;
                }
                if !relay(&shared, &flow, ending.started).await {
                    return;
                }
            }
            () = &mut sleep => {
                // The timer is set once per idle period and checked when it fires: a datagram
                // costs a relaxed store, not a timer reset.
                let quiet = Duration::from_millis(shared.now_ms().saturating_sub(flow.last()));
                if quiet >= idle {
                    return;
                }
                sleep.as_mut().reset(tokio::time::Instant::now() + (idle - quiet));
            }
            r = stopped.changed(), if idle > super::DRAIN_IDLE => {
                // The listener stopped: answers still pass, until a short quiet.
                let _ = r;
                idle = super::DRAIN_IDLE;
                sleep.as_mut().reset(tokio::time::Instant::now() + idle);
            }
        }
    }
}

/// Passes every answer waiting on the flow's socket to its client; `false`: the flow ends (its
/// member refused a datagram).
async fn relay(shared: &Shared, flow: &Flow, started: Instant) -> bool {
    // Bounded: other flows get the thread between batches.
    for _ in 0..64 {
        let read = BUF.with(|b| {
            let mut b = b.borrow_mut();
            match flow.socket.try_recv(&mut b) {
                Ok(n) => match shared.socket.try_send_to(&b[..n], flow.key.client) {
                    Ok(_) => Read::Sent,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        Read::Queued(b[..n].to_vec())
                    }
                    Err(_) => Read::Dropped,
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Read::Empty,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Read::Refused,
                Err(_) => Read::Dropped,
            }
        });
        let sent = match read {
            Read::Sent => true,
            Read::Queued(answer) => shared.socket.send_to(&answer, flow.key.client).await.is_ok(),
            Read::Empty => return true,
            Read::Refused => {
                flow.refused.store(true, Ordering::Relaxed);
                return false;
            }
            Read::Dropped => false,
        };
        if !sent {
            flow.metrics.dropped.inc();
            continue;
        }
        flow.touch(shared.now_ms());
        flow.metrics.datagrams_out.inc();
        if flow.first_answer_us.load(Ordering::Relaxed) == 0 {
            let us = started.elapsed().as_micros().clamp(1, u128::from(u64::MAX)) as u64;
            flow.first_answer_us.store(us, Ordering::Relaxed);
        }
    }
    true
}
