//! Tracing with OpenTelemetry (`[tracing]`, cargo feature `otel`): a server span for each
//! forwarded request and a client span for each of its tries, exported over OTLP/HTTP.
//!
//! [`Tracer`] is made once at start and kept in each listener's context as an `Option`: a router
//! without `[tracing]` looks at that `None` once per request and pays nothing else. With it,
//! the forward stage (`http/forward.rs`) opens a `ReqTrace` per request: its parent is
//! the client's W3C `traceparent` (and `tracestate`), sampling is the SDK's parent-based
//! sampler over a trace-id ratio (a sampled or unsampled parent keeps its decision; a new trace
//! is sampled at `sample_ratio`), each try gets a span of its own whose `traceparent` the codec
//! sends to the member, and each span ends as its try or request does. Finished spans leave
//! through `export.rs`'s bounded queue.

mod export;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderValue;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt as _, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span as SdkSpan, SpanExporter as _,
};
use rondo_config::TracingSpec;
use rondo_core::{MemberSpec, Route};
use rondo_runtime::metrics::Metrics;

use crate::error::Kind;
use crate::head::Headers;

/// The process's tracer: spans of every traced listener, one export queue.
#[derive(Debug)]
pub struct Tracer {
    tracer: SdkTracer,
    /// Kept so that the provider (and with it the export queue's sender) lives as long as the
    /// tracer; dropping both ends the export task once the queue is empty.
    _provider: SdkTracerProvider,
}

impl Tracer {
    /// Starts exporting as `spec` says: the exporter task is spawned on the current tokio
    /// runtime. Lost spans are counted in `metrics`.
    pub fn start(spec: &TracingSpec, metrics: Arc<Metrics>) -> Result<Tracer, String> {
        let headers: HashMap<String, String> = spec.headers.iter().cloned().collect();
        // hyper's client, not reqwest: the exporter shares the router's HTTP stack.
        let client = opentelemetry_http::hyper::HyperClient::with_default_connector(
            spec.export_timeout,
            None,
        );
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(spec.endpoint.clone())
            .with_timeout(spec.export_timeout)
            .with_headers(headers)
            .build()
            .map_err(|e| format!("tracing: the otlp exporter for {}: {e}", spec.endpoint))?;
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(spec.service_name.clone())
            .build();
        exporter.set_resource(&resource);
        let (tx, rx) = tokio::sync::mpsc::channel(spec.max_queue);
        tokio::spawn(export::run(exporter, rx, metrics.clone(), spec.endpoint.clone()));
        let ratio = Sampler::TraceIdRatioBased(spec.sample_ratio);
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(ratio)))
            .with_span_processor(export::Queue { tx, metrics })
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("rondo");
        Ok(Tracer { tracer, _provider: provider })
    }

    /// Opens the server span of a request to `route` from `peer`, a child of the request's
    /// `traceparent` when it has a valid one.
    pub(crate) fn request(
        &self,
        headers: &impl Headers,
        about: About<'_>,
        route: &Route,
        peer: SocketAddr,
    ) -> ReqTrace {
        let parent = match about.own_parent {
            true => Context::new(),
            false => TraceContextPropagator::new().extract(&Extract(headers)),
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", about.method.to_owned()),
            KeyValue::new("url.path", about.path.to_owned()),
            KeyValue::new("client.address", peer.ip().to_string()),
            KeyValue::new("rondo.route", route.name.clone()),
        ];
        if let Some(host) = about.host {
            let (name, port) = split_host(host);
            attributes.push(KeyValue::new("server.address", name.to_owned()));
            if let Some(port) = port {
                attributes.push(KeyValue::new("server.port", i64::from(port)));
            }
        }
        let server = self
            .tracer
            .span_builder(format!("{} {}", about.method, route.name))
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        let parent = Context::new().with_remote_span_context(server.span_context().clone());
        ReqTrace {
            tracer: self.tracer.clone(),
            server,
            parent,
            method: about.method.to_owned(),
            route: route.name.clone(),
            current: None,
            hedges: Vec::new(),
            last_failure: None,
        }
    }
}

