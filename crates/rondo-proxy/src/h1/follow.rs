//! Follows the requests of an HTTP/1 connection that hyper serves (one this path declined), so
//! that their chunked bodies meet the own path's rules ([`super::chunked`]) there too. hyper
//! skips chunk extensions unread: a NUL, bare CR or other control byte in one would otherwise
//! pass to a member that may read the body differently. The follower sits under hyper, in
//! [`crate::conn::TimedIo`], and sees the client's bytes in order; at a malformed chunked body
//! the read fails, so the request's body fails (400 when no response has begun, as on the own
//! path) and hyper closes the connection.
//!
//! What the follower does not read it leaves to hyper, and stops following the connection:
//! a head the own path would refuse (hyper refuses it too, or serves it by its own rules), a
//! protocol switch (`Upgrade`, `CONNECT`: what follows may not be HTTP), a head over the
//! listener's limits. Those connections are hyper's alone, as before.

use super::chunked::{ChunkError, Chunked};
use super::parse::{self, Framing, Limits};

/// Where the follower is in the connection's request stream.
#[derive(Debug)]
enum At {
    /// A request head, of which these bytes have arrived.
    Head(Vec<u8>),
    /// A body of a length: this many bytes are left.
    Length(u64),
    /// A chunked body.
    Chunked(Box<Chunked>),
    /// Not following (see the module's doc).
    Off,
    /// A chunked body was malformed: every read fails.
    Refused(ChunkError),
}

/// The follower of one connection's requests.
#[derive(Debug)]
pub struct Follow {
    at: At,
    limits: Limits,
}

impl Follow {
    /// Follows a connection from its first byte; heads are read within `limits` (the
    /// listener's `max_header_bytes` and `max_headers`).
    pub fn new(limits: Limits) -> Self {
        Follow { at: At::Head(Vec::new()), limits }
    }

    /// Follows `bytes`, the next the client sent. An error: a chunked body is malformed from
    /// the byte at `.0` on (the bytes before it are well formed and may be passed on), and the
    /// connection must end (every later call fails, at 0).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), (usize, ChunkError)> {
        let all = bytes.len();
        let mut bytes = bytes;
        while !bytes.is_empty() {
            match &mut self.at {
                At::Off => return Ok(()),
                At::Refused(e) => return Err((0, *e)),
                At::Head(head) => {
                    let before = head.len();
                    let room = self.limits.max_bytes.saturating_sub(before);
                    head.extend_from_slice(&bytes[..bytes.len().min(room)]);
                    match parse::request(head, self.limits) {
                        Ok(None) if head.len() < self.limits.max_bytes => return Ok(()),
                        Ok(Some(h)) => {
                            bytes = &bytes[h.len - before..];
                            let switch = h.decline == Some(parse::Decline::Upgrade)
                                || h.method.get(head).eq_ignore_ascii_case(b"CONNECT");
                            self.at = match h.framing {
                                _ if switch => At::Off,
                                Framing::None | Framing::Length(0) => At::Head(Vec::new()),
                                Framing::Length(n) => At::Length(n),
                                Framing::Chunked => {
                                    At::Chunked(Box::new(Chunked::new(self.limits.max_bytes)))
                                }
                                Framing::Close => At::Off,
                            };
                        }
                        // Over the limits, or a head the own path refuses: hyper's to judge.
                        Ok(None) | Err(_) => self.at = At::Off,
                    }
                }
                At::Length(left) => {
                    let n = bytes.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    bytes = &bytes[n..];
                    *left -= n as u64;
                    if *left == 0 {
                        self.at = At::Head(Vec::new());
                    }
                }
                At::Chunked(c) => {
                    let from = (**c).clone();
                    match c.feed(bytes) {
                        Ok(n) => {
                            bytes = &bytes[n..];
                            if c.is_done() {
                                self.at = At::Head(Vec::new());
                            }
                        }
                        Err(e) => {
                            // Where: the first byte the decoder refuses, fed one at a time again
                            // from where this call found it (once per connection at most).
                            let mut again = from;
                            let bad = (0..bytes.len())
                                .find(|&i| again.feed(&bytes[i..=i]).is_err())
                                .unwrap_or(0);
                            self.at = At::Refused(e);
                            return Err((all - bytes.len() + bad, e));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the follower has stopped following the connection.
    pub fn is_off(&self) -> bool {
        matches!(self.at, At::Off)
    }

    /// The malformed chunked body that ended the connection, if one did.
    pub fn refused(&self) -> Option<ChunkError> {
        match self.at {
            At::Refused(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow() -> Follow {
        Follow::new(Limits { max_bytes: 1024, max_fields: 32 })
    }

    const GOOD: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;n=v\r\nhello\r\n0\r\n\r\n";

    #[test]
    fn well_formed_requests_pass_in_any_split() {
        let stream =
            [GOOD, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", GOOD].concat();
        for split in 0..stream.len() {
            let mut f = follow();
            assert_eq!(f.feed(&stream[..split]), Ok(()), "split {split}");
            assert_eq!(f.feed(&stream[split..]), Ok(()), "split {split}");
            assert!(!f.is_off(), "split {split}");
        }
    }

    #[test]
    fn a_control_byte_in_a_chunk_extension_fails_this_read_and_every_later_one() {
        // After a first request with a body of a length, so the follower must count it.
        let first = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n5;a\0";
        let bad = b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;a\0b\r\nhello\r\n0\r\n\r\n";
        let mut f = follow();
        assert_eq!(f.feed(first), Ok(()), "inside a body of a length, NUL is data");
        let (at, e) = f.feed(bad).expect_err("NUL in an extension");
        assert_eq!(&bad[at..at + 2], b"\0b", "the NUL is the first byte refused");
        assert!(e.to_string().contains("malformed chunked body"), "{e}");
        assert_eq!(f.refused(), Some(e));
        assert_eq!(f.feed(b"GET / HTTP/1.1\r\n"), Err((0, e)), "refused for good");
    }

    #[test]
    fn a_protocol_switch_or_a_head_it_does_not_read_ends_the_following() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: ws\r\n\r\n"[..],
            b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            &[b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 2000]].concat(),
        ] {
            let mut f = follow();
            let tunnel = b"1;\0\r\n";
            assert_eq!(f.feed(&[head, tunnel].concat()), Ok(()));
            assert!(f.is_off(), "{}", String::from_utf8_lossy(&head[..20]));
        }
    }
}
