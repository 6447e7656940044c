//! `rondo-queue-bench`: accepted and delivered messages per second of a durable queue, in one
//! process over loopback (docs/benchmarks.md, "Queued routing").
//!
//! Phase 1 (accepted/s): `--clients` keep-alive connections post `--messages` messages of
//! `--bytes` each to a `queue` listener, each answered 202 only once durable. The member's socket
//! is bound but not yet accepting, so the deliveries under way wait and the intake runs alone.
//! Phase 2 (delivered/s): the member starts answering 200 at once, and the backlog is timed
//! until the member has every message. `--nats HOST:PORT` (feature `nats`) runs the same against
//! a NATS JetStream queue, and then a plain JetStream publisher (the same message size and
//! number in flight) against the same server, for comparison.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Debug, Parser)]
#[command(about = "Accepted and delivered messages per second of a rondo queue")]
struct Args {
    /// Messages to send.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Body size of each message, bytes.
    #[arg(long, default_value_t = 1024)]
    bytes: usize,
    /// Client connections posting at once.
    #[arg(long, default_value_t = 64)]
    clients: u64,
    /// Deliveries under way at once (the queue's `concurrency`).
    #[arg(long, default_value_t = 64)]
    concurrency: u32,
    /// The embedded store's directory (default: a fresh one under the temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// A NATS server (`nats-server -js`): the queue in JetStream instead, then a plain
    /// JetStream publisher beside it (feature `nats`).
    #[arg(long, value_name = "HOST:PORT")]
    nats: Option<String>,
    /// Session keys the messages are spread over (`x-session: s{i % N}`, the queue's
    /// `session_header`): each key's messages go one at a time. 0: no session keys.
    #[arg(long, default_value_t = 0)]
    sessions: u64,
    /// The NATS queue's `session_partitions` (with `--sessions`).
    #[arg(long)]
    session_partitions: Option<u32>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("rondo-queue-bench-{}", std::process::id()))
    });
    let _ = std::fs::remove_dir_all(&dir);
    // The member's socket: bound now, accepting from phase 2 on.
    let member = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let text = config_text(&args, &dir, member.local_addr()?);
    let config = rondo_config::parse_str(&text, std::path::Path::new("bench.toml"), 1)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let live = Arc::new(rondo_runtime::Live::new(config.view.clone(), None));
    let queues = rondo_queue::start(&config, rondo_queue::QueueParts::of(&live))
        .await
        .context("starting the queue")?;
    let intake = queues.addr("in").context("queue listener")?;
    let store = match &args.nats {
        Some(url) => format!("NATS JetStream at {url}"),
        None => format!("embedded, {}", dir.join("bench.redb").display()),
    };
    println!(
        "queue bench: {} messages of {} bytes, {} client connections, concurrency {}, {} \
         session keys, {store}",
        args.messages, args.bytes, args.clients, args.concurrency, args.sessions
    );
    accept_phase(&args, intake).await?;
    deliver_phase(&args, member).await;
    queues.stop();
    drop(queues);
    if args.nats.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    #[cfg(feature = "nats")]
    if let Some(url) = &args.nats {
        publisher(url, args.messages, args.bytes, args.clients as usize).await?;
    }
    #[cfg(not(feature = "nats"))]
    if args.nats.is_some() {
        anyhow::bail!("--nats needs the `nats` feature (cargo run -p rondo-bench --features nats)");
    }
    Ok(())
}

/// The router's configuration: a `queue` listener routed to the one member, the queue in
/// `dir` (or NATS with `--nats`).
fn config_text(args: &Args, dir: &std::path::Path, member_addr: SocketAddr) -> String {
    let mut backend = match &args.nats {
        Some(url) => format!("backend = \"nats\"\nnats_url = \"{url}\""),
        None => format!("directory = \"{}\"", dir.display()),
    };
    if args.sessions > 0 {
        backend.push_str("\nsession_header = \"x-session\"");
    }
    if let Some(n) = args.session_partitions {
        backend.push_str(&format!("\nsession_partitions = {n}"));
    }
    format!(
        r#"
[[listener]]
name = "in"
listen = "127.0.0.1:0"
protocol = "queue"

[[route]]
listener = "in"
cluster = "c"
request_timeout_ms = 600000

[cluster.c]
members = [{{ name = "m1", address = "{member_addr}" }}]

[[queue]]
name = "bench"
{backend}
max_message_bytes = {max}
concurrency = {concurrency}
lease_ms = 600000
"#,
        max = args.bytes.max(1),
        concurrency = args.concurrency
    )
}