/// The process's tracer when the configuration has `[tracing]` (`spec`), exporting already.
pub fn tracer(
    spec: Option<&TracingSpec>,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<Tracer>>, String> {
    spec.map(|s| Tracer::start(s, metrics.clone()).map(Arc::new)).transpose()
}

/// What the server span says about a request besides its headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct About<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    /// `Host` or `:authority`.
    pub(crate) host: Option<&'a str>,
    /// The request's `traceparent` is the router's own (`request_id` started it), not a parent.
    pub(crate) own_parent: bool,
}

/// A traced request: its server span and the span of the try in flight.
#[derive(Debug)]
pub(crate) struct ReqTrace {
    tracer: SdkTracer,
    server: SdkSpan,
    /// The server span as the tries' parent.
    parent: Context,
    method: String,
    route: String,
    current: Option<SdkSpan>,
    /// The spans of hedged tries running beside `current` (`retry.hedge`).
    hedges: Vec<SdkSpan>,
    /// Why the last try failed: the next try's retry reason.
    last_failure: Option<&'static str>,
}

impl ReqTrace {
    /// Opens the span of try number `tries` (1 for the first) on `member` of `cluster`; the
    /// `traceparent` the member gets, naming that span.
    pub(crate) fn try_begins(
        &mut self,
        cluster: &str,
        member: &MemberSpec,
        tries: u32,
    ) -> Option<HeaderValue> {
        let mut attributes = self.try_attributes(cluster, member);
        if tries > 1 {
            attributes.push(KeyValue::new("http.request.resend_count", i64::from(tries - 1)));
            if let Some(why) = self.last_failure {
                attributes.push(KeyValue::new("rondo.retry.reason", why));
            }
        }
        if let Some(mut left) = self.current.take() {
            left.end();
        }
        let (span, value) = self.client_span(attributes);
        self.current = Some(span);
        value
    }

    /// What every try's span says: the request's method and route, the member and its cluster.
    fn try_attributes(&self, cluster: &str, member: &MemberSpec) -> Vec<KeyValue> {
        let (host, port) = split_host(&member.address);
        let mut attributes = vec![
            KeyValue::new("http.request.method", self.method.clone()),
            KeyValue::new("server.address", host.to_owned()),
            KeyValue::new("rondo.route", self.route.clone()),
            KeyValue::new("rondo.cluster", cluster.to_owned()),
            KeyValue::new("rondo.member", member.name.clone()),
        ];
        if let Some(port) = port {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        attributes
    }

    /// A try's span with `attributes`, a child of the server span, and the `traceparent`
    /// naming it.
    fn client_span(&self, attributes: Vec<KeyValue>) -> (SdkSpan, Option<HeaderValue>) {
        let span = self
            .tracer
            .span_builder(self.method.clone())
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.parent);
        let value = traceparent(span.span_context());
        (span, value)
    }

    /// Opens the span of a hedge on `member` of `cluster`, beside the try in flight (which
    /// goes on); the `traceparent` its member gets.
    pub(crate) fn hedge_begins(
        &mut self,
        cluster: &str,
        member: &MemberSpec,
    ) -> Option<HeaderValue> {
        let mut attributes = self.try_attributes(cluster, member);
        attributes.push(KeyValue::new("rondo.retry.reason", "hedge"));
        let (span, value) = self.client_span(attributes);
        self.hedges.push(span);
        value
    }

    /// A hedged race is over: the try numbered `winner` (0 the first, then the hedges in the
    /// order they began) gave the outcome and becomes the try in flight; every other try's span
    /// ends, lost (cancelled, or failed before the race ended).
    pub(crate) fn hedges_end(&mut self, winner: usize) {
        let mut hedges = std::mem::take(&mut self.hedges);
        if let Some(i) = winner.checked_sub(1).filter(|i| *i < hedges.len()) {
            let won = hedges.remove(i);
            hedges.extend(self.current.replace(won));
        }
        for mut span in hedges {
            span.set_attribute(KeyValue::new("rondo.hedge.lost", true));
            span.end();
        }
    }

