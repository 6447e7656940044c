//! The tower layer without a network: an offline client and inner services from closures.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use rondo_core::wire::{Answer, Member, Source, VIEW_ID_HEADER};
use rondo_core::{AdminState, Policy};
use tower::{Layer, Service};

use super::{BalancedError, BoxError, SlotBody};
use crate::Client;

fn offline(names: &[&str]) -> Client {
    offline_with(Policy::default(), names)
}

fn offline_with(policy: Policy, names: &[&str]) -> Client {
    let members = names
        .iter()
        .zip(1u16..)
        .map(|(n, p)| Member {
            name: (*n).into(),
            address: format!("127.0.0.1:{p}"),
            weight: 100,
            group: None,
            state: AdminState::Active,
            source: Source::Config,
        })
        .collect();
    let answer = Answer { service: "web".into(), view_id: 3, policy, members };
    Client::builder("web").seed(7).offline(answer)
}

/// An inner service from a closure.
#[derive(Clone)]
struct Fake<F>(F);

impl<F, Fut> Service<Request<SlotBody<Full<Bytes>>>> for Fake<F>
where
    F: FnMut(Request<SlotBody<Full<Bytes>>>) -> Fut,
    Fut: Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send + 'static,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
        Box::pin((self.0)(req))
    }
}

fn refused() -> BoxError {
    Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
}

fn reset() -> BoxError {
    Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
}

fn post(body: &'static str) -> Request<Full<Bytes>> {
    Request::post("http://web/orders?x=1").body(Full::new(Bytes::from(body))).unwrap()
}

#[tokio::test]
async fn the_authority_is_the_members_and_an_unread_body_goes_to_the_next_member() {
    let client = offline(&["a", "b"]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let inner = Fake(move |req: Request<SlotBody<Full<Bytes>>>| {
        let log = log.clone();
        async move {
            let first = {
                let mut log = log.lock().unwrap();
                log.push(req.uri().to_string());
                log.len() == 1
            };
            if first {
                // Failed to connect: the body was never read.
                return Err(refused());
            }
            let body = req.into_body().collect().await.map_err(|e| match e {})?.to_bytes();
            Ok(Response::builder().header(VIEW_ID_HEADER, "9").body(Full::new(body)).unwrap())
        }
    });
    let mut svc = client.layer().layer(inner);
    let resp = svc.call(post("order 1")).await.expect("second member answers");
    assert!(resp.body().member().is_some(), "open until the body ends");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "order 1", "the same body reached the second member");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0], seen[1]);
    for uri in &seen {
        assert!(
            uri == "http://127.0.0.1:1/orders?x=1" || uri == "http://127.0.0.1:2/orders?x=1",
            "{uri}"
        );
    }
    assert_eq!(client.inner.wanted.load(Ordering::Relaxed), 9, "newer view id observed");
    let st = client.inner.lock();
    assert!(st.balancer.states().iter().all(|s| s.load.in_flight == 0), "body done");
}

#[tokio::test]
async fn a_post_whose_body_was_read_is_not_sent_again_after_a_reset() {
    let client = offline(&["a", "b"]);
    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let inner = Fake(move |req: Request<SlotBody<Full<Bytes>>>| {
        n.fetch_add(1, Ordering::Relaxed);
        async move {
            let _ = req.into_body().collect().await;
            Err::<Response<Full<Bytes>>, _>(reset())
        }
    });
    let mut svc = client.layer().layer(inner.clone());
    let err = svc.call(post("order 2")).await.expect_err("reset");
    let err = err.downcast::<BalancedError>().expect("a call error");
    assert!(err.is_not_retryable(), "{err}");
    assert_eq!(err.attempts().len(), 1);
    assert_eq!(calls.swap(0, Ordering::Relaxed), 1);

    // A GET after a reset goes elsewhere (3 attempts; 2 members).
    let get = Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
    let err = svc.call(get).await.expect_err("every member resets");
    let err = err.downcast::<BalancedError>().expect("a call error");
    assert!(err.is_all_failed(), "{err}");
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    assert!(err.to_string().contains("connection reset"), "{err}");
}

