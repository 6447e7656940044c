//! `rondo-loadgen`: the load generator of `bench/run.sh`.
//!
//! - `rondo-loadgen rate --target ADDR... --rate R --duration-secs D`: open-loop requests at a
//!   fixed rate; prints one `key=value` line (latencies in microseconds).
//! - `rondo-loadgen hold --target ADDR... --connections N --hold-secs S`: opens N keep-alive
//!   connections, one request on each, prints `held=N errors=E` and holds them for S seconds.
//! - `rondo-loadgen tls-handshakes --target ADDR --connections N --duration-secs D`: full TLS
//!   handshakes (no resumption), one `Connection: close` request each; prints
//!   `done=N errors=E per_sec=X`.
//! - `rondo-loadgen tls-hold --target ADDR --connections N --hold-secs S`: [`hold`] over TLS.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rondo_bench::{hold, rate, tls};

/// Load generator for rondo's benchmarks.
#[derive(Debug, Parser)]
#[command(name = "rondo-loadgen")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Requests at a fixed rate over keep-alive connections (open loop).
    Rate {
        /// Where to send (repeat for several; connections are spread over them).
        #[arg(long = "target", required = true)]
        targets: Vec<SocketAddr>,
        /// Request path.
        #[arg(long, default_value = "/")]
        path: String,
        /// Requests per second.
        #[arg(long, default_value_t = 5000)]
        rate: u64,
        /// Measured seconds.
        #[arg(long, default_value_t = 10.0)]
        duration_secs: f64,
        /// Unmeasured seconds first, at the same rate.
        #[arg(long, default_value_t = 1.0)]
        warmup_secs: f64,
        /// Keep-alive connections.
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Per-request timeout, milliseconds from release.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// Opens connections, one request on each, and holds them open.
    Hold {
        /// Where to connect (repeat for several).
        #[arg(long = "target", required = true)]
        targets: Vec<SocketAddr>,
        /// Request path.
        #[arg(long, default_value = "/")]
        path: String,
        /// Connections.
        #[arg(long, default_value_t = 1000)]
        connections: usize,
        /// Connections being opened at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Seconds to hold them once open (then exit).
        #[arg(long, default_value_t = 30)]
        hold_secs: u64,
    },
    /// Full TLS handshakes (no session resumption), one request each, as fast as they go.
    TlsHandshakes {
        /// Where to connect.
        #[arg(long)]
        target: SocketAddr,
        /// Connections in flight at once.
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Measured seconds.
        #[arg(long, default_value_t = 10.0)]
        duration_secs: f64,
        /// Unmeasured seconds first.
        #[arg(long, default_value_t = 1.0)]
        warmup_secs: f64,
    },
    /// Opens TLS connections, one keep-alive request on each, and holds them open.
    TlsHold {
        /// Where to connect.
        #[arg(long)]
        target: SocketAddr,
        /// Connections.
        #[arg(long, default_value_t = 1000)]
        connections: usize,
        /// Connections being opened at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Seconds to hold them once open (then exit).
        #[arg(long, default_value_t = 30)]
        hold_secs: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rondo-loadgen: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rondo-loadgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn secs(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|e| anyhow::anyhow!("bad duration {s}: {e}"))
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Rate {
            targets,
            path,
            rate,
            duration_secs,
            warmup_secs,
            connections,
            timeout_ms,
        } => {
            let opts = rate::RateOpts {
                targets,
                path,
                rate,
                duration: secs(duration_secs)?,
                warmup: secs(warmup_secs)?,
                connections,
                timeout: Duration::from_millis(timeout_ms),
            };
            let r = rate::run(opts).await?;
            let l = &r.latency;
            println!(
                "scheduled={} ok={} bad_status={} errors={} timeouts={} rate={:.1} \
                 p50_us={:.1} p90_us={:.1} p99_us={:.1} p999_us={:.1} max_us={:.1} mean_us={:.1} \
                 pacer_lag_p99_us={:.1} pacer_lag_max_us={:.1}",
                r.scheduled,
                r.ok,
                r.bad_status,
                r.errors,
                r.timeouts,
                r.achieved_rate,
                l.p50_us,
                l.p90_us,
                l.p99_us,
                l.p999_us,
                l.max_us,
                l.mean_us,
                r.pacer_lag_p99_us,
                r.pacer_lag_max_us,
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Hold { targets, path, connections, concurrency, hold_secs } => {
            let held = hold::open(hold::HoldOpts {
                targets,
                path,
                connections,
                concurrency,
                open_timeout: Duration::from_secs(60),
            })
            .await?;
            println!(
                "held={} errors={} open_ms={}",
                held.conns.len(),
                held.errors,
                held.took.as_millis()
            );
            std::io::stdout().flush()?;
            tokio::time::sleep(Duration::from_secs(hold_secs.min(600))).await;
            drop(held);
            Ok(ExitCode::SUCCESS)
        }
        Command::TlsHandshakes { target, connections, duration_secs, warmup_secs } => {
            let r = tls::handshakes(target, connections, secs(warmup_secs)?, secs(duration_secs)?)
                .await?;
            println!("done={} errors={} per_sec={:.1}", r.done, r.errors, r.per_sec);
            Ok(ExitCode::SUCCESS)
        }
        Command::TlsHold { target, connections, concurrency, hold_secs } => {
            let (held, errors) = tls::hold(target, connections, concurrency).await?;
            println!("held={} errors={errors}", held.len());
            std::io::stdout().flush()?;
            tokio::time::sleep(Duration::from_secs(hold_secs.min(600))).await;
            drop(held);
            Ok(ExitCode::SUCCESS)
        }
    }
}
