//! `GET /api/v1/clusters/{cluster}/explain`: the cluster's recent picks, each with why its
//! member was chosen over the other candidates, and the member TLS failures no pick shows.

use axum::extract::{Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use rondo_runtime::clock;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, find};

#[derive(Deserialize)]
pub(super) struct ExplainQuery {
    n: Option<usize>,
}

pub(super) async fn explain(
    State(st): State<AppState>,
    UrlPath(c): UrlPath<String>,
    Query(q): Query<ExplainQuery>,
) -> Response {
    let snap = st.parts.views.load();
    let (rt, _) = match find(&snap, &c, None) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let n = q.n.unwrap_or(20).min(256);
    let now = clock::now();
    let group = st.parts.group.as_deref();
    let picks: Vec<Value> = rt
        .recent_decisions(n)
        .into_iter()
        .map(|(at, d)| {
            let e = rt.with(|b| b.explain(&d, now, group));
            let candidates: Vec<Value> = e
                .candidates
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name, "weight": c.weight,
                        "effective_weight": c.effective_weight, "in_flight": c.in_flight,
                        "sessions": c.sessions, "ewma_us": c.ewma_us,
                        "probe_rtt_us": c.probe_rtt_us, "cpu_percent": c.cpu_percent,
                        "free_mib": c.free_mib,
                    })
                })
                .collect();
            json!({
                "at_unix_ms": at,
                "member": e.chosen,
                "algorithm": d.algorithm.as_str(),
                "scope": d.scope.to_string(),
                "why": d.why.to_string(),
                "summary": e.summary,
                "candidates": candidates,
            })
        })
        .collect();
    // Tries that failed in TLS to a member (its certificate, or it refused the router's), which
    // no pick shows: the member was picked, the failure came after.
    let tls_failures: Vec<Value> = st
        .parts
        .metrics
        .tls_failures_of(&c)
        .into_iter()
        .map(|(member, reason, count, at)| {
            json!({ "member": member, "reason": reason, "count": count, "last_unix_ms": at })
        })
        .collect();
    axum::Json(json!({ "cluster": c, "view": snap.view.id, "picks": picks,
                       "tls_failures": tls_failures }))
    .into_response()
}
