//! The router's side: a TCP listener for first contact and a UDP socket (same address and port)
//! for heartbeats, feeding `Balancer::report_agent`, plus a watcher that logs members becoming
//! unavailable or available again and agent algorithms falling back to least-sessions.
//!
//! Every receiver draws a random epoch when it starts, names it in its `OK` answers and refuses
//! heartbeats of another epoch (a restart forgets the last sequence numbers, the epoch makes
//! the datagrams captured before it worthless). Every refusal is logged with the member the
//! message claims to be from and its source address, at most [`LOG_BURST`] lines per kind of
//! refusal per [`LOG_WINDOW`] (a flood of bad datagrams cannot fill the log; the next line says
//! how many were left out).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rondo_core::load::AgentReport;
use rondo_core::{AdminState, Algorithm};
use rondo_runtime::metrics::{Counter, Metrics};
use rondo_runtime::sockets::Sockets;
use rondo_runtime::tls::server::TlsServer;
use rondo_runtime::{Views, clock};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;

use crate::wire::{self, HelloError, Key, WireError};

/// Most log lines per kind of refusal in one [`LOG_WINDOW`].
pub const LOG_BURST: u32 = 5;
/// The window [`LOG_BURST`] counts in.
pub const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Most [`wire::STALE_EPOCH`] answers per second, all agents together (they are answers to
/// authenticated datagrams, but a captured one can be replayed from a spoofed address).
const STALE_NOTICES_PER_SECOND: u32 = 100;

/// How the receiver runs.
#[derive(Debug, Clone)]
pub struct ReceiverOpts {
    /// TCP and UDP address (one port number for both).
    pub listen: SocketAddr,
    /// The shared key.
    pub key: Key,
    /// Heartbeat interval the agents are told to use.
    pub interval: Duration,
    /// TLS on the first contact's TCP listener (`[agent] tls`); heartbeats stay UDP.
    pub tls: Option<Arc<TlsServer>>,
    /// The epoch and last sequence numbers of the process this one replaces (a hitless
    /// upgrade): agents then go on without a new hello, and no heartbeat can be replayed.
    pub resume: Option<Resume>,
}

/// What a receiver hands to the receiver of the process that replaces it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resume {
    /// The epoch.
    pub epoch: u64,
    /// The last sequence number accepted, by cluster and member.
    pub last_seq: Vec<(String, String, u64)>,
}

/// What the receiver counted since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Heartbeats applied to a member.
    pub accepted: u64,
    /// Datagrams whose MAC did not match (wrong key or altered).
    pub bad_mac: u64,
    /// Datagrams shorter (or longer) than their own lengths say.
    pub truncated: u64,
    /// Datagrams that are not heartbeats (bad magic) or of another version.
    pub bad_version: u64,
    /// Authenticated datagrams with invalid fields (non-UTF-8 names, CPU outside 0..=1).
    pub malformed: u64,
    /// Sequence numbers not above the member's last one.
    pub replayed: u64,
    /// Authenticated heartbeats for another epoch (sent to an earlier run of this router).
    pub stale_epoch: u64,
    /// Authenticated heartbeats for a cluster or member the current view does not have.
    pub unknown_member: u64,
    /// Hellos answered `OK`.
    pub hellos: u64,
    /// Hellos refused (bad key, unknown member, malformed).
    pub hellos_refused: u64,
}

/// The receiver's counters: the process's `rondo_agent_messages_total` series, so `/metrics`
/// shows them.
#[derive(Debug)]
struct Counters {
    accepted: Counter,
    bad_mac: Counter,
    truncated: Counter,
    bad_version: Counter,
    malformed: Counter,
    replayed: Counter,
    stale_epoch: Counter,
    unknown_member: Counter,
    hellos: Counter,
    hellos_refused: Counter,
}

fn bump(c: &Counter) {
    c.inc();
}

impl Counters {
    fn new(m: &Metrics) -> Counters {
        let hb = |result| m.agent_counter("heartbeat", result);
        Counters {
            accepted: hb("accepted"),
            bad_mac: hb("bad_mac"),
            truncated: hb("truncated"),
            bad_version: hb("bad_version"),
            malformed: hb("malformed"),
            replayed: hb("replayed"),
            stale_epoch: hb("stale_epoch"),
            unknown_member: hb("unknown_member"),
            hellos: m.agent_counter("hello", "accepted"),
            hellos_refused: m.agent_counter("hello", "refused"),
        }
    }

