//! The public facade: [`Builder`] (settings, bootstrap from the naming service), [`Client`]
//! (one service's members and policy, kept current by a background task, `watch.rs`), its
//! calls ([`Client::call`], [`CallOptions`], the picked member as a [`Target`]) and [`Session`]s.
//! A call is handed to the call loop (`call/`) as [`Tries`] over the caller's closure; the call
//! internals (pick, tickets, the loop) and the tower layer (`tower/`, which also adds
//! [`Client::layer`] and [`Session::layer`]) are kept out of here.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::Authority;
use rondo_core::wire::{Answer, Member};
use rondo_core::{Algorithm, Policy};
use tokio::sync::{Notify, watch};

use crate::call::{Plan, Run, Ticket, Tries};
use crate::clock;
use crate::error::{BootstrapError, CallError, Failed};
use crate::inner::{Inner, SessionCell, SessionState};
use crate::naming::NamingClient;
use crate::state::{MemberRef, State};
use crate::tls::TlsConfig;
use crate::watch::{Timing, keep_current};

/// Settings of a [`Client`]; see [`Client::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    service: String,
    endpoints: Vec<String>,
    group: Option<String>,
    seed: Option<u64>,
    naming_timeout: Duration,
    watch_wait: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    call_timeout: Duration,
    tls: Option<TlsConfig>,
    watch_on: bool,
}

