//! HTTP/3 listeners' QUIC protections, counted per listener and event
//! (`rondo_http3_events_total`) through handles resolved once per listener ([`Http3Metrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of an HTTP/3 listener's event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct Http3Labels {
    /// Listener name.
    pub listener: String,
    /// One of [`Http3Metrics`]' fields' names.
    pub event: &'static str,
}

/// One HTTP/3 listener's counters (the `event` label is the field's name).
#[derive(Debug)]
pub struct Http3Metrics {
    /// QUIC handshakes finished: connections open.
    pub handshakes: Counter,
    /// Handshakes that failed or timed out (among them, garbage that parsed as an Initial).
    pub handshake_failed: Counter,
    /// New connections refused over the listener's `max_connections`.
    pub refused: Counter,
    /// Clients asked to prove their address with a Retry (more handshakes in progress than
    /// `http3_retry_above`).
    pub retried: Counter,
    /// Initials dropped unanswered: a Retry token that did not validate, or a client that
    /// ignored the Retry.
    pub ignored: Counter,
    /// Connections closed by `http3_idle_timeout_ms`.
    pub idle_timeouts: Counter,
    /// Times a connection had `http3_max_streams` request streams open (QUIC's stream credit
    /// holds its next one back until one ends).
    pub streams_at_limit: Counter,
    /// Requests (request streams) served.
    pub requests: Counter,
    /// Requests in 0-RTT early data answered 425 (`http3_0rtt`: an unsafe method).
    pub too_early: Counter,
    /// Times the bytes sent to a not yet validated address reached three times the bytes
    /// received from it: quinn then sends it nothing more until it hears from it (RFC 9000
    /// 8.1).
    pub amplification_limited: Counter,
    /// Datagrams of an older process's connections passed to it during an upgrade.
    pub forwarded: Counter,
    /// Such datagrams dropped: the older process's channel was full, or it had just ended.
    pub forward_dropped: Counter,
    /// Datagrams of this process's connections passed to it by the process that took over.
    pub forwarded_in: Counter,
}

impl Metrics {
    /// The HTTP/3 handles of listener `name`.
    pub fn http3(&self, name: &str) -> Http3Metrics {
        let c = |event| {
            self.http3_events
                .get_or_create(&Http3Labels { listener: name.to_owned(), event })
                .clone()
        };
        Http3Metrics {
            handshakes: c("handshakes"),
            handshake_failed: c("handshake_failed"),
            refused: c("refused"),
            retried: c("retried"),
            ignored: c("ignored"),
            idle_timeouts: c("idle_timeouts"),
            streams_at_limit: c("streams_at_limit"),
            requests: c("requests"),
            too_early: c("too_early"),
            amplification_limited: c("amplification_limited"),
            forwarded: c("forwarded"),
            forward_dropped: c("forward_dropped"),
            forwarded_in: c("forwarded_in"),
        }
    }
}

/// Registers the HTTP/3 family.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
        "http3_events",
        "HTTP/3 listeners' QUIC events by listener: handshakes, handshake_failed, refused (max_connections), retried (address validation), ignored, idle_timeouts, streams_at_limit, requests, too_early (425 to early data), amplification_limited (3x limit reached before address validation), forwarded, forward_dropped, forwarded_in (datagrams steered between an old and a new process in an upgrade)",
        m.http3_events.clone(),
    );
}
