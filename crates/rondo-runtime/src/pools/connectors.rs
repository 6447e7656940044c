//! The connectors of the member pools: the plain one, which keeps a connection opened for a
//! request that was dropped before it was ready for the next request to that member
//! ([`KeepConnector`]), and the TLS one ([`TlsConnector`]), each bounded by the cluster's gate
//! and timing what it opens ([`super::connect_time`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rondo_core::TlsFailure;
use tokio::net::TcpStream;

use super::connect_time::ConnectTime;
use super::gate::{AtCapacity, Gate, Permit};
use crate::tls::upstream::UpstreamTlsRt;

/// The plain connector: no delay, `connect_timeout`, `http` URIs only.
pub(super) fn http_connector(connect_timeout: Duration) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.enforce_http(true);
    connector
}

/// Connections opened for requests that were dropped before they got them, kept per member
/// address at most this many ([`KeepConnector`]).
const MAX_SPARE: usize = 32;

/// How long such a connection is kept for the next request to its member.
const SPARE_TTL: Duration = Duration::from_secs(2);

/// Per member authority: connections opened for requests that no longer wanted them, newest
/// last, with when they were kept.
type Spares = HashMap<String, Vec<(Instant, TcpStream)>>;

/// hyper-util's plain connector, with the connect in a task of its own: when the request that
/// started it is dropped first (its client reset the HTTP/2 stream), the connection is still
/// made and kept (at most `MAX_SPARE` per member, for `SPARE_TTL`) for the next request to
/// that member, which takes it instead of connecting. Without it, a client that resets its
/// streams as fast as the router connects for them opens member connections that carry nothing.
#[derive(Debug, Clone)]
pub struct KeepConnector {
    pub(super) http: HttpConnector,
    pub(super) spare: Arc<Mutex<Spares>>,
    /// The PROXY protocol header written first on each new connection (a pool of one client's,
    /// `Clients::for_client`): such a connection is never kept as a spare for others.
    pub(super) header: Option<Arc<[u8]>>,
    /// The cluster's `max_connections`: each new connection holds a place there, or is refused
    /// at once with [`AtCapacity`] (nor is it kept as a spare: its place would go with it).
    pub(super) gate: Option<Arc<Gate>>,
}

impl KeepConnector {
    /// A kept connection to `key` that is still open, if any.
    fn take(&self, key: &str) -> Option<TcpStream> {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let list = spare.get_mut(key)?;
        let mut found = None;
        while let Some((kept, s)) = list.pop() {
            // Nothing may have come yet on a connection no request was sent on: a read that
            // would block says it is open, anything else (the member closed it) that it is not.
            let mut byte = [0u8; 1];
            let read = s.try_read(&mut byte);
            let open = matches!(read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            if open && kept.elapsed() < SPARE_TTL {
                found = Some(s);
                break;
            }
        }
        if list.is_empty() {
            spare.remove(key);
        }
        found
    }

    /// Keeps `s`, opened to `key` for a request that was dropped, until [`SPARE_TTL`] has
    /// passed or a request takes it.
    fn keep(spare: &Arc<Mutex<Spares>>, key: String, s: TcpStream) {
        let mut table = spare.lock().unwrap_or_else(|e| e.into_inner());
        let list = table.entry(key).or_default();
        if list.len() >= MAX_SPARE {
            return;
        }
        list.push((Instant::now(), s));
        drop(table);
        // Closed when its time is up even if no request to any member comes again (one task
        // per kept connection: at most MAX_SPARE per member, each for SPARE_TTL).
        let spare = Arc::downgrade(spare);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            tokio::time::sleep(SPARE_TTL).await;
            if let Some(spare) = spare.upgrade() {
                let mut table = spare.lock().unwrap_or_else(|e| e.into_inner());
                table.retain(|_, list| {
                    list.retain(|(kept, _)| kept.elapsed() < SPARE_TTL);
                    !list.is_empty()
                });
            }
        });
    }
}

