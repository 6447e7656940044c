//! A cluster's `retry.hedge` (`{ after = "50ms", max = 1 }`), compiled into the core's `Hedge`.

use std::time::Duration;

use rondo_core::failover::hedge::Hedge;

use super::Compiler;
use crate::path::FieldPath;
use crate::raw::{RawHedge, RawRetry};

/// The most hedges a request may have: each is a try more on a member.
const MAX_HEDGES: u64 = 3;

/// `retry.hedge` at `retry` (its path): `after` required and positive, `max` 1 to 3 (1 when
/// unset). A hedge is a try on another member, so `attempts` must leave room for one.
pub(super) fn hedge(c: &mut Compiler<'_>, retry: &FieldPath, h: &RawHedge, r: &RawRetry) -> Hedge {
    let p = retry.key("hedge");
    if h.after_ms.is_none() {
        c.err(
            p.key("after_ms"),
            "hedge needs after (how long a try may go unanswered, e.g. \"50ms\")",
        );
    }
    let after = c.ms(p.key("after_ms"), h.after_ms, Duration::from_millis(50), false);
    let max = c.int(p.key("max"), h.max, 1, 1, MAX_HEDGES) as u32;
    if r.attempts == Some(1) {
        c.err(
            p.key("max"),
            "hedge needs retry.attempts of at least 2 (a hedge is a try on another member)",
        );
    }
    Hedge { after, max }
}
