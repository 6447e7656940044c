//! The router's own HTTP/1 request parser (`h1::parse::request`, with `h1::chunked::Chunked`
//! for chunked bodies) against hyper's HTTP/1 server, on the corpus in `testdata/h1/` (one raw
//! request stream per file: valid requests, the published request-smuggling families and other
//! malformed heads). Each file, followed by a pipelined canary request, is read the way both
//! paths read a connection: hyper's real `http1` server on an in-memory duplex stream, its
//! service recording each request it gets (method, target, field count, body length or body
//! error), against a loop of `parse::request` and the body framing the own path follows. The
//! two must see the same requests with the same bodies and end the same way (refused with the
//! same status, closed, or a body error); where they do not, the case must be in [`DELIBERATE`]
//! with the reason the difference is wanted, and a listed case that stopped differing fails too
//! (the table stays true). A request the own path declines is hyper's by construction: only
//! the requests before it are compared.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rondo_proxy::h1::chunked::Chunked;
use rondo_proxy::h1::parse::{self, Framing, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The limits both parsers get: the router's defaults for `max_header_bytes` and `max_headers`
/// (hyper's `max_buf_size` is given the same bytes, as `http_builder` in lib.rs does).
const LIMITS: Limits = Limits { max_bytes: 8192, max_fields: 100 };

/// Appended to every case: where the next request starts after the case's last one.
const CANARY: &[u8] = b"GET /canary HTTP/1.1\r\nHost: canary\r\n\r\n";

/// The cases where the own path and hyper disagree on purpose, each with why. A case here
/// that agrees fails the test (remove it); a disagreement not here fails it too.
const DELIBERATE: &[(&str, &str)] = &[
    // Line ends.
    (
        "bare-lf-all",
        "a bare LF line end is refused (RFC 9112 2.2 allows either; two readers differing on it smuggle); hyper accepts it",
    ),
    ("bare-lf-request-line", "same: bare LF refused, hyper accepts"),
    ("bare-lf-final", "same: bare LF refused, hyper accepts"),
    ("leading-bare-lf", "same: a bare LF before the request line is refused, hyper skips it"),
    ("te-bare-lf-in-line", "same: a bare LF ending a header line is refused, hyper accepts it"),
    // Framing.
    (
        "clte",
        "Content-Length with Transfer-Encoding is refused (RFC 9112 6.1 lets a server process it as chunked and close; hyper does)",
    ),
    ("tecl", "same: CL with TE refused; hyper reads the body as chunked"),
    ("clte-zero-cl", "same: CL with TE refused; hyper reads the body as chunked"),
    (
        "te-chunked-twice-lines",
        "chunked applied twice is refused (RFC 9112 6.1: MUST NOT apply chunked more than once); hyper accepts",
    ),
    ("te-chunked-twice-list", "same: chunked twice refused; hyper accepts"),
    (
        "cl-duplicate-same",
        "a repeated Content-Length is refused even when equal (RFC 9110 8.6 allows merging it; one parser merging and another not is a smuggling shape); hyper merges",
    ),
    (
        "cl-u64-max",
        "a Content-Length of 20 digits is not a number of bytes (400); hyper reads it and refuses it as too large (431)",
    ),
    // Chunked bodies.
    (
        "chunk-ext-nul",
        "a NUL in a chunk extension is refused (a reader that stops at it frames the body differently); hyper skips extensions unread",
    ),
    ("chunk-ext-ctl", "same: a control byte in a chunk extension is refused; hyper skips it"),
    (
        "chunk-ext-long",
        "a chunk extension over 4 KiB is refused (bounded work per byte of framing); hyper allows 16 KiB of them per body",
    ),
    (
        "chunk-size-17-digits-leading-zeros",
        "a chunk size over 16 hex digits is refused even when its value fits (the digits are counted, not the value); hyper counts the value",
    ),
    (
        "chunk-last-bare-lf",
        "a bare LF ending the last chunk's line is refused; hyper accepts the body, then loses the request after it",
    ),
    (
        "chunk-trailer-bare-lf",
        "a bare LF ending a trailer line is refused; hyper accepts the body, then loses the request after it",
    ),
    // Host (the router's hyper path refuses these too, in its route stage, after hyper's parser).
    (
        "host-missing",
        "an HTTP/1.1 request without Host is refused (RFC 9112 3.2); hyper's parser accepts it, the router's hyper path refuses it in request_host",
    ),
    (
        "host-duplicate-same",
        "more than one Host is refused (RFC 9112 3.2); hyper's parser accepts, the router's hyper path refuses",
    ),
    (
        "host-duplicate-different",
        "same: more than one Host refused here and in the router's hyper path, not by hyper's parser",
    ),
    (
        "host-obs-text",
        "a Host that is not visible ASCII is refused; hyper's parser accepts it, the router's hyper path refuses it (HeaderValue::to_str)",
    ),
    (
        "host-inner-space",
        "a Host that is not visible ASCII (here a space) is refused; hyper's parser and the router's hyper path (to_str allows spaces) accept it",
    ),
    // Expectations.
    (
        "expect-other",
        "an expectation other than 100-continue is refused with 417 (RFC 9110 10.1.1 allows it); hyper ignores it and reads the body",
    ),
    // Targets.
    (
        "rl-target-fragment",
        "a fragment in the target is refused (RFC 9112 3.2: not sent in a request); hyper drops it",
    ),
    // Sizes.
    (
        "request-line-over-limit",
        "a request line that alone fills max_header_bytes is 414, hyper says 431 for any over-long head",
    ),
];

/// How a stream of requests ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// Refused with this status (and closed).
    Refused(u16),
    /// Closed: end of input, `Connection: close`, or a partial head at end of input.
    Closed,
    /// The last request's body was malformed or cut short.
    BodyError,
    /// The own path handed the rest of the connection to hyper (own side only).
    Declined(String),
    /// Hyper answered nothing and did not close within the test's bound (hyper side only).
    Hung,
}

