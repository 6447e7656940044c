//! `rondo-registry`: what registrations cost as the embedded registry grows, and what they do to
//! proxied requests meanwhile (`bench/registry.sh`, results in `docs/benchmarks.md`).
//!
//! It starts a `rondo member` and a `rondo serve` (any build, `--rondo`) with one listener routed
//! to that member (cluster `web`) and the naming service with a snapshot file; registrations go
//! to other clusters (`reg`, or `reg0` .. with `--services`, registration `i` into service
//! `i % services`), so proxied requests never pick a registered member and only feel the
//! registrations' cost. Then:
//!
//! 1. baseline: proxied `GET /` at a fixed rate (open loop, [`rondo_bench::rate`]) in windows
//!    of `--window-ms`, for `--baseline-secs`;
//! 2. `--registrations` registrations (`PUT /v1/services/reg/members/rN`), `--concurrency` at a
//!    time over keep-alive connections (released on a fixed schedule with
//!    `--registration-rate`, latency counted from the send), each one's latency recorded, while
//!    the same proxied load runs in windows until the last registration is answered.
//!
//! Output (markdown): the registrations' wall time and rate, their latency (median and p99, and
//! the median of the first and last tenth: flat means O(1) per registration), and the median
//! and worst of the windows' proxied p99 before and during. Everything is bounded: counts,
//! `--max-secs` for the registrations, and per-request timeouts.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rondo_bench::rate::{self, RateOpts};
use rondo_bench::stats::{nanos, quantile};

