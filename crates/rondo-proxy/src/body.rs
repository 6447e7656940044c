//! Bodies. Requests and responses stream through without being buffered: [`UpstreamBody`]
//! (`request_body.rs`) forwards the client's body frame by frame (enforcing the size limit), and [`ProxyBody`]
//! forwards the member's response frame by frame, trailers included (gRPC's status lives there),
//! ending the member's in-flight count when the last frame has passed; then [`Finish`] also
//! counts the body bytes of the route and cluster and completes the access log line.

use std::pin::Pin;
use std::sync::Arc;
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
use crate::conn::ConnState;

pub use crate::request_body::{
    BodySlot, BodyStalled, BoxError, ClientBodyError, TooLarge, UpstreamBody,
};

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
