//! The pools of clusters spoken to in HTTP/2 (`upstream_protocol = "http2"`): one multiplexed
//! connection per member address, keyed by the request URI's authority (the member's), while the
//! request goes out with the client's authority as `:authority` (its `Host`, which HTTP/2 does
//! not carry beside it, RFC 9113 8.3.1), as the HTTP/1.1 pools forward `Host`. hyper-util's
//! pooled client cannot do this: it keys its pool on the authority it sends.
//!
//! A connection comes from the same connectors as the HTTP/1.1 pools' (connect timeout,
//! `max_connections`, PROXY header, TLS), carries its open time to its answers, is replaced when
//! it closes, and is let go after 90 s without a new request (`POOL_IDLE`, as the HTTP/1.1
//! pools' idle connections).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use http::uri::{Authority, Scheme};
use http::{Extensions, Request, Response, Uri, header};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::{BoxError, POOL_IDLE, PoolBody, SendError};

/// What a connector must give for an HTTP/2 connection.
pub trait MemberIo:
    hyper::rt::Read + hyper::rt::Write + Connection + Unpin + Send + 'static
{
}

impl<T> MemberIo for T where
    T: hyper::rt::Read + hyper::rt::Write + Connection + Unpin + Send + 'static
{
}

/// A member's connection: its sender, what the connector said of it, its number (so that an
/// idle one takes only itself out of its slot) and its last request's time.
struct Conn<B> {
    tx: http2::SendRequest<B>,
    /// What its connector said of it (its open time), for its answers.
    extras: Extensions,
    id: u64,
    used: Arc<AtomicU64>,
}

/// A member's connection, filled by one request at a time.
type Slot<B> = Arc<tokio::sync::Mutex<Option<Conn<B>>>>;

/// The HTTP/2 pool of one connector (`C`), for request bodies of type `B`.
pub struct H2Pool<C, B> {
    connector: C,
    shared: Arc<Shared<B>>,
}

struct Shared<B> {
    /// Per member address, its slot (one per member the pool was asked for: the members of
    /// the views it served).
    slots: Mutex<HashMap<Authority, Slot<B>>>,
    next_id: AtomicU64,
    /// When the pool was made: connections note their last request's time from it.
    epoch: Instant,
}

impl<B> Shared<B> {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

impl<C, B> std::fmt::Debug for H2Pool<C, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Pool").finish_non_exhaustive()
    }
}

impl<C: Clone, B> Clone for H2Pool<C, B> {
    fn clone(&self) -> Self {
        H2Pool { connector: self.connector.clone(), shared: self.shared.clone() }
    }
}

/// A request's answer from an HTTP/2 pool.
pub type Answering = Pin<Box<dyn Future<Output = Result<Response<Incoming>, SendError>> + Send>>;

/// A connection to send on: its sender, what its connector said, its number, and whether it
/// was open before this request.
type Taken<B> = (http2::SendRequest<B>, Extensions, u64, bool);

