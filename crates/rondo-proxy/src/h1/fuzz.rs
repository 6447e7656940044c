//! What the fuzz targets `h1_head`, `h1_chunked` and `h1_follow` (in `fuzz/`) run on arbitrary bytes, as
//! plain functions so the crate's own tests replay the checked-in corpus without nightly. Each
//! panics when an invariant of the parsers breaks; the invariants are the ones the connection
//! loop relies on: a head lies inside its input and its limits, every span lies inside the head,
//! and a verdict does not depend on how the bytes arrived (a refused prefix is never accepted
//! later, an accepted head is never refused or completed early by a shorter prefix, and a
//! chunked body reads the same whole, split in two or byte by byte; so does a connection's
//! byte stream under hyper, as [`super::follow`] follows it).

use super::chunked::Chunked;
use super::follow::Follow;
use super::parse::{self, Framing, Limits};

/// The limits a head is parsed under when the input does not choose its own: the router's
/// defaults.
const DEFAULT_LIMITS: Limits = Limits { max_bytes: 8192, max_fields: 100 };

/// Inputs up to this long have every prefix checked; longer ones a spread of them (the check
/// is quadratic).
const ALL_PREFIXES_UP_TO: usize = 512;

/// The `h1_head` fuzz target. An input starting with 0xFF chooses its limits from the next two
/// bytes (head bytes `32 * (b1 + 1)`, fields `b2`, so both the stack and the heap field arrays
/// are reached); any other input is a request head under the router's default limits (so the
/// differential corpus in `testdata/h1` seeds it as it is). The same bytes are also parsed as a
/// response head.
pub fn head_input(data: &[u8]) {
    let (limits, input) = match data {
        [0xff, b, f, rest @ ..] => {
            (Limits { max_bytes: 32 * (usize::from(*b) + 1), max_fields: usize::from(*f) }, rest)
        }
        _ => (DEFAULT_LIMITS, data),
    };
    let whole = parse::request(input, limits);
    match &whole {
        Ok(Some(head)) => check_request(input, limits, head),
        Ok(None) => assert!(input.len() < limits.max_bytes, "partial head at the limit"),
        Err(e) => {
            assert!(matches!(e.status, 400 | 414 | 417 | 431), "status {}", e.status);
            assert!(!e.why.is_empty() && !e.why.chars().any(char::is_control), "{:?}", e.why);
        }
    }
    // Arrival does not matter: fed in pieces, the loop parses each longer prefix in turn.
    let mut refused = false;
    for end in prefixes(input.len()) {
        match parse::request(&input[..end], limits) {
            Err(_) => refused = true,
            Ok(Some(head)) => {
                assert!(!refused, "a prefix was refused, a longer one accepted");
                // A head is complete at one length only: the whole input's head is this one.
                let Ok(Some(full)) = &whole else {
                    panic!("a prefix holds a head the whole input does not");
                };
                assert_eq!(head.len, full.len, "the head ends elsewhere in a prefix");
                assert_eq!(head.framing, full.framing);
                assert_eq!(head.decline, full.decline);
            }
            Ok(None) => assert!(!refused, "a prefix was refused, a longer one is only partial"),
        }
    }
    if let Ok(Some(head)) = &whole {
        assert!(!refused, "a prefix of an accepted head was refused");
        // The bytes after the head do not change it.
        let again = parse::request(&input[..head.len], limits);
        assert!(matches!(&again, Ok(Some(h)) if h.len == head.len), "{again:?}");
    }
    response_input(input);
}