/// Registrations at scale: their cost and their effect on proxied latency.
#[derive(Debug, Parser)]
#[command(name = "rondo-registry")]
struct Args {
    /// The `rondo` binary to run.
    #[arg(long, default_value = "target/release/rondo")]
    rondo: PathBuf,
    /// Registrations to make.
    #[arg(long, default_value_t = 10_000)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=100_000))]
    registrations: u64,
    /// Services the registrations are spread over (round robin).
    #[arg(long, default_value_t = 1)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=1000))]
    services: u64,
    /// Registrations in flight at once.
    #[arg(long, default_value_t = 64)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=1024))]
    concurrency: u64,
    /// Registrations per second, released on a fixed schedule (0: as fast as the in-flight
    /// limit allows).
    #[arg(long, default_value_t = 0)]
    #[arg(value_parser = clap::value_parser!(u64).range(0..=100_000))]
    registration_rate: u64,
    /// Proxied requests per second.
    #[arg(long, default_value_t = 1000)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=50_000))]
    rate: u64,
    /// One latency window, milliseconds.
    #[arg(long, default_value_t = 1000)]
    #[arg(value_parser = clap::value_parser!(u64).range(100..=60_000))]
    window_ms: u64,
    /// Baseline before the registrations, seconds.
    #[arg(long, default_value_t = 5)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=300))]
    baseline_secs: u64,
    /// Where `rondo serve`'s log goes (with `RONDO_LOG` from the environment); default nowhere.
    #[arg(long, value_name = "FILE")]
    serve_log: Option<PathBuf>,
    /// Longest the registrations may take, seconds.
    #[arg(long, default_value_t = 600)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=3600))]
    max_secs: u64,
}

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits (at most 20 s) until `addr` accepts connections.
fn wait_listening(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {addr} after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The name of service `k` of `services`: `reg` alone, else `reg0`, `reg1`, ...
fn service(services: u64, k: usize) -> String {
    if services == 1 { "reg".to_owned() } else { format!("reg{}", k as u64 % services) }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rondo-registry: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("rondo-registry-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = bench(args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Where the started processes listen.
struct Addrs {
    member: SocketAddr,
    web: SocketAddr,
    naming: SocketAddr,
}

fn bench(args: &Args, dir: &std::path::Path) -> anyhow::Result<()> {
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let addrs = Addrs {
        member: loopback(free_port()?),
        web: loopback(free_port()?),
        naming: loopback(free_port()?),
    };
    let _member = start_member(args, addrs.member)?;
    let _serve = start_serve(args, dir, &addrs)?;
    wait_listening(addrs.member)?;
    wait_listening(addrs.web)?;
    wait_listening(addrs.naming)?;

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let window = Duration::from_millis(args.window_ms);
    let load = RateOpts {
        targets: vec![addrs.web],
        path: "/".to_owned(),
        rate: args.rate,
        duration: window,
        warmup: Duration::ZERO,
        connections: 8,
        timeout: Duration::from_secs(2),
    };
    rt.block_on(async {
        // Warm-up: connections, the member, the router's caches.
        rate::run(RateOpts { duration: Duration::from_secs(1), ..load.clone() }).await?;
        let mut before = Vec::new();
        let windows = (args.baseline_secs * 1000).div_ceil(args.window_ms);
        for _ in 0..windows {
            before.push(rate::run(load.clone()).await?);
        }
        let tally = Tally::new(args.registrations as usize);
        let done = Arc::new(AtomicBool::new(false));
        let registering = register_all(args, addrs.naming, &tally, done.clone());
        let (during, failed_windows) = proxied_until(&done, &load).await;
        let Some(wall) = registering.await? else {
            let answered = lock(&tally.latencies).iter().filter(|&&l| l > 0).count();
            bail!(
                "the registrations took more than {} s: {answered} of {} answered, {} proxied \
                 windows of {} could not connect",
                args.max_secs,
                args.registrations,
                failed_windows,
                during.len() + failed_windows
            );
        };
        let proxied = Proxied { before: &before, during: &during, failed_windows };
        report(args, wall, &tally, &proxied);
        anyhow::Ok(())
    })
}

/// The `rondo member` every proxied request goes to.
fn start_member(args: &Args, addr: SocketAddr) -> anyhow::Result<Killed> {
    Ok(Killed(
        Command::new(&args.rondo)
            .args(["member", "--name", "m1", "--listen", &addr.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} member", args.rondo.display()))?,
    ))
}

/// `rondo serve` with the one proxied route, the registration services and the naming
/// service (with a snapshot), its stdout drained.
fn start_serve(args: &Args, dir: &std::path::Path, addrs: &Addrs) -> anyhow::Result<Killed> {
    let Addrs { member, web, naming } = addrs;
    let config = dir.join("rondo.toml");
    std::fs::write(
        &config,
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"{web}\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"web\"\n\n\
             [cluster.web]\nmembers = [{{ name = \"m1\", address = \"{member}\" }}]\n\n\
             {}\
             [naming]\nlisten = \"{naming}\"\nsnapshot = \"registry.json\"\n",
            (0..args.services)
                .map(|k| format!(
                    "[cluster.{}]\nmembers = [{{ name = \"seed\", address = \"127.0.0.1:9\" }}]\n\n",
                    service(args.services, k as usize)
                ))
                .collect::<String>()
        ),
    )?;
    let mut serve = Killed(
        Command::new(&args.rondo)
            .args(["serve", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match &args.serve_log {
                Some(f) => Stdio::from(std::fs::File::create(f)?),
                None => Stdio::null(),
            })
            .spawn()
            .with_context(|| format!("starting {} serve", args.rondo.display()))?,
    );
    // Drain its stdout so it never blocks on a full pipe.
    let out = serve.0.stdout.take().context("serve's stdout")?;
    std::thread::spawn(move || for _ in BufReader::new(out).lines().map_while(Result::ok) {});
    Ok(serve)
}

/// What the registrations recorded, shared by their workers.
#[derive(Clone)]
struct Tally {
    /// Each registration's latency, ns (0: not answered).
    latencies: Arc<Mutex<Vec<u64>>>,
    failures: Arc<AtomicUsize>,
    first_failure: Arc<Mutex<Option<String>>>,
}

impl Tally {
    fn new(registrations: usize) -> Self {
        Tally {
            latencies: Arc::new(Mutex::new(vec![0u64; registrations])),
            failures: Arc::new(AtomicUsize::new(0)),
            first_failure: Arc::default(),
        }
    }
}

/// The value behind `m`, even when a worker panicked holding it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `--concurrency` workers making the registrations; the task answers their wall time
/// (`None`: not all done within `--max-secs`) and sets `done` when they end.
fn register_all(
    args: &Args,
    naming: SocketAddr,
    tally: &Tally,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Option<Duration>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    let (pace, services) = (args.registration_rate, args.services);
    for _ in 0..args.concurrency {
        let (client, next, tally) = (client.clone(), next.clone(), tally.clone());
        let n = args.registrations as usize;
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                if pace > 0 {
                    let due = start + Duration::from_secs_f64(i as f64 / pace as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                register(&client, naming, &service(services, i), i, &tally).await;
            }
        });
    }
    let max = Duration::from_secs(args.max_secs);
    tokio::spawn(async move {
        let finished = tokio::time::timeout(max, async {
            while let Some(r) = workers.join_next().await {
                r.expect("registration worker");
            }
        })
        .await;
        let wall = start.elapsed();
        done.store(true, Ordering::Release);
        finished.is_ok().then_some(wall)
    })
}

/// Registration `i` into `svc`, its latency and any failure recorded in `tally`.
async fn register(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    naming: SocketAddr,
    svc: &str,
    i: usize,
    tally: &Tally,
) {
    let body = format!(
        "{{\"address\":\"127.0.{}.{}:8080\",\"ttl_ms\":3600000}}",
        1 + i / 250,
        1 + i % 250
    );
    let req = Request::put(format!("http://{naming}/v1/services/{svc}/members/r{i}"))
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let t = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(60), async {
        let resp = client.request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    })
    .await;
    lock(&tally.latencies)[i] = nanos(t.elapsed());
    let failure = match answer {
        Ok(Ok((StatusCode::OK, _))) => None,
        Ok(Ok((s, b))) => Some(format!("{s}: {}", String::from_utf8_lossy(&b))),
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 60 s".to_owned()),
    };
    if let Some(f) = failure {
        tally.failures.fetch_add(1, Ordering::Relaxed);
        lock(&tally.first_failure).get_or_insert(f);
    }
}

/// Proxied load in windows until `done`: the windows' reports, and how many windows could not
/// even connect (the router too busy to accept within 2 s: counted, not fatal).
async fn proxied_until(done: &AtomicBool, load: &RateOpts) -> (Vec<rate::RateReport>, usize) {
    let mut during = Vec::new();
    let mut failed_windows = 0;
    while !done.load(Ordering::Acquire) {
        match rate::run(load.clone()).await {
            Ok(r) => during.push(r),
            Err(e) => {
                failed_windows += 1;
                eprintln!("rondo-registry: proxied window failed: {e:#}");
            }
        }
    }
    (during, failed_windows)
}

/// The proxied load's windows before and during the registrations.
struct Proxied<'a> {
    before: &'a [rate::RateReport],
    during: &'a [rate::RateReport],
    failed_windows: usize,
}

/// The median and the worst of the windows' p99, ms.
fn windows_p99(reports: &[rate::RateReport]) -> (f64, f64) {
    let mut v: Vec<u64> = reports.iter().map(|r| (r.latency.p99_us * 1000.0) as u64).collect();
    v.sort_unstable();
    (quantile(&v, 0.5).unwrap_or(0) as f64 / 1e6, v.last().copied().unwrap_or(0) as f64 / 1e6)
}

/// The median of `v`, ns, in ms.
fn median(v: &[u64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    quantile(&v, 0.5).unwrap_or(0) as f64 / 1e6
}

/// Prints the markdown table.
fn report(args: &Args, wall: Duration, tally: &Tally, proxied: &Proxied<'_>) {
    let lat = lock(&tally.latencies).clone();
    let tenth = (lat.len() / 10).max(1);
    let mut sorted = lat.clone();
    sorted.sort_unstable();
    let p99 = quantile(&sorted, 0.99).unwrap_or(0) as f64 / 1e6;
    let (before_med, before_max) = windows_p99(proxied.before);
    let (during_med, during_max) = windows_p99(proxied.during);
    let proxied_errors: u64 =
        proxied.during.iter().map(|r| r.errors + r.timeouts + r.bad_status).sum();
    let pace = args.registration_rate;
    println!(
        "Registrations: {} ({} in flight, {}) into {} service(s), snapshot on, `{}`; proxied \
         load {} req/s in {} ms windows\n",
        args.registrations,
        args.concurrency,
        if pace > 0 { format!("{pace}/s scheduled") } else { "unpaced".to_owned() },
        args.services,
        args.rondo.display(),
        args.rate,
        args.window_ms
    );
    println!("| measure | value |\n|---|---|");
    println!("| wall time | {:.2} s |", wall.as_secs_f64());
    println!("| registrations/s | {:.0} |", args.registrations as f64 / wall.as_secs_f64());
    println!("| failed registrations | {} |", tally.failures.load(Ordering::Relaxed));
    println!("| registration latency median / p99 | {:.2} / {:.2} ms |", median(&lat), p99);
    println!(
        "| median latency, first tenth / last tenth | {:.2} / {:.2} ms (x{:.2}) |",
        median(&lat[..tenth]),
        median(&lat[lat.len() - tenth..]),
        median(&lat[lat.len() - tenth..]) / median(&lat[..tenth]).max(1e-9)
    );
    println!(
        "| proxied p99, median of windows: before / during | {before_med:.2} / {during_med:.2} ms (x{:.2}) |",
        during_med / before_med.max(1e-9)
    );
    println!(
        "| proxied p99, worst window: before / during | {before_max:.2} / {during_max:.2} ms |"
    );
    println!("| proxied errors during | {proxied_errors} |");
    let failed_windows = proxied.failed_windows;
    println!(
        "| proxied windows that could not connect | {failed_windows} of {} |",
        proxied.during.len() + failed_windows
    );
    if let Some(f) = lock(&tally.first_failure).as_ref() {
        println!("\nfirst failed registration: {f}");
    }
}
