//! `fault`: delays and aborts injected into a share of a route's requests, drawn per request
//! with the worker's generator ([`crate::entropy`]); or, with `header`, only into requests
//! carrying that header, whose value may name the fault itself, as Envoy's header-controlled
//! faults do:
//!
//! - `abort=STATUS` (200 to 599): abort this request with that status;
//! - `delay=MS` (at most an hour): delay this request that long;
//!
//! both may be given, comma-separated (`delay=200, abort=503`). A fault the value names
//! applies to the request whatever the configured percentage; the ones it does not name apply
//! as configured. Anything else in the value is ignored.
//!
//! A drawn delay goes into [`Applied::delay`]: each codec waits it out ([`hold`]) before the
//! first try, or before the answer of a request that is also aborted, cut to the route's
//! `request_timeout`. An abort is an [`Answer`] (`text/plain`, `fault filter abort`).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, header};
use rondo_core::Route;
use rondo_core::traffic::{Fault, PPM};
use rondo_runtime::metrics::{Counter, Metrics};

use super::{Answer, Applied};
use crate::entropy::chance;
use crate::head::Headers;

/// The longest delay a header may ask for: an hour, as `delay_ms` allows.
const MAX_HEADER_DELAY: Duration = Duration::from_secs(3600);

/// A compiled `fault`, with its route's counters once bound ([`FaultStep::bind`]).
pub(super) struct FaultStep {
    spec: Fault,
    counters: Option<(Counter, Counter)>,
}

impl FaultStep {
    pub(super) fn new(spec: &Fault) -> FaultStep {
        FaultStep { spec: spec.clone(), counters: None }
    }

    /// Counts this step's injections under `route`.
    pub(super) fn bind(&mut self, metrics: &Metrics, route: &str) {
        self.counters =
            Some((metrics.fault_counter(route, "delay"), metrics.fault_counter(route, "abort")));
    }

    /// Draws this request's faults: a delay into `applied`, an abort as the answer.
    pub(super) fn request(&self, headers: &impl Headers, applied: &mut Applied) -> Option<Answer> {
        let s = &self.spec;
        let (mut delay, mut delay_ppm) = (s.delay, s.delay_ppm);
        let (mut abort, mut abort_ppm) = (s.abort_status, s.abort_ppm);
        if let Some(name) = &s.header {
            let value = headers.get_str(name)?;
            for item in value.split(',') {
                match item.trim().split_once('=') {
                    Some(("abort", v)) => {
                        if let Some(status) =
                            v.trim().parse().ok().filter(|s| (200..=599).contains(s))
                        {
                            (abort, abort_ppm) = (Some(status), PPM);
                        }
                    }
                    Some(("delay", v)) => {
                        if let Ok(ms) = v.trim().parse::<u64>() {
                            delay = Some(Duration::from_millis(ms).min(MAX_HEADER_DELAY));
                            delay_ppm = PPM;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(d) = delay.filter(|_| chance(delay_ppm)) {
            applied.delay = Some(applied.delay.map_or(d, |before| before.max(d)));
            if let Some((delays, _)) = &self.counters {
                delays.inc();
            }
        }
        let status = abort.filter(|_| chance(abort_ppm))?;
        if let Some((_, aborts)) = &self.counters {
            aborts.inc();
        }
        let headers = vec![(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))];
        Some(Answer { status, headers, body: Bytes::from_static(b"fault filter abort\n") })
    }
}

/// Waits out the request's injected delay, if any, cut to the route's `request_timeout`.
pub(crate) async fn hold(applied: Option<&Applied>, route: &Route) {
    if let Some(delay) = applied.and_then(|a| a.delay) {
        tokio::time::sleep(delay.min(route.request_timeout)).await;
    }
}
