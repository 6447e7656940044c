//! Access logs (`[[listener]] access_log`): one line per request, text (`key=value`) or JSON,
//! with the time, client, method, path, route, cluster, member, status, body bytes in and out,
//! duration, tries and the pick's reason.
//!
//! The request path never waits for the log: when a response is over (its last body frame
//! passed, or the client went away) its [`Entry`] goes into a bounded channel with `try_send`;
//! when the channel is full the line is dropped and counted (`rondo_access_log_dropped_total`).
//! A writer thread of its own (file writes block, so not a runtime worker) formats the lines and
//! writes them through a 64 KiB buffer, flushing whenever the channel is empty. While lines keep
//! coming it naps [`BATCH_PAUSE`] between batches instead of blocking on the channel, so that
//! senders do not have to wake it for every line: a line reaches the file within about that
//! pause, and a burst costs one wake-up rather than one per request. [`reopen_all`] (SIGHUP)
//! makes every writer reopen its file before its next line, for log rotation.

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use http::uri::PathAndQuery;
use http::{Method, Request};
use rondo_config::access_format::AccessField;
use rondo_config::{AccessLogSpec, AccessLogTarget, LogFormat};
use rondo_core::{Algorithm, ClusterSpec, Why};
use rondo_runtime::metrics::{Counter, RouteMetrics};

pub use crate::access_fields::{Extra, Layout, Scratch};
use crate::access_fields::{
    Fields, Kept, Value, fields_line, micros32, push_addr, push_padded, push_u64, template_line,
    value,
};
use crate::error::ProxyError;

/// Lines waiting for the writer, per access log; more are dropped and counted. About 1 MiB.
pub const CAPACITY: usize = 4096;

/// How long the writer naps between batches while lines keep coming.
pub const BATCH_PAUSE: Duration = Duration::from_millis(10);

/// A listener's access log: the sending side of the writer's channel (cheap to clone).
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: SyncSender<Entry>,
    dropped: Counter,
    /// The layout names facts a request records only for it ([`Extra`]).
    extra: bool,
}

