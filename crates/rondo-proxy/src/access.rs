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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::uri::PathAndQuery;
use http::{Method, Request};
use rondo_config::{AccessLogSpec, AccessLogTarget, LogFormat};
use rondo_core::{Algorithm, ClusterSpec, Why};
use rondo_runtime::metrics::{Counter, RouteMetrics};

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
        let (log, rx) = AccessLog::channel(CAPACITY, dropped);
        let format = spec.format;
        let name = listener.to_owned();
        std::thread::Builder::new()
            .name(format!("access-log-{listener}"))
            .spawn(move || write_lines(&rx, out, format, &name))?;
        Ok(log)
    }

    /// An access log whose lines wait in a channel of `capacity` for whoever reads `Receiver`.
    fn channel(capacity: usize, dropped: Counter) -> (AccessLog, Receiver<Entry>) {
        let (tx, rx) = mpsc::sync_channel(capacity);
        (AccessLog { tx, dropped }, rx)
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
}

impl Start {
    /// Names the request's id in its line.
    pub(crate) fn set_request_id(&mut self, id: Option<&str>) {
        self.request_id = id.map(str::to_owned);
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
    pub fn served(log: &AccessLog, start: Start, status: u16) -> Pending {
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

    /// The line in `format`, with its newline, appended to `out`; `scratch` keeps buffers and
    /// the current second's date between lines (formatting runs on the writer thread, but a
    /// busy log formats a line per request, so it avoids `format!` and float formatting).
    pub fn format(&self, format: LogFormat, out: &mut String, scratch: &mut Scratch) {
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
        out.push('\n');
    }
}

/// What [`Entry::format`] keeps between lines.
#[derive(Debug, Default)]
pub struct Scratch {
    clock: DateCache,
    reason: String,
    time: String,
    client: String,
}

/// The date and time of one second, `2026-12-01T06:40:00`, kept while lines of that second
/// keep coming.
#[derive(Debug, Default)]
struct DateCache {
    secs: Option<u64>,
    text: String,
}

impl DateCache {
    /// `t` as `2026-12-01T06:40:00.123Z` (UTC, milliseconds), appended to `out`.
    fn push(&mut self, out: &mut String, t: SystemTime) {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = d.as_secs();
        if self.secs != Some(secs) {
            self.secs = Some(secs);
            let (days, rem) = (secs / 86_400, secs % 86_400);
            let (y, m, day) = civil_from_days(days as i64);
            self.text.clear();
            let _ = write!(
                self.text,
                "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
                rem / 3600,
                rem / 60 % 60,
                rem % 60
            );
        }
        out.push_str(&self.text);
        out.push('.');
        push_padded(out, u64::from(d.subsec_millis()), 3);
        out.push('Z');
    }
}

/// `n` in decimal (no formatting machinery: this runs for every field of every line).
fn push_u64(out: &mut String, n: u64) {
    push_padded(out, n, 1);
}

/// `n` in decimal, zero-padded to at least `width` digits (at most 20).
fn push_padded(out: &mut String, mut n: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    while n > 0 || buf.len() - i < width.clamp(1, 20) {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    // ASCII digits: always UTF-8.
    out.push_str(std::str::from_utf8(&buf[i..]).unwrap_or("0"));
}

/// A client address: `a.b.c.d:port` by hand for IPv4, `[..]:port` for IPv6.
fn push_addr(out: &mut String, a: SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            for (i, o) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_u64(out, u64::from(o));
            }
        }
        SocketAddr::V6(v6) => {
            let _ = write!(out, "[{}]", v6.ip());
        }
    }
    out.push(':');
    push_u64(out, u64::from(a.port()));
}

/// A text-format value: `-` when absent, bare when it is plain, else quoted with `"` and `\`
/// escaped and control characters written as `\n`, `\t` or `\u{..}`.
fn value(out: &mut String, v: Option<&str>) {
    let Some(v) = v else {
        out.push('-');
        return;
    };
    let plain = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b'=');
    if plain {
        out.push_str(v);
        return;
    }
    out.push('"');
    // Runs of characters that need no escape are copied whole.
    let mut rest = v;
    while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c.is_control()) {
        out.push_str(&rest[..i]);
        let c = rest[i..].chars().next().unwrap_or(' ');
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.push_str(rest);
    out.push('"');
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The writer thread: formats and writes lines until every sender is gone.
fn write_lines(rx: &Receiver<Entry>, out: Output, format: LogFormat, name: &str) {
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
        e.format(format, &mut line, &mut scratch);
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
        s.time = UNIX_EPOCH + Duration::from_millis(1_796_107_200_123);
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

    /// `t` formatted as the lines do.
    fn rfc3339_millis(t: SystemTime) -> String {
        let mut out = String::new();
        DateCache::default().push(&mut out, t);
        out
    }

    #[test]
    fn text_lines_are_key_value_pairs_with_quoted_values_where_needed() {
        let mut out = String::new();
        failed_entry().format(LogFormat::Text, &mut out, &mut Scratch::default());
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
        failed_entry().format(LogFormat::Json, &mut out, &mut Scratch::default());
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

    #[test]
    fn numbers_and_addresses_are_written_by_hand_correctly() {
        let mut out = String::new();
        for (n, w) in [(0, 1), (7, 3), (1234, 3), (u64::MAX, 1), (5, 0)] {
            push_padded(&mut out, n, w);
            out.push(' ');
        }
        assert_eq!(out, "0 007 1234 18446744073709551615 5 ");
        out.clear();
        push_addr(&mut out, "10.0.255.1:80".parse().unwrap());
        out.push(' ');
        push_addr(&mut out, "[::1]:8080".parse().unwrap());
        assert_eq!(out, "10.0.255.1:80 [::1]:8080");
    }

    #[test]
    fn awkward_values_are_escaped() {
        let mut out = String::new();
        value(&mut out, Some("a\"b\\c\nd\u{1}"));
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\u{1}\"");
        out.clear();
        value(&mut out, Some(""));
        assert_eq!(out, "\"\"");
    }

    #[test]
    fn dates_are_gregorian() {
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_millis(leap), "2000-02-29T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_secs(4_102_444_799); // 2099-12-31T23:59:59
        assert_eq!(rfc3339_millis(t), "2099-12-31T23:59:59.000Z");
        // The cached second is reused within the second and replaced after it.
        let mut cache = DateCache::default();
        let mut out = String::new();
        for ms in [4_102_444_799_007, 4_102_444_799_999, 4_102_444_800_050] {
            cache.push(&mut out, UNIX_EPOCH + Duration::from_millis(ms));
            out.push(' ');
        }
        assert_eq!(
            out,
            "2099-12-31T23:59:59.007Z 2099-12-31T23:59:59.999Z 2100-01-01T00:00:00.050Z "
        );
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
