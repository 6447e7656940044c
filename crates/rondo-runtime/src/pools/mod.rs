//! Connections to members, for the router's request path and the queues' deliveries alike: one
//! keep-alive pool per member address (hyper-util's pooled client, keyed by authority), HTTP/1.1
//! or HTTP/2 prior knowledge per cluster, generic over the request body. A cluster with
//! `upstream_tls` has pools of its own whose connector does the TLS handshake after the TCP
//! connect ([`TlsConnector`]: members verified against the cluster's `ca`, the router's
//! certificate presented when set), so TLS connections are pooled like plain ones; its pools are
//! made again when a new view brings the files read again. A plain connection opened for a
//! request that was dropped before it was ready is kept for the next request to that member
//! ([`KeepConnector`]), not closed unused. A cluster with `proxy_protocol` gets pools of one
//! client's each ([`Clients::for_client`]), whose connections start with its PROXY header.
//! `gate.rs` bounds a cluster's connections and waiting requests; `connect_time.rs` is the
//! open time a new connection carries to its answers.

pub mod connect_time;
mod connectors;
pub mod gate;
pub mod h2;

use connectors::http_connector;
pub use connectors::*;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rondo_core::{TlsFailure, UpstreamProtocol};

use crate::ClusterRt;
use crate::pools::gate::Gate;
use crate::tls::upstream::UpstreamTlsRt;

/// A pooled client sending bodies of type `B`.
pub type Pool<B> = Conns<KeepConnector, B>;
/// A pooled client speaking TLS to members.
pub type TlsPool<B> = Conns<TlsConnector, B>;

/// What a request body must be for the pools (hyper-util's client's bounds).
pub trait PoolBody: hyper::body::Body + Send + Unpin + 'static
where
    Self::Data: Send,
    Self::Error: Into<BoxError>,
{
}

impl<B> PoolBody for B
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
}

/// How long an idle pooled connection is kept.
pub(crate) const POOL_IDLE: Duration = Duration::from_secs(90);

/// The pools of one router (or of one process's queue deliveries).
pub struct Clients<B> {
    h1: Pool<B>,
    h2: Pool<B>,
    connector: KeepConnector,
    /// The shared pools' connect timeout; a cluster with another `connect_timeout` gets a pool
    /// of its own.
    connect_timeout: Duration,
    /// Per cluster with `upstream_tls`: the loaded settings its pool was made with, when, and
    /// the pool.
    tls: Arc<Mutex<TlsPools<B>>>,
    /// Per plain cluster with `max_connection_age_ms`: when its own pool was made, and the pool.
    aged: Arc<Mutex<AgedPools<B>>>,
    /// Per cluster with `max_connections`: its count of open connections, kept across views
    /// (made again only when its limits change).
    gates: Arc<Mutex<HashMap<String, Arc<Gate>>>>,
}

impl<B> Clone for Clients<B> {
    fn clone(&self) -> Self {
        Clients {
            h1: self.h1.clone(),
            h2: self.h2.clone(),
            connector: self.connector.clone(),
            connect_timeout: self.connect_timeout,
            tls: self.tls.clone(),
            aged: self.aged.clone(),
            gates: self.gates.clone(),
        }
    }
}

impl<B> std::fmt::Debug for Clients<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients").finish_non_exhaustive()
    }
}

/// What a cluster's own pool was made with: its connect timeout and its gate.
type MadeWith = (Duration, Option<Arc<Gate>>);

/// Whether a pool made with `made` still fits `now`'s settings.
fn same(made: &MadeWith, now: &MadeWith) -> bool {
    made.0 == now.0
        && match (&made.1, &now.1) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
}

/// Per cluster name: when its own pool was made, with what, and the pool.
type AgedPools<B> = HashMap<String, (Instant, MadeWith, Arc<Pool<B>>)>;

/// Per cluster name: the loaded `upstream_tls` a pool was made with, when, and the pool.
type TlsPools<B> = HashMap<String, (Arc<UpstreamTlsRt>, Instant, MadeWith, Arc<TlsPool<B>>)>;