impl tower_service::Service<Uri> for KeepConnector {
    type Response = MemberIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<MemberIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if self.header.is_some() || self.gate.is_some() {
            let permit = match self.gate.as_ref().map(Gate::try_open).transpose() {
                Ok(permit) => permit,
                Err(full) => return Box::pin(std::future::ready(Err(full.into()))),
            };
            let (mut http, header) = (self.http.clone(), self.header.clone());
            return Box::pin(async move {
                use tokio::io::AsyncWriteExt;
                let opening = Instant::now();
                let mut s = http.call(uri).await?.into_inner();
                if let Some(header) = header {
                    s.write_all(&header).await?;
                }
                let took = Some(ConnectTime::new(opening.elapsed()));
                Ok(MemberIo { io: TokioIo::new(s), _permit: permit, took })
            });
        }
        let key = uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
        if let Some(s) = self.take(&key) {
            return Box::pin(std::future::ready(Ok(MemberIo::plain(s))));
        }
        let mut http = self.http.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spare = self.spare.clone();
        let mut waiting = Waiting { rx, spare: spare.clone(), key: key.clone() };
        let opening = Instant::now();
        // Bounded by the connector's connect timeout.
        tokio::spawn(async move {
            if let Err(Ok(io)) = tx.send(http.call(uri).await) {
                KeepConnector::keep(&spare, key, io.into_inner());
            }
        });
        Box::pin(async move {
            match (&mut waiting.rx).await {
                Ok(r) => r
                    .map(|io| {
                        let took = Some(ConnectTime::new(opening.elapsed()));
                        MemberIo { io, _permit: None, took }
                    })
                    .map_err(Into::into),
                Err(_) => Err("the connect task ended without an answer".into()),
            }
        })
    }
}

/// What a connect's task answers.
type ConnectAnswer =
    Result<TokioIo<TcpStream>, <HttpConnector as tower_service::Service<Uri>>::Error>;

/// The waiting side of a [`KeepConnector`] connect: dropped after its task sent the connection
/// but before it was taken, it keeps the connection too.
struct Waiting {
    rx: tokio::sync::oneshot::Receiver<ConnectAnswer>,
    spare: Arc<Mutex<Spares>>,
    key: String,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(Ok(io)) = self.rx.try_recv() {
            KeepConnector::keep(&self.spare, std::mem::take(&mut self.key), io.into_inner());
        }
    }
}

/// Why a try failed in TLS, when it did: the connector's error, or a rustls alert, in `e`'s
/// chain.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    crate::tls::upstream::failure_in(e)
}

/// hyper-util's connector for TLS members: TCP through the plain connector, then the handshake
/// for the member's host (or the cluster's `server_name`).
#[derive(Debug, Clone)]
pub struct TlsConnector {
    pub(super) http: KeepConnector,
    pub(super) tls: Arc<UpstreamTlsRt>,
}

/// The error type of hyper-util's connectors and bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
            let opening = Instant::now();
            let MemberIo { io, _permit: permit, .. } = http.call(uri).await?;
            match tls.connect(io.into_inner(), &host).await {
                // TCP (a spare one too: its handshake is still this request's wait) and TLS.
                Ok(s) => Ok(TlsConn(TokioIo::new(s), permit, ConnectTime::new(opening.elapsed()))),
                Err(e) => {
                    tracing::debug!("tls to member {host} failed: {e}");
                    Err(Box::new(e) as BoxError)
                }
            }
        })
    }
}

/// A TLS connection to a member, as hyper-util's pool holds it (with its place under the
/// cluster's `max_connections`).
#[derive(Debug)]
pub struct TlsConn(
    TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    // Held, never read: the place is given back when the connection goes.
    #[allow(dead_code)] Option<Permit>,
    ConnectTime,
);

/// A plain connection to a member, as hyper-util's pool holds it (with its place under the
/// cluster's `max_connections`).
#[derive(Debug)]
pub struct MemberIo {
    io: TokioIo<TcpStream>,
    _permit: Option<Permit>,
    /// How long the connection took to open; `None` for a spare one a dropped request opened.
    took: Option<ConnectTime>,
}

impl MemberIo {
    fn plain(s: TcpStream) -> Self {
        MemberIo { io: TokioIo::new(s), _permit: None, took: None }
    }
}

impl hyper::rt::Read for MemberIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for MemberIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

impl Connection for MemberIo {
    fn connected(&self) -> Connected {
        let c = self.io.connected();
        match &self.took {
            Some(took) => c.extra(*took),
            None => c,
        }
    }
}

/// Whether `e`'s chain says a new connection was refused by the cluster's `max_connections`.
pub fn at_capacity(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<AtCapacity>() {
            return true;
        }
        cur = err.source();
    }
    false
}

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
        let c = tcp.connected().extra(self.2);
        if session.alpn_protocol() == Some(b"h2") { c.negotiated_h2() } else { c }
    }
}
