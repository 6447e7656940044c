//! The threads `rondo serve` runs on (`--workers`, `--runtime`, `--shards`): one work-stealing
//! tokio runtime for everything (the default), or a current-thread runtime for the process's
//! control parts plus one current-thread runtime per worker that accepts and serves the
//! router's TCP connections ([`rondo_proxy::cores`]).

use anyhow::Context;
use rondo_proxy::cores::{Cores, Shards};

/// `--runtime`: how connections are spread over the worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RuntimeMode {
    /// One tokio runtime whose workers share every connection's tasks (work stealing).
    #[default]
    WorkStealing,
    /// One single-threaded runtime per worker, each accepting and serving its own
    /// connections, like HAProxy's threads (`nbthread`).
    PerCore,
}

/// `--shards`: how a listener's connections reach the per-core runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ShardsArg {
    /// One `SO_REUSEPORT` socket per worker (HAProxy's `shards by-thread`).
    #[default]
    ByCore,
    /// One socket per listener, accepted on by every worker.
    One,
}

/// How `rondo serve` was asked to use threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Threads {
    /// `--workers` (default: one per core).
    pub workers: Option<usize>,
    /// `--runtime`.
    pub runtime: RuntimeMode,
    /// `--shards`.
    pub shards: ShardsArg,
}

impl Threads {
    /// The runtime `rondo serve` blocks on, and the per-core runtimes (none with
    /// `work-stealing`).
    pub fn start(&self) -> anyhow::Result<(tokio::runtime::Runtime, Cores)> {
        match self.runtime {
            RuntimeMode::WorkStealing => Ok((super::runtime(self.workers)?, Cores::default())),
            RuntimeMode::PerCore => {
                let n = self
                    .workers
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
                let shards = match self.shards {
                    ShardsArg::ByCore => Shards::ByCore,
                    ShardsArg::One => Shards::One,
                };
                let cores = Cores::start(n, shards).context("starting the per-core runtimes")?;
                Ok((super::runtime(Some(1))?, cores))
            }
        }
    }
}
