//! A member that logs every request it receives (its `x-request-id`, method, path and body) in
//! arrival order, and answers its name: for tests that must say which member got which request,
//! how often and in which order (multicast branches, session replay). It runs on a runtime of
//! its own, so that killing it closes its open connections as a dying process would. It can
//! hold requests (answer only once released, for a slow branch), and answers
//! `x-rondo-checkpoint: 1` to requests carrying `x-test-checkpoint`.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::sync::{Semaphore, watch};

/// One request as the member saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) id: String,
    pub(crate) method: String,
    pub(crate) path: String,
    /// The path with its query, as the request line had it.
    pub(crate) target: String,
    pub(crate) body: Vec<u8>,
    pub(crate) headers: http::HeaderMap,
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Vec<Seen>>,
    /// While set, requests wait for a permit of `gate` before they are answered.
    holding: std::sync::atomic::AtomicBool,
    gate: Semaphore,
    /// Answers 500 to replayed requests (`x-rondo-replay`).
    fail_replays: std::sync::atomic::AtomicBool,
    /// The status of every answer, when not 0 ([`Recorder::answer_with`]).
    status: std::sync::atomic::AtomicU16,
}

/// A recording member.
pub(crate) struct Recorder {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    shared: Arc<Shared>,
    parts: Option<(tokio::runtime::Runtime, watch::Sender<bool>)>,
}

impl Recorder {
    /// Starts member `name` on a free port.
    pub(crate) fn spawn(name: &str) -> Recorder {
        let shared = Arc::new(Shared {
            log: Mutex::default(),
            holding: Default::default(),
            gate: Semaphore::new(0),
            fail_replays: Default::default(),
            status: Default::default(),
        });
        let (n, s) = (Arc::<str>::from(name), shared.clone());
        let (runtime, addr, stop) = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("member runtime");
            let (addr, stop) = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let addr = listener.local_addr().expect("addr");
                let (stop, mut stopped) = watch::channel(false);
                tokio::spawn(async move {
                    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
                    loop {
                        let stream = tokio::select! {
                            r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                            _ = stopped.changed() => return,
                        };
                        let (n, s, builder) = (n.clone(), s.clone(), builder.clone());
                        tokio::spawn(async move {
                            let svc = service_fn(move |req| answer(n.clone(), s.clone(), req));
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        });
                    }
                });
                (addr, stop)
            });
            (runtime, addr, stop)
        })
        .join()
        .expect("member thread");
        Recorder { name: name.to_owned(), addr, shared, parts: Some((runtime, stop)) }
    }

    /// Every request seen so far, in arrival order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.shared.log.lock().unwrap().clone()
    }

    /// The request ids seen so far, in arrival order.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.id).collect()
    }

    /// Waits (5 s at most) until `n` requests were seen: the ids.
    pub(crate) async fn wait_for(&self, n: usize) -> Vec<String> {
        let start = Instant::now();
        loop {
            let ids = self.ids();
            if ids.len() >= n {
                return ids;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{} saw {} of {n} requests: {ids:?}",
                self.name,
                ids.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// From now on, requests wait until [`Recorder::release`] before they are answered.
    pub(crate) fn hold(&self) {
        self.shared.holding.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Lets every held (and future) request be answered.
    pub(crate) fn release(&self) {
        self.shared.holding.store(false, std::sync::atomic::Ordering::SeqCst);
        self.shared.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// From now on, every request is answered with `status`.
    pub(crate) fn answer_with(&self, status: u16) {
        self.shared.status.store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on, replayed requests (`x-rondo-replay`) are answered 500.
    pub(crate) fn fail_replays(&self) {
        self.shared.fail_replays.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stops the member and closes every connection it has.
    pub(crate) async fn kill(&mut self) {
        if let Some((runtime, stop)) = self.parts.take() {
            let _ = stop.send(true);
            tokio::task::spawn_blocking(move || drop(runtime)).await.expect("runtime dropped");
        }
    }

    /// `{ name = ..., address = ... }` for a cluster's members.
    pub(crate) fn entry(&self) -> String {
        format!("{{ name = \"{}\", address = \"{}\" }}", self.name, self.addr)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some((runtime, stop)) = self.parts.take() {
            let _ = stop.send(true);
            runtime.shutdown_background();
        }
    }
}

async fn answer(
    name: Arc<str>,
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
    let id =
        parts.headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let checkpoint = parts.headers.contains_key("x-test-checkpoint");
    let refuse = parts.headers.contains_key("x-rondo-replay")
        && shared.fail_replays.load(std::sync::atomic::Ordering::SeqCst);
    shared.log.lock().unwrap().push(Seen {
        id: id.clone(),
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        target: parts.uri.path_and_query().map_or("/".to_owned(), |pq| pq.to_string()),
        body,
        headers: parts.headers,
    });
    if shared.holding.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = shared.gate.acquire().await;
    }
    let mut resp = Response::new(Full::new(Bytes::from(format!("{name} {id}\n"))));
    if let Ok(v) = http::HeaderValue::from_str(&name) {
        resp.headers_mut().insert("x-member", v);
    }
    if checkpoint {
        resp.headers_mut().insert("x-rondo-checkpoint", http::HeaderValue::from_static("1"));
    }
    if refuse {
        *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    }
    let status = shared.status.load(std::sync::atomic::Ordering::SeqCst);
    if let Ok(s) = http::StatusCode::from_u16(status) {
        *resp.status_mut() = s;
    }
    Ok(resp)
}
