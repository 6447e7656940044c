//! The member's side (`rondo agent`): says hello to every router over TCP (retrying with
//! backoff until it answers `OK`), then sends each one a UDP heartbeat every interval, even when
//! nothing changed, with an increasing sequence number and the router's epoch from its `OK`.
//! A router that restarted answers those heartbeats with [`wire::STALE_EPOCH`]; the agent then
//! says hello again (at most once per [`REHELLO_PAUSE`]).
//!
//! A refused key is not a passing failure: the agent logs it at `error` naming the fix and
//! backs off far longer (from [`KEY_BACKOFF_START`], doubling, at most [`MAX_KEY_BACKOFF`]) than
//! for a router that is down or still starting.
//!
//! Measurements (Linux): CPU use from `/proc/stat` deltas between heartbeats, free memory from
//! `/proc/meminfo`'s `MemAvailable`. Elsewhere, or when a file cannot be read, 0. Both can be
//! fixed from the command line (tests, or members that measure themselves differently).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rondo_core::{Entropy, SplitMix64};
use rondo_runtime::tls::client::ClientTls;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UdpSocket};

use crate::wire::{self, Heartbeat, HelloOk, Key};

/// Interval when neither the command line nor a router says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);
/// Longest wait between two hello attempts (router down, unknown member, ...).
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// First wait after a router refused the key.
pub const KEY_BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest wait between two hellos with a refused key: it will not fix itself, and every try
/// is a warning in the router's log.
pub const MAX_KEY_BACKOFF: Duration = Duration::from_secs(60);
/// Shortest time between two hellos to one router after a stale-epoch notice (notices are not
/// authenticated: a flood of them must not turn into a flood of hellos).
pub const REHELLO_PAUSE: Duration = Duration::from_secs(1);

/// What the agent does.
#[derive(Debug, Clone)]
pub struct AgentOpts {
    /// Each router's agent address, `host:port` (TCP for hello, UDP for heartbeats).
    pub report_to: Vec<String>,
    /// The member's cluster.
    pub cluster: String,
    /// The member's name in that cluster.
    pub member: String,
    /// The shared key.
    pub key: Key,
    /// Heartbeat interval; `None` takes the router's (its `[agent] interval_ms`). When both
    /// are known, the shorter one is used, so the router never sees fewer heartbeats than it
    /// expects.
    pub interval: Option<Duration>,
    /// Sessions reported (static).
    pub sessions: u32,
    /// Report this CPU use (0..=1) instead of measuring it.
    pub fixed_cpu: Option<f32>,
    /// Report this much free memory (bytes) instead of measuring it.
    pub fixed_mem: Option<u64>,
    /// Fault injection for tests: skip this percentage of heartbeats, chosen by a generator
    /// seeded from the cluster and member names (0 = none).
    pub drop_percent: u8,
    /// TLS to the routers' first-contact listeners (their `[agent] tls`), when set.
    pub tls: Option<ClientTls>,
}

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nothing to report to.
    #[error("no router to report to (--report-to)")]
    NoRouter,
    /// A name that cannot be sent.
    #[error("invalid {0} name `{1}`: 1 to 255 bytes, no white space")]
    BadName(&'static str, String),
    /// A CPU figure out of range.
    #[error("fixed cpu {0} is outside 0..=1")]
    BadCpu(f32),
    /// A percentage over 100.
    #[error("drop percent {0} is over 100")]
    BadDrop(u8),
}

