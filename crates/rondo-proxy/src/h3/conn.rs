//! One HTTP/3 connection: the QUIC handshake (bounded by the listener's
//! `header_read_timeout_ms`), then each request stream as a task of its own, through
//! [`crate::hyper_path::handle`] and back onto its stream. The connection keeps its slot of
//! the listener's `max_connections` until it and its last request are over. GOAWAY ends it
//! after the drain's idle grace in a draining process, or once past the listener's
//! `max_connection_age_ms` or `max_requests_per_connection`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use bytes::Bytes;
use h3::server::{RequestResolver, RequestStream};
use http::{Response, header};
use http_body_util::BodyExt as _;
use rustls_pki_types::CertificateDer;
use tokio::sync::OwnedSemaphorePermit;

use super::Shared;
use super::body::H3Body;
use crate::body::ProxyBody;
use crate::client_body::ClientBody;
use crate::conn::ConnState;

type Resolver = RequestResolver<h3_quinn::Connection, Bytes>;
type SendHalf = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// What the connection's requests share with it.
struct Conn {
    shared: Arc<Shared>,
    state: Arc<ConnState>,
    peer: SocketAddr,
    /// Request streams open now, against `http3_max_streams`.
    streams: AtomicU32,
    /// The handshake of a 0-RTT connection is not complete yet: a request now may be early
    /// data, replayable.
    early: Arc<AtomicBool>,
    /// The listener slot and the open-connection gauge, released with the last holder.
    _held: (OwnedSemaphorePermit, rondo_runtime::metrics::OpenConn),
}

/// The QUIC handshake, bounded by `header_read_timeout_ms` (with 0-RTT: begun, the connection
/// then serving at once), counted; the connection and whether it may still be in early data.
async fn handshake(
    shared: &Shared,
    connecting: quinn::Connecting,
) -> Option<(quinn::Connection, Arc<AtomicBool>)> {
    let name = &shared.ctx.listener.name;
    let peer = connecting.remote_address();
    // With 0-RTT, the connection serves from its first packet; `early` stays set until the
    // handshake is complete (never, for a replay: the replayer cannot complete it).
    let early = Arc::new(AtomicBool::new(false));
    let timeout = shared.ctx.listener.header_read_timeout;
    let handshake = if shared.spec.zero_rtt {
        // (A server's `into_0rtt` always succeeds; the handshake is then bounded by the idle
        // timeout.)
        match connecting.into_0rtt() {
            Ok((quic, done)) => {
                early.store(true, Ordering::Relaxed);
                let early = early.clone();
                tokio::spawn(async move {
                    done.await;
                    early.store(false, Ordering::Relaxed);
                });
                Ok(Ok(quic))
            }
            Err(connecting) => tokio::time::timeout(timeout, connecting).await,
        }
    } else {
        tokio::time::timeout(timeout, connecting).await
    };
    shared.handshaking.fetch_sub(1, Ordering::Relaxed);
    // Validated, or over: the amplification limit is no longer this address's to count.
    shared.socket.forget(peer);
    match handshake {
        Ok(Ok(quic)) => {
            shared.metrics.handshakes.inc();
            Some((quic, early))
        }
        Ok(Err(e)) => {
            shared.metrics.handshake_failed.inc();
            tracing::debug!(listener = %name, "quic handshake failed: {e}");
            None
        }
        Err(_) => {
            shared.metrics.handshake_failed.inc();
            tracing::debug!(listener = %name, "quic handshake timed out");
            None
        }
    }
}

/// Serves one connection from its handshake to its end.
pub(super) async fn serve(
    shared: Arc<Shared>,
    connecting: quinn::Connecting,
    permit: OwnedSemaphorePermit,
) {
    let ctx = &shared.ctx;
    let Some((quic, early)) = handshake(&shared, connecting).await else { return };
    let timeout = ctx.listener.header_read_timeout;
    let peer = quic.remote_address();
    // As over TCP TLS: `Some` on a TLS listener, with no values when no certificate came.
    let cert = quic
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .and_then(|certs| certs.first().map(|c| crate::tls::client_cert(c)))
        .unwrap_or_default();
    let client_ip = crate::headers::client_ip_value(peer.ip());
    let trusted = ctx.listener.trust_forwarded_for.trusts(peer.ip());
    // The address the client reached (the PROXY header's destination, for clusters that send
    // one): the listener's, with the QUIC connection's own IP when the listener's is a wildcard.
    let listen = ctx.listener.listen;
    let local = quic.local_ip().map_or(listen, |ip| std::net::SocketAddr::new(ip, listen.port()));
    let metrics = ctx.metrics.clone();
    let state =
        ConnState::with_tls(timeout, (client_ip, trusted), metrics, Some(cert), (peer, local));
    let held = (permit, ctx.metrics.opened());
    let conn = Arc::new(Conn {
        shared: shared.clone(),
        state,
        peer,
        streams: AtomicU32::new(0),
        early,
        _held: held,
    });
    let mut builder = h3::server::builder();
    builder.max_field_section_size(u64::from(ctx.listener.max_header_bytes));
    let mut h3 = match builder.build(h3_quinn::Connection::new(quic.clone())).await {
        Ok(h3) => h3,
        Err(e) => {
            tracing::debug!(listener = %ctx.listener.name, %peer, "http3 setup failed: {e}");
            return;
        }
    };
    // One timer for the connection's life: requests arriving do not put the GOAWAY off. The
    // listener's `max_connection_age_ms` and `max_requests_per_connection` end it the same way.
    let limits = ctx.listener.connections;
    let drain = async {
        let age = async {
            match limits.max_age {
                Some(age) => tokio::time::sleep(age).await,
                None => std::future::pending().await,
            }
        };
        let drained = async {
            ctx.drain.started().await;
            tokio::time::sleep(crate::DRAIN_IDLE_GRACE).await;
        };
        tokio::select! { () = age => {}, () = drained => {} }
    };
    tokio::pin!(drain);
    let (mut draining, mut served) = (false, 0u64);
    loop {
        tokio::select! {
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => {
                    tokio::spawn(request(conn.clone(), resolver));
                    served += 1;
                    if !draining && limits.max_requests.is_some_and(|n| served >= n) {
                        // Streams the client opened past this one are refused with
                        // `H3_REQUEST_REJECTED`: it sends them again on a new connection.
                        draining = true;
                        let _ = h3.shutdown(0).await;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    if matches!(quic.close_reason(), Some(quinn::ConnectionError::TimedOut)) {
                        shared.metrics.idle_timeouts.inc();
                        ctx.metrics.idle_timeouts.inc();
                    }
                    tracing::debug!(listener = %ctx.listener.name, %peer, "http3 connection ended: {e}");
                    break;
                }
            },
            () = &mut drain, if !draining => {
                // GOAWAY: requests in progress finish, the client opens no new ones here.
                draining = true;
                let _ = h3.shutdown(0).await;
            }
        }
    }
}

