//! `rondo serve`: loads the configuration, starts the live state, the probes and the router,
//! reloads routes, clusters and members when the config file changes or on SIGHUP, and runs
//! until interrupted.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use rondo_runtime::reload::{self, Reloader};
use rondo_runtime::{Live, probe};

/// The first view's id.
const FIRST_VIEW: u64 = 1;

/// Runs the router from the configuration at `path` on `workers` threads (default: one per
/// core) until SIGINT or SIGTERM; the log starts from `log` and the config's `[log]`.
pub fn serve(
    path: &Path,
    workers: Option<usize>,
    log: &crate::cli::LogArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    // Checked against this build's features before anything is bound.
    let config = match rondo_config::load_file_with(path, FIRST_VIEW, crate::features()) {
        Ok(c) => c,
        Err(errors) => {
            crate::init_tracing(log, None, "info");
            for e in &errors {
                writeln!(err, "{e}")?;
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    crate::init_tracing(log, Some(&config.log), "info");
    for w in &config.warnings {
        tracing::warn!("config: {}", w.as_warning());
    }
    let runtime = runtime(workers)?;
    runtime.block_on(async {
        let live = Arc::new(Live::new(config.view.clone(), config.router.group.clone()));
        if let Some(k) = &config.router.tier_key {
            match rondo_runtime::secret::read_token(k) {
                Ok(bytes) if bytes.len() >= 16 => {
                    live.set_tier_key(rondo_runtime::secret::TierKey::new(&bytes))
                }
                Ok(_) => {
                    writeln!(err, "rondo serve: the tier key must be at least 16 bytes")?;
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => {
                    writeln!(err, "rondo serve: tier key: {e}")?;
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        probe::spawn(&live.load());
        let router = match rondo_proxy::start(&config.listeners, live.clone()).await {
            Ok(r) => r,
            Err(e) => {
                writeln!(err, "rondo serve: {e}")?;
                return Ok(ExitCode::FAILURE);
            }
        };
        // The process's own sockets, which the naming service refuses as member addresses.
        let mut own: Vec<rondo_naming::api::OwnAddress> = Vec::new();
        for (name, addr) in &router.listeners {
            writeln!(out, "rondo: listener {name} on {addr}")?;
            own.push(rondo_naming::api::OwnAddress {
                what: format!("listener {name}"),
                addr: *addr,
            });
        }
        // The durable queues (`[[queue]]`, `queue` listeners): stores opened (a damaged store
        // file stops the start, naming it), delivery workers started.
        let _queues = if config.queues.is_empty() {
            None
        } else {
            match rondo_queue::start(&config, live.clone()).await {
                Ok(q) => {
                    for spec in &config.queues {
                        let at = match &spec.backend {
                            rondo_config::QueueBackend::Embedded { directory } => {
                                rondo_queue::embedded::store_path(directory, &spec.name)
                                    .display()
                                    .to_string()
                            }
                            rondo_config::QueueBackend::Nats { url } => format!("nats {url}"),
                        };
                        writeln!(
                            out,
                            "rondo: queue {} ({}, {at})",
                            spec.name,
                            spec.backend.as_str()
                        )?;
                    }
                    for (name, addr) in &q.listeners {
                        writeln!(out, "rondo: queue listener {name} on {addr}")?;
                        own.push(rondo_naming::api::OwnAddress {
                            what: format!("queue listener {name}"),
                            addr: *addr,
                        });
                    }
                    Some(q)
                }
                Err(e) => {
                    writeln!(err, "rondo serve: {e}")?;
                    router.stop();
                    return Ok(ExitCode::FAILURE);
                }
            }
        };
        let mut _receiver = None;
        if let Some(spec) = &config.agent {
            let key = match read_key(&spec.key) {
                Ok(k) => k,
                Err(e) => {
                    writeln!(err, "rondo serve: {e}")?;
                    router.stop();
                    return Ok(ExitCode::FAILURE);
                }
            };
            let tls = match &spec.tls {
                None => None,
                Some(t) => match rondo_runtime::tls_server::TlsServer::new(
                    "[agent]",
                    t,
                    &[],
                    rondo_runtime::tls_server::HANDSHAKE_TIMEOUT,
                    live.metrics.clone(),
                ) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        writeln!(err, "rondo serve: [agent] tls: {e}")?;
                        router.stop();
                        return Ok(ExitCode::FAILURE);
                    }
                },
            };
            let opts = rondo_agent::ReceiverOpts {
                listen: spec.listen,
                key: rondo_agent::Key::new(&key),
                interval: spec.interval,
                tls,
            };
            match rondo_agent::receiver::start(opts, live.clone()).await {
                Ok(r) => {
                    let tls = if spec.tls.is_some() { ", tls on tcp" } else { "" };
                    writeln!(out, "rondo: agent receiver on {} (tcp and udp{tls})", r.addr)?;
                    own.push(rondo_naming::api::OwnAddress {
                        what: "agent receiver".to_owned(),
                        addr: r.addr,
                    });
                    _receiver = Some(r);
                }
                Err(e) => {
                    writeln!(err, "rondo serve: agent receiver on {}: {e}", spec.listen)?;
                    router.stop();
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        // The admin API (`[admin]`), stopped when the server returns.
        let mut _admin = None;
        if let Some(spec) = &config.admin {
            match rondo_admin::start(spec, live.clone()).await {
                Ok(a) => {
                    writeln!(out, "rondo: admin API on {}", a.addr)?;
                    writeln!(
                        out,
                        "rondo: dashboard on {}://{}/ (it asks for the admin token)",
                        a.scheme(),
                        a.addr
                    )?;
                    own.push(rondo_naming::api::OwnAddress {
                        what: "admin API".to_owned(),
                        addr: a.addr,
                    });
                    _admin = Some(a);
                }
                Err(e) => {
                    writeln!(err, "rondo serve: admin API on {}: {e}", spec.listen)?;
                    router.stop();
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        // The naming service (`[naming]`): registry, HTTP API, DNS; stopped when serve returns.
        let mut _naming = None;
        if let Some(spec) = &config.naming {
            match start_naming(spec, live.clone(), own, out).await {
                Ok(n) => _naming = Some(n),
                Err(e) => {
                    writeln!(err, "rondo serve: {e}")?;
                    router.stop();
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        // Live reconfiguration: the config file's changes (polled, debounced) and SIGHUP.
        let reloader = Arc::new(Reloader::new(path, live.clone(), &config));
        let watcher =
            reload::watch_file(reloader.clone(), reload::DEFAULT_POLL, reload::DEFAULT_SETTLE);
        #[cfg(unix)]
        let hup = match reload::on_sighup(reloader.clone()) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!("cannot handle SIGHUP, reload by saving the config file: {e}");
                None
            }
        };
        // SIGHUP also reopens access log files (after a rotation renamed them).
        #[cfg(unix)]
        let reopen = reopen_access_logs_on_sighup();
        writeln!(out, "rondo: reloading on changes to {} and on SIGHUP", path.display())?;
        out.flush()?;
        shutdown_signal().await;
        watcher.abort();
        #[cfg(unix)]
        if let Some(h) = hup {
            h.abort();
        }
        #[cfg(unix)]
        reopen.abort();
        writeln!(out, "rondo: shutting down")?;
        router.stop();
        if let Some(q) = &_queues {
            q.stop();
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// What the naming service runs; dropping it stops all of it.
#[derive(Debug)]
struct Naming {
    registry: rondo_naming::Registry,
    _api: rondo_naming::api::NamingServer,
    #[cfg(feature = "dns")]
    _dns: Option<rondo_naming::dns::DnsServer>,
}

impl Drop for Naming {
    fn drop(&mut self) {
        self.registry.stop();
    }
}

async fn start_naming(
    spec: &rondo_config::NamingSpec,
    live: Arc<Live>,
    own: Vec<rondo_naming::api::OwnAddress>,
    out: &mut dyn Write,
) -> anyhow::Result<Naming> {
    // The embedded registry keeps this router's revocations beside its snapshot (an etcd tier
    // keeps them in etcd).
    if let rondo_config::RegistrySpec::Embedded { snapshot: Some(snapshot) } = &spec.registry {
        let mut path = snapshot.clone().into_os_string();
        path.push(".revoked");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        live.revocations.set_store(path.into(), now).map_err(|e| anyhow::anyhow!("naming: {e}"))?;
    }
    let limits = rondo_naming::Limits::of(spec);
    live.allow_declared(spec.allow_registered_clusters);
    let registry = rondo_naming::start_registry_with(&spec.registry, limits, live.clone())
        .map_err(|e| anyhow::anyhow!("naming registry: {e}"))?;
    let token = match &spec.token {
        Some(t) => Some(rondo_runtime::secret::read_token(t).context("[naming] token")?),
        None => None,
    };
    let opts = rondo_naming::api::ApiOptions {
        token,
        allowed_hosts: spec.allowed_hosts.clone(),
        own,
        tls: spec.tls.clone(),
        allow_registered_clusters: spec.allow_registered_clusters,
    };
    let api = rondo_naming::api::start_with(spec.listen, live.clone(), registry.clone(), opts)
        .await
        .with_context(|| format!("naming API on {}", spec.listen))?;
    writeln!(out, "rondo: naming API (registry {}) on {}", registry.status().backend, api.addr)?;
    #[cfg(feature = "dns")]
    let dns = match &spec.dns {
        Some(d) => {
            let server = rondo_naming::dns::start(d.listen, &d.zone, live)
                .await
                .with_context(|| format!("naming DNS on {}", d.listen))?;
            writeln!(out, "rondo: naming DNS (udp and tcp, zone {}) on {}", d.zone, server.addr)?;
            Some(server)
        }
        None => None,
    };
    #[cfg(not(feature = "dns"))]
    if spec.dns.is_some() {
        anyhow::bail!(
            "[naming] dns_listen: this rondo was built without the `dns` feature \
             (cargo build --features dns)"
        );
    }
    Ok(Naming {
        registry,
        _api: api,
        #[cfg(feature = "dns")]
        _dns: dns,
    })
}

/// The agents' shared key: inline, or a file's content without its trailing newline.
pub fn read_key(key: &rondo_config::AgentKey) -> anyhow::Result<Vec<u8>> {
    let bytes = match key {
        rondo_config::AgentKey::Inline(k) => k.as_bytes().to_vec(),
        rondo_config::AgentKey::File(path) => {
            let mut b = std::fs::read(path)
                .with_context(|| format!("cannot read agent key file {}", path.display()))?;
            if b.last() == Some(&b'\n') {
                b.pop();
                if b.last() == Some(&b'\r') {
                    b.pop();
                }
            }
            b
        }
    };
    anyhow::ensure!(!bytes.is_empty(), "the agent key is empty");
    Ok(bytes)
}

/// A tokio runtime with `workers` threads (default: one per core). One worker gets a
/// current-thread runtime: everything runs on the calling thread, with no work-stealing queues
/// and no cross-thread wake-ups (the HAProxy / nginx single-thread shape).
pub fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.max(1));
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all().build().context("starting the async runtime")
}

/// Reopens every access log file on each SIGHUP (one more listener of the signal, beside the
/// reloader's).
#[cfg(unix)]
fn reopen_access_logs_on_sighup() -> tokio::task::JoinHandle<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let hup = signal(SignalKind::hangup());
    tokio::spawn(async move {
        let Ok(mut hup) = hup else { return };
        while hup.recv().await.is_some() {
            rondo_proxy::access::reopen_all();
        }
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
