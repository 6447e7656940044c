//! The future of a [`Balanced`](super::Balanced) request, [`ResponseFuture`]: the client's call
//! loop (`call/run.rs`) over the request's [`HttpTries`], named so that no request boxes its
//! future. A try rebuilds the caller's request for its member (the member's address as URI
//! authority, the body in a [`SlotBody`] shared by every try), calls the inner service in place
//! when it is ready ([`TryFuture`]), and the try that answers hands the caller the response with
//! its body [`Tracked`] until the last frame ends the member's request.

use std::fmt;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use http::header::HeaderName;
use http::request::Parts;
use http::uri::{self, Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use http_body::Body;
use pin_project_lite::pin_project;
use rondo_core::FailureKind;
use rondo_core::wire::VIEW_ID_HEADER;
use tower::Service;

use super::body::{Shared, SlotBody, Tracked};
use super::error::{BoxError, HttpError, classify};
use crate::call::{Run, Ticket, Tries};
use crate::error::Failed;
use crate::inner::Inner;
use crate::state::MemberRef;

/// The view id header as a name (no parsing per response).
static VIEW_ID: HeaderName = HeaderName::from_static(VIEW_ID_HEADER);

pin_project! {
    /// The future of a [`Balanced`](super::Balanced) request: the client's call loop (no box
    /// per request). Its error, when every option failed, is a boxed
    /// [`BalancedError`](super::BalancedError).
    pub struct ResponseFuture<S, B, RB>
    where
        S: Service<Request<SlotBody<B>>, Response = Response<RB>>,
        S: Clone,
        S: Send,
        S: 'static,
        S::Future: Send,
        S::Error: Into<BoxError>,
        B: Body,
        B: Send,
        B: 'static,
        RB: Body,
        RB: Send,
        RB: 'static,
    {
        #[pin]
        pub(super) run: Run<Arc<Inner>, HttpTries<S, B>>,
    }
}

impl<S, B, RB> fmt::Debug for ResponseFuture<S, B, RB>
where
    S: Service<Request<SlotBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    RB: Body + Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B, RB>
where
    S: Service<Request<SlotBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    RB: Body + Send + 'static,
{
    type Output = Result<Response<Tracked<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().run.poll(cx).map_err(|e| Box::new(e) as BoxError)
    }
}

/// A [`Balanced`](super::Balanced) request as the call loop drives it.
pub(crate) struct HttpTries<S, B> {
    shared: Arc<Shared<B>>,
    /// Whether the caller's request has a body (in `shared` until a try reads it).
    has_body: bool,
    inner: Arc<Mutex<S>>,
    /// The latest try's "handed to the inner service" flag when it had to wait for readiness
    /// (`None`: it was handed over at once).
    waiting: Option<Arc<AtomicBool>>,
}

impl<S, B> HttpTries<S, B> {
    pub(crate) fn new(shared: Arc<Shared<B>>, has_body: bool, inner: Arc<Mutex<S>>) -> Self {
        HttpTries { shared, has_body, inner, waiting: None }
    }
}

