//! Tracing with OpenTelemetry (issue 38 item 8, feature `otel`): a real `rondo serve` exports
//! its spans over OTLP/HTTP to a receiver built here from the official protobufs
//! (`opentelemetry-proto`; no collector can be installed from the package registries), on a
//! real hyper listener on 127.0.0.1. Members are real HTTP servers that record the
//! `traceparent` they get; clients are a raw HTTP/1.1 socket and curl over h2c.
//!
//! Checked: one server span per request and one client span per try, with their attributes;
//! the client's trace kept and the spans chained; the member's `traceparent` naming its try's
//! span; a retried request's two tries with the retry reason; sampling by ratio and by parent;
//! failed exports counted as dropped spans.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Proc, TempDir};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

/// A span as the receiver decoded it, with its resource's `service.name`.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, String>,
    error: bool,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// Something that runs on a tokio runtime of its own thread while it lives (the tests drive
/// `rondo serve` with blocking calls).
struct Served<T> {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<T>>>,
    _rt: tokio::runtime::Runtime,
}

/// Serves `answer` over HTTP/1.1 and h2c on a free loopback port, recording what it returns.
fn serve<T, F>(answer: F) -> Served<T>
where
    T: Send + 'static,
    F: Fn(http::request::Parts, Bytes) -> (T, Response<Full<Bytes>>) + Send + Sync + 'static,
{
    serve_after(Duration::ZERO, answer)
}

/// [`serve`], each answer given `delay` after its request arrived (and was recorded).
fn serve_after<T, F>(delay: Duration, answer: F) -> Served<T>
where
    T: Send + 'static,
    F: Fn(http::request::Parts, Bytes) -> (T, Response<Full<Bytes>>) + Send + Sync + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener =
        rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind a loopback port");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (answer, log) = (Arc::new(answer), seen.clone());
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (answer, log) = (answer.clone(), log.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let (record, resp) = answer(parts, body);
                        log.lock().unwrap().push(record);
                        tokio::time::sleep(delay).await;
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Served { addr, seen, _rt: rt }
}

/// The OTLP/HTTP receiver: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`.
fn receiver() -> Served<Vec<Got>> {
    serve(|parts, body| {
        assert_eq!(parts.uri.path(), "/v1/traces");
        assert_eq!(parts.method, http::Method::POST);
        let kind = parts.headers.get("content-type").and_then(|v| v.to_str().ok());
        assert_eq!(kind, Some("application/x-protobuf"));
        let auth = parts.headers.get("x-collector-key").and_then(|v| v.to_str().ok());
        assert_eq!(auth, Some("k123"), "the configured headers are sent");
        let req = ExportTraceServiceRequest::decode(body).expect("a valid export request");
        let answer = ExportTraceServiceResponse::default().encode_to_vec();
        let resp = Response::builder()
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::from(answer)))
            .unwrap();
        (decode(req), resp)
    })
}

fn decode(req: ExportTraceServiceRequest) -> Vec<Got> {
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let resource = rs.resource.unwrap_or_default();
        let service = resource
            .attributes
            .iter()
            .find(|a| a.key == "service.name")
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
            out.push(Got {
                service: service.clone(),
                name: span.name,
                kind: span.kind,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent: hex(&span.parent_span_id),
                attributes: span
                    .attributes
                    .iter()
                    .map(|a| (a.key.clone(), text(&a.value)))
                    .collect(),
                error: span.status.is_some_and(|s| s.code == 2),
            });
        }
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A member answering 200 with its name, recording each request's path and `traceparent`.
fn member(name: &'static str) -> Served<(String, Option<String>)> {
    member_after(name, Duration::ZERO)
}

/// [`member`], answering `delay` after each request arrived.
fn member_after(name: &'static str, delay: Duration) -> Served<(String, Option<String>)> {
    serve_after(delay, move |parts, _| {
        let tp = parts.headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let resp = Response::new(Full::new(Bytes::from(name)));
        ((parts.uri.path().to_owned(), tp), resp)
    })
}

impl Served<Vec<Got>> {
    /// Every span received so far.
    fn spans(&self) -> Vec<Got> {
        self.seen.lock().unwrap().iter().flatten().cloned().collect()
    }

