//! The chunked transfer coding (RFC 9112 section 7.1), followed byte by byte so a chunked body
//! passes through unchanged while the router knows where it ends and refuses what two parsers
//! could read differently: a size of more than 16 hex digits (overflow), a chunk extension with
//! a NUL, bare CR or other control byte, a bare LF anywhere, a missing CRLF after a chunk's
//! data, a malformed trailer field. Extensions and trailers are bounded in size.

/// Bytes of one chunk extension, at most.
const MAX_EXTENSION: u32 = 4096;

/// Where in the coding the next byte falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The chunk size's hex digits.
    Size,
    /// White space after the size, before `;` or CR.
    SizeSpace,
    /// A chunk extension, up to CR.
    Extension,
    /// The LF after the size line's CR.
    SizeLf,
    /// Data bytes left in this chunk.
    Data,
    /// The CR after a chunk's data.
    DataCr,
    /// The LF after a chunk's data.
    DataLf,
    /// The start of a trailer line (or of the final empty line).
    TrailerStart,
    /// A trailer field's name.
    TrailerName,
    /// A trailer field's value, up to CR.
    TrailerValue,
    /// The LF ending a trailer line.
    TrailerLf,
    /// The LF of the final empty line.
    EndLf,
    /// The body is over.
    Done,
}

/// A chunked body's framing, followed as its bytes go by.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: State,
    /// The size being read, or the data bytes left.
    size: u64,
    digits: u8,
    extension: u32,
    trailers: usize,
    max_trailers: usize,
    /// The current trailer field name's first bytes, lower case with `_` as `-`.
    name: [u8; 16],
    name_len: u8,
}

/// Trailer names the router sets or strips in heads (identity, forwarding, client
/// certificates, a login): a trailer section must not carry them either way, or a member (or
/// client) that merges trailers into the head would trust them.
const RESERVED_TRAILER_PREFIXES: [&[u8]; 3] = [b"x-rondo-", b"x-forwarded-", b"x-client-cert-"];

/// What is wrong with a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked body: {0}")]
pub struct ChunkError(pub &'static str);

impl Chunked {
    /// A body whose trailer section may be at most `max_trailers` bytes.
    pub fn new(max_trailers: usize) -> Self {
        Chunked {
            state: State::Size,
            size: 0,
            digits: 0,
            extension: 0,
            trailers: 0,
            max_trailers,
            name: [0; 16],
            name_len: 0,
        }
    }

    /// Whether the body's last byte has been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The data bytes left in the chunk under way (0 between chunks): bytes a pump may forward
    /// without looking at them (splice(2)), then report with [`Chunked::passed`].
    pub fn data_left(&self) -> u64 {
        if self.state == State::Data { self.size } else { 0 }
    }

    /// Follows `n` data bytes forwarded unseen, at most [`Chunked::data_left`].
    pub fn passed(&mut self, n: u64) {
        debug_assert!(n <= self.data_left());
        if self.state == State::Data {
            self.size -= n.min(self.size);
            if self.size == 0 {
                self.state = State::DataCr;
            }
        }
    }

    /// Follows `bytes`; returns how many of them belong to the body (all of them unless the
    /// body ends inside `bytes`).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == State::Done {
                return Ok(i);
            }
            if self.state == State::Data {
                let take = (bytes.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                i += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            self.step(bytes[i])?;
            i += 1;
        }
        Ok(i)
    }

    /// One byte through the chunked coding's state machine. One `match` over the states on
    /// purpose (over the ~100 lines a function gets elsewhere): each arm is one state's
    /// transition, read side by side against RFC 9112 section 7.1, and the fuzz target checks
    /// that feeding byte by byte and whole agree.
    fn step(&mut self, b: u8) -> Result<(), ChunkError> {
        self.state = match self.state {
            State::Size => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    if self.digits == 16 {
                        return Err(ChunkError("chunk size over 16 hex digits"));
                    }
                    self.digits += 1;
                    let d = (b as char).to_digit(16).unwrap_or(0);
                    self.size = (self.size << 4) | u64::from(d);
                    State::Size
                }
                _ if self.digits == 0 => return Err(ChunkError("chunk size is not hex")),
                b' ' | b'\t' => State::SizeSpace,
                b';' => self.extension_start(),
                b'\r' => State::SizeLf,
                _ => return Err(ChunkError("chunk size is not hex")),
            },
            State::SizeSpace => match b {
                b' ' | b'\t' => State::SizeSpace,
                b';' => self.extension_start(),
                b'\r' => State::SizeLf,
                _ => return Err(ChunkError("unexpected byte after the chunk size")),
            },
            State::Extension => match b {
                b'\r' => State::SizeLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff => {
                    self.extension += 1;
                    if self.extension > MAX_EXTENSION {
                        return Err(ChunkError("chunk extension too long"));
                    }
                    State::Extension
                }
                _ => return Err(ChunkError("control byte in a chunk extension")),
            },
            State::SizeLf => {
                if b != b'\n' {
                    return Err(ChunkError("chunk size line not ended by CRLF"));
                }
                let size = self.size;
                self.digits = 0;
                if size == 0 { State::TrailerStart } else { State::Data }
            }
            State::Data => unreachable!("data bytes are taken in bulk by feed"),
            State::DataCr => {
                if b != b'\r' {
                    return Err(ChunkError("chunk data not followed by CRLF"));
                }
                State::DataLf
            }
            State::DataLf => {
                if b != b'\n' {
                    return Err(ChunkError("chunk data not followed by CRLF"));
                }
                self.size = 0;
                State::Size
            }
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                _ if is_token(b) => {
                    self.name_len = 0;
                    self.name_byte(b);
                    self.trailer_byte(State::TrailerName)?
                }
                _ => return Err(ChunkError("malformed trailer field name")),
            },
            State::TrailerName => match b {
                b':' => {
                    let name = &self.name[..usize::from(self.name_len)];
                    if RESERVED_TRAILER_PREFIXES.iter().any(|p| name.starts_with(p)) {
                        return Err(ChunkError(
                            "trailer field reserved for the router (x-rondo-*, x-forwarded-*, \
                             x-client-cert-*)",
                        ));
                    }
                    self.trailer_byte(State::TrailerValue)?
                }
                _ if is_token(b) => {
                    self.name_byte(b);
                    self.trailer_byte(State::TrailerName)?
                }
                _ => return Err(ChunkError("malformed trailer field name")),
            },
            State::TrailerValue => match b {
                b'\r' => State::TrailerLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff => self.trailer_byte(State::TrailerValue)?,
                _ => return Err(ChunkError("control byte in a trailer field")),
            },
            State::TrailerLf => {
                if b != b'\n' {
                    return Err(ChunkError("trailer line not ended by CRLF"));
                }
                State::TrailerStart
            }
            State::EndLf => {
                if b != b'\n' {
                    return Err(ChunkError("chunked body not ended by CRLF"));
                }
                State::Done
            }
            State::Done => State::Done,
        };
        Ok(())
    }

    fn extension_start(&mut self) -> State {
        self.extension = 0;
        State::Extension
    }

    fn name_byte(&mut self, b: u8) {
        if let Some(slot) = self.name.get_mut(usize::from(self.name_len)) {
            *slot = if b == b'_' { b'-' } else { b.to_ascii_lowercase() };
            self.name_len += 1;
        }
    }

    fn trailer_byte(&mut self, next: State) -> Result<State, ChunkError> {
        self.trailers += 1;
        if self.trailers > self.max_trailers {
            return Err(ChunkError("trailer section too large"));
        }
        Ok(next)
    }
}