impl<S, B, RB> Tries for HttpTries<S, B>
where
    S: Service<Request<SlotBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    RB: Body + Send + 'static,
{
    type Value = Response<RB>;
    type Error = HttpError;
    type Try = TryFuture<S::Future, Response<RB>>;
    type Output = Response<Tracked<RB>>;

    fn start(&mut self, member: &Arc<MemberRef>, _addr: SocketAddr) -> Self::Try {
        let body = self.has_body.then(|| self.shared.clone());
        let req = match rebuild(&self.shared.parts, member, body) {
            Ok(req) => req,
            Err(e) => return TryFuture::failed(Failed::Fatal(HttpError(e.into()))),
        };
        // Readiness asked without a waker first: a ready service (a hyper client always is) is
        // called in place, with no clone per try. One that is not goes with the try (boxed: a
        // rare path), which waits for its readiness, and a clone takes its place: the polled
        // one may hold a place in a queue (a concurrency limit's semaphore, a buffer's slot)
        // that a fresh clone would only join at its end.
        self.waiting = None;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match inner.poll_ready(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(())) => TryFuture::Called { call: inner.call(req) },
            Poll::Ready(Err(e)) => TryFuture::failed(classify(e)),
            Poll::Pending => {
                let fresh = inner.clone();
                let mut svc = std::mem::replace(&mut *inner, fresh);
                drop(inner);
                let handed = Arc::new(AtomicBool::new(false));
                self.waiting = Some(handed.clone());
                TryFuture::Boxed {
                    wait: Box::pin(async move {
                        poll_fn(|cx| svc.poll_ready(cx)).await.map_err(classify)?;
                        handed.store(true, Ordering::Relaxed);
                        svc.call(req).await.map_err(classify)
                    }),
                }
            }
        }
    }

    fn untouched(&self) -> bool {
        !self.has_body || self.shared.body().is_some()
    }

    fn dispatched(&self) -> bool {
        self.waiting.as_ref().is_none_or(|handed| handed.load(Ordering::Relaxed))
    }

    fn finish(self, inner: &Inner, resp: Response<RB>, mut ticket: Ticket) -> Self::Output {
        if resp.status().is_server_error() || grpc_failure(inner, resp.headers()) {
            ticket.failed(FailureKind::Status5xx);
        } else {
            ticket.succeeded();
        }
        let seen = resp
            .headers()
            .get(&VIEW_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(v) = seen {
            inner.observe_view_id(v);
        }
        // The member's request lasts until the body's last frame passes, and ends in the core
        // then (a stream may end long after its head: the core's time must not go back).
        ticket.end_when_dropped();
        resp.map(|body| Tracked::new(body, ticket))
    }
}

/// Whether `headers` are a gRPC call's trailers-only answer whose status the policy held names
/// as the member's failure (`grpc_failure_codes`): counted like a 5xx. A non-gRPC response pays
/// one `content-type` check; a status in the trailers is the caller's to read.
fn grpc_failure(inner: &Inner, headers: &http::HeaderMap) -> bool {
    use rondo_core::grpc::{Code, is_grpc_content_type, parse_status};
    if !headers.get(http::header::CONTENT_TYPE).is_some_and(|v| is_grpc_content_type(v.as_bytes()))
    {
        return false;
    }
    let Some(status) = headers.get("grpc-status") else { return false };
    let code = parse_status(status.as_bytes()).unwrap_or(Code::UNKNOWN);
    inner.lock().answer.policy.grpc.is_failure(code)
}

/// The result of one try of a [`Balanced`](super::Balanced) request.
type TryResult<R> = Result<R, Failed<HttpError>>;

pin_project! {
    /// One try of a [`Balanced`](super::Balanced) request.
    #[project = TryProj]
    pub(crate) enum TryFuture<F, R> {
        /// The inner service was ready and called: its response future.
        Called { #[pin] call: F },
        /// The inner service was not ready: it waits for readiness, then takes the request.
        Boxed { wait: Pin<Box<dyn Future<Output = TryResult<R>> + Send>> },
        /// Failed before anything was sent.
        Failed { failed: Option<Failed<HttpError>> },
    }
}

impl<F, R> TryFuture<F, R> {
    fn failed(failed: Failed<HttpError>) -> Self {
        TryFuture::Failed { failed: Some(failed) }
    }
}

impl<F, R, E> Future for TryFuture<F, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
{
    type Output = TryResult<R>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TryResult<R>> {
        match self.project() {
            TryProj::Called { call } => call.poll(cx).map_err(classify),
            TryProj::Boxed { wait } => wait.as_mut().poll(cx),
            TryProj::Failed { failed } => {
                Poll::Ready(Err(failed.take().expect("TryFuture polled after completion")))
            }
        }
    }
}

/// The request for one try: the caller's, with the member's address as URI authority.
fn rebuild<B>(
    parts: &Parts,
    member: &MemberRef,
    body: Option<Arc<Shared<B>>>,
) -> Result<Request<SlotBody<B>>, http::Error> {
    let mut uri = uri::Parts::default();
    uri.scheme = Some(parts.uri.scheme().cloned().unwrap_or(Scheme::HTTP));
    // Parsed once per answer; an address that is no authority fails here as it always did.
    uri.authority = Some(match &member.authority {
        Some(a) => a.clone(),
        None => Authority::try_from(&*member.address)?,
    });
    uri.path_and_query =
        Some(parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")));
    let uri = Uri::from_parts(uri)?;
    let mut req = Request::new(SlotBody::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    *req.extensions_mut() = parts.extensions.clone();
    Ok(req)
}
