//! Queues in NATS JetStream (`backend = "nats"`, cargo feature `nats`): several routers that
//! name the same server and queue compete on one work queue (WCF: several routers reading one
//! queue), and a router that dies mid-delivery loses nothing: JetStream hands its unacknowledged
//! messages to another router once their ack wait passes.
//!
//! | rondo | JetStream |
//! |---|---|
//! | queue `NAME` | stream `RONDO_Q_NAME` on subject `rondo.q.NAME`, work-queue retention, file storage, `discard = new` at `max_messages` / `max_bytes` (a full stream refuses the publish: 503) |
//! | accepted (202) | the publish acknowledged by the server (stored, fsynced by its own policy) |
//! | peek-lock lease | the durable pull consumer `rondo` every router shares, explicit acks, `ack_wait` = `lease_ms` + 5 s |
//! | complete | `ack` (acknowledged by the server: double ack) |
//! | retry with backoff | `nak` with the backoff as its delay |
//! | dead-letter | the message published to stream `RONDO_DLQ_NAME` (`rondo.dlq.NAME`) with its tries, then `term` |
//! | tries of each attempt | stream `RONDO_TRIES_NAME`, one message per subject `rondo.tries.NAME.{id}` (the latest list) |
//!
//! The consumer's `max_deliver` is left unlimited: rondo counts attempts itself (the server's
//! delivery count included, so attempts lost with a router count too) and dead-letters on the
//! `max_attempts`-th, so no message is stranded by the server's own limit. Session keys are
//! kept with each message but do not order deliveries here: routers compete for messages, and
//! JetStream keeps no per-key lock (docs/queues.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use rondo_config::QueueSpec;
use rondo_runtime::queues::{
    BoxFuture, DeadLetter, DeadLetterSummary, QueueError, QueueStats, TryRecord,
};

use crate::record;
use crate::store::{AppendError, Lease, Message, Store, unix_ms};

const ID: &str = "Rondo-Id";
const ACCEPTED: &str = "Rondo-Accepted";
const SESSION: &str = "Rondo-Session";
const DEAD: &str = "Rondo-Dead";

#[derive(Debug, Default, Clone)]
struct Cached {
    depth: u64,
    bytes: u64,
    dead: u64,
    dead_bytes: u64,
    in_delivery: u64,
    oldest_ms: Option<u64>,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    delivered: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    rejected_full: AtomicU64,
    rejected_too_large: AtomicU64,
}

/// A queue in NATS JetStream; see the module docs.
pub struct Nats {
    spec: QueueSpec,
    js: jetstream::Context,
    subject: String,
    dlq_subject: String,
    dlq: stream::Stream,
    tries: stream::Stream,
    tries_prefix: String,
    uid: u32,
    messages: tokio::sync::Mutex<consumer::pull::Stream>,
    leased: Mutex<HashMap<u64, jetstream::Message>>,
    next_key: AtomicU64,
    cached: Arc<Mutex<Cached>>,
    counters: Counters,
    poller: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats").field("queue", &self.spec.name).finish_non_exhaustive()
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

fn store_err(e: impl std::fmt::Display) -> QueueError {
    QueueError::Store(e.to_string())
}

fn header<'a>(h: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    h.and_then(|h| h.get(name)).map(|v| v.as_str())
}

