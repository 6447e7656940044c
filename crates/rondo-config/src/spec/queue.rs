//! A compiled `[[queue]]`: its backend (embedded store or NATS), limits, retries and lease.

use std::path::PathBuf;
use std::time::Duration;

/// Where a queue keeps its messages (`backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueBackend {
    /// The embedded, crash-safe store (redb): the file `{directory}/{name}.redb`.
    Embedded {
        /// The directory of the store file (created if missing), relative paths resolved
        /// against the configuration file's directory.
        directory: PathBuf,
    },
    /// A NATS JetStream work-queue stream (`nats_url`, `host:port`), shared by every router
    /// that names the same server and queue (cargo feature `nats`).
    Nats {
        /// `host:port` of the NATS server.
        url: String,
        /// How many subjects (each with its own one-at-a-time consumer) the session keys are
        /// hashed over; every router of a tier must name the same number.
        session_partitions: u32,
    },
}

impl QueueBackend {
    /// The configuration spelling (`embedded` or `nats`).
    pub fn as_str(&self) -> &'static str {
        match self {
            QueueBackend::Embedded { .. } => "embedded",
            QueueBackend::Nats { .. } => "nats",
        }
    }
}

/// A `[[queue]]`: a durable queue of messages accepted by `queue` listeners and delivered to the
/// cluster their route picks, with peek-lock, retries and a dead-letter queue (docs/queues.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// The name, also the last segment of `POST /queues/{name}`.
    pub name: String,
    /// Where the messages live.
    pub backend: QueueBackend,
    /// Most messages held (waiting, in delivery and dead letters); more are answered 503.
    pub max_messages: u64,
    /// Most bytes held (each message's path, header fields and body); more are answered 503.
    pub max_bytes: u64,
    /// Largest message body accepted; a larger one is answered 413.
    pub max_message_bytes: u64,
    /// Delivery attempts before a message moves to the dead-letter queue.
    pub max_attempts: u32,
    /// The wait before the second attempt; doubled for each later one.
    pub backoff_initial: Duration,
    /// The longest wait between attempts.
    pub backoff_max: Duration,
    /// How long a delivery holds its message (peek-lock); a delivery still running then is
    /// counted as failed and the message returns.
    pub lease: Duration,
    /// Deliveries under way at once.
    pub concurrency: u32,
    /// The header field (lower case) whose value is a message's session key: messages with the
    /// same key are delivered in the order they were accepted, one at a time.
    pub session_header: Option<String>,
}

impl QueueSpec {
    /// Default `max_messages`.
    pub const DEFAULT_MAX_MESSAGES: u64 = 1_000_000;
    /// Default `max_bytes` (1 GiB).
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
    /// Default `max_message_bytes` (1 MiB).
    pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1 << 20;
    /// Default `max_attempts`.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
    /// Default `backoff_initial_ms`.
    pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(500);
    /// Default `backoff_max_ms`.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
    /// Default `lease_ms`.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
    /// Default `concurrency`.
    pub const DEFAULT_CONCURRENCY: u32 = 32;
    /// Largest `concurrency`.
    pub const MAX_CONCURRENCY: u64 = 10_000;
    /// Largest `max_attempts`.
    pub const MAX_ATTEMPTS: u64 = 1000;
    /// Default `session_partitions` (NATS).
    pub const DEFAULT_SESSION_PARTITIONS: u32 = 16;
    /// Largest `session_partitions` (NATS).
    pub const MAX_SESSION_PARTITIONS: u64 = 1024;

    /// The wait after failed attempt `attempt` (1-based): `backoff_initial` doubled for each
    /// attempt after the first, at most `backoff_max`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(30);
        self.backoff_initial.saturating_mul(1 << shift).min(self.backoff_max)
    }
}
