//! The parts of an access log line that do not depend on what a request is: a listener's
//! [`Layout`] (the default text or JSON line, chosen `fields`, or a template) compiled once when
//! the log opens; the request facts only some layouts need ([`Extra`]: header values, the TLS
//! version and server name, each try's time), recorded on the request path only when the layout
//! names them; and the writing of each value (`Value`) by hand, on the writer thread, without
//! an allocation per field.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use rondo_config::access_format::{AccessField, Piece};
use rondo_config::{AccessLogSpec, LogFormat};

/// How a listener's lines are laid out, compiled from its `access_log`.
#[derive(Debug, Clone)]
pub enum Layout {
    /// The 14 default fields, as text or JSON (byte for byte what they always were).
    Default(LogFormat),
    /// `fields = [...]`: these fields, in order, as `key=value` text or a JSON object.
    Fields(LogFormat, Box<[AccessField]>),
    /// A template: its text and its fields' values.
    Template(Box<[Piece]>),
}

impl Layout {
    /// `spec`'s layout.
    pub fn of(spec: &AccessLogSpec) -> Layout {
        match (&spec.template, &spec.fields) {
            (Some(t), _) => Layout::Template(t.clone().into_boxed_slice()),
            (None, Some(f)) => Layout::Fields(spec.format, f.clone().into_boxed_slice()),
            (None, None) => Layout::Default(spec.format),
        }
    }

    /// Whether a request must record its [`Extra`] facts for this layout.
    pub fn needs_extra(&self) -> bool {
        let extra = |f: &AccessField| {
            use AccessField::*;
            matches!(
                f,
                Host | UserAgent
                    | Referer
                    | Traceparent
                    | RequestId
                    | TlsVersion
                    | Sni
                    | Protocol
                    | TryMs
                    | FirstByteMs
                    | ConnectMs
            )
        };
        match self {
            Layout::Default(_) => false,
            Layout::Fields(_, fields) => fields.iter().any(extra),
            Layout::Template(pieces) => {
                pieces.iter().any(|p| matches!(p, Piece::Field(f) if extra(f)))
            }
        }
    }
}

/// The header values [`Extra`] keeps, by index.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kept {
    Host = 0,
    UserAgent = 1,
    Referer = 2,
    Traceparent = 3,
    RequestId = 4,
    Sni = 5,
}

/// The request's header fields [`Kept`] reads, by name (lower case).
const KEPT_HEADERS: [(Kept, &str); 4] = [
    (Kept::UserAgent, "user-agent"),
    (Kept::Referer, "referer"),
    (Kept::Traceparent, "traceparent"),
    (Kept::RequestId, "x-request-id"),
];

/// Facts of a request that only some layouts write, recorded when the request arrives (and as
/// its tries end): the texts in one buffer (one allocation), times as integers.
#[derive(Debug, Default)]
pub struct Extra {
    text: String,
    spans: [Option<(u32, u32)>; 6],
    /// `HTTP/1.1`, `HTTP/2`, ...
    pub(crate) protocol: &'static str,
    /// The TLS version negotiated, on a TLS connection.
    pub(crate) tls_version: Option<&'static str>,
    /// Each try's time, µs (saturated at `u32::MAX`, about 71 minutes).
    pub(crate) tries_us: Vec<u32>,
    /// From the arrival to the answering member's response head, µs.
    pub(crate) first_byte_us: Option<u32>,
    /// The last try's new member connection took this long to open, µs (`None`: it reused
    /// one, or the codec does not time it).
    pub(crate) connect_us: Option<u32>,
}

impl Extra {
    /// The facts of a request over `protocol`, `host` its `Host` or authority, `get` reading
    /// its other header fields, on a connection with `tls` (version, server name).
    pub(crate) fn capture<'h>(
        protocol: &'static str,
        host: Option<&'h [u8]>,
        get: impl Fn(&str) -> Option<&'h [u8]>,
        tls: Option<(Option<&'static str>, Option<&str>)>,
    ) -> Box<Extra> {
        let mut x = Extra { protocol, ..Extra::default() };
        x.keep(Kept::Host, host);
        for (kept, name) in KEPT_HEADERS {
            x.keep(kept, get(name));
        }
        if let Some((version, sni)) = tls {
            x.tls_version = version;
            x.keep(Kept::Sni, sni.map(str::as_bytes));
        }
        Box::new(x)
    }