impl Nats {
    /// Connects to `url`, creates (or opens) the queue's streams, consumer and bucket.
    pub async fn connect(spec: &QueueSpec, url: &str) -> Result<Nats, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("queue {}: nats {url}: {what}: {e}", spec.name)
        };
        let client =
            tokio::time::timeout(Duration::from_secs(5), async_nats::connect(url.to_owned()))
                .await
                .map_err(|_| fail("cannot connect", &"no answer within 5 s"))?
                .map_err(|e| fail("cannot connect", &e))?;
        let js = jetstream::new(client);
        let name = &spec.name;
        let subject = format!("rondo.q.{name}");
        let dlq_subject = format!("rondo.dlq.{name}");
        let mut main = js
            .get_or_create_stream(stream::Config {
                name: format!("RONDO_Q_{name}"),
                subjects: vec![subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                max_messages: i64::try_from(spec.max_messages).unwrap_or(i64::MAX),
                max_bytes: i64::try_from(spec.max_bytes).unwrap_or(i64::MAX),
                ..Default::default()
            })
            .await
            .map_err(|e| fail("stream", &e))?;
        let created = main.info().await.map_err(|e| fail("stream info", &e))?.created;
        let uid = rondo_core::hash::hash_key(
            format!("{name}/{}", created.unix_timestamp_nanos()).as_bytes(),
        ) as u32;
        let dlq = js
            .get_or_create_stream(stream::Config {
                name: format!("RONDO_DLQ_{name}"),
                subjects: vec![dlq_subject.clone()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| fail("dead-letter stream", &e))?;
        let tries_prefix = format!("rondo.tries.{name}");
        let tries = js
            .get_or_create_stream(stream::Config {
                name: format!("RONDO_TRIES_{name}"),
                subjects: vec![format!("{tries_prefix}.>")],
                storage: stream::StorageType::File,
                max_messages_per_subject: 1,
                ..Default::default()
            })
            .await
            .map_err(|e| fail("tries stream", &e))?;
        let consumer: consumer::PullConsumer = main
            .get_or_create_consumer(
                "rondo",
                consumer::pull::Config {
                    durable_name: Some("rondo".to_owned()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: spec.lease + Duration::from_secs(5),
                    max_deliver: -1,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| fail("consumer", &e))?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(spec.concurrency as usize)
            .messages()
            .await
            .map_err(|e| fail("consumer messages", &e))?;
        let cached = Arc::new(Mutex::new(Cached::default()));
        let poller = tokio::spawn(poll(main, dlq.clone(), consumer, cached.clone()));
        Ok(Nats {
            spec: spec.clone(),
            js,
            subject,
            dlq_subject,
            dlq,
            tries,
            tries_prefix,
            uid,
            messages: tokio::sync::Mutex::new(messages),
            leased: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            cached,
            counters: Counters::default(),
            poller,
        })
    }

    fn tries_subject(&self, id: &str) -> String {
        format!("{}.{id}", self.tries_prefix)
    }

    async fn forget_tries(&self, id: &str) {
        let _ = self.tries.purge().filter(self.tries_subject(id)).await;
    }

    fn take(&self, key: u64) -> Result<jetstream::Message, QueueError> {
        self.leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .ok_or_else(|| QueueError::Store("the lease is gone".to_owned()))
    }

    /// Every dead letter (`id`: the one with that id, an error when there is none).
    async fn scan_for(&self, id: Option<&str>) -> Result<Vec<(u64, DeadLetter)>, QueueError> {
        let found = self.scan(usize::MAX, id).await?;
        match id {
            Some(id) if found.is_empty() => Err(QueueError::UnknownMessage(id.to_owned())),
            _ => Ok(found),
        }
    }

    /// The dead letters, oldest first: (sequence in the dead-letter stream, summary, message).
    async fn scan(
        &self,
        limit: usize,
        want: Option<&str>,
    ) -> Result<Vec<(u64, DeadLetter)>, QueueError> {
        let mut dlq = self.dlq.clone();
        let state = dlq.info().await.map_err(store_err)?.state.clone();
        let mut out = Vec::new();
        if state.messages == 0 {
            return Ok(out);
        }
        for seq in state.first_sequence..=state.last_sequence {
            if out.len() >= limit {
                break;
            }
            let Ok(m) = dlq.get_raw_message(seq).await else { continue };
            let Some(d) = decode_dead(Some(&m.headers), &m.payload) else { continue };
            if want.is_some_and(|w| w != d.summary.id) {
                continue;
            }
            out.push((seq, d));
        }
        Ok(out)
    }
}

/// Refreshes the figures every 500 ms (the server's counts: tier-wide).
async fn poll(
    mut main: stream::Stream,
    mut dlq: stream::Stream,
    mut consumer: consumer::PullConsumer,
    cached: Arc<Mutex<Cached>>,
) {
    loop {
        let mut c = cached.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Ok(i) = main.info().await {
            c.depth = i.state.messages;
            c.bytes = i.state.bytes;
            c.oldest_ms = (i.state.messages > 0)
                .then(|| (i.state.first_timestamp.unix_timestamp_nanos() / 1_000_000) as u64);
        }
        if let Ok(i) = dlq.info().await {
            c.dead = i.state.messages;
            c.dead_bytes = i.state.bytes;
        }
        if let Ok(i) = consumer.info().await {
            c.in_delivery = i.num_ack_pending as u64;
        }
        *cached.lock().unwrap_or_else(|e| e.into_inner()) = c;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn decode_dead(h: Option<&HeaderMap>, payload: &[u8]) -> Option<DeadLetter> {
    let n = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
    let tries = record::decode_tries(payload.get(4..4 + n)?).ok()?;
    let m = record::decode_message(payload.get(4 + n..)?).ok()?;
    let summary = DeadLetterSummary {
        id: header(h, ID)?.to_owned(),
        accepted_ms: header(h, ACCEPTED).and_then(|v| v.parse().ok()).unwrap_or(0),
        dead_ms: header(h, DEAD).and_then(|v| v.parse().ok()).unwrap_or(0),
        attempts: tries.len() as u32,
        bytes: m.size(),
        last_reason: tries.last().map(|t| t.reason.clone()).unwrap_or_default(),
        session: header(h, SESSION).map(str::to_owned),
    };
    Some(m.into_dead_letter(summary, tries))
}

impl Store for Nats {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn count_too_large(&self) {
        self.counters.rejected_too_large.fetch_add(1, Ordering::Relaxed);
    }

    fn append(
        &self,
        message: Message,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<String, AppendError>> {
        Box::pin(async move {
            let queue = self.spec.name.clone();
            let mut h = HeaderMap::new();
            h.insert(ACCEPTED, unix_ms().to_string().as_str());
            if let Some(s) = &session {
                h.insert(SESSION, s.as_str());
            }
            let payload = Bytes::from(record::encode_message(&message));
            let ack = match self.js.publish_with_headers(self.subject.clone(), h, payload).await {
                Ok(f) => f.await,
                Err(e) => {
                    return Err(AppendError::Store { queue, error: e.to_string() });
                }
            };
            match ack {
                Ok(a) => {
                    self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    Ok(format!("{:08x}-{}", self.uid, a.sequence))
                }
                Err(e) => {
                    let error = e.to_string();
                    if error.contains("maximum") {
                        self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
                        Err(AppendError::Full { queue, why: error })
                    } else {
                        Err(AppendError::Store { queue, error })
                    }
                }
            }
        })
    }

    fn next(&self) -> BoxFuture<'_, Result<Lease, QueueError>> {
        Box::pin(async move {
            let m = {
                let mut stream = self.messages.lock().await;
                match stream.next().await {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return Err(store_err(e)),
                    None => return Err(QueueError::Store("the consumer closed".to_owned())),
                }
            };
            let info = m.info().map_err(store_err)?;
            let (seq, delivered) = (info.stream_sequence, info.delivered.max(1) as u32);
            let h = m.headers.as_ref();
            let id = header(h, ID)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{:08x}-{seq}", self.uid));
            let accepted_ms = header(h, ACCEPTED).and_then(|v| v.parse().ok()).unwrap_or(0);
            let message = match record::decode_message(&m.payload) {
                Ok(msg) => msg,
                Err(e) => {
                    // Not ours to deliver: kept out of the way for good.
                    let _ = m.ack_with(AckKind::Term).await;
                    return Err(QueueError::Store(format!("message {id}: {e}")));
                }
            };
            let tries =
                match self.tries.get_last_raw_message_by_subject(&self.tries_subject(&id)).await {
                    Ok(m) => record::decode_tries(&m.payload).unwrap_or_default(),
                    Err(_) => Vec::new(),
                };
            // Attempts lost with a router (the server delivered, nobody recorded) count too.
            let attempts = (tries.len() as u32).max(delivered - 1);
            let key = self.next_key.fetch_add(1, Ordering::Relaxed);
            self.leased.lock().unwrap_or_else(|e| e.into_inner()).insert(key, m);
            Ok(Lease { id, message, accepted_ms, attempts, tries, key })
        })
    }

    fn complete(&self, lease: Lease) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move {
            let m = self.take(lease.key)?;
            m.double_ack().await.map_err(store_err)?;
            if !lease.tries.is_empty() {
                self.forget_tries(&lease.id).await;
            }
            self.counters.delivered.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    fn retry(
        &self,
        lease: Lease,
        tried: TryRecord,
        after: Duration,
    ) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move {
            let m = self.take(lease.key)?;
            let mut tries = lease.tries;
            tries.push(tried);
            let bytes = Bytes::from(record::encode_tries(&tries));
            let put = match self.js.publish(self.tries_subject(&lease.id), bytes).await {
                Ok(f) => f.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = put {
                tracing::warn!(queue = %self.spec.name, "cannot record a try: {e}");
            }
            m.ack_with(AckKind::Nak(Some(after))).await.map_err(store_err)?;
            self.counters.retried.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    fn dead_letter(&self, lease: Lease, tried: TryRecord) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move {
            let m = self.take(lease.key)?;
            let mut tries = lease.tries;
            tries.push(tried);
            let t = record::encode_tries(&tries);
            let mut payload = (t.len() as u32).to_le_bytes().to_vec();
            payload.extend_from_slice(&t);
            payload.extend_from_slice(&record::encode_message(&lease.message));
            let mut h = HeaderMap::new();
            h.insert(ID, lease.id.as_str());
            h.insert(ACCEPTED, lease.accepted_ms.to_string().as_str());
            h.insert(DEAD, unix_ms().to_string().as_str());
            if let Some(s) = header(m.headers.as_ref(), SESSION) {
                h.insert(SESSION, s);
            }
            let published = self
                .js
                .publish_with_headers(self.dlq_subject.clone(), h, Bytes::from(payload))
                .await
                .map_err(store_err)?;
            published.await.map_err(store_err)?;
            m.ack_with(AckKind::Term).await.map_err(store_err)?;
            self.forget_tries(&lease.id).await;
            self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    fn stats(&self) -> QueueStats {
        let c = self.cached.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let n = &self.counters;
        QueueStats {
            name: self.spec.name.clone(),
            backend: "nats",
            depth: c.depth,
            in_delivery: c.in_delivery,
            dead_letters: c.dead,
            bytes: c.bytes + c.dead_bytes,
            oldest_age: c.oldest_ms.map(|t| Duration::from_millis(unix_ms().saturating_sub(t))),
            accepted: n.accepted.load(Ordering::Relaxed),
            delivered: n.delivered.load(Ordering::Relaxed),
            retried: n.retried.load(Ordering::Relaxed),
            dead_lettered: n.dead_lettered.load(Ordering::Relaxed),
            rejected_full: n.rejected_full.load(Ordering::Relaxed),
            rejected_too_large: n.rejected_too_large.load(Ordering::Relaxed),
            max_messages: self.spec.max_messages,
            max_bytes: self.spec.max_bytes,
        }
    }

    fn dead_letters(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DeadLetterSummary>, QueueError>> {
        Box::pin(async move {
            Ok(self.scan(limit, None).await?.into_iter().map(|(_, d)| d.summary).collect())
        })
    }

    fn dead_letter_get(&self, id: &str) -> BoxFuture<'_, Result<DeadLetter, QueueError>> {
        let id = id.to_owned();
        Box::pin(async move {
            let found = self.scan(1, Some(&id)).await?;
            found.into_iter().next().map(|(_, d)| d).ok_or(QueueError::UnknownMessage(id))
        })
    }

    fn requeue(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        let id = id.map(str::to_owned);
        Box::pin(async move {
            let mut n = 0;
            for (seq, d) in self.scan_for(id.as_deref()).await? {
                let raw = self.dlq.get_raw_message(seq).await.map_err(store_err)?;
                let len = u32::from_le_bytes(raw.payload[..4].try_into().expect("4 bytes"));
                let message = raw.payload.slice(4 + len as usize..);
                let mut h = HeaderMap::new();
                h.insert(ID, d.summary.id.as_str());
                h.insert(ACCEPTED, d.summary.accepted_ms.to_string().as_str());
                if let Some(s) = &d.summary.session {
                    h.insert(SESSION, s.as_str());
                }
                let published = self
                    .js
                    .publish_with_headers(self.subject.clone(), h, message)
                    .await
                    .map_err(store_err)?;
                published.await.map_err(store_err)?;
                self.dlq.delete_message(seq).await.map_err(store_err)?;
                n += 1;
            }
            Ok(n)
        })
    }

    fn purge(&self, id: Option<&str>) -> BoxFuture<'_, Result<u64, QueueError>> {
        let id = id.map(str::to_owned);
        Box::pin(async move {
            let mut n = 0;
            for (seq, _) in self.scan_for(id.as_deref()).await? {
                self.dlq.delete_message(seq).await.map_err(store_err)?;
                n += 1;
            }
            Ok(n)
        })
    }
}
