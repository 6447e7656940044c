//! The own path's byte pumps: the request body from the client to a member ([`pump_body`],
//! held to the listener's limits), the member's response head read past interim responses
//! ([`read_response_head`]) and its body to the client ([`pump_response`]), each following the
//! message's framing byte by byte so a connection is reused only after a whole message. Also
//! the same response relay as plain functions for the `h1_member` fuzz target ([`relay_head`],
//! [`relay_body`]). A run of body bytes of known length between two plain sockets is spliced
//! ([`super::zero_copy`]); everything else is copied through a pooled buffer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::chunked::{ChunkError, Chunked};
use super::client::{ClientStream, ReqBody};
use super::parse::{self, Framing, ResponseHead};
use super::pool;
use super::zero_copy::{Mover, Spliced, Watch, answered, splice_exact};
use crate::body::Finish;
use crate::error::Kind;
use crate::splice::{Moved, PlainTcp};

/// Body bytes that arrived with a response head are sent with it in one write up to this many.
const COALESCE: usize = 16 * 1024;
/// A response head from a member larger than this is refused (502).
pub(super) const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Reads more of the connection into `buf` (growing it when full).
pub(super) async fn read_more<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(pool::BUF_SIZE);
    }
    stream.read_buf(buf).await
}

/// Streams the rest of the request body from the client (`from`) to the member (`to`), held to
/// the listener's body `limit` and waiting at most `stall` (`body_read_timeout_ms`) for each
/// next byte (then [`Kind::ClientBodyTimeout`]: 408, or a cut response when the member already
/// answered); bytes past the body's end are kept in `extra`. With `watch`, stops as soon as the
/// member starts answering: `Ok(true)`. Known runs are spliced as `mover` allows.
#[allow(clippy::too_many_arguments)]
pub(super) async fn pump_body<R, W>(
    body: &mut ReqBody,
    extra: &mut Vec<u8>,
    (limit, stall): (u64, Duration),
    from: &mut R,
    to: &mut W,
    watch: Option<&TcpStream>,
    waiting_client: &AtomicBool,
    mover: Mover<'_>,
) -> Result<bool, SendError>
where
    R: AsyncRead + Unpin + PlainTcp,
    W: AsyncWrite + Unpin + PlainTcp,
{
    let mut chunk = pool::take();
    let mut counted = Counted { mover, moved: Moved::default() };
    let result = loop {
        if body.remaining == 0 && body.chunked.as_ref().is_none_or(Chunked::is_done) {
            body.complete = true;
            break Ok(false);
        }
        let left = body.chunked.as_ref().map_or(body.remaining, Chunked::data_left);
        // Spliced only within the limit: a body over it is refused before its bytes go on.
        let within = limit == 0 || body.received.saturating_add(left) <= limit;
        if within && let Some((f, t)) = counted.mover.pair(&*from, &*to, left) {
            let w = Watch { stall, member: watch, waiting_client };
            let mut n = 0;
            // Boxed: the bulk case, whose pipe and waits would take room in every try's future.
            let spliced = Box::pin(splice_exact(f, t, left, Some(w), &mut n)).await;
            counted.moved.spliced += n;
            body.received += n;
            match &mut body.chunked {
                Some(c) => c.passed(n),
                None => body.remaining -= n,
            }
            match spliced {
                Spliced::Whole => continue,
                Spliced::NoPipe => counted.mover.splice = false,
                Spliced::Answered => break Ok(true),
                Spliced::ReadEnded => break Err(SendError::Client(Kind::ClientBody)),
                Spliced::Stalled => break Err(SendError::Client(Kind::ClientBodyTimeout)),
                Spliced::WriteFailed => break Err(SendError::Member),
            }
        }
        chunk.clear();
        waiting_client.store(true, Ordering::Relaxed);
        let read = tokio::select! {
            biased;
            () = answered(watch) => None,
            r = tokio::time::timeout(stall, read_more(from, &mut chunk)) => Some(r),
        };
        waiting_client.store(false, Ordering::Relaxed);
        let n = match read {
            None => break Ok(true),
            Some(Err(_stalled)) => break Err(SendError::Client(Kind::ClientBodyTimeout)),
            Some(Ok(Ok(0) | Err(_))) => break Err(SendError::Client(Kind::ClientBody)),
            Some(Ok(Ok(n))) => n,
        };
        let take = match &mut body.chunked {
            Some(c) => match c.feed(&chunk[..n]) {
                Ok(k) => k,
                Err(_) => break Err(SendError::Client(Kind::ClientBody)),
            },
            None => {
                let k = (n as u64).min(body.remaining);
                body.remaining -= k;
                k as usize
            }
        };
        body.received += take as u64;
        counted.moved.copied += take as u64;
        if limit > 0 && body.received > limit {
            break Err(SendError::Client(Kind::BodyTooLarge));
        }
        extra.extend_from_slice(&chunk[take..n]);
        if to.write_all(&chunk[..take]).await.is_err() {
            break Err(SendError::Member);
        }
    };
    pool::give(chunk);
    result
}

