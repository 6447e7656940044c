//! The NATS store's JetStream layout: the queue's main stream (checked against this router's
//! `session_partitions`) and its durable consumers, made or opened at connect, and the tasks
//! that pump their messages to the delivery workers and poll the server's counts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use rondo_config::QueueSpec;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Cached, Pulled};

/// The queue's main stream, created or opened, and the store's id (from the stream's creation
/// time); a stream made with another `session_partitions` is refused. Errors: what failed and
/// why.
pub(super) async fn main_stream(
    js: &jetstream::Context,
    spec: &QueueSpec,
    subject: &str,
    partitions: u32,
) -> Result<(stream::Stream, u32), (String, String)> {
    let name = &spec.name;
    let stream_name = format!("RONDO_Q_{name}");
    let description = format!("rondo queue {name}, session_partitions = {partitions}");
    let mut main = js
        .get_or_create_stream(stream::Config {
            name: stream_name.clone(),
            description: Some(description.clone()),
            subjects: vec![subject.to_owned(), format!("{subject}.p.*")],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::New,
            max_messages: i64::try_from(spec.max_messages).unwrap_or(i64::MAX),
            max_bytes: i64::try_from(spec.max_bytes).unwrap_or(i64::MAX),
            ..Default::default()
        })
        .await
        .map_err(|e| ("stream".to_owned(), e.to_string()))?;
    let info = main.info().await.map_err(|e| ("stream info".to_owned(), e.to_string()))?;
    if info.config.description.as_deref() != Some(description.as_str()) {
        // Another number would put a key's messages on two subjects, ordered by neither.
        return Err((
            format!("stream {stream_name}"),
            format!(
                "it was made as `{}`, this router's config says `{description}`: every \
                 router of a tier must name the same session_partitions (to change it, \
                 let the queue drain and delete the stream)",
                info.config.description.as_deref().unwrap_or("(no description)")
            ),
        ));
    }
    let created = info.created;
    let uid =
        rondo_core::hash::hash_key(format!("{name}/{}", created.unix_timestamp_nanos()).as_bytes())
            as u32;
    Ok((main, uid))
}

/// The main stream's consumers and the tasks pumping their messages.
type Consumers = (Vec<consumer::PullConsumer>, Vec<tokio::task::JoinHandle<()>>);

/// The durable consumers of the main stream (`rondo` for messages without a session key, one
/// `rondo-pK` per session partition, one message at a time), each with a task pumping its
/// messages into `tx`. Errors: what failed and why.
pub(super) async fn consumers(
    main: &stream::Stream,
    spec: &QueueSpec,
    subject: &str,
    partitions: u32,
    tx: &mpsc::Sender<Pulled>,
) -> Result<Consumers, (String, String)> {
    let (mut consumers, mut pumps) = (Vec::new(), Vec::new());
    let wanted = std::iter::once(("rondo".to_owned(), subject.to_owned(), None)).chain(
        (0..partitions).map(|k| (format!("rondo-p{k}"), format!("{subject}.p.{k}"), Some(1))),
    );
    for (durable, filter, max_ack_pending) in wanted {
        let consumer: consumer::PullConsumer = main
            .get_or_create_consumer(
                &durable,
                consumer::pull::Config {
                    durable_name: Some(durable.clone()),
                    filter_subject: filter,
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: spec.lease + Duration::from_secs(5),
                    max_deliver: -1,
                    max_ack_pending: max_ack_pending.unwrap_or_default(),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| (format!("consumer {durable}"), e.to_string()))?;
        let batch = if max_ack_pending.is_some() { 1 } else { spec.concurrency as usize };
        let messages = consumer
            .stream()
            .max_messages_per_batch(batch)
            .messages()
            .await
            .map_err(|e| (format!("consumer {durable} messages"), e.to_string()))?;
        pumps.push(tokio::spawn(pump(messages, tx.clone())));
        consumers.push(consumer);
    }
    Ok((consumers, pumps))
}

/// Hands what `messages` pulls to the delivery workers, until they are gone.
async fn pump(mut messages: consumer::pull::Stream, tx: mpsc::Sender<Pulled>) {
    while let Some(m) = messages.next().await {
        let pulled = m.map(|m| (Instant::now(), m)).map_err(|e| e.to_string());
        if tx.send(pulled).await.is_err() {
            return;
        }
    }
    let _ = tx.send(Err("a consumer closed".to_owned())).await;
}

/// Refreshes the figures every 500 ms (the server's counts: tier-wide).
pub(super) async fn poll(
    mut main: stream::Stream,
    mut dlq: stream::Stream,
    mut consumers: Vec<consumer::PullConsumer>,
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
        let mut in_delivery = Some(0);
        for consumer in &mut consumers {
            in_delivery = match consumer.info().await {
                Ok(i) => in_delivery.map(|n| n + i.num_ack_pending as u64),
                Err(_) => None,
            };
        }
        if let Some(n) = in_delivery {
            c.in_delivery = n;
        }
        *cached.lock().unwrap_or_else(|e| e.into_inner()) = c;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
