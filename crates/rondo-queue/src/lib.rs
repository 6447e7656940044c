//! rondo's durable queues (WCF's queued routing: MSMQ under a transaction): `queue` listeners
//! accept messages over HTTP and answer `202 Accepted` once a message is durable ([`intake`]);
//! delivery workers take each one under a lease (peek-lock), send it to a member of the cluster
//! the route picks, with the router's own balancers and failover engine, and complete it on a
//! 2xx, retry it with exponential backoff, or move it to the dead-letter queue after
//! `max_attempts` ([`deliver`]). Messages live in a [`Store`]: the embedded one
//! ([`embedded`], a redb file per queue with group commit) or NATS JetStream (`nats`, cargo
//! feature `nats`), where several routers compete on one work queue.
//!
//! Delivery is at least once: a crash between a member's 2xx and the commit that records it
//! delivers the message again after the restart. See `docs/queues.md`.

pub mod deliver;
pub mod embedded;
pub mod intake;
#[cfg(feature = "nats")]
pub mod nats;
mod parts;
pub mod record;
pub mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use rondo_config::{Config, ListenerProtocol, QueueBackend};
use rondo_runtime::queues::{
    BoxFuture, DeadLetter, DeadLetterSummary, QueueError, QueueOps, QueueStats,
};

pub use intake::Entry;
pub use parts::QueueParts;
pub use store::{AppendError, Lease, Message, Store};

/// Why the queues could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A store could not be opened (the message names its file or server).
    #[error("{0}")]
    Store(String),
    /// A queue listener could not be bound.
    #[error("{0}")]
    Bind(#[from] std::io::Error),
}

/// The running queues: their listeners, stores and workers. [`Queues::stop`] (or drop) stops
/// the listeners and workers and lets each store commit what it was given.
#[derive(Debug)]
pub struct Queues {
    /// Each queue listener's name and bound address, in configuration order.
    pub listeners: Vec<(String, SocketAddr)>,
    set: Arc<QueueSet>,
    embedded: Vec<Arc<embedded::Embedded>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// The queue listeners, until [`Queues::drained`] waits for them.
    intakes: std::sync::Mutex<Vec<intake::Intake>>,
}

impl Queues {
    /// The bound address of queue listener `name`.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    /// The queues, for the admin API ([`QueueOps`]).
    pub fn ops(&self) -> Arc<dyn QueueOps> {
        self.set.clone()
    }

    /// Resolves once (after [`Queues::stop`]) no queue listener has a connection open.
    pub async fn drained(&self) {
        let intakes = std::mem::take(&mut *self.intakes.lock().unwrap_or_else(|e| e.into_inner()));
        for i in intakes {
            i.drained().await;
        }
    }

    /// Stops accepting and delivering; stores commit what they were given.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
        for e in &self.embedded {
            e.close();
        }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Opens every `[[queue]]` of `config`, binds its `queue` listeners, starts the delivery
/// workers over `parts`' view, and hands the queues to its metrics (and so to the admin API).
pub async fn start(config: &Config, parts: QueueParts) -> Result<Queues, StartError> {
    let parts = Arc::new(parts);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut entries = Vec::new();
    let mut embedded = Vec::new();
    for spec in &config.queues {
        let store: Arc<dyn Store> = match &spec.backend {
            QueueBackend::Embedded { directory } => {
                let dir = directory.clone();
                let s = spec.clone();
                let e = tokio::task::spawn_blocking(move || embedded::Embedded::open(&s, &dir))
                    .await
                    .map_err(|e| StartError::Store(e.to_string()))?
                    .map_err(|e| StartError::Store(e.to_string()))?;
                let e = Arc::new(e);
                embedded.push(e.clone());
                e
            }
            #[cfg(feature = "nats")]
            QueueBackend::Nats { url, session_partitions } => Arc::new(
                nats::Nats::connect(spec, url, *session_partitions)
                    .await
                    .map_err(|e| StartError::Store(e.to_string()))?,
            ),
            #[cfg(not(feature = "nats"))]
            QueueBackend::Nats { .. } => {
                return Err(StartError::Store(format!(
                    "queue {}: backend `nats` needs the `nats` cargo feature, which this rondo \
                     was built without",
                    spec.name
                )));
            }
        };
        entries.push(Entry { spec: Arc::new(spec.clone()), store });
    }
    let clients = deliver::Clients::new(deliver::CONNECT_TIMEOUT);
    for e in &entries {
        for _ in 0..e.spec.concurrency {
            tokio::spawn(deliver::worker(
                e.store.clone(),
                e.spec.clone(),
                parts.clone(),
                clients.clone(),
                stopped.clone(),
            ));
        }
    }
    let by_name: Arc<HashMap<String, Entry>> =
        Arc::new(entries.iter().map(|e| (e.spec.name.clone(), e.clone())).collect());
    let (mut listeners, mut intakes) = (Vec::new(), Vec::new());
    for l in config.listeners.iter().filter(|l| l.protocol == ListenerProtocol::Queue) {
        let intake = intake::start(l, by_name.clone(), parts.clone(), stopped.clone()).await?;
        listeners.push((l.name.clone(), intake.addr));
        intakes.push(intake);
    }
    let set = Arc::new(QueueSet { entries });
    let _ = parts.metrics.queues.set(set.clone());
    Ok(Queues { listeners, set, embedded, stop, intakes: std::sync::Mutex::new(intakes) })
}

/// Every queue of the process, as [`QueueOps`].
#[derive(Debug)]
pub struct QueueSet {
    entries: Vec<Entry>,
}

impl QueueSet {
    fn store(&self, queue: &str) -> Result<&Arc<dyn Store>, QueueError> {
        self.entries
            .iter()
            .find(|e| e.spec.name == queue)
            .map(|e| &e.store)
            .ok_or_else(|| QueueError::UnknownQueue(queue.to_owned()))
    }
}

impl QueueOps for QueueSet {
    fn stats(&self) -> Vec<QueueStats> {
        self.entries.iter().map(|e| e.store.stats()).collect()
    }

    fn dead_letters(
        &self,
        queue: &str,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DeadLetterSummary>, QueueError>> {
        match self.store(queue) {
            Ok(s) => s.dead_letters(limit),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn dead_letter(&self, queue: &str, id: &str) -> BoxFuture<'_, Result<DeadLetter, QueueError>> {
        match self.store(queue) {
            Ok(s) => s.dead_letter_get(id),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn requeue(&self, queue: &str, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        match self.store(queue) {
            Ok(s) => s.requeue(id),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn purge(&self, queue: &str, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        match self.store(queue) {
            Ok(s) => s.purge(id),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}