/// Phase 1: the intake alone (the member not accepting yet); prints accepted/s and the 202s'
/// latency.
async fn accept_phase(args: &Args, intake: SocketAddr) -> anyhow::Result<()> {
    let body = Bytes::from(vec![b'x'; args.bytes]);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.clients {
        let (next, body, n) = (next.clone(), body.clone(), args.messages);
        tasks.spawn(post_loop(intake, next, n, body, args.sessions));
    }
    let mut latencies = Vec::with_capacity(args.messages as usize);
    while let Some(r) = tasks.join_next().await {
        latencies.extend(r??);
    }
    let took = started.elapsed();
    let mut ns: Vec<u64> = latencies.iter().map(|&d| rondo_bench::stats::nanos(d)).collect();
    ns.sort_unstable();
    let pct = |p: f64| rondo_bench::stats::quantile(&ns, p).map_or(0.0, |n| n as f64 / 1e6);
    println!(
        "accepted: {:.0} msgs/s ({} in {:.2} s; 202 latency p50 {:.2} ms, p99 {:.2} ms)",
        args.messages as f64 / took.as_secs_f64(),
        args.messages,
        took.as_secs_f64(),
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}

/// Phase 2: the member answers; the backlog is timed until the member has every message (at
/// most 600 s), and delivered/s printed.
async fn deliver_phase(args: &Args, member: tokio::net::TcpListener) {
    let delivered = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let sink = tokio::spawn(sink(member, delivered.clone()));
    let deadline = Instant::now() + Duration::from_secs(600);
    while delivered.load(Ordering::Relaxed) < args.messages && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    let got = delivered.load(Ordering::Relaxed);
    println!(
        "delivered: {:.0} msgs/s ({got} in {:.2} s, from a backlog of {})",
        got as f64 / took.as_secs_f64(),
        took.as_secs_f64(),
        args.messages
    );
    sink.abort();
}

/// The member: answers every request 200 at once and counts it in `counter`.
async fn sink(member: tokio::net::TcpListener, counter: Arc<AtomicU64>) {
    loop {
        let Ok((stream, _)) = member.accept().await else { continue };
        let counter = counter.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<_>| {
                let counter = counter.clone();
                async move {
                    let _ = BodyExt::collect(req.into_body()).await;
                    counter.fetch_add(1, Ordering::Relaxed);
                    let mut r = Response::new(Full::new(Bytes::new()));
                    *r.status_mut() = StatusCode::OK;
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Posts messages until `n` were taken from `next`; each one's time to its 202.
async fn post_loop(
    at: SocketAddr,
    next: Arc<AtomicU64>,
    n: u64,
    body: Bytes,
    sessions: u64,
) -> anyhow::Result<Vec<Duration>> {
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1).build_http();
    let mut out = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        let mut req = Request::post(format!("http://{at}/queues/bench"));
        if sessions > 0 {
            req = req.header("x-session", format!("s{}", i % sessions));
        }
        let req = req.body(Full::new(body.clone())).expect("request");
        let t = Instant::now();
        let resp = client.request(req).await.context("post")?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        anyhow::ensure!(status == StatusCode::ACCEPTED, "the queue answered {status}");
        out.push(t.elapsed());
    }
    Ok(out)
}

/// A plain JetStream publisher against the same server: `n` messages of `bytes` to a fresh
/// file-stored stream, `in_flight` publishes awaiting their acknowledgement at once (what each
/// 202 waits for in the NATS backend).
#[cfg(feature = "nats")]
async fn publisher(url: &str, n: u64, bytes: usize, in_flight: usize) -> anyhow::Result<()> {
    use async_nats::jetstream::{self, stream};
    let js = jetstream::new(async_nats::connect(url.to_owned()).await?);
    let _ = js.delete_stream("RONDO_BENCH_PUB").await;
    js.create_stream(stream::Config {
        name: "RONDO_BENCH_PUB".to_owned(),
        subjects: vec!["rondo.bench.pub".to_owned()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    let payload = Bytes::from(vec![b'x'; bytes]);
    let started = Instant::now();
    let mut acks = std::collections::VecDeque::new();
    for _ in 0..n {
        acks.push_back(js.publish("rondo.bench.pub", payload.clone()).await?);
        if acks.len() >= in_flight
            && let Some(a) = acks.pop_front()
        {
            a.await?;
        }
    }
    for a in acks {
        a.await?;
    }
    let took = started.elapsed();
    println!(
        "jetstream publisher (same server, {in_flight} in flight): {:.0} msgs/s ({n} in {:.2} s)",
        n as f64 / took.as_secs_f64(),
        took.as_secs_f64()
    );
    let _ = js.delete_stream("RONDO_BENCH_PUB").await;
    Ok(())
}