impl Builder {
    /// Adds a naming endpoint (`host:port` or `http://host:port`). Give two or more: any of them
    /// may be down; the client uses the first that answers and moves on when it fails.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoints.push(endpoint.into());
        self
    }

    /// TLS for `https://host:port` naming endpoints (their `[naming] tls`): the roots their
    /// certificates are verified against, and a client certificate if they ask for one. To
    /// reach members that speak TLS, give the same settings' [`TlsConfig::connector`] to the
    /// hyper-util client under [`Client::layer`].
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Adds several naming endpoints.
    pub fn endpoints<I: IntoIterator<Item = S>, S: Into<String>>(mut self, endpoints: I) -> Self {
        self.endpoints.extend(endpoints.into_iter().map(Into::into));
        self
    }

    /// The caller's locality group: members of this group are preferred while the policy says
    /// `prefer_local` and the group has a healthy member.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Seeds the client's random generator (randomized pickers, `rotating`'s order); by default
    /// a random seed, so that clients spread differently.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Timeout of a naming request (and of connecting to an endpoint); default 2 s.
    pub fn naming_timeout(mut self, timeout: Duration) -> Self {
        self.naming_timeout = timeout;
        self
    }

    /// How long one watch request waits for a change; default 30 s, kept within 10 ms to
    /// 300 s (the naming service's limit; a shorter wait would poll it in a tight loop).
    pub fn watch_wait(mut self, wait: Duration) -> Self {
        self.watch_wait = wait.clamp(Duration::from_millis(10), Duration::from_secs(300));
        self
    }

    /// Backoff between failed naming requests, doubling from `min` up to `max`; default 100 ms
    /// to 5 s; `min` is at least 1 ms (a zero backoff would spin on a dead endpoint).
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min.max(Duration::from_millis(1));
        self.backoff_max = max.max(self.backoff_min);
        self
    }

    /// The most a call may take over all its tries (each try is also bounded by the policy's
    /// per-try timeout); default 30 s.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Whether the background task long-polls the naming service's watch (default on). Off,
    /// the answer is fetched again only when a response shows a newer view id
    /// ([`Client::observe_view_id`], done by the tower layer for every response; routers add
    /// the id to proxied responses with `view_id_header = true`): no standing request per
    /// client, as PKUAS's clients learnt of changes from the view id on replies.
    pub fn watch(mut self, on: bool) -> Self {
        self.watch_on = on;
        self
    }

    /// Fetches the service's answer from the first endpoint that gives it and starts keeping it
    /// current in a background task (which ends when the last clone of the client is dropped).
    /// With no [`Builder::endpoint`], the endpoints are read from `RONDO_NAMING_ENDPOINTS`
    /// (`host:port,host:port`; a malformed list is [`BootstrapError::BadEnv`]). Must run
    /// inside a tokio runtime.
    pub async fn connect(mut self) -> Result<Client, BootstrapError> {
        if self.endpoints.is_empty() {
            match crate::env::endpoints_from_env().map_err(BootstrapError::BadEnv)? {
                Some(list) => self.endpoints = list,
                None => return Err(BootstrapError::NoEndpoint),
            }
        }
        let naming = self
            .endpoints
            .iter()
            .map(|e| {
                NamingClient::with_tls(e, self.naming_timeout, self.tls.as_ref()).ok_or_else(|| {
                    if e.trim().starts_with("https://") && self.tls.is_none() {
                        BootstrapError::NeedsTls(e.clone())
                    } else {
                        BootstrapError::BadEndpoint(e.clone())
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut failures = Vec::new();
        let mut first = None;
        for (i, n) in naming.iter().enumerate() {
            match n.answer(&self.service).await {
                Ok(a) => {
                    first = Some((i, a));
                    break;
                }
                Err(e) => {
                    tracing::debug!(service = %self.service, error = %e, "bootstrap endpoint failed");
                    failures.push(e);
                }
            }
        }
        let Some((at, answer)) = first else {
            return Err(BootstrapError::NoAnswer { service: self.service, failures });
        };
        let timing = Timing {
            wait: self.watch_wait,
            backoff_min: self.backoff_min,
            backoff_max: self.backoff_max,
            watch: self.watch_on,
        };
        let inner = self.assemble(naming, at, answer);
        let task = tokio::spawn(keep_current(inner.clone(), at, timing));
        Ok(Client { inner, _task: Arc::new(AbortOnDrop(Some(task))) })
    }

    fn assemble(self, naming: Vec<NamingClient>, at: usize, answer: Answer) -> Arc<Inner> {
        let seed = self.seed.unwrap_or_else(|| RandomState::new().hash_one(std::process::id()));
        let (view, _) = watch::channel(answer.view_id);
        let hash = answer.policy.algorithm == Algorithm::Hash;
        Arc::new(Inner {
            service: self.service,
            hash_policy: AtomicBool::new(hash),
            group: self.group,
            state: Mutex::new(State::new(answer, seed, clock::now())),
            view,
            wanted: AtomicU64::new(0),
            wake: Notify::new(),
            endpoint: AtomicU64::new(at as u64),
            naming,
            call_timeout: self.call_timeout,
            own: Mutex::new(SessionState::default()),
        })
    }

    /// A client held at `answer`, with no naming endpoint and no background task (tests).
    #[cfg(test)]
    pub(crate) fn offline(self, answer: Answer) -> Client {
        let naming =
            vec![NamingClient::new("127.0.0.1:9", Duration::from_secs(1)).expect("endpoint")];
        Client { inner: self.assemble(naming, 0, answer), _task: Arc::new(AbortOnDrop(None)) }
    }
}

/// A service's members and policy, kept current from the naming service, balancing calls with
/// the same core as the router. Cheap to clone; clones share everything.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    _task: Arc<AbortOnDrop>,
}

#[derive(Debug)]
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// What to do with a call.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Whether the call may be sent again after a member failed it once sent (a reset, a
    /// timeout). Connect failures always go elsewhere. Default: idempotent (`Client::call`).
    pub not_idempotent: bool,
    /// The key for `hash` services (a user id, a session id): equal keys go to the same
    /// member while it is up.
    pub hash_key: Option<String>,
}

impl CallOptions {
    /// Options for a call that must not be sent twice once a member may have acted on it.
    pub fn not_idempotent() -> Self {
        CallOptions { not_idempotent: true, hash_key: None }
    }

    /// Sets the key for `hash` services.
    pub fn hash_key(mut self, key: impl Into<String>) -> Self {
        self.hash_key = Some(key.into());
        self
    }
}

/// The member a try goes to, handed to the caller's closure. Cheap to clone: it shares the
/// member's name and address with the client (built once per answer, not per call).
#[derive(Clone)]
pub struct Target {
    member: Arc<MemberRef>,
    addr: SocketAddr,
}

impl Target {
    /// The member's name.
    pub fn name(&self) -> &str {
        &self.member.name
    }

    /// Its `host:port` as the naming service gave it.
    pub fn address(&self) -> &str {
        &self.member.address
    }

    /// Its socket address (resolved when the address is a host name).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its address as a URI authority (parsed once per answer), to build a request's URI
    /// without parsing the address again; `None` when the address is not a valid authority.
    pub fn authority(&self) -> Option<&Authority> {
        self.member.authority.as_ref()
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name())
            .field("address", &self.address())
            .field("addr", &self.addr)
            .finish()
    }
}

impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        self.name() == other.name() && self.address() == other.address() && self.addr == other.addr
    }
}