#[tokio::test]
async fn a_5xx_goes_back_to_the_caller_and_counts_against_the_member() {
    let client = offline(&["a"]);
    let inner = Fake(|_req: Request<SlotBody<Full<Bytes>>>| async {
        Ok(Response::builder().status(503).body(Full::new(Bytes::from("busy"))).unwrap())
    });
    let mut svc = client.layer().layer(inner);
    let get = Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
    let resp = svc.call(get).await.expect("a response");
    assert_eq!(resp.status(), 503);
    drop(resp);
    let st = client.inner.lock();
    assert_eq!(st.balancer.states()[0].load.consecutive_failures, 1);
    assert_eq!(st.balancer.states()[0].load.in_flight, 0);
}

#[tokio::test]
async fn a_grpc_failure_status_counts_against_the_member_and_an_answer_does_not() {
    let client = offline(&["a"]);
    let answer = |status: &'static str| {
        Fake(move |_req: Request<SlotBody<Full<Bytes>>>| async move {
            Ok(Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", status)
                .body(Full::new(Bytes::new()))
                .unwrap())
        })
    };
    let call = |inner| {
        let mut svc = client.layer().layer(inner);
        let req = Request::post("http://web/pkg.Svc/M").body(Full::new(Bytes::new())).unwrap();
        async move { drop(svc.call(req).await.expect("a response")) }
    };
    // 5, NOT_FOUND: the application's answer.
    call(answer("5")).await;
    assert_eq!(client.inner.lock().balancer.states()[0].load.consecutive_failures, 0);
    // 14, UNAVAILABLE: the member's failure, as a 5xx is.
    call(answer("14")).await;
    assert_eq!(client.inner.lock().balancer.states()[0].load.consecutive_failures, 1);
}

/// An inner service that is not ready on its first poll (and wakes its caller), then is.
#[derive(Clone)]
struct Slow {
    polls: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Service<Request<SlotBody<Full<Bytes>>>> for Slow {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.polls.fetch_add(1, Ordering::Relaxed) == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let body = req.into_body().collect().await.map_err(|e| match e {})?.to_bytes();
            Ok(Response::new(Full::new(body)))
        })
    }
}

#[tokio::test]
async fn a_try_waits_for_an_inner_service_that_is_not_ready() {
    let client = offline(&["a", "b"]);
    let slow = Slow { polls: Arc::default(), calls: Arc::default() };
    let mut svc = client.layer().layer(slow.clone());
    let resp = svc.call(post("order 3")).await.expect("answered once ready");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "order 3");
    assert_eq!(slow.calls.load(Ordering::Relaxed), 1, "one try, after readiness");
    assert!(slow.polls.load(Ordering::Relaxed) >= 2);
    let st = client.inner.lock();
    assert!(st.balancer.states().iter().all(|s| s.load.in_flight == 0), "body done");
}

/// An inner service like tower's `ConcurrencyLimit`: readiness acquires a permit of a shared
/// semaphore (queued in order), a call holds it until its response is released by the test;
/// a clone starts with nothing acquired.
struct Limited {
    sem: Arc<tokio::sync::Semaphore>,
    acquiring: Option<Pin<Box<dyn Future<Output = tokio::sync::OwnedSemaphorePermit> + Send>>>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    release: tokio::sync::watch::Receiver<bool>,
}

impl Clone for Limited {
    fn clone(&self) -> Self {
        Limited {
            sem: self.sem.clone(),
            acquiring: None,
            permit: None,
            release: self.release.clone(),
        }
    }
}

impl Service<Request<SlotBody<Full<Bytes>>>> for Limited {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.permit.is_none() {
            let sem = self.sem.clone();
            let acquiring = self.acquiring.get_or_insert_with(|| {
                Box::pin(async move { sem.acquire_owned().await.expect("open semaphore") })
            });
            self.permit = Some(std::task::ready!(acquiring.as_mut().poll(cx)));
            self.acquiring = None;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
        let permit = self.permit.take().expect("called when ready");
        let mut release = self.release.clone();
        Box::pin(async move {
            let _ = release.wait_for(|r| *r).await;
            drop(permit);
            Ok(Response::new(Full::new(Bytes::from("done"))))
        })
    }
}

