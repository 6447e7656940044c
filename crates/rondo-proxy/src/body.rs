//! Bodies. Requests and responses stream through without being buffered: [`UpstreamBody`]
//! forwards the client's body frame by frame (enforcing the size limit), and [`ProxyBody`]
//! forwards the member's response frame by frame, trailers included (gRPC's status lives there),
//! ending the member's in-flight count when the last frame has passed; then [`Finish`] also
//! counts the body bytes of the route and cluster and completes the access log line.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use rondo_core::{FailureKind, Outcome};
use rondo_runtime::ClusterRt;
use rondo_runtime::metrics::{Histogram, Metrics, RouteMetrics};

use crate::access::{Pending, Reason};
use crate::client_body::ClientBody;
use crate::conn::ConnState;

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

/// What happens when a response is over (its last frame passed, or it was dropped): the
/// member's in-flight request ends with its outcome, the route's body bytes are counted, the
/// access log line (if any) is completed, and the client connection goes back to waiting for
/// its next request under the route's idle timeout.
#[derive(Default)]
pub struct Finish {
    request: Option<(Arc<ClusterRt>, usize, Outcome)>,
    conn: Option<(Arc<ConnState>, Duration)>,
    served: Option<Served>,
    /// Response body bytes sent so far.
    sent: u64,
    /// Request body bytes received, when no body slot counts them (the router's own HTTP/1
    /// path counts them itself).
    received: u64,
    log: Option<Box<Pending>>,
    /// The response is a gRPC call's: its trailers' `grpc-status` decides the outcome.
    grpc: bool,
    /// The client-facing duration's histogram and the request's arrival, observed at the end.
    downstream: Option<(Histogram, Instant)>,
}

/// How a member's response was reached, for the metrics and the access log.
struct Served {
    route: Arc<RouteMetrics>,
    body: Option<BodySlot>,
    tries: u32,
    reason: Reason,
}

impl Finish {
    /// Ends `member`'s request on `cluster` with `outcome` (unless the body then fails).
    pub fn request(mut self, cluster: Arc<ClusterRt>, member: usize, outcome: Outcome) -> Self {
        self.request = Some((cluster, member, outcome));
        self
    }

    /// Re-arms the client connection's idle timer.
    pub fn conn(mut self, conn: Arc<ConnState>, idle: Duration) -> Self {
        self.conn = Some((conn, idle));
        self
    }

    /// Counts the body bytes into `route`'s metrics (request bytes from `body`); `tries` and
    /// `reason` say how the member was reached, for the access log.
    pub fn served(
        mut self,
        route: Arc<RouteMetrics>,
        body: Option<BodySlot>,
        tries: u32,
        reason: Reason,
    ) -> Self {
        self.served = Some(Served { route, body, tries, reason });
        self
    }

    /// Observes the time since `arrived` into `histogram` when the response is over
    /// (`rondo_downstream_request_duration_seconds`).
    pub(crate) fn downstream(mut self, histogram: &Histogram, arrived: Instant) -> Self {
        self.downstream = Some((histogram.clone(), arrived));
        self
    }

    /// Completes `line` of the access log when the response is over.
    pub fn log(mut self, line: Option<Pending>) -> Self {
        self.log = line.map(Box::new);
        self
    }

    /// A gRPC call's trailers passed: their status decides ([`Finish::grpc_status`]).
    fn trailers(&mut self, trailers: &http::HeaderMap) {
        if let Some(v) = trailers.get("grpc-status") {
            let code = rondo_core::grpc::parse_status(v.as_bytes());
            self.grpc_status(code.unwrap_or(rondo_core::grpc::Code::UNKNOWN));
        }
    }

    /// A gRPC call ended with `code`: a status its cluster names as the member's failure turns
    /// the outcome into one (counted like a 5xx), and the status is counted on the route.
    fn grpc_status(&mut self, code: rondo_core::grpc::Code) {
        if let Some((rt, _, outcome)) = &mut self.request
            && let Outcome::Success { latency } = *outcome
        {
            *outcome = Outcome::of_grpc(code, &rt.spec.policy.grpc, latency);
        }
        if let Some(s) = &self.served {
            s.route.grpc_status(code);
        }
    }