/// Whether a pool made at `made` is still young under the cluster's `max_connection_age_ms`
/// (hyper's pools count no age per connection: a cluster with the limit gets a pool of its own,
/// made anew once it is that old; the old pool's connections close as their requests end).
fn young(made: Instant, rt: &ClusterRt) -> bool {
    rt.spec.policy.connections.max_age.is_none_or(|age| made.elapsed() < age)
}

/// Where a try is sent.
pub enum Sender<'a, B> {
    /// A plain pool.
    Plain(&'a Pool<B>),
    /// A cluster's TLS pool.
    Tls(Arc<TlsPool<B>>),
    /// A plain pool of a cluster's own (one with `max_connection_age_ms`).
    Own(Arc<Pool<B>>),
}

impl<B> std::fmt::Debug for Sender<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sender::Plain(_) => "Sender::Plain",
            Sender::Tls(_) => "Sender::Tls",
            Sender::Own(_) => "Sender::Own",
        })
    }
}

impl<B: PoolBody> Sender<'_, B>
where
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// Sends `req` through the pool.
    pub fn request(&self, req: http::Request<B>) -> Sending {
        match self {
            Sender::Plain(p) => p.request(req),
            Sender::Tls(p) => p.request(req),
            Sender::Own(p) => p.request(req),
        }
    }
}

fn pool<C, B>(connector: C, protocol: UpstreamProtocol) -> Conns<C, B>
where
    C: MemberConnector,
    B: PoolBody,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if protocol == UpstreamProtocol::Http2 {
        return Conns::Http2(h2::H2Pool::new(connector));
    }
    let mut b = Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(POOL_IDLE).pool_timer(TokioTimer::new());
    Conns::Http1(b.build(connector))
}

/// What the pools' connectors are: hyper-util's kind for HTTP/1.1, a service giving
/// [`h2::MemberIo`] for HTTP/2 (both [`KeepConnector`] and [`TlsConnector`]).
pub trait MemberConnector:
    hyper_util::client::legacy::connect::Connect
    + tower_service::Service<Uri, Error = BoxError, Future: Send, Response: h2::MemberIo>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<C> MemberConnector for C where
    C: hyper_util::client::legacy::connect::Connect
        + tower_service::Service<Uri, Error = BoxError, Future: Send, Response: h2::MemberIo>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The pool of one protocol: hyper-util's pooled client for HTTP/1.1 members,
/// [`h2::H2Pool`] for HTTP/2 members (which sends the client's authority as `:authority`).
// Unboxed: a pool is made once per cluster setting and never moved per request, and a box would
// cost each HTTP/1.1 request a pointer hop.
#[allow(clippy::large_enum_variant)]
pub enum Conns<C, B> {
    /// HTTP/1.1.
    Http1(Client<C, B>),
    /// HTTP/2 with prior knowledge.
    Http2(h2::H2Pool<C, B>),
}

impl<C: Clone, B> Clone for Conns<C, B> {
    fn clone(&self) -> Self {
        match self {
            Conns::Http1(c) => Conns::Http1(c.clone()),
            Conns::Http2(p) => Conns::Http2(p.clone()),
        }
    }
}

impl<C, B> Conns<C, B>
where
    C: MemberConnector,
    B: PoolBody,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// Sends `req` to the member its URI's authority names.
    pub fn request(&self, req: http::Request<B>) -> Sending {
        match self {
            Conns::Http1(c) => Sending::Pool(c.request(req)),
            Conns::Http2(p) => Sending::Own(p.request(req)),
        }
    }
}

impl<C, B> std::fmt::Debug for Conns<C, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conns::Http1(_) => "Conns::Http1",
            Conns::Http2(_) => "Conns::Http2",
        })
    }
}

/// A request on its way through a pool.
pub enum Sending {
    /// Through hyper-util's pooled client.
    Pool(ResponseFuture),
    /// Through an HTTP/2 pool.
    Own(h2::Answering),
}

impl std::fmt::Debug for Sending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sending")
    }
}

impl Future for Sending {
    type Output = Result<http::Response<hyper::body::Incoming>, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Sending::Pool(f) => Pin::new(f).poll(cx).map_err(SendError::Pool),
            Sending::Own(f) => f.as_mut().poll(cx),
        }
    }
}

