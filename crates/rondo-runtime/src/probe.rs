//! Active probes (CLB's 200 ms poll): every interval each member of a cluster is probed (TCP
//! connect, or an HTTP GET whose status must fall in the expected range). Each round's round-trip
//! times re-rank the `response-time` table; `rise` successes in a row bring a member up and `fall`
//! failures take it down. A cluster with `response-time` (or `response-time-clb`) but no health
//! check is still probed (TCP connect, default interval) for the ranking, without touching
//! health.
//!
//! A UDP check (`health.udp`) sends a datagram and waits for an answer (`probe_udp`); with
//! `health.port`, any check goes to that port of the member's host instead of its own.
//!
//! An HTTP check of an `upstream_protocol = "http2"` cluster, and a gRPC check
//! (`grpc.health.v1.Health/Check`), speak HTTP/2 (`probe_h2`).
//!
//! Every failed check records why ([`ProbeFailure`]: status NNN, timeout, refused, reset, dns,
//! ...) on the member, for status pages and for the `member down` log line.
//!
//! One task per cluster and view; it stops when its view is replaced (the next view's task takes
//! over with the member state carried across).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rondo_core::{Actor, HealthCheck, HealthCheckKind, ProbeFailure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::live::{ClusterRt, Snapshot};

/// Starts the probe tasks of every cluster in `snapshot` that needs them.
pub fn spawn(snapshot: &Snapshot) {
    spawn_clusters(snapshot.clusters.values());
}

/// Starts the probe tasks of the cluster runtimes `clusters` that need them (the ones a view
/// swap built: a cluster it kept keeps its running task).
pub fn spawn_clusters<'a>(clusters: impl IntoIterator<Item = &'a Arc<ClusterRt>>) {
    for rt in clusters {
        let policy = &rt.spec.policy;
        let (check, judge) = match &policy.health {
            Some(h) => (h.clone(), true),
            None if policy.algorithm.ranks_by_probes() => (HealthCheck::default(), false),
            None => continue,
        };
        if rt.spec.members.is_empty() {
            continue;
        }
        tokio::spawn(run(Arc::downgrade(rt), check, judge));
    }
}

/// A member to probe: its index, name and the address the check goes to.
type Target = (usize, String, String);

/// What one probe found of member `.0`: its round trip, or why it failed.
type Found = (usize, Result<Duration, ProbeFailure>);

/// A shared member's verdict, for the other clusters listing it.
type Verdict = (usize, bool, Option<ProbeFailure>);

async fn run(rt: Weak<ClusterRt>, check: HealthCheck, judge: bool) {
    let mut ticker = tokio::time::interval(check.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(cluster) = rt.upgrade() else { return };
        if cluster.is_retired() {
            return;
        }
        let members = targets(&cluster, &check, judge);
        let round = start_round(&cluster, &members, &check);
        drop(cluster);
        let results = finish_round(round, members.len()).await;
        let Some(cluster) = rt.upgrade() else { return };
        let (changed, shared) = record_round(&cluster, &members, &results, &check, judge);
        if changed {
            cluster.state_changed();
        }
        // Its verdict on a shared member holds in every cluster listing it (each round, so
        // that a cluster new in the view learns it too).
        for (i, healthy, why) in shared {
            cluster.share_health(i, healthy, why);
        }
    }
}

/// The members this cluster probes this round, at the address each check goes to.
fn targets(cluster: &ClusterRt, check: &HealthCheck, judge: bool) -> Vec<Target> {
    cluster
        .spec
        .members
        .iter()
        .enumerate()
        // A shared member is probed by one of its clusters, for all of them.
        .filter(|(i, _)| !(judge && cluster.probed_elsewhere(*i)))
        .map(|(i, m)| {
            // `health.port`: the check goes to a side port of the member's host.
            let address = match check.port {
                Some(p) => crate::probe_udp::with_port(&m.address, p),
                None => m.address.clone(),
            };
            (i, m.name.clone(), address)
        })
        .collect()
}

/// Starts one round: every target checked at once, over the cluster's TLS to its members.
fn start_round(cluster: &ClusterRt, members: &[Target], check: &HealthCheck) -> JoinSet<Found> {
    let http2 = cluster.spec.upstream_protocol == rondo_core::UpstreamProtocol::Http2;
    let mut round = JoinSet::new();
    for (i, _, address) in members {
        let (i, address, kind, timeout) = (*i, address.clone(), check.kind.clone(), check.timeout);
        let tls = cluster.tls.clone();
        round.spawn(async move {
            let r = match &tls {
                None => check_once_tls(&address, &kind, timeout, None, http2).await,
                Some(Ok(t)) => check_once_tls(&address, &kind, timeout, Some(t), http2).await,
                Some(Err(_)) => Err(ProbeFailure::Tls(rondo_core::TlsFailure::Config)),
            };
            (i, r)
        });
    }
    round
}

