//! Keeping a client's answer current: the background task that long-polls the naming service's
//! `watch` on the endpoint in use, refetches the answer when the view moved (or a response
//! showed a newer view id, see [`crate::Client::observe_view_id`]), and moves to the next
//! endpoint with a doubling backoff when one fails.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::inner::Inner;
use crate::naming::is_not_found;

/// The task's waits, from the client's builder.
pub(crate) struct Timing {
    pub(crate) wait: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    /// Whether to long-poll the watch; off, only a newer id seen on a response wakes a refetch.
    pub(crate) watch: bool,
}

/// The background task: long-polls `watch` on the endpoint in use, refetches the answer when
/// the view id moved (or a response showed a newer one), and moves to the next endpoint with a
/// doubling backoff when one fails.
pub(crate) async fn keep_current(inner: Arc<Inner>, mut at: usize, timing: Timing) {
    let n = inner.naming.len();
    let mut backoff = timing.backoff_min;
    let mut fetch = false;
    loop {
        let held = *inner.view.borrow();
        let wanted = inner.wanted.swap(0, Ordering::Relaxed);
        if fetch || wanted > held {
            match inner.naming[at].answer(&inner.service).await {
                Ok(answer) => {
                    inner.apply(answer);
                    fetch = false;
                    backoff = timing.backoff_min;
                }
                Err(e) => {
                    let level_404 = is_not_found(&e);
                    tracing::warn!(service = %inner.service, error = %e, unknown = level_404, "naming answer failed");
                    at = (at + 1) % n;
                    inner.endpoint.store(at as u64, Ordering::Relaxed);
                    fetch = true;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(timing.backoff_max);
                }
            }
            continue;
        }
        if !timing.watch {
            inner.wake.notified().await;
            continue;
        }
        tokio::select! {
            r = inner.naming[at].watch(held, timing.wait) => match r {
                Ok(w) => {
                    backoff = timing.backoff_min;
                    fetch = w.changed || w.view_id != held;
                }
                Err(e) => {
                    tracing::warn!(service = %inner.service, error = %e, "naming watch failed");
                    at = (at + 1) % n;
                    inner.endpoint.store(at as u64, Ordering::Relaxed);
                    // Another endpoint counts views its own way: start from its answer.
                    fetch = true;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(timing.backoff_max);
                }
            },
            () = inner.wake.notified() => {}
        }
    }
}