    /// The facts of `req`, on a connection whose TLS handshake gave `tls`.
    pub(crate) fn of_request<B>(
        req: &http::Request<B>,
        tls: Option<&rondo_runtime::tls::server::ClientCert>,
    ) -> Box<Extra> {
        let protocol = match req.version() {
            http::Version::HTTP_09 => "HTTP/0.9",
            http::Version::HTTP_10 => "HTTP/1.0",
            http::Version::HTTP_11 => "HTTP/1.1",
            http::Version::HTTP_2 => "HTTP/2",
            http::Version::HTTP_3 => "HTTP/3",
            _ => "HTTP",
        };
        let headers = req.headers();
        let host = req.uri().authority().map(|a| a.as_str().as_bytes());
        let host = host.or_else(|| headers.get(http::header::HOST).map(|v| v.as_bytes()));
        let get = |name: &str| headers.get(name).map(|v| v.as_bytes());
        Extra::capture(protocol, host, get, tls.map(|t| (t.version, t.sni.as_deref())))
    }

    fn keep(&mut self, kept: Kept, value: Option<&[u8]>) {
        let Some(value) = value else { return };
        let start = self.text.len() as u32;
        self.text.push_str(&String::from_utf8_lossy(value));
        self.spans[kept as usize] = Some((start, self.text.len() as u32));
    }

    /// A kept text.
    pub(crate) fn get(&self, kept: Kept) -> Option<&str> {
        let (start, end) = self.spans[kept as usize]?;
        self.text.get(start as usize..end as usize)
    }

    /// Notes a try that took `took`; a new member connection it opens is noted after.
    pub(crate) fn tried(&mut self, took: std::time::Duration) {
        self.tries_us.push(micros32(took));
    }

    /// Notes that the try under way opened a new member connection in `took`.
    pub(crate) fn connected(&mut self, took: std::time::Duration) {
        self.connect_us = Some(micros32(took));
    }

    /// A try begins: until it opens a connection, it has none of its own.
    pub(crate) fn try_begins(&mut self) {
        self.connect_us = None;
    }
}

/// `d` in µs, saturated at `u32::MAX`.
pub(crate) fn micros32(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// A field's value in a line.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Absent,
    Str(&'a str),
    Num(u64),
    /// µs, written as milliseconds with three decimals.
    Micros(u64),
    Time(SystemTime),
    Addr(SocketAddr),
    Ip(IpAddr),
    /// Each try's µs, written as milliseconds, comma-separated (a JSON array).
    Tries(&'a [u32]),
}

/// What an entry answers for each field.
pub(crate) trait Fields {
    fn field<'a>(&'a self, f: AccessField, scratch: &'a mut String) -> Value<'a>;
}

/// What writing keeps between lines.
#[derive(Debug, Default)]
pub struct Scratch {
    pub(crate) clock: DateCache,
    pub(crate) reason: String,
    pub(crate) time: String,
    pub(crate) client: String,
}

/// Appends `entry`'s line in `fields` as `key=value` pairs or a JSON object.
pub(crate) fn fields_line(
    entry: &impl Fields,
    json: bool,
    fields: &[AccessField],
    out: &mut String,
    scratch: &mut Scratch,
) {
    if json {
        out.push('{');
    }
    for (i, &f) in fields.iter().enumerate() {
        let v = entry.field(f, &mut scratch.reason);
        if json {
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(f.as_str());
            out.push_str("\":");
            push_json(out, v, &mut scratch.clock);
        } else {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(f.as_str());
            out.push('=');
            match v {
                Value::Str(s) => value(out, Some(s)),
                v => push_plain(out, v, &mut scratch.clock),
            }
        }
    }
    if json {
        out.push('}');
    }
}

/// Appends `entry`'s line by `template`: texts as written, values bare (control characters
/// escaped, so a line stays a line), `-` when absent.
pub(crate) fn template_line(
    entry: &impl Fields,
    template: &[Piece],
    out: &mut String,
    scratch: &mut Scratch,
) {
    for piece in template {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Field(f) => match entry.field(*f, &mut scratch.reason) {
                Value::Str(s) => push_escaped(out, s),
                v => push_plain(out, v, &mut scratch.clock),
            },
        }
    }
}

/// A value that is not free text.
fn push_plain(out: &mut String, v: Value<'_>, clock: &mut DateCache) {
    match v {
        Value::Absent => out.push('-'),
        Value::Str(s) => push_escaped(out, s),
        Value::Num(n) => push_u64(out, n),
        Value::Micros(us) => push_ms(out, us),
        Value::Time(t) => clock.push(out, t),
        Value::Addr(a) => push_addr(out, a),
        Value::Ip(IpAddr::V4(v4)) => push_ip4(out, v4),
        Value::Ip(IpAddr::V6(v6)) => {
            let _ = write!(out, "{v6}");
        }
        Value::Tries([]) => out.push('-'),
        Value::Tries(t) => {
            for (i, &us) in t.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_ms(out, u64::from(us));
            }
        }
    }
}

