//! The filters that act on a sampled share of requests: `fault` (delays and aborts, by
//! percentage or for requests carrying a header) and `mirror` (copies to another cluster).
//! Percentages are kept as parts per million, so the core's filters stay comparable (`Eq`).

use std::time::Duration;

use rondo_core::Branch;
use rondo_core::traffic::{Fault, Mirror, PPM};

use super::{ClusterSpec, Compiler};
use crate::path::FieldPath;
use crate::raw::{RawFault, RawFilter, RawMirror, RawRoute};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest `delay_ms`: an hour (the route's `request_timeout_ms` cuts it shorter).
pub const MAX_FAULT_DELAY_MS: u64 = 3_600_000;

/// A percentage from 0 to 100 in parts per million; `default` (ppm) when absent.
fn percent(c: &mut Compiler<'_>, path: FieldPath, v: Option<f64>, default: u32) -> u32 {
    match v {
        None => default,
        Some(p) if p.is_finite() && (0.0..=100.0).contains(&p) => {
            (p * f64::from(PPM / 100)).round() as u32
        }
        Some(p) => {
            c.err(path, format!("must be a percentage from 0 to 100, got {p}"));
            default
        }
    }
}

/// How a filter's header name is checked (`traffic`'s rule, handed in).
pub(super) type HeaderName = fn(&mut Compiler<'_>, FieldPath, &str) -> String;

/// A `fault`: a delay, an abort, or both, each with its share (100 % when not given), or a
/// header that names the requests subject to them (and may name the fault itself), checked by
/// `header_name`.
pub(super) fn fault(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawFault,
    header_name: HeaderName,
) -> Option<Fault> {
    if r.delay_ms.is_none() && r.abort_status.is_none() && r.header.is_none() {
        c.err(path.clone(), "a fault needs `delay_ms`, `abort_status` or `header`");
        return None;
    }
    if r.delay_percent.is_some() && r.delay_ms.is_none() {
        c.err(path.key("delay_percent"), "`delay_percent` needs `delay_ms`");
    }
    if r.abort_percent.is_some() && r.abort_status.is_none() {
        c.err(path.key("abort_percent"), "`abort_percent` needs `abort_status`");
    }
    let delay = r.delay_ms.map(|ms| {
        Duration::from_millis(c.int(path.key("delay_ms"), Some(ms), 1, 1, MAX_FAULT_DELAY_MS))
    });
    let abort_status =
        r.abort_status.map(|s| c.int(path.key("abort_status"), Some(s), 503, 200, 599) as u16);
    let header = r.header.as_ref().map(|h| header_name(c, path.key("header"), h));
    Some(Fault {
        delay,
        delay_ppm: percent(c, path.key("delay_percent"), r.delay_percent, PPM),
        abort_status,
        abort_ppm: percent(c, path.key("abort_percent"), r.abort_percent, PPM),
        header,
    })
}

/// A `mirror`: its cluster (checked against the file's clusters by [`check_mirrors`]), share
/// and queue.
pub(super) fn mirror(c: &mut Compiler<'_>, path: &FieldPath, m: &RawMirror) -> Mirror {
    Mirror {
        cluster: m.cluster.clone(),
        ppm: percent(c, path.key("percent"), m.percent, PPM),
        queue: c.u32(path.key("queue"), m.queue, Branch::DEFAULT_QUEUE, 1),
    }
}

/// Each `mirror` of a route's raw `filters` names a cluster the file defines (or a registration
/// may declare) that does not already serve the route (its cluster, split or backups).
pub(super) fn check_mirrors(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
    declared_ok: bool,
) {
    for (i, f) in r.filters.iter().flatten().enumerate() {
        let Some(m) = &f.mirror else { continue };
        let p = path.key("filters").index(i).key("mirror").key("cluster");
        let in_split = r.clusters.iter().flatten().any(|w| w.cluster == m.cluster);
        if m.cluster == r.cluster || r.backups.contains(&m.cluster) || in_split {
            c.err(
                p,
                format!(
                    "cluster `{}` already serves the route (its cluster, split or a backup): a \
                     mirror copies requests to another cluster",
                    m.cluster
                ),
            );
        } else if !clusters.contains_key(&m.cluster) && !declared_ok {
            c.err(p, super::unknown_cluster(&m.cluster, clusters));
        }
    }
}

/// A listener's filters have no `mirror`: it names a cluster, which is a route's to choose.
pub(super) fn refuse_listener_mirrors(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    filters: Option<&[RawFilter]>,
) {
    for (i, f) in filters.unwrap_or_default().iter().enumerate() {
        if f.mirror.is_some() {
            c.err(
                path.key("filters").index(i).key("mirror"),
                "`mirror` is a route's filter (it names a cluster), not a listener's",
            );
        }
    }
}
