//! The open-loop generator: requests at a fixed rate, whatever the responses do.
//!
//! A pacer thread (a plain OS thread, so the schedule does not depend on the async runtime's
//! 1 ms timer wheel) releases request `i` at `start + i / rate` into a queue. Keep-alive
//! connections take released requests first come, first served. A request's latency runs from
//! its *release* to the end of its response: when every connection is busy, the time a request
//! waits in the queue is counted, which is what a client arriving at that moment would see (no
//! coordinated omission). The pacer's own oversleep is not charged to the target; it is
//! reported separately (`pacer_lag_*`) so a noisy machine shows up as such.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::{Mutex, mpsc};

use crate::client::Conn;
use crate::stats::{self, Summary};

/// At most this many requests in one run (warm-up included).
pub const MAX_REQUESTS: u64 = 5_000_000;
/// At most this long a run (warm-up included).
pub const MAX_DURATION: Duration = Duration::from_secs(600);

/// What to run.
#[derive(Debug, Clone)]
pub struct RateOpts {
    /// Targets; connection `k` goes to target `k % len`.
    pub targets: Vec<SocketAddr>,
    /// Request path.
    pub path: String,
    /// Requests per second.
    pub rate: u64,
    /// Measured part of the run.
    pub duration: Duration,
    /// Unmeasured part before it, at the same rate.
    pub warmup: Duration,
    /// Keep-alive connections.
    pub connections: usize,
    /// A request not answered this long after its release is an error; a released request
    /// still queued this long is dropped as one.
    pub timeout: Duration,
}

/// What happened in the measured part of a run.
#[derive(Debug, Clone, Default)]
pub struct RateReport {
    /// Requests scheduled in the measured part.
    pub scheduled: u64,
    /// Answered with a 2xx or 3xx status.
    pub ok: u64,
    /// Answered with another status.
    pub bad_status: u64,
    /// Connection errors (refused, reset, closed).
    pub errors: u64,
    /// Not answered (or not even sent) within the timeout.
    pub timeouts: u64,
    /// Latency of the `ok` requests, release to last body byte.
    pub latency: Summary,
    /// How late the pacer released requests (its oversleep), 99th percentile and worst.
    pub pacer_lag_p99_us: f64,
    /// See `pacer_lag_p99_us`.
    pub pacer_lag_max_us: f64,
    /// Completed requests per second of measured time.
    pub achieved_rate: f64,
}

#[derive(Debug)]
struct Ticket {
    measured: bool,
    released: Instant,
}

#[derive(Debug, Default)]
struct Tally {
    latencies: Vec<u64>,
    ok: u64,
    bad_status: u64,
    errors: u64,
    timeouts: u64,
}