/// One request stream: its head, then hyper's path, then the response onto the stream.
async fn request(conn: Arc<Conn>, resolver: Resolver) {
    let shared = &conn.shared;
    let (req, stream) = match tokio::time::timeout(
        shared.ctx.listener.header_read_timeout,
        resolver.resolve_request(),
    )
    .await
    {
        Ok(Ok(r)) => r,
        // A malformed head: h3 has reset the stream (or closed the connection) already.
        Ok(Err(e)) => {
            tracing::debug!(listener = %shared.ctx.listener.name, "http3 request refused: {e}");
            return;
        }
        Err(_) => return,
    };
    shared.metrics.requests.inc();
    // h3 answered a head over `max_header_bytes` (its field section size) with 431 itself; the
    // count of fields is the listener's `max_headers`, as over TCP.
    let max_headers = shared.ctx.listener.max_headers as usize;
    if req.headers().len() > max_headers {
        let text = format!("rondo: 431 more than {max_headers} header fields (max_headers)\n");
        return answer(
            &shared.ctx,
            stream,
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            text,
        )
        .await;
    }
    // RFC 8470: only a safe method may be served from early data; the client sends any other
    // again once the handshake is complete.
    if conn.early.load(Ordering::Relaxed) && !req.method().is_safe() {
        shared.metrics.too_early.inc();
        let text = "rondo: 425 too early: sent in 0-RTT early data, which may be replayed\n";
        return answer(&shared.ctx, stream, http::StatusCode::TOO_EARLY, text.to_owned()).await;
    }
    let open = conn.streams.fetch_add(1, Ordering::Relaxed) + 1;
    if open >= shared.spec.max_streams {
        shared.metrics.streams_at_limit.inc();
    }
    let (mut send, recv) = stream.split();
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = H3Body::start(recv, length).await;
    let req = req.map(|()| ClientBody::H3(Box::new(body)));
    let Ok(resp) =
        crate::hyper_path::handle(shared.ctx.clone(), conn.state.clone(), conn.peer, req).await;
    write(&mut send, resp).await;
    conn.streams.fetch_sub(1, Ordering::Relaxed);
}

/// The router's own answer `status` with `text` on `stream`, counted as the listener's.
async fn answer(
    ctx: &crate::http::HttpCtx,
    stream: RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    status: http::StatusCode,
    text: String,
) {
    ctx.metrics.router_response(status.as_u16(), None, None);
    let (mut send, _) = stream.split();
    let mut resp = Response::new(ProxyBody::local(Bytes::from(text)));
    *resp.status_mut() = status;
    write(&mut send, resp).await;
}

/// Fields HTTP/3 forbids (RFC 9114 4.2: connection-specific), were any left.
const CONNECTION_SPECIFIC: [header::HeaderName; 4] =
    [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE, header::TE];

/// Sends `resp` on the stream: its head, its body's frames as they come, its trailers. A
/// client that resets the stream ends the sending (the body's end is then reported as for
/// any client that went away).
async fn write(send: &mut SendHalf, resp: Response<ProxyBody>) {
    let (mut parts, body) = resp.into_parts();
    for name in CONNECTION_SPECIFIC {
        parts.headers.remove(name);
    }
    parts.headers.remove("keep-alive");
    parts.headers.remove("proxy-connection");
    if send.send_response(Response::from_parts(parts, ())).await.is_err() {
        return;
    }
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.as_mut().frame().await {
        let sent = match frame.map(|f| f.into_data()) {
            Ok(Ok(data)) if data.is_empty() => Ok(()),
            Ok(Ok(data)) => send.send_data(data).await,
            Ok(Err(frame)) => match frame.into_trailers() {
                Ok(trailers) => send.send_trailers(trailers).await,
                Err(_) => Ok(()),
            },
            Err(_) => {
                // The member's body broke off: the client must not take it for whole.
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = send.finish().await;
}
