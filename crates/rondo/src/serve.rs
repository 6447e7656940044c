//! `rondo serve`: loads the configuration, starts the live state, the probes and the router,
//! reloads routes, clusters and members when the config file changes or on SIGHUP, and runs
//! until interrupted.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use rondo_runtime::reload::{self, Reloader};
use rondo_runtime::{Live, handoff, probe};

/// The first view's id.
const FIRST_VIEW: u64 = 1;

/// How `rondo serve` was started: what a `SIGUSR2` or `rondo ctl upgrade` starts again.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The executable, as resolved at start (a new binary at that path is an upgrade).
    pub exe: std::path::PathBuf,
    /// The arguments after the program name.
    pub args: Vec<std::ffi::OsString>,
}

impl Invocation {
    /// This process's.
    pub fn current() -> Self {
        Invocation {
            exe: std::env::current_exe().unwrap_or_else(|_| "rondo".into()),
            args: std::env::args_os().skip(1).collect(),
        }
    }
}

/// Why the serving loop ended.
enum End {
    /// `SIGTERM` or `SIGINT`: drain, then exit.
    Signal,
    /// A new process took over (its pid), once the hand-over is written to it.
    Upgraded(u32, tokio::sync::oneshot::Receiver<Result<(), String>>),
}

/// Runs the router from the configuration at `path` on `workers` threads (default: one per
/// core) until SIGINT or SIGTERM (then it drains: see [`crate::upgrade`]); the log starts from
/// `log` and the config's `[log]`. With `upgrade`, it takes over from the process serving on
/// `[router] upgrade_socket` instead of binding anew.
pub fn serve(
    path: &Path,
    workers: Option<usize>,
    upgrade: bool,
    log: &crate::cli::LogArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    // Checked against this build's features before anything is bound.
    let mut config = match rondo_config::load_file_with(path, FIRST_VIEW, crate::features()) {
        Ok(c) => c,
        Err(errors) => {
            crate::init_tracing(log, None, "info");
            for e in &errors {
                writeln!(err, "{e}")?;
            }
            if upgrade {
                writeln!(err, "rondo serve --upgrade: the running rondo was not touched")?;
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    crate::init_tracing(log, Some(&config.log), "info");
    for w in &config.warnings {
        tracing::warn!("config: {}", w.as_warning());
    }
    // The running process's sockets and state, before anything else starts.
    let takeover = if upgrade {
        let Some(socket) = &config.router.upgrade_socket else {
            writeln!(
                err,
                "rondo serve --upgrade: {}: [router] upgrade_socket is not set, so there is no \
                 running rondo to take over from",
                path.display()
            )?;
            return Ok(ExitCode::FAILURE);
        };
        match crate::upgrade::connect(socket) {
            Ok(t) => {
                config.view.id = config.view.id.max(t.state.view_id + 1);
                Some(t)
            }
            Err(e) => {
                writeln!(err, "rondo serve --upgrade: {e:#}")?;
                return Ok(ExitCode::FAILURE);
            }
        }
    } else {
        None
    };
    let runtime = runtime(workers)?;
    let code = runtime.block_on(run(path, &config, takeover, out, err));
    // Whatever still runs (a connection past the drain timeout) ends with the process.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

async fn run(
    path: &Path,
    config: &rondo_config::Config,
    mut takeover: Option<crate::upgrade::Takeover>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    // First: a signal from here on is handled, never the default that ends the process (a
    // `SIGUSR2` sent as soon as the admin API answers must not kill it).
    let Signals { mut term, mut int, mut usr2 } = Signals::new()?;
    // Status lines wait until every part is bound: a part that cannot start (its port taken)
    // stops the start before anything was announced as up. `out` is the buffer until then.
    let mut announced: Vec<u8> = Vec::new();
    let (stdout, out) = (out, &mut announced as &mut dyn Write);
    let live = Arc::new(Live::new(config.view.clone(), config.router.group.clone()));
    if config.router.upgrade_socket.is_some() {
        live.sockets.keep_for_successor();
    }
    if let Some(t) = takeover.as_mut() {
        live.sockets.inherit(std::mem::take(&mut t.keys), std::mem::take(&mut t.fds));
        let members = handoff::import(&live, &t.state);
        tracing::info!(from = t.from, members, "upgrade: sockets and state taken over");
    }
    // This router's own revocations, loaded before the admin API can make one (and written
    // again with what the process it replaced handed over).
    if let Some(store) = revocations_file(config) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Err(e) = live.revocations.set_store(store, now) {
            writeln!(err, "rondo serve: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    }
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
        Ok(r) => Arc::new(r),
        Err(e) => {
            writeln!(err, "rondo serve: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Some(t) = &takeover
        && let Some(sessions) = t.state.parts.get("router")
    {
        let (pinned, logs) = router.import_sessions(sessions, &live);
        tracing::info!(pinned, logs, "upgrade: sessions and kept requests taken over");
    }
    // The process's own sockets, which the naming service refuses as member addresses.
    let mut own: Vec<rondo_naming::api::OwnAddress> = Vec::new();
    for (name, addr) in &router.listeners {
        writeln!(out, "rondo: listener {name} on {addr}")?;
        own.push(rondo_naming::api::OwnAddress { what: format!("listener {name}"), addr: *addr });
    }
    let mut receiver = None;
    if let Some(spec) = &config.agent {
        let key = match read_key(&spec.key) {
            Ok(k) => k,
            Err(e) => {
                writeln!(err, "rondo serve: {e}")?;
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
                    return Ok(ExitCode::FAILURE);
                }
            },
        };
        let resume = takeover
            .as_ref()
            .and_then(|t| t.state.parts.get("agent"))
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let opts = rondo_agent::ReceiverOpts {
            listen: spec.listen,
            key: rondo_agent::Key::new(&key),
            interval: spec.interval,
            tls,
            resume,
        };
        match rondo_agent::receiver::start(opts, live.clone()).await {
            Ok(r) => {
                let tls = if spec.tls.is_some() { ", tls on tcp" } else { "" };
                writeln!(out, "rondo: agent receiver on {} (tcp and udp{tls})", r.addr)?;
                own.push(rondo_naming::api::OwnAddress {
                    what: "agent receiver".to_owned(),
                    addr: r.addr,
                });
                receiver = Some(Arc::new(r));
            }
            Err(e) => {
                writeln!(err, "rondo serve: agent receiver on {}: {e}", spec.listen)?;
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
                // The token only to a terminal: a service's output goes to its log.
                let link = a.dashboard_link(std::io::IsTerminal::is_terminal(&std::io::stdout()));
                writeln!(out, "rondo: dashboard on {link}")?;
                own.push(rondo_naming::api::OwnAddress {
                    what: "admin API".to_owned(),
                    addr: a.addr,
                });
                _admin = Some(a);
            }
            Err(e) => {
                writeln!(err, "rondo serve: admin API on {}: {e}", spec.listen)?;
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    // Taking over: ready to serve. The running process stops accepting, its registry's writer
    // ends, and its state as of then comes back.
    let mut handed = None;
    if let Some(t) = takeover.take() {
        let from = t.from;
        match tokio::task::spawn_blocking(move || t.ready()).await {
            Ok(Ok(state)) => {
                handoff::import(&live, &state);
                tracing::info!(from, "upgrade: the old process handed over and drains");
                handed = Some(state);
            }
            Ok(Err(e)) => {
                writeln!(err, "rondo serve --upgrade: {e:#}")?;
                return Ok(ExitCode::FAILURE);
            }
            Err(e) => {
                writeln!(err, "rondo serve --upgrade: {e}")?;
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    // The durable queues (`[[queue]]`, `queue` listeners): stores opened (a damaged store file
    // stops the start, naming it), delivery workers started. After a hand-over, since the old
    // process held the embedded stores until then.
    let queues = if config.queues.is_empty() {
        None
    } else {
        match rondo_queue::start(config, live.clone()).await {
            Ok(q) => {
                for spec in &config.queues {
                    let at = match &spec.backend {
                        rondo_config::QueueBackend::Embedded { directory } => {
                            rondo_queue::embedded::store_path(directory, &spec.name)
                                .display()
                                .to_string()
                        }
                        rondo_config::QueueBackend::Nats { url, .. } => format!("nats {url}"),
                    };
                    writeln!(out, "rondo: queue {} ({}, {at})", spec.name, spec.backend.as_str())?;
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
                return Ok(ExitCode::FAILURE);
            }
        }
    };
    // The naming service (`[naming]`): registry, HTTP API, DNS; stopped when serve returns.
    let mut naming = None;
    if let Some(spec) = &config.naming {
        match start_naming(spec, live.clone(), own, out).await {
            Ok(n) => naming = Some(n),
            Err(e) => {
                writeln!(err, "rondo serve: {e}")?;
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    if let Some(state) = &handed {
        // Again, now that the registered members are in the view; and the sessions as of the
        // hand-over (those the old process served since the offer).
        handoff::import(&live, state);
        if let Some(sessions) = state.parts.get("router") {
            router.import_sessions(sessions, &live);
        }
    }
    // Live reconfiguration: the config file's changes (polled, debounced) and SIGHUP.
    let reloader = Arc::new(Reloader::new(path, live.clone(), config));
    let watcher =
        reload::watch_file(reloader.clone(), reload::DEFAULT_POLL, reload::DEFAULT_SETTLE);
    let hup = match reload::on_sighup(reloader.clone()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!("cannot handle SIGHUP, reload by saving the config file: {e}");
            None
        }
    };
    // SIGHUP also reopens access log files (after a rotation renamed them).
    let reopen = reopen_access_logs_on_sighup();
    // What this process hands to the one that replaces it: the live state and revocations, the
    // router's sessions and kept requests, the agent receiver's epoch (`last`: the hand-over).
    let export: Arc<dyn Fn(bool) -> handoff::StateDoc + Send + Sync> = {
        let (live, router, receiver) = (live.clone(), router.clone(), receiver.clone());
        Arc::new(move |last| {
            let mut doc = handoff::export(&live, last);
            doc.parts.insert("router".to_owned(), router.export_sessions());
            if let Some(r) = &receiver
                && let Ok(v) = serde_json::to_value(r.resume())
            {
                doc.parts.insert("agent".to_owned(), v);
            }
            doc
        })
    };
    // Hitless upgrades: the upgrade socket, `SIGUSR2` and the admin API's `upgrade`.
    let invocation = Invocation::current();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(1);
    if let Some(socket) = &config.router.upgrade_socket {
        let listener = match live.sockets.unix_listener("upgrade", socket) {
            Ok(l) => l,
            Err(e) => {
                writeln!(err, "rondo serve: [router] upgrade_socket {}: {e}", socket.display())?;
                return Ok(ExitCode::FAILURE);
            }
        };
        crate::upgrade::serve(listener, live.clone(), export.clone(), ready_tx)
            .context("starting the upgrade socket's thread")?;
        let inv = invocation.clone();
        live.upgrader.set(move || crate::upgrade::spawn_successor(&inv.exe, &inv.args));
        writeln!(out, "rondo: upgrades on {} (rondo serve --upgrade, SIGUSR2)", socket.display())?;
    }
    let unused = live.sockets.unused();
    if !unused.is_empty() {
        tracing::info!(sockets = ?unused, "upgrade: sockets the new configuration does not use are closed");
    }
    writeln!(out, "rondo: reloading on changes to {} and on SIGHUP", path.display())?;
    let out = stdout;
    out.write_all(&announced)?;
    out.flush()?;
    crate::upgrade::notify(&if handed.is_some() {
        format!("MAINPID={}\nREADY=1", std::process::id())
    } else {
        "READY=1".to_owned()
    });
    let end = loop {
        tokio::select! {
            _ = term.recv() => break End::Signal,
            _ = int.recv() => break End::Signal,
            Some(ready) = ready_rx.recv() => {
                // Stop accepting everywhere; the registry's writer ends so that the new process
                // can open its files; then the state as of now.
                router.stop();
                if let Some(r) = &receiver {
                    r.stop();
                }
                live.drain.start();
                if let Some(n) = &naming {
                    n.release();
                }
                // The queues stop delivering and close their stores, for the new process to
                // open (a message in delivery is delivered again there: at least once).
                if let Some(q) = &queues {
                    q.stop();
                }
                let _ = ready.reply.send(export(true));
                break End::Upgraded(ready.pid, ready.sent);
            }
            _ = usr2.recv() => {
                if config.router.upgrade_socket.is_none() {
                    tracing::warn!("SIGUSR2: no [router] upgrade_socket, so no upgrade");
                } else if let Some(Err(e)) = live.upgrader.start() {
                    tracing::warn!("SIGUSR2: upgrade not started: {e}");
                }
            }
        }
    };
    watcher.abort();
    if let Some(h) = hup {
        h.abort();
    }
    reopen.abort();
    // The drain: nothing new is accepted; requests, streams and tunnels in progress get
    // `drain_timeout`; idle connections close.
    router.stop();
    if let Some(r) = &receiver {
        r.stop();
    }
    live.drain.start();
    live.sockets.release();
    if matches!(end, End::Signal) {
        // (Not after a hand-over: the new process is the service's main process by now, or is
        // about to say so, and a STOPPING=1 from this one could stop the service.)
        crate::upgrade::notify("STOPPING=1");
    }
    let open = router.open_connections();
    match end {
        End::Signal => writeln!(out, "rondo: shutting down: draining {open} connection(s)")?,
        End::Upgraded(pid, sent) => {
            // The hand-over is written by the upgrade socket's thread: this process exits only
            // after it is (an exit before would leave the new process without its state, and
            // it gives up).
            match tokio::time::timeout(crate::upgrade::HANDOVER_WRITE_TIMEOUT, sent).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::error!(pid, "upgrade: {e}"),
                Ok(Err(_)) => tracing::error!(pid, "upgrade: the hand-over was never written"),
                Err(_) => tracing::error!(
                    pid,
                    "upgrade: the hand-over was not written in {} s",
                    crate::upgrade::HANDOVER_WRITE_TIMEOUT.as_secs()
                ),
            }
            writeln!(out, "rondo: handed over to pid {pid}: draining {open} connection(s)")?
        }
    }
    out.flush()?;
    let timeout = config.router.drain_timeout;
    if let Some(q) = &queues {
        q.stop();
    }
    let drained = async {
        router.drained().await;
        if let Some(q) = &queues {
            q.drained().await;
        }
    };
    tokio::select! {
        () = drained => tracing::info!("drained: every connection finished"),
        () = tokio::time::sleep(timeout) => tracing::warn!(
            open = router.open_connections(),
            "drain timeout ({} ms) reached: the connections still open are cut",
            timeout.as_millis()
        ),
        _ = term.recv() => tracing::warn!(
            open = router.open_connections(),
            "a second SIGTERM: the connections still open are cut"
        ),
        _ = int.recv() => tracing::warn!(
            open = router.open_connections(),
            "a second SIGINT: the connections still open are cut"
        ),
    }
    drop(naming);
    writeln!(out, "rondo: stopped")?;
    Ok(ExitCode::SUCCESS)
}

/// The signals `rondo serve` answers: `SIGTERM` and `SIGINT` (drain and exit; a second one
/// during the drain cuts it short), `SIGUSR2` (start an upgrade).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("handling SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("handling SIGINT")?,
            usr2: signal(SignalKind::user_defined2()).context("handling SIGUSR2")?,
        })
    }
}

/// What the naming service runs; dropping it stops all of it.
#[derive(Debug)]
struct Naming {
    registry: rondo_naming::Registry,
    _api: rondo_naming::api::NamingServer,
    #[cfg(feature = "dns")]
    _dns: Option<rondo_naming::dns::DnsServer>,
}

impl Naming {
    /// Stops the registry for a hitless upgrade's hand-off (its writer ends, so the new process
    /// can open the files).
    fn release(&self) {
        if !self.registry.release(std::time::Duration::from_secs(2)) {
            tracing::warn!("upgrade: the registry's writer did not end within 2 s");
        }
    }
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

/// Where this router's own revocations are kept: `[router] revocations_file`, else beside the
/// embedded registry's snapshot (an etcd tier keeps them in etcd too), else nowhere.
fn revocations_file(config: &rondo_config::Config) -> Option<std::path::PathBuf> {
    if let Some(f) = &config.router.revocations_file {
        return Some(f.clone());
    }
    let naming = config.naming.as_ref()?;
    let rondo_config::RegistrySpec::Embedded { snapshot: Some(snapshot) } = &naming.registry else {
        return None;
    };
    let mut path = snapshot.clone().into_os_string();
    path.push(".revoked");
    Some(path.into())
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
