//! The tower layer: [`BalanceLayer`] wraps an HTTP service (a hyper-util client, the transport
//! under `tonic::client::Grpc`) into [`Balanced`], which sends each request to a member picked
//! by the service's policy by rewriting the request's URI authority, and fails over like the
//! router does:
//!
//! - a connect failure goes to the next member, whatever the method, as long as the request's
//!   body is still in its [`SlotBody`] (the inner service takes it out on its first read, so a
//!   connection that failed first leaves it there);
//! - a reset or a per-try timeout goes to the next member only for idempotent methods (`GET`,
//!   `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) whose body was not consumed; a try whose time
//!   ran out while the inner service was still not ready to take it (a saturated concurrency
//!   limit) sent nothing: it goes on like a refused connection and its member is not charged;
//! - a response, whatever its status, goes back to the caller (a 5xx counts as a failure of
//!   the member for its estimators and outlier detection).
//!
//! The member's in-flight count ends when the response body's last frame passes (a body error
//! counts as a reset). A response carrying a `rondo-view-id` header newer than the answer held
//! makes the client refetch.

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
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use rondo_core::failover::is_idempotent_method;
use rondo_core::wire::VIEW_ID_HEADER;
use rondo_core::{FailureKind, HashKeySource};
use tower::{Layer, Service};

use crate::client::{Client, Inner, Plan, SessionCell, Ticket, Tries};
use crate::error::{CallError, Failed, is_connect_error};
use crate::run::Run;
use crate::state::MemberRef;

/// The view id header as a name (no parsing per response).
static VIEW_ID: HeaderName = HeaderName::from_static(VIEW_ID_HEADER);

/// The boxed error of the tower service.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A transport error from the inner service, inside a [`CallError`] of [`Balanced`].
#[derive(Debug)]
pub struct HttpError(pub BoxError);

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(s) = cur {
            write!(f, ": {s}")?;
            cur = s.source();
        }
        Ok(())
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// Wraps an HTTP service into a [`Balanced`] one; from [`Client::layer`] (per request, or per
/// session when the policy's granularity is `session`) or [`crate::Session::layer`] (every
/// request in that session).
#[derive(Debug, Clone)]
pub struct BalanceLayer {
    client: Client,
    session: Option<Arc<SessionCell>>,
}

impl BalanceLayer {
    pub(crate) fn new(client: Client, session: Option<Arc<SessionCell>>) -> Self {
        BalanceLayer { client, session }
    }
}

impl<S> Layer<S> for BalanceLayer {
    type Service = Balanced<S>;

    fn layer(&self, inner: S) -> Balanced<S> {
        Balanced {
            client: self.client.clone(),
            session: self.session.clone(),
            inner: Arc::new(Mutex::new(inner)),
        }
    }
}

/// An HTTP service balanced over a rondo service's members: each request goes to a member
/// picked by the service's policy (its URI authority rewritten to the member's address), and
/// fails over like the router:
///
/// - a connect failure goes to the next member, whatever the method, as long as the request's
///   body is still in its [`SlotBody`] (the inner service takes it out on its first read, so a
///   connection that failed first leaves it there);
/// - a reset or a per-try timeout goes to the next member only for idempotent methods (`GET`,
///   `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) whose body was not consumed; a try whose time
///   ran out while the inner service was still not ready sent nothing: it goes on like a
///   refused connection and its member is not charged;
/// - a response, whatever its status, goes back to the caller (a 5xx counts as a failure of
///   the member for its estimators and outlier detection);
/// - when every option failed, the error is a boxed [`BalancedError`] listing every attempt.
///
/// The member's in-flight request ends when the response body's last frame passes (a body
/// error counts as a reset). A response whose `rondo-view-id` header is newer than the answer
/// held makes the client refetch ([`Client::observe_view_id`]).
///
/// The inner service receives requests whose URI is `scheme://member-address/path` and whose
/// body is a [`SlotBody`] around the caller's body. The requests of one `Balanced` share its
/// inner service: a try calls it in place, under a lock held only while it takes the request,
/// instead of carrying a clone of its own (a hyper-util client is 300 bytes and takes about
/// 80 ns to clone and drop). It is cloned only for a try that must wait for its readiness, and
/// when the `Balanced` service is cloned (give each task its own clone, as usual with tower,
/// and no two tasks wait for the same lock).
#[derive(Debug)]
pub struct Balanced<S> {
    client: Client,
    session: Option<Arc<SessionCell>>,
    inner: Arc<Mutex<S>>,
}

