//! The bodies of the tower layer: [`SlotBody`], the request body every try of a request
//! shares (the caller's body waits in a [`Shared`] slot until a try reads it, so a try that
//! never read it leaves it for the next member), and [`Tracked`], the response body that holds
//! the member's request (its ticket) until its last frame passes.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::request::Parts;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use rondo_core::FailureKind;

use crate::call::Ticket;

/// What the tries of one request share (one allocation): the caller's request parts, each
/// try's request rebuilt from them, and the caller's body, waiting until a try reads it.
pub(crate) struct Shared<B> {
    pub(crate) parts: Parts,
    /// The body's size hint before any try read it.
    pub(crate) hint: SizeHint,
    pub(crate) body: Mutex<Option<B>>,
}

impl<B> Shared<B> {
    pub(crate) fn body(&self) -> std::sync::MutexGuard<'_, Option<B>> {
        self.body.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pin_project! {
    /// The request body a [`Balanced`](super::Balanced) service hands its inner service: the caller's body, taken
    /// out of a slot shared by every try on the first read. A try that never read it (its
    /// connection failed first) leaves it for the next member.
    ///
    /// It holds the caller's body in place (no box), so it is `Unpin` when that body is; hyper's
    /// client asks for `Unpin` request bodies (wrap one that is not in `Box::pin` or
    /// `http_body_util::combinators::BoxBody` first).
    pub struct SlotBody<B> {
        #[pin]
        state: SlotState<B>,
    }
}

pin_project! {
    #[project = SlotProj]
    enum SlotState<B> {
        Waiting { shared: Arc<Shared<B>> },
        Reading { #[pin] body: B },
        Done,
    }
}

impl<B> SlotBody<B> {
    /// A try's body: waiting in `shared` for the first read, or none (the caller's request had
    /// no body).
    pub(crate) fn new(shared: Option<Arc<Shared<B>>>) -> Self {
        match shared {
            Some(shared) => SlotBody { state: SlotState::Waiting { shared } },
            None => SlotBody { state: SlotState::Done },
        }
    }
}

impl<B> fmt::Debug for SlotBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            SlotState::Waiting { .. } => "waiting",
            SlotState::Reading { .. } => "reading",
            SlotState::Done => "done",
        };
        f.debug_struct("SlotBody").field("state", &state).finish()
    }
}

impl<B: Body> Body for SlotBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut state = self.project().state;
        if let SlotProj::Waiting { shared } = state.as_mut().project() {
            let taken = shared.body().take();
            state.set(match taken {
                Some(body) => SlotState::Reading { body },
                None => SlotState::Done,
            });
        }
        match state.project() {
            SlotProj::Reading { body } => body.poll_frame(cx),
            _ => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            // A try starts only while the body is whole (`Tries::untouched`), so a waiting body
            // is the caller's as it came: not at its end (bodies at their end never wait in a
            // slot), with the hint it had. No lock needed. (Should a try that timed out still
            // take the body later, this try sends less than it announced and hyper fails it,
            // rather than sending an empty body.)
            SlotState::Waiting { .. } => false,
            SlotState::Reading { body } => body.is_end_stream(),
            SlotState::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            SlotState::Waiting { shared } => shared.hint,
            SlotState::Reading { body } => body.size_hint(),
            SlotState::Done => SizeHint::with_exact(0),
        }
    }
}

pin_project! {
    /// A member's response body; the member's in-flight request ends when its last frame passes
    /// (or it is dropped), a body error counting as a reset. It holds the member's body in
    /// place (no box): `Unpin` when that body is.
    pub struct Tracked<B> {
        #[pin]
        inner: B,
        ticket: Option<Ticket>,
    }
}

impl<B> fmt::Debug for Tracked<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracked").field("open", &self.ticket.is_some()).finish_non_exhaustive()
    }
}

impl<B> Tracked<B> {
    /// `body`, ending `ticket`'s request when it ends.
    pub(crate) fn new(body: B, ticket: Ticket) -> Self {
        Tracked { inner: body, ticket: Some(ticket) }
    }

    /// The member that answered, while the body is still open.
    pub fn member(&self) -> Option<&str> {
        self.ticket.as_ref().map(Ticket::member)
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let r = std::task::ready!(this.inner.poll_frame(cx));
        match &r {
            None => {
                this.ticket.take();
            }
            Some(Err(_)) => {
                if let Some(mut t) = this.ticket.take() {
                    t.failed(FailureKind::Reset);
                }
            }
            Some(Ok(_)) => {}
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
