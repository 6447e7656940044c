//! `rondo-overhead`: what balancing costs a caller, the PKUAS overhead table over loopback.
//!
//! Three in-process HTTP/1.1 echo members (a POST's body comes back as the response body) and an
//! in-process naming service (`rondo_naming::api` over a `rondo_runtime::Live` compiled from a
//! config: cluster `echo`, round-robin, granularity `request`, embedded registry) run on their
//! own thread with a current-thread tokio runtime. The caller runs on the main thread, on
//! another current-thread runtime, and makes one call at a time (latency, not throughput) in
//! four ways:
//!
//! - `direct`: a hyper-util keep-alive client POSTs to one member;
//! - `per-lookup`: one `GET /v1/lookup/echo` on the naming service, then every call of the
//!   chunk goes to the member it returned with the same kind of client; the lookup's time is
//!   spread over the chunk's calls (amortised);
//! - `per-request (tower)`: `rondo_client::Client`'s tower layer around the same kind of hyper
//!   client (`client.layer().layer(http)`, request bodies in `SlotBody`) picks every call;
//! - `per-request (call)`: `Client::call` with a closure that POSTs to the picked member;
//! - and a control row, `direct` rotating over the three members by itself (no rondo): what
//!   spreading calls over three keep-alive connections costs without any balancer.
//!
//! Every mode bounds a call with one tokio timer (`direct` and `per-lookup` wrap the request in
//! `tokio::time::timeout`; the client's modes rely on the client's call timeout).
//!
//! Noise control: each mode does `calls / rounds` calls per payload size per round; the modes
//! are interleaved and their order rotated every round; every call's latency is recorded (from
//! building the request to the last byte of the response body). The output is a markdown table
//! of median, p90, p99 and mean per mode and payload, the ratio of medians to `direct`, and the
//! spread of that ratio over the rounds; then the client's own per-call cost without any I/O.
//!
//! `rondo-overhead [--calls 10000] [--rounds 10] [--warmup 1000] [--quick]`; `bench/overhead.sh`
//! runs it pinned to one CPU with `taskset` (one call in flight: the caller and the members
//! never run at once, and cross-vCPU wake-ups on a VM cost more than the call), then unpinned.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use clap::Parser;
use http::uri::{self, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rondo_bench::stats::{nanos, quantile};
use rondo_client::{Balanced, Client, Failed, SlotBody, Target};
use tower::{Layer, Service};

/// Balancing overhead over loopback: direct vs per-lookup vs per-request.
#[derive(Debug, Parser)]
#[command(name = "rondo-overhead")]
struct Cli {
    /// Measured calls per mode and payload size.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
    /// Rounds the calls are split into (modes interleaved, their order rotated every round).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Unmeasured calls per mode and payload size first.
    #[arg(long, default_value_t = 1_000)]
    warmup: usize,
    /// Payload sizes in bytes (each goes both ways).
    #[arg(long = "sizes", value_delimiter = ',', default_values_t = vec![16, 1024, 65536])]
    sizes: Vec<usize>,
    /// Iterations of the no-I/O measurement of the client's own per-call cost.
    #[arg(long, default_value_t = 200_000)]
    cpu_iterations: usize,
    /// Smoke run: 300 calls in 3 rounds, 50 warm-up calls, 20,000 no-I/O iterations.
    #[arg(long)]
    quick: bool,
    /// Only these modes (for profiling one path; `direct` is always kept as the reference).
    #[arg(long, value_enum, value_delimiter = ',')]
    modes: Vec<Mode>,
    /// A `rondo` binary: adds the mode `router`, calls through `rondo serve --workers 1` with
    /// a route to the same members (CLB's "over the network").
    #[arg(long, value_name = "PATH")]
    rondo: Option<std::path::PathBuf>,
}

const SERVICE: &str = "echo";
const MEMBERS: usize = 3;
/// No call may take longer than this (the run must end by itself).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Mode {
    /// A hyper-util client straight to member m1.
    Direct,
    /// Control: the same client, the caller rotating over the three members by itself (no
    /// rondo), i.e. what spreading calls over three connections costs without any balancer.
    DirectRr,
    /// One naming lookup per chunk, then straight to the member it returned.
    PerLookup,
    /// A naming lookup before every call (PKUAS Figure 7), each call timed with its lookup.
    LookupEach,
    /// Through `rondo serve` (needs `--rondo`).
    Router,
    /// `Client::layer()` around a hyper-util client.
    Tower,
    /// `Client::call` with a closure around a hyper-util client.
    Call,
}

