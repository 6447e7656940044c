//! The store interface every backend implements ([`Store`]), and what passes through it: a
//! [`Message`] as accepted, a [`Lease`] on one for a delivery, a failed attempt
//! ([`TryRecord`]).
//!
//! The contract, which the delivery workers rely on and every backend keeps:
//!
//! - [`Store::append`] answers `Ok` only once the message is durable (it survives a crash of
//!   the process, and for the embedded store of the machine's power too).
//! - [`Store::next`] hands out each message under one lease at a time; a message whose session
//!   key has an earlier message not yet completed or dead-lettered is not handed out.
//! - A leased message is finished by exactly one of [`Store::complete`], [`Store::retry`] or
//!   [`Store::dead_letter`]; a lease lost with the process (a crash) makes the message
//!   deliverable again after a restart (or, with NATS, after the lease's ack wait), which is
//!   where duplicates come from.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rondo_runtime::queues::{
    BoxFuture, DeadLetter, DeadLetterSummary, QueueError, QueueStats, TryRecord,
};

/// A message as a client posted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The listener it arrived on (its routes pick the cluster).
    pub listener: String,
    /// The path and query it was posted to (`/queues/orders?x=1`).
    pub path: String,
    /// Its header fields (lower-case names), hop-by-hop fields left out.
    pub headers: Vec<(String, Bytes)>,
    /// Its body.
    pub body: Bytes,
    /// The client's address.
    pub peer: Option<IpAddr>,
    /// The multicast branch this copy is for (its cluster), on a route with `multicast`; `None`
    /// for the route's own cluster.
    pub branch: Option<String>,
}

impl Message {
    /// The bytes a message holds against the queue's `max_bytes`.
    pub fn size(&self) -> u64 {
        let headers: usize = self.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        (self.path.len() + headers + self.body.len()) as u64
    }

    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_ref())
    }

    /// The dead letter this message makes, with its `summary` and `tries` (every backend's
    /// admin view of one).
    pub fn into_dead_letter(self, summary: DeadLetterSummary, tries: Vec<TryRecord>) -> DeadLetter {
        DeadLetter {
            summary,
            tries,
            path: self.path,
            headers: self
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect(),
            body: self.body.to_vec(),
        }
    }
}

/// One message handed out for a delivery attempt.
#[derive(Debug)]
pub struct Lease {
    /// Its id, as answered to the client (and sent in `Idempotency-Key`).
    pub id: String,
    /// The message.
    pub message: Message,
    /// When it was accepted (Unix milliseconds).
    pub accepted_ms: u64,
    /// Attempts made before this one.
    pub attempts: u32,
    /// Its failed attempts so far, oldest first.
    pub tries: Vec<TryRecord>,
    /// The backend's handle on the lease.
    pub(crate) key: u64,
}

/// Why a message was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// `max_messages` or `max_bytes` is reached (503 with `Retry-After`).
    #[error("queue {queue} is full ({why})")]
    Full {
        /// The queue.
        queue: String,
        /// Which limit.
        why: String,
    },
    /// The store could not make it durable (503).
    #[error("queue {queue}: the store failed: {error}")]
    Store {
        /// The queue.
        queue: String,
        /// What failed.
        error: String,
    },
}

/// A durable queue's store; see the module docs for the contract.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// The queue's name.
    fn name(&self) -> &str;
    /// Counts a message refused as too large (the intake checks sizes before the store).
    fn count_too_large(&self);
    /// Accepts `message` with session key `session`: its id once it is durable.
    fn append(
        &self,
        message: Message,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<String, AppendError>>;
    /// Accepts every one of `copies` (a message with its session key) or none: their ids once
    /// all are durable (a multicast route's copies, one per branch).
    fn append_all(
        &self,
        copies: Vec<(Message, Option<String>)>,
    ) -> BoxFuture<'_, Result<Vec<String>, AppendError>>;
    /// Waits for the next message due for delivery and leases it.
    fn next(&self) -> BoxFuture<'_, Result<Lease, QueueError>>;
    /// The leased message was delivered: it goes.
    fn complete(&self, lease: Lease) -> BoxFuture<'_, Result<(), QueueError>>;
    /// The attempt `tried` failed: the message returns, due again `after` from now.
    fn retry(
        &self,
        lease: Lease,
        tried: TryRecord,
        after: Duration,
    ) -> BoxFuture<'_, Result<(), QueueError>>;
    /// The attempt `tried` was the last allowed: the message moves to the dead-letter queue.
    fn dead_letter(&self, lease: Lease, tried: TryRecord) -> BoxFuture<'_, Result<(), QueueError>>;
    /// The queue's figures now (no I/O).
    fn stats(&self) -> QueueStats;
    /// The oldest `limit` dead letters.
    fn dead_letters(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DeadLetterSummary>, QueueError>>;
    /// One dead letter with its tries and content.
    fn dead_letter_get(&self, id: &str) -> BoxFuture<'_, Result<DeadLetter, QueueError>>;
    /// Dead letter `id` (all when `None`) back for delivery with fresh attempts; how many.
    fn requeue(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>>;
    /// Dead letter `id` (all when `None`) deleted; how many.
    fn purge(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>>;
}

/// Now, in Unix milliseconds.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a backend counts since start, for its [`QueueStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub accepted: AtomicU64,
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub rejected_full: AtomicU64,
    pub rejected_too_large: AtomicU64,
}

impl Counters {
    /// The counts as stats, the rest of them left for the backend to fill in (`..`).
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            accepted: self.accepted.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            rejected_full: self.rejected_full.load(Ordering::Relaxed),
            rejected_too_large: self.rejected_too_large.load(Ordering::Relaxed),
            ..QueueStats::default()
        }
    }
}