    fn snapshot(&self) -> ReceiverStats {
        let g = |c: &Counter| c.get();
        ReceiverStats {
            accepted: g(&self.accepted),
            bad_mac: g(&self.bad_mac),
            truncated: g(&self.truncated),
            bad_version: g(&self.bad_version),
            malformed: g(&self.malformed),
            replayed: g(&self.replayed),
            stale_epoch: g(&self.stale_epoch),
            unknown_member: g(&self.unknown_member),
            hellos: g(&self.hellos),
            hellos_refused: g(&self.hellos_refused),
        }
    }
}

/// At most `burst` events per `window` and key; counts what it held back.
#[derive(Debug)]
struct Limiter {
    burst: u32,
    window: Duration,
    /// Key -> (window start, events let through, events held back).
    state: Mutex<HashMap<&'static str, (Instant, u32, u64)>>,
}

impl Limiter {
    fn new(burst: u32, window: Duration) -> Limiter {
        Limiter { burst, window, state: Mutex::new(HashMap::new()) }
    }

    /// `Some(held back in the previous window)` when this event may go through.
    fn allow(&self, key: &'static str) -> Option<u64> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (start, passed, held) = state.entry(key).or_insert((now, 0, 0));
        if now.duration_since(*start) >= self.window {
            let before = std::mem::take(held);
            (*start, *passed) = (now, 1);
            return Some(before);
        }
        if *passed < self.burst {
            *passed += 1;
            Some(0)
        } else {
            *held += 1;
            None
        }
    }
}

/// State shared by the receiver's tasks.
#[derive(Debug)]
struct Shared {
    /// The view whose members the reports are about.
    views: Views,
    key: Key,
    interval: Duration,
    /// This run's epoch (random): heartbeats must carry it.
    epoch: u64,
    counters: Counters,
    /// Refusal log lines, per kind.
    log_limit: Limiter,
    /// Stale-epoch answers, all together.
    notice_limit: Limiter,
    /// Last accepted sequence number per (cluster, member); kept across view swaps.
    last_seq: Mutex<HashMap<(String, String), u64>>,
}

/// A running receiver; its tasks stop when it is dropped.
#[derive(Debug)]
pub struct Receiver {
    /// The bound address (TCP and UDP).
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Receiver {
    /// The counters so far.
    pub fn stats(&self) -> ReceiverStats {
        self.shared.counters.snapshot()
    }

    /// This run's epoch (named in every `OK`, required in every heartbeat).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// The epoch and last sequence numbers, for the process that replaces this one.
    pub fn resume(&self) -> Resume {
        let last = self.shared.last_seq.lock().unwrap_or_else(|e| e.into_inner());
        let last_seq = last.iter().map(|((c, m), s)| (c.clone(), m.clone(), *s)).collect();
        Resume { epoch: self.shared.epoch, last_seq }
    }

    /// Stops every task.
    pub fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds the TCP listener, then a UDP socket on the same address and port, and starts the
/// hello, heartbeat and watcher tasks, applying the reports to `views` (counted in `metrics`;
/// the sockets bound through `sockets`).
pub async fn start(
    opts: ReceiverOpts,
    views: Views,
    metrics: &Metrics,
    sockets: &Sockets,
) -> io::Result<Receiver> {
    let tcp = sockets.tcp_listener("agent tcp", opts.listen)?;
    let addr = tcp.local_addr()?;
    // With port 0, the UDP socket takes the TCP listener's port (one number for both).
    let udp = sockets.udp("agent udp", opts.listen, addr).await?;
    let (epoch, last_seq) = match opts.resume {
        Some(r) => {
            let last = r.last_seq.into_iter().map(|(c, m, s)| ((c, m), s)).collect();
            (r.epoch, last)
        }
        None => (random_epoch()?, HashMap::new()),
    };
    let counters = Counters::new(metrics);
    let shared = Arc::new(Shared {
        views,
        key: opts.key,
        interval: opts.interval,
        epoch,
        counters,
        log_limit: Limiter::new(LOG_BURST, LOG_WINDOW),
        notice_limit: Limiter::new(STALE_NOTICES_PER_SECOND, Duration::from_secs(1)),
        last_seq: Mutex::new(last_seq),
    });
    tracing::debug!(epoch = shared.epoch, "agent receiver epoch");
    let mut tasks = vec![
        tokio::spawn(accept_loop(tcp, opts.tls.clone(), shared.clone())),
        tokio::spawn(udp_loop(Arc::new(udp), shared.clone())),
        tokio::spawn(watch_loop(shared.clone())),
    ];
    if let Some(tls) = opts.tls {
        tasks.push(tls.spawn_watch());
    }
    Ok(Receiver { addr, shared, tasks })
}

/// A fresh epoch from the system's random source: two runs of a router never share one (a
/// clock could repeat after a reset; 64 random bits do not in practice).
fn random_epoch() -> io::Result<u64> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 8];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| io::Error::other("no random source for the agent epoch"))?;
    Ok(u64::from_be_bytes(bytes))
}