/// Runs the agent until the task is cancelled; returns early only for invalid options.
pub async fn run(opts: AgentOpts) -> Result<(), AgentError> {
    if opts.report_to.is_empty() {
        return Err(AgentError::NoRouter);
    }
    for (what, n) in [("cluster", &opts.cluster), ("member", &opts.member)] {
        if n.is_empty() || n.len() > wire::MAX_NAME || n.chars().any(char::is_whitespace) {
            return Err(AgentError::BadName(what, n.clone()));
        }
    }
    if let Some(c) = opts.fixed_cpu
        && !(0.0..=1.0).contains(&c)
    {
        return Err(AgentError::BadCpu(c));
    }
    if opts.drop_percent > 100 {
        return Err(AgentError::BadDrop(opts.drop_percent));
    }
    let opts = Arc::new(opts);
    let sample = Arc::new(Mutex::new(Sample::default()));
    let sampler = tokio::spawn(sample_loop(opts.clone(), sample.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    for router in opts.report_to.clone() {
        tasks.spawn(router_loop(router, opts.clone(), sample.clone()));
    }
    while tasks.join_next().await.is_some() {}
    sampler.abort();
    Ok(())
}

/// The latest measurement.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    cpu_used: f32,
    mem_free: u64,
}

async fn sample_loop(opts: Arc<AgentOpts>, out: Arc<Mutex<Sample>>) {
    let mut prev = read_cpu_times();
    let mut tick =
        tokio::time::interval(opts.interval.unwrap_or(DEFAULT_INTERVAL).min(DEFAULT_INTERVAL));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let cur = read_cpu_times();
        let measured = match (prev, cur) {
            (Some((t0, i0)), Some((t1, i1))) if t1 > t0 => {
                let busy = (t1 - t0).saturating_sub(i1.saturating_sub(i0));
                (busy as f64 / (t1 - t0) as f64).clamp(0.0, 1.0) as f32
            }
            _ => 0.0,
        };
        prev = cur.or(prev);
        let s = Sample {
            cpu_used: opts.fixed_cpu.unwrap_or(measured),
            mem_free: opts.fixed_mem.unwrap_or_else(|| read_mem_available().unwrap_or(0)),
        };
        *out.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }
}

/// (total, idle) jiffies from `/proc/stat`'s first line.
fn read_cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_times(text.lines().next()?)
}

fn parse_cpu_times(line: &str) -> Option<(u64, u64)> {
    let mut parts = line.split_whitespace();
    if parts.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let v: Vec<u64> = parts.take(8).map(|p| p.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((v.iter().sum(), idle))
}

/// `MemAvailable` from `/proc/meminfo`, bytes.
fn read_mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_mem_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Hello until `OK`, then heartbeats until the router says its epoch changed; again, forever.
async fn router_loop(router: String, opts: Arc<AgentOpts>, sample: Arc<Mutex<Sample>>) {
    // Drops (fault injection) follow a generator seeded by the names: the same pattern every
    // run, so a test that relies on it is reproducible.
    let names = format!("{}/{}", opts.cluster, opts.member);
    let mut rng = SplitMix64::new(rondo_core::hash::hash_key(names.as_bytes()));
    let mut seq = 0u64;
    let mut last_hello: Option<tokio::time::Instant> = None;
    loop {
        if let Some(at) = last_hello {
            tokio::time::sleep_until(at + REHELLO_PAUSE).await;
        }
        last_hello = Some(tokio::time::Instant::now());
        let (addr, ok) = hello_until_ok(&router, &opts).await;
        let interval = Duration::from_millis(ok.interval_ms);
        let interval =
            opts.interval.map_or(interval, |own| own.min(interval)).max(Duration::from_millis(1));
        // Start above anything an earlier run of this agent sent (time in microseconds) and
        // above what the router last accepted, so a restart never looks like a replay.
        seq = seq.max(unix_micros()).max(ok.next_seq);
        let local: SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let sock = loop {
            match UdpSocket::bind(local).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(%router, "cannot open a UDP socket: {e}");
                    tokio::time::sleep(MAX_BACKOFF).await;
                }
            }
        };
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut notice = [0u8; 16];
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                got = sock.recv_from(&mut notice) => {
                    // Only the router's own address, and only the notice, count.
                    match got {
                        Ok((n, from)) if from == addr && notice[..n] == wire::STALE_EPOCH[..] => {
                            tracing::info!(%router, "the router refused a heartbeat of an earlier epoch (it restarted): saying hello again");
                            break;
                        }
                        Ok(_) => {}
                        // An error that repeats at once must not spin: heartbeats go on.
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                    continue;
                }
            }
            seq += 1;
            if opts.drop_percent > 0 && rng.next_u64() % 100 < u64::from(opts.drop_percent) {
                continue;
            }
            let s = *sample.lock().unwrap_or_else(|e| e.into_inner());
            let hb = Heartbeat {
                epoch: ok.epoch,
                cluster: opts.cluster.clone(),
                member: opts.member.clone(),
                seq,
                cpu_used: s.cpu_used,
                mem_free: s.mem_free,
                sessions: opts.sessions,
            };
            let Ok(d) = wire::encode(&hb, &opts.key) else {
                return; // names were checked in `run`
            };
            if let Err(e) = sock.send_to(&d, addr).await {
                tracing::debug!(%router, "heartbeat not sent: {e}");
            }
        }
    }
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Why one hello did not get an `OK`.
#[derive(Debug)]
enum HelloFailure {
    /// The router answered `ERR bad key`.
    KeyRefused,
    /// Anything else: the router's `ERR`, no connection, no answer.
    Other(String),
}