fn check_request(input: &[u8], limits: Limits, head: &parse::RequestHead) {
    assert!(head.len <= input.len() && head.len <= limits.max_bytes, "head len {}", head.len);
    assert!(head.fields.len() <= limits.max_fields);
    let inside = |s: parse::Span| s.start <= s.end && s.end as usize <= head.len;
    for s in [head.method, head.target, head.path, head.host] {
        assert!(inside(s), "span {s:?} outside a head of {} bytes", head.len);
    }
    for f in &head.fields {
        assert!(inside(f.name) && inside(f.value), "field {f:?} outside the head");
        assert!(!f.name.get(input).is_empty());
        let value = f.value.get(input);
        assert!(!value.iter().any(|b| matches!(b, b'\0' | b'\r' | b'\n')), "{value:?}");
    }
    assert!(head.path.start == head.target.start && head.path.end <= head.target.end);
    // What is forwarded is CRLF-delimited throughout.
    let bytes = &input[..head.len];
    assert!(bytes.ends_with(b"\r\n\r\n"), "head end");
    assert!(!bytes.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'), "bare LF in {bytes:?}");
    if head.decline.is_none() {
        assert!(head.target.get(input).starts_with(b"/"), "origin-form only");
        assert!(!head.host.get(input).iter().any(|b| !b.is_ascii_graphic()));
    }
    assert!(!matches!(head.framing, Framing::Close | Framing::Length(0)));
}

/// The same bytes as a member's response head.
fn response_input(input: &[u8]) {
    for head_request in [false, true] {
        let Ok(Some(head)) = parse::response(input, head_request) else { continue };
        assert!(head.len <= input.len());
        // Three digits, any of them (000 too): the connection loop refuses what is not 1xx-5xx.
        assert!(head.status <= 999, "status {}", head.status);
        for f in &head.fields {
            assert!(f.name.end as usize <= head.len && f.value.end as usize <= head.len);
        }
        assert!(head.reason.end as usize <= head.len);
        if head.framing == Framing::Close {
            assert!(!head.reusable, "a body delimited by close on a reusable connection");
        }
        if head_request {
            assert_eq!(head.framing, Framing::None, "a response to HEAD has no body");
        }
    }
}

/// The prefix lengths checked, shortest first: all below [`ALL_PREFIXES_UP_TO`], then a spread.
fn prefixes(len: usize) -> impl Iterator<Item = usize> {
    let step = if len <= ALL_PREFIXES_UP_TO { 1 } else { len / 97 + 1 };
    (1..len).filter(move |n| n % step == 0 || len - n < 8)
}

/// The `h1_chunked` fuzz target: the first byte bounds the trailer section (`8 * b0` bytes),
/// the second says where to split the rest in two; the rest is a chunked body, followed whole,
/// in those two pieces and byte by byte, which must all read it the same.
pub fn chunked_input(data: &[u8]) {
    let (max_trailers, split, body) = match data {
        [t, s, rest @ ..] => (8 * usize::from(*t), usize::from(*s), rest),
        _ => return,
    };
    let whole = follow(max_trailers, [body]);
    let split = split.min(body.len());
    let halves = follow(max_trailers, [&body[..split], &body[split..]]);
    assert_eq!(whole, halves, "read whole and split at {split}");
    let mut c = Chunked::new(max_trailers);
    let mut bytewise = Ok(0);
    for b in body {
        if c.is_done() {
            break;
        }
        match c.feed(std::slice::from_ref(b)) {
            Ok(n) => {
                assert_eq!(n, 1, "one byte fed, {n} taken while not done");
                bytewise = bytewise.map(|t| t + 1);
            }
            Err(e) => {
                bytewise = Err(e);
                break;
            }
        }
    }
    let bytewise = bytewise.map(|n| (n, c.is_done()));
    assert_eq!(whole, bytewise, "read whole and byte by byte");
    if let Ok((n, done)) = whole {
        assert!(n <= body.len());
        assert!(done || n == body.len(), "stopped early without being done");
        if done {
            // The body is exactly its first n bytes: they alone read as the same whole body.
            assert_eq!(follow(max_trailers, [&body[..n]]), Ok((n, true)));
            let mut after = Chunked::new(max_trailers);
            assert_eq!(after.feed(&body[..n]), Ok(n));
            assert_eq!(after.feed(b"GET / HTTP/1.1\r\n"), Ok(0), "bytes taken after the end");
        }
    }
}

/// Follows `pieces` in turn; the bytes taken and whether the body ended, or the error.
fn follow<'a>(
    max_trailers: usize,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(usize, bool), super::chunked::ChunkError> {
    let mut c = Chunked::new(max_trailers);
    let mut taken = 0;
    for piece in pieces {
        let n = c.feed(piece)?;
        assert!(n <= piece.len(), "took {n} of {} bytes", piece.len());
        taken += n;
        if c.is_done() {
            break;
        }
        assert_eq!(n, piece.len(), "stopped inside a piece without being done");
    }
    Ok((taken, c.is_done()))
}

/// The limits of the `h1_follow` target: small, so that inputs reach them.
const FOLLOW_LIMITS: Limits = Limits { max_bytes: 1024, max_fields: 32 };

/// The `h1_follow` fuzz target: the first byte says where to split the rest (at `4 * b0`),
/// a client's bytes on a connection hyper serves. Followed whole, in those two pieces and byte
/// by byte, the verdict must be the same: well formed throughout (and following or not), or
/// refused at the same byte; a refusal never points past what was fed, and it stays.
pub fn follow_input(data: &[u8]) {
    let Some((&s, stream)) = data.split_first() else { return };
    let whole = follow_stream([stream]);
    let split = (4 * usize::from(s)).min(stream.len());
    let halves = follow_stream([&stream[..split], &stream[split..]]);
    assert_eq!(whole, halves, "followed whole and split at {split}");
    let bytewise = follow_stream(stream.chunks(1));
    assert_eq!(whole, bytewise, "followed whole and byte by byte");
}

/// Follows `pieces` in turn: where the stream was refused (its byte's offset), or whether the
/// follower still follows it.
fn follow_stream<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Result<bool, usize> {
    let mut f = Follow::new(FOLLOW_LIMITS);
    let mut fed = 0;
    for piece in pieces {
        match f.feed(piece) {
            Ok(()) => fed += piece.len(),
            Err((at, e)) => {
                assert!(at < piece.len(), "refused at {at} of {} bytes", piece.len());
                assert_eq!(f.refused(), Some(e));
                assert_eq!(f.feed(b"GET / HTTP/1.1\r\n"), Err((0, e)), "the refusal stays");
                return Err(fed + at);
            }
        }
    }
    Ok(!f.is_off())
}

/// The `h1_member` fuzz target: a member's bytes on one pooled connection, after the router
/// sent it a request. The first byte says whether the request was `HEAD` (its low bit) and the
/// second how many bytes each read returns; the rest is everything the member sends. Read as
/// the own path reads it (the response head, then its body streamed to the client), the
/// invariant is that no byte of this exchange lands in another:
/// - the client gets only body bytes that follow the response's head on the wire, at most the
///   framing's length, never a byte past it;
/// - a connection that goes back to the pool had exactly this response read off it (a later
///   byte is the pool's to refuse when the connection is taken: `pool::Idle::take`);
/// - the verdict, and a whole body's bytes, do not depend on how the bytes arrived (read in
///   the given pieces, byte by byte and whole), except that a body refused in the first read
///   is refused before the head goes (a 502) rather than after it.
pub fn member_input(data: &[u8]) {
    let [flags, step, stream @ ..] = data else { return };
    let head_request = flags & 1 == 1;
    let runs = [usize::from(*step).max(1), 1, stream.len().max(1)];
    let relayed =
        runs.map(|step| RUNTIME.with(|rt| rt.block_on(relay(stream, step, head_request))));
    let [first, bytewise, whole] = &relayed;
    for other in [bytewise, whole] {
        assert_eq!(first.0, other.0, "the head was read differently in another arrival");
        match (&first.1, &other.1) {
            (Some(a), Some(b)) if a.whole || b.whole => {
                assert_eq!((a.whole, &a.body), (b.whole, &b.body), "arrival mattered");
            }
            _ => {}
        }
    }
}

/// Relays `stream` read `step` bytes at a time and checks what the client got: where the head
/// ended on the wire and the body, if a head was read.
async fn relay(
    stream: &[u8],
    step: usize,
    head_request: bool,
) -> (Option<usize>, Option<super::pump::Relayed>) {
    let mut member = Pieces { data: stream, step, read: 0 };
    let mut rbuf = Vec::new();
    let Some(head) = super::pump::relay_head(&mut member, &mut rbuf, head_request).await else {
        return (None, None);
    };
    // The head ends where what was read stops, less what followed it in the buffer (which
    // starts with the head).
    assert!(head.len <= rbuf.len(), "a head longer than the bytes read");
    let head_end = member.read - (rbuf.len() - head.len);
    let at = head_end - head.len;
    let again = parse::response(&stream[at..], head_request);
    assert!(matches!(&again, Ok(Some(h)) if h.len == head.len), "no such head on the wire");
    let relayed = super::pump::relay_body(&mut member, rbuf, &head).await;
    let body = &relayed.body;
    assert!(stream[head_end..].starts_with(body), "the client got bytes that are not the body");
    if relayed.unsent {
        assert!(body.is_empty() && !relayed.pooled, "a refused body was sent");
    }
    match head.framing {
        Framing::Length(n) => assert!(body.len() as u64 <= n, "past the content-length"),
        Framing::None => assert!(body.is_empty(), "a body where none is framed"),
        Framing::Chunked if !relayed.unsent => {
            let mut c = Chunked::new(super::pump::MAX_RESPONSE_HEAD);
            assert_eq!(c.feed(body), Ok(body.len()), "the client got bytes past the last chunk");
            assert_eq!(c.is_done(), relayed.whole);
        }
        Framing::Chunked => {}
        Framing::Close => assert!(!relayed.pooled),
    }
    if relayed.pooled {
        assert!(relayed.whole);
        assert_eq!(head_end + body.len(), member.read, "a pooled connection had more read off it");
    }
    (Some(head_end), Some(relayed))
}

/// A member's bytes, `step` at a time; `read` counts what was read.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
    read: usize,
}

// Not a socket: its body is always copied.
impl crate::splice::PlainTcp for Pieces<'_> {}

impl tokio::io::AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self.step.min(self.data.len() - self.read).min(buf.remaining());
        buf.put_slice(&self.data[self.read..self.read + n]);
        self.read += n;
        std::task::Poll::Ready(Ok(()))
    }
}

thread_local! {
    /// One runtime per fuzzing thread (the relay never waits on a timer or a socket).
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime");
}