/// Why a request through a pool got no answer. Its `source` chain is the cause's (a
/// connector's error, TLS alert, body error), as the callers classify it.
#[derive(Debug)]
pub enum SendError {
    /// hyper-util's pooled client's error (HTTP/1.1 members).
    Pool(hyper_util::client::legacy::Error),
    /// No connection to the member could be opened (HTTP/2 members).
    Connect(BoxError),
    /// The HTTP/2 connection failed the request or its handshake.
    Request(hyper::Error),
}

impl SendError {
    /// Whether the request failed before any connection to its member was open.
    pub fn is_connect(&self) -> bool {
        match self {
            SendError::Pool(e) => e.is_connect(),
            SendError::Connect(_) => true,
            SendError::Request(_) => false,
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Pool(e) => e.fmt(f),
            SendError::Connect(_) => f.write_str("cannot connect to the member"),
            SendError::Request(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Pool(e) => e.source(),
            SendError::Connect(e) => Some(&**e),
            SendError::Request(e) => e.source(),
        }
    }
}

impl<B: PoolBody> Clients<B>
where
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// Pools with `connect_timeout` for new connections (clusters with another
    /// `connect_timeout` get pools of their own).
    pub fn new(connect_timeout: Duration) -> Self {
        let http = http_connector(connect_timeout);
        let connector = KeepConnector { http, spare: Arc::default(), header: None, gate: None };
        let h1 = pool(connector.clone(), UpstreamProtocol::Http1);
        let h2 = pool(connector.clone(), UpstreamProtocol::Http2);
        let (tls, aged, gates) = Default::default();
        Clients { h1, h2, connector, connect_timeout, tls, aged, gates }
    }

    /// The count of `rt`'s open connections when it has `max_connections` (the same across
    /// views while its limits stay).
    pub fn gate(&self, rt: &ClusterRt) -> Option<Arc<Gate>> {
        let cap = rt.spec.policy.limits.max_connections?;
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        match gates.get(&rt.spec.name) {
            Some(g) if g.cap() == cap => Some(g.clone()),
            _ => {
                let g = Gate::new(cap);
                gates.insert(rt.spec.name.clone(), g.clone());
                Some(g)
            }
        }
    }

    /// What `rt`'s own pool is made with now.
    fn made_with(&self, rt: &ClusterRt) -> MadeWith {
        (rt.spec.policy.connect_timeout, self.gate(rt))
    }

    /// The connector for `rt`'s members: the shared one, or one with the cluster's own
    /// `connect_timeout` (sharing the spare connections).
    fn connector_for(&self, rt: &ClusterRt) -> KeepConnector {
        let timeout = rt.spec.policy.connect_timeout;
        let gate = self.gate(rt);
        if timeout == self.connect_timeout {
            return KeepConnector { gate, ..self.connector.clone() };
        }
        let spare = self.connector.spare.clone();
        KeepConnector { http: http_connector(timeout), spare, header: None, gate }
    }

