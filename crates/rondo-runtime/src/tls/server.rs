//! TLS termination for every socket rondo listens on with a `tls` table: the router's listeners
//! (wrapped by `rondo-proxy`'s `Terminator`, which adds the client-certificate headers), the
//! admin API, the naming service and the agents' first contact. One [`TlsServer`] per socket
//! holds the current rustls `ServerConfig` (the build's provider from `rondo_config::crypto`, TLS 1.2 and 1.3 only, the
//! certificate chosen by SNI, client certificates asked for as configured, the ALPN protocols
//! the socket serves) behind an `ArcSwap`, so a certificate reload swaps it for new handshakes
//! while connections already up keep the one they started with. [`TlsServer::watch`] reloads
//! when a certificate, key or CA file changes (polling) and on SIGHUP; a file that fails to load
//! keeps the old configuration and logs why. [`TlsIncoming`] turns a TCP listener into a
//! stream of finished handshakes for the HTTP servers (the admin API, the naming service), with
//! the handshakes run beside each other so that one slow client cannot hold up the others.
//! A certificate's OCSP staple comes from its response file (read with the certificate, so a
//! bad file fails the load or reload like a bad certificate) or from `crate::tls::ocsp_fetch`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use http::HeaderValue;
use rondo_config::tls::{self as ctls, ClientAuth, ListenerTls};
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use crate::metrics::Metrics;
use crate::tls::ocsp_fetch::{Restaple, Staples, fetch_loop};
use rondo_config::ocsp::OcspSource;

/// How often the certificate files are looked at for changes.
const POLL: Duration = Duration::from_millis(250);

/// ALPN of an HTTP/1.1-only server (the admin API, the naming service).
pub const ALPN_HTTP1: &[&[u8]] = &[b"http/1.1"];
/// ALPN of a router `http` listener: HTTP/2 (gRPC too) and HTTP/1.1 on one port.
pub const ALPN_H2_HTTP1: &[&[u8]] = &[b"h2", b"http/1.1"];

/// The build's crypto provider (ring, or aws-lc-rs with the feature `aws-lc`).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    rondo_config::crypto::crypto_provider()
}

/// Picks the certificate for a ClientHello's server name: an exact name first, then a wildcard,
/// then the first certificate (also for clients that send no SNI).
#[derive(Debug)]
struct SniResolver {
    certs: Vec<(Vec<String>, Arc<CertifiedKey>)>,
}

/// The entry of `certs` (names, value) for `sni`: an exact name first, then a wildcard, then
/// the first entry.
fn choose<'a, T>(certs: &'a [(Vec<String>, T)], sni: Option<&str>) -> Option<&'a T> {
    if let Some(host) = sni {
        let exact = certs.iter().find(|(names, _)| {
            names.iter().any(|n| !n.starts_with("*.") && ctls::name_matches(n, host))
        });
        let wild =
            || certs.iter().find(|(names, _)| names.iter().any(|n| ctls::name_matches(n, host)));
        if let Some((_, c)) = exact.or_else(wild) {
            return Some(c);
        }
    }
    certs.first().map(|(_, c)| c)
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        choose(&self.certs, hello.server_name()).cloned()
    }
}