impl AccessLog {
    /// Opens `spec`'s target (a file is created if missing and appended to) and starts its
    /// writer thread; lines dropped when it falls behind are counted in `dropped`.
    pub fn open(listener: &str, spec: &AccessLogSpec, dropped: Counter) -> io::Result<AccessLog> {
        let out = match &spec.target {
            AccessLogTarget::Stdout => Output { out: Box::new(io::stdout()), path: None },
            AccessLogTarget::File(path) => {
                let file = open_append(path).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "listener {listener}: cannot open access log {}: {e}",
                            path.display()
                        ),
                    )
                })?;
                Output { out: Box::new(file), path: Some(path.clone()) }
            }
        };
        let (mut log, rx) = AccessLog::channel(CAPACITY, dropped);
        let layout = Layout::of(spec);
        log.extra = layout.needs_extra();
        let name = listener.to_owned();
        std::thread::Builder::new()
            .name(format!("access-log-{listener}"))
            .spawn(move || write_lines(&rx, out, &layout, &name))?;
        Ok(log)
    }

    /// An access log whose lines wait in a channel of `capacity` for whoever reads `Receiver`.
    fn channel(capacity: usize, dropped: Counter) -> (AccessLog, Receiver<Entry>) {
        let (tx, rx) = mpsc::sync_channel(capacity);
        (AccessLog { tx, dropped, extra: false }, rx)
    }

    /// Hands `entry` to the writer, or drops and counts it when the writer is behind; never
    /// waits.
    fn send(&self, entry: Entry) {
        match self.tx.try_send(entry) {
            Ok(()) => {}
            // A writer that stopped (its output failed for good) drops lines just the same.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }
}

/// What an access log line knows when the request arrives.
#[derive(Debug)]
pub struct Start {
    time: SystemTime,
    started: Instant,
    client: SocketAddr,
    method: Method,
    path: Option<PathAndQuery>,
    /// The request's id (a route's `request_id` filter).
    request_id: Option<String>,
    /// What only some layouts write, when the log's does.
    extra: Option<Box<Extra>>,
}

impl Start {
    /// Names the request's id in its line.
    pub(crate) fn set_request_id(&mut self, id: Option<&str>) {
        self.request_id = id.map(str::to_owned);
    }

    /// The request's extra facts, recorded when the layout names them.
    pub(crate) fn with_extra(
        mut self,
        extra: impl FnOnce() -> Box<Extra>,
        log: &AccessLog,
    ) -> Start {
        if log.extra {
            self.extra = Some(extra());
        }
        self
    }

    /// Notes that the try under way opened a new member connection in `took` (for
    /// `connect_ms`; `None`: a try begins).
    pub(crate) fn connected(&mut self, took: Option<Duration>) {
        if let Some(x) = &mut self.extra {
            match took {
                Some(took) => x.connected(took),
                None => x.try_begins(),
            }
        }
    }

    /// Notes a try of this request that took `took` (for `try_ms`).
    pub(crate) fn tried(&mut self, took: Duration) {
        if let Some(x) = &mut self.extra {
            x.tried(took);
        }
    }

    /// The request `req` from `client`, arriving now.
    pub fn new<B>(client: SocketAddr, req: &Request<B>) -> Start {
        Start {
            time: SystemTime::now(),
            started: Instant::now(),
            client,
            method: req.method().clone(),
            path: req.uri().path_and_query().cloned(),
            request_id: None,
            extra: None,
        }
    }
}

impl Start {
    /// A request of the own HTTP/1 path: `method` and `target` from its head.
    pub fn from_head(client: SocketAddr, method: &str, target: &str) -> Start {
        Start {
            time: SystemTime::now(),
            started: Instant::now(),
            client,
            method: Method::from_bytes(method.as_bytes()).unwrap_or_default(),
            path: PathAndQuery::try_from(target).ok(),
            request_id: None,
            extra: None,
        }
    }
}

/// Why the member was chosen.
#[derive(Debug, Clone, Copy, Default)]
pub enum Reason {
    /// Nothing to say (a response the router made itself says what failed instead).
    #[default]
    None,
    /// The request's sticky session held it on its member.
    Session,
    /// The cluster's algorithm chose, for this reason.
    Pick(Algorithm, Why),
}

/// Who answered, as far as known.
#[derive(Debug)]
enum Names {
    /// A member: the route's metrics name the route and cluster.
    Served { route: Arc<RouteMetrics>, spec: Arc<ClusterSpec>, member: usize },
    /// The router answered itself.
    Failed {
        route: Option<String>,
        cluster: Option<String>,
        member: Option<String>,
        error: &'static str,
    },
}

/// One request's line, complete.
#[derive(Debug)]
pub struct Entry {
    start: Start,
    status: u16,
    names: Names,
    bytes_in: u64,
    bytes_out: u64,
    duration: Duration,
    tries: u32,
    reason: Reason,
}

/// A line waiting for its response to end (kept by the response body's
/// [`crate::body::Finish`]).
#[derive(Debug)]
pub struct Pending {
    log: AccessLog,
    start: Start,
    status: u16,
    /// Who failed and the tries made, for a response the router made itself.
    failed: Option<(Names, u32)>,
}

impl Pending {
    /// A member's response with `status` to the request of `start`.
    pub fn served(log: &AccessLog, mut start: Start, status: u16) -> Pending {
        if let Some(x) = &mut start.extra {
            x.first_byte_us = Some(micros32(start.started.elapsed()));
        }
        Pending { log: log.clone(), start, status, failed: None }
    }

    /// The request's start, for a line that is written otherwise after all.
    pub(crate) fn into_start(self) -> Start {
        self.start
    }

    /// The router's own response to the request of `start`, for failure `e`.
    pub fn failed(log: &AccessLog, start: Start, e: &ProxyError) -> Pending {
        let member = e.attempts.iter().rev().find_map(|a| a.member.clone());
        let names = Names::Failed {
            route: e.route.clone(),
            cluster: e.cluster.clone(),
            member,
            error: e.kind.describe(),
        };
        let status = e.kind.status().as_u16();
        // Tries: the attempts that reached for a member.
        let tries = e.attempts.iter().filter(|a| a.member.is_some()).count() as u32;
        Pending { log: log.clone(), start, status, failed: Some((names, tries)) }
    }

    /// The response is over: completes the line and hands it to the writer. `served` is the
    /// member's route metrics, cluster and index, `tries` and `reason` how it was reached.
    pub(crate) fn finish(
        self,
        served: Option<(Arc<RouteMetrics>, Arc<ClusterSpec>, usize)>,
        tries: u32,
        reason: Reason,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        let (names, tries) = match (self.failed, served) {
            (Some(failed), _) => failed,
            (None, Some((route, spec, member))) => (Names::Served { route, spec, member }, tries),
            (None, None) => {
                let error = "unknown";
                (Names::Failed { route: None, cluster: None, member: None, error }, tries)
            }
        };
        let entry = Entry {
            duration: self.start.started.elapsed(),
            start: self.start,
            status: self.status,
            names,
            bytes_in,
            bytes_out,
            tries,
            reason,
        };
        self.log.send(entry);
    }
}

impl Entry {
    fn route(&self) -> Option<&str> {
        match &self.names {
            Names::Served { route, .. } => Some(&route.route),
            Names::Failed { route, .. } => route.as_deref(),
        }
    }

    fn cluster(&self) -> Option<&str> {
        match &self.names {
            Names::Served { spec, .. } => Some(&spec.name),
            Names::Failed { cluster, .. } => cluster.as_deref(),
        }
    }

    fn member(&self) -> Option<&str> {
        match &self.names {
            Names::Served { spec, member, .. } => spec.members.get(*member).map(|m| &*m.name),
            Names::Failed { member, .. } => member.as_deref(),
        }
    }

    fn error(&self) -> Option<&'static str> {
        match &self.names {
            Names::Served { .. } => None,
            Names::Failed { error, .. } => Some(error),
        }
    }

    /// The reason into `buf` (cleared first); `false` when there is none.
    fn reason_into(&self, buf: &mut String) -> bool {
        buf.clear();
        match self.reason {
            Reason::None => return false,
            Reason::Session => buf.push_str("sticky session"),
            Reason::Pick(algorithm, why) => {
                let _ = write!(buf, "{}: {why}", algorithm.as_str());
            }
        }
        true
    }

    fn path(&self) -> &str {
        self.start.path.as_ref().map_or("/", PathAndQuery::path)
    }

    /// The line in `layout`, with its newline, appended to `out`; `scratch` keeps buffers and
    /// the current second's date between lines (formatting runs on the writer thread, but a
    /// busy log formats a line per request, so it avoids `format!` and float formatting).
    pub fn format(&self, layout: &Layout, out: &mut String, scratch: &mut Scratch) {
        match layout {
            Layout::Default(format) => self.default_line(*format, out, scratch),
            Layout::Fields(format, fields) => {
                fields_line(self, *format == LogFormat::Json, fields, out, scratch);
            }
            Layout::Template(pieces) => template_line(self, pieces, out, scratch),
        }
        out.push('\n');
    }

    /// The default fields, as they always were.
    fn default_line(&self, format: LogFormat, out: &mut String, scratch: &mut Scratch) {
        let Scratch { clock, reason, time, client } = scratch;
        time.clear();
        clock.push(time, self.start.time);
        client.clear();
        push_addr(client, self.start.client);
        let has_reason = self.reason_into(reason);
        let reason = has_reason.then_some(reason.as_str());
        let micros = u64::try_from(self.duration.as_micros()).unwrap_or(u64::MAX);
        match format {
            LogFormat::Json => {
                // A struct rather than a `json!` map: the keys stay in this order.
                #[derive(serde::Serialize)]
                struct Line<'a> {
                    time: &'a str,
                    client: &'a str,
                    method: &'a str,
                    path: &'a str,
                    status: u16,
                    route: Option<&'a str>,
                    cluster: Option<&'a str>,
                    member: Option<&'a str>,
                    bytes_in: u64,
                    bytes_out: u64,
                    duration_ms: f64,
                    tries: u32,
                    reason: Option<&'a str>,
                    error: Option<&'a str>,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    request_id: Option<&'a str>,
                }
                let line = Line {
                    time,
                    client,
                    method: self.start.method.as_str(),
                    path: self.path(),
                    status: self.status,
                    route: self.route(),
                    cluster: self.cluster(),
                    member: self.member(),
                    bytes_in: self.bytes_in,
                    bytes_out: self.bytes_out,
                    duration_ms: micros as f64 / 1000.0,
                    tries: self.tries,
                    reason,
                    error: self.error(),
                    request_id: self.start.request_id.as_deref(),
                };
                // Serialising plain fields cannot fail.
                if let Ok(text) = serde_json::to_string(&line) {
                    out.push_str(&text);
                }
            }
            LogFormat::Text => {
                out.push_str("time=");
                out.push_str(time);
                out.push_str(" client=");
                out.push_str(client);
                out.push_str(" method=");
                value(out, Some(self.start.method.as_str()));
                out.push_str(" path=");
                value(out, Some(self.path()));
                out.push_str(" status=");
                push_u64(out, u64::from(self.status));
                out.push_str(" route=");
                value(out, self.route());
                out.push_str(" cluster=");
                value(out, self.cluster());
                out.push_str(" member=");
                value(out, self.member());
                out.push_str(" bytes_in=");
                push_u64(out, self.bytes_in);
                out.push_str(" bytes_out=");
                push_u64(out, self.bytes_out);
                out.push_str(" duration_ms=");
                push_u64(out, micros / 1000);
                out.push('.');
                push_padded(out, micros % 1000, 3);
                out.push_str(" tries=");
                push_u64(out, u64::from(self.tries));
                out.push_str(" reason=");
                value(out, reason);
                out.push_str(" error=");
                value(out, self.error());
                if let Some(id) = &self.start.request_id {
                    out.push_str(" request_id=");
                    value(out, Some(id));
                }
            }
        }
    }

    fn extra(&self, kept: Kept) -> Option<&str> {
        self.start.extra.as_ref().and_then(|x| x.get(kept))
    }

    fn member_address(&self) -> Option<&str> {
        match &self.names {
            Names::Served { spec, member, .. } => {
                spec.members.get(*member).map(|m| m.address.as_str())
            }
            Names::Failed { .. } => None,
        }
    }
}

