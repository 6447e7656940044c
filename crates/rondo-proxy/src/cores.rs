//! Where the router's TCP accept loops run (`rondo serve --runtime`): on the runtime that starts
//! the router (`work-stealing`, the default: one tokio multi-thread runtime), or on one
//! current-thread runtime per core (`per-core`, HAProxy's and nginx's shape: a connection lives
//! on the thread that accepted it, with that thread's buffers, splice pipes and idle member
//! connections, and no task ever moves). In `per-core`, each listener has one `SO_REUSEPORT`
//! socket per runtime (`--shards by-core`, the kernel spreads connections) or one socket every
//! runtime accepts on (`--shards one`). The process's other parts (probes, reloads, the APIs,
//! metrics, the drain, upgrades, UDP and HTTP/3 listeners) stay on the starting runtime.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// How many runtimes serve connections (1 unless [`Cores::start`] made more): the shards of
/// per-runtime state shared through views, such as the idle member connections.
static COUNT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// This thread's runtime among [`COUNT`] (0 on any other thread).
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// How many runtimes serve connections.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// The runtime this thread serves (below [`count`]).
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// How a listener's connections reach the per-core runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shards {
    /// One `SO_REUSEPORT` socket per runtime (HAProxy's `shards by-thread`).
    #[default]
    ByCore,
    /// One socket, accepted on by every runtime.
    One,
}

impl Shards {
    /// The name on the command line (`--shards`).
    pub fn as_str(self) -> &'static str {
        match self {
            Shards::ByCore => "by-core",
            Shards::One => "one",
        }
    }
}

/// The per-core runtimes (none: the starting runtime serves everything).
#[derive(Debug, Default)]
pub struct Cores {
    handles: Vec<Handle>,
    shards: Shards,
    /// Dropped to end the runtimes' threads.
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Cores {
    /// Starts `n` threads, each running a current-thread runtime (named `rondo-core-{i}`).
    pub fn start(n: usize, shards: Shards) -> std::io::Result<Cores> {
        let n = n.max(1);
        let mut cores =
            Cores { handles: Vec::new(), shards, stop: Vec::new(), threads: Vec::new() };
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            cores.stop.push(stop);
            let thread =
                std::thread::Builder::new().name(format!("rondo-core-{i}")).spawn(move || {
                    INDEX.with(|c| c.set(i));
                    let rt =
                        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                            Ok(rt) => rt,
                            Err(e) => {
                                let _ = tx.send(Err(e));
                                return;
                            }
                        };
                    let _ = tx.send(Ok(rt.handle().clone()));
                    // Serves until its sender is dropped ([`Cores::shutdown`]).
                    let _ = rt.block_on(stopped);
                    rt.shutdown_timeout(std::time::Duration::from_millis(100));
                })?;
            cores.threads.push(thread);
            let handle = rx.recv().map_err(std::io::Error::other)??;
            cores.handles.push(handle);
        }
        COUNT.store(n, Ordering::Relaxed);
        Ok(cores)
    }

    /// Whether per-core runtimes serve (else the starting runtime does).
    pub fn per_core(&self) -> bool {
        !self.handles.is_empty()
    }

    /// How many sockets each listener wants: one per runtime with [`Shards::ByCore`].
    pub fn shards_wanted(&self) -> usize {
        match self.shards {
            Shards::ByCore => self.handles.len().max(1),
            Shards::One => 1,
        }
    }

    /// Where each of a listener's `sockets` is accepted on: socket `i` on runtime `i` modulo
    /// their count when there are enough sockets, else every socket on every runtime (a shared
    /// socket); `None` for the starting runtime.
    pub fn place(
        &self,
        sockets: Vec<std::net::TcpListener>,
    ) -> std::io::Result<Vec<(std::net::TcpListener, Option<Handle>)>> {
        let n = self.handles.len();
        if n == 0 {
            return Ok(sockets.into_iter().map(|s| (s, None)).collect());
        }
        if sockets.len() >= n {
            let placed = sockets.into_iter().enumerate();
            return Ok(placed.map(|(i, s)| (s, Some(self.handles[i % n].clone()))).collect());
        }
        let mut placed = Vec::new();
        for s in sockets {
            for h in &self.handles {
                placed.push((s.try_clone()?, Some(h.clone())));
            }
        }
        Ok(placed)
    }

    /// Ends the runtimes' threads (what still runs there is dropped after a short grace).
    pub fn shutdown(mut self) {
        self.stop.clear();
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

/// Runs `accept(listener)` on `on` (or the current runtime), `socket` registered there.
pub(crate) fn spawn_accept<F, A>(
    socket: std::net::TcpListener,
    on: Option<&Handle>,
    accept: A,
) -> JoinHandle<()>
where
    A: FnOnce(TcpListener) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let run = async move {
        match TcpListener::from_std(socket) {
            Ok(l) => accept(l).await,
            Err(e) => tracing::error!("cannot serve a listening socket on this runtime: {e}"),
        }
    };
    match on {
        Some(h) => h.spawn(run),
        None => tokio::spawn(run),
    }
}

/// Listener `spec`'s sockets (bound, or taken over with every shard a previous process had),
/// each with the runtime that accepts on it.
pub(crate) fn listen(
    sockets: &rondo_runtime::sockets::Sockets,
    spec: &rondo_config::ListenerSpec,
    cores: &Cores,
) -> std::io::Result<Vec<(std::net::TcpListener, Option<Handle>)>> {
    let what = format!("listener {}", spec.name);
    let bound = sockets.listener_shards(&what, spec.listen, spec.backlog, cores.shards_wanted())?;
    cores.place(bound)
}