    /// The spans received once `done` holds for them (15 s at most).
    fn wait(&self, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "spans did not arrive; got {spans:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The spans of requests to `path`: (server spans, client spans).
fn of_path(spans: &[Got], path: &str) -> (Vec<Got>, Vec<Got>) {
    let servers: Vec<Got> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32 && s.attr("url.path") == Some(path))
        .cloned()
        .collect();
    let ids: Vec<&str> = servers.iter().map(|s| s.span_id.as_str()).collect();
    let clients = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32 && ids.contains(&s.parent.as_str()))
        .cloned()
        .collect();
    (servers, clients)
}

/// `rondo serve` with `config`, and its `web` listener's address.
fn rondo(dir: &Path, config: &str) -> (Proc, SocketAddr) {
    let path = dir.join("rondo.toml");
    std::fs::write(&path, config).expect("write config");
    let mut p =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    let web = p.addr_after("rondo: listener web on ");
    (p, web)
}

/// A config with `[tracing]` (`extra` lines in it) exporting to `collector`, and routes:
/// `/retry` to a cluster of one dead member backed by `good`, `/ids` to `good` with a
/// `request_id` filter (which starts a trace of its own), anything else to `good`.
fn config(collector: SocketAddr, extra: &str, good: SocketAddr) -> String {
    let dead = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    format!(
        "[tracing]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"edge-test\"\n\
         headers = {{ x-collector-key = \"k123\" }}\n{extra}\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"retried\"\nlistener = \"web\"\nmatch = {{ path_prefix = \"/retry\" }}\n\
         cluster = \"dead\"\nbackups = [\"app\"]\n\n\
         [[route]]\nname = \"ids\"\nlistener = \"web\"\nmatch = {{ path_prefix = \"/ids\" }}\n\
         cluster = \"app\"\nfilters = [{{ request_id = {{}} }}]\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"app\"\n\n\
         [cluster.dead]\nmembers = [{{ name = \"gone\", address = \"{dead}\" }}]\n\n\
         [cluster.app]\nmembers = [{{ name = \"good\", address = \"{good}\" }}]\n"
    )
}

/// An HTTP/1.1 GET of `path` with `extra` header lines: the status.
fn h1(web: SocketAddr, path: &str, extra: &str) -> u16 {
    common::request_with(web, "GET", path, extra, b"").0
}

/// A GET of `path` by curl over h2c (HTTP/2 prior knowledge) with `headers`: the status.
fn h2c(web: SocketAddr, path: &str, headers: &[&str]) -> u16 {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "--max-time", "10"]);
    cmd.arg("--http2-prior-knowledge");
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(format!("http://{web}{path}")).output().expect("run curl");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, version) = out.split_once(' ').expect("curl's status and version");
    assert_eq!(version, "2", "h2c: {out}");
    status.parse().expect("a status")
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[test]
fn requests_and_tries_are_spans_chained_to_the_clients_trace_on_both_codecs() {
    let dir = TempDir::new("tracing");
    let (collector, good) = (receiver(), member("good"));
    let (_p, web) = rondo(&dir.0, &config(collector.addr, "", good.addr));

    let incoming = format!("traceparent: 00-{TRACE}-{PARENT}-01\r\ntracestate: vendor=x\r\n");
    assert_eq!(h1(web, "/h1?q=1", &incoming), 200);
    assert_eq!(h2c(web, "/h2", &[&format!("traceparent: 00-{TRACE}-{PARENT}-01")]), 200);
    assert_eq!(h1(web, "/root", ""), 200);

    let spans = collector.wait(|s| {
        ["/h1", "/h2", "/root"].iter().all(|p| {
            let (servers, clients) = of_path(s, p);
            servers.len() == 1 && clients.len() == 1
        })
    });
    let seen = good.seen.lock().unwrap().clone();
    for path in ["/h1", "/h2", "/root"] {
        let (servers, clients) = of_path(&spans, path);
        let (server, client) = (&servers[0], &clients[0]);
        assert_eq!(server.service, "edge-test");
        assert_eq!(server.name, "GET main");
        assert_eq!(server.attr("http.request.method"), Some("GET"));
        assert_eq!(server.attr("http.response.status_code"), Some("200"));
        assert_eq!(server.attr("rondo.route"), Some("main"));
        assert!(server.attr("server.address").is_some(), "{server:?}");
        assert!(!server.error);
        if path == "/root" {
            // No parent: a new trace, sampled at the default ratio of 1.
            assert!(server.parent.is_empty(), "{server:?}");
            assert_ne!(server.trace_id, TRACE);
        } else {
            assert_eq!(server.trace_id, TRACE, "the client's trace is kept");
            assert_eq!(server.parent, PARENT, "the client's span is the parent");
        }
        assert_eq!(client.trace_id, server.trace_id);
        assert_eq!(client.parent, server.span_id);
        assert_eq!(client.attr("rondo.cluster"), Some("app"));
        assert_eq!(client.attr("rondo.member"), Some("good"));
        assert_eq!(client.attr("rondo.route"), Some("main"));
        assert_eq!(client.attr("server.address"), Some("127.0.0.1"));
        assert_eq!(client.attr("http.response.status_code"), Some("200"));
        assert_eq!(client.attr("rondo.retry.reason"), None);
        // The member got one traceparent, naming the try's span.
        let expected = format!("00-{}-{}-01", client.trace_id, client.span_id);
        let got: Vec<_> = seen.iter().filter(|(p, _)| p == path).collect();
        assert_eq!(got.len(), 1, "{seen:?}");
        assert_eq!(got[0].1.as_deref(), Some(&*expected), "{path}");
    }
}