impl Fields for Entry {
    fn field<'a>(&'a self, f: AccessField, scratch: &'a mut String) -> Value<'a> {
        fn s(v: Option<&str>) -> Value<'_> {
            v.map_or(Value::Absent, Value::Str)
        }
        let x = self.start.extra.as_deref();
        match f {
            AccessField::Time => Value::Time(self.start.time),
            AccessField::Client => Value::Addr(self.start.client),
            AccessField::ClientIp => Value::Ip(self.start.client.ip()),
            AccessField::Method => Value::Str(self.start.method.as_str()),
            AccessField::Host => s(self.extra(Kept::Host)),
            AccessField::Path => Value::Str(self.path()),
            AccessField::Query => s(self.start.path.as_ref().and_then(PathAndQuery::query)),
            AccessField::Protocol => s(x.map(|x| x.protocol)),
            AccessField::Status => Value::Num(u64::from(self.status)),
            AccessField::Route => s(self.route()),
            AccessField::Cluster => s(self.cluster()),
            AccessField::Member => s(self.member()),
            AccessField::MemberAddress => s(self.member_address()),
            AccessField::BytesIn => Value::Num(self.bytes_in),
            AccessField::BytesOut => Value::Num(self.bytes_out),
            AccessField::DurationMs => {
                Value::Micros(u64::try_from(self.duration.as_micros()).unwrap_or(u64::MAX))
            }
            AccessField::Tries => Value::Num(u64::from(self.tries)),
            AccessField::TryMs => x.map_or(Value::Absent, |x| Value::Tries(&x.tries_us)),
            AccessField::ConnectMs => {
                x.and_then(|x| x.connect_us).map_or(Value::Absent, |us| Value::Micros(us.into()))
            }
            AccessField::FirstByteMs => {
                x.and_then(|x| x.first_byte_us).map_or(Value::Absent, |us| Value::Micros(us.into()))
            }
            AccessField::Reason => {
                if self.reason_into(scratch) {
                    Value::Str(scratch.as_str())
                } else {
                    Value::Absent
                }
            }
            AccessField::Error => s(self.error()),
            AccessField::RequestId => {
                s(self.start.request_id.as_deref().or_else(|| self.extra(Kept::RequestId)))
            }
            AccessField::Traceparent => s(self.extra(Kept::Traceparent)),
            AccessField::UserAgent => s(self.extra(Kept::UserAgent)),
            AccessField::Referer => s(self.extra(Kept::Referer)),
            AccessField::TlsVersion => s(x.and_then(|x| x.tls_version)),
            AccessField::Sni => s(self.extra(Kept::Sni)),
        }
    }
}