/// The round's results, each as it comes (`n`: the targets).
async fn finish_round(mut round: JoinSet<Found>, n: usize) -> Vec<Found> {
    let mut results = Vec::with_capacity(n);
    while let Some(done) = round.join_next().await {
        if let Ok(r) = done {
            results.push(r);
        }
    }
    results
}

/// The round's round trips re-rank the cluster; when it `judge`s health, each result counts
/// toward `rise` or `fall`. Returns whether any member's health changed, and the verdicts on
/// shared members.
fn record_round(
    cluster: &ClusterRt,
    members: &[Target],
    results: &[Found],
    check: &HealthCheck,
    judge: bool,
) -> (bool, Vec<Verdict>) {
    let now = crate::clock::now();
    let names: std::collections::HashMap<usize, &str> =
        members.iter().map(|(i, name, _)| (*i, name.as_str())).collect();
    let mut shared = Vec::new();
    let changed = cluster.with(|b| {
        let rtts: Vec<(usize, Option<Duration>)> =
            results.iter().map(|(i, r)| (*i, r.as_ref().ok().copied())).collect();
        b.record_probe_round(&rtts);
        let mut changed = false;
        if !judge {
            return changed;
        }
        for &(i, result) in results {
            let name = names.get(&i).copied().unwrap_or_default();
            changed |= judge_one(b, i, name, result, check, now);
            if cluster.shared_member(i).is_some()
                && let Some(st) = b.states().get(i)
            {
                shared.push((i, st.healthy, result.err()));
            }
        }
        changed
    });
    (changed, shared)
}

/// Counts one check of member `i` (`name`): `rise` passes in a row bring it up, `fall`
/// failures take it down, each logged with why. Returns whether its health changed.
fn judge_one(
    b: &mut rondo_core::Balancer,
    i: usize,
    name: &str,
    result: Result<Duration, ProbeFailure>,
    check: &HealthCheck,
    now: rondo_core::Instant,
) -> bool {
    let in_row = b.count_probe(i, result.is_ok());
    if let Err(why) = result {
        b.note_probe_failure(i, why, now);
    }
    let healthy = b.states().get(i).map(|st| st.healthy);
    if healthy == Some(false) && result.is_ok() && in_row >= check.rise {
        b.set_health(i, true, Actor::HealthCheck, now);
        let reason = format!("{in_row} health check(s) passed in a row");
        // A `&str` field: quoted in text lines, a plain string in JSON ones.
        tracing::info!(
            cluster = %b.spec().name,
            member = %name,
            reason = reason.as_str(),
            "member up"
        );
        true
    } else if healthy == Some(true) && result.is_err() && in_row >= check.fall {
        b.set_health(i, false, Actor::HealthCheck, now);
        let why = result.err().map_or_else(String::new, |w| w.to_string());
        let reason = format!("{in_row} health check(s) failed in a row, the last: {why}");
        tracing::warn!(
            cluster = %b.spec().name,
            member = %name,
            reason = reason.as_str(),
            "member down"
        );
        true
    } else {
        false
    }
}

/// One probe: its round trip, or `None` when it failed.
pub async fn probe(address: &str, kind: &HealthCheckKind, timeout: Duration) -> Option<Duration> {
    check_once(address, kind, timeout).await.ok()
}

/// One probe: its round trip, or why it failed.
pub async fn check_once(
    address: &str,
    kind: &HealthCheckKind,
    timeout: Duration,
) -> Result<Duration, ProbeFailure> {
    check_once_tls(address, kind, timeout, None, false).await
}

/// A client stream of a probe: plain or TLS.
trait ProbeStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> ProbeStream for T {}