const MODES: [Mode; 7] = [
    Mode::Direct,
    Mode::DirectRr,
    Mode::PerLookup,
    Mode::LookupEach,
    Mode::Router,
    Mode::Tower,
    Mode::Call,
];

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::DirectRr => "direct, own rotation over 3 members (control)",
            Mode::PerLookup => "per-lookup",
            Mode::LookupEach => "lookup before every call (PKUAS Fig. 7)",
            Mode::Router => "through the router (`rondo serve`)",
            Mode::Tower => "per-request (tower layer)",
            Mode::Call => "per-request (`Client::call`)",
        }
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    if cli.quick {
        cli.calls = 300;
        cli.rounds = 3;
        cli.warmup = 50;
        cli.cpu_iterations = 20_000;
    }
    if cli.calls == 0 || cli.rounds == 0 || cli.calls < cli.rounds || cli.sizes.is_empty() {
        eprintln!("rondo-overhead: need --calls >= --rounds >= 1 and at least one size");
        return ExitCode::FAILURE;
    }
    let result = start_servers().and_then(|servers| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1800), run(&cli, &servers))
                .await
                .map_err(|_| anyhow!("the run took over 30 minutes"))?
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rondo-overhead: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The server side: members and the naming service, on their own thread.
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Servers {
    members: Vec<SocketAddr>,
    naming: SocketAddr,
    /// Connections the members accepted (keep-alive check).
    accepted: Arc<AtomicUsize>,
}

/// Starts the members and the naming service on a thread of their own (which lives until the
/// process exits).
fn start_servers() -> anyhow::Result<Servers> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("servers".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                let _ = tx.send(Err(anyhow!("server runtime: {e}")));
                return;
            }
        };
        rt.block_on(async move {
            match serve_all().await {
                Ok((servers, keep)) => {
                    let _ = tx.send(Ok(servers));
                    std::future::pending::<()>().await;
                    drop(keep);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
    })?;
    rx.recv().context("the server thread ended")?
}

type Keep = (rondo_naming::api::NamingServer, rondo_naming::Registry);

async fn serve_all() -> anyhow::Result<(Servers, Keep)> {
    let accepted = Arc::new(AtomicUsize::new(0));
    let mut members = Vec::new();
    for _ in 0..MEMBERS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        members.push(listener.local_addr()?);
        tokio::spawn(echo(listener, accepted.clone()));
    }
    let list = member_list(&members);
    let text = format!(
        "[cluster.{SERVICE}]\nalgorithm = \"round-robin\"\ngranularity = \"request\"\n\
         members = [{list}]\n\n[naming]\nlisten = \"127.0.0.1:0\"\nregistry = \"embedded\"\n"
    );
    let config = rondo_config::parse_str(&text, Path::new("overhead.toml"), 1)
        .map_err(|e| anyhow!("the benchmark's config is invalid:\n{e}"))?;
    let spec = config.naming.context("no [naming] in the benchmark's config")?;
    let live = Arc::new(rondo_runtime::Live::new(config.view.clone(), config.router.group.clone()));
    let registry =
        rondo_naming::start_registry(&spec.registry, &rondo_naming::NamingParts::of(&live))
            .map_err(anyhow::Error::msg)?;
    let api = rondo_naming::api::start(
        spec.listen,
        &rondo_naming::NamingParts::of(&live),
        registry.clone(),
        None,
    )
    .await
    .context("starting the naming API")?;
    Ok((Servers { members, naming: api.addr, accepted }, (api, registry)))
}

