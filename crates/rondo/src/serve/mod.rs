//! `rondo serve`: loads the configuration, starts the live state, the probes and the router,
//! reloads routes, clusters and members when the config file changes or on SIGHUP, and runs
//! until interrupted.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use rondo_runtime::reload::{self, Reloader};
use rondo_runtime::sockets::handoff;
use rondo_runtime::{Live, probe};

mod naming;
pub mod threads;
use naming::{Naming, start_naming};

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

/// Runs the router from the configuration at `path` on `threads` (default: one work-stealing
/// worker per core) until SIGINT or SIGTERM (then it drains: see [`crate::upgrade`]); the log starts from
/// `log` and the config's `[log]`. With `upgrade`, it takes over from the process serving on
/// `[router] upgrade_socket` instead of binding anew.
///
/// With a JSON log (`--log-format json` or `[log] format = "json"`), every line it writes is
/// JSON: the status lines and refusals too (the `json_lines` module), and an error that ends it.
pub fn serve(
    path: &Path,
    threads: threads::Threads,
    upgrade: bool,
    log: &crate::cli::LogArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    // Checked against this build's features before anything is bound.
    let loaded = rondo_config::load_file_with(path, FIRST_VIEW, crate::features());
    let how = How { path, threads, upgrade, log };
    if !crate::log_is_json(log, loaded.as_ref().ok().map(|c| &c.log)) {
        return serve_loaded(loaded, &how, out, err);
    }
    let mut out = crate::json_lines::JsonLines::new(out, "INFO", "rondo::status");
    let mut err = crate::json_lines::JsonLines::new(err, "ERROR", "rondo::serve");
    match serve_loaded(loaded, &how, &mut out, &mut err) {
        Ok(code) => Ok(code),
        Err(e) => {
            writeln!(err, "error: {e:#}")?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// How `rondo serve` was asked to run: [`serve`]'s arguments, for [`serve_loaded`].
struct How<'a> {
    path: &'a Path,
    threads: threads::Threads,
    upgrade: bool,
    log: &'a crate::cli::LogArgs,
}

/// [`serve`] once the file is read (`loaded`), writing status lines to `out` and refusals to
/// `err`.
fn serve_loaded(
    loaded: Result<rondo_config::Config, rondo_config::ConfigErrors>,
    how: &How<'_>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let How { path, threads, upgrade, log } = *how;
    let mut config = match loaded {
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
    let (runtime, cores) = threads.start()?;
    let code = runtime.block_on(run(path, &config, (takeover, &cores), out, err));
    // Whatever still runs (a connection past the drain timeout) ends with the process.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    cores.shutdown();
    code
}

/// What a hitless upgrade hands to the process that replaces it (`true`: the hand-over itself,
/// `false`: the offer).
type Export = Arc<dyn Fn(bool) -> handoff::StateDoc + Send + Sync>;

/// Why the start stopped: a line for stderr (the exit then fails, and nothing was announced as
/// up), or a failure of the process itself (an error of `run`).
enum Stop {
    Refused(String),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Self {
        Stop::Failed(e)
    }
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Failed(e.into())
    }
}

/// `rondo serve: {e}`, the line of a part that could not start.
fn refused(e: impl std::fmt::Display) -> Stop {
    Stop::Refused(format!("rondo serve: {e}"))
}

/// The parts that serve; dropping them stops what is left of them (fields drop in this order).
struct Parts {
    naming: Option<Naming>,
    queues: Option<rondo_queue::Queues>,
    _admin: Option<rondo_admin::AdminServer>,
    receiver: Option<Arc<rondo_agent::Receiver>>,
    router: Arc<rondo_proxy::Router>,
    live: Arc<Live>,
}

impl Parts {
    /// Nothing new is accepted anywhere: the router's listeners and the agent receiver stop,
    /// and the process's drain starts (the APIs stop accepting, connections close when idle).
    fn stop_accepting(&self) {
        self.router.stop();
        if let Some(r) = &self.receiver {
            r.stop();
        }
        self.live.drain.start();
    }

    /// What this process hands to the one that replaces it: the live state and revocations,
    /// the router's sessions and kept requests, the agent receiver's epoch (`last`: the
    /// hand-over).
    fn exporter(&self) -> Export {
        let (live, router, receiver) =
            (self.live.clone(), self.router.clone(), self.receiver.clone());
        Arc::new(move |last| {
            let mut doc = live.export_state(last);
            doc.parts.insert("router".to_owned(), router.export_sessions());
            if let Some(r) = &receiver
                && let Ok(v) = serde_json::to_value(r.resume())
            {
                doc.parts.insert("agent".to_owned(), v);
            }
            doc
        })
    }
}

/// Everything started and bound, not yet announced.
struct Started {
    parts: Parts,
    reloading: Reloading,
    export: Export,
    /// A new process ready to take over (nothing comes without `[router] upgrade_socket`).
    ready: tokio::sync::mpsc::Receiver<crate::upgrade::Ready>,
    /// The state the process this one replaced handed over.
    handed: Option<handoff::StateDoc>,
}

async fn run(
    path: &Path,
    config: &rondo_config::Config,
    (takeover, cores): (Option<crate::upgrade::Takeover>, &rondo_proxy::cores::Cores),
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    // First: a signal from here on is handled, never the default that ends the process (a
    // `SIGUSR2` sent as soon as the admin API answers must not kill it).
    let mut signals = Signals::new()?;
    // Status lines wait until every part is bound: a part that cannot start (its port taken)
    // stops the start before anything was announced as up. This is the buffer until then.
    let mut announced: Vec<u8> = Vec::new();
    let Started { parts, reloading, export, mut ready, handed } =
        match start(path, config, (takeover, cores), &mut announced).await {
            Ok(s) => s,
            Err(Stop::Refused(line)) => {
                writeln!(err, "{line}")?;
                return Ok(ExitCode::FAILURE);
            }
            Err(Stop::Failed(e)) => return Err(e),
        };
    let watched = config.router.watch_config.then_some(path);
    announce(&parts.live, watched, announced, handed.is_some(), out)?;
    let end = wait_for_end(&mut signals, &mut ready, &parts, &export, config).await;
    reloading.stop();
    drain(&mut signals, parts, end, config, out).await?;
    Ok(ExitCode::SUCCESS)
}

/// Starts every part in order, each announcing itself into `out` (the buffer).
async fn start(
    path: &Path,
    config: &rondo_config::Config,
    (mut takeover, cores): (Option<crate::upgrade::Takeover>, &rondo_proxy::cores::Cores),
    out: &mut dyn Write,
) -> Result<Started, Stop> {
    let live = live_state(config, takeover.as_mut());
    load_revocations(config, &live)?;
    set_tier_key(config, &live)?;
    probe::spawn(&live.load());
    // The tier's load view (`[tier]`; `rondo check` refuses it without the feature).
    #[cfg(feature = "nats")]
    if let Some(tier) = &config.tier {
        rondo_runtime::tier_load::spawn(&live.views, live.metrics.clone(), tier.clone());
    }
    let router = start_router(config, &live, (takeover.as_ref(), cores)).await?;
    // The process's own sockets, which the naming service refuses as member addresses.
    let mut own: Vec<rondo_naming::api::OwnAddress> = Vec::new();
    for (name, addr) in &router.listeners {
        writeln!(out, "rondo: listener {name} on {addr}")?;
        own.push(rondo_naming::api::OwnAddress { what: format!("listener {name}"), addr: *addr });
    }
    let receiver = start_agent_receiver(config, &live, takeover.as_ref(), &mut own, out).await?;
    let admin = start_admin(config, &live, &mut own, out).await?;
    let handed = match takeover {
        Some(t) => Some(take_over(t, &live).await?),
        None => None,
    };
    let queues = start_queues(config, &live, &mut own, out).await?;
    // The naming service (`[naming]`): registry, HTTP API, DNS; stopped when serve returns.
    let naming = match &config.naming {
        Some(spec) => Some(
            start_naming(spec, rondo_naming::NamingParts::of(&live), own, out)
                .await
                .map_err(refused)?,
        ),
        None => None,
    };
    if let Some(state) = &handed {
        // Again, now that the registered members are in the view; and the sessions as of the
        // hand-over (those the old process served since the offer).
        live.import_state(state);
        if let Some(sessions) = state.parts.get("router") {
            router.import_sessions(sessions, &live);
        }
    }
    let reloading = Reloading::start(path, &live, config);
    let parts = Parts { naming, queues, _admin: admin, receiver, router, live };
    let export = parts.exporter();
    let ready = start_upgrades(config, &parts.live, &export, out)?;
    Ok(Started { parts, reloading, export, ready, handed })
}

/// The live state, with the sockets (kept for a successor, or taken over) and the state of
/// the process this one replaces.
fn live_state(
    config: &rondo_config::Config,
    takeover: Option<&mut crate::upgrade::Takeover>,
) -> Arc<Live> {
    let live = Arc::new(Live::new(config.view.clone(), config.router.group.clone()));
    live.set_shared_members(config.shared_members.clone());
    live.metrics.set_departed_grace(config.metrics.departed_grace);
    if config.router.upgrade_socket.is_some() {
        live.sockets.keep_for_successor();
    }
    if let Some(t) = takeover {
        live.sockets.inherit(std::mem::take(&mut t.keys), std::mem::take(&mut t.fds));
        let members = live.import_state(&t.state);
        tracing::info!(from = t.from, members, "upgrade: sockets and state taken over");
    }
    live
}

/// This router's own revocations, loaded before the admin API can make one (and written again
/// with what the process it replaced handed over).
fn load_revocations(config: &rondo_config::Config, live: &Live) -> Result<(), Stop> {
    if let Some(store) = revocations_file(config) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        live.revocations.set_store(store, now).map_err(refused)?;
    }
    Ok(())
}

/// The tier key (`[router] tier_key`), which signs sticky cookies and sessions.
fn set_tier_key(config: &rondo_config::Config, live: &Live) -> Result<(), Stop> {
    let Some(k) = &config.router.tier_key else { return Ok(()) };
    match rondo_runtime::secret::read_token(k) {
        Ok(bytes) if bytes.len() >= 16 => {
            live.set_tier_key(rondo_runtime::secret::TierKey::new(&bytes));
            Ok(())
        }
        Ok(_) => Err(refused("the tier key must be at least 16 bytes")),
        Err(e) => Err(refused(format_args!("tier key: {e}"))),
    }
}

/// The router's listeners, with the sessions of the process it replaces.
async fn start_router(
    config: &rondo_config::Config,
    live: &Arc<Live>,
    (takeover, cores): (Option<&crate::upgrade::Takeover>, &rondo_proxy::cores::Cores),
) -> Result<Arc<rondo_proxy::Router>, Stop> {
    let tracer =
        rondo_proxy::otel::tracer(config.tracing.as_ref(), &live.metrics).map_err(refused)?;
    let router = rondo_proxy::start_on(&config.listeners, live.clone(), tracer, cores);
    let router = Arc::new(router.await.map_err(refused)?);
    if let Some(t) = takeover
        && let Some(sessions) = t.state.parts.get("router")
    {
        let (pinned, logs) = router.import_sessions(sessions, live);
        tracing::info!(pinned, logs, "upgrade: sessions and kept requests taken over");
    }
    Ok(router)
}

/// The load agents' receiver (`[agent]`), resuming the epoch of the process it replaces.
async fn start_agent_receiver(
    config: &rondo_config::Config,
    live: &Arc<Live>,
    takeover: Option<&crate::upgrade::Takeover>,
    own: &mut Vec<rondo_naming::api::OwnAddress>,
    out: &mut dyn Write,
) -> Result<Option<Arc<rondo_agent::Receiver>>, Stop> {
    let Some(spec) = &config.agent else { return Ok(None) };
    let key = read_key(&spec.key).map_err(refused)?;
    let tls = match &spec.tls {
        None => None,
        Some(t) => Some(
            rondo_runtime::tls::server::TlsServer::new(
                "[agent]",
                t,
                &[],
                rondo_runtime::tls::server::HANDSHAKE_TIMEOUT,
                live.metrics.clone(),
            )
            .map_err(|e| refused(format_args!("[agent] tls: {e}")))?,
        ),
    };
    let resume = takeover
        .and_then(|t| t.state.parts.get("agent"))
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    let opts = rondo_agent::ReceiverOpts {
        listen: spec.listen,
        key: rondo_agent::Key::new(&key),
        interval: spec.interval,
        tls,
        resume,
    };
    let r = rondo_agent::receiver::start(opts, live.views.clone(), &live.metrics, &live.sockets)
        .await
        .map_err(|e| refused(format_args!("agent receiver on {}: {e}", spec.listen)))?;
    let tls = if spec.tls.is_some() { ", tls on tcp" } else { "" };
    writeln!(out, "rondo: agent receiver on {} (tcp and udp{tls})", r.addr)?;
    own.push(rondo_naming::api::OwnAddress { what: "agent receiver".to_owned(), addr: r.addr });
    Ok(Some(Arc::new(r)))
}

/// The admin API (`[admin]`) and its dashboard.
async fn start_admin(
    config: &rondo_config::Config,
    live: &Arc<Live>,
    own: &mut Vec<rondo_naming::api::OwnAddress>,
    out: &mut dyn Write,
) -> Result<Option<rondo_admin::AdminServer>, Stop> {
    let Some(spec) = &config.admin else { return Ok(None) };
    let a = rondo_admin::start(spec, rondo_admin::AdminParts::of(live))
        .await
        .map_err(|e| refused(format_args!("admin API on {}: {e}", spec.listen)))?;
    writeln!(out, "rondo: admin API on {}", a.addr)?;
    // The token only to a terminal: a service's output goes to its log.
    let link = a.dashboard_link(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    writeln!(out, "rondo: dashboard on {link}")?;
    own.push(rondo_naming::api::OwnAddress { what: "admin API".to_owned(), addr: a.addr });
    if let Some(addr) = a.probe_addr() {
        writeln!(out, "rondo: probe listener on {addr}")?;
        own.push(rondo_naming::api::OwnAddress { what: "probe listener".to_owned(), addr });
    }
    Ok(Some(a))
}

/// Taking over: ready to serve. The running process stops accepting, its registry's writer
/// ends, and its state as of then comes back.
async fn take_over(
    t: crate::upgrade::Takeover,
    live: &Arc<Live>,
) -> Result<handoff::StateDoc, Stop> {
    let from = t.from;
    match tokio::task::spawn_blocking(move || t.ready()).await {
        Ok(Ok(state)) => {
            // The old process has stopped reading the QUIC sockets: this one reads them.
            live.sockets.steering.open();
            live.import_state(&state);
            tracing::info!(from, "upgrade: the old process handed over and drains");
            Ok(state)
        }
        Ok(Err(e)) => Err(Stop::Refused(format!("rondo serve --upgrade: {e:#}"))),
        Err(e) => Err(Stop::Refused(format!("rondo serve --upgrade: {e}"))),
    }
}

/// The durable queues (`[[queue]]`, `queue` listeners): stores opened (a damaged store file
/// stops the start, naming it), delivery workers started. After a hand-over, since the old
/// process held the embedded stores until then.
async fn start_queues(
    config: &rondo_config::Config,
    live: &Arc<Live>,
    own: &mut Vec<rondo_naming::api::OwnAddress>,
    out: &mut dyn Write,
) -> Result<Option<rondo_queue::Queues>, Stop> {
    if config.queues.is_empty() {
        return Ok(None);
    }
    let q = rondo_queue::start(config, rondo_queue::QueueParts::of(live)).await.map_err(refused)?;
    for spec in &config.queues {
        let at = match &spec.backend {
            rondo_config::QueueBackend::Embedded { directory } => {
                rondo_queue::embedded::store_path(directory, &spec.name).display().to_string()
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
    Ok(Some(q))
}

/// Live reconfiguration: the config file's changes (polled, debounced) and SIGHUP, which also
/// reopens access log files (after a rotation renamed them).
struct Reloading {
    /// Kept for its `members_dns` resolvers, whether or not a watcher or SIGHUP holds it.
    _reloader: Arc<Reloader>,
    /// `None` with `watch_config = false`.
    watcher: Option<tokio::task::JoinHandle<()>>,
    hup: Option<tokio::task::JoinHandle<()>>,
    reopen: tokio::task::JoinHandle<()>,
}

impl Reloading {
    fn start(path: &Path, live: &Arc<Live>, config: &rondo_config::Config) -> Self {
        let reloader = Arc::new(Reloader::new(
            path,
            live.views.clone(),
            live.registrations.clone(),
            live.metrics.clone(),
            live.defaults.clone(),
            config,
        ));
        let watcher = config.router.watch_config.then(|| {
            reload::watch_file(reloader.clone(), reload::DEFAULT_POLL, reload::DEFAULT_SETTLE)
        });
        let hup = match reload::on_sighup(reloader.clone()) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!("cannot handle SIGHUP, reload by saving the config file: {e}");
                None
            }
        };
        Reloading { _reloader: reloader, watcher, hup, reopen: reopen_access_logs_on_sighup() }
    }

    fn stop(self) {
        if let Some(w) = self.watcher {
            w.abort();
        }
        if let Some(h) = self.hup {
            h.abort();
        }
        self.reopen.abort();
    }
}

/// Hitless upgrades: the upgrade socket (`[router] upgrade_socket`), `SIGUSR2` and the admin
/// API's `upgrade`. New processes ready to take over come out of the receiver.
fn start_upgrades(
    config: &rondo_config::Config,
    live: &Arc<Live>,
    export: &Export,
    out: &mut dyn Write,
) -> Result<tokio::sync::mpsc::Receiver<crate::upgrade::Ready>, Stop> {
    let (ready_tx, ready_rx) = tokio::sync::mpsc::channel(1);
    let Some(socket) = &config.router.upgrade_socket else { return Ok(ready_rx) };
    let listener = live
        .sockets
        .unix_listener("upgrade", socket)
        .map_err(|e| refused(format_args!("[router] upgrade_socket {}: {e}", socket.display())))?;
    crate::upgrade::serve(listener, live.clone(), export.clone(), ready_tx)
        .context("starting the upgrade socket's thread")?;
    let inv = Invocation::current();
    live.upgrader.set(move || crate::upgrade::spawn_successor(&inv.exe, &inv.args));
    writeln!(out, "rondo: upgrades on {} (rondo serve --upgrade, SIGUSR2)", socket.display())?;
    Ok(ready_rx)
}

/// Everything is bound: the sockets no part took are closed, the status lines printed, and the
/// service manager told.
fn announce(
    live: &Live,
    watched: Option<&Path>,
    mut announced: Vec<u8>,
    handed: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let unused = live.sockets.unused();
    if !unused.is_empty() {
        tracing::info!(sockets = ?unused, "upgrade: sockets the new configuration does not use are closed");
    }
    match watched {
        Some(path) => {
            writeln!(announced, "rondo: reloading on changes to {} and on SIGHUP", path.display())?
        }
        None => writeln!(announced, "rondo: reloading on SIGHUP and reload calls only")?,
    }
    out.write_all(&announced)?;
    out.flush()?;
    live.drain.set_serving();
    crate::upgrade::notify(&if handed {
        format!("MAINPID={}\nREADY=1", std::process::id())
    } else {
        "READY=1".to_owned()
    });
    Ok(())
}

/// Serves until `SIGTERM` or `SIGINT`, or until a new process took over; starts upgrades on
/// `SIGUSR2`.
async fn wait_for_end(
    signals: &mut Signals,
    ready: &mut tokio::sync::mpsc::Receiver<crate::upgrade::Ready>,
    parts: &Parts,
    export: &Export,
    config: &rondo_config::Config,
) -> End {
    loop {
        tokio::select! {
            _ = signals.term.recv() => return End::Signal,
            _ = signals.int.recv() => return End::Signal,
            Some(ready) = ready.recv() => {
                // Stop accepting everywhere; the registry's writer ends so that the new process
                // can open its files; then the state as of now.
                parts.stop_accepting();
                // The new process reads the QUIC sockets from now on and passes this one's
                // datagrams over (once it said it would).
                parts.live.sockets.steering.handed_over();
                if let Some(n) = &parts.naming {
                    n.release();
                }
                // The queues stop delivering and close their stores, for the new process to
                // open (a message in delivery is delivered again there: at least once).
                if let Some(q) = &parts.queues {
                    q.stop();
                }
                let _ = ready.reply.send(export(true));
                return End::Upgraded(ready.pid, ready.sent);
            }
            _ = signals.usr2.recv() => {
                if config.router.upgrade_socket.is_none() {
                    tracing::warn!("SIGUSR2: no [router] upgrade_socket, so no upgrade");
                } else if let Some(Err(e)) = parts.live.upgrader.start() {
                    tracing::warn!("SIGUSR2: upgrade not started: {e}");
                }
            }
        }
    }
}

/// The drain: nothing new is accepted; requests, streams and tunnels in progress get
/// `drain_timeout`; idle connections close. Then every part stops.
async fn drain(
    signals: &mut Signals,
    mut parts: Parts,
    end: End,
    config: &rondo_config::Config,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    parts.stop_accepting();
    parts.live.sockets.release();
    if matches!(end, End::Signal) {
        // (Not after a hand-over: the new process is the service's main process by now, or is
        // about to say so, and a STOPPING=1 from this one could stop the service.)
        crate::upgrade::notify("STOPPING=1");
    }
    let open = parts.router.open_connections();
    match end {
        End::Signal => writeln!(out, "rondo: shutting down: draining {open} connection(s)")?,
        End::Upgraded(pid, sent) => {
            handover_written(pid, sent).await;
            writeln!(out, "rondo: handed over to pid {pid}: draining {open} connection(s)")?
        }
    }
    out.flush()?;
    if let Some(q) = &parts.queues {
        q.stop();
    }
    wait_for_drained(signals, &parts, config.router.drain_timeout).await;
    drop(parts.naming.take());
    writeln!(out, "rondo: stopped")?;
    Ok(())
}

/// The hand-over is written by the upgrade socket's thread: this process exits only after it
/// is (an exit before would leave the new process without its state, and it gives up).
async fn handover_written(pid: u32, sent: tokio::sync::oneshot::Receiver<Result<(), String>>) {
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
}

/// Until the router's connections and the queues' deliveries end, `timeout` passes or a second
/// `SIGTERM` or `SIGINT` cuts it short.
async fn wait_for_drained(signals: &mut Signals, parts: &Parts, timeout: std::time::Duration) {
    let router = &parts.router;
    let drained = async {
        router.drained().await;
        if let Some(q) = &parts.queues {
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
        _ = signals.term.recv() => tracing::warn!(
            open = router.open_connections(),
            "a second SIGTERM: the connections still open are cut"
        ),
        _ = signals.int.recv() => tracing::warn!(
            open = router.open_connections(),
            "a second SIGINT: the connections still open are cut"
        ),
    }
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
