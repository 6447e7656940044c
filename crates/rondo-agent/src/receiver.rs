//! The router's side: a TCP listener for first contact and a UDP socket (same address and port)
//! for heartbeats, feeding `Balancer::report_agent`, plus a watcher that logs members becoming
//! unavailable or available again and agent algorithms falling back to least-sessions.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rondo_core::load::AgentReport;
use rondo_core::{AdminState, Algorithm};
use rondo_runtime::metrics::{Counter, Metrics};
use rondo_runtime::{Live, clock};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

use crate::wire::{self, HelloError, Key, WireError};

/// How the receiver runs.
#[derive(Debug, Clone)]
pub struct ReceiverOpts {
    /// TCP and UDP address (one port number for both).
    pub listen: SocketAddr,
    /// The shared key.
    pub key: Key,
    /// Heartbeat interval the agents are told to use.
    pub interval: Duration,
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
            unknown_member: g(&self.unknown_member),
            hellos: g(&self.hellos),
            hellos_refused: g(&self.hellos_refused),
        }
    }
}

/// State shared by the receiver's tasks.
#[derive(Debug)]
struct Shared {
    live: Arc<Live>,
    key: Key,
    interval: Duration,
    counters: Counters,
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
/// hello, heartbeat and watcher tasks.
pub async fn start(opts: ReceiverOpts, live: Arc<Live>) -> io::Result<Receiver> {
    let tcp = TcpListener::bind(opts.listen).await?;
    let addr = tcp.local_addr()?;
    let udp = UdpSocket::bind(addr).await?;
    let counters = Counters::new(&live.metrics);
    let shared = Arc::new(Shared {
        live,
        key: opts.key,
        interval: opts.interval,
        counters,
        last_seq: Mutex::new(HashMap::new()),
    });
    let tasks = vec![
        tokio::spawn(accept_loop(tcp, shared.clone())),
        tokio::spawn(udp_loop(udp, shared.clone())),
        tokio::spawn(watch_loop(shared.clone())),
    ];
    Ok(Receiver { addr, shared, tasks })
}

async fn accept_loop(tcp: TcpListener, shared: Arc<Shared>) {
    loop {
        match tcp.accept().await {
            Ok((stream, peer)) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let hello =
                        tokio::time::timeout(Duration::from_secs(5), hello(stream, &shared));
                    if let Ok(Err(e)) = hello.await {
                        tracing::debug!(%peer, "agent hello: {e}");
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
async fn hello(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    // Bounded: a hello is short.
    let mut r = BufReader::new(r.take(1024));
    r.read_line(&mut line).await?;
    let answer = match wire::parse_hello(&line, &shared.key) {
        Err(HelloError::BadKey) => Err("ERR bad key\n".to_owned()),
        Err(HelloError::Malformed) => Err("ERR malformed hello\n".to_owned()),
        Ok((cluster, member)) => {
            let snap = shared.live.load();
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
                tracing::info!(%cluster, %member, "agent said hello");
                Ok(format!("OK {} {next}\n", shared.interval.as_millis()))
            } else {
                Err(format!("ERR unknown member {cluster}/{member}\n"))
            }
        }
    };
    let text = match answer {
        Ok(ok) => {
            bump(&shared.counters.hellos);
            ok
        }
        Err(err) => {
            bump(&shared.counters.hellos_refused);
            tracing::warn!("agent hello refused: {}", err.trim_end());
            err
        }
    };
    w.write_all(text.as_bytes()).await?;
    w.shutdown().await
}

async fn udp_loop(udp: UdpSocket, shared: Arc<Shared>) {
    let mut buf = vec![0u8; wire::MAX_DATAGRAM + 1];
    loop {
        let n = match udp.recv_from(&mut buf).await {
            Ok((n, _)) => n,
            Err(e) => {
                // ICMP errors and the like: nothing to do but go on.
                tracing::debug!("agent socket: {e}");
                continue;
            }
        };
        handle_datagram(&buf[..n], &shared);
    }
}

fn handle_datagram(d: &[u8], shared: &Shared) {
    let c = &shared.counters;
    let hb = match wire::decode(d, &shared.key) {
        Ok(hb) => hb,
        Err(e) => {
            bump(match e {
                WireError::BadMac => &c.bad_mac,
                WireError::Truncated { .. } | WireError::Trailing { .. } => &c.truncated,
                WireError::BadMagic | WireError::UnsupportedVersion(_) => &c.bad_version,
                WireError::Malformed(_) | WireError::NameTooLong(_) => &c.malformed,
            });
            tracing::debug!("heartbeat dropped: {e}");
            return;
        }
    };
    let snap = shared.live.load();
    let Some(rt) = snap.clusters.get(&hb.cluster) else {
        bump(&c.unknown_member);
        return;
    };
    let Some(idx) = rt.with(|b| b.member_index(&hb.member)) else {
        bump(&c.unknown_member);
        return;
    };
    {
        let mut last = shared.last_seq.lock().unwrap_or_else(|e| e.into_inner());
        let key = (hb.cluster, hb.member);
        match last.get_mut(&key) {
            Some(s) if hb.seq <= *s => {
                drop(last);
                bump(&c.replayed);
                return;
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
    bump(&c.accepted);
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
        let snap = shared.live.load();
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