/// The members as a cluster's `members` array in the configuration: `m1`, `m2`, ... in order.
fn member_list(members: &[SocketAddr]) -> String {
    members
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{{ name = \"m{}\", address = \"{a}\" }}", i + 1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `rondo serve --workers 1` routing to the members (`--rondo`), killed on drop.
struct Router {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: std::path::PathBuf,
}

impl Router {
    fn start(bin: &Path, servers: &Servers) -> anyhow::Result<Router> {
        use std::io::BufRead;
        let dir = std::env::temp_dir().join(format!("rondo-overhead-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let list = member_list(&servers.members);
        let text = format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"{SERVICE}\"\n\n\
             [cluster.{SERVICE}]\nalgorithm = \"round-robin\"\nmembers = [{list}]\n"
        );
        let path = dir.join("rondo.toml");
        std::fs::write(&path, text)?;
        let mut child = std::process::Command::new(bin)
            .args(["serve", "--workers", "1", "--config"])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let stdout = child.stdout.take().context("stdout")?;
        for line in std::io::BufReader::new(stdout).lines() {
            if let Some(a) = line?.strip_prefix("rondo: listener web on ") {
                let addr = a.split_whitespace().next().unwrap_or_default().parse()?;
                return Ok(Router { child, addr, _dir: dir });
            }
        }
        bail!("rondo serve printed no listener address")
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

/// An HTTP/1.1 echo member: the response body is the request body.
async fn echo(listener: tokio::net::TcpListener, accepted: Arc<AtomicUsize>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let body = req.into_body().collect().await?.to_bytes();
                Ok::<_, hyper::Error>(Response::new(Full::new(body)))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The caller side.
// ---------------------------------------------------------------------------------------------

/// A keep-alive HTTP/1.1 client (TCP_NODELAY, as the members).
fn http_client<B>() -> HttpClient<HttpConnector, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    HttpClient::builder(TokioExecutor::new()).build(connector)
}

type Plain = HttpClient<HttpConnector, Full<Bytes>>;

struct Caller {
    direct: Plain,
    direct_uri: Uri,
    rotation: Vec<Uri>,
    next: usize,
    after_lookup: Plain,
    naming: HttpClient<HttpConnector, Empty<Bytes>>,
    lookup_uri: Uri,
    balanced: Balanced<HttpClient<HttpConnector, SlotBody<Full<Bytes>>>>,
    service_uri: Uri,
    client: Client,
    call_http: Plain,
    /// Calls per member name, per-request modes.
    spread: BTreeMap<String, usize>,
    /// Time of every lookup (ns).
    lookups: Vec<u64>,
    /// `http://ROUTER/echo` with `--rondo`.
    router_uri: Option<Uri>,
    via_router: Plain,
}

fn check(status: StatusCode, body: &Bytes, payload: &Bytes) -> anyhow::Result<()> {
    if status != StatusCode::OK {
        bail!("status {status}");
    }
    if body.len() != payload.len() {
        bail!("echo of {} bytes came back with {} bytes", payload.len(), body.len());
    }
    Ok(())
}

impl Caller {
    async fn new(servers: &Servers, router: Option<SocketAddr>) -> anyhow::Result<Caller> {
        let client = Client::builder(SERVICE)
            .endpoint(servers.naming.to_string())
            .seed(1)
            .call_timeout(CALL_TIMEOUT)
            .connect()
            .await
            .context("bootstrapping the client from the naming service")?;
        let balanced = client.layer().layer(http_client());
        Ok(Caller {
            direct: http_client(),
            direct_uri: format!("http://{}/echo", servers.members[0]).parse()?,
            rotation: servers
                .members
                .iter()
                .map(|m| format!("http://{m}/echo").parse())
                .collect::<Result<_, _>>()?,
            next: 0,
            after_lookup: http_client(),
            naming: http_client(),
            lookup_uri: format!("http://{}/v1/lookup/{SERVICE}", servers.naming).parse()?,
            balanced,
            service_uri: format!("http://{SERVICE}/echo").parse()?,
            client,
            call_http: http_client(),
            spread: BTreeMap::new(),
            lookups: Vec::new(),
            router_uri: router.map(|r| format!("http://{r}/echo").parse()).transpose()?,
            via_router: http_client(),
        })
    }

    /// `n` calls in `mode` with `payload`, each call's latency (ns) pushed to `out`.
    async fn chunk(
        &mut self,
        mode: Mode,
        payload: &Bytes,
        n: usize,
        out: &mut Vec<u64>,
    ) -> anyhow::Result<()> {
        match mode {
            Mode::Direct => {
                for _ in 0..n {
                    let t = Instant::now();
                    send(&self.direct, &self.direct_uri, payload).await?;
                    out.push(nanos(t.elapsed()));
                }
            }
            Mode::DirectRr => {
                for _ in 0..n {
                    let t = Instant::now();
                    let uri = &self.rotation[self.next];
                    self.next = (self.next + 1) % self.rotation.len();
                    send(&self.direct, uri, payload).await?;
                    out.push(nanos(t.elapsed()));
                }
            }
            Mode::PerLookup => {
                let t = Instant::now();
                let uri = self.lookup().await?;
                let lookup = nanos(t.elapsed());
                self.lookups.push(lookup);
                let start = out.len();
                for _ in 0..n {
                    let t = Instant::now();
                    send(&self.after_lookup, &uri, payload).await?;
                    out.push(nanos(t.elapsed()));
                }
                // The lookup's cost, spread over the calls it served.
                let share = lookup / n as u64;
                let rest = lookup % n as u64;
                for (i, s) in out[start..].iter_mut().enumerate() {
                    *s += share + u64::from((i as u64) < rest);
                }
            }
            Mode::LookupEach => {
                for _ in 0..n {
                    let t = Instant::now();
                    let uri = self.lookup().await?;
                    send(&self.after_lookup, &uri, payload).await?;
                    out.push(nanos(t.elapsed()));
                }
            }
            Mode::Router => {
                let uri = self.router_uri.clone().context("the router mode needs --rondo")?;
                for _ in 0..n {
                    let t = Instant::now();
                    send(&self.via_router, &uri, payload).await?;
                    out.push(nanos(t.elapsed()));
                }
            }
            Mode::Tower => {
                for _ in 0..n {
                    let t = Instant::now();
                    let req =
                        Request::post(self.service_uri.clone()).body(Full::new(payload.clone()))?;
                    poll_fn(|cx| self.balanced.poll_ready(cx)).await.map_err(|e| anyhow!(e))?;
                    // Bounded by the client's call timeout (one timer per call, as in direct).
                    let resp = self.balanced.call(req).await.map_err(|e| anyhow!(e))?;
                    let status = resp.status();
                    // The member's name is copied after the timing (no allocation inside it).
                    let member = resp.body().member().and_then(member_number);
                    let body = resp.into_body().collect().await?.to_bytes();
                    out.push(nanos(t.elapsed()));
                    check(status, &body, payload)?;
                    let name = member.map(|i| format!("m{i}")).unwrap_or_default();
                    *self.spread.entry(name).or_default() += 1;
                }
            }
            Mode::Call => {
                for _ in 0..n {
                    let t = Instant::now();
                    let http = &self.call_http;
                    let (member, status, body) = self
                        .client
                        .call(|target: Target| post_echo(http, target, Full::new(payload.clone())))
                        .await?;
                    out.push(nanos(t.elapsed()));
                    check(status, &body, payload)?;
                    *self.spread.entry(member.name().to_owned()).or_default() += 1;
                }
            }
        }
        Ok(())
    }

    /// `GET /v1/lookup/echo`: the URI of the member the naming service picked.
    async fn lookup(&self) -> anyhow::Result<Uri> {
        let req = Request::get(self.lookup_uri.clone()).body(Empty::new())?;
        let resp = tokio::time::timeout(CALL_TIMEOUT, self.naming.request(req))
            .await
            .context("lookup timed out")??;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!("lookup: status {status}: {}", String::from_utf8_lossy(&body));
        }
        let lookup: rondo_client::wire::Lookup =
            serde_json::from_slice(&body).context("lookup answer")?;
        Ok(format!("http://{}/echo", lookup.member.address).parse()?)
    }
}

/// The number of member `m<i>` (the members are named `m1`, `m2`, ...).
fn member_number(name: &str) -> Option<usize> {
    name.strip_prefix('m')?.parse().ok()
}

/// One POST of `payload` to `uri`, the whole response read and checked.
async fn send(http: &Plain, uri: &Uri, payload: &Bytes) -> anyhow::Result<()> {
    let req = Request::post(uri.clone()).body(Full::new(payload.clone()))?;
    let resp =
        tokio::time::timeout(CALL_TIMEOUT, http.request(req)).await.context("call timed out")??;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    check(status, &body, payload)
}

/// Samples of one mode and payload, by round.
/// One try of `Client::call`: POSTs `body` to the target member's `/echo` with `http`, and
/// answers the target, the status and the response body.
async fn post_echo(
    http: &Plain,
    target: Target,
    body: Full<Bytes>,
) -> Result<(Target, StatusCode, Bytes), Failed<std::io::Error>> {
    // The member's authority was parsed once per answer; the rest of the URI is static.
    let mut uri = uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = target.authority().cloned();
    uri.path_and_query = Some(PathAndQuery::from_static("/echo"));
    let uri = Uri::from_parts(uri).map_err(|e| Failed::Fatal(std::io::Error::other(e)))?;
    let req = Request::post(uri).body(body).map_err(|e| Failed::Fatal(std::io::Error::other(e)))?;
    let resp =
        http.request(req).await.map_err(|e| Failed::classify(e).map(std::io::Error::other))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| Failed::Member(std::io::Error::other(e)))?
        .to_bytes();
    Ok((target, status, body))
}

type Samples = BTreeMap<(usize, Mode), Vec<Vec<u64>>>;

async fn run(cli: &Cli, servers: &Servers) -> anyhow::Result<()> {
    let router = match &cli.rondo {
        Some(bin) => Some(Router::start(bin, servers)?),
        None => None,
    };
    let mut caller = Caller::new(servers, router.as_ref().map(|r| r.addr)).await?;
    let modes: Vec<Mode> = if cli.modes.is_empty() {
        MODES.iter().copied().filter(|m| *m != Mode::Router || router.is_some()).collect()
    } else {
        MODES.iter().copied().filter(|m| *m == Mode::Direct || cli.modes.contains(m)).collect()
    };
    let payloads: Vec<Bytes> = cli
        .sizes
        .iter()
        .map(|&n| Bytes::from((0..n).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>()))
        .collect();

    // Warm-up: connections open, caches and estimators settled; nothing recorded.
    let mut scratch = Vec::new();
    for payload in &payloads {
        for &mode in &modes {
            caller.chunk(mode, payload, cli.warmup.max(1), &mut scratch).await?;
        }
    }
    caller.spread.clear();
    caller.lookups.clear();
    let accepted_before = servers.accepted.load(Ordering::Relaxed);

    let started = Instant::now();
    let mut samples: Samples = BTreeMap::new();
    for round in 0..cli.rounds {
        // The round's share of the calls (the first rounds take the remainder).
        let n = cli.calls / cli.rounds + usize::from(round < cli.calls % cli.rounds);
        for (p, payload) in payloads.iter().enumerate() {
            for k in 0..modes.len() {
                let mode = modes[(k + round) % modes.len()];
                let mut out = Vec::with_capacity(n);
                caller.chunk(mode, payload, n, &mut out).await?;
                samples.entry((p, mode)).or_default().push(out);
            }
        }
    }
    let took = started.elapsed();
    let accepted = servers.accepted.load(Ordering::Relaxed) - accepted_before;

    print_table(cli, &samples, &caller, took, accepted);
    cpu_cost(cli, &caller.client).await?;
    Ok(())
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    quantile(v, 0.5).unwrap_or(0)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn print_table(cli: &Cli, samples: &Samples, caller: &Caller, took: Duration, accepted: usize) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "Balancing overhead over loopback: {} calls per mode and payload in {} rounds (modes \
         interleaved, order rotated each round), one call in flight, after {} warm-up calls; \
         {cpus} CPU(s) available to the process; measured part {:.1} s; {} new member \
         connections during it.\n",
        cli.calls,
        cli.rounds,
        cli.warmup,
        took.as_secs_f64(),
        accepted
    );
    println!(
        "| payload | mode | calls | median (µs) | p90 (µs) | p99 (µs) | mean (µs) | calls/s, one in flight | median / direct | per-round median ratio (min–max) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for (p, size) in cli.sizes.iter().enumerate() {
        let Some(direct_rounds) = samples.get(&(p, Mode::Direct)) else { continue };
        let mut direct_all: Vec<u64> = direct_rounds.concat();
        let direct_median = median(&mut direct_all);
        let direct_round_medians: Vec<u64> =
            direct_rounds.iter().map(|r| median(&mut r.clone())).collect();
        for mode in MODES {
            let Some(rounds) = samples.get(&(p, mode)) else { continue };
            let mut all = rounds.concat();
            all.sort_unstable();
            let q = |q: f64| us(quantile(&all, q).unwrap_or(0));
            let mean = all.iter().map(|&n| n as f64).sum::<f64>() / all.len().max(1) as f64 / 1e3;
            let m = quantile(&all, 0.5).unwrap_or(0);
            let (ratio, spread) = if mode == Mode::Direct {
                ("1.000".to_owned(), "–".to_owned())
            } else {
                let per_round: Vec<f64> = rounds
                    .iter()
                    .zip(&direct_round_medians)
                    .map(|(r, &d)| median(&mut r.clone()) as f64 / d.max(1) as f64)
                    .collect();
                let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = per_round.iter().copied().fold(0.0, f64::max);
                (
                    format!("{:.3}", m as f64 / direct_median.max(1) as f64),
                    format!("{lo:.3}–{hi:.3}"),
                )
            };
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {} |",
                size_label(*size),
                mode.label(),
                all.len(),
                q(0.5),
                q(0.9),
                q(0.99),
                mean,
                1e6 / mean.max(1e-3),
                ratio,
                spread
            );
        }
    }
    let mut lookups = caller.lookups.clone();
    let lookup_median = us(median(&mut lookups));
    let spread: Vec<String> = caller.spread.iter().map(|(m, n)| format!("{m} {n}")).collect();
    println!(
        "\nLookups: {} (one per per-lookup chunk), median {lookup_median:.1} µs each, spread over \
         the chunk's calls. Per-request calls by member: {}.",
        caller.lookups.len(),
        spread.join(", ")
    );
}

fn size_label(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) { format!("{} KiB", n / 1024) } else { format!("{n} B") }
}

// ---------------------------------------------------------------------------------------------
// The client's own per-call cost, without I/O.
// ---------------------------------------------------------------------------------------------

/// An inner service that reads the request body and answers 200 at once.
#[derive(Debug, Clone, Copy)]
struct Instant200;

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> Service<Request<B>> for Instant200
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Boxed<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        Box::pin(async move {
            let _ = req.into_body().collect().await;
            Ok(Response::new(Full::new(Bytes::new())))
        })
    }
}

