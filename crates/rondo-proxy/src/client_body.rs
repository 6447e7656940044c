//! A client's request body on hyper's path, whichever codec received it: hyper's own
//! (HTTP/1.x, HTTP/2) or an HTTP/3 request stream (`h3/`, feature `http3`). The stages
//! of hyper's path (`hyper_path/`) read and forward it the same way; the own HTTP/1 path has bodies
//! of its own and never sees this.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// What reading either body fails with (`crate::body::BoxError`, the same type: spelled here so
/// that the bodies' module and this one do not use each other).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// See the module docs.
#[derive(Debug)]
pub enum ClientBody {
    /// Received by hyper.
    Hyper(Incoming),
    /// Received on an HTTP/3 request stream (boxed: hyper's bodies, the common case, stay
    /// small).
    #[cfg(feature = "http3")]
    H3(Box<crate::h3::body::H3Body>),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(|e| Box::new(e) as BoxError),
            #[cfg(feature = "http3")]
            ClientBody::H3(b) => Pin::new(&mut **b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            #[cfg(feature = "http3")]
            ClientBody::H3(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            #[cfg(feature = "http3")]
            ClientBody::H3(b) => b.size_hint(),
        }
    }
}
