//! Health checks over HTTP/2 (the probe's part for `upstream_protocol = "http2"` clusters and
//! gRPC): an HTTP GET sent as h2c, or h2 over the cluster's TLS, and gRPC's health-checking
//! protocol, `grpc.health.v1.Health/Check` (gRPC's `doc/health-checking.md`), whose tiny
//! protobuf messages are written and read here by hand: the request's field 1 is the service
//! (a string), the response's field 1 its status (an enum, `SERVING` = 1, `NOT_SERVING` = 2).

use bytes::{Buf, Bytes};
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rondo_core::ProbeFailure;
use rondo_core::grpc::{Code, parse_status};
use tokio::io::{AsyncRead, AsyncWrite};

/// The most bytes of a health answer read (the real one is 7 bytes).
const MAX_ANSWER: usize = 16 * 1024;

/// `SERVING` in `grpc.health.v1.HealthCheckResponse.ServingStatus`.
const SERVING: u64 = 1;

/// An HTTP GET of `path` over HTTP/2 on `io` (connected to `address`; `tls`: h2 over TLS,
/// else h2c with prior knowledge); its status must fall in `expect`.
pub(crate) async fn http<S>(
    io: S,
    address: &str,
    tls: bool,
    path: &str,
    expect: (u16, u16),
) -> Result<(), ProbeFailure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let req = Request::get(uri(address, tls, path)?)
        .header(header::USER_AGENT, "rondo-probe")
        .body(Full::new(Bytes::new()))
        .map_err(|_| ProbeFailure::NotHttp)?;
    let resp = send(io, req).await?;
    let status = resp.status().as_u16();
    if (expect.0..=expect.1).contains(&status) { Ok(()) } else { Err(ProbeFailure::Status(status)) }
}

/// `grpc.health.v1.Health/Check` for `service` over HTTP/2 on `io`: only an OK call answered
/// `SERVING` passes.
pub(crate) async fn grpc<S>(
    io: S,
    address: &str,
    tls: bool,
    service: &str,
) -> Result<(), ProbeFailure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let req = Request::post(uri(address, tls, "/grpc.health.v1.Health/Check")?)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .header(header::USER_AGENT, "rondo-probe")
        .body(Full::new(check_request(service)))
        .map_err(|_| ProbeFailure::NotHttp)?;
    let resp = send(io, req).await?;
    if resp.status() != StatusCode::OK {
        return Err(ProbeFailure::Status(resp.status().as_u16()));
    }
    // A trailers-only answer carries its status in the head.
    if let Some(code) = grpc_status(resp.headers()) {
        return Err(if code == Code::OK {
            ProbeFailure::NotServing
        } else {
            ProbeFailure::Grpc(code)
        });
    }
    let collected = Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|_| ProbeFailure::Reset)?;
    match collected.trailers().and_then(grpc_status) {
        Some(Code::OK) => {}
        Some(code) => return Err(ProbeFailure::Grpc(code)),
        // gRPC requires a status: a call ended without one is broken.
        None => return Err(ProbeFailure::Grpc(Code::INTERNAL)),
    }
    match serving_status(&collected.to_bytes()) {
        Some(SERVING) => Ok(()),
        Some(_) => Err(ProbeFailure::NotServing),
        None => Err(ProbeFailure::NotHttp),
    }
}

fn uri(address: &str, tls: bool, path: &str) -> Result<http::Uri, ProbeFailure> {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{address}{path}").parse().map_err(|_| ProbeFailure::NotHttp)
}

/// Sends `req` on a new HTTP/2 connection over `io`, which closes when the answer's head and
/// body are dropped.
async fn send<S>(
    io: S,
    req: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, ProbeFailure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .map_err(|e| failure(&e))?;
    // The connection task ends with the probe (its sender dropped) or with the check's timeout,
    // which drops this future and with it the sender.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| failure(&e))
}

fn failure(e: &hyper::Error) -> ProbeFailure {
    if e.is_parse() || e.to_string().contains("protocol") {
        ProbeFailure::NotHttp
    } else {
        ProbeFailure::Reset
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    headers.get("grpc-status").map(|v| parse_status(v.as_bytes()).unwrap_or(Code::UNKNOWN))
}

/// The length-prefixed `HealthCheckRequest { service }` (field 1, a string; an empty service
/// is the empty message).
fn check_request(service: &str) -> Bytes {
    let mut message = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0); // not compressed
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn get_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.first()?;
        buf.advance(1);
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// The status of a length-prefixed `HealthCheckResponse`: field 1's value (0, `UNKNOWN`, when
/// absent, as protobuf's default); `None` for a malformed or compressed message.
fn serving_status(body: &[u8]) -> Option<u64> {
    let (&[0, a, b, c, d], rest) = body.split_first_chunk::<5>()? else {
        return None;
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    let mut message = rest.get(..len)?;
    let mut status = 0;
    while !message.is_empty() {
        let key = get_varint(&mut message)?;
        match key & 7 {
            0 => {
                let v = get_varint(&mut message)?;
                if key >> 3 == 1 {
                    status = v;
                }
            }
            1 => message = message.get(8..)?,
            2 => {
                let n = usize::try_from(get_varint(&mut message)?).ok()?;
                message = message.get(n..)?;
            }
            5 => message = message.get(4..)?,
            _ => return None,
        }
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_request_is_the_protobuf_grpc_writes() {
        // grpcio's HealthCheckRequest(service="my.Service").SerializeToString(), framed.
        let framed = check_request("my.Service");
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 12]);
        assert_eq!(&framed[5..], b"\x0a\x0amy.Service");
        assert_eq!(&check_request("")[..], &[0, 0, 0, 0, 0]);
    }

    #[test]
    fn serving_statuses_are_read_and_malformed_answers_refused() {
        assert_eq!(serving_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(SERVING));
        assert_eq!(serving_status(&[0, 0, 0, 0, 2, 0x08, 2]), Some(2));
        // The empty message: the default, UNKNOWN.
        assert_eq!(serving_status(&[0, 0, 0, 0, 0]), Some(0));
        // An unknown field before the status is skipped.
        assert_eq!(serving_status(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 1]), Some(SERVING));
        assert_eq!(serving_status(&[1, 0, 0, 0, 2, 0x08, 1]), None, "compressed");
        assert_eq!(serving_status(&[0, 0, 0, 0, 9, 0x08, 1]), None, "short");
        assert_eq!(serving_status(&[0, 0, 0]), None);
        assert_eq!(serving_status(&[0, 0, 0, 0, 1, 0x08]), None, "cut varint");
    }
}