    /// Counts `n` more response body bytes sent to the client.
    pub(crate) fn sent(&mut self, n: usize) {
        self.sent += n as u64;
    }

    /// Counts `n` more request body bytes received from the client.
    pub(crate) fn received(&mut self, n: u64) {
        self.received += n;
    }

    /// The access log line this response would complete, taken back: the response never
    /// reached the client, so the line is the router's own answer's to write.
    pub(crate) fn take_log(&mut self) -> Option<Pending> {
        self.log.take().map(|line| *line)
    }

    /// The response ran past the call's deadline: the member's request ends as a timeout.
    pub(crate) fn timed_out(&mut self) {
        if let Some((_, _, outcome)) = &mut self.request {
            let latency = match *outcome {
                Outcome::Success { latency } | Outcome::Failure { latency, .. } => latency,
                Outcome::Cancelled => Duration::ZERO,
            };
            *outcome = Outcome::Failure { kind: FailureKind::Timeout, latency };
        }
    }

    /// The response broke off: the member's request ends as a failure.
    pub(crate) fn failed(&mut self) {
        if let Some((_, _, outcome)) = &mut self.request {
            *outcome = Outcome::Failure { kind: FailureKind::Reset, latency: Duration::ZERO };
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some((histogram, arrived)) = self.downstream.take() {
            histogram.observe(arrived.elapsed().as_secs_f64());
        }
        let log = self.log.take();
        let member = match (&log, &self.request) {
            (Some(_), Some((rt, member, _))) => Some((rt.spec.clone(), *member)),
            _ => None,
        };
        if let Some((cluster, member, outcome)) = self.request.take() {
            cluster.end_request(member, outcome);
        }
        let mut bytes_in = 0;
        if let Some(s) = &self.served {
            bytes_in = s.body.as_ref().map_or(self.received, BodySlot::received);
            s.route.bytes_in.inc_by(bytes_in);
            s.route.bytes_out.inc_by(self.sent);
        }
        if let Some(line) = log {
            let (served, tries, reason) = match self.served.take() {
                Some(s) => (member.map(|(spec, m)| (s.route, spec, m)), s.tries, s.reason),
                None => (None, 0, Reason::None),
            };
            line.finish(served, tries, reason, bytes_in, self.sent);
        }
        if let Some((conn, idle)) = self.conn.take() {
            conn.response_finished(idle);
        }
    }
}

impl std::fmt::Debug for Finish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finish")
            .field("member", &self.request.as_ref().map(|r| (&r.0.spec.name, r.1, r.2)))
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The body sent to the client.
    #[project = ProxyProj]
    pub enum ProxyBody {
        /// A member's response, streamed.
        Upstream { #[pin] inner: Incoming, finish: Option<Finish> },
        /// A response rondo made.
        Local { #[pin] inner: Full<Bytes>, finish: Option<Finish> },
        /// A member's response, compressed as it streams (`compress`); `finish` counts what
        /// the client got.
        Encoded { #[pin] inner: crate::encode::Encoded, finish: Option<Finish> },
        /// A member's response in another framing as it streams (`grpc_web`); the member's
        /// body inside keeps its finish, which counts and classifies what the member sent.
        Converted { inner: Box<ProxyBody>, reframe: Box<dyn Reframe>, done: bool },
        /// A gRPC call's member body that must end by the call's deadline (`grpc-timeout`):
        /// past it the member's stream is dropped and the client gets DEADLINE_EXCEEDED in
        /// trailers.
        Deadline { inner: Option<Box<ProxyBody>>, sleep: Pin<Box<tokio::time::Sleep>> },
    }
}

/// A framing a member's body is sent on in (`grpc_web`'s): what each data frame, the trailers
/// and the end become. An empty `Bytes` sends nothing.
pub(crate) trait Reframe: Send {
    /// A data frame's bytes.
    fn data(&mut self, data: &[u8]) -> Bytes;
    /// The trailers (the body's last frame).
    fn trailers(&mut self, trailers: &http::HeaderMap) -> Bytes;
    /// The end of a body without trailers.
    fn end(&mut self) -> Bytes;
}

impl ProxyBody {
    /// A body rondo made.
    pub fn local(bytes: Bytes) -> Self {
        ProxyBody::Local { inner: Full::new(bytes), finish: None }
    }

    /// A member's body; `finish` runs when it is done.
    pub fn upstream(inner: Incoming, finish: Finish) -> Self {
        ProxyBody::Upstream { inner, finish: Some(finish) }
    }

    /// A member's body and what its end runs, taken back to be read here (a filter that
    /// converts the whole message); `None` for a body the router made.
    pub(crate) fn into_upstream(self) -> Option<(Incoming, Option<Finish>)> {
        match self {
            ProxyBody::Upstream { inner, finish } => Some((inner, finish)),
            _ => None,
        }
    }

    /// This body cut at `left` from now: a gRPC call's stream that runs past its deadline
    /// ends there with `grpc-status: 4` in trailers, and its member's request as a timeout.
    pub(crate) fn deadline(self, left: Duration) -> ProxyBody {
        let sleep = Box::pin(tokio::time::sleep(left));
        ProxyBody::Deadline { inner: Some(Box::new(self)), sleep }
    }

    /// This body sent on in another framing as it streams (its finish stays inside).
    pub(crate) fn reframed(self, reframe: Box<dyn Reframe>) -> ProxyBody {
        ProxyBody::Converted { inner: Box::new(self), reframe, done: false }
    }

    /// Runs `f` when the body is done (replacing nothing already set for a member's body).
    /// A response that will not reach the client (a member's answer declined for a retry): its
    /// end no longer reports to the client connection, whose request goes on.
    pub(crate) fn detach_conn(&mut self) {
        if let Some(Some(finish)) = self.finish_mut() {
            finish.conn = None;
        }
    }

    pub fn set_finish(&mut self, f: Finish) {
        if let Some(finish) = self.finish_mut() {
            *finish = Some(f);
        }
    }

    /// Where the body's finish is (a converted body's is its member's body's).
    fn finish_mut(&mut self) -> Option<&mut Option<Finish>> {
        match self {
            ProxyBody::Upstream { finish, .. }
            | ProxyBody::Local { finish, .. }
            | ProxyBody::Encoded { finish, .. } => Some(finish),
            ProxyBody::Converted { inner, .. } => inner.finish_mut(),
            ProxyBody::Deadline { inner, .. } => inner.as_mut()?.finish_mut(),
        }
    }

    /// The body answers a gRPC call: its status, `head`'s for a trailers-only answer, else the
    /// trailers', decides the member's outcome and is counted on the route.
    pub(crate) fn grpc(&mut self, head: Option<rondo_core::grpc::Code>) {
        let Some(f) = self.finish_mut().and_then(Option::as_mut) else { return };
        match head {
            Some(code) => f.grpc_status(code),
            None => f.grpc = true,
        }
    }

    /// This body through `encode` (a member's body to compress), its finish moved outside so
    /// that it counts the bytes the client gets.
    pub(crate) fn encoded(
        mut self,
        encode: impl FnOnce(ProxyBody) -> crate::encode::Encoded,
    ) -> ProxyBody {
        let finish = self.finish_mut().and_then(Option::take);
        ProxyBody::Encoded { inner: encode(self), finish }
    }

    /// Times the request that arrived at `arrived` and is answered with `status` by this body
    /// until it is done, on `listener`'s `route` (`""`: none): through the route's metrics a
    /// member's body already has, else by the names.
    pub(crate) fn time(
        &mut self,
        metrics: &Metrics,
        (listener, route): (&str, &str),
        arrived: Instant,
        status: u16,
    ) {
        let Some(slot) = self.finish_mut() else { return };
        let f = slot.get_or_insert_with(Finish::default);
        let histogram = match &f.served {
            Some(s) => s.route.downstream(metrics, listener).class(status).clone(),
            None => metrics.downstream(listener, route).class(status).clone(),
        };
        f.downstream = Some((histogram, arrived));
    }

    /// Completes `line` of the access log when the body is done (a member's body: its finish
    /// is set already).
    pub fn log(&mut self, line: Pending) {
        if let Some(f) = self.finish_mut().and_then(Option::as_mut) {
            f.log = Some(Box::new(line));
        }
    }
}

/// Adds a data frame's bytes to the response's count.
fn count_sent(finish: &mut Option<Finish>, frame: &Frame<Bytes>) {
    if let (Some(f), Some(data)) = (finish.as_mut(), frame.data_ref()) {
        f.sent += data.len() as u64;
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ProxyProj::Local { inner, finish } => {
                let r = std::task::ready!(inner.poll_frame(cx));
                match &r {
                    None => drop(finish.take()),
                    Some(Ok(frame)) => count_sent(finish, frame),
                    Some(Err(e)) => match *e {},
                }
                Poll::Ready(r.map(|f| f.map_err(|e| match e {})))
            }
            ProxyProj::Upstream { inner, finish } => {
                let mut r = std::task::ready!(inner.poll_frame(cx));
                if let Some(Ok(frame)) = &mut r
                    && let Some(trailers) = frame.trailers_mut()
                {
                    crate::headers::strip_reserved_trailers(trailers);
                    if let Some(f) = finish.as_mut().filter(|f| f.grpc) {
                        f.trailers(trailers);
                    }
                }
                match &r {
                    None => {
                        finish.take();
                    }
                    Some(Ok(frame)) => count_sent(finish, frame),
                    Some(Err(_)) => {
                        if let Some(f) = finish.as_mut() {
                            f.failed();
                        }
                        finish.take();
                    }
                }
                Poll::Ready(r.map(|f| f.map_err(|e| Box::new(e) as BoxError)))
            }
            ProxyProj::Encoded { inner, finish } => {
                let r = std::task::ready!(inner.poll_frame(cx));
                match &r {
                    None => drop(finish.take()),
                    Some(Ok(frame)) => count_sent(finish, frame),
                    Some(Err(_)) => {
                        if let Some(f) = finish.as_mut() {
                            f.failed();
                        }
                        finish.take();
                    }
                }
                Poll::Ready(r)
            }
            ProxyProj::Deadline { inner, sleep } => {
                let Some(body) = inner.as_mut() else { return Poll::Ready(None) };
                if sleep.as_mut().poll(cx).is_ready() {
                    // The member's stream goes (hyper resets it) and its request ends as a
                    // timeout; the client learns why.
                    if let Some(f) = body.finish_mut().and_then(Option::as_mut) {
                        f.timed_out();
                    }
                    *inner = None;
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("4"));
                    let why = "deadline exceeded: the call ran past its grpc-timeout";
                    trailers.insert("grpc-message", http::HeaderValue::from_static(why));
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                let r = std::task::ready!(Pin::new(&mut **body).poll_frame(cx));
                if r.is_none() {
                    *inner = None;
                }
                Poll::Ready(r)
            }
            ProxyProj::Converted { inner, reframe, done } => loop {
                if *done {
                    return Poll::Ready(None);
                }
                let out = match std::task::ready!(Pin::new(&mut **inner).poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => reframe.data(&data),
                        Err(frame) => match frame.into_trailers() {
                            Ok(trailers) => {
                                *done = true;
                                reframe.trailers(&trailers)
                            }
                            Err(_) => continue,
                        },
                    },
                    Some(Err(e)) => {
                        *done = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                    None => {
                        *done = true;
                        reframe.end()
                    }
                };
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Upstream { inner, .. } => inner.is_end_stream(),
            ProxyBody::Local { inner, .. } => inner.is_end_stream(),
            ProxyBody::Encoded { inner, .. } => inner.is_end_stream(),
            ProxyBody::Converted { done, .. } => *done,
            ProxyBody::Deadline { inner, .. } => inner.as_ref().is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Upstream { inner, .. } => inner.size_hint(),
            ProxyBody::Local { inner, .. } => inner.size_hint(),
            ProxyBody::Encoded { inner, .. } => inner.size_hint(),
            ProxyBody::Converted { .. } | ProxyBody::Deadline { .. } => SizeHint::default(),
        }
    }
}