/// One request as a path saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: String,
    target: String,
    fields: usize,
    /// The body's length (decoded, for chunked), or `None` when the body was in error.
    body: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    seen: Vec<Seen>,
    end: End,
}

/// The own path's reading of `input`: heads parsed in turn, bodies delimited by their framing.
fn own(input: &[u8]) -> Run {
    let mut rest = input;
    let mut seen = Vec::new();
    let end = loop {
        if rest.is_empty() {
            break End::Closed;
        }
        // The connection loop checks for the HTTP/2 preface before parsing a head.
        if parse::is_h2_preface(rest) {
            break End::Declined("h2 preface".into());
        }
        let head = match parse::request(rest, LIMITS) {
            Err(e) => break End::Refused(e.status),
            Ok(None) => break End::Closed,
            Ok(Some(head)) => head,
        };
        assert!(head.len <= rest.len(), "head longer than its input");
        if let Some(why) = head.decline {
            break End::Declined(format!("{why:?}"));
        }
        let after = &rest[head.len..];
        let text = |s: parse::Span| String::from_utf8_lossy(s.get(rest)).into_owned();
        let mut req = Seen {
            method: text(head.method),
            target: text(head.target),
            fields: head.fields.len(),
            body: None,
        };
        let used = match head.framing {
            Framing::None => 0,
            Framing::Length(n) => match usize::try_from(n) {
                Ok(n) if n <= after.len() => n,
                _ => {
                    seen.push(req);
                    break End::BodyError;
                }
            },
            Framing::Chunked => {
                // As serve.rs follows a request's chunked body: trailers up to the head limit.
                let mut c = Chunked::new(LIMITS.max_bytes);
                match c.feed(after) {
                    Ok(n) if c.is_done() => n,
                    _ => {
                        seen.push(req);
                        break End::BodyError;
                    }
                }
            }
            Framing::Close => unreachable!("requests are never delimited by close"),
        };
        req.body = Some(match head.framing {
            Framing::Chunked => decoded_len(&after[..used]),
            _ => used as u64,
        });
        seen.push(req);
        if head.close {
            break End::Closed;
        }
        rest = &after[used..];
    };
    Run { seen, end }
}

/// The data length of a chunked body `Chunked` accepted (so well formed by its rules).
fn decoded_len(mut body: &[u8]) -> u64 {
    let mut total = 0;
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").expect("size line");
        let digits: Vec<u8> =
            body[..line_end].iter().copied().take_while(u8::is_ascii_hexdigit).collect();
        let size =
            u64::from_str_radix(std::str::from_utf8(&digits).unwrap(), 16).expect("chunk size");
        body = &body[line_end + 2..];
        if size == 0 {
            return total;
        }
        total += size;
        body = &body[size as usize + 2..];
    }
}