/// The writer thread: formats and writes lines until every sender is gone.
fn write_lines(rx: &Receiver<Entry>, out: Output, layout: &Layout, name: &str) {
    let Output { out, path } = out;
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    let mut line = String::with_capacity(512);
    let mut scratch = Scratch::default();
    let mut failing = false;
    let mut seen = REOPEN.load(Ordering::Relaxed);
    let mut write = |out: &mut BufWriter<Box<dyn Write + Send>>, e: &Entry| {
        // Asked to reopen (SIGHUP, after the file was rotated): later lines go to a new file
        // at the same path.
        let wanted = REOPEN.load(Ordering::Relaxed);
        if wanted != seen {
            seen = wanted;
            if let Some(path) = &path {
                let _ = out.flush();
                match open_append(path) {
                    Ok(f) => *out = BufWriter::with_capacity(64 * 1024, Box::new(f)),
                    Err(err) => tracing::warn!(
                        listener = name,
                        error = %err,
                        "cannot reopen access log {}; writing on to the old file",
                        path.display()
                    ),
                }
            }
        }
        line.clear();
        e.format(layout, &mut line, &mut scratch);
        if let Err(err) = out.write_all(line.as_bytes()) {
            if !failing {
                tracing::warn!(listener = name, error = %err, "access log write failed; lines are lost until it works again");
            }
            failing = true;
        } else {
            failing = false;
        }
    };
    // Idle: block until a line comes.
    while let Ok(first) = rx.recv() {
        write(&mut out, &first);
        // Busy: nap, then write what came meanwhile, until a nap brings nothing.
        loop {
            std::thread::sleep(BATCH_PAUSE);
            let mut n = 0;
            let gone = loop {
                match rx.try_recv() {
                    Ok(e) => {
                        write(&mut out, &e);
                        n += 1;
                    }
                    Err(TryRecvError::Empty) => break false,
                    Err(TryRecvError::Disconnected) => break true,
                }
            };
            let _ = out.flush();
            if gone {
                return;
            }
            if n == 0 {
                break;
            }
        }
    }
    let _ = out.flush();
}