#[test]
fn a_retried_request_has_a_span_per_try_with_the_retry_reason() {
    let dir = TempDir::new("tracing");
    let (collector, good) = (receiver(), member("good"));
    let (_p, web) = rondo(&dir.0, &config(collector.addr, "", good.addr));
    assert_eq!(h1(web, "/retry", ""), 200);
    assert_eq!(h2c(web, "/retry-h2", &[]), 200);
    let spans =
        collector.wait(|s| ["/retry", "/retry-h2"].iter().all(|p| of_path(s, p).1.len() == 2));
    let seen = good.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for path in ["/retry", "/retry-h2"] {
        retried(&spans, path, &seen);
    }
}

/// A hedged request (`retry.hedge`) has a span for each try side by side: the hedge's names
/// its reason, the loser's says it lost, and the member that answered got its own try's span.
#[test]
fn a_hedged_request_has_a_span_for_each_try_side_by_side() {
    let dir = TempDir::new("tracing");
    let (collector, good) = (receiver(), member("good"));
    let slow = member_after("slow", Duration::from_millis(400));
    let config = format!(
        "[tracing]\notlp_endpoint = \"http://{}\"\nheaders = {{ x-collector-key = \"k123\" }}\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"app\"\n\n\
         [cluster.app]\nalgorithm = \"round-robin\"\n\
         retry = {{ hedge = {{ after = \"50ms\", max = 1 }} }}\n\
         members = [{{ name = \"slow\", address = \"{}\" }}, {{ name = \"good\", address = \"{}\" }}]\n",
        collector.addr, slow.addr, good.addr
    );
    let (_p, web) = rondo(&dir.0, &config);
    // Round robin: one of the two starts on the slow member, and is hedged.
    let paths = ["/hedge-0", "/hedge-1"];
    for path in paths {
        assert_eq!(h1(web, path, ""), 200);
    }
    let hedged =
        slow.seen.lock().unwrap().first().expect("a first try on the slow member").0.clone();
    let spans = collector.wait(|s| of_path(s, &hedged).1.len() == 2);
    let (servers, tries) = of_path(&spans, &hedged);
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].attr("http.response.status_code"), Some("200"));
    let lost = tries.iter().find(|t| t.attr("rondo.member") == Some("slow")).expect("the slow try");
    let won = tries.iter().find(|t| t.attr("rondo.member") == Some("good")).expect("the hedge");
    assert_eq!(lost.attr("rondo.hedge.lost"), Some("true"), "{lost:?}");
    assert_eq!(lost.attr("http.response.status_code"), None, "{lost:?}");
    assert_eq!(won.attr("rondo.retry.reason"), Some("hedge"), "{won:?}");
    assert_eq!(won.attr("http.response.status_code"), Some("200"), "{won:?}");
    assert_eq!(won.attr("rondo.hedge.lost"), None, "{won:?}");
    // Each member got the traceparent of its own try's span.
    let expected = |t: &Got| Some(format!("00-{}-{}-01", t.trace_id, t.span_id));
    let got = |m: &Served<(String, Option<String>)>| {
        m.seen.lock().unwrap().iter().find(|(p, _)| *p == hedged).map(|(_, tp)| tp.clone())
    };
    assert_eq!(got(&good), Some(expected(won)), "the good member's traceparent");
    assert_eq!(got(&slow), Some(expected(lost)), "the slow member's traceparent");
}

