//! The process-wide drain: once started (by `SIGTERM` or by a hitless upgrade's hand-off), every
//! server of the process stops taking new work gracefully. The router's HTTP/1 connections
//! close between requests and say `Connection: close` on the response in progress, its HTTP/2
//! connections get GOAWAY, the admin and naming APIs stop accepting and finish what they serve.
//! Whoever serves connections asks [`Drain::is_on`] at the points it could close, and waits on
//! [`Drain::started`] where it idles.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Once the process drains, how long an idle connection may still send a request (it is served,
/// told the connection closes) before it is closed. Closing an idle keep-alive connection, or
/// one just accepted, at the very moment the drain begins would race a client that is sending
/// on it just then; a client idle this long is in the ordinary keep-alive race that clients
/// handle.
pub const IDLE_GRACE: Duration = Duration::from_secs(1);

/// See the module docs.
#[derive(Debug, Default)]
pub struct Drain {
    on: AtomicBool,
    notify: Notify,
    /// Every part has started and the process said so (readiness waits for it).
    serving: AtomicBool,
}

impl Drain {
    /// Marks the process as serving: every part bound and announced.
    pub fn set_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }

    /// Whether the process has started serving (it still is while it drains).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Starts the drain (once; later calls change nothing).
    pub fn start(&self) {
        if !self.on.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }

    /// Whether the drain has started.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// A future that resolves at the drain's start, for a waiter that waits many times (a
    /// keep-alive connection between its requests): made once and pinned, it stays in the
    /// notify's list between waits, where [`Drain::started`] joins the list and leaves it again
    /// under its lock for every wait. It hears a start from its creation on; ask
    /// [`Drain::is_on`] before each wait (once it has resolved, it is done).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Resolves once the drain has started (at once if it has).
    pub async fn started(&self) {
        // Created before the check: `notify_waiters` reaches a `Notified` from its creation on,
        // so a start between the check and the first poll is not missed.
        let notified = self.notify.notified();
        if self.is_on() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn started_resolves_for_a_waiter_before_and_after_the_start() {
        let drain = std::sync::Arc::new(Drain::default());
        let d = drain.clone();
        let waiter = tokio::spawn(async move { d.started().await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert!(!drain.is_on());
        drain.start();
        waiter.await.unwrap();
        assert!(drain.is_on());
        // After the start, at once.
        drain.started().await;
    }

    #[tokio::test]
    async fn one_notified_hears_a_start_after_many_waits() {
        let drain = std::sync::Arc::new(Drain::default());
        let d = drain.clone();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let waiter = tokio::spawn(async move {
            let drained = d.notified();
            tokio::pin!(drained);
            // Waits that end for another reason leave it registered for the next.
            for _ in 0..3 {
                tokio::select! {
                    biased;
                    _ = rx.recv() => {}
                    () = drained.as_mut() => return false,
                }
            }
            if !d.is_on() {
                drained.as_mut().await;
            }
            true
        });
        for _ in 0..3 {
            tx.send(()).await.unwrap();
        }
        tokio::task::yield_now().await;
        drain.start();
        assert!(waiter.await.unwrap());
    }
}