impl Eq for Target {}

impl Client {
    /// Settings for a client of `service`; add endpoints and [`Builder::connect`].
    pub fn builder(service: impl Into<String>) -> Builder {
        Builder {
            service: service.into(),
            endpoints: Vec::new(),
            group: None,
            seed: None,
            naming_timeout: Duration::from_secs(2),
            watch_wait: Duration::from_secs(30),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            tls: None,
            watch_on: true,
        }
    }

    /// The service this client balances.
    pub fn service(&self) -> &str {
        &self.inner.service
    }

    /// The view id of the answer held. View ids are counted by each naming endpoint (each
    /// router) on its own: compare ids from the endpoint in use ([`Client::endpoint`]); after
    /// the client moves to another endpoint it starts again from that endpoint's answer.
    pub fn view_id(&self) -> u64 {
        *self.inner.view.borrow()
    }

    /// The answer held: members, policy, view id.
    pub fn answer(&self) -> Arc<Answer> {
        self.inner.lock().answer.clone()
    }

    /// The members held, in the answer's order.
    pub fn members(&self) -> Vec<Member> {
        self.answer().members.clone()
    }

    /// The policy held.
    pub fn policy(&self) -> Policy {
        self.answer().policy.clone()
    }

    /// The naming endpoint in use, as `http://host:port`.
    pub fn endpoint(&self) -> &str {
        let i = self.inner.endpoint.load(Ordering::Relaxed) as usize;
        self.inner.naming[i.min(self.inner.naming.len() - 1)].endpoint()
    }

    /// Tells the client that a response carried view id `view_id` (the `rondo-view-id`
    /// header, which the naming service sets; a member behind a rondo router may pass it on):
    /// when it is newer than the one held, the answer is fetched again now instead of waiting
    /// for the watch. The tower layer does this for every response by itself. Ids from another
    /// naming endpoint than the one in use can only cause an early refetch, never a missed one.
    pub fn observe_view_id(&self, view_id: u64) {
        self.inner.observe_view_id(view_id);
    }

    /// Waits until the answer held is from view `view_id` or later (of the endpoint in use; see
    /// [`Client::view_id`]).
    pub async fn wait_for_view(&self, view_id: u64) {
        let mut rx = self.inner.view.subscribe();
        let _ = rx.wait_for(|v| *v >= view_id).await;
    }

    /// Waits until the answer held changes (a newer view).
    pub async fn changed(&self) {
        let mut rx = self.inner.view.subscribe();
        rx.borrow_and_update();
        let _ = rx.changed().await;
    }

    /// Runs `call` against a member picked by the service's policy, failing over to other
    /// members as the policy's retry rules allow; see [`Client::call_with`]. The call is taken
    /// as idempotent.
    ///
    /// With granularity `session` (or `lookup`) the whole client is one session: calls stay on
    /// the member picked first while it can keep them. Use [`Client::session`] for sessions of
    /// your own.
    pub fn call<T, E, F, Fut>(&self, call: F) -> impl Future<Output = Result<T, CallError<E>>>
    where
        F: FnMut(Target) -> Fut,
        Fut: Future<Output = Result<T, Failed<E>>>,
    {
        self.call_with(CallOptions::default(), call)
    }