/// Says hello to `router` until it answers `OK`; returns its address and what it said.
async fn hello_until_ok(router: &str, opts: &AgentOpts) -> (SocketAddr, HelloOk) {
    let mut backoff = Duration::from_millis(100);
    let mut key_backoff = KEY_BACKOFF_START;
    loop {
        let wait = match hello_once(router, opts).await {
            Ok((addr, ok)) => {
                tracing::info!(%router, interval_ms = ok.interval_ms, "router accepted the agent");
                return (addr, ok);
            }
            Err(HelloFailure::KeyRefused) => {
                let wait = key_backoff;
                tracing::error!(
                    %router,
                    cluster = %opts.cluster,
                    member = %opts.member,
                    "the router refused this agent's key (ERR bad key): --key or --key-file must \
                     hold the router's [agent] key; trying again in {} s",
                    wait.as_secs()
                );
                key_backoff = (key_backoff * 2).min(MAX_KEY_BACKOFF);
                wait
            }
            Err(HelloFailure::Other(e)) => {
                let wait = backoff;
                tracing::warn!(%router, "hello refused or failed: {e}; retrying in {} ms", wait.as_millis());
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

async fn hello_once(router: &str, opts: &AgentOpts) -> Result<(SocketAddr, HelloOk), HelloFailure> {
    let other = HelloFailure::Other;
    let addr = tokio::net::lookup_host(router)
        .await
        .map_err(|e| other(format!("cannot resolve {router}: {e}")))?
        .next()
        .ok_or_else(|| other(format!("{router} has no address")))?;
    let exchange = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let line = wire::hello_line(&opts.cluster, &opts.member, &opts.key);
        match &opts.tls {
            None => exchange_line(stream, &line).await,
            Some(tls) => exchange_line(tls.connect(stream, router).await?, &line).await,
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| other("no answer within 5 s".to_owned()))?
        .map_err(other)?;
    if answer.is_empty() {
        return Err(other("connection closed without an answer".to_owned()));
    }
    match wire::parse_ok(&answer, &opts.cluster, &opts.member, &opts.key) {
        Ok(ok) => Ok((addr, ok)),
        Err(e) if e == "bad key" => Err(HelloFailure::KeyRefused),
        Err(e) => Err(other(e)),
    }
}

/// Sends the hello `line` and reads the one-line answer (at most 1 KiB).
async fn exchange_line<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    line: &str,
) -> Result<String, String> {
    stream.write_all(line.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
    stream.flush().await.map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    BufReader::new(stream.take(1024))
        .read_line(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let line = "cpu  100 5 50 800 20 3 2 0 0 0";
        assert_eq!(parse_cpu_times(line), Some((980, 820)));
        assert_eq!(parse_cpu_times("cpu0 1 2 3 4"), None);
        assert_eq!(parse_cpu_times("cpu x"), None);
        let mem = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_mem_available(mem), Some(8_000_000 * 1024));
        assert_eq!(parse_mem_available("MemFree: 1 kB"), None);
    }

    #[tokio::test]
    async fn invalid_options_are_refused() {
        let base = AgentOpts {
            report_to: vec!["127.0.0.1:1".into()],
            cluster: "c".into(),
            member: "m".into(),
            key: Key::new(b"k"),
            interval: None,
            sessions: 0,
            fixed_cpu: None,
            fixed_mem: None,
            drop_percent: 0,
            tls: None,
        };
        let r = run(AgentOpts { report_to: vec![], ..base.clone() }).await;
        assert!(matches!(r, Err(AgentError::NoRouter)));
        let r = run(AgentOpts { member: "a b".into(), ..base.clone() }).await;
        assert!(matches!(r, Err(AgentError::BadName("member", _))));
        let r = run(AgentOpts { fixed_cpu: Some(1.5), ..base.clone() }).await;
        assert!(matches!(r, Err(AgentError::BadCpu(_))));
        let r = run(AgentOpts { drop_percent: 101, ..base }).await;
        assert!(matches!(r, Err(AgentError::BadDrop(101))));
    }
}