    /// The try in flight was answered with `status` (when the codec knows it): its span ends.
    pub(crate) fn try_answered(&mut self, status: Option<u16>) {
        if let Some(mut span) = self.current.take() {
            if let Some(s) = status {
                span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
                if s >= 400 {
                    span.set_status(Status::error(format!("status {s}")));
                }
            }
            span.end();
        }
    }

    /// The try in flight failed with `kind`: its span ends as an error, and the next try, if
    /// any, names the failure as its retry reason.
    pub(crate) fn try_failed(&mut self, kind: Kind) {
        let reason = reason(kind);
        self.last_failure = Some(reason);
        if let Some(mut span) = self.current.take() {
            span.set_attribute(KeyValue::new("error.type", reason));
            span.set_status(Status::error(kind.describe()));
            span.end();
        }
    }

    /// The request is over: answered with `status` (`failed` when the router answered it
    /// itself). Every span still open ends.
    pub(crate) fn end(mut self, status: Option<u16>, failed: Option<Kind>) {
        if let Some(mut span) = self.current.take() {
            span.end();
        }
        let server = &mut self.server;
        if let Some(kind) = failed {
            server.set_attribute(KeyValue::new("error.type", reason(kind)));
        }
        let Some(status) = status else { return server.end() };
        server.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
        if status >= 500 {
            server.set_status(Status::error(format!("status {status}")));
        }
        server.end();
    }
}

/// A short name of a try's failure (`error.type`, `rondo.retry.reason`), in the words of
/// `retry_on` where it has them.
fn reason(kind: Kind) -> &'static str {
    match kind {
        Kind::Connect => "connect-failure",
        Kind::Resolve => "resolve-failure",
        Kind::Reset => "reset",
        Kind::Timeout => "timeout",
        Kind::Declined => "retriable-status",
        Kind::BadStatus => "bad-status",
        Kind::BadBody => "bad-body",
        Kind::Tls(_) => "tls",
        Kind::Replay => "replay",
        Kind::Breaker(_) => "circuit-breaker",
        Kind::NoEligible => "no-eligible-member",
        Kind::BodyTooLarge | Kind::ClientBody | Kind::ClientBodyTimeout => "client-body",
        _ => "other",
    }
}

/// `traceparent` (version 00) naming the span of `cx`.
fn traceparent(cx: &SpanContext) -> Option<HeaderValue> {
    let flags = cx.trace_flags().to_u8();
    let v = format!("00-{}-{}-{flags:02x}", cx.trace_id(), cx.span_id());
    HeaderValue::try_from(v).ok()
}

/// `host:port` or `[v6]:port` into the host and the port, when there is one.
fn split_host(s: &str) -> (&str, Option<u16>) {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => {
            match port.parse() {
                Ok(p) => (host.trim_start_matches('[').trim_end_matches(']'), Some(p)),
                Err(_) => (s, None),
            }
        }
        _ => (s, None),
    }
}

/// A request's header fields as the W3C propagator reads them.
struct Extract<'a, H>(&'a H);

impl<H: Headers> Extractor for Extract<'_, H> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get_str(key)
    }

    fn keys(&self) -> Vec<&str> {
        // Asked only by propagators that take every field (baggage); trace context names its two.
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_ports_split() {
        assert_eq!(split_host("10.0.0.1:80"), ("10.0.0.1", Some(80)));
        assert_eq!(split_host("[::1]:8080"), ("::1", Some(8080)));
        assert_eq!(split_host("example.com"), ("example.com", None));
        assert_eq!(split_host("::1"), ("::1", None));
        assert_eq!(split_host("h:x"), ("h:x", None));
    }
}