/// A value in JSON.
fn push_json(out: &mut String, v: Value<'_>, clock: &mut DateCache) {
    match v {
        Value::Absent => out.push_str("null"),
        Value::Num(n) => push_u64(out, n),
        Value::Micros(us) => push_ms(out, us),
        Value::Str(s) => push_json_str(out, s),
        Value::Tries(t) => {
            out.push('[');
            for (i, &us) in t.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_ms(out, u64::from(us));
            }
            out.push(']');
        }
        v @ (Value::Time(_) | Value::Addr(_) | Value::Ip(_)) => {
            out.push('"');
            push_plain(out, v, clock);
            out.push('"');
        }
    }
}

/// A JSON string: `"` and `\` escaped, control characters as `\u00XX`.
fn push_json_str(out: &mut String, s: &str) {
    // Control characters are all below U+10000: four hex digits hold each.
    push_quoted(out, s, |out, c| {
        let _ = write!(out, "\\u{:04x}", c as u32);
    });
}

/// `s` in `"`, with `"` and `\` escaped, `\n` and `\t` as such, and any other control
/// character as `other` writes it. Runs of characters that need no escape are copied whole.
fn push_quoted(out: &mut String, s: &str, other: impl Fn(&mut String, char)) {
    out.push('"');
    let mut rest = s;
    while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c.is_control()) {
        out.push_str(&rest[..i]);
        let c = rest[i..].chars().next().unwrap_or(' ');
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => other(out, c),
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.push_str(rest);
    out.push('"');
}