/// Builds the rustls configuration of a `tls` table, loading every file (`alpn`: the protocols
/// offered, empty for none); the error names the file and what is wrong with it.
pub fn server_config(spec: &ListenerTls, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, String> {
    server_config_with(spec, alpn, &Staples::default())
}

/// [`server_config`] with the OCSP responses fetched so far (`ocsp = "fetch"`); a response
/// file (`ocsp = "FILE"`) is read and checked here, and one that fails fails the whole load.
fn server_config_with(
    spec: &ListenerTls,
    alpn: &[&[u8]],
    staples: &Staples,
) -> Result<Arc<ServerConfig>, String> {
    let mut certs = Vec::with_capacity(spec.certs.len());
    for ck in &spec.certs {
        let loaded = ctls::load_cert_key(ck).map_err(|(_, e)| e)?;
        let staple = match &ck.ocsp {
            Some(OcspSource::Fetch) => staples.current(&ck.cert, &loaded.certified.cert),
            _ => ctls::check_ocsp(ck, &loaded)?.map(|s| s.der),
        };
        let certified = match staple {
            None => loaded.certified,
            Some(der) => {
                let mut with = (*loaded.certified).clone();
                with.ocsp = Some(der);
                Arc::new(with)
            }
        };
        certs.push((loaded.names, certified));
    }
    if certs.is_empty() {
        return Err("no certificate".to_owned());
    }
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("tls versions: {e}"))?;
    let builder = match (spec.client_auth, &spec.client_ca) {
        (ClientAuth::None, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let roots = Arc::new(ctls::load_roots(ca, "client_ca")?);
            let b = WebPkiClientVerifier::builder_with_provider(roots, provider());
            let b = if auth == ClientAuth::Optional { b.allow_unauthenticated() } else { b };
            let verifier = b.build().map_err(|e| format!("client_ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(SniResolver { certs }));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// One socket's TLS: the configuration in force and how to reload it.
#[derive(Debug)]
pub struct TlsServer {
    /// The socket's name in logs and in the `listener` label of the TLS metrics (a router
    /// listener's name, or `[admin]`, `[naming]`, `[agent]`).
    name: String,
    spec: ListenerTls,
    alpn: &'static [&'static [u8]],
    current: ArcSwap<ServerConfig>,
    /// How long a handshake may take.
    pub handshake_timeout: Duration,
    metrics: Arc<Metrics>,
    /// The OCSP responses fetched for `ocsp = "fetch"` certificates.
    staples: Staples,
    /// Wakes the OCSP fetchers (SIGHUP).
    refetch: tokio::sync::Notify,
}

impl TlsServer {
    /// Loads the `tls` table of the socket `name`, offering `alpn`; handshakes get
    /// `handshake_timeout`. The error names the file that failed and why.
    pub fn new(
        name: &str,
        spec: &ListenerTls,
        alpn: &'static [&'static [u8]],
        handshake_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, String> {
        let config = server_config(spec, alpn)?;
        Ok(Arc::new(TlsServer {
            name: name.to_owned(),
            spec: spec.clone(),
            alpn,
            current: ArcSwap::new(config),
            handshake_timeout,
            metrics,
            staples: Staples::default(),
            refetch: tokio::sync::Notify::new(),
        }))
    }

    /// The socket's name (as in the metrics).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rustls configuration in force (a reload swaps it; an HTTP/3 listener's QUIC
    /// configuration asks it for each handshake's certificate).
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Reloads every file; on failure the configuration in force stays and the reason is
    /// logged. `source` says what asked (`file change`, `SIGHUP`).
    pub fn reload(&self, source: &str) -> Result<(), String> {
        match server_config_with(&self.spec, self.alpn, &self.staples) {
            Ok(config) => {
                self.current.store(config);
                self.metrics.tls_listener(true, &self.name, "accepted");
                tracing::info!(listener = %self.name, "tls certificates reloaded ({source})");
                Ok(())
            }
            Err(e) => {
                self.metrics.tls_listener(true, &self.name, "rejected");
                tracing::warn!(
                    listener = %self.name,
                    "tls reload ({source}) rejected, the certificates in force stay: {e}"
                );
                Err(e)
            }
        }
    }

    /// The TLS handshake with a client, bounded by the handshake timeout, counted by result.
    pub async fn accept(&self, stream: TcpStream) -> Result<TlsStream<TcpStream>, String> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.current.load_full());
        let accepted = tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream)).await;
        let result = match &accepted {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "failed",
            Err(_) => "timeout",
        };
        self.metrics.tls_listener(false, &self.name, result);
        match accepted {
            Ok(Ok(s)) => {
                self.metrics.tls_detail.handshake(&self.name, s.get_ref().1);
                Ok(s)
            }
            Ok(Err(e)) => Err(format!("tls handshake failed: {e}")),
            Err(_) => Err("tls handshake timed out".to_owned()),
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> =
            self.spec.certs.iter().flat_map(|c| [c.cert.clone(), c.key.clone()]).collect();
        v.extend(self.spec.client_ca.clone());
        v.extend(self.spec.certs.iter().filter_map(|c| match &c.ocsp {
            Some(OcspSource::File(f)) => Some(f.clone()),
            _ => None,
        }));
        v
    }

    /// Reloads when any file changes (modification time, length or inode; checked every
    /// 250 ms, reloaded once the change has stood for one more look) and on SIGHUP, until
    /// `stopped` changes.
    pub fn watch(self: Arc<Self>, stopped: watch::Receiver<bool>) {
        tokio::spawn(self.watch_loop(Some(stopped)));
    }

    /// [`TlsServer::watch`] until the returned task is aborted.
    pub fn spawn_watch(self: Arc<Self>) -> JoinHandle<()> {
        tokio::spawn(self.watch_loop(None))
    }

    async fn watch_loop(self: Arc<Self>, mut stopped: Option<watch::Receiver<bool>>) {
        // The OCSP fetchers live as long as this loop (aborted when it returns or is aborted).
        let _fetchers: Vec<AbortOnDrop> = self
            .spec
            .certs
            .iter()
            .filter(|c| c.ocsp == Some(OcspSource::Fetch))
            .map(|c| AbortOnDrop(tokio::spawn(fetch_loop(self.clone(), c.cert.clone()))))
            .collect();
        let stamp = |files: &[PathBuf]| -> Vec<Option<(Option<SystemTime>, u64, u64)>> {
            files
                .iter()
                .map(|f| {
                    let m = std::fs::metadata(f).ok()?;
                    #[cfg(unix)]
                    let ino = std::os::unix::fs::MetadataExt::ino(&m);
                    #[cfg(not(unix))]
                    let ino = 0;
                    Some((m.modified().ok(), m.len(), ino))
                })
                .collect()
        };
        let files = self.files();
        let mut applied = stamp(&files);
        let mut seen = applied.clone();
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            #[cfg(unix)]
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hup_recv = std::future::pending::<Option<()>>();
            let stop = async {
                match stopped.as_mut() {
                    Some(s) => s.changed().await.map_or((), drop),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop => return,
                Some(()) = hup_recv => {
                    applied = stamp(&files);
                    seen = applied.clone();
                    let _ = self.reload("SIGHUP");
                    self.refetch.notify_waiters();
                }
                _ = tick.tick() => {
                    let now = stamp(&files);
                    if now != seen {
                        // Still changing (a key written after its certificate): wait.
                        seen = now;
                    } else if now != applied && now.iter().all(Option::is_some) {
                        applied = now;
                        let _ = self.reload("file change");
                    }
                }
            }
        }
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Restaple for TlsServer {
    fn name(&self) -> &str {
        &self.name
    }

    fn staples(&self) -> &Staples {
        &self.staples
    }

    fn counted(&self, ok: bool) {
        self.metrics.tls_detail.ocsp_fetch(&self.name, ok);
    }

    fn refetch(&self) -> &tokio::sync::Notify {
        &self.refetch
    }

    fn restaple(&self) {
        // Not a reload: the files are read again only to rebuild the same configuration with
        // the new response; if they fail now, the next file change or SIGHUP says so.
        match server_config_with(&self.spec, self.alpn, &self.staples) {
            Ok(config) => self.current.store(config),
            Err(e) => tracing::warn!(listener = %self.name, "ocsp staple not applied: {e}"),
        }
    }
}

/// How long a client of the admin API, the naming service or the agents' first contact may
/// take over its handshake (router listeners use their `header_read_timeout_ms`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most handshakes of one [`TlsIncoming`] in progress at once; a connection beyond them is
/// closed at once (each handshake is bounded in time, so this bounds the memory they hold).
pub const MAX_HANDSHAKES: usize = 256;

/// Finished handshakes waiting for the server to take them.
const QUEUE: usize = 64;

/// A TCP listener whose connections come out TLS-terminated: accepts, runs each handshake in
/// its own task (at most [`MAX_HANDSHAKES`] at once), and queues the finished ones. Failed
/// handshakes are counted by the [`TlsServer`] and logged at debug level. Dropping it stops
/// accepting.
#[derive(Debug)]
pub struct TlsIncoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    task: JoinHandle<()>,
    watcher: JoinHandle<()>,
}

impl TlsIncoming {
    /// Starts accepting on `listener` with `tls` (whose files are then watched for changes).
    pub fn new(listener: TcpListener, tls: Arc<TlsServer>) -> std::io::Result<TlsIncoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let watcher = tls.clone().spawn_watch();
        let task = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: pause rather than spin.
                        tracing::warn!(listener = %tls.name(), "accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::debug!(listener = %tls.name(), %peer, "too many tls handshakes in progress: closed");
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let tls = tls.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    match tls.accept(tcp).await {
                        Ok(s) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Err(e) => tracing::debug!(listener = %tls.name(), %peer, "{e}"),
                    }
                });
            }
        });
        Ok(TlsIncoming { rx, local, task, watcher })
    }

    /// The next finished handshake; `None` once the acceptor stopped.
    pub async fn next(&mut self) -> Option<(TlsStream<TcpStream>, std::net::SocketAddr)> {
        self.rx.recv().await
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.task.abort();
        self.watcher.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// What a verified client certificate tells members (router listeners and queue listeners).
// ---------------------------------------------------------------------------------------------

/// The header carrying a verified client certificate's subject (RFC 4514 form).
pub const CLIENT_CERT_SUBJECT: &str = "x-client-cert-subject";
/// The header carrying a verified client certificate's subject alternative names
/// (`DNS:a.example, IP:127.0.0.1, URI:spiffe://..., email:x@y`, comma separated).
pub const CLIENT_CERT_SAN: &str = "x-client-cert-san";

/// What a completed handshake tells members.
#[derive(Debug, Clone, Default)]
pub struct ClientCert {
    /// [`CLIENT_CERT_SUBJECT`]'s value.
    pub subject: Option<HeaderValue>,
    /// [`CLIENT_CERT_SAN`]'s value.
    pub san: Option<HeaderValue>,
    /// The TLS version negotiated (`TLSv1.3`), for the access log.
    pub version: Option<&'static str>,
    /// The server name the client's hello asked for, for the access log.
    pub sni: Option<std::sync::Arc<str>>,
}

/// A header value from text, with anything not visible ASCII escaped (`\u{..}`).
fn header_value(s: &str) -> Option<HeaderValue> {
    let clean: String = s
        .chars()
        .flat_map(|c| {
            if c.is_ascii_graphic() || c == ' ' { vec![c] } else { c.escape_unicode().collect() }
        })
        .collect();
    HeaderValue::from_str(&clean).ok()
}

/// The subject and subject alternative names of a (verified) client certificate.
pub fn client_cert(der: &[u8]) -> ClientCert {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return ClientCert::default();
    };
    let subject = header_value(&cert.subject().to_string());
    let mut sans = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => sans.push(format!("DNS:{d}")),
                GeneralName::RFC822Name(e) => sans.push(format!("email:{e}")),
                GeneralName::URI(u) => sans.push(format!("URI:{u}")),
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b)
                            .ok()
                            .map(|a| std::net::IpAddr::from(a).to_string()),
                        16 => <[u8; 16]>::try_from(*b)
                            .ok()
                            .map(|a| std::net::IpAddr::from(a).to_string()),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        sans.push(format!("IP:{ip}"));
                    }
                }
                _ => {}
            }
        }
    }
    let san = (!sans.is_empty()).then(|| header_value(&sans.join(", "))).flatten();
    ClientCert { subject, san, ..ClientCert::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_name_wins_over_a_wildcard_listed_before_it() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let certs = vec![
            (names(&["default.test"]), "default"),
            (names(&["*.x.test"]), "wildcard"),
            (names(&["api.x.test", "other.test"]), "exact"),
        ];
        assert_eq!(choose(&certs, Some("API.x.test")), Some(&"exact"));
        assert_eq!(choose(&certs, Some("web.x.test")), Some(&"wildcard"));
        assert_eq!(choose(&certs, Some("a.b.x.test")), Some(&"default"));
        assert_eq!(choose(&certs, Some("nowhere.test")), Some(&"default"));
        assert_eq!(choose(&certs, None), Some(&"default"));
        assert_eq!(choose::<&str>(&[], Some("a.test")), None);
    }

    #[test]
    fn header_values_escape_what_a_header_cannot_hold() {
        assert_eq!(header_value("CN=a, O=b").unwrap(), "CN=a, O=b");
        assert_eq!(header_value("CN=\u{e9}\n").unwrap(), "CN=\\u{e9}\\u{a}");
    }
}