/// Counts a message's streamed body bytes when its pump ends, however it ends.
struct Counted<'a> {
    mover: Mover<'a>,
    moved: Moved,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.mover.count(self.moved);
    }
}

/// Streams the member's response to the client (`to`): `head` (the head as the client gets it,
/// sent with the first body bytes in one write), then the body, whose first bytes are already
/// in `rbuf` after the member's head, then the rest from `from`. Returns whether the body was
/// whole, whether the client took every byte, and whether nothing followed the response (else
/// the member connection goes). A member that sent bytes past its response loses its
/// connection, not the client its own. A body that breaks its chunked coding before the head
/// was written is [`Unsent`]: nothing reached the client. Known runs past the first buffer are
/// spliced as `mover` allows.
pub(super) async fn pump_response<R, W>(
    rhead: &ResponseHead,
    head: &mut Vec<u8>,
    rbuf: &mut Vec<u8>,
    (from, to): (&mut R, &mut W),
    finish: &mut Option<Finish>,
    mover: Mover<'_>,
) -> Result<(bool, bool, bool), Unsent>
where
    R: AsyncRead + Unpin + PlainTcp,
    W: AsyncWrite + Unpin + PlainTcp,
{
    let mut counted = Counted { mover, moved: Moved::default() };
    // Past the first buffer (what came with the head), the bytes are counted as streamed.
    let mut streamed = false;
    let mut pending = rhead.len;
    let mut chunked = (rhead.framing == Framing::Chunked).then(|| Chunked::new(MAX_RESPONSE_HEAD));
    let mut remaining = match rhead.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    loop {
        let avail = &rbuf[pending..];
        let (take, done) = match (rhead.framing, &mut chunked) {
            (Framing::None, _) => (0, true),
            (Framing::Length(_), _) => {
                let k = (avail.len() as u64).min(remaining) as usize;
                remaining -= k as u64;
                (k, remaining == 0)
            }
            (Framing::Chunked, Some(c)) => match c.feed(avail) {
                Ok(k) => (k, c.is_done()),
                Err(why) if !head.is_empty() => return Err(Unsent(why)),
                Err(_) => return Ok((false, true, false)),
            },
            _ => (avail.len(), false),
        };
        if let Some(f) = finish.as_mut() {
            f.sent(take);
        }
        if streamed {
            counted.moved.copied += take as u64;
        }
        if done {
            // The member's request ends before the client can see the response's end, so a
            // next request the client sends at once finds the member's load as it is.
            drop(finish.take());
        }
        let written = if !head.is_empty() {
            // The head and what came with it in one write (one system call for a small answer).
            if take <= COALESCE {
                head.extend_from_slice(&avail[..take]);
                to.write_all(head).await
            } else {
                match to.write_all(head).await {
                    Ok(()) => to.write_all(&avail[..take]).await,
                    e => e,
                }
            }
        } else if take > 0 {
            to.write_all(&avail[..take]).await
        } else {
            Ok(())
        };
        head.clear();
        if written.is_err() {
            return Ok((false, false, false));
        }
        if done {
            // Bytes past the response: the member spoke out of turn; its connection goes.
            return Ok((true, true, take == avail.len()));
        }
        rbuf.clear();
        pending = 0;
        streamed = true;
        let left = chunked.as_ref().map_or(remaining, Chunked::data_left);
        if let Some((f, t)) = counted.mover.pair(&*from, &*to, left) {
            let mut n = 0;
            // Boxed: the bulk case, whose pipe and waits would take room in every try's future.
            let spliced = Box::pin(splice_exact(f, t, left, None, &mut n)).await;
            counted.moved.spliced += n;
            if let Some(f) = finish.as_mut() {
                f.sent(n as usize);
            }
            match &mut chunked {
                Some(c) => c.passed(n),
                None => remaining -= n,
            }
            match spliced {
                // The loop's top sees the body's end (or, chunked, reads the next size line).
                Spliced::Whole => continue,
                Spliced::NoPipe => counted.mover.splice = false,
                Spliced::WriteFailed => return Ok((false, false, false)),
                _ => return Ok((false, true, false)),
            }
        }
        match read_more(from, rbuf).await {
            // A body delimited by the close is whole when the member closes.
            Ok(0) if rhead.framing == Framing::Close => {
                drop(finish.take());
                return Ok((true, true, false));
            }
            Ok(0) | Err(_) => return Ok((false, true, false)),
            Ok(_) => {}
        }
    }
}

/// A member's response body was refused before any of it went to the client.
pub(super) struct Unsent(pub(super) ChunkError);

/// Why sending a request failed.
pub(super) enum SendError {
    /// The member's side of the connection failed.
    Member,
    /// The client's body failed, for this reason.
    Client(Kind),
}

