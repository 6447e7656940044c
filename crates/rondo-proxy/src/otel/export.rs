//! The way out of finished spans: the SDK hands each to [`Queue`] as it ends, which puts it in
//! a bounded channel without waiting (a full channel drops it and counts it in
//! `rondo_trace_spans_dropped_total{reason="queue_full"}`); a task of its own ([`run`]) takes
//! them out in batches and posts each batch with opentelemetry-otlp's OTLP/HTTP protobuf
//! exporter, over opentelemetry-http's hyper client. A request never waits for an export.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _, SpanProcessor};
use rondo_runtime::metrics::Metrics;
use tokio::sync::mpsc;

/// Most spans in one export request (the SDK's batch processor's default).
pub(super) const MAX_BATCH: usize = 512;

/// How long a batch waits for more spans after its first (the SDK's default is 5 s; a shorter
/// one keeps traces fresh at the cost of a few more, smaller, posts).
pub(super) const BATCH_DELAY: Duration = Duration::from_millis(500);

/// The processor the tracer provider hands finished spans to.
#[derive(Debug)]
pub(super) struct Queue {
    pub(super) tx: mpsc::Sender<SpanData>,
    pub(super) metrics: Arc<Metrics>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        // Never waits: a full queue (or a stopped exporter) loses the span, counted.
        if self.tx.try_send(span).is_err() {
            self.metrics.trace_dropped("queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Exports the spans of `rx` in batches of up to [`MAX_BATCH`], each sent once it is full or
/// [`BATCH_DELAY`] after its first span; ends when every sender is gone and the queue is empty.
/// A failed export is logged (once per streak of failures) and its spans counted as dropped.
pub(super) async fn run(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
    metrics: Arc<Metrics>,
    endpoint: String,
) {
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::with_capacity(MAX_BATCH.min(rx.len() + 1));
        batch.push(first);
        let until = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        match exporter.export(batch).await {
            Ok(()) => {
                if failing {
                    tracing::info!(endpoint = %endpoint, "tracing: exports succeed again");
                }
                failing = false;
                metrics.trace_exported(n);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(endpoint = %endpoint, error = %e, "tracing: an export of {n} spans failed; spans are dropped until exports succeed again");
                }
                failing = true;
                metrics.trace_dropped("export_failed", n);
            }
        }
    }
}
