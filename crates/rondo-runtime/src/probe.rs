//! Active probes (CLB's 200 ms poll): every interval each member of a cluster is probed (TCP
//! connect, or an HTTP GET whose status must fall in the expected range). Each round's round-trip
//! times re-rank the `response-time` table; `rise` successes in a row bring a member up and `fall`
//! failures take it down. A cluster with `response-time` but no health check is still probed
//! (TCP connect, default interval) for the ranking, without touching health.
//!
//! One task per cluster and view; it stops when its view is replaced (the next view's task takes
//! over with the member state carried across).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rondo_core::{Actor, Algorithm, HealthCheck, HealthCheckKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::live::{ClusterRt, Snapshot};

/// Starts the probe tasks of every cluster in `snapshot` that needs them.
pub fn spawn(snapshot: &Snapshot) {
    for rt in snapshot.clusters.values() {
        let policy = &rt.spec.policy;
        let (check, judge) = match &policy.health {
            Some(h) => (h.clone(), true),
            None if policy.algorithm == Algorithm::ResponseTime => (HealthCheck::default(), false),
            None => continue,
        };
        if rt.spec.members.is_empty() {
            continue;
        }
        tokio::spawn(run(Arc::downgrade(rt), check, judge));
    }
}

#[derive(Default, Clone, Copy)]
struct Streak {
    ok: u32,
    failed: u32,
}

async fn run(rt: Weak<ClusterRt>, check: HealthCheck, judge: bool) {
    let mut streaks: HashMap<String, Streak> = HashMap::new();
    let mut ticker = tokio::time::interval(check.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(cluster) = rt.upgrade() else { return };
        if cluster.is_retired() {
            return;
        }
        let members: Vec<(usize, String, String)> = cluster
            .spec
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (i, m.name.clone(), m.address.clone()))
            .collect();
        drop(cluster);
        let mut round = JoinSet::new();
        for (i, _, address) in &members {
            let (i, address, kind, timeout) =
                (*i, address.clone(), check.kind.clone(), check.timeout);
            round.spawn(async move { (i, probe_why(&address, &kind, timeout).await) });
        }
        let mut results = Vec::with_capacity(members.len());
        let mut why: HashMap<usize, String> = HashMap::new();
        while let Some(done) = round.join_next().await {
            if let Ok((i, r)) = done {
                if let Err(e) = &r {
                    why.insert(i, e.clone());
                }
                results.push((i, r.ok()));
            }
        }
        let Some(cluster) = rt.upgrade() else { return };
        let now = crate::clock::now();
        let changed = cluster.with(|b| {
            b.record_probe_round(&results);
            let mut changed = false;
            if !judge {
                return changed;
            }
            for &(i, rtt) in &results {
                let name = &members[i].1;
                let s = streaks.entry(name.clone()).or_default();
                if rtt.is_some() {
                    s.ok += 1;
                    s.failed = 0;
                } else {
                    s.failed += 1;
                    s.ok = 0;
                }
                let healthy = b.states().get(i).map(|st| st.healthy);
                if healthy == Some(false) && s.ok >= check.rise {
                    changed = true;
                    b.set_health(i, true, Actor::HealthCheck, now);
                    let reason = format!("{} health check(s) passed in a row", s.ok);
                    // A `&str` field: quoted in text lines, a plain string in JSON ones.
                    tracing::info!(
                        cluster = %b.spec().name,
                        member = %name,
                        reason = reason.as_str(),
                        "member up"
                    );
                } else if healthy == Some(true) && s.failed >= check.fall {
                    changed = true;
                    b.set_health(i, false, Actor::HealthCheck, now);
                    let last = why.get(&i).map_or("failed", String::as_str);
                    let reason =
                        format!("{} health check(s) failed in a row, the last: {last}", s.failed);
                    tracing::warn!(
                        cluster = %b.spec().name,
                        member = %name,
                        reason = reason.as_str(),
                        "member down"
                    );
                }
            }
            changed
        });
        if changed {
            cluster.state_changed();
        }
    }
}

/// One probe: its round trip, or `None` when it failed.
pub async fn probe(address: &str, kind: &HealthCheckKind, timeout: Duration) -> Option<Duration> {
    probe_why(address, kind, timeout).await.ok()
}

/// One probe: its round trip, or why it failed (for the log line of a member going down).
async fn probe_why(
    address: &str,
    kind: &HealthCheckKind,
    timeout: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let attempt = async {
        let mut stream =
            TcpStream::connect(address).await.map_err(|e| format!("cannot connect: {e}"))?;
        match kind {
            HealthCheckKind::Tcp => Ok(()),
            HealthCheckKind::Http { path, expect_min, expect_max } => {
                let _ = stream.set_nodelay(true);
                let req = format!(
                    "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: rondo-probe\r\nConnection: close\r\n\r\n"
                );
                stream.write_all(req.as_bytes()).await.map_err(|e| format!("cannot send: {e}"))?;
                let status = read_status(&mut stream)
                    .await
                    .ok_or_else(|| "no HTTP status line in the answer".to_owned())?;
                if (*expect_min..=*expect_max).contains(&status) {
                    Ok(())
                } else {
                    Err(format!("status {status}, expected {expect_min} to {expect_max}"))
                }
            }
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => Ok(start.elapsed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// Reads up to the end of the status line and returns the status code.
async fn read_status(stream: &mut TcpStream) -> Option<u16> {
    let mut buf = [0u8; 256];
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..]).await.ok()?;
        if n == 0 {
            return None;
        }
        len += n;
        if let Some(end) = buf[..len].windows(2).position(|w| w == b"\r\n") {
            let line = std::str::from_utf8(&buf[..end]).ok()?;
            let mut parts = line.split(' ');
            let version = parts.next()?;
            if !version.starts_with("HTTP/1.") {
                return None;
            }
            return parts.next()?.parse().ok();
        }
        if len == buf.len() {
            return None;
        }
    }
}
