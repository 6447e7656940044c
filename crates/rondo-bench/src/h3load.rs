//! Closed-loop HTTP/3 load for `bench/h3.sh` (h2load here has no HTTP/3): `connections` QUIC
//! connections, each with `streams` request streams in flight, until `requests` are answered.
//! Like [`crate::tls`]'s client, it does not verify the server's certificate (loopback
//! benchmarks only) and resumes no session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Buf as _;
use quinn::crypto::rustls::QuicClientConfig;

/// What a run did.
#[derive(Debug)]
pub struct Outcome {
    /// Requests answered 2xx.
    pub ok: u64,
    /// Requests that failed or got another status.
    pub failed: u64,
    /// From the first connection to the last answer.
    pub elapsed: Duration,
}

/// A QUIC client endpoint on a free loopback port offering `h3`, with the bench's TLS client
/// settings ([`crate::tls::client_config`]).
fn client_endpoint() -> anyhow::Result<quinn::Endpoint> {
    let mut tls = (*crate::tls::client_config()).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = QuicClientConfig::try_from(tls).context("quic tls")?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    Ok(endpoint)
}

/// Runs `requests` GETs of `url_path` against `addr` (named `server_name` in the handshake).
pub async fn run(
    addr: SocketAddr,
    server_name: &str,
    url_path: &str,
    connections: usize,
    streams: usize,
    requests: u64,
) -> anyhow::Result<Outcome> {
    let endpoint = client_endpoint()?;
    let uri: http::Uri = format!("https://{server_name}{url_path}").parse()?;
    let (next, ok, failed) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let conn = endpoint.connect(addr, server_name)?.await.context("quic connect")?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn)).await?;
        tasks.push(tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        }));
        for _ in 0..streams {
            let (mut send, uri) = (send.clone(), uri.clone());
            let (next, ok, failed) = (next.clone(), ok.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let one = async {
                        let req = http::Request::get(uri.clone()).body(())?;
                        let mut stream = send.send_request(req).await?;
                        stream.finish().await?;
                        let resp = stream.recv_response().await?;
                        while let Some(mut chunk) = stream.recv_data().await? {
                            chunk.advance(chunk.remaining());
                        }
                        anyhow::Ok(resp.status().is_success())
                    };
                    match tokio::time::timeout(Duration::from_secs(10), one).await {
                        Ok(Ok(true)) => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    let (ok_now, failed_now) = (ok.clone(), failed.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    while ok_now.load(Ordering::Relaxed) + failed_now.load(Ordering::Relaxed) < requests
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    for t in &tasks {
        t.abort();
    }
    endpoint.close(0u32.into(), b"done");
    Ok(Outcome { ok: ok.load(Ordering::Relaxed), failed: failed.load(Ordering::Relaxed), elapsed })
}

/// Opens `connections` QUIC connections to `addr`, one GET of `url_path` on each, then holds
/// them open (each endpoint's keep-alive off: the router's idle timeout must be longer than
/// `hold`) for `hold`; returns how many were opened and answered.
pub async fn hold(
    addr: SocketAddr,
    server_name: &str,
    url_path: &str,
    connections: usize,
    hold: Duration,
) -> anyhow::Result<usize> {
    let endpoint = client_endpoint()?;
    let uri: http::Uri = format!("https://{server_name}{url_path}").parse()?;
    let mut held = Vec::with_capacity(connections);
    for _ in 0..connections {
        let conn = endpoint.connect(addr, server_name)?.await.context("quic connect")?;
        let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn)).await?;
        let task = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        let mut stream = send.send_request(http::Request::get(uri.clone()).body(())?).await?;
        stream.finish().await?;
        stream.recv_response().await?;
        while let Some(mut chunk) = stream.recv_data().await? {
            chunk.advance(chunk.remaining());
        }
        held.push((task, send));
    }
    println!("held {}", held.len());
    tokio::time::sleep(hold).await;
    Ok(held.len())
}