/// Bumped by [`reopen_all`]; each writer reopens its file when it sees a new value.
static REOPEN: AtomicU64 = AtomicU64::new(0);

/// Asks every access log writing to a file to reopen it before its next line (log rotation:
/// rename the file, then signal; `rondo serve` calls this on SIGHUP).
pub fn reopen_all() {
    REOPEN.fetch_add(1, Ordering::Relaxed);
}

/// Where a writer writes, and the file's path when it is one (to reopen it).
struct Output {
    out: Box<dyn Write + Send>,
    path: Option<PathBuf>,
}

/// Opens `path` for appending, creating it if missing.
fn open_append(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start() -> Start {
        let req = Request::post("/orders/7?token=secret").body(()).expect("request");
        let mut s = Start::new("127.0.0.1:4242".parse().expect("addr"), &req);
        // 2026-12-01T06:40:00.123Z
        s.time = std::time::UNIX_EPOCH + Duration::from_millis(1_796_107_200_123);
        s
    }

    fn failed_entry() -> Entry {
        Entry {
            start: start(),
            status: 502,
            names: Names::Failed {
                route: Some("main".into()),
                cluster: Some("web".into()),
                member: Some("w 2".into()),
                error: "connection refused",
            },
            bytes_in: 12,
            bytes_out: 80,
            duration: Duration::from_micros(1500),
            tries: 2,
            reason: Reason::None,
        }
    }

    #[test]
    fn text_lines_are_key_value_pairs_with_quoted_values_where_needed() {
        let mut out = String::new();
        failed_entry().format(&Layout::Default(LogFormat::Text), &mut out, &mut Scratch::default());
        assert_eq!(
            out,
            "time=2026-12-01T06:40:00.123Z client=127.0.0.1:4242 method=POST path=/orders/7 \
             status=502 route=main cluster=web member=\"w 2\" bytes_in=12 bytes_out=80 \
             duration_ms=1.500 tries=2 reason=- error=\"connection refused\"\n"
        );
    }

    #[test]
    fn json_lines_parse_and_leave_the_query_out() {
        let mut out = String::new();
        failed_entry().format(&Layout::Default(LogFormat::Json), &mut out, &mut Scratch::default());
        assert!(out.ends_with('\n') && out.matches('\n').count() == 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["time"], "2026-12-01T06:40:00.123Z");
        assert_eq!(v["path"], "/orders/7");
        assert_eq!(v["status"], 502);
        assert_eq!(v["member"], "w 2");
        assert_eq!(v["tries"], 2);
        assert_eq!(v["reason"], serde_json::Value::Null);
        assert_eq!(v["error"], "connection refused");
        assert_eq!(v["duration_ms"], 1.5);
        assert!(!out.contains("secret"), "{out}");
        assert!(out.starts_with("{\"time\":"), "keys in the documented order: {out}");
    }

    /// A full channel drops the line and counts it; it never waits.
    #[test]
    fn a_full_channel_drops_and_counts() {
        let dropped = Counter::default();
        let (log, rx) = AccessLog::channel(2, dropped.clone());
        for _ in 0..5 {
            log.send(failed_entry());
        }
        assert_eq!(dropped.get(), 3);
        assert_eq!(rx.try_iter().count(), 2);
        log.send(failed_entry());
        assert_eq!(dropped.get(), 3, "room again after the writer read");
    }
}
