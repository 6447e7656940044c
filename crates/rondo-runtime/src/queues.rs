//! What the admin API, `rondo ctl` and `/metrics` see of the durable queues: their figures
//! ([`QueueStats`], read at scrape time) and the dead-letter operations ([`QueueOps`]). The
//! queues themselves live in `rondo-queue`, which implements [`QueueOps`] and hands it to
//! [`crate::metrics::Metrics::queues`] when `rondo serve` starts them; this crate knows nothing
//! of stores or delivery.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A boxed future, for the object-safe [`QueueOps`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One queue's figures now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue's name.
    pub name: String,
    /// `embedded` or `nats`.
    pub backend: &'static str,
    /// Messages accepted and not yet delivered (waiting, backing off or in delivery); dead
    /// letters are not counted.
    pub depth: u64,
    /// Messages under a delivery's lease right now.
    pub in_delivery: u64,
    /// Messages in the dead-letter queue.
    pub dead_letters: u64,
    /// Bytes held (waiting, in delivery and dead letters).
    pub bytes: u64,
    /// Age of the oldest message not yet delivered (`None`: none waits).
    pub oldest_age: Option<Duration>,
    /// Messages accepted (answered 202) since start.
    pub accepted: u64,
    /// Messages delivered (a member answered 2xx) since start.
    pub delivered: u64,
    /// Delivery attempts that failed and were retried later since start.
    pub retried: u64,
    /// Messages moved to the dead-letter queue since start.
    pub dead_lettered: u64,
    /// Messages refused because the queue was full (503) since start.
    pub rejected_full: u64,
    /// Messages refused as too large (413) since start.
    pub rejected_too_large: u64,
    /// `max_messages`.
    pub max_messages: u64,
    /// `max_bytes`.
    pub max_bytes: u64,
}

/// One delivery attempt that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryRecord {
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// When it ended (Unix milliseconds).
    pub at_ms: u64,
    /// Why it failed (the member and its answer, a timeout, no eligible member...).
    pub reason: String,
}

/// A dead letter as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterSummary {
    /// The message id (as answered to the client that sent it).
    pub id: String,
    /// When it was accepted (Unix milliseconds).
    pub accepted_ms: u64,
    /// When it moved to the dead-letter queue (Unix milliseconds).
    pub dead_ms: u64,
    /// Attempts made.
    pub attempts: u32,
    /// Bytes held.
    pub bytes: u64,
    /// The last attempt's reason.
    pub last_reason: String,
    /// Its session key, if it has one.
    pub session: Option<String>,
}

/// A dead letter with its tries and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// What the list shows.
    pub summary: DeadLetterSummary,
    /// Every failed attempt, oldest first.
    pub tries: Vec<TryRecord>,
    /// The path (and query) it was posted to.
    pub path: String,
    /// Its header fields as accepted.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
}

/// Why a queue operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueError {
    /// No queue of that name.
    UnknownQueue(String),
    /// No dead letter of that id in the queue.
    UnknownMessage(String),
    /// The store failed (its message).
    Store(String),
}

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueError::UnknownQueue(q) => write!(f, "no queue named `{q}`"),
            QueueError::UnknownMessage(m) => write!(f, "no dead letter with id `{m}`"),
            QueueError::Store(e) => write!(f, "queue store: {e}"),
        }
    }
}

impl std::error::Error for QueueError {}

/// The queues of this process, as the admin API operates them.
pub trait QueueOps: Send + Sync + std::fmt::Debug {
    /// Every queue's figures now, in configuration order.
    fn stats(&self) -> Vec<QueueStats>;
    /// The oldest `limit` dead letters of `queue`.
    fn dead_letters(
        &self,
        queue: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DeadLetterSummary>, QueueError>>;
    /// One dead letter of `queue`, with its tries.
    fn dead_letter(&self, queue: &str, id: &str) -> BoxFuture<'_, Result<DeadLetter, QueueError>>;
    /// Moves dead letter `id` (every one when `None`) back to `queue` for delivery with fresh
    /// attempts; answers how many moved.
    fn requeue(&self, queue: &str, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>>;
    /// Deletes dead letter `id` (every one when `None`); answers how many went.
    fn purge(&self, queue: &str, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>>;
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RejectLabels {
    queue: String,
    reason: &'static str,
}

/// The queue metrics in the Prometheus text format (version 0.0.4), from `stats`: state gauges
/// and the counters since start (docs/admin.md lists them).
pub fn render(stats: &[QueueStats]) -> String {
    let mut reg = Registry::with_prefix("rondo_queue");
    let gauges = [
        ("depth", "Messages accepted and not yet delivered (waiting, backing off or in delivery)"),
        ("in_delivery", "Messages under a delivery's lease"),
        ("dead_letters", "Messages in the dead-letter queue"),
        ("bytes", "Bytes held: waiting, in delivery and dead letters"),
    ];
    let counters = [
        ("messages_accepted", "Messages accepted (202) since start"),
        ("messages_delivered", "Messages a member answered 2xx since start"),
        ("delivery_retries", "Failed delivery attempts that are tried again later"),
        ("messages_dead_lettered", "Messages moved to the dead-letter queue"),
    ];
    let mut g: Vec<Family<QueueLabels, Gauge>> = Vec::new();
    for (name, help) in gauges {
        let f = Family::<QueueLabels, Gauge>::default();
        reg.register(name, help, f.clone());
        g.push(f);
    }
    let age = Family::<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    reg.register(
        "oldest_age_seconds",
        "Age of the oldest message not yet delivered (0 when none waits)",
        age.clone(),
    );
    let mut c: Vec<Family<QueueLabels, Counter>> = Vec::new();
    for (name, help) in counters {
        let f = Family::<QueueLabels, Counter>::default();
        reg.register(name, help, f.clone());
        c.push(f);
    }
    let rejected = Family::<RejectLabels, Counter>::default();
    reg.register(
        "messages_rejected",
        "Messages refused: `full` (503) or `too_large` (413)",
        rejected.clone(),
    );
    for s in stats {
        let l = QueueLabels { queue: s.name.clone() };
        for (f, v) in g.iter().zip([s.depth, s.in_delivery, s.dead_letters, s.bytes]) {
            f.get_or_create(&l).set(v as i64);
        }
        age.get_or_create(&l).set(s.oldest_age.map_or(0.0, |d| d.as_secs_f64()));
        for (f, v) in c.iter().zip([s.accepted, s.delivered, s.retried, s.dead_lettered]) {
            f.get_or_create(&l).inc_by(v);
        }
        for (reason, v) in [("full", s.rejected_full), ("too_large", s.rejected_too_large)] {
            rejected.get_or_create(&RejectLabels { queue: s.name.clone(), reason }).inc_by(v);
        }
    }
    let mut out = String::new();
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg);
    out
}
