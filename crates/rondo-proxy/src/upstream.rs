//! Connections to members: one keep-alive pool per member address (hyper-util's pooled client,
//! keyed by authority), HTTP/1.1 or HTTP/2 prior knowledge per cluster. A cluster with
//! `upstream_tls` has pools of its own whose connector does the TLS handshake after the TCP
//! connect ([`TlsConnector`]: members verified against the cluster's `ca`, the router's
//! certificate presented when set), so TLS connections are pooled like plain ones; its pools are
//! made again when a new view brings the files read again.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rondo_core::{TlsFailure, UpstreamProtocol};
use rondo_runtime::ClusterRt;
use rondo_runtime::upstream_tls::UpstreamTlsRt;
use tokio::net::TcpStream;

use crate::body::UpstreamBody;

/// A pooled client.
pub type Pool = Client<HttpConnector, UpstreamBody>;
/// A pooled client speaking TLS to members.
pub type TlsPool = Client<TlsConnector, UpstreamBody>;

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(90);

/// The pools of one router.
#[derive(Debug, Clone)]
pub struct Clients {
    h1: Pool,
    h2: Pool,
    connector: HttpConnector,
    /// Per cluster with `upstream_tls`: the loaded settings its pool was made with, when, and
    /// the pool.
    tls: Arc<Mutex<TlsPools>>,
    /// Per plain cluster with `max_connection_age_ms`: when its own pool was made, and the pool.
    aged: Arc<Mutex<AgedPools>>,
}

/// Per cluster name: when its own pool was made, and the pool.
type AgedPools = HashMap<String, (Instant, Arc<Pool>)>;

/// Per cluster name: the loaded `upstream_tls` a pool was made with, when, and the pool.
type TlsPools = HashMap<String, (Arc<UpstreamTlsRt>, Instant, Arc<TlsPool>)>;

/// Whether a pool made at `made` is still young under the cluster's `max_connection_age_ms`
/// (hyper's pools count no age per connection: a cluster with the limit gets a pool of its own,
/// made anew once it is that old; the old pool's connections close as their requests end).
fn young(made: Instant, rt: &ClusterRt) -> bool {
    rt.spec.policy.connections.max_age.is_none_or(|age| made.elapsed() < age)
}

/// Where a try is sent.
#[derive(Debug)]
pub enum Sender<'a> {
    /// A plain pool.
    Plain(&'a Pool),
    /// A cluster's TLS pool.
    Tls(Arc<TlsPool>),
    /// A plain pool of a cluster's own (one with `max_connection_age_ms`).
    Own(Arc<Pool>),
}

impl Sender<'_> {
    /// Sends `req` through the pool.
    pub fn request(&self, req: http::Request<UpstreamBody>) -> ResponseFuture {
        match self {
            Sender::Plain(p) => p.request(req),
            Sender::Tls(p) => p.request(req),
            Sender::Own(p) => p.request(req),
        }
    }
}

fn pool<C>(connector: C, protocol: UpstreamProtocol) -> Client<C, UpstreamBody>
where
    C: hyper_util::client::legacy::connect::Connect + Clone,
{
    let mut b = Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(POOL_IDLE).pool_timer(TokioTimer::new());
    if protocol == UpstreamProtocol::Http2 {
        b.http2_only(true).timer(TokioTimer::new());
    }
    b.build(connector)
}

impl Clients {
    /// Pools with `connect_timeout` for new connections.
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        connector.enforce_http(true);
        let h1 = pool(connector.clone(), UpstreamProtocol::Http1);
        let h2 = pool(connector.clone(), UpstreamProtocol::Http2);
        Clients { h1, h2, connector, tls: Arc::default(), aged: Arc::default() }
    }

    /// The pool for a cluster's protocol.
    pub fn for_protocol(&self, p: UpstreamProtocol) -> &Pool {
        match p {
            UpstreamProtocol::Http2 => &self.h2,
            UpstreamProtocol::Http1 | UpstreamProtocol::Tcp => &self.h1,
        }
    }

    /// Where a try to a member of `rt` goes: its TLS pool when it has `upstream_tls` (an error
    /// when its files could not be loaded), else the plain pool of its protocol.
    pub fn for_cluster<'a>(&'a self, rt: &ClusterRt) -> Result<Sender<'a>, TlsFailure> {
        let tls = match &rt.tls {
            None if rt.spec.policy.connections.max_age.is_none() => {
                return Ok(Sender::Plain(self.for_protocol(rt.spec.upstream_protocol)));
            }
            None => {
                let mut pools = self.aged.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((made, p)) = pools.get(&rt.spec.name)
                    && young(*made, rt)
                {
                    return Ok(Sender::Own(p.clone()));
                }
                let p = Arc::new(pool(self.connector.clone(), rt.spec.upstream_protocol));
                pools.insert(rt.spec.name.clone(), (Instant::now(), p.clone()));
                return Ok(Sender::Own(p));
            }
            Some(Err(_)) => return Err(TlsFailure::Config),
            Some(Ok(t)) => t,
        };
        let mut pools = self.tls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((loaded, made, p)) = pools.get(&rt.spec.name)
            && Arc::ptr_eq(loaded, tls)
            && young(*made, rt)
        {
            return Ok(Sender::Tls(p.clone()));
        }
        let connector = TlsConnector { http: self.connector.clone(), tls: tls.clone() };
        let p = Arc::new(pool(connector, rt.spec.upstream_protocol));
        pools.insert(rt.spec.name.clone(), (tls.clone(), Instant::now(), p.clone()));
        Ok(Sender::Tls(p))
    }
}

/// Why a try failed in TLS, when it did: the connector's error, or a rustls alert, in `e`'s
/// chain.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    rondo_runtime::upstream_tls::failure_in(e)
}

/// hyper-util's connector for TLS members: TCP through the plain connector, then the handshake
/// for the member's host (or the cluster's `server_name`).
#[derive(Debug, Clone)]
pub struct TlsConnector {
    http: HttpConnector,
    tls: Arc<UpstreamTlsRt>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TlsConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().to_owned();
            let tcp = http.call(uri).await?.into_inner();
            match tls.connect(tcp, &host).await {
                Ok(s) => Ok(TlsConn(TokioIo::new(s))),
                Err(e) => {
                    tracing::debug!("tls to member {host} failed: {e}");
                    Err(Box::new(e) as BoxError)
                }
            }
        })
    }
}

/// A TLS connection to a member, as hyper-util's pool holds it.
#[derive(Debug)]
pub struct TlsConn(TokioIo<tokio_rustls::client::TlsStream<TcpStream>>);

impl hyper::rt::Read for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
}

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        let (tcp, session) = self.0.inner().get_ref();
        let c = tcp.connected();
        if session.alpn_protocol() == Some(b"h2") { c.negotiated_h2() } else { c }
    }
}