/// Whether `b` may be in a field name (RFC 9110 `tchar`).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(body: &[u8]) -> Result<usize, ChunkError> {
        let mut c = Chunked::new(1024);
        let n = c.feed(body)?;
        assert!(c.is_done(), "not done after {body:?}");
        Ok(n)
    }

    #[test]
    fn a_body_ends_where_its_last_chunk_says() {
        let body = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\nGET /next";
        assert_eq!(whole(body).unwrap(), body.len() - b"GET /next".len());
        assert_eq!(whole(b"0\r\n\r\n").unwrap(), 5);
        assert_eq!(whole(b"A \t;x\r\n0123456789\r\n0\r\n\r\n").unwrap(), 24);
    }

    #[test]
    fn data_passed_unseen_is_followed_like_data_fed() {
        // A pump that splices a chunk's data reports it with `passed`; the framing after it
        // (the data's CRLF, the next size line, the trailers) is read as before.
        let mut c = Chunked::new(1024);
        assert_eq!(c.data_left(), 0, "no chunk under way before its size line");
        assert_eq!(c.feed(b"10;x=1\r\n0123").unwrap(), 12);
        assert_eq!(c.data_left(), 12);
        c.passed(5);
        assert_eq!(c.data_left(), 7);
        c.passed(7);
        assert_eq!(c.data_left(), 0, "the chunk's data is over");
        assert!(c.feed(b"X\r\n").is_err(), "a byte past the chunk's size is refused");
        let mut c = Chunked::new(1024);
        c.feed(b"3\r\n").unwrap();
        c.passed(3);
        let rest = b"\r\n0\r\nX-T: 1\r\n\r\nGET";
        assert_eq!(c.feed(rest).unwrap(), rest.len() - 3);
        assert!(c.is_done());
    }

    #[test]
    fn one_byte_at_a_time_is_the_same() {
        let body = b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n";
        let mut c = Chunked::new(1024);
        for b in body.iter() {
            assert_eq!(c.feed(std::slice::from_ref(b)).unwrap(), 1);
        }
        assert!(c.is_done());
    }

    #[test]
    fn what_two_parsers_could_read_differently_is_refused() {
        for bad in [
            &b"12345678901234567\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5;a\0b\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"\r\n",
            b"0\r\nBad Name: 1\r\n\r\n",
            b"0\r\nX: a\0\r\n\r\n",
            b"0\r\n\n",
        ] {
            let mut c = Chunked::new(1024);
            assert!(c.feed(bad).is_err(), "{bad:?}");
        }
        let mut c = Chunked::new(8);
        assert!(c.feed(b"0\r\nX-Long-Trailer: 1\r\n\r\n").is_err());
        let mut c = Chunked::new(8);
        let ext = format!("1;{}\r\n", "a".repeat(5000));
        assert!(c.feed(ext.as_bytes()).is_err());
    }

    #[test]
    fn trailers_the_router_owns_are_refused_in_any_spelling() {
        for name in [
            "x-rondo-subject",
            "X-Rondo-Claim-Role",
            "x_rondo_subject",
            "X-RONDO-LOGIN",
            "x-forwarded-for",
            "X_Forwarded_Proto",
            "x-client-cert-subject",
        ] {
            let body = format!("0\r\n{name}: root\r\n\r\n");
            let e = Chunked::new(1024).feed(body.as_bytes()).unwrap_err();
            assert!(e.0.contains("reserved for the router"), "{name}: {e}");
        }
        // Other trailers, and names that only begin alike, pass.
        for name in ["x-checksum", "x-rondo", "x-forwarded", "grpc-status", "x-rondox"] {
            let body = format!("0\r\n{name}: 1\r\n\r\n");
            assert_eq!(whole(body.as_bytes()), Ok(body.len()), "{name}");
        }
    }
}