/// ns per iteration of `f` over `n` iterations, best of 3 runs.
async fn per_call<F, Fut>(n: usize, mut f: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..n {
            f().await?;
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    Ok(best)
}

async fn cpu_cost(cli: &Cli, client: &Client) -> anyhow::Result<()> {
    let n = cli.cpu_iterations.max(1);
    let payload = Bytes::from_static(&[b'x'; 16]);
    let uri: Uri = format!("http://{SERVICE}/echo").parse()?;

    let mut plain = Instant200;
    let bare = per_call(n, || {
        let req = Request::post(uri.clone()).body(Full::new(payload.clone()));
        let fut = req.map(|r| plain.call(r));
        async move {
            let resp = fut?.await?;
            resp.into_body().collect().await?;
            Ok(())
        }
    })
    .await?;

    let mut balanced = client.layer().layer(Instant200);
    let tower = per_call(n, || {
        let req = Request::post(uri.clone()).body(Full::new(payload.clone()));
        let fut = req.map(|r| balanced.call(r));
        async move {
            let resp = fut?.await.map_err(|e| anyhow!(e))?;
            resp.into_body().collect().await?;
            Ok(())
        }
    })
    .await?;

    let call = per_call(n, || async {
        client
            .call(|target: Target| async move { Ok::<_, Failed<std::io::Error>>(target.addr()) })
            .await?;
        Ok(())
    })
    .await?;

    println!(
        "\nThe client's own cost per call, no I/O (best of 3 × {n} calls on this thread; the inner \
         service reads the body and answers 200 at once):\n"
    );
    println!("| path | ns per call | added by the client (ns) |");
    println!("|---|---:|---:|");
    println!("| inner service alone (request + body + response) | {bare:.0} | – |");
    println!("| tower layer around it (`Balanced`) | {tower:.0} | {:.0} |", tower - bare);
    println!("| `Client::call` with a ready closure | {call:.0} | {call:.0} |");
    Ok(())
}
