//! The platform probes (`[admin] ready_path`, `live_path`): answered without the token, on the
//! admin listener or on a plain listener of their own (`probe_listen`) that answers nothing
//! else, for a Kubernetes or cloud load balancer's health checks.
//!
//! Ready: the process has started serving (every part bound and announced), no drain has
//! started, and every cluster readiness names (`ready_clusters`, else every cluster of the
//! current view) has a member the next pick could choose. Otherwise 503, one reason a line.
//! Live: 200 while the process answers, draining or not.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rondo_config::ProbeSpec;
use rondo_runtime::clock;

use crate::AdminParts;

/// The probe routes of `spec` (none when it names no path).
pub(crate) fn routes(parts: &Arc<AdminParts>, spec: &ProbeSpec) -> Router {
    let mut router = Router::new();
    if let Some(path) = &spec.ready_path {
        let (parts, clusters) = (parts.clone(), spec.ready_clusters.clone());
        router = router.route(
            path,
            get(move || {
                let reasons = not_ready(&parts, clusters.as_deref());
                async move { answer(reasons) }
            }),
        );
    }
    if let Some(path) = &spec.live_path {
        router = router.route(path, get(|| async { text(StatusCode::OK, "live\n".to_owned()) }));
    }
    router
}

/// The routes of a probe listener of its own: the probes, and 404 for anything else.
pub(crate) fn own_listener(parts: &Arc<AdminParts>, spec: &ProbeSpec) -> Router {
    routes(parts, spec).fallback(|| async {
        text(
            StatusCode::NOT_FOUND,
            "not found: this listener answers only the probe paths\n".into(),
        )
    })
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
        body,
    )
        .into_response()
}

fn answer(reasons: Vec<String>) -> Response {
    if reasons.is_empty() {
        return text(StatusCode::OK, "ready\n".to_owned());
    }
    let mut body = String::from("not ready\n");
    for r in reasons {
        body.push_str(&r);
        body.push('\n');
    }
    text(StatusCode::SERVICE_UNAVAILABLE, body)
}

/// Why the process is not ready (empty: it is). `clusters`: the clusters that must have an
/// eligible member; `None`: every cluster of the current view.
fn not_ready(parts: &AdminParts, clusters: Option<&[String]>) -> Vec<String> {
    let mut reasons = Vec::new();
    if !parts.drain.is_serving() {
        reasons.push("starting: not every part is serving yet".to_owned());
    }
    if parts.drain.is_on() {
        reasons.push("draining".to_owned());
    }
    let snap = parts.views.load();
    let now = clock::now();
    let all: Vec<String>;
    let names = match clusters {
        Some(c) => c,
        None => {
            all = snap.view.clusters.keys().cloned().collect();
            &all
        }
    };
    for name in names {
        let Some(rt) = snap.clusters.get(name) else {
            reasons.push(format!("cluster {name}: not in the current view"));
            continue;
        };
        // Healthy as well: in panic mode (too few healthy members) the down ones are eligible.
        let eligible = rt.with(|b| {
            let (eligibility, _) = b.eligibility(now, parts.group.as_deref());
            b.states().iter().zip(&eligibility).filter(|(s, e)| e.eligible && s.healthy).count()
        });
        if eligible == 0 {
            reasons.push(format!("cluster {name}: no eligible member"));
        }
    }
    reasons
}