/// Free text in a template: control characters written as `\n`, `\t` or `\u{..}`.
fn push_escaped(out: &mut String, s: &str) {
    let mut rest = s;
    while let Some(i) = rest.find(char::is_control) {
        out.push_str(&rest[..i]);
        let c = rest[i..].chars().next().unwrap_or(' ');
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.push_str(rest);
}

/// µs as milliseconds with three decimals (`1.500`).
pub(crate) fn push_ms(out: &mut String, us: u64) {
    push_u64(out, us / 1000);
    out.push('.');
    push_padded(out, us % 1000, 3);
}

/// The date and time of one second, `2026-12-01T06:40:00`, kept while lines of that second
/// keep coming.
#[derive(Debug, Default)]
pub(crate) struct DateCache {
    secs: Option<u64>,
    text: String,
}

impl DateCache {
    /// `t` as `2026-12-01T06:40:00.123Z` (UTC, milliseconds), appended to `out`.
    pub(crate) fn push(&mut self, out: &mut String, t: SystemTime) {
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
pub(crate) fn push_u64(out: &mut String, n: u64) {
    push_padded(out, n, 1);
}

/// `n` in decimal, zero-padded to at least `width` digits (at most 20).
pub(crate) fn push_padded(out: &mut String, mut n: u64, width: usize) {
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
pub(crate) fn push_addr(out: &mut String, a: SocketAddr) {
    match a {
        SocketAddr::V4(v4) => push_ip4(out, *v4.ip()),
        SocketAddr::V6(v6) => {
            let _ = write!(out, "[{}]", v6.ip());
        }
    }
    out.push(':');
    push_u64(out, u64::from(a.port()));
}

/// `a.b.c.d` by hand.
fn push_ip4(out: &mut String, ip: std::net::Ipv4Addr) {
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        push_u64(out, u64::from(o));
    }
}

/// A text-format value: `-` when absent, bare when it is plain, else quoted with `"` and `\`
/// escaped and control characters written as `\n`, `\t` or `\u{..}`.
pub(crate) fn value(out: &mut String, v: Option<&str>) {
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
    push_quoted(out, v, |out, c| {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A fixed entry answering every field.
    struct All;

    impl Fields for All {
        fn field<'a>(&'a self, f: AccessField, _: &'a mut String) -> Value<'a> {
            match f {
                AccessField::Time => Value::Time(UNIX_EPOCH),
                AccessField::Client => Value::Addr("10.0.0.1:5".parse().unwrap()),
                AccessField::ClientIp => Value::Ip("10.0.0.1".parse().unwrap()),
                AccessField::Status => Value::Num(200),
                AccessField::DurationMs => Value::Micros(1500),
                AccessField::TryMs => Value::Tries(&[250_000, 1_200]),
                AccessField::UserAgent => Value::Str("curl/8 \"x\"\n"),
                _ => Value::Absent,
            }
        }
    }

    #[test]
    fn templates_fields_and_json_write_each_value() {
        let mut out = String::new();
        let mut s = Scratch::default();
        let pieces = rondo_config::access_format::parse_template(
            "{client_ip} [{time}] {status} {duration_ms} {try_ms} {user_agent} {host}",
        )
        .expect("template");
        template_line(&All, &pieces, &mut out, &mut s);
        assert_eq!(
            out,
            "10.0.0.1 [1970-01-01T00:00:00.000Z] 200 1.500 250.000,1.200 curl/8 \"x\"\\n -"
        );
        out.clear();
        let fields = [AccessField::Client, AccessField::UserAgent, AccessField::TryMs];
        fields_line(&All, false, &fields, &mut out, &mut s);
        assert_eq!(
            out,
            "client=10.0.0.1:5 user_agent=\"curl/8 \\\"x\\\"\\n\" try_ms=250.000,1.200"
        );
        out.clear();
        let fields =
            [AccessField::Time, AccessField::Host, AccessField::TryMs, AccessField::UserAgent];
        fields_line(&All, true, &fields, &mut out, &mut s);
        let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
        assert_eq!(v["host"], serde_json::Value::Null);
        assert_eq!(v["try_ms"], serde_json::json!([250.0, 1.2]));
        assert_eq!(v["user_agent"], "curl/8 \"x\"\n");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
    }

    /// `t` formatted as the lines do.
    fn rfc3339_millis(t: SystemTime) -> String {
        let mut out = String::new();
        DateCache::default().push(&mut out, t);
        out
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

    #[test]
    fn extras_keep_header_values_in_one_buffer() {
        let headers = [("user-agent", &b"curl"[..]), ("x-request-id", b"abc")];
        let get = |n: &str| headers.iter().find(|(h, _)| *h == n).map(|(_, v)| *v);
        let x = Extra::capture(
            "HTTP/2",
            Some(b"example.com"),
            get,
            Some((Some("TLSv1.3"), Some("sni.test"))),
        );
        assert_eq!(x.get(Kept::Host), Some("example.com"));
        assert_eq!(x.get(Kept::UserAgent), Some("curl"));
        assert_eq!(x.get(Kept::RequestId), Some("abc"));
        assert_eq!(x.get(Kept::Referer), None);
        assert_eq!(x.get(Kept::Sni), Some("sni.test"));
        assert_eq!((x.protocol, x.tls_version), ("HTTP/2", Some("TLSv1.3")));
    }
}