    /// Pools of one client's for `rt`'s members (a cluster with `proxy_protocol`): each new
    /// connection starts with `header`, the PROXY header naming that client, before TLS if the
    /// cluster has `upstream_tls`. Such a connection may carry only that client's requests, so
    /// its pool is made for the client alone and is dropped with it (closing its connections).
    pub fn for_client(
        &self,
        rt: &ClusterRt,
        header: Arc<[u8]>,
    ) -> Result<Sender<'static, B>, TlsFailure> {
        let http = KeepConnector { header: Some(header), ..self.connector_for(rt) };
        Ok(match &rt.tls {
            None => Sender::Own(Arc::new(pool(http, rt.spec.upstream_protocol))),
            Some(Err(_)) => return Err(TlsFailure::Config),
            Some(Ok(tls)) => {
                let connector = TlsConnector { http, tls: tls.clone() };
                Sender::Tls(Arc::new(pool(connector, rt.spec.upstream_protocol)))
            }
        })
    }

    /// The pool for a cluster's protocol.
    pub fn for_protocol(&self, p: UpstreamProtocol) -> &Pool<B> {
        match p {
            UpstreamProtocol::Http2 => &self.h2,
            UpstreamProtocol::Http1 | UpstreamProtocol::Tcp | UpstreamProtocol::Udp => &self.h1,
        }
    }

    /// Where a try to a member of `rt` goes: its TLS pool when it has `upstream_tls` (an error
    /// when its files could not be loaded), else the plain pool of its protocol.
    pub fn for_cluster<'a>(&'a self, rt: &ClusterRt) -> Result<Sender<'a, B>, TlsFailure> {
        let tls = match &rt.tls {
            None if rt.spec.policy.connections.max_age.is_none()
                && rt.spec.policy.connect_timeout == self.connect_timeout
                && rt.spec.policy.limits.max_connections.is_none() =>
            {
                return Ok(Sender::Plain(self.for_protocol(rt.spec.upstream_protocol)));
            }
            None => {
                let now = self.made_with(rt);
                let mut pools = self.aged.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((made, made_with, p)) = pools.get(&rt.spec.name)
                    && young(*made, rt)
                    && same(made_with, &now)
                {
                    return Ok(Sender::Own(p.clone()));
                }
                let p = Arc::new(pool(self.connector_for(rt), rt.spec.upstream_protocol));
                pools.insert(rt.spec.name.clone(), (Instant::now(), now, p.clone()));
                return Ok(Sender::Own(p));
            }
            Some(Err(_)) => return Err(TlsFailure::Config),
            Some(Ok(t)) => t,
        };
        let now = self.made_with(rt);
        let mut pools = self.tls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((loaded, made, made_with, p)) = pools.get(&rt.spec.name)
            && Arc::ptr_eq(loaded, tls)
            && young(*made, rt)
            && same(made_with, &now)
        {
            return Ok(Sender::Tls(p.clone()));
        }
        let connector = TlsConnector { http: self.connector_for(rt), tls: tls.clone() };
        let p = Arc::new(pool(connector, rt.spec.upstream_protocol));
        pools.insert(rt.spec.name.clone(), (tls.clone(), Instant::now(), now, p.clone()));
        Ok(Sender::Tls(p))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A member that counts the connections it accepts and the requests they carry, and
    /// answers each request head with an empty 200.
    async fn counting_member() -> (std::net::SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, requests) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (a, r) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::Relaxed);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        head.extend_from_slice(&buf[..n]);
                        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                            head.drain(..end + 4);
                            r.fetch_add(1, Ordering::Relaxed);
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted, requests)
    }

    // Issue 41 item 5: a request dropped while its connection was being opened (its client
    // reset the HTTP/2 stream) left a member connection that carried nothing; a flood of such
    // resets opened one each. The connection is now kept and carries the next request.
    // One thread: the connect's task runs only once the request was dropped, as when the
    // client's reset comes first (on two threads the connect can finish during the first
    // poll, and hyper-util's handshake then owns it).
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_opened_for_a_dropped_request_carries_the_next_one() {
        let (addr, accepted, requests) = counting_member().await;
        let clients = Clients::<String>::new(Duration::from_secs(5));
        let pool = clients.for_protocol(UpstreamProtocol::Http1);
        let get =
            || http::Request::get(format!("http://{addr}/")).body(String::new()).expect("request");
        // Polled once (the connect starts), then dropped.
        poll_once(pool.request(get())).await;
        for _ in 0..200 {
            if accepted.load(Ordering::Relaxed) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 1, "the dropped request's connection");
        // The connect's task keeps the connection as it completes; give it a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let resp = tokio::time::timeout(Duration::from_secs(10), pool.request(get()))
            .await
            .expect("answered in time")
            .expect("answered");
        assert_eq!(resp.status(), 200);
        assert_eq!(requests.load(Ordering::Relaxed), 1);
        assert_eq!(
            accepted.load(Ordering::Relaxed),
            1,
            "the next request opened another connection instead of taking the kept one"
        );
    }

    /// Polls `f` once, which must not be ready yet, and drops it.
    async fn poll_once<R: std::fmt::Debug>(f: impl Future<Output = R>) {
        let mut f = std::pin::pin!(f);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = f.as_mut().poll(cx) {
                panic!("ready at its first poll: {r:?}");
            }
            Poll::Ready(())
        })
        .await;
    }
}