/// The two tries of the request to `path`: a connect failure, then the backup's answer.
fn retried(spans: &[Got], path: &str, seen: &[(String, Option<String>)]) {
    let (servers, mut tries) = of_path(spans, path);
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].attr("rondo.route"), Some("retried"));
    tries.sort_by_key(|t| t.attr("http.request.resend_count").is_some());
    let (first, second) = (&tries[0], &tries[1]);
    assert_eq!(first.attr("rondo.cluster"), Some("dead"));
    assert_eq!(first.attr("rondo.member"), Some("gone"));
    assert_eq!(first.attr("error.type"), Some("connect-failure"));
    assert!(first.error, "a failed try is an error span");
    assert_eq!(second.attr("rondo.cluster"), Some("app"));
    assert_eq!(second.attr("rondo.member"), Some("good"));
    assert_eq!(second.attr("rondo.retry.reason"), Some("connect-failure"));
    assert_eq!(second.attr("http.request.resend_count"), Some("1"));
    assert_eq!(second.attr("http.response.status_code"), Some("200"));
    // The member got the second try's span.
    let expected = format!("00-{}-{}-01", second.trace_id, second.span_id);
    assert!(seen.contains(&(path.to_owned(), Some(expected))), "{path}: {seen:?}");
}

#[test]
fn ratio_zero_samples_no_new_trace_but_a_sampled_parent_is_traced() {
    let dir = TempDir::new("tracing");
    let (collector, good) = (receiver(), member("good"));
    let (_p, web) = rondo(&dir.0, &config(collector.addr, "sample_ratio = 0.0", good.addr));
    let unsampled = format!("traceparent: 00-{TRACE}-{PARENT}-00\r\n");
    let sampled = format!("traceparent: 00-{TRACE}-{PARENT}-01\r\n");
    // Spans leave in the order they end: once the last request's arrived, any of the first
    // two's would have too.
    assert_eq!(h1(web, "/new", ""), 200);
    assert_eq!(h2c(web, "/unsampled", &[unsampled.trim_end()]), 200);
    assert_eq!(h1(web, "/sampled", &sampled), 200);
    let spans = collector.wait(|s| of_path(s, "/sampled").1.len() == 1);
    let paths: Vec<_> = spans.iter().filter_map(|s| s.attr("url.path")).collect();
    assert_eq!(paths, ["/sampled"], "only the sampled parent's request: {spans:#?}");
    assert_eq!(spans.len(), 2, "its server and client spans: {spans:#?}");
    // Unsampled requests still carry the trace on, marked unsampled.
    let seen = good.seen.lock().unwrap().clone();
    for (path, tp) in &seen {
        let tp = tp.as_deref().unwrap_or_else(|| panic!("{path} got no traceparent"));
        let flags = if path == "/sampled" { "-01" } else { "-00" };
        assert!(tp.ends_with(flags), "{path}: {tp}");
        if path != "/new" {
            assert!(tp.starts_with(&format!("00-{TRACE}-")), "{path}: {tp}");
            assert!(!tp.contains(PARENT), "{path}: the try's own span: {tp}");
        }
    }
    assert_eq!(seen.len(), 3);
}