impl<C, B> H2Pool<C, B>
where
    C: tower_service::Service<Uri, Error = BoxError> + Clone + Send + Sync + 'static,
    C::Future: Send,
    C::Response: MemberIo,
    B: PoolBody,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// A pool with no connection yet.
    pub fn new(connector: C) -> Self {
        let shared =
            Shared { slots: Mutex::default(), next_id: AtomicU64::new(0), epoch: Instant::now() };
        H2Pool { connector, shared: Arc::new(shared) }
    }

    /// Sends `req` to the member its URI names, with its `Host` (when it has a valid one) as
    /// the `:authority`.
    pub fn request(&self, mut req: Request<B>) -> Answering {
        let Some(member) = req.uri().authority().cloned() else {
            let e = "the request names no member address".into();
            return Box::pin(std::future::ready(Err(SendError::Connect(e))));
        };
        client_authority(&mut req);
        let pool = self.clone();
        Box::pin(async move { pool.send(member, req).await })
    }

    async fn send(
        self,
        member: Authority,
        req: Request<B>,
    ) -> Result<Response<Incoming>, SendError> {
        let (mut tx, extras, id, reused) = self.conn(&member, None).await?;
        let req = match tx.try_send_request(req).await {
            Ok(resp) => return Ok(answered(resp, extras)),
            Err(mut e) => match e.take_message() {
                // Refused unsent by a connection that was closing (its member's GOAWAY, say):
                // once more on a new one, as hyper-util's pool does.
                Some(req) if reused => req,
                _ => return Err(SendError::Request(e.into_error())),
            },
        };
        drop(tx);
        let (mut tx, extras, ..) = self.conn(&member, Some(id)).await?;
        match tx.send_request(req).await {
            Ok(resp) => Ok(answered(resp, extras)),
            Err(e) => Err(SendError::Request(e)),
        }
    }

    /// The open connection to `member`, opened now if there is none (or only connection
    /// `stale`, which refused a request).
    async fn conn(&self, member: &Authority, stale: Option<u64>) -> Result<Taken<B>, SendError> {
        let slot = {
            let mut slots = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get(member) {
                Some(slot) => slot.clone(),
                None => slots.entry(member.clone()).or_default().clone(),
            }
        };
        // Held while connecting: the requests behind wait for this connection, not open more.
        let mut slot = slot.lock_owned().await;
        if let Some(conn) = slot.as_ref()
            && !conn.tx.is_closed()
            && stale != Some(conn.id)
        {
            conn.used.store(self.shared.now(), Ordering::Relaxed);
            return Ok((conn.tx.clone(), conn.extras.clone(), conn.id, true));
        }
        *slot = None;
        let conn = self.open(member).await?;
        let taken = (conn.tx.clone(), conn.extras.clone(), conn.id, false);
        *slot = Some(conn);
        Ok(taken)
    }

    /// Opens a connection to `member` and starts driving it.
    async fn open(&self, member: &Authority) -> Result<Conn<B>, SendError> {
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(member.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| SendError::Connect(e.into()))?;
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(SendError::Connect)?;
        let io = connector.call(uri).await.map_err(SendError::Connect)?;
        let mut extras = Extensions::new();
        io.connected().get_extras(&mut extras);
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder.timer(TokioTimer::new());
        let (tx, conn) = builder.handshake(io).await.map_err(SendError::Request)?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let used = Arc::new(AtomicU64::new(self.shared.now()));
        let watch = Watch {
            shared: Arc::downgrade(&self.shared),
            member: member.clone(),
            id,
            used: used.clone(),
        };
        tokio::spawn(watch.drive(conn));
        Ok(Conn { tx, extras, id, used })
    }
}

/// What drives a connection: it lets the connection go (takes it out of its slot) once it has
/// carried no new request for `POOL_IDLE`; the connection then ends with its last stream.
struct Watch<B> {
    shared: Weak<Shared<B>>,
    member: Authority,
    id: u64,
    used: Arc<AtomicU64>,
}

impl<B> Watch<B> {
    async fn drive<F: Future>(self, conn: F) {
        let mut conn = std::pin::pin!(conn);
        // Bounded: each round either ends the connection's driving or finds it used since.
        loop {
            if tokio::time::timeout(POOL_IDLE / 4, &mut conn).await.is_ok() {
                return;
            }
            let Some(shared) = self.shared.upgrade() else { break };
            let idle = shared.now().saturating_sub(self.used.load(Ordering::Relaxed));
            if u128::from(idle) >= POOL_IDLE.as_millis() && self.forget(&shared) {
                break;
            }
        }
        let _ = conn.await;
    }

    /// Takes this connection out of its slot, unless a request holds the slot now.
    fn forget(&self, shared: &Shared<B>) -> bool {
        let mut slots = shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slot) = slots.get(&self.member) else { return true };
        let Ok(mut conn) = slot.try_lock() else { return false };
        if conn.as_ref().is_some_and(|c| c.id == self.id) {
            *conn = None;
            drop(conn);
            slots.remove(&self.member);
        }
        true
    }
}

/// The answer on a connection, with what its connector said of it (its open time).
fn answered(mut resp: Response<Incoming>, extras: Extensions) -> Response<Incoming> {
    if !extras.is_empty() {
        resp.extensions_mut().extend(extras);
    }
    resp
}

/// Moves `req`'s `Host` into its URI's authority, which HTTP/2 sends as `:authority`; a request
/// without a valid one keeps the member's address there (an `http` request needs one).
fn client_authority<B>(req: &mut Request<B>) {
    let Some(host) = req.headers_mut().remove(header::HOST) else { return };
    let Ok(authority) = Authority::try_from(host.as_bytes()) else { return };
    let mut parts = http::uri::Parts::default();
    parts.scheme = req.uri().scheme().cloned();
    parts.authority = Some(authority);
    parts.path_and_query = req.uri().path_and_query().cloned();
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}