    /// Runs `call` against a member picked by the service's policy: each try is bounded by the
    /// policy's per-try timeout, its outcome (latency, failure) goes into the core's estimators,
    /// and a failed try goes to another member when it is safe (see [`Failed`] and
    /// [`CallOptions::not_idempotent`]) and the retry budget allows. The error, when every
    /// option failed, lists every attempt.
    pub fn call_with<T, E, F, Fut>(
        &self,
        options: CallOptions,
        call: F,
    ) -> impl Future<Output = Result<T, CallError<E>>>
    where
        F: FnMut(Target) -> Fut,
        Fut: Future<Output = Result<T, Failed<E>>>,
    {
        self.call_in(options, None, call)
    }

    /// A session: its calls stay on one member while that member can keep them (draining
    /// members keep their sessions), and move down the failover order when it cannot. With the
    /// `rotating` algorithm each session is a new context (GlassFish: the client's list is
    /// randomized once, each context starts one further down it). The member's session count
    /// (`least-sessions`) holds until the session is dropped.
    pub fn session(&self) -> Session {
        Session {
            client: self.clone(),
            cell: Arc::new(SessionCell { inner: self.inner.clone(), state: Mutex::default() }),
        }
    }

    /// A closure call with `options`, in `session` (or the client's own session when the
    /// granularity asks for one). The call loop's future is the whole call's: no async layer
    /// of its own around it.
    fn call_in<T, E, F, Fut>(
        &self,
        options: CallOptions,
        session: Option<Arc<SessionCell>>,
        call: F,
    ) -> impl Future<Output = Result<T, CallError<E>>>
    where
        F: FnMut(Target) -> Fut,
        Fut: Future<Output = Result<T, Failed<E>>>,
    {
        let plan = Plan {
            idempotent: !options.not_idempotent,
            hash: options.hash_key.as_deref().map(|k| crate::state::key_hash(k.as_bytes())),
            session,
        };
        Run::new(&self.inner, plan, Targeted(call))
    }
}

/// A caller's closure over [`Target`]s as the call loop takes it.
struct Targeted<F>(F);

impl<T, E, F, Fut> Tries for Targeted<F>
where
    F: FnMut(Target) -> Fut,
    Fut: Future<Output = Result<T, Failed<E>>>,
{
    type Value = T;
    type Error = E;
    type Try = Fut;
    type Output = T;

    fn start(&mut self, member: &Arc<MemberRef>, addr: SocketAddr) -> Fut {
        (self.0)(Target { member: member.clone(), addr })
    }

    fn untouched(&self) -> bool {
        true
    }

    fn finish(self, _inner: &Inner, value: T, mut ticket: Ticket) -> T {
        ticket.succeeded();
        value
    }
}

/// A session of calls that stay on one member while it can keep them; see [`Client::session`].
#[derive(Debug, Clone)]
pub struct Session {
    pub(crate) client: Client,
    pub(crate) cell: Arc<SessionCell>,
}

impl Session {
    /// The member the session is on, once a call placed it.
    pub fn member(&self) -> Option<String> {
        self.cell.state.lock().unwrap_or_else(|e| e.into_inner()).member.clone()
    }

    /// The session's `rotating` context, once a call started it.
    pub fn context(&self) -> Option<u32> {
        self.cell.state.lock().unwrap_or_else(|e| e.into_inner()).context
    }

    /// Like [`Client::call`], on the session's member (or the next one in the failover order
    /// when it cannot take the call; the session then moves there).
    pub fn call<T, E, F, Fut>(&self, call: F) -> impl Future<Output = Result<T, CallError<E>>>
    where
        F: FnMut(Target) -> Fut,
        Fut: Future<Output = Result<T, Failed<E>>>,
    {
        self.call_with(CallOptions::default(), call)
    }

    /// Like [`Client::call_with`], in the session.
    pub fn call_with<T, E, F, Fut>(
        &self,
        options: CallOptions,
        call: F,
    ) -> impl Future<Output = Result<T, CallError<E>>>
    where
        F: FnMut(Target) -> Fut,
        Fut: Future<Output = Result<T, Failed<E>>>,
    {
        self.client.call_in(options, Some(self.cell.clone()), call)
    }
}

#[cfg(test)]
mod tests;
