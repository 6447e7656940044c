//! A demo member, like CLB's GetName component: an HTTP/1.1 + HTTP/2 server that answers every
//! request with its own name, optionally after a delay. `rondo demo` runs a few inside its
//! process; `rondo member` runs one as its own process (the integration tests start real member
//! processes this way).
//!
//! Paths: `/health` answers 200 `ok`; `/headers` answers the request's headers, one
//! `name: value` per line; `/status/N` answers status N; `/slow/MS` waits MS milliseconds
//! first; `/echo` streams the request body back; `/collect` reads the whole body, then answers
//! `NAME got N bytes`; `/login/USER` answers `NAME` with `x-rondo-login: USER` (a login
//! service that vouches for anyone, for trying a login route: docs/identity.md); anything else
//! answers `NAME\n`. Every answer carries `x-member: NAME`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A running member.
#[derive(Debug)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Requests it has answered.
    pub served: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
}

impl Member {
    /// Stops accepting (open connections finish).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a member called `name` on `addr` (port 0 picks one) that waits `delay` before every
/// answer.
pub async fn spawn(name: &str, addr: SocketAddr, delay: Duration) -> std::io::Result<Member> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (stop, mut stopped) = watch::channel(false);
    let served = Arc::new(AtomicU64::new(0));
    let (n, s) = (Arc::<str>::from(name), served.clone());
    tokio::spawn(async move {
        let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                _ = stopped.changed() => return,
            };
            let _ = stream.set_nodelay(true);
            let (n, s, builder) = (n.clone(), s.clone(), builder.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(n.clone(), s.clone(), delay, req));
                let _ = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc).await;
            });
        }
    });
    Ok(Member { name: name.to_owned(), addr, served, stop })
}

type Body = BoxBody<Bytes, hyper::Error>;

fn full(s: impl Into<Bytes>) -> Body {
    Full::new(s.into()).map_err(|never| match never {}).boxed()
}

async fn answer(
    name: Arc<str>,
    served: Arc<AtomicU64>,
    delay: Duration,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    served.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_owned();
    let mut status = StatusCode::OK;
    let vouch = path.strip_prefix("/login/").map(str::to_owned);
    let body = if path == "/health" {
        full("ok\n")
    } else if path == "/headers" {
        let mut text = String::new();
        for (k, v) in req.headers() {
            text.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
        }
        full(text)
    } else if let Some(code) = path.strip_prefix("/status/") {
        status = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        full(format!("{name}\n"))
    } else if let Some(ms) = path.strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
        full(format!("{name}\n"))
    } else if path == "/echo" {
        req.into_body().boxed()
    } else if path == "/collect" {
        // Reads the whole request body before answering, as most applications do.
        match req.into_body().collect().await {
            Ok(b) => full(format!("{name} got {} bytes\n", b.to_bytes().len())),
            Err(_) => {
                status = StatusCode::BAD_REQUEST;
                full("request body failed\n")
            }
        }
    } else {
        full(format!("{name}\n"))
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(&name) {
        resp.headers_mut().insert("x-member", v);
    }
    if let Some(v) = vouch.and_then(|u| http::HeaderValue::from_str(&u).ok()) {
        resp.headers_mut().insert("x-rondo-login", v);
    }
    Ok(resp)
}
