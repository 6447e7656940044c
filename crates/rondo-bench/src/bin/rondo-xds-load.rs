//! `rondo-xds-load`: many xDS clients on one naming service (`bench/xds.sh`, results in
//! `docs/benchmarks.md`). It opens `--clients` ADS streams, each on its own connection as a
//! proxyless gRPC client's would be, subscribed to the Listener, RouteConfiguration, Cluster
//! and ClusterLoadAssignment of `--cluster` and ACKing every response; reads the naming
//! service's resident memory (`--pid`) once all have their endpoints; then `--rounds` times
//! drains or undrains `--member` through the admin API and measures how long until every
//! client has received the new endpoints. Everything is bounded: counts and `--timeout-secs`
//! per phase.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const TYPES: [&str; 4] = [
    "type.googleapis.com/envoy.config.listener.v3.Listener",
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
];
const EDS: &str = TYPES[3];

/// Many xDS clients on one naming service: its memory, and how fast a change reaches them all.
#[derive(Debug, Parser)]
#[command(name = "rondo-xds-load")]
struct Args {
    /// The naming service's xDS server.
    #[arg(long)]
    xds: SocketAddr,
    /// The admin API (drains `--member`).
    #[arg(long)]
    admin: SocketAddr,
    /// The admin API's token.
    #[arg(long, default_value = "t")]
    token: String,
    /// The cluster every client subscribes to.
    #[arg(long, default_value = "web")]
    cluster: String,
    /// The member drained and undrained in turn.
    #[arg(long, default_value = "m1")]
    member: String,
    /// ADS streams (each on its own connection).
    #[arg(long, default_value_t = 1000)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=10_000))]
    clients: u64,
    /// Changes pushed and timed.
    #[arg(long, default_value_t = 10)]
    #[arg(value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: u64,
    /// The naming service's process id (its resident memory is read from /proc).
    #[arg(long)]
    pid: u32,
    /// Longest wait of each phase.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
}

fn request(t: &str, cluster: &str, version: String, nonce: String, id: u64) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version,
        node: Some(Node { id: format!("load-{id}"), ..Default::default() }),
        resource_names: vec![cluster.to_owned()],
        type_url: t.to_owned(),
        response_nonce: nonce,
        ..Default::default()
    }
}

/// One client: subscribes to the four types and ACKs every response, counting EDS responses.
async fn client(
    xds: SocketAddr,
    cluster: String,
    id: u64,
    eds: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut c = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}")).await?;
    let (tx, rx) = mpsc::channel(8);
    for t in TYPES {
        tx.send(request(t, &cluster, String::new(), String::new(), id)).await?;
    }
    let mut stream = c.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    while let Some(resp) = stream.message().await? {
        let ack = request(&resp.type_url, &cluster, resp.version_info, resp.nonce, id);
        tx.send(ack).await?;
        if resp.type_url == EDS {
            eds.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    line.split_whitespace().nth(1).context("no value")?.parse().context("VmRSS")
}

/// `POST /api/v1/clusters/CLUSTER/members/MEMBER/{drain,undrain}`.
async fn admin(args: &Args, what: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(args.admin).await?;
    let path = format!("/api/v1/clusters/{}/members/{}/{what}", args.cluster, args.member);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        args.token
    );
    s.write_all(head.as_bytes()).await?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    if !text.starts_with("HTTP/1.1 200") {
        bail!("{what}: {}", text.lines().next().unwrap_or(""));
    }
    Ok(())
}

/// Waits until every counter passed its `base`; how long it took.
async fn all_passed(
    counts: &[Arc<AtomicU64>],
    base: &[u64],
    limit: Duration,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    loop {
        let behind =
            counts.iter().zip(base).filter(|(c, b)| c.load(Ordering::Relaxed) <= **b).count();
        if behind == 0 {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            bail!("{behind} clients still without endpoints after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let limit = Duration::from_secs(args.timeout_secs);
    let before = rss_kib(args.pid)?;
    let counts: Vec<Arc<AtomicU64>> = (0..args.clients).map(|_| Arc::default()).collect();
    let t0 = Instant::now();
    for (id, eds) in counts.iter().enumerate() {
        let (xds, cluster, eds) = (args.xds, args.cluster.clone(), eds.clone());
        tokio::spawn(async move {
            if let Err(e) = client(xds, cluster, id as u64, eds).await {
                eprintln!("client {id}: {e}");
            }
        });
    }
    let zero = vec![0; counts.len()];
    all_passed(&counts, &zero, limit).await?;
    let connected = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(args.pid)?;
    println!(
        "{} clients with endpoints after {} ms; naming service RSS {} MiB before, {} MiB with them",
        args.clients,
        connected.as_millis(),
        before / 1024,
        after / 1024
    );
    let mut times = Vec::new();
    for round in 0..args.rounds {
        let base: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        admin(&args, if round % 2 == 0 { "drain" } else { "undrain" }).await?;
        let took = all_passed(&counts, &base, limit).await?;
        times.push(took);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    times.sort();
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    println!(
        "push to all {} clients over {} changes: median {:.0} ms, worst {:.0} ms; RSS now {} MiB",
        args.clients,
        times.len(),
        ms(&times[times.len() / 2]),
        ms(times.last().expect("rounds >= 1")),
        rss_kib(args.pid)? / 1024
    );
    Ok(())
}
