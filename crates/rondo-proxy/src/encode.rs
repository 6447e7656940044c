//! The `compress` filter's response body: the member's body (`crate::body::ProxyBody`) through a
//! streaming encoder (async-compression's gzip, brotli or zstd writer over a `Vec`), never
//! held whole. Input is fed as it arrives; whenever the member has nothing more for now, the
//! encoder is flushed (a sync flush), so a slow or streaming member's bytes reach the client
//! without waiting for the end. Trailers pass through after the encoded end.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_compression::Level;
use async_compression::tokio::write::{BrotliEncoder, GzipEncoder, ZstdEncoder};
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use rondo_core::traffic::Encoding;
use rondo_runtime::metrics::Counter;
use tokio::io::AsyncWrite;

/// A body's error (the same type as `crate::body::BoxError`, named here so that this file
/// stays below the body it wraps).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body being encoded: a member's, as the router passes it on.
type Inner = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

/// Encoded output past this is sent at once, without waiting for a flush.
const EMIT_AT: usize = 32 * 1024;
/// Input one poll takes before it lets other tasks run (with nothing to send yet).
const TAKE_PER_POLL: usize = 256 * 1024;

/// One of the encoders, writing into a `Vec` (which never waits).
enum Encoder {
    Gzip(GzipEncoder<Vec<u8>>),
    /// Boxed: brotli's state is some 5 KiB.
    Br(Box<BrotliEncoder<Vec<u8>>>),
    Zstd(ZstdEncoder<Vec<u8>>),
}

macro_rules! each {
    ($enc:expr, $e:ident => $body:expr) => {
        match $enc {
            Encoder::Gzip($e) => $body,
            Encoder::Br($e) => $body,
            Encoder::Zstd($e) => $body,
        }
    };
}

/// A poll of a writer into a `Vec` that says it must wait: never, but not a reason to spin.
fn never_waits() -> io::Error {
    io::Error::other("the encoder's buffer asked to wait")
}

impl Encoder {
    fn new(encoding: Encoding, level: u32) -> Encoder {
        let level = Level::Precise(level as i32);
        match encoding {
            Encoding::Gzip => Encoder::Gzip(GzipEncoder::with_quality(Vec::new(), level)),
            Encoding::Br => Encoder::Br(Box::new(BrotliEncoder::with_quality(Vec::new(), level))),
            Encoding::Zstd => Encoder::Zstd(ZstdEncoder::with_quality(Vec::new(), level)),
        }
    }

    fn write_all(&mut self, cx: &mut Context<'_>, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = each!(self, e => Pin::new(e).poll_write(cx, data));
            match n {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => data = &data[n..],
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Err(never_waits()),
            }
        }
        Ok(())
    }

    fn flush(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match each!(self, e => Pin::new(e).poll_flush(cx)) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(never_waits()),
        }
    }

    fn finish(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match each!(self, e => Pin::new(e).poll_shutdown(cx)) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(never_waits()),
        }
    }

    /// The encoded bytes so far, taken.
    fn take(&mut self) -> Option<Bytes> {
        let out = each!(self, e => e.get_mut());
        (!out.is_empty()).then(|| Bytes::from(std::mem::take(out)))
    }

    fn pending(&mut self) -> usize {
        each!(self, e => e.get_mut().len())
    }
}

enum State {
    Body,
    /// The encoded end went out; the trailers (if any) follow.
    Trailers(Option<HeaderMap>),
    Done,
}

/// A member's body, encoded as it streams.
pub struct Encoded {
    inner: Inner,
    encoder: Encoder,
    /// Input went in since the last flush.
    unflushed: bool,
    state: State,
    bytes_in: Counter,
    bytes_out: Counter,
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let encoding = match self.encoder {
            Encoder::Gzip(_) => "gzip",
            Encoder::Br(_) => "br",
            Encoder::Zstd(_) => "zstd",
        };
        f.debug_struct("Encoded").field("encoding", &encoding).finish_non_exhaustive()
    }
}

impl Encoded {
    /// `inner` encoded in `encoding` at `level`, its bytes counted into `(bytes_in, bytes_out)`.
    pub(crate) fn new(
        inner: impl Body<Data = Bytes, Error = BoxError> + Send + 'static,
        encoding: Encoding,
        level: u32,
        (bytes_in, bytes_out): (Counter, Counter),
    ) -> Encoded {
        Encoded {
            inner: Box::pin(inner),
            encoder: Encoder::new(encoding, level),
            unflushed: false,
            state: State::Body,
            bytes_in,
            bytes_out,
        }
    }

    fn out(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.bytes_out.inc_by(data.len() as u64);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    /// The member's body ended (with `trailers`): the encoder's end goes out first.
    fn end(&mut self, cx: &mut Context<'_>, trailers: Option<HeaderMap>) -> io::Result<()> {
        self.encoder.finish(cx)?;
        self.state = State::Trailers(trailers);
        Ok(())
    }
}

impl Body for Encoded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let mut taken = 0;
        loop {
            match &mut this.state {
                State::Body => {}
                State::Trailers(t) => {
                    if let Some(data) = this.encoder.take() {
                        return this.out(data);
                    }
                    let t = t.take();
                    this.state = State::Done;
                    return Poll::Ready(t.map(|t| Ok(Frame::trailers(t))));
                }
                State::Done => return Poll::Ready(None),
            }
            let polled = this.inner.as_mut().poll_frame(cx);
            let step = match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.bytes_in.inc_by(data.len() as u64);
                        taken += data.len();
                        this.unflushed = true;
                        this.encoder.write_all(cx, &data)
                    }
                    Err(frame) => this.end(cx, frame.into_trailers().ok()),
                },
                Poll::Ready(Some(Err(e))) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => this.end(cx, None),
                Poll::Pending => {
                    // Nothing more from the member for now: what it sent goes out.
                    if this.unflushed {
                        this.unflushed = false;
                        if let Err(e) = this.encoder.flush(cx) {
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(e.into())));
                        }
                    }
                    return match this.encoder.take() {
                        Some(data) => this.out(data),
                        None => Poll::Pending,
                    };
                }
            };
            if let Err(e) = step {
                this.state = State::Done;
                return Poll::Ready(Some(Err(e.into())));
            }
            if matches!(this.state, State::Body) && this.encoder.pending() >= EMIT_AT {
                let data = this.encoder.take().unwrap_or_default();
                return this.out(data);
            }
            if matches!(this.state, State::Body) && taken >= TAKE_PER_POLL {
                // A fast member and a compressible body: let other tasks run.
                cx.waker().wake_by_ref();
                return match this.encoder.take() {
                    Some(data) => this.out(data),
                    None => Poll::Pending,
                };
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