#[test]
fn spans_a_collector_does_not_take_are_counted_as_dropped() {
    let dir = TempDir::new("tracing");
    let good = member("good");
    // Nobody listens at the endpoint: every export fails.
    let nobody = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let token = "trace-test-token-0123456789";
    let admin = format!(
        "export_timeout = \"1s\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n"
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config(nobody, &admin, good.addr)).expect("write config");
    let mut p = Proc::start(&["serve", "--config", path.to_str().unwrap(), "--workers", "1"]);
    let web = p.addr_after("rondo: listener web on ");
    let admin = p.addr_after("rondo: admin API on ");
    assert_eq!(h1(web, "/x", ""), 200);
    let auth = format!("Authorization: Bearer {token}\r\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = common::request_with(admin, "GET", "/metrics", &auth, b"");
        assert_eq!(status, 200);
        let line = "rondo_trace_spans_dropped_total{reason=\"export_failed\"} 2";
        if body.lines().any(|l| l == line) {
            break;
        }
        assert!(Instant::now() < deadline, "no dropped spans counted:\n{body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_trace_request_id_started_is_no_parent_on_either_codec() {
    let dir = TempDir::new("tracing");
    let (collector, good) = (receiver(), member("good"));
    let (_p, web) = rondo(&dir.0, &config(collector.addr, "", good.addr));
    // No traceparent from the client: `request_id` starts an unsampled one, which must not
    // keep `[tracing]` (ratio 1) from recording the request as a new trace.
    assert_eq!(h1(web, "/ids-h1", ""), 200);
    assert_eq!(h2c(web, "/ids-h2", &[]), 200);
    let spans =
        collector.wait(|s| ["/ids-h1", "/ids-h2"].iter().all(|p| of_path(s, p).1.len() == 1));
    let seen = good.seen.lock().unwrap().clone();
    for path in ["/ids-h1", "/ids-h2"] {
        let (servers, clients) = of_path(&spans, path);
        assert!(servers[0].parent.is_empty(), "{path}: a root span: {:?}", servers[0]);
        assert_eq!(servers[0].attr("rondo.route"), Some("ids"));
        let expected = format!("00-{}-{}-01", clients[0].trace_id, clients[0].span_id);
        assert!(seen.contains(&(path.to_owned(), Some(expected))), "{path}: {seen:?}");
    }
}

#[test]
fn a_throttling_collector_never_stalls_requests() {
    // A collector that answers every export `503 Retry-After: 20`: the exporter waits 20 s
    // before its retry. That wait must be a timer's, not a sleep of the runtime's thread: with
    // one worker, a sleeping thread would leave every request unanswered for those 20 s. And
    // spans that end meanwhile wait in the bounded queue or are dropped and counted.
    let collector = serve(|_, _| {
        let resp = Response::builder()
            .status(503)
            .header("retry-after", "20")
            .body(Full::new(Bytes::new()))
            .unwrap();
        ((), resp)
    });
    let dir = TempDir::new("tracing");
    let good = member("good");
    let token = "trace-test-token-0123456789";
    let extra = format!(
        "export_timeout = \"60s\"\nmax_queue = 2\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n"
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, config(collector.addr, &extra, good.addr)).expect("write config");
    let mut p = Proc::start(&["serve", "--config", path.to_str().unwrap(), "--workers", "1"]);
    let web = p.addr_after("rondo: listener web on ");
    let admin = p.addr_after("rondo: admin API on ");
    assert_eq!(h1(web, "/first", ""), 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    while collector.seen.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no export came");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The exporter is now waiting out the Retry-After.
    std::thread::sleep(Duration::from_millis(300));
    for path in ["/second", "/third"] {
        let mut s = std::net::TcpStream::connect(web).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        use std::io::{Read as _, Write as _};
        let head = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).expect("send");
        let mut answer = Vec::new();
        let read = s.read_to_end(&mut answer);
        assert!(read.is_ok(), "{path} unanswered within 5 s while the exporter waits: {read:?}");
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
    }
    // Meanwhile the queue (`max_queue = 2`) took the second request's two spans; the third
    // request's two were dropped, not waited for.
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (status, body) = common::request_with(admin, "GET", "/metrics", &auth, b"");
    assert_eq!(status, 200);
    let line = "rondo_trace_spans_dropped_total{reason=\"queue_full\"} 2";
    assert!(body.lines().any(|l| l == line), "no `{line}` in:\n{body}");
}
