//! Queues in NATS JetStream (`backend = "nats"`, cargo feature `nats`): several routers that
//! name the same server and queue compete on one work queue (WCF: several routers reading one
//! queue), and a router that dies mid-delivery loses nothing: JetStream hands its unacknowledged
//! messages to another router once their ack wait passes.
//!
//! | rondo | JetStream |
//! |---|---|
//! | queue `NAME` | stream `RONDO_Q_NAME` on subjects `rondo.q.NAME` (messages without a session key) and `rondo.q.NAME.p.K` (session keys, hashed over `session_partitions`), work-queue retention, file storage, `discard = new` at `max_messages` / `max_bytes` (a full stream refuses the publish: 503) |
//! | accepted (202) | the publish acknowledged by the server (stored, fsynced by its own policy) |
//! | peek-lock lease | durable pull consumers every router shares, explicit acks, `ack_wait` = `lease_ms` + 5 s: `rondo` on `rondo.q.NAME`, and `rondo-pK` on each partition with `max_ack_pending = 1` |
//! | complete | `ack` (acknowledged by the server: double ack) |
//! | retry with backoff | `nak` with the backoff as its delay |
//! | dead-letter | the message published to stream `RONDO_DLQ_NAME` (`rondo.dlq.NAME`) with its tries, then `term` |
//! | tries of each attempt | stream `RONDO_TRIES_NAME`, one message per subject `rondo.tries.NAME.{id}` (the latest list) |
//!
//! The consumer's `max_deliver` is left unlimited: rondo counts attempts itself (the server's
//! delivery count included, so attempts lost with a router count too) and dead-letters on the
//! `max_attempts`-th, so no message is stranded by the server's own limit.
//!
//! Sessions: the server holds each partition's one unacknowledged message for the whole tier (a
//! `nak` with a delay keeps it pending through its backoff, a lease lost with a router holds it
//! until the ack wait), so a session key's messages go one at a time, in the order they were
//! accepted, whichever router takes them. Keys that hash to one partition wait for each other;
//! `session_partitions` trades that against a consumer per partition. The stream's description
//! records the number, and a router configured with another one refuses to start.

mod streams;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, stream};
use bytes::Bytes;
use rondo_config::QueueSpec;
use rondo_runtime::queues::{
    BoxFuture, DeadLetter, DeadLetterSummary, QueueError, QueueStats, TryRecord,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::streams::{consumers, main_stream, poll};
use crate::record;
use crate::store::{AppendError, Counters, Lease, Message, Store, unix_ms};

const ID: &str = "Rondo-Id";
const ACCEPTED: &str = "Rondo-Accepted";
const SESSION: &str = "Rondo-Session";
const DEAD: &str = "Rondo-Dead";
/// On a multicast route's message: its branches (each name in hex, comma-separated), whose
/// copies the first router to lease it publishes before the message itself is delivered.
const FANOUT: &str = "Rondo-Fanout";

#[derive(Debug, Default, Clone)]
struct Cached {
    depth: u64,
    bytes: u64,
    dead: u64,
    dead_bytes: u64,
    in_delivery: u64,
    oldest_ms: Option<u64>,
}

/// A message a consumer handed out, and when; or why a consumer failed.
type Pulled = Result<(Instant, jetstream::Message), String>;

/// A queue in NATS JetStream; see the module docs.
pub struct Nats {
    spec: QueueSpec,
    js: jetstream::Context,
    /// `rondo.q.NAME`: messages without a session key; `.p.K` added for partition `K`.
    subject: String,
    partitions: u32,
    dlq_subject: String,
    dlq: stream::Stream,
    tries: stream::Stream,
    tries_prefix: String,
    uid: u32,
    /// What every consumer hands out, for the delivery workers.
    messages: tokio::sync::Mutex<mpsc::Receiver<Pulled>>,
    pumps: Vec<tokio::task::JoinHandle<()>>,
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
        for p in &self.pumps {
            p.abort();
        }
    }
}

fn store_err(e: impl std::fmt::Display) -> QueueError {
    QueueError::Store(e.to_string())
}

fn header<'a>(h: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    h.and_then(|h| h.get(name)).map(|v| v.as_str())
}

impl Nats {
    /// Connects to `url`, creates (or opens) the queue's streams and consumers; `partitions`
    /// is its `session_partitions`.
    pub async fn connect(spec: &QueueSpec, url: &str, partitions: u32) -> Result<Nats, String> {
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
        let (main, uid) =
            main_stream(&js, spec, &subject, partitions).await.map_err(|(w, e)| fail(&w, &e))?;
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
        // Channel room for one message per consumer: what a worker takes next is never far
        // behind what the server handed out.
        let (tx, rx) = mpsc::channel(partitions as usize + 1);
        let (consumers, pumps) = consumers(&main, spec, &subject, partitions, &tx)
            .await
            .map_err(|(w, e)| fail(&w, &e))?;
        let cached = Arc::new(Mutex::new(Cached::default()));
        let poller = tokio::spawn(poll(main, dlq.clone(), consumers, cached.clone()));
        Ok(Nats {
            spec: spec.clone(),
            js,
            subject,
            partitions,
            dlq_subject,
            dlq,
            tries,
            tries_prefix,
            uid,
            messages: tokio::sync::Mutex::new(rx),
            pumps,
            leased: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            cached,
            counters: Counters::default(),
            poller,
        })
    }