/// A claimed (unauthenticated) name as it may be logged: control characters escaped, at most
/// 64 characters.
fn shown(name: &str) -> String {
    let mut out: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    if name.chars().count() > 64 {
        out.push_str("...");
    }
    out
}

/// Logs a refusal at `warn` with who claimed to send it, unless this kind already logged
/// [`LOG_BURST`] lines in the current window.
fn log_refusal(
    shared: &Shared,
    kind: &'static str,
    peer: SocketAddr,
    names: Option<(&str, &str)>,
    reason: &str,
) {
    let Some(held_back) = shared.log_limit.allow(kind) else { return };
    let (cluster, member) = names.map_or(("?".into(), "?".into()), |(c, m)| (shown(c), shown(m)));
    if held_back > 0 {
        tracing::warn!(%peer, %cluster, %member, kind, suppressed = held_back,
            "agent {reason} (and {held_back} more of this kind not logged in the last {} s)",
            LOG_WINDOW.as_secs());
    } else {
        tracing::warn!(%peer, %cluster, %member, kind, "agent {reason}");
    }
}

async fn accept_loop(tcp: TcpListener, tls: Option<Arc<TlsServer>>, shared: Arc<Shared>) {
    loop {
        match tcp.accept().await {
            Ok((stream, peer)) => {
                let shared = shared.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    // The handshake and the hello together within the hello's time.
                    let contact = async {
                        match &tls {
                            None => hello(stream, peer, &shared).await,
                            Some(tls) => {
                                let stream = tls.accept(stream).await.map_err(io::Error::other)?;
                                hello(stream, peer, &shared).await
                            }
                        }
                    };
                    match tokio::time::timeout(Duration::from_secs(5), contact).await {
                        Ok(Err(e)) => tracing::debug!(%peer, "agent hello: {e}"),
                        Err(_) => tracing::debug!(%peer, "agent hello: no hello within 5 s"),
                        Ok(Ok(())) => {}
                    }
                });
            }
            Err(e) => {
                tracing::warn!("agent listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One first contact: read one line, answer one line, close.
async fn hello<S>(stream: S, peer: SocketAddr, shared: &Shared) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut line = String::new();
    // Bounded: a hello is short.
    let mut r = BufReader::new(r.take(1024));
    r.read_line(&mut line).await?;
    let claimed = wire::claimed_hello(&line);
    let answer = match wire::parse_hello(&line, &shared.key) {
        Err(HelloError::BadKey) => Err(("bad_key", "ERR bad key\n".to_owned())),
        Err(HelloError::Malformed) => Err(("malformed_hello", "ERR malformed hello\n".to_owned())),
        Ok((cluster, member)) => {
            let snap = shared.views.load();
            let known = snap
                .clusters
                .get(&cluster)
                .is_some_and(|rt| rt.with(|b| b.member_index(&member).is_some()));
            if known {
                let next = shared
                    .last_seq
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&(cluster.clone(), member.clone()))
                    .map_or(0, |s| s.saturating_add(1));
                tracing::info!(%cluster, %member, %peer, "agent accepted");
                let ok = wire::HelloOk {
                    interval_ms: shared.interval.as_millis().max(1) as u64,
                    next_seq: next,
                    epoch: shared.epoch,
                };
                Ok(wire::ok_line(&cluster, &member, &ok, &shared.key))
            } else {
                Err(("unknown_member", format!("ERR unknown member {cluster}/{member}\n")))
            }
        }
    };
    let text = match answer {
        Ok(ok) => {
            bump(&shared.counters.hellos);
            ok
        }
        Err((kind, err)) => {
            bump(&shared.counters.hellos_refused);
            let names = claimed.as_ref().map(|(c, m)| (c.as_str(), m.as_str()));
            let reason = match kind {
                "bad_key" => "refused: wrong key (its hello's tag does not match [agent] key)",
                "unknown_member" => "refused: no such cluster or member in the current view",
                _ => "refused: malformed hello",
            };
            log_refusal(shared, kind, peer, names, reason);
            err
        }
    };
    w.write_all(text.as_bytes()).await?;
    w.shutdown().await
}

async fn udp_loop(udp: Arc<UdpSocket>, shared: Arc<Shared>) {
    let mut buf = vec![0u8; wire::MAX_DATAGRAM + 1];
    loop {
        let (n, peer) = match udp.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                // ICMP errors and the like: nothing to do but go on.
                tracing::debug!("agent socket: {e}");
                continue;
            }
        };
        if handle_datagram(&buf[..n], peer, &shared) == Verdict::StaleEpoch
            && shared.notice_limit.allow("stale_epoch").is_some()
        {
            // Best effort: a lost notice is made up for by the next heartbeat's.
            let _ = udp.try_send_to(wire::STALE_EPOCH, peer);
        }
    }
}