impl<S: Clone> Clone for Balanced<S> {
    fn clone(&self) -> Self {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Balanced {
            client: self.client.clone(),
            session: self.session.clone(),
            inner: Arc::new(Mutex::new(inner)),
        }
    }
}

impl<S> Balanced<S> {
    /// `inner` balanced by `client` (the same as `client.layer().layer(inner)`).
    pub fn new(client: &Client, inner: S) -> Self {
        client.layer().layer(inner)
    }

    /// The client balancing the requests.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl<S, B, RB> Service<Request<B>> for Balanced<S>
where
    S: Service<Request<SlotBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    RB: Body + Send + 'static,
{
    type Response = Response<Tracked<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B, RB>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is the inner service's, per member; each try waits for it.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let client = self.client.inner.clone();
        let (parts, body) = req.into_parts();
        let hash = if client.hash_policy.load(Ordering::Relaxed) {
            hash_of(&client, &parts)
        } else {
            None
        };
        let plan = Plan {
            idempotent: is_idempotent_method(parts.method.as_str()),
            hash,
            session: self.session.clone(),
        };
        let has_body = !body.is_end_stream();
        let hint = body.size_hint();
        let shared = Arc::new(Shared { parts, hint, body: Mutex::new(has_body.then_some(body)) });
        // The call loop's future is the whole request's: everything it needs moves in.
        let tries = HttpTries { shared, has_body, inner: self.inner.clone(), waiting: None };
        ResponseFuture { run: Run::new(client, plan, tries) }
    }
}