    /// The subject a message with session key `session` is published to.
    /// Publishes `message` and waits for the stream to keep it: its id.
    async fn publish(
        &self,
        message: Message,
        session: Option<String>,
        fanout: Option<String>,
    ) -> Result<String, AppendError> {
        let queue = self.spec.name.clone();
        let mut h = HeaderMap::new();
        h.insert(ACCEPTED, unix_ms().to_string().as_str());
        if let Some(s) = &session {
            h.insert(SESSION, s.as_str());
        }
        if let Some(f) = &fanout {
            h.insert(FANOUT, f.as_str());
        }
        let payload = Bytes::from(record::encode_message(&message));
        let subject = self.subject_for(session.as_deref());
        let ack = match self.js.publish_with_headers(subject, h, payload).await {
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
    }

    /// Publishes the copies of multicast message `id` (one for the route's cluster, keeping
    /// `id`, and one per branch of `fanout`), each under a `Nats-Msg-Id` made of `id` and its
    /// branch, so that a router that dies before acknowledging the message makes no second
    /// copy when another leases it again (within the stream's duplicate window, 2 minutes).
    async fn split(
        &self,
        id: &str,
        accepted_ms: u64,
        message: Message,
        session: Option<String>,
        fanout: &str,
    ) -> Result<(), String> {
        let mut branches = vec![None];
        for b in fanout.split(',') {
            let name = unhex(b).ok_or_else(|| format!("bad {FANOUT} field"))?;
            branches.push(Some(name));
        }
        for branch in branches {
            let mut h = HeaderMap::new();
            h.insert(ACCEPTED, accepted_ms.to_string().as_str());
            let session = match (&session, &branch) {
                (Some(s), Some(b)) => Some(format!("{s} @{b}")),
                (s, _) => s.clone(),
            };
            if let Some(s) = &session {
                h.insert(SESSION, s.as_str());
            }
            let dedupe = match &branch {
                None => {
                    h.insert(ID, id);
                    format!("{id}/")
                }
                Some(b) => format!("{id}/{}", hex(b.as_bytes())),
            };
            h.insert("Nats-Msg-Id", dedupe.as_str());
            let copy = Message { branch, ..message.clone() };
            let payload = Bytes::from(record::encode_message(&copy));
            let subject = self.subject_for(session.as_deref());
            let ack = self.js.publish_with_headers(subject, h, payload).await;
            ack.map_err(|e| e.to_string())?.await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn subject_for(&self, session: Option<&str>) -> String {
        match session {
            None => self.subject.clone(),
            Some(s) => {
                let k = rondo_core::hash::hash_key(s.as_bytes()) % u64::from(self.partitions);
                format!("{}.p.{k}", self.subject)
            }
        }
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
        Box::pin(self.publish(message, session, None))
    }

    fn append_all(
        &self,
        copies: Vec<(Message, Option<String>)>,
    ) -> BoxFuture<'_, Result<Vec<String>, AppendError>> {
        Box::pin(async move {
            let mut copies = copies.into_iter();
            let Some((message, session)) = copies.next() else { return Ok(Vec::new()) };
            // One publish holds them all: a stream refuses it whole or keeps it whole. The
            // copies are made when it is first leased ([`Nats::split`]).
            let fanout: Vec<String> =
                copies.filter_map(|(m, _)| m.branch).map(|b| hex(b.as_bytes())).collect();
            let fanout = (!fanout.is_empty()).then(|| fanout.join(","));
            self.publish(message, session, fanout).await.map(|id| vec![id])
        })
    }

    fn next(&self) -> BoxFuture<'_, Result<Lease, QueueError>> {
        Box::pin(async move {
            loop {
                let (pulled, m) = {
                    let mut messages = self.messages.lock().await;
                    match messages.recv().await {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => return Err(QueueError::Store(e)),
                        None => return Err(QueueError::Store("the consumers closed".to_owned())),
                    }
                };
                if pulled.elapsed() > Duration::from_secs(1) {
                    // It waited for a free worker: its ack wait starts again now, so the server
                    // does not hand it to another router while this one delivers it.
                    let _ = m.ack_with(AckKind::Progress).await;
                }
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
                if let Some(fanout) = header(h, FANOUT).map(str::to_owned) {
                    let session = header(h, SESSION).map(str::to_owned);
                    match self.split(&id, accepted_ms, message, session, &fanout).await {
                        Ok(()) => {
                            let _ = m.double_ack().await;
                        }
                        Err(e) => {
                            tracing::warn!(queue = %self.spec.name, "message {id}: its multicast copies could not be made yet: {e}");
                            let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                        }
                    }
                    continue;
                }
                let tries = match self
                    .tries
                    .get_last_raw_message_by_subject(&self.tries_subject(&id))
                    .await
                {
                    Ok(m) => record::decode_tries(&m.payload).unwrap_or_default(),
                    Err(_) => Vec::new(),
                };
                // Attempts lost with a router (the server delivered, nobody recorded) count too.
                let attempts = (tries.len() as u32).max(delivered - 1);
                let key = self.next_key.fetch_add(1, Ordering::Relaxed);
                self.leased.lock().unwrap_or_else(|e| e.into_inner()).insert(key, m);
                return Ok(Lease { id, message, accepted_ms, attempts, tries, key });
            }
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
        QueueStats {
            name: self.spec.name.clone(),
            backend: "nats",
            depth: c.depth,
            in_delivery: c.in_delivery,
            dead_letters: c.dead,
            bytes: c.bytes + c.dead_bytes,
            oldest_age: c.oldest_ms.map(|t| Duration::from_millis(unix_ms().saturating_sub(t))),
            max_messages: self.spec.max_messages,
            max_bytes: self.spec.max_bytes,
            ..self.counters.stats()
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
                let subject = self.subject_for(d.summary.session.as_deref());
                let published =
                    self.js.publish_with_headers(subject, h, message).await.map_err(store_err)?;
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

/// `bytes` as lower-case hex (a branch's name in a header field, whatever it holds).
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The text [`hex`] made.
fn unhex(text: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}