/// What became of one datagram (beyond the counters).
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Accepted,
    StaleEpoch,
    Refused,
}

fn handle_datagram(d: &[u8], peer: SocketAddr, shared: &Shared) -> Verdict {
    let c = &shared.counters;
    let hb = match wire::decode(d, &shared.key) {
        Ok(hb) => hb,
        Err(e) => {
            let (counter, kind) = match e {
                WireError::BadMac => (&c.bad_mac, "bad_mac"),
                WireError::Truncated { .. } | WireError::Trailing { .. } => {
                    (&c.truncated, "truncated")
                }
                WireError::BadMagic | WireError::UnsupportedVersion(_) => {
                    (&c.bad_version, "bad_version")
                }
                WireError::Malformed(_) | WireError::NameTooLong(_) => (&c.malformed, "malformed"),
            };
            bump(counter);
            let names = wire::claimed_names(d);
            let names = names.as_ref().map(|(c, m)| (c.as_str(), m.as_str()));
            let reason = if e == WireError::BadMac {
                "heartbeat refused: bad mac (wrong key or altered)".to_owned()
            } else {
                format!("heartbeat refused: {e}")
            };
            log_refusal(shared, kind, peer, names, &reason);
            return Verdict::Refused;
        }
    };
    let names = Some((hb.cluster.as_str(), hb.member.as_str()));
    if hb.epoch != shared.epoch {
        bump(&c.stale_epoch);
        let reason = "heartbeat refused: another epoch (sent to an earlier run of this router, \
                      or replayed); asking the agent to say hello again";
        log_refusal(shared, "stale_epoch", peer, names, reason);
        return Verdict::StaleEpoch;
    }
    let snap = shared.views.load();
    let found = snap
        .clusters
        .get(&hb.cluster)
        .and_then(|rt| rt.with(|b| b.member_index(&hb.member)).map(|i| (rt, i)));
    let Some((rt, idx)) = found else {
        bump(&c.unknown_member);
        let reason = "heartbeat refused: no such cluster or member in the current view";
        log_refusal(shared, "unknown_member", peer, names, reason);
        return Verdict::Refused;
    };
    {
        let mut last = shared.last_seq.lock().unwrap_or_else(|e| e.into_inner());
        let key = (hb.cluster.clone(), hb.member.clone());
        match last.get_mut(&key) {
            Some(s) if hb.seq <= *s => {
                drop(last);
                bump(&c.replayed);
                let reason = "heartbeat refused: sequence number not above the last (replayed)";
                log_refusal(shared, "replayed", peer, names, reason);
                return Verdict::Refused;
            }
            Some(s) => *s = hb.seq,
            None => {
                last.insert(key, hb.seq);
            }
        }
    }
    let report = AgentReport {
        cpu_used: hb.cpu_used,
        mem_free: hb.mem_free,
        sessions: hb.sessions,
        seq: hb.seq,
        at: clock::now(),
    };
    rt.with(|b| b.report_agent(idx, report));
    // A shared member's report is its report in every cluster that lists it.
    rt.share_agent_report(idx, report);
    bump(&c.accepted);
    Verdict::Accepted
}