pin_project! {
    /// The future of a [`Balanced`] request: the client's call loop (no box per request). Its
    /// error, when every option failed, is a boxed [`BalancedError`].
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
        run: Run<Arc<Inner>, HttpTries<S, B>>,
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

/// A [`Balanced`] request as the call loop drives it.
struct HttpTries<S, B> {
    shared: Arc<Shared<B>>,
    /// Whether the caller's request has a body (in `shared` until a try reads it).
    has_body: bool,
    inner: Arc<Mutex<S>>,
    /// The latest try's "handed to the inner service" flag when it had to wait for readiness
    /// (`None`: it was handed over at once).
    waiting: Option<Arc<AtomicBool>>,
}

/// What the tries of one request share (one allocation): the caller's request parts, each
/// try's request rebuilt from them, and the caller's body, waiting until a try reads it.
struct Shared<B> {
    parts: Parts,
    /// The body's size hint before any try read it.
    hint: SizeHint,
    body: Mutex<Option<B>>,
}

impl<B> Shared<B> {
    fn body(&self) -> std::sync::MutexGuard<'_, Option<B>> {
        self.body.lock().unwrap_or_else(|e| e.into_inner())
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
        if resp.status().is_server_error() {
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
        resp.map(|body| Tracked { inner: body, ticket: Some(ticket) })
    }
}

/// The result of one try of a [`Balanced`] request.
type TryResult<R> = Result<R, Failed<HttpError>>;

pin_project! {
    /// One try of a [`Balanced`] request.
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

/// The error of a [`Balanced`] service when every option failed (boxed as [`BoxError`];
/// downcast to read the attempts).
pub type BalancedError = CallError<HttpError>;

fn classify<E: Into<BoxError>>(e: E) -> Failed<HttpError> {
    let e: BoxError = e.into();
    if is_connect_error(e.as_ref()) {
        Failed::Connect(HttpError(e))
    } else {
        Failed::Member(HttpError(e))
    }
}

/// The hash key of a `hash` service from the request (a header or a cookie; the client's own
/// address means nothing here, so such services pick without a key).
fn hash_of(client: &Inner, parts: &Parts) -> Option<u64> {
    let source = {
        let st = client.lock();
        let policy = &st.balancer.spec().policy;
        if policy.algorithm != rondo_core::Algorithm::Hash {
            return None;
        }
        policy.hash.key.clone()
    };
    let key = match &source {
        HashKeySource::ClientAddress => None,
        HashKeySource::Header(h) => parts.headers.get(h.as_str()).map(|v| v.as_bytes().to_vec()),
        HashKeySource::Cookie(name) => parts
            .headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_bytes().to_vec()),
    };
    key.map(|k| crate::state::key_hash(&k))
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
    let body = match body {
        Some(shared) => SlotBody { state: SlotState::Waiting { shared } },
        None => SlotBody { state: SlotState::Done },
    };
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    *req.extensions_mut() = parts.extensions.clone();
    Ok(req)
}

pin_project! {
    /// The request body a [`Balanced`] service hands its inner service: the caller's body, taken
    /// out of a slot shared by every try on the first read. A try that never read it (its
    /// connection failed first) leaves it for the next member.
    ///
    /// It holds the caller's body in place (no box), so it is `Unpin` when that body is; hyper's
    /// client asks for `Unpin` request bodies (wrap one that is not in `Box::pin` or
    /// `http_body_util::combinators::BoxBody` first).
    pub struct SlotBody<B> {
        #[pin]
        state: SlotState<B>,
    }
}

pin_project! {
    #[project = SlotProj]
    enum SlotState<B> {
        Waiting { shared: Arc<Shared<B>> },
        Reading { #[pin] body: B },
        Done,
    }
}

impl<B> fmt::Debug for SlotBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            SlotState::Waiting { .. } => "waiting",
            SlotState::Reading { .. } => "reading",
            SlotState::Done => "done",
        };
        f.debug_struct("SlotBody").field("state", &state).finish()
    }
}

impl<B: Body> Body for SlotBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut state = self.project().state;
        if let SlotProj::Waiting { shared } = state.as_mut().project() {
            let taken = shared.body().take();
            state.set(match taken {
                Some(body) => SlotState::Reading { body },
                None => SlotState::Done,
            });
        }
        match state.project() {
            SlotProj::Reading { body } => body.poll_frame(cx),
            _ => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            // A try starts only while the body is whole (`Tries::untouched`), so a waiting body
            // is the caller's as it came: not at its end (bodies at their end never wait in a
            // slot), with the hint it had. No lock needed. (Should a try that timed out still
            // take the body later, this try sends less than it announced and hyper fails it,
            // rather than sending an empty body.)
            SlotState::Waiting { .. } => false,
            SlotState::Reading { body } => body.is_end_stream(),
            SlotState::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            SlotState::Waiting { shared } => shared.hint,
            SlotState::Reading { body } => body.size_hint(),
            SlotState::Done => SizeHint::with_exact(0),
        }
    }
}

pin_project! {
    /// A member's response body; the member's in-flight request ends when its last frame passes
    /// (or it is dropped), a body error counting as a reset. It holds the member's body in
    /// place (no box): `Unpin` when that body is.
    pub struct Tracked<B> {
        #[pin]
        inner: B,
        ticket: Option<Ticket>,
    }
}

impl<B> fmt::Debug for Tracked<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracked").field("open", &self.ticket.is_some()).finish_non_exhaustive()
    }
}