/// Runs the schedule to the end and reports on it.
pub async fn run(opts: RateOpts) -> anyhow::Result<RateReport> {
    if opts.targets.is_empty() || opts.rate == 0 || opts.connections == 0 {
        bail!("need at least one target, a rate and a connection");
    }
    if opts.duration + opts.warmup > MAX_DURATION {
        bail!("run longer than {} s", MAX_DURATION.as_secs());
    }
    let warm = count(opts.rate, opts.warmup);
    let measured = count(opts.rate, opts.duration);
    if warm + measured > MAX_REQUESTS {
        bail!("more than {MAX_REQUESTS} requests in one run");
    }
    let connect_timeout = Duration::from_secs(2);

    // Every connection is up before the clock starts.
    let mut conns = Vec::with_capacity(opts.connections);
    for k in 0..opts.connections {
        let target = opts.targets[k % opts.targets.len()];
        conns.push(Conn::connect(target, connect_timeout).await?);
    }

    let (tx, rx) = mpsc::unbounded_channel::<Ticket>();
    let rx = Arc::new(Mutex::new(rx));
    let stop = Arc::new(AtomicBool::new(false));
    let interval_ns = 1_000_000_000f64 / opts.rate as f64;
    let pacer = {
        let stop = stop.clone();
        std::thread::Builder::new().name("pacer".into()).spawn(move || {
            let start = Instant::now() + Duration::from_millis(5);
            let mut lags = Vec::with_capacity(usize::try_from(measured).unwrap_or(0));
            for i in 0..warm + measured {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let due = start + Duration::from_nanos((i as f64 * interval_ns) as u64);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let released = Instant::now();
                let is_measured = i >= warm;
                if is_measured {
                    lags.push(stats::nanos(released.saturating_duration_since(due)));
                }
                if tx.send(Ticket { measured: is_measured, released }).is_err() {
                    break;
                }
            }
            lags
        })?
    };

    let mut workers = tokio::task::JoinSet::new();
    for conn in conns {
        let (rx, path, timeout) = (rx.clone(), opts.path.clone(), opts.timeout);
        workers.spawn(worker(conn, rx, path, timeout, connect_timeout));
    }
    // Bounded: the schedule, plus one timeout for the last requests, plus slack.
    let limit =
        opts.warmup + opts.duration + opts.timeout + connect_timeout + Duration::from_secs(5);
    let mut total = Tally::default();
    let collected = tokio::time::timeout(limit, async {
        while let Some(t) = workers.join_next().await {
            let t = t.context("a connection task failed")?;
            total.latencies.extend_from_slice(&t.latencies);
            total.ok += t.ok;
            total.bad_status += t.bad_status;
            total.errors += t.errors;
            total.timeouts += t.timeouts;
        }
        anyhow::Ok(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    workers.abort_all();
    let mut lags = pacer.join().map_err(|_| anyhow::anyhow!("the pacer thread panicked"))?;
    match collected {
        Ok(r) => r?,
        Err(_) => bail!("the run did not finish within {} s", limit.as_secs()),
    }
    let lag = stats::summarize(&mut lags);
    let answered = total.ok + total.bad_status;
    let unaccounted = measured.saturating_sub(answered + total.errors + total.timeouts);
    Ok(RateReport {
        scheduled: measured,
        ok: total.ok,
        bad_status: total.bad_status,
        errors: total.errors,
        timeouts: total.timeouts + unaccounted,
        latency: stats::summarize(&mut total.latencies),
        pacer_lag_p99_us: lag.p99_us,
        pacer_lag_max_us: lag.max_us,
        achieved_rate: answered as f64 / opts.duration.as_secs_f64().max(1e-9),
    })
}

fn count(rate: u64, d: Duration) -> u64 {
    (rate as f64 * d.as_secs_f64()).round() as u64
}

async fn worker(
    mut conn: Conn,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<Ticket>>>,
    path: String,
    timeout: Duration,
    connect_timeout: Duration,
) -> Tally {
    let mut t = Tally::default();
    let target = conn.target;
    loop {
        let ticket = {
            let mut rx = rx.lock().await;
            rx.recv().await
        };
        let Some(ticket) = ticket else { break };
        // Left in the queue past its timeout: the target is far behind; don't pile on.
        if ticket.released.elapsed() >= timeout {
            t.timeouts += u64::from(ticket.measured);
            continue;
        }
        if !conn.is_open() {
            match Conn::connect(target, connect_timeout).await {
                Ok(c) => conn = c,
                Err(_) => {
                    t.errors += u64::from(ticket.measured);
                    continue;
                }
            }
        }
        let left = timeout.saturating_sub(ticket.released.elapsed());
        let result = tokio::time::timeout(left, conn.get(&path)).await;
        let done = Instant::now();
        if result.is_err() {
            // The connection may still carry the late response: start afresh.
            if let Ok(c) = Conn::connect(target, connect_timeout).await {
                conn = c;
            }
        }
        if !ticket.measured {
            continue;
        }
        match result {
            Ok(Ok(status)) if status.is_success() || status.is_redirection() => {
                t.ok += 1;
                t.latencies.push(stats::nanos(done.saturating_duration_since(ticket.released)));
            }
            Ok(Ok(_)) => t.bad_status += 1,
            Ok(Err(_)) => t.errors += 1,
            Err(_) => t.timeouts += 1,
        }
    }
    t
}