/// Every interval: logs each member whose agent falls silent past the timeout (unavailable) or
/// reports again (available), and each `least-cpu` / `most-free-memory` cluster that starts or
/// stops falling back to least-sessions because a member has no fresh report. One line per
/// transition.
async fn watch_loop(shared: Arc<Shared>) {
    // (cluster, member) -> fresh; cluster -> members without a fresh report.
    let mut fresh: HashMap<(String, String), bool> = HashMap::new();
    let mut fallback: HashMap<String, bool> = HashMap::new();
    let mut tick = tokio::time::interval(shared.interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let snap = shared.views.load();
        let now = clock::now();
        for (cname, rt) in &snap.clusters {
            let agent_algo =
                matches!(rt.spec.policy.algorithm, Algorithm::LeastCpu | Algorithm::MostFreeMemory);
            let (changes, missing) = rt.with(|b| {
                let policy = &b.spec().policy;
                let mut changes = Vec::new();
                let mut missing = Vec::new();
                for (i, st) in b.states().iter().enumerate() {
                    let name = &b.spec().members[i].name;
                    let now_fresh = st.load.agent.map(|r| r.is_fresh(now, policy.agent.timeout));
                    if let Some(f) = now_fresh {
                        let was = fresh.insert((cname.clone(), name.clone()), f);
                        if was != Some(f) && (was.is_some() || !f) {
                            changes.push((name.clone(), f));
                        }
                    }
                    if agent_algo
                        && st.admin != AdminState::Disabled
                        && now_fresh.is_none()
                        && st.is_healthy(now, policy)
                    {
                        missing.push(name.clone());
                    }
                }
                (changes, missing)
            });
            if !changes.is_empty() {
                rt.state_changed();
            }
            for (member, up) in changes {
                if up {
                    tracing::warn!(cluster = %cname, %member, "member available again: agent heartbeats resumed");
                } else {
                    tracing::warn!(
                        cluster = %cname,
                        %member,
                        timeout_ms = rt.spec.policy.agent.timeout.as_millis() as u64,
                        "member unavailable: agent heartbeats missed"
                    );
                }
            }
            if agent_algo {
                let falling = !missing.is_empty();
                let was = fallback.insert(cname.clone(), falling).unwrap_or(false);
                if falling && !was {
                    tracing::warn!(
                        cluster = %cname,
                        algorithm = rt.spec.policy.algorithm.as_str(),
                        members = %missing.join(", "),
                        "falling back to least-sessions: no fresh agent report"
                    );
                } else if !falling && was {
                    tracing::warn!(
                        cluster = %cname,
                        algorithm = rt.spec.policy.algorithm.as_str(),
                        "agent reports complete again: no longer falling back"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_lets_a_burst_through_per_window_and_counts_the_rest() {
        let l = Limiter::new(2, Duration::from_millis(50));
        assert_eq!(
            [l.allow("a"), l.allow("a"), l.allow("a"), l.allow("a")],
            [Some(0), Some(0), None, None]
        );
        // Kinds are counted apart.
        assert_eq!(l.allow("b"), Some(0));
        std::thread::sleep(Duration::from_millis(60));
        // The next window's first event says how many the last one held back.
        assert_eq!(l.allow("a"), Some(2));
        assert_eq!(l.allow("a"), Some(0));
        assert_eq!(l.allow("a"), None);
        assert_eq!(shown("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(shown(&"x".repeat(100)), format!("{}...", "x".repeat(64)));
    }
}
