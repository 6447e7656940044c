//! TLS load for `bench/run.sh --tls`: full handshakes per second ([`handshakes`]) and many idle
//! TLS connections held open ([`hold`]).
//!
//! The client is rustls (ring) with **session resumption off**, so every connection is a full
//! handshake (wrk and `openssl s_time` reuse or serialize sessions: wrk resumed 1,128 of 1,129
//! handshakes against `openssl s_server` here). The server's certificate and handshake
//! signature are **not verified**: a benchmark client on one core must spend less per handshake
//! than the server it measures, and a signature check (an ECDSA verify costs more than the
//! server's sign) would make the client the bottleneck. Never use this client for anything
//! but loopback benchmarks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Accepts any certificate and any handshake signature (see the module text: benchmarks only).
#[derive(Debug)]
pub(crate) struct NoVerify(pub(crate) Vec<SignatureScheme>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls12_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.clone()
    }
}

/// The benchmark client's configuration: TLS 1.3, `http/1.1` by ALPN, no resumption, no
/// verification.
pub fn client_config() -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let schemes = provider.signature_verification_algorithms.supported_schemes();
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify(schemes)))
        .with_no_client_auth();
    config.resumption = Resumption::disabled();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

async fn connect(
    connector: &TlsConnector,
    target: SocketAddr,
) -> anyhow::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(target).await.context("connect")?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("localhost").expect("name").to_owned();
    connector.connect(name, tcp).await.context("handshake")
}

/// Reads one HTTP/1.1 response with a `Content-Length` (the benchmark members' kind); its
/// status code.
async fn read_response(s: &mut TlsStream<TcpStream>) -> anyhow::Result<u16> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed before a response");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            bail!("response head over 64 KiB");
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).context("status line")?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no content-length")?;
    let mut have = buf.len() - head_end;
    while have < length {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed in the body");
        }
        have += n;
    }
    Ok(status)
}

const REQUEST_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
const REQUEST_KEEP: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// What a handshake run did in its measured time.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeRun {
    /// Connections completed (handshake, one request answered 200).
    pub done: u64,
    /// Connections that failed.
    pub errors: u64,
    /// Completed per second.
    pub per_sec: f64,
}

/// `connections` loops, each: connect, full handshake, one request with `Connection: close`,
/// the answer, close; for `warmup` unmeasured, then `duration` measured.
pub async fn handshakes(
    target: SocketAddr,
    connections: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<HandshakeRun> {
    if connections == 0 || connections > 1024 {
        bail!("connections must be 1 to 1024");
    }
    let connector = TlsConnector::from(client_config());
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (connector, measuring, stop) = (connector.clone(), measuring.clone(), stop.clone());
        let (done, errors) = (done.clone(), errors.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let one = async {
                    let mut s = connect(&connector, target).await?;
                    s.write_all(REQUEST_CLOSE).await?;
                    let status = read_response(&mut s).await?;
                    anyhow::ensure!(status == 200, "status {status}");
                    anyhow::Ok(())
                };
                let ok =
                    matches!(tokio::time::timeout(Duration::from_secs(5), one).await, Ok(Ok(())));
                if measuring.load(Ordering::Relaxed) {
                    if ok { &done } else { &errors }.fetch_add(1, Ordering::Relaxed);
                }
                if !ok {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
    }
    tokio::time::sleep(warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    let done = done.load(Ordering::Relaxed);
    Ok(HandshakeRun {
        done,
        errors: errors.load(Ordering::Relaxed),
        per_sec: done as f64 / took.as_secs_f64(),
    })
}

/// Opens `connections` TLS connections (`concurrency` at a time), one keep-alive request on
/// each; returns them (dropping them closes them) and how many failed.
pub async fn hold(
    target: SocketAddr,
    connections: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<TlsStream<TcpStream>>, usize)> {
    if connections == 0 || connections > crate::hold::MAX_CONNECTIONS || concurrency == 0 {
        bail!("need 1 to {} connections and a concurrency", crate::hold::MAX_CONNECTIONS);
    }
    let connector = TlsConnector::from(client_config());
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (gate, connector) = (gate.clone(), connector.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            tokio::time::timeout(Duration::from_secs(5), async {
                let mut s = connect(&connector, target).await?;
                s.write_all(REQUEST_KEEP).await?;
                let status = read_response(&mut s).await?;
                anyhow::ensure!(status == 200, "status {status}");
                anyhow::Ok(s)
            })
            .await?
        });
    }
    let mut held = Vec::with_capacity(connections);
    let mut errors = 0;
    let joined = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok(s)) => held.push(s),
                _ => errors += 1,
            }
        }
    })
    .await;
    if joined.is_err() {
        errors += tasks.len();
        tasks.abort_all();
    }
    Ok((held, errors))
}