impl<B> Tracked<B> {
    /// The member that answered, while the body is still open.
    pub fn member(&self) -> Option<&str> {
        self.ticket.as_ref().map(Ticket::member)
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let r = std::task::ready!(this.inner.poll_frame(cx));
        match &r {
            None => {
                this.ticket.take();
            }
            Some(Err(_)) => {
                if let Some(mut t) = this.ticket.take() {
                    t.failed(FailureKind::Reset);
                }
            }
            Some(Ok(_)) => {}
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use rondo_core::wire::{Answer, Member, Source};
    use rondo_core::{AdminState, Policy};

    use super::*;

    fn offline(names: &[&str]) -> Client {
        offline_with(Policy::default(), names)
    }

    fn offline_with(policy: Policy, names: &[&str]) -> Client {
        let members = names
            .iter()
            .zip(1u16..)
            .map(|(n, p)| Member {
                name: (*n).into(),
                address: format!("127.0.0.1:{p}"),
                weight: 100,
                group: None,
                state: AdminState::Active,
                source: Source::Config,
            })
            .collect();
        let answer = Answer { service: "web".into(), view_id: 3, policy, members };
        Client::builder("web").seed(7).offline(answer)
    }

    /// An inner service from a closure.
    #[derive(Clone)]
    struct Fake<F>(F);

    impl<F, Fut> Service<Request<SlotBody<Full<Bytes>>>> for Fake<F>
    where
        F: FnMut(Request<SlotBody<Full<Bytes>>>) -> Fut,
        Fut: Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send + 'static,
    {
        type Response = Response<Full<Bytes>>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
            Box::pin((self.0)(req))
        }
    }

    fn refused() -> BoxError {
        Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    }

    fn reset() -> BoxError {
        Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    fn post(body: &'static str) -> Request<Full<Bytes>> {
        Request::post("http://web/orders?x=1").body(Full::new(Bytes::from(body))).unwrap()
    }

    #[tokio::test]
    async fn the_authority_is_the_members_and_an_unread_body_goes_to_the_next_member() {
        let client = offline(&["a", "b"]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let inner = Fake(move |req: Request<SlotBody<Full<Bytes>>>| {
            let log = log.clone();
            async move {
                let first = {
                    let mut log = log.lock().unwrap();
                    log.push(req.uri().to_string());
                    log.len() == 1
                };
                if first {
                    // Failed to connect: the body was never read.
                    return Err(refused());
                }
                let body = req.into_body().collect().await.map_err(|e| match e {})?.to_bytes();
                Ok(Response::builder().header(VIEW_ID_HEADER, "9").body(Full::new(body)).unwrap())
            }
        });
        let mut svc = client.layer().layer(inner);
        let resp = svc.call(post("order 1")).await.expect("second member answers");
        assert!(resp.body().member().is_some(), "open until the body ends");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "order 1", "the same body reached the second member");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_ne!(seen[0], seen[1]);
        for uri in &seen {
            assert!(
                uri == "http://127.0.0.1:1/orders?x=1" || uri == "http://127.0.0.1:2/orders?x=1",
                "{uri}"
            );
        }
        assert_eq!(client.inner.wanted.load(Ordering::Relaxed), 9, "newer view id observed");
        let st = client.inner.lock();
        assert!(st.balancer.states().iter().all(|s| s.load.in_flight == 0), "body done");
    }

    #[tokio::test]
    async fn a_post_whose_body_was_read_is_not_sent_again_after_a_reset() {
        let client = offline(&["a", "b"]);
        let calls = Arc::new(AtomicUsize::new(0));
        let n = calls.clone();
        let inner = Fake(move |req: Request<SlotBody<Full<Bytes>>>| {
            n.fetch_add(1, Ordering::Relaxed);
            async move {
                let _ = req.into_body().collect().await;
                Err::<Response<Full<Bytes>>, _>(reset())
            }
        });
        let mut svc = client.layer().layer(inner.clone());
        let err = svc.call(post("order 2")).await.expect_err("reset");
        let err = err.downcast::<BalancedError>().expect("a call error");
        assert_eq!(err.reason, crate::GaveUp::NotRetryable);
        assert_eq!(err.attempts.len(), 1);
        assert_eq!(calls.swap(0, Ordering::Relaxed), 1);

        // A GET after a reset goes elsewhere (3 attempts; 2 members).
        let get = Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
        let err = svc.call(get).await.expect_err("every member resets");
        let err = err.downcast::<BalancedError>().expect("a call error");
        assert_eq!(err.reason, crate::GaveUp::AllFailed, "{err}");
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        assert!(err.to_string().contains("connection reset"), "{err}");
    }

    #[tokio::test]
    async fn a_5xx_goes_back_to_the_caller_and_counts_against_the_member() {
        let client = offline(&["a"]);
        let inner = Fake(|_req: Request<SlotBody<Full<Bytes>>>| async {
            Ok(Response::builder().status(503).body(Full::new(Bytes::from("busy"))).unwrap())
        });
        let mut svc = client.layer().layer(inner);
        let get = Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
        let resp = svc.call(get).await.expect("a response");
        assert_eq!(resp.status(), 503);
        drop(resp);
        let st = client.inner.lock();
        assert_eq!(st.balancer.states()[0].load.consecutive_failures, 1);
        assert_eq!(st.balancer.states()[0].load.in_flight, 0);
    }

    /// An inner service that is not ready on its first poll (and wakes its caller), then is.
    #[derive(Clone)]
    struct Slow {
        polls: Arc<AtomicUsize>,
        calls: Arc<AtomicUsize>,
    }

    impl Service<Request<SlotBody<Full<Bytes>>>> for Slow {
        type Response = Response<Full<Bytes>>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            if self.polls.fetch_add(1, Ordering::Relaxed) == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                let body = req.into_body().collect().await.map_err(|e| match e {})?.to_bytes();
                Ok(Response::new(Full::new(body)))
            })
        }
    }

    #[tokio::test]
    async fn a_try_waits_for_an_inner_service_that_is_not_ready() {
        let client = offline(&["a", "b"]);
        let slow = Slow { polls: Arc::default(), calls: Arc::default() };
        let mut svc = client.layer().layer(slow.clone());
        let resp = svc.call(post("order 3")).await.expect("answered once ready");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "order 3");
        assert_eq!(slow.calls.load(Ordering::Relaxed), 1, "one try, after readiness");
        assert!(slow.polls.load(Ordering::Relaxed) >= 2);
        let st = client.inner.lock();
        assert!(st.balancer.states().iter().all(|s| s.load.in_flight == 0), "body done");
    }

    /// An inner service like tower's `ConcurrencyLimit`: readiness acquires a permit of a shared
    /// semaphore (queued in order), a call holds it until its response is released by the test;
    /// a clone starts with nothing acquired.
    struct Limited {
        sem: Arc<tokio::sync::Semaphore>,
        acquiring: Option<Pin<Box<dyn Future<Output = tokio::sync::OwnedSemaphorePermit> + Send>>>,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        release: tokio::sync::watch::Receiver<bool>,
    }

    impl Clone for Limited {
        fn clone(&self) -> Self {
            Limited {
                sem: self.sem.clone(),
                acquiring: None,
                permit: None,
                release: self.release.clone(),
            }
        }
    }

    impl Service<Request<SlotBody<Full<Bytes>>>> for Limited {
        type Response = Response<Full<Bytes>>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            if self.permit.is_none() {
                let sem = self.sem.clone();
                let acquiring = self.acquiring.get_or_insert_with(|| {
                    Box::pin(async move { sem.acquire_owned().await.expect("open semaphore") })
                });
                self.permit = Some(std::task::ready!(acquiring.as_mut().poll(cx)));
                self.acquiring = None;
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
            let permit = self.permit.take().expect("called when ready");
            let mut release = self.release.clone();
            Box::pin(async move {
                let _ = release.wait_for(|r| *r).await;
                drop(permit);
                Ok(Response::new(Full::new(Bytes::from("done"))))
            })
        }
    }

    // Regression: a try whose inner service was not ready went with a fresh clone and left
    // the polled service, first in the semaphore's queue, behind: the permit went to it and the
    // try waited until its deadline.
    #[tokio::test]
    async fn a_try_waiting_for_readiness_keeps_its_place_in_the_queue() {
        let client = offline(&["a"]);
        let (tx, rx) = tokio::sync::watch::channel(false);
        let sem = Arc::new(tokio::sync::Semaphore::new(1));
        let limited = Limited { sem, acquiring: None, permit: None, release: rx };
        let mut svc = client.layer().layer(limited);
        let get = || Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
        // A takes the only permit and holds it until released.
        let first = tokio::spawn(svc.call(get()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // B queues for the permit.
        let second = tokio::spawn(svc.call(get()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(true).expect("a receiver");
        let a = tokio::time::timeout(Duration::from_secs(2), first).await.expect("A answers");
        assert_eq!(a.unwrap().expect("A").status(), 200);
        let b = tokio::time::timeout(Duration::from_secs(2), second)
            .await
            .expect("B gets the permit A released");
        assert_eq!(b.unwrap().expect("B").status(), 200);
    }

    // Regression: a streamed response ended the member's request in the core at the time of its
    // head, so the member's EWMA went back in time when a long body ended.
    #[tokio::test(start_paused = true)]
    async fn a_response_ends_in_the_core_when_its_body_ends() {
        let client = offline(&["a"]);
        let inner = Fake(|_req: Request<SlotBody<Full<Bytes>>>| async {
            Ok(Response::new(Full::new(Bytes::from("streamed"))))
        });
        let mut svc = client.layer().layer(inner);
        let get = Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
        let resp = svc.call(get).await.expect("a response");
        let head = crate::clock::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "streamed");
        let st = client.inner.lock();
        let (_, stamp) = st.balancer.states()[0].load.ewma.last();
        assert!(
            stamp.since(head) >= Duration::from_secs(5),
            "ended {:?} after the head",
            stamp.since(head)
        );
        assert_eq!(st.balancer.states()[0].load.in_flight, 0);
    }

    /// An inner service that is never ready (a concurrency limit that stays saturated).
    #[derive(Clone)]
    struct NeverReady;

    impl Service<Request<SlotBody<Full<Bytes>>>> for NeverReady {
        type Response = Response<Full<Bytes>>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Pending
        }

        fn call(&mut self, _req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
            unreachable!("never ready, never called")
        }
    }

    // Regression: a try whose time ran out while the inner service was still not ready (so the
    // member never saw the request) was charged to the member as a timeout, so a saturated local
    // limit could eject healthy members.
    #[tokio::test(start_paused = true)]
    async fn a_try_that_never_left_is_not_charged_to_its_member() {
        let mut policy = Policy::default();
        policy.retry.per_try_timeout = Some(Duration::from_millis(50));
        policy.outlier.consecutive_failures = 1;
        let client = offline_with(policy, &["a", "b"]);
        let mut svc = client.layer().layer(NeverReady);
        // A POST: it may still go elsewhere, since nothing of it was sent.
        let err = svc.call(post("order 4")).await.expect_err("never ready");
        let err = err.downcast::<BalancedError>().expect("a call error");
        assert_eq!(err.reason, crate::GaveUp::AllFailed, "{err}");
        // Both members tried (each try timing out before it left), then nobody left to try.
        let timeouts =
            err.attempts.iter().filter(|a| matches!(a.error, crate::AttemptError::Timeout(_)));
        assert_eq!(timeouts.count(), 2, "{err}");
        let st = client.inner.lock();
        for s in st.balancer.states() {
            assert_eq!(s.load.consecutive_failures, 0, "not charged");
            assert!(s.ejected_until.is_none(), "not ejected");
            assert_eq!(s.load.in_flight, 0);
        }
    }
}
