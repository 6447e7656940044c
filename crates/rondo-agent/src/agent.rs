//! The member's side (`rondo agent`): says hello to every router over TCP (retrying with
//! backoff until it answers `OK`), then sends each one a UDP heartbeat every interval, even when
//! nothing changed, with an increasing sequence number.
//!
//! Measurements (Linux): CPU use from `/proc/stat` deltas between heartbeats, free memory from
//! `/proc/meminfo`'s `MemAvailable`. Elsewhere, or when a file cannot be read, 0. Both can be
//! fixed from the command line (tests, or members that measure themselves differently).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rondo_core::{Entropy, SplitMix64};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UdpSocket};

use crate::wire::{self, Heartbeat, Key};

/// Interval when neither the command line nor a router says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);
/// Longest wait between two hello attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

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

/// Hello until `OK`, then heartbeats forever.
async fn router_loop(router: String, opts: Arc<AgentOpts>, sample: Arc<Mutex<Sample>>) {
    let (addr, interval, next_seq) = hello_until_ok(&router, &opts).await;
    let interval =
        opts.interval.map_or(interval, |own| own.min(interval)).max(Duration::from_millis(1));
    // Start above anything an earlier run of this agent sent (time in microseconds) and above
    // what the router last accepted, so a restart never looks like a replay.
    let mut seq = unix_micros().max(next_seq);
    // Drops (fault injection) follow a generator seeded by the names: the same pattern every
    // run, so a test that relies on it is reproducible.
    let names = format!("{}/{}", opts.cluster, opts.member);
    let mut rng = SplitMix64::new(rondo_core::hash::hash_key(names.as_bytes()));
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
    loop {
        tick.tick().await;
        seq += 1;
        if opts.drop_percent > 0 && rng.next_u64() % 100 < u64::from(opts.drop_percent) {
            continue;
        }
        let s = *sample.lock().unwrap_or_else(|e| e.into_inner());
        let hb = Heartbeat {
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

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Says hello to `router` until it answers `OK`; returns its address, interval and the next
/// sequence number it expects.
async fn hello_until_ok(router: &str, opts: &AgentOpts) -> (SocketAddr, Duration, u64) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match hello_once(router, opts).await {
            Ok(ok) => {
                tracing::info!(%router, interval_ms = ok.1.as_millis() as u64, "router accepted the agent");
                return ok;
            }
            Err(e) => {
                tracing::warn!(%router, "hello refused or failed: {e}; retrying in {} ms", backoff.as_millis())
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn hello_once(router: &str, opts: &AgentOpts) -> Result<(SocketAddr, Duration, u64), String> {
    let addr = tokio::net::lookup_host(router)
        .await
        .map_err(|e| format!("cannot resolve {router}: {e}"))?
        .next()
        .ok_or_else(|| format!("{router} has no address"))?;
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let line = wire::hello_line(&opts.cluster, &opts.member, &opts.key);
        stream.write_all(line.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
        let mut answer = String::new();
        BufReader::new(stream.take(1024))
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())??;
    parse_ok(answer.trim_end()).map(|(i, s)| (addr, i, s)).ok_or_else(|| {
        if answer.is_empty() {
            "connection closed without an answer".to_owned()
        } else {
            answer.trim_end().to_owned()
        }
    })
}

/// `OK <interval_ms> [<next_seq>]`.
fn parse_ok(line: &str) -> Option<(Duration, u64)> {
    let mut parts = line.split(' ');
    if parts.next()? != "OK" {
        return None;
    }
    let ms: u64 = parts.next()?.parse().ok()?;
    let next = match parts.next() {
        Some(s) => s.parse().ok()?,
        None => 0,
    };
    (ms > 0).then_some((Duration::from_millis(ms), next))
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

    #[test]
    fn parses_ok_answers() {
        assert_eq!(parse_ok("OK 200 17"), Some((Duration::from_millis(200), 17)));
        assert_eq!(parse_ok("OK 100"), Some((Duration::from_millis(100), 0)));
        assert_eq!(parse_ok("OK 0 1"), None);
        assert_eq!(parse_ok("ERR bad key"), None);
        assert_eq!(parse_ok("OK x"), None);
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