/// Hyper's reading of `input`: its HTTP/1 server, configured as the router configures it, on a
/// duplex stream the input is written to (then shut), and what it answered read back.
async fn hyper(input: &[u8]) -> Run {
    let (client, server) = tokio::io::duplex(1 << 20);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let record = record.clone();
        async move {
            let mut s = Seen {
                method: req.method().to_string(),
                target: req.uri().to_string(),
                fields: req.headers().len(),
                body: None,
            };
            // The slot is taken before the body is read, so a body error still leaves it.
            let at = {
                let mut seen = record.lock().unwrap();
                seen.push(s.clone());
                seen.len() - 1
            };
            s.body = req.into_body().collect().await.ok().map(|b| b.to_bytes().len() as u64);
            record.lock().unwrap()[at] = s;
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    // `half_close`: the input is written, then the write side shut, and hyper must still serve
    // the requests already in its buffer (without it, the EOF ends the connection after the
    // first response, and the pipelined requests after it are never read).
    let conn = hyper::server::conn::http1::Builder::new()
        .half_close(true)
        .max_buf_size(LIMITS.max_bytes.max(8192))
        .max_headers(LIMITS.max_fields)
        .serve_connection(TokioIo::new(server), service);
    let server = tokio::spawn(conn);
    let (mut rd, mut wr) = tokio::io::split(client);
    let bytes = input.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        let _ = wr.shutdown().await;
    });
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
    writer.abort();
    server.abort();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    if read.is_err() {
        return Run { seen, end: End::Hung };
    }
    let statuses = statuses(&out);
    let end = if seen.last().is_some_and(|s| s.body.is_none()) {
        End::BodyError
    } else if statuses.len() > seen.len() {
        End::Refused(*statuses.last().unwrap())
    } else {
        End::Closed
    };
    Run { seen, end }
}

/// The final (non-1xx) statuses of the responses in `out` (hyper's have no bodies here).
fn statuses(mut out: &[u8]) -> Vec<u16> {
    let mut found = Vec::new();
    while !out.is_empty() {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        match resp.parse(out) {
            Ok(httparse::Status::Complete(n)) => {
                let code = resp.code.unwrap();
                let len = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |h| std::str::from_utf8(h.value).unwrap().parse().unwrap());
                if code >= 200 {
                    found.push(code);
                }
                out = &out[(n + len).min(out.len())..];
            }
            other => panic!("hyper answered something unreadable ({other:?}): {out:?}"),
        }
    }
    found
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/h1");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| f.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "http"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("corpus file"))
        })
        .collect();
    files.sort();
    files
}

/// Whether two runs agree: the same requests, then the same end. A decline ends the
/// comparison there (hyper serves the rest, so it agrees with itself).
fn agree(own: &Run, hyper: &Run) -> bool {
    if let End::Declined(_) = own.end {
        return hyper.seen.len() >= own.seen.len() && hyper.seen[..own.seen.len()] == own.seen[..];
    }
    own == hyper
}

#[tokio::test]
async fn the_own_parser_agrees_with_hyper_but_where_the_table_says() {
    let files = corpus();
    assert!(files.len() >= 150, "only {} corpus files", files.len());
    for (name, _) in DELIBERATE {
        assert!(files.iter().any(|(n, _)| n == name), "DELIBERATE names no corpus file {name}");
    }
    let mut unexpected = Vec::new();
    let mut stale = Vec::new();
    let mut declined = 0;
    for (name, raw) in &files {
        let mut input = raw.clone();
        input.extend_from_slice(CANARY);
        let own = own(&input);
        let hyper = hyper(&input).await;
        let listed = DELIBERATE.iter().any(|(n, _)| n == name);
        let agrees = agree(&own, &hyper);
        let verdict = match (&own.end, agrees) {
            (End::Declined(_), _) => {
                declined += 1;
                "declined"
            }
            (_, true) => "agree",
            (_, false) if listed => "deliberate",
            (_, false) => "DIFFERENT",
        };
        eprintln!("{verdict:10} {name}\n    own:   {own:?}\n    hyper: {hyper:?}");
        assert_ne!(hyper.end, End::Hung, "{name}: hyper neither answered nor closed");
        if !agrees && !listed {
            unexpected.push(format!("{name}\n    own:   {own:?}\n    hyper: {hyper:?}"));
        }
        if agrees && listed {
            stale.push(name.clone());
        }
    }
    assert!(declined > 0 && declined < files.len() / 4, "{declined} cases declined");
    assert!(unexpected.is_empty(), "disagreements not in DELIBERATE:\n{}", unexpected.join("\n"));
    assert!(stale.is_empty(), "DELIBERATE lists cases that agree now: {stale:?}");
}

#[test]
fn the_canary_is_seen_after_a_valid_case() {
    // The harness itself: a plain request and the canary are two requests on the own side.
    let mut input = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec();
    input.extend_from_slice(CANARY);
    let run = own(&input);
    assert_eq!(run.end, End::Closed);
    assert_eq!(run.seen.len(), 2);
    assert_eq!(run.seen[1].target, "/canary");
    assert_eq!(decoded_len(b"5;x\r\nhello\r\nA\r\n0123456789\r\n0\r\nT: 1\r\n\r\n"), 15);
}
