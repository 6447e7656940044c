//! The request body on its way to members: [`BodySlot`], where the client's body waits until a
//! try reads it (a try that never read it leaves it for the next, and a copy can be kept for a
//! retry), and [`UpstreamBody`], which forwards it frame by frame under the listener's size
//! limit and read timeout. Its errors say whose fault a failed body was.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::client_body::ClientBody;

/// Boxed error used by bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client's request body failed while being forwarded (the client aborted or sent
/// garbage): the client's fault, not the member's.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed: {0}")]
pub struct ClientBodyError(#[source] pub BoxError);

/// No byte of the client's body arrived for the listener's `body_read_timeout_ms`: the
/// client's fault (408), not the member's.
#[derive(Debug, thiserror::Error)]
#[error("no byte of the request body arrived for {} ms", .0.as_millis())]
pub struct BodyStalled(pub Duration);

/// The request body was over the listener's limit.
#[derive(Debug, thiserror::Error)]
#[error("request body over the limit of {0} bytes")]
pub struct TooLarge(pub u64);

/// The client's body, held where a failed try can take it back: a try that never read from it
/// (the connection to the member failed first) leaves it in the slot, so the request can go to
/// another member whatever its method, since nothing was sent.
#[derive(Debug, Clone)]
pub struct BodySlot(Arc<SlotInner>);

#[derive(Debug)]
struct SlotInner {
    body: Mutex<Option<ClientBody>>,
    /// The body's first bytes, read before the first try (a body filter's peek, a multicast
    /// copy's whole body): every try sends them first, then what is left in `body`.
    head: Bytes,
    /// The trailers, when the whole body was read before the first try and had some.
    trailers: Option<http::HeaderMap>,
    /// `head` (and `trailers`) is the whole body: every try can send it again.
    whole: bool,
    /// The whole body was passed on.
    complete: AtomicBool,
    /// The last read of the client's body found nothing yet: the forwarding waits on the
    /// client, not on the member.
    waiting_on_client: AtomicBool,
    /// No byte of the client's body came for the listener's `body_read_timeout_ms`: a try's
    /// error after that is the client's 408, whatever the member connection reports.
    stalled: AtomicBool,
    /// Reading the client's body failed (it broke off, or was malformed): a try's error after
    /// that is the client's, whatever the member connection reports (an HTTP/2 member's
    /// stream is reset, which hyper returns without the body's error as its cause).
    failed_by_client: AtomicBool,
    /// Body bytes passed on (whichever try read them; the body is read once).
    received: AtomicU64,
    /// A copy of what was passed on, kept so that a declined gRPC call can be sent again
    /// ([`BodySlot::keep_copy`]).
    copy: Mutex<Option<Copy>>,
}

/// The copy a slot keeps of its body while it fits `limit` bytes.
#[derive(Debug)]
struct Copy {
    data: Vec<Bytes>,
    trailers: Option<http::HeaderMap>,
    len: u64,
    limit: u64,
}

impl BodySlot {
    /// A slot holding `body`.
    pub fn new(body: ClientBody) -> Self {
        BodySlot::prefixed(Bytes::new(), body)
    }

    /// A slot whose body starts with `head`, read already, and goes on with `rest`.
    pub fn prefixed(head: Bytes, rest: ClientBody) -> Self {
        let received = head.len() as u64;
        BodySlot(Arc::new(SlotInner {
            body: Mutex::new(Some(rest)),
            head,
            trailers: None,
            whole: false,
            complete: AtomicBool::new(false),
            waiting_on_client: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            failed_by_client: AtomicBool::new(false),
            received: AtomicU64::new(received),
            copy: Mutex::new(None),
        }))
    }

    /// A slot holding a whole body read already (and its trailers): every try sends it.
    pub fn whole(body: Bytes, trailers: Option<http::HeaderMap>) -> Self {
        let received = body.len() as u64;
        BodySlot(Arc::new(SlotInner {
            body: Mutex::new(None),
            head: body,
            trailers,
            whole: true,
            complete: AtomicBool::new(true),
            waiting_on_client: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            failed_by_client: AtomicBool::new(false),
            received: AtomicU64::new(received),
            copy: Mutex::new(None),
        }))
    }

    /// The whole body, when it was read before the first try.
    pub fn whole_body(&self) -> Option<(&Bytes, Option<&http::HeaderMap>)> {
        self.0.whole.then(|| (&self.0.head, self.0.trailers.as_ref()))
    }

    /// Body bytes passed on so far.
    pub fn received(&self) -> u64 {
        self.0.received.load(Ordering::Relaxed)
    }

    /// Whether the body is still untouched in the slot.
    pub fn is_untouched(&self) -> bool {
        self.0.whole || self.peek(|b| b.is_some())
    }

    /// Whether a try that timed out was waiting for the client's body rather than for the
    /// member: part of the body was passed on, not all of it, and the last read of the client's
    /// body found nothing (a member that stops reading is not this).
    pub fn stalled_by_client(&self) -> bool {
        !self.0.complete.load(Ordering::Relaxed)
            && !self.is_untouched()
            && self.0.waiting_on_client.load(Ordering::Relaxed)
    }

    /// Whether the client's body stalled for `body_read_timeout_ms`: a try's error after that is
    /// the client's 408.
    pub fn stalled(&self) -> bool {
        self.0.stalled.load(Ordering::Relaxed)
    }

    /// Whether reading the client's body failed: a try's error after that is the client's.
    pub fn failed_by_client(&self) -> bool {
        self.0.failed_by_client.load(Ordering::Relaxed)
    }

    /// Keeps a copy of the body as it is passed on, up to `limit` bytes, so that a try the
    /// member declined can be followed by another ([`BodySlot::copied`]).
    pub fn keep_copy(&self, limit: u64) {
        let mut copy = self.0.copy.lock().unwrap_or_else(|e| e.into_inner());
        copy.get_or_insert(Copy { data: Vec::new(), trailers: None, len: 0, limit });
    }

    /// The whole body as a new slot every try can send, when all of it passed on within the
    /// copy's limit ([`BodySlot::keep_copy`]).
    pub fn copied(&self) -> Option<BodySlot> {
        if self.0.whole {
            return Some(self.clone());
        }
        if !self.0.complete.load(Ordering::Relaxed) {
            return None;
        }
        let copy = self.0.copy.lock().unwrap_or_else(|e| e.into_inner());
        let copy = copy.as_ref().filter(|c| c.len <= c.limit)?;
        let mut body = bytes::BytesMut::with_capacity(copy.len as usize);
        for d in &copy.data {
            body.extend_from_slice(d);
        }
        Some(BodySlot::whole(body.freeze(), copy.trailers.clone()))
    }

    /// Adds `frame` to the copy, if one is kept; past its limit the copy is given up.
    fn copy(&self, frame: &Frame<Bytes>) {
        let mut copy = self.0.copy.lock().unwrap_or_else(|e| e.into_inner());
        let Some(c) = copy.as_mut().filter(|c| c.len <= c.limit) else { return };
        if let Some(data) = frame.data_ref() {
            c.len += data.len() as u64;
            if c.len > c.limit {
                c.data = Vec::new();
            } else {
                c.data.push(data.clone());
            }
        } else if let Some(t) = frame.trailers_ref() {
            c.trailers = Some(t.clone());
        }
    }

    fn take(&self) -> Option<ClientBody> {
        self.0.body.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// `f` of the body still waiting in the slot (`None` once a try took it).
    fn peek<R>(&self, f: impl FnOnce(Option<&ClientBody>) -> R) -> R {
        f(self.0.body.lock().unwrap_or_else(|e| e.into_inner()).as_ref())
    }
}

/// The body sent to a member.
#[derive(Debug)]
pub enum UpstreamBody {
    /// The client's body, streamed; taken out of its slot on the first read.
    Stream {
        /// Where the body waits until read.
        slot: BodySlot,
        /// The body once taken.
        inner: Option<ClientBody>,
        /// Most bytes allowed (0: no limit).
        limit: u64,
        /// Bytes passed so far.
        seen: u64,
        /// 0: the slot's head is still to send; 1: its trailers (a whole body); 2: the rest.
        stage: u8,
        /// The longest wait for the client's next frame (`body_read_timeout_ms`; `None`: a
        /// whole body, read already), and its timer while a wait is on.
        stall: Option<Duration>,
        /// Runs while the client's body has nothing for us.
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    },
    /// No body.
    Empty,
}

impl UpstreamBody {
    /// Streams the body in `slot`, failing once more than `limit` bytes (0 = no limit) passed,
    /// or once no frame of the client's came for `stall`.
    pub fn stream(slot: BodySlot, limit: u64, stall: Option<Duration>) -> Self {
        UpstreamBody::Stream { slot, inner: None, limit, seen: 0, stage: 0, stall, timer: None }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Empty => Poll::Ready(None),
            UpstreamBody::Stream { slot, inner, limit, seen, stage, stall, timer } => {
                if *stage == 0 {
                    *stage = 1;
                    let head = slot.0.head.clone();
                    if !head.is_empty() {
                        *seen += head.len() as u64;
                        if *limit > 0 && *seen > *limit {
                            return Poll::Ready(Some(Err(Box::new(TooLarge(*limit)))));
                        }
                        let frame = Frame::data(head);
                        slot.copy(&frame);
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
                if *stage == 1 {
                    *stage = 2;
                    if slot.0.whole {
                        return Poll::Ready(
                            slot.0.trailers.clone().map(|t| Ok(Frame::trailers(t))),
                        );
                    }
                }
                if slot.0.whole {
                    return Poll::Ready(None);
                }
                if inner.is_none() {
                    *inner = slot.take();
                }
                let Some(body) = inner.as_mut() else { return Poll::Ready(None) };
                let polled = Pin::new(&mut *body).poll_frame(cx);
                slot.0.waiting_on_client.store(polled.is_pending(), Ordering::Relaxed);
                if polled.is_ready() {
                    *timer = None;
                } else if let Some(stall) = *stall {
                    let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                    if t.as_mut().poll(cx).is_ready() {
                        slot.0.stalled.store(true, Ordering::Relaxed);
                        return Poll::Ready(Some(Err(Box::new(BodyStalled(stall)))));
                    }
                }
                match std::task::ready!(polled) {
                    Some(Ok(mut frame)) => {
                        if let Some(trailers) = frame.trailers_mut() {
                            crate::headers::strip_reserved_trailers(trailers);
                        }
                        if let Some(data) = frame.data_ref() {
                            *seen += data.len() as u64;
                            slot.0.received.fetch_add(data.len() as u64, Ordering::Relaxed);
                            if *limit > 0 && *seen > *limit {
                                return Poll::Ready(Some(Err(Box::new(TooLarge(*limit)))));
                            }
                        }
                        slot.copy(&frame);
                        if body.is_end_stream() {
                            // hyper sends no more once the body says it has ended: this was
                            // its last frame, and no poll will see the end.
                            slot.0.complete.store(true, Ordering::Relaxed);
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Some(Err(e)) => {
                        slot.0.failed_by_client.store(true, Ordering::Relaxed);
                        Poll::Ready(Some(Err(Box::new(ClientBodyError(e)))))
                    }
                    None => {
                        slot.0.complete.store(true, Ordering::Relaxed);
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Stream { slot, stage, .. } if slot.0.whole => {
                *stage >= 2 || (slot.0.head.is_empty() && slot.0.trailers.is_none())
            }
            UpstreamBody::Stream { stage: 0, slot, .. } if !slot.0.head.is_empty() => false,
            UpstreamBody::Stream { slot, inner, .. } => match inner {
                Some(b) => b.is_end_stream(),
                None => slot.peek(|b| b.is_none_or(ClientBody::is_end_stream)),
            },
            UpstreamBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Stream { slot, stage, .. } if slot.0.whole => {
                let left = if *stage == 0 { slot.0.head.len() as u64 } else { 0 };
                SizeHint::with_exact(left)
            }
            UpstreamBody::Stream { slot, inner, stage, .. } => {
                let rest = match inner {
                    Some(b) => b.size_hint(),
                    None => slot
                        .peek(|b| b.map_or_else(|| SizeHint::with_exact(0), ClientBody::size_hint)),
                };
                let head = if *stage == 0 { slot.0.head.len() as u64 } else { 0 };
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + head);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + head);
                }
                hint
            }
            UpstreamBody::Empty => SizeHint::with_exact(0),
        }
    }
}
