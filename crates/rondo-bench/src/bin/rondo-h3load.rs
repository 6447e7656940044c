//! `rondo-h3load ADDR --connections C --streams M --requests N [--path P] [--server-name S]`:
//! closed-loop HTTP/3 GETs (see `rondo_bench::h3load`); prints requests per second and the
//! counts.

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
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
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