/// Why reading a response head failed.
pub(super) enum HeadFailure {
    /// The connection closed before any byte of a response (a pooled connection the member
    /// closed as it was reused).
    Stale,
    /// The member failed, or answered what the router does not pass on.
    Failed(Kind),
    /// The client closed its connection while waiting.
    ClientGone,
}
use HeadFailure::{Failed, Stale};

/// Reads the member's response head (skipping interim 1xx responses) into `rbuf`.
pub(super) async fn read_response_head<S: ClientStream, R: AsyncRead + Unpin>(
    upstream: &mut R,
    rbuf: &mut Vec<u8>,
    head_request: bool,
    client: Option<(&S, tokio::time::Instant)>,
) -> Result<ResponseHead, HeadFailure> {
    let mut seen_any = false;
    loop {
        if !rbuf.is_empty() {
            match parse::response(rbuf, head_request) {
                Ok(Some(head)) if head.status == 101 => return Err(Failed(Kind::Reset)),
                Ok(Some(head)) if (100..200).contains(&head.status) => {
                    rbuf.drain(..head.len);
                    continue;
                }
                Ok(Some(head)) if head.status > 599 || head.status < 100 => {
                    return Err(Failed(Kind::BadStatus));
                }
                Ok(Some(head)) => return Ok(head),
                Ok(None) if rbuf.len() >= MAX_RESPONSE_HEAD => return Err(Failed(Kind::Reset)),
                Ok(None) => {}
                Err(why) => {
                    tracing::debug!("member's response refused: {why}");
                    return Err(Failed(Kind::Reset));
                }
            }
        }
        let read = tokio::select! {
            r = read_more(upstream, rbuf) => r,
            () = client_gone(client) => return Err(HeadFailure::ClientGone),
        };
        match read {
            Ok(0) | Err(_) if !seen_any => return Err(Stale),
            Ok(0) | Err(_) => return Err(Failed(Kind::Reset)),
            Ok(_) => seen_any = true,
        }
    }
}

/// What the own path made of a member's response body, for the `h1_member` fuzz target
/// (`super::fuzz::member_input`).
#[cfg(feature = "fuzzing")]
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Relayed {
    /// The response body bytes the client got (after the head).
    pub(super) body: Vec<u8>,
    /// Whether the body was whole.
    pub(super) whole: bool,
    /// Whether the member connection would go back to the pool.
    pub(super) pooled: bool,
    /// Whether the body was refused before anything went to the client.
    pub(super) unsent: bool,
}

/// Reads a response head off `member` into `rbuf` as a try does (interim responses skipped):
/// its length and framing, with what followed it left in `rbuf`.
#[cfg(feature = "fuzzing")]
pub(super) async fn relay_head<R: AsyncRead + Unpin>(
    member: &mut R,
    rbuf: &mut Vec<u8>,
    head_request: bool,
) -> Option<ResponseHead> {
    let none = None::<(&TcpStream, tokio::time::Instant)>;
    read_response_head(member, rbuf, head_request, none).await.ok()
}

/// Streams the body of `rhead` as the respond stage does, to a client that takes every byte.
#[cfg(feature = "fuzzing")]
pub(super) async fn relay_body<R: AsyncRead + Unpin + PlainTcp>(
    member: &mut R,
    mut rbuf: Vec<u8>,
    rhead: &ResponseHead,
) -> Relayed {
    // A one-byte head marks where the body starts in what the client got.
    let (mut head, mut client) = (vec![b'#'], Vec::new());
    let uncounted = rondo_runtime::metrics::BodyBytes::default();
    let mover = Mover { splice: false, bytes: &uncounted };
    let ends = (member, &mut client);
    let pumped = pump_response(rhead, &mut head, &mut rbuf, ends, &mut None, mover).await;
    match pumped {
        Ok((whole, _, clean)) => Relayed {
            body: client.split_off(1.min(client.len())),
            whole,
            pooled: whole && clean && rhead.reusable,
            unsent: false,
        },
        Err(Unsent(_)) => Relayed { body: Vec::new(), whole: false, pooled: false, unsent: true },
    }
}

/// Resolves when the client (if any is watched) has closed its connection; never when it sends
/// more (a pipelined request, left for later). It is looked at no sooner than `look_at`
/// (`WATCH_CLIENT_AFTER` in [`super::exchange`] into the wait for the answer).
async fn client_gone<S: ClientStream>(client: Option<(&S, tokio::time::Instant)>) {
    match client {
        Some((client, look_at)) => {
            // Not at once: most members answer sooner, and looking costs a system call. Nor
            // while the client's socket stays quiet, the usual case: waiting for its readiness
            // (which the read that drained it cleared) costs nothing, where a timer set for
            // every request cost its place in tokio's wheel.
            client.stirs().await;
            // Boxed: the rest runs only when the client's socket stirred while its member
            // thinks (rare), and its timer would take room in every try's future.
            Box::pin(async {
                tokio::time::sleep_until(look_at).await;
                client.closed().await;
            })
            .await;
        }
        None => std::future::pending().await,
    }
}