/// [`check_once`] over TLS when `tls` is given (the cluster's `upstream_tls`): a TCP check is
/// then a completed handshake, an HTTP check is sent over it. `http2`: an HTTP check speaks
/// HTTP/2 (the cluster's `upstream_protocol`); a gRPC check always does.
pub async fn check_once_tls(
    address: &str,
    kind: &HealthCheckKind,
    timeout: Duration,
    tls: Option<&crate::tls::upstream::UpstreamTlsRt>,
    http2: bool,
) -> Result<Duration, ProbeFailure> {
    let start = Instant::now();
    if let HealthCheckKind::Udp { send, expect } = kind {
        return match tokio::time::timeout(timeout, crate::probe_udp::check(address, send, expect))
            .await
        {
            Ok(Ok(())) => Ok(start.elapsed()),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(ProbeFailure::Timeout),
        };
    }
    let attempt = async {
        let tcp = connect(address).await?;
        let _ = tcp.set_nodelay(true);
        let mut stream: Box<dyn ProbeStream> = match tls {
            None => Box::new(tcp),
            Some(t) => {
                let host = crate::tls::upstream::host_of(address);
                // An HTTP/2 check offers the cluster's ALPN (`h2`), an HTTP/1.1 one none.
                let tls = if http2 || matches!(kind, HealthCheckKind::Grpc { .. }) {
                    t.connect(tcp, host).await
                } else {
                    t.connect_probe(tcp, host).await
                };
                Box::new(tls.map_err(|e| ProbeFailure::Tls(e.why))?)
            }
        };
        match kind {
            // Answered above, without a TCP connection.
            HealthCheckKind::Tcp | HealthCheckKind::Udp { .. } => Ok(()),
            HealthCheckKind::Http { path, expect_min, expect_max } if http2 => {
                let expect = (*expect_min, *expect_max);
                crate::probe_h2::http(stream, address, tls.is_some(), path, expect).await
            }
            HealthCheckKind::Grpc { service } => {
                crate::probe_h2::grpc(stream, address, tls.is_some(), service).await
            }
            HealthCheckKind::Http { path, expect_min, expect_max } => {
                let req = format!(
                    "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: rondo-probe\r\nConnection: close\r\n\r\n"
                );
                stream.write_all(req.as_bytes()).await.map_err(|e| io_failure(&e))?;
                stream.flush().await.map_err(|e| io_failure(&e))?;
                let status = read_status(&mut stream).await?;
                if (*expect_min..=*expect_max).contains(&status) {
                    Ok(())
                } else {
                    Err(ProbeFailure::Status(status))
                }
            }
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => Ok(start.elapsed()),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(ProbeFailure::Timeout),
    }
}

/// Resolves `address` (a failure there is `dns`) and connects to the first of its addresses
/// that accepts.
async fn connect(address: &str) -> Result<TcpStream, ProbeFailure> {
    let addrs: Vec<std::net::SocketAddr> = match address.parse::<std::net::SocketAddr>() {
        Ok(a) => vec![a],
        Err(_) => tokio::net::lookup_host(address).await.map(Iterator::collect).unwrap_or_default(),
    };
    let mut last = ProbeFailure::Dns;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = io_failure(&e),
        }
    }
    Err(last)
}

fn io_failure(e: &std::io::Error) -> ProbeFailure {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => ProbeFailure::Refused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            ProbeFailure::Reset
        }
        K::TimedOut => ProbeFailure::Timeout,
        _ => ProbeFailure::Unreachable,
    }
}

/// Reads up to the end of the status line and returns the status code.
async fn read_status<S: tokio::io::AsyncRead + Unpin + ?Sized>(
    stream: &mut S,
) -> Result<u16, ProbeFailure> {
    let mut buf = [0u8; 256];
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..]).await.map_err(|e| io_failure(&e))?;
        if n == 0 {
            // Closed before a whole status line.
            return Err(ProbeFailure::Reset);
        }
        len += n;
        if let Some(end) = buf[..len].windows(2).position(|w| w == b"\r\n") {
            let line = std::str::from_utf8(&buf[..end]).map_err(|_| ProbeFailure::NotHttp)?;
            let mut parts = line.split(' ');
            let version = parts.next().unwrap_or("");
            if !version.starts_with("HTTP/1.") {
                return Err(ProbeFailure::NotHttp);
            }
            return parts.next().and_then(|s| s.parse().ok()).ok_or(ProbeFailure::NotHttp);
        }
        if len == buf.len() {
            return Err(ProbeFailure::NotHttp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A loopback server that answers every connection with `reply` (then closes), or holds it
    /// open without a word when `reply` is `None`.
    async fn server(reply: Option<&'static [u8]>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, _)) = l.accept().await {
                match reply {
                    Some(r) => {
                        let mut buf = [0u8; 1024];
                        let _ = s.read(&mut buf).await;
                        let _ = s.write_all(r).await;
                    }
                    None => held.push(s),
                }
            }
        });
        addr
    }

    fn http(path: &str) -> HealthCheckKind {
        HealthCheckKind::Http { path: path.into(), expect_min: 200, expect_max: 399 }
    }

    #[tokio::test]
    async fn every_failure_says_why() {
        let t = Duration::from_secs(5);
        let ok = server(Some(b"HTTP/1.1 204 No Content\r\n\r\n")).await;
        assert!(check_once(&ok, &http("/"), t).await.is_ok());
        let unavailable = server(Some(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")).await;
        assert_eq!(check_once(&unavailable, &http("/"), t).await, Err(ProbeFailure::Status(503)));
        let closes = server(Some(b"")).await;
        assert_eq!(check_once(&closes, &http("/"), t).await, Err(ProbeFailure::Reset));
        let smtp = server(Some(b"220 mail ready\r\n")).await;
        assert_eq!(check_once(&smtp, &http("/"), t).await, Err(ProbeFailure::NotHttp));
        let silent = server(None).await;
        let short = Duration::from_millis(200);
        assert_eq!(check_once(&silent, &http("/"), short).await, Err(ProbeFailure::Timeout));
        // Nobody listens: refused (a port just released).
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        assert_eq!(check_once(&dead, &HealthCheckKind::Tcp, t).await, Err(ProbeFailure::Refused));
        // `.invalid` never resolves (RFC 6761).
        let nowhere = "no-such-member.invalid:80";
        assert_eq!(check_once(nowhere, &HealthCheckKind::Tcp, t).await, Err(ProbeFailure::Dns));
        assert_eq!(ProbeFailure::Status(503).to_string(), "status 503");
    }
}
