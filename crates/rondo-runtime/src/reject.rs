//! The answer to a connection over a listener's limit (HTTP and queue listeners): a `503` with
//! `Retry-After`, then a close, written by one task per listener ([`Rejecter`]), so that a
//! flood of refused connections costs no task each and holds at most [`MAX_REJECTING`] at once.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Connections over the listener's limit answered with a 503 at the same time; beyond that, a
/// flood's connections are closed at once without a word.
pub const MAX_REJECTING: usize = 256;

/// How long one 503 may take to write before its connection is closed anyway.
const REJECT_TIME: Duration = Duration::from_secs(1);

/// Answers connections over a listener's limit with a 503 (with `Retry-After`) and closes them,
/// all from one task per listener: a flood of refused connections costs no task each, and at
/// most [`MAX_REJECTING`] are being answered at once.
#[derive(Debug)]
pub struct Rejecter {
    queue: tokio::sync::mpsc::UnboundedSender<TcpStream>,
    /// Connections queued or being answered.
    busy: Arc<AtomicUsize>,
}

impl Rejecter {
    /// Starts the answering task of `listener`, whose limit is `limit` connections; it ends
    /// when the `Rejecter` is dropped and the 503s under way are done.
    pub fn spawn(listener: &str, limit: u32) -> Self {
        let body = format!(
            "rondo: 503 listener {listener} is at its limit of {limit} client connections; retry shortly\n"
        );
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (queue, rx) = tokio::sync::mpsc::unbounded_channel();
        let busy = Arc::new(AtomicUsize::new(0));
        tokio::spawn(answer_rejections(rx, response.into_bytes(), busy.clone()));
        Rejecter { queue, busy }
    }

    /// Answers `stream` with the 503, or closes it at once when [`MAX_REJECTING`] are under way;
    /// whether a 503 goes out.
    pub fn reject(&self, stream: TcpStream) -> bool {
        let taken = self.busy.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < MAX_REJECTING).then_some(n + 1)
        });
        if taken.is_ok() && self.queue.send(stream).is_err() {
            self.busy.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        taken.is_ok()
    }
}

/// One 503 being written.
struct Rejection {
    stream: TcpStream,
    written: usize,
    deadline: Instant,
}

impl Rejection {
    /// Ready when the connection is done with (answered and shut, failed, or out of time).
    fn poll(&mut self, cx: &mut Context<'_>, response: &[u8], now: Instant) -> Poll<()> {
        if now >= self.deadline {
            return Poll::Ready(());
        }
        while self.written < response.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &response[self.written..]) {
                Poll::Ready(Ok(n)) if n > 0 => self.written += n,
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(&mut self.stream).poll_shutdown(cx).map(|_| ())
    }
}

/// The task of a `Rejecter`: drives every queued 503 from one future, re-polling them all on
/// each wake (there are at most [`MAX_REJECTING`]), with one timer for the earliest deadline.
async fn answer_rejections(
    mut queue: tokio::sync::mpsc::UnboundedReceiver<TcpStream>,
    response: Vec<u8>,
    busy: Arc<AtomicUsize>,
) {
    let mut pending: Vec<Rejection> = Vec::new();
    let mut timer = Box::pin(tokio::time::sleep(Duration::ZERO));
    let mut open = true;
    std::future::poll_fn(|cx| {
        while open {
            match queue.poll_recv(cx) {
                Poll::Ready(Some(stream)) => pending.push(Rejection {
                    stream,
                    written: 0,
                    deadline: Instant::now() + REJECT_TIME,
                }),
                Poll::Ready(None) => open = false,
                Poll::Pending => break,
            }
        }
        let now = Instant::now();
        let before = pending.len();
        pending.retain_mut(|r| r.poll(cx, &response, now).is_pending());
        busy.fetch_sub(before - pending.len(), Ordering::Relaxed);
        if !open && pending.is_empty() {
            return Poll::Ready(());
        }
        if let Some(first) = pending.iter().map(|r| r.deadline).min() {
            timer.as_mut().reset(first);
            if timer.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    })
    .await;
}
