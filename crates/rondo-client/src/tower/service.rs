//! [`Balanced`]: the tower [`Service`] that balances an HTTP service over a rondo service's
//! members. Its `call` takes a request apart once (the parts and body every try shares), reads
//! the hash key when the policy is `hash`, and hands the request to the call loop as
//! [`HttpTries`] inside a named [`ResponseFuture`] (`future.rs`), which does the rest.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use rondo_core::HashKeySource;
use rondo_core::failover::is_idempotent_method;
use tower::Service;

use super::body::{Shared, SlotBody, Tracked};
use super::error::BoxError;
use super::future::{HttpTries, ResponseFuture};
use crate::call::{Plan, Run};
use crate::client::Client;
use crate::inner::{Inner, SessionCell};

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
/// - when every option failed, the error is a boxed [`BalancedError`](crate::BalancedError) listing every attempt.
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
        Balanced::with(self.client.clone(), self.session.clone(), inner)
    }
}

impl<S> Balanced<S> {
    /// `inner` balanced by `client` (the same as `client.layer().layer(inner)`).
    pub fn new(client: &Client, inner: S) -> Self {
        Balanced::with(client.clone(), None, inner)
    }

    /// `inner` balanced by `client`, its requests in `session` (`None`: per request, or the
    /// client's own session when the policy's granularity asks for one).
    pub(crate) fn with(client: Client, session: Option<Arc<SessionCell>>, inner: S) -> Self {
        Balanced { client, session, inner: Arc::new(Mutex::new(inner)) }
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
        let tries = HttpTries::new(shared, has_body, self.inner.clone());
        ResponseFuture { run: Run::new(client, plan, tries) }
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
