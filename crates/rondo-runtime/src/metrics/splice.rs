//! How `tcp` listeners moved their sessions' bytes (`rondo_tcp_forwarded_bytes_total{listener,
//! path}`), and `http` listeners the HTTP/1 bodies that streamed past their head's buffer
//! (`rondo_http_body_bytes_total{listener,path}`): through a kernel pipe with splice(2) or
//! through a userspace buffer, so that an operator (and the tests) can see that zero-copy
//! forwarding runs. One series per listener and path, bounded by the configuration.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of forwarded bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ForwardedLabels {
    /// The tcp listener.
    pub listener: String,
    /// `splice` (kernel pipe) or `copy` (userspace buffer).
    pub path: &'static str,
}

/// The family, kept in [`Metrics`].
#[derive(Debug, Default)]
pub(super) struct SpliceFamilies {
    forwarded: Family<ForwardedLabels, Counter>,
    bodies: Family<ForwardedLabels, Counter>,
}

/// An `http` listener's body bytes by path, resolved once per listener (kept in
/// [`super::ListenerMetrics`]).
#[derive(Debug, Clone, Default)]
pub struct BodyBytes {
    spliced: Counter,
    copied: Counter,
}

impl BodyBytes {
    /// Counts one message's streamed body bytes: `spliced` through a pipe, `copied` through a
    /// buffer.
    pub fn add(&self, spliced: u64, copied: u64) {
        if spliced > 0 {
            self.spliced.inc_by(spliced);
        }
        if copied > 0 {
            self.copied.inc_by(copied);
        }
    }
}

impl Metrics {
    /// Counts a tcp session's bytes on `listener`, both directions: `spliced` through a pipe,
    /// `copied` through a buffer. Called once per session, at its end.
    pub fn tcp_forwarded(&self, listener: &str, spliced: u64, copied: u64) {
        for (path, n) in [("splice", spliced), ("copy", copied)] {
            if n > 0 {
                let labels = ForwardedLabels { listener: listener.to_owned(), path };
                self.splice.forwarded.get_or_create(&labels).inc_by(n);
            }
        }
    }
}

impl Metrics {
    /// The body counters of `listener` (made once, with its other handles).
    pub(super) fn body_bytes(&self, listener: &str) -> BodyBytes {
        let get = |path| {
            let labels = ForwardedLabels { listener: listener.to_owned(), path };
            self.splice.bodies.get_or_create(&labels).clone()
        };
        BodyBytes { spliced: get("splice"), copied: get("copy") }
    }
}

pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "tcp_forwarded_bytes",
        "Bytes tcp listeners' sessions forwarded (both directions), by listener and path (splice: through a kernel pipe, copy: through a userspace buffer)",
        m.splice.forwarded.clone(),
    );
    r.register(
        "http_body_bytes",
        "HTTP/1 body bytes http listeners streamed past the buffer their head came in (both directions), by listener and path (splice: through a kernel pipe, copy: through a userspace buffer)",
        m.splice.bodies.clone(),
    );
}
