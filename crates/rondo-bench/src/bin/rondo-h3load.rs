//! `rondo-h3load ADDR --connections C --streams M --requests N [--path P] [--server-name S]`:
//! closed-loop HTTP/3 GETs (see `rondo_bench::h3load`); prints requests per second and the
//! counts. With `--hold N`: N idle connections held open (memory per connection).

use clap::Parser;

#[derive(Parser)]
struct Args {
    /// The router's HTTP/3 address (`IP:PORT`).
    addr: std::net::SocketAddr,
    #[arg(long, default_value_t = 10)]
    connections: usize,
    #[arg(long, default_value_t = 10)]
    streams: usize,
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    #[arg(long, default_value = "/")]
    path: String,
    #[arg(long, default_value = "localhost")]
    server_name: String,
    /// Instead: open this many connections, one request on each, print `held N` and hold them
    /// for `--hold-seconds`.
    #[arg(long)]
    hold: Option<usize>,
    #[arg(long, default_value_t = 30)]
    hold_seconds: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if let Some(n) = a.hold {
        let wait = std::time::Duration::from_secs(a.hold_seconds);
        rondo_bench::h3load::hold(a.addr, &a.server_name, &a.path, n, wait).await?;
        return Ok(());
    }
    let o = rondo_bench::h3load::run(
        a.addr,
        &a.server_name,
        &a.path,
        a.connections,
        a.streams,
        a.requests,
    )
    .await?;
    let secs = o.elapsed.as_secs_f64();
    println!(
        "requests {} ok {} failed {} seconds {secs:.3} rps {:.0}",
        a.requests,
        o.ok,
        o.failed,
        o.ok as f64 / secs
    );
    Ok(())
}
