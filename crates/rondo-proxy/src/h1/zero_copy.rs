//! Zero-copy bodies on the own path: the part of an HTTP/1 body whose length is known before
//! its bytes arrive (what a `Content-Length` leaves, or a chunk's data once its size line is
//! read) moves socket → pipe → socket with splice(2), through [`crate::splice`]'s per-worker
//! pipes, when both ends are plain TCP and the listener says `splice = "auto"`.
//!
//! Nothing on this path reads a body: a route whose filters hold, rewrite or copy bodies
//! (`compress`, `soap`, `mirror`, body matches, multicast, session replay) and a cluster that
//! keeps bodies to send again (status retries, hedging) are hyper's, decided when the route's
//! chain is compiled ([`crate::chain::Chain::needs_hyper`]), so the pumps need no per-request
//! check of their own beyond the listener's setting and the streams' types. A part shorter
//! than [`SPLICE_AT_LEAST`] copies, as HAProxy's `splice-auto` copies a sender until it fills a
//! buffer: splicing a few bytes costs two system calls where a copy costs one. Chunk size
//! lines and trailers are always read (they are parsed), and bytes that came with the head are
//! always copied first, so the order of bytes holds and a pipelined request after the body
//! stays in the client's socket for the next read.
//!
//! How each body byte moved is counted per listener in `rondo_http_body_bytes_total{path}`
//! ([`BodyBytes`]), once per message and only for bodies that streamed past the buffer their
//! head came in: a small exchange counts nothing and pays nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rondo_runtime::metrics::BodyBytes;
use tokio::net::TcpStream;

use crate::splice::{COPY_BUFFER, Moved, PIPE_SIZE, Pipe, PlainTcp};

/// A known run of body bytes at least this long is spliced; a shorter one copies.
pub(super) const SPLICE_AT_LEAST: u64 = COPY_BUFFER as u64;

/// How a message's body may move and where its bytes are counted: the listener's `splice`
/// and its counters.
#[derive(Clone, Copy)]
pub(super) struct Mover<'a> {
    /// Whether the listener splices (`splice = "auto"`).
    pub(super) splice: bool,
    pub(super) bytes: &'a BodyBytes,
}

impl Mover<'_> {
    /// Both plain sockets, when this body part may be spliced: the listener splices, both ends
    /// are plain TCP, and `left` known bytes make it worth it.
    pub(super) fn pair<'s, R: PlainTcp, W: PlainTcp>(
        &self,
        from: &'s R,
        to: &'s W,
        left: u64,
    ) -> Option<(&'s TcpStream, &'s TcpStream)> {
        if !self.splice || left < SPLICE_AT_LEAST {
            return None;
        }
        Some((from.plain()?, to.plain()?))
    }

    /// Counts a message's body bytes, once at its end (nothing for a body that never streamed).
    pub(super) fn count(&self, moved: Moved) {
        if moved.total() > 0 {
            self.bytes.add(moved.spliced, moved.copied);
        }
    }
}

/// How a splice of a known run of body bytes ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Spliced {
    /// Every byte went.
    Whole,
    /// No pipe could be had (out of descriptors): nothing moved, the caller copies.
    NoPipe,
    /// The sender closed, or its socket failed, before the run was over.
    ReadEnded,
    /// The sender sent nothing for the stall timeout.
    Stalled,
    /// The receiver's socket failed.
    WriteFailed,
    /// The watched member began to answer before the run was over (only between pipefuls:
    /// the pipe is empty then).
    Answered,
}

/// What a splice of a request body watches besides its two sockets: the longest wait for the
/// client's next bytes, the member whose answer ends the body early, and the flag that says
/// the try waits on the client (not on the member) meanwhile.
#[derive(Clone, Copy)]
pub(super) struct Watch<'a> {
    pub(super) stall: Duration,
    pub(super) member: Option<&'a TcpStream>,
    pub(super) waiting_client: &'a AtomicBool,
}

/// Moves exactly `len` bytes from `from` to `to` through a pooled pipe, counting each one that
/// reached `to` into `moved` as it goes (so a cut run still counts what went). The pipe goes
/// back to the pool only empty; a cut (or dropped) run closes it, so none of its bytes can
/// reach another exchange.
pub(super) async fn splice_exact(
    from: &TcpStream,
    to: &TcpStream,
    mut len: u64,
    watch: Option<Watch<'_>>,
    moved: &mut u64,
) -> Spliced {
    let Some(pipe) = Pipe::take() else {
        return Spliced::NoPipe;
    };
    while len > 0 {
        let max = usize::try_from(len).unwrap_or(usize::MAX).min(PIPE_SIZE);
        let filled = match watch {
            None => pipe.fill(from, max).await,
            Some(w) => {
                w.waiting_client.store(true, Ordering::Relaxed);
                let read = tokio::select! {
                    biased;
                    () = answered(w.member) => None,
                    r = tokio::time::timeout(w.stall, pipe.fill(from, max)) => Some(r),
                };
                w.waiting_client.store(false, Ordering::Relaxed);
                match read {
                    None => {
                        // Nothing was taken from the client in this round: the pipe is empty.
                        pipe.give();
                        return Spliced::Answered;
                    }
                    Some(Err(_stalled)) => return Spliced::Stalled,
                    Some(Ok(r)) => r,
                }
            }
        };
        let n = match filled {
            Ok(0) | Err(_) => return Spliced::ReadEnded,
            Ok(n) => n,
        };
        if pipe.drain(to, n, moved).await.is_err() {
            return Spliced::WriteFailed;
        }
        len -= n as u64;
    }
    pipe.give();
    Spliced::Whole
}

impl PlainTcp for tokio::net::tcp::WriteHalf<'_> {
    fn plain(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl PlainTcp for tokio::net::tcp::ReadHalf<'_> {
    fn plain(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

// The halves of a client stream split for the rare exchange that streams both ways at once
// (`pump_both`), and the fuzz target's buffers: copied.
impl<T> PlainTcp for tokio::io::ReadHalf<T> {}
impl<T> PlainTcp for tokio::io::WriteHalf<T> {}
impl PlainTcp for Vec<u8> {}
impl<T: PlainTcp + ?Sized> PlainTcp for &mut T {
    fn plain(&self) -> Option<&TcpStream> {
        (**self).plain()
    }
}

/// Resolves when the watched member connection has something to read (its answer), or is
/// closed. A peek, not `readable()` alone: a spliced response before this request on the same
/// pooled connection leaves tokio's readiness set with nothing to read (a splice that took the
/// whole body never saw `EAGAIN`), and a stale readiness taken for an answer stopped the body.
pub(super) async fn answered(watch: Option<&TcpStream>) {
    match watch {
        Some(s) => {
            let mut probe = [0u8; 1];
            let _ = s.peek(&mut probe).await;
        }
        None => std::future::pending().await,
    }
}