// Regression: a try whose inner service was not ready went with a fresh clone and left
// the polled service, first in the semaphore's queue, behind: the permit went to it and the
// try waited until its deadline.
#[tokio::test]
async fn a_try_waiting_for_readiness_keeps_its_place_in_the_queue() {
    let client = offline(&["a"]);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let sem = Arc::new(tokio::sync::Semaphore::new(1));
    let limited = Limited { sem, acquiring: None, permit: None, release: rx };
    let mut svc = client.layer().layer(limited);
    let get = || Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
    // A takes the only permit and holds it until released.
    let first = tokio::spawn(svc.call(get()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // B queues for the permit.
    let second = tokio::spawn(svc.call(get()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    tx.send(true).expect("a receiver");
    let a = tokio::time::timeout(Duration::from_secs(2), first).await.expect("A answers");
    assert_eq!(a.unwrap().expect("A").status(), 200);
    let b = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("B gets the permit A released");
    assert_eq!(b.unwrap().expect("B").status(), 200);
}

// Regression: a streamed response ended the member's request in the core at the time of its
// head, so the member's EWMA went back in time when a long body ended.
#[tokio::test(start_paused = true)]
async fn a_response_ends_in_the_core_when_its_body_ends() {
    let client = offline(&["a"]);
    let inner = Fake(|_req: Request<SlotBody<Full<Bytes>>>| async {
        Ok(Response::new(Full::new(Bytes::from("streamed"))))
    });
    let mut svc = client.layer().layer(inner);
    let get = Request::get("http://web/").body(Full::new(Bytes::new())).unwrap();
    let resp = svc.call(get).await.expect("a response");
    let head = crate::clock::now();
    tokio::time::advance(Duration::from_secs(5)).await;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "streamed");
    let st = client.inner.lock();
    let (_, stamp) = st.balancer.states()[0].load.ewma.last();
    assert!(
        stamp.since(head) >= Duration::from_secs(5),
        "ended {:?} after the head",
        stamp.since(head)
    );
    assert_eq!(st.balancer.states()[0].load.in_flight, 0);
}

/// An inner service that is never ready (a concurrency limit that stays saturated).
#[derive(Clone)]
struct NeverReady;

impl Service<Request<SlotBody<Full<Bytes>>>> for NeverReady {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Pending
    }

    fn call(&mut self, _req: Request<SlotBody<Full<Bytes>>>) -> Self::Future {
        unreachable!("never ready, never called")
    }
}

// Regression: a try whose time ran out while the inner service was still not ready (so the
// member never saw the request) was charged to the member as a timeout, so a saturated local
// limit could eject healthy members.
#[tokio::test(start_paused = true)]
async fn a_try_that_never_left_is_not_charged_to_its_member() {
    let mut policy = Policy::default();
    policy.retry.per_try_timeout = Some(Duration::from_millis(50));
    policy.outlier.consecutive_failures = 1;
    let client = offline_with(policy, &["a", "b"]);
    let mut svc = client.layer().layer(NeverReady);
    // A POST: it may still go elsewhere, since nothing of it was sent.
    let err = svc.call(post("order 4")).await.expect_err("never ready");
    let err = err.downcast::<BalancedError>().expect("a call error");
    assert!(err.is_all_failed(), "{err}");
    // Both members tried (each try timing out before it left), then nobody left to try.
    let timeouts = err.attempts().filter(|a| matches!(a.error(), crate::AttemptError::Timeout(_)));
    assert_eq!(timeouts.count(), 2, "{err}");
    let st = client.inner.lock();
    for s in st.balancer.states() {
        assert_eq!(s.load.consecutive_failures, 0, "not charged");
        assert!(s.ejected_until.is_none(), "not ejected");
        assert_eq!(s.load.in_flight, 0);
    }
}
