//! Many idle keep-alive connections: open them, do one request on each, hold them open.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::sync::Semaphore;

use crate::client::Conn;

/// At most this many connections.
pub const MAX_CONNECTIONS: usize = 20_000;

/// What to open.
#[derive(Debug, Clone)]
pub struct HoldOpts {
    /// Targets; connection `k` goes to target `k % len`.
    pub targets: Vec<SocketAddr>,
    /// Request path.
    pub path: String,
    /// Connections to open and hold.
    pub connections: usize,
    /// At most this many connections being opened (connect + first request) at once; this is
    /// also the most upstream connections a proxy needs for them.
    pub concurrency: usize,
    /// Give up opening after this long.
    pub open_timeout: Duration,
}

/// Connections held open.
#[derive(Debug)]
pub struct Held {
    /// The open connections (dropping them closes them).
    pub conns: Vec<Conn>,
    /// Connections that failed to open or whose request failed.
    pub errors: usize,
    /// How long opening took.
    pub took: Duration,
}

/// Opens the connections and does one request on each.
pub async fn open(opts: HoldOpts) -> anyhow::Result<Held> {
    if opts.targets.is_empty() || opts.connections == 0 || opts.concurrency == 0 {
        bail!("need at least one target, a connection and a concurrency");
    }
    if opts.connections > MAX_CONNECTIONS {
        bail!("more than {MAX_CONNECTIONS} connections");
    }
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(opts.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..opts.connections {
        let (gate, path) = (gate.clone(), opts.path.clone());
        let target = opts.targets[k % opts.targets.len()];
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let mut conn = Conn::connect(target, Duration::from_secs(2)).await?;
            let status = tokio::time::timeout(Duration::from_secs(2), conn.get(&path)).await??;
            if !status.is_success() {
                bail!("status {status}");
            }
            anyhow::Ok(conn)
        });
    }
    let mut held =
        Held { conns: Vec::with_capacity(opts.connections), errors: 0, took: Duration::ZERO };
    let joined = tokio::time::timeout(opts.open_timeout, async {
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok(c)) => held.conns.push(c),
                _ => held.errors += 1,
            }
        }
    })
    .await;
    if joined.is_err() {
        held.errors += tasks.len();
        tasks.abort_all();
    }
    held.took = started.elapsed();
    Ok(held)
}
