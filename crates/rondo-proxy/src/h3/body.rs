//! An HTTP/3 request's body as an [`http_body::Body`], so that hyper's path forwards it like
//! hyper's own bodies ([`crate::client_body::ClientBody::H3`]): DATA frames, then the
//! trailers, read off the request stream's receiving half as the member's connection pulls.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use h3::server::RequestStream;
use http_body::{Body, Frame, SizeHint};

/// `crate::body::BoxError`, spelled out (the bodies' module uses this one through
/// `crate::client_body`).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The receiving half of a request stream.
pub(crate) type RecvHalf = RequestStream<h3_quinn::RecvStream, Bytes>;

/// Where the body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Data,
    Trailers,
    Done,
}

/// See the module docs.
pub struct H3Body {
    stream: RecvHalf,
    stage: Stage,
    /// Read by [`H3Body::start`] before anyone polled: given out first.
    first: Option<Result<Frame<Bytes>, BoxError>>,
    /// The `Content-Length` the client declared, less what came: the size hint.
    left: Option<u64>,
}

impl std::fmt::Debug for H3Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Body").field("stage", &self.stage).field("left", &self.left).finish()
    }
}

impl H3Body {
    /// The body of a request whose head declared `length`. What the stream already holds is
    /// read at once, without waiting: a request whose stream ended with its head (a GET) is
    /// then known to have no body, so it is forwarded without one (and stays replayable),
    /// as hyper's bodies are.
    pub(crate) async fn start(stream: RecvHalf, length: Option<u64>) -> H3Body {
        let mut body = H3Body { stream, stage: Stage::Data, first: None, left: length };
        std::future::poll_fn(|cx| {
            if let Poll::Ready(frame) = Pin::new(&mut body).poll_frame(cx) {
                body.first = frame;
            }
            Poll::Ready(())
        })
        .await;
        body
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(frame));
        }
        loop {
            match this.stage {
                Stage::Data => match std::task::ready!(this.stream.poll_recv_data(cx)) {
                    Ok(Some(mut buf)) => {
                        let data = buf.copy_to_bytes(buf.remaining());
                        if let Some(left) = this.left.as_mut() {
                            *left = left.saturating_sub(data.len() as u64);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(None) => this.stage = Stage::Trailers,
                    Err(e) => {
                        this.stage = Stage::Done;
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                },
                Stage::Trailers => {
                    let polled = std::task::ready!(this.stream.poll_recv_trailers(cx));
                    this.stage = Stage::Done;
                    return Poll::Ready(match polled {
                        Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
                        Ok(None) => None,
                        Err(e) => Some(Err(Box::new(e))),
                    });
                }
                Stage::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.stage == Stage::Done
    }

    fn size_hint(&self) -> SizeHint {
        let first = match &self.first {
            Some(Ok(frame)) => frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => 0,
        };
        match self.left {
            _ if self.is_end_stream() => SizeHint::with_exact(0),
            Some(left) => SizeHint::with_exact(left + first),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(first);
                hint
            }
        }
    }
}
