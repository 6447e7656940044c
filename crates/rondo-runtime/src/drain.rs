//! The process-wide drain: once started (by `SIGTERM` or by a hitless upgrade's hand-off), every
//! server of the process stops taking new work gracefully. The router's HTTP/1 connections
//! close between requests and say `Connection: close` on the response in progress, its HTTP/2
//! connections get GOAWAY, the admin and naming APIs stop accepting and finish what they serve.
//! Whoever serves connections asks [`Drain::is_on`] at the points it could close, and waits on
//! [`Drain::started`] where it idles.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Drain {
    on: AtomicBool,
    notify: Notify,
}

impl Drain {
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

/// Resolves once `live`'s drain has started: a `'static` future for a server's graceful
/// shutdown (axum's `with_graceful_shutdown`).
pub async fn drained(live: std::sync::Arc<crate::Live>) {
    live.drain.started().await;
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
}
