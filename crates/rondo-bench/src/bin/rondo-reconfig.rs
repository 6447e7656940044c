//! `rondo-reconfig`: WCF's claim that a reconfiguration is a pointer move, measured on rondo
//! (`bench/reconfig.sh`, results in `docs/benchmarks.md`).
//!
//! It writes a configuration of `--clusters` clusters (two members each, a route each, no
//! health checks so that nothing but the configuration is measured), starts `rondo serve`
//! (any build, `--rondo`) on it, and then:
//!
//! 1. compiles the same text in this process `--compiles` times (`rondo_config::parse_str`:
//!    what every apply does before its swap) and reports the median;
//! 2. applies `--reloads` configurations through the admin API (`POST /api/v1/config`), each
//!    with one member's weight changed so that every one is a new view, one at a time, timing
//!    each from the send to the answer (compile, carry-over and swap in the router);
//! 3. reads the router's RSS (`/proc/PID/status`) before the first apply and after every tenth
//!    of them: flat means no view, cluster or member state is leaked across applies.
//!
//! Everything is bounded: counts, and a timeout on each call.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rondo_bench::stats::{nanos, quantile};

/// The cost of applying a large configuration, and RSS across many applies.
#[derive(Debug, Parser)]
#[command(name = "rondo-reconfig")]
struct Args {
    /// The `rondo` binary to run.
    #[arg(long, default_value = "target/release/rondo")]
    rondo: PathBuf,
    /// Clusters in the configuration (each with two members and a route).
    #[arg(long, default_value_t = 1000)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=20_000))]
    clusters: u64,
    /// Configurations applied through the admin API.
    #[arg(long, default_value_t = 1000)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=100_000))]
    reloads: u64,
    /// In-process compiles of the text, for the compile-only median.
    #[arg(long, default_value_t = 20)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=1000))]
    compiles: u64,
}

const TOKEN: &str = "reconfig-bench-token-0123456789";

/// The configuration with `clusters` clusters; member `m0` of cluster `bump % clusters` gets
/// weight `100 + bump % 7 + 1` (every other member 100), so consecutive `bump`s differ.
fn config(clusters: u64, bump: u64) -> String {
    let mut t = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n"
    );
    for c in 0..clusters {
        t.push_str(&format!(
            "[[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/c{c}/\" }}\ncluster = \"c{c}\"\n\n"
        ));
    }
    for c in 0..clusters {
        let w = if c == bump % clusters { 100 + bump % 7 + 1 } else { 100 };
        let (m0, m1) = (10_000 + c % 50_000, 20_000 + c % 40_000);
        t.push_str(&format!("[cluster.c{c}]\nalgorithm = \"least-sessions\"\nmembers = [\n"));
        t.push_str(&format!(
            "  {{ name = \"m0\", address = \"127.0.0.1:{m0}\", weight = {w} }},\n"
        ));
        t.push_str(&format!("  {{ name = \"m1\", address = \"127.0.0.1:{m1}\" }},\n]\n\n"));
    }
    t
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    let kib = line.split_whitespace().nth(1).context("VmRSS value")?;
    Ok(kib.parse()?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("rondo-reconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("rondo.toml");
    let text = config(args.clusters, 0);
    std::fs::write(&path, &text)?;
    let compiles = compile_times(&args)?;
    let (mut child, admin) = start_serve(&args, &path)?;
    let applied = apply_all(&args, child.id(), admin).await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let (applies, rss) = applied?;
    report(&args, &compiles, &applies, &rss);
    Ok(ExitCode::SUCCESS)
}

/// `--compiles` in-process compiles of the text, each of a new weight, timed.
fn compile_times(args: &Args) -> anyhow::Result<Vec<Duration>> {
    let mut compiles = Vec::new();
    for i in 0..args.compiles {
        let t = config(args.clusters, i + 1);
        let start = Instant::now();
        let c = rondo_config::parse_str(&t, Path::new("bench.toml"), i + 1);
        compiles.push(start.elapsed());
        if let Err(e) = c {
            bail!("the generated configuration is invalid: {e}");
        }
    }
    Ok(compiles)
}

/// `rondo serve` on `path`, and the admin API's address it prints.
fn start_serve(args: &Args, path: &Path) -> anyhow::Result<(Child, SocketAddr)> {
    let mut child = Command::new(&args.rondo)
        .args(["serve", "--workers", "1", "--config"])
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", args.rondo.display()))?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut admin: Option<SocketAddr> = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(a) = line.strip_prefix("rondo: admin API on ") {
            admin = Some(a.trim().parse()?);
            break;
        }
    }
    let Some(admin) = admin else { bail!("rondo serve printed no admin address") };
    Ok((child, admin))
}

/// Applies `--reloads` configurations through the admin API one at a time: each apply's
/// time, and the router's RSS (KiB) at the start and after every tenth.
async fn apply_all(
    args: &Args,
    pid: u32,
    admin: SocketAddr,
) -> anyhow::Result<(Vec<Duration>, Vec<(u64, u64)>)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut applies = Vec::new();
    let mut rss = vec![(0, rss_kib(pid)?)];
    let tenth = (args.reloads / 10).max(1);
    for i in 1..=args.reloads {
        let body = Bytes::from(config(args.clusters, i));
        let req = Request::post(format!("http://{admin}/api/v1/config"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(body))?;
        let start = Instant::now();
        let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req)).await??;
        let status = resp.status();
        let answer = resp.into_body().collect().await?.to_bytes();
        applies.push(start.elapsed());
        if !status.is_success() {
            bail!("apply {i}: {status}: {}", String::from_utf8_lossy(&answer));
        }
        if i % tenth == 0 {
            rss.push((i, rss_kib(pid)?));
        }
    }
    Ok((applies, rss))
}

/// Prints the markdown tables: compile and apply times, then RSS across the applies.
fn report(args: &Args, compiles: &[Duration], applies: &[Duration], rss: &[(u64, u64)]) {
    let sorted = |d: &[Duration]| {
        let mut v: Vec<u64> = d.iter().copied().map(nanos).collect();
        v.sort_unstable();
        v
    };
    let (c, a) = (sorted(compiles), sorted(applies));
    let ms = |n: Option<u64>| n.unwrap_or(0) as f64 / 1e6;
    println!("| clusters | members | compile median (ms) | apply median (ms) | apply p99 (ms) |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {:.2} | {:.2} | {:.2} |",
        args.clusters,
        args.clusters * 2,
        ms(quantile(&c, 0.5)),
        ms(quantile(&a, 0.5)),
        ms(quantile(&a, 0.99)),
    );
    println!();
    println!("| applies | RSS (MiB) |");
    println!("|---:|---:|");
    for (i, kib) in rss {
        println!("| {i} | {:.1} |", *kib as f64 / 1024.0);
    }
    let (first, last) = (rss[0].1 as f64, rss[rss.len() - 1].1 as f64);
    let after_first = rss.get(1).map_or(first, |r| r.1 as f64);
    println!();
    println!(
        "RSS after the last apply: {:+.1} % against the first tenth's, {:+.1} % against the start",
        (last / after_first - 1.0) * 100.0,
        (last / first - 1.0) * 100.0
    );
}
