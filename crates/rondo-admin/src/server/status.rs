//! `GET /api/v1/status`: the view in effect, its routes, and each cluster's members as the next
//! pick sees them (eligibility, health and what it rests on, load, rank).

use axum::extract::State;
use axum::response::Response;
use rondo_core::{Actor, Algorithm};
use rondo_runtime::{ClusterRt, clock};
use serde_json::{Value, json};

use super::{AppState, with_etag};

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

pub(super) async fn status(State(st): State<AppState>) -> Response {
    let snap = st.parts.views.load();
    let now = clock::now();
    let routes: Vec<Value> = snap
        .view
        .routes
        .iter()
        .map(|r| {
            let mut route = json!({ "name": r.name, "listener": r.listener, "cluster": r.cluster,
                    "backups": r.backups });
            if !r.split.is_empty() {
                // A weighted split (`clusters`): `cluster` is its first cluster of positive weight.
                let split =
                    r.split.iter().map(|w| json!({ "cluster": w.cluster, "weight": w.weight }));
                route["clusters"] = Value::Array(split.collect());
            }
            route
        })
        .collect();
    let clusters: Vec<Value> = snap
        .view
        .clusters
        .keys()
        .filter_map(|name| snap.clusters.get(name))
        .map(|rt| {
            let mut c = cluster_status(rt, now, st.parts.group.as_deref());
            crate::members::note_shared(&st.parts.views, &mut c);
            // Proxyless gRPC clients balancing by this cluster (the naming service's xDS server).
            c["xds_clients"] = json!(st.parts.metrics.xds_clients_of(&rt.spec.name));
            c
        })
        .collect();
    let algorithms: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
    let pid = std::process::id();
    with_etag(
        snap.view.id,
        json!({ "view": snap.view.id, "pid": pid, "routes": routes, "clusters": clusters,
                "algorithms": algorithms }),
    )
}

/// What the health checks say of a member: `up`, `down`, or `unchecked` when nothing checks it
/// (no health checks configured and no registry verdict).
fn health_word(s: &rondo_core::MemberState, checked: bool) -> &'static str {
    if !s.healthy {
        "down"
    } else if checked || s.health_by != Actor::Config {
        "up"
    } else {
        "unchecked"
    }
}

/// What the member's current health rests on. `health_by` names who last *changed* it, and a
/// member that health checks keep finding up was never changed: it still says `config` though
/// the checks have confirmed it since. So: `health-check` once a check has answered (passed or
/// failed short of `fall`), `assumed` while the checks run but none has answered yet, `null`
/// when nothing checks the member, and otherwise whoever set it (registry, operator, ...).
fn health_source(s: &rondo_core::MemberState, checked: bool) -> Option<String> {
    match &s.health_by {
        Actor::Config if !checked => None,
        Actor::Config if s.probe_streak == (0, 0) => Some("assumed".to_owned()),
        Actor::Config => Some(Actor::HealthCheck.to_string()),
        by => Some(by.to_string()),
    }
}

fn cluster_status(rt: &ClusterRt, now: rondo_core::Instant, group: Option<&str>) -> Value {
    let spec = &rt.spec;
    let policy = &spec.policy;
    rt.with(|b| {
        // The same rules and candidate set the next pick uses (rondo-core's candidates.rs).
        let (eligibility, panic) = b.eligibility(now, group);
        let states = b.states();
        let mut ranked: Vec<(std::time::Duration, usize)> =
            states.iter().enumerate().filter_map(|(i, s)| s.load.probe_rtt.map(|r| (r, i))).collect();
        ranked.sort();
        let members: Vec<Value> = spec
            .members
            .iter()
            .zip(states)
            .zip(&eligibility)
            .enumerate()
            .map(|(i, ((m, s), e))| {
                let agent = s.load.agent.map(|r| {
                    json!({ "cpu_percent": r.cpu_used * 100.0,
                            "free_mib": r.mem_free >> 20,
                            "age_ms": ms(now.since(r.at)) })
                });
                let checked = policy.health.is_some();
                let sampled = s.load.ewma.sampled_at();
                json!({
                    "name": m.name,
                    "address": m.address,
                    "weight": m.weight,
                    "group": m.group,
                    "admin": s.admin.as_str(),
                    "admin_by": s.admin_by.to_string(),
                    "healthy": s.healthy,
                    "health": health_word(s, checked),
                    "health_by": s.health_by.to_string(),
                    "health_source": health_source(s, checked),
                    "checks_in_a_row": {"passed": s.probe_streak.0, "failed": s.probe_streak.1},
                    "last_probe_failure": s.last_probe_failure.map(|(f, _)| f.to_string()),
                    "last_probe_failure_ago_ms": s.last_probe_failure.map(|(_, at)| ms(now.since(at))),
                    "eligible": e.eligible,
                    "reason": e.reason.map(|r| r.as_str()),
                    "ejected_until_ms": s.ejected_until.filter(|u| *u > now).map(|u| ms(u.since(now))),
                    "in_flight": s.load.in_flight,
                    "sessions": s.load.sessions,
                    "served": s.load.completed,
                    "ewma_us": (s.load.ewma.get_at(now, policy.ewma.decay) / 1000.0) as u64,
                    "ewma_sample_ago_ms": sampled.map(|at| ms(now.since(at))),
                    "ewma_at_sample_us": sampled.map(|_| (s.load.ewma.last().0 / 1000.0) as u64),
                    "probe_rtt_us": s.load.probe_rtt.map(|r| r.as_micros() as u64),
                    "rank": ranked.iter().position(|&(_, j)| j == i),
                    "agent": agent,
                })
            })
            .collect();
        json!({
            "name": spec.name,
            "algorithm": policy.algorithm.as_str(),
            "granularity": policy.granularity.as_str(),
            "panic": panic,
            "shadow": b.shadow().map(Algorithm::as_str),
            "members": members,
        })
    })
}
