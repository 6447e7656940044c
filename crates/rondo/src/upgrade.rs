//! Hitless restarts and binary upgrades: the conversation between the running `rondo serve` and
//! the new one (`rondo serve --upgrade`, started by hand, by `rondo ctl upgrade` or by
//! `SIGUSR2`) over the Unix socket `[router] upgrade_socket`.
//!
//! ```text
//! new                                   running
//!  │ load and check the config (an error ends here: the running one never hears of it)
//!  ├─ Hello {pid, version} ───────────────▶ busy with another upgrade? ──▶ Refused {reason}
//!  │◀── Offer {socket keys} + SCM_RIGHTS ──┤ every listening socket it has
//!  │◀── State {state} ──────────────────────┤ view id, member state, revocations,
//!  │                                          sessions, kept requests, agent epoch
//!  │ take the sockets (same kernel sockets: both accept from one queue), import the state,
//!  │ start router, agent, admin
//!  ├─ Ready ───────────────────────────────▶ stop accepting; the registry's writer ends
//!  │◀── Handover {state} ────────────────────┤ the state as of now (no revocation is made
//!  │                                          here after it); then drain and exit
//!  │ import it again, open the registry, start naming; serve
//! ```
//!
//! Frames are a 4-byte big-endian length and a JSON message. A new process that goes away
//! before `Ready` (killed, or failing to start) leaves the running one as it was: it never
//! stopped accepting. A second upgrade while one is in progress is refused.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use rondo_runtime::Live;
use rondo_runtime::sockets::handoff::StateDoc;
use serde::{Deserialize, Serialize};

/// The largest frame either side accepts (a state of 100,000 members fits).
const MAX_FRAME: usize = 256 << 20;
/// How long the running process waits for a new one's `Hello` after it connects.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the running process waits for `Ready`: the new one loads certificates, key files
/// and the config before it sends it.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the upgrade socket is looked at for a new process.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// How long the new process waits for each answer of the running one.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// One message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum Msg {
    Hello { pid: u32, version: String },
    Refused { reason: String },
    Offer { sockets: Vec<String> },
    State { state: Box<StateDoc> },
    Ready,
    Handover { state: Box<StateDoc> },
}

fn write_msg(stream: &UnixStream, msg: &Msg, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    if fds.is_empty() {
        (&*stream).write_all(&frame)
    } else {
        rondo_runtime::sockets::send_fds(stream, &frame, fds)
    }
}

fn read_msg(stream: &UnixStream) -> io::Result<(Msg, Vec<OwnedFd>)> {
    // The first bytes with whatever descriptors ride on them, then the rest of the frame.
    let mut head = [0u8; 4096];
    let (n, fds) = rondo_runtime::sockets::recv_fds(stream, &mut head)?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the other process hung up"));
    }
    let mut got = head[..n].to_vec();
    while got.len() < 4 {
        let mut more = [0u8; 4];
        let m = (&*stream).read(&mut more[..4 - got.len()])?;
        if m == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a frame cut short"));
        }
        got.extend_from_slice(&more[..m]);
    }
    let len = u32::from_be_bytes([got[0], got[1], got[2], got[3]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes")));
    }
    if got.len() > len + 4 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bytes past the frame"));
    }
    let mut body = got.split_off(4);
    let have = body.len();
    body.resize(len, 0);
    (&*stream).read_exact(&mut body[have..])?;
    let msg = serde_json::from_slice(&body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("a bad message: {e}")))?;
    Ok((msg, fds))
}

/// The new process's side: what it took over, and the connection it says `Ready` on.
#[derive(Debug)]
pub struct Takeover {
    stream: UnixStream,
    /// The running process's pid.
    pub from: u32,
    /// Its sockets' keys, parallel to `fds`.
    pub keys: Vec<String>,
    /// Its sockets.
    pub fds: Vec<OwnedFd>,
    /// Its state at the offer.
    pub state: StateDoc,
}

/// Connects to the running process at `path` and takes its sockets and state.
pub fn connect(path: &Path) -> anyhow::Result<Takeover> {
    let stream = UnixStream::connect(path).with_context(|| {
        format!("cannot reach the running rondo on its upgrade socket {}", path.display())
    })?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    let hello = Msg::Hello {
        pid: std::process::id(),
        version: crate::cli::LONG_VERSION.replace('\n', ", "),
    };
    write_msg(&stream, &hello, &[]).context("upgrade socket: sending hello")?;
    let (msg, fds) = read_msg(&stream).context("upgrade socket: waiting for the offer")?;
    let keys = match msg {
        Msg::Offer { sockets } => sockets,
        Msg::Refused { reason } => anyhow::bail!("the running rondo refused the upgrade: {reason}"),
        other => anyhow::bail!("upgrade socket: expected an offer, got {other:?}"),
    };
    anyhow::ensure!(
        keys.len() == fds.len(),
        "upgrade socket: {} sockets named, {} received",
        keys.len(),
        fds.len()
    );
    let (msg, _) = read_msg(&stream).context("upgrade socket: waiting for the state")?;
    let Msg::State { state } = msg else {
        anyhow::bail!("upgrade socket: expected the state, got {msg:?}");
    };
    Ok(Takeover { stream, from: state.pid, keys, fds, state: *state })
}

impl Takeover {
    /// Says this process is ready; returns the running process's state as of when it stopped
    /// accepting. Blocks (call it off the runtime's threads).
    pub fn ready(self) -> anyhow::Result<StateDoc> {
        write_msg(&self.stream, &Msg::Ready, &[]).context("upgrade socket: sending ready")?;
        let (msg, _) =
            read_msg(&self.stream).context("upgrade socket: waiting for the hand-over")?;
        match msg {
            Msg::Handover { state } => Ok(*state),
            other => anyhow::bail!("upgrade socket: expected the hand-over, got {other:?}"),
        }
    }
}

/// What the running process's main task is asked to do by an upgrade.
#[derive(Debug)]
pub struct Ready {
    /// The new process.
    pub pid: u32,
    /// Where the state goes once the process has stopped accepting and released the registry.
    pub reply: std::sync::mpsc::SyncSender<StateDoc>,
    /// Resolves once the hand-over is written to the new process (or failed to be): the
    /// process must not exit before, or the new one is left waiting for it and gives up.
    pub sent: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

/// How long the running process waits for its hand-over to be written to the new process
/// before it goes on draining regardless.
pub const HANDOVER_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The running process's side: answers upgrade requests on `listener` (a thread per request),
/// with `export` for the state and `live`'s sockets; asks `events` to stop accepting once a new
/// process is ready.
pub fn serve(
    listener: UnixListener,
    live: Arc<Live>,
    export: Arc<dyn Fn(bool) -> StateDoc + Send + Sync>,
    events: tokio::sync::mpsc::Sender<Ready>,
) -> io::Result<()> {
    let busy = Arc::new(AtomicBool::new(false));
    // Polled, not blocking in accept: the socket is shared with the process that takes over,
    // and a draining process must stop answering on it (it checks before every accept).
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("rondo-upgrade".to_owned()).spawn(move || {
        while !live.drain.is_on() {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(ACCEPT_POLL);
                    continue;
                }
                Err(_) => {
                    std::thread::sleep(ACCEPT_POLL);
                    continue;
                }
            };
            if stream.set_nonblocking(false).is_err() {
                continue;
            }
            let (live, export, events, busy) =
                (live.clone(), export.clone(), events.clone(), busy.clone());
            let _ = std::thread::Builder::new().name("rondo-upgrade-conn".to_owned()).spawn(
                move || {
                    if let Err(e) = answer(&stream, &live, &*export, &events, &busy) {
                        tracing::warn!("upgrade: {e:#}");
                    }
                },
            );
        }
    })?;
    Ok(())
}

fn answer(
    stream: &UnixStream,
    live: &Live,
    export: &(dyn Fn(bool) -> StateDoc + Send + Sync),
    events: &tokio::sync::mpsc::Sender<Ready>,
    busy: &AtomicBool,
) -> anyhow::Result<()> {
    stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let (msg, _) = read_msg(stream).context("waiting for hello")?;
    let Msg::Hello { pid, version } = msg else {
        anyhow::bail!("expected hello, got {msg:?}");
    };
    if busy.swap(true, Ordering::AcqRel) {
        let reason = "an upgrade is already in progress".to_owned();
        tracing::warn!(pid, "upgrade refused: {reason}");
        let _ = write_msg(stream, &Msg::Refused { reason }, &[]);
        return Ok(());
    }
    if live.drain.is_on() {
        let reason = "this process is draining".to_owned();
        tracing::warn!(pid, "upgrade refused: {reason}");
        let _ = write_msg(stream, &Msg::Refused { reason }, &[]);
        return Ok(());
    }
    tracing::info!(pid, version = version.as_str(), "upgrade: a new process asks to take over");
    // Everything until `Ready` may fail: the upgrade is then off and this process goes on.
    let offered = (|| -> anyhow::Result<()> {
        let sockets = live.sockets.for_successor();
        let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, fd)| fd.as_fd()).collect();
        let keys = sockets.iter().map(|(k, _)| k.clone()).collect();
        write_msg(stream, &Msg::Offer { sockets: keys }, &fds).context("sending the sockets")?;
        write_msg(stream, &Msg::State { state: Box::new(export(false)) }, &[])
            .context("sending the state")?;
        stream.set_read_timeout(Some(READY_TIMEOUT))?;
        match read_msg(stream).context("waiting for ready")?.0 {
            Msg::Ready => Ok(()),
            other => anyhow::bail!("expected ready, got {other:?}"),
        }
    })();
    if let Err(e) = offered {
        busy.store(false, Ordering::Release);
        anyhow::bail!(
            "the new process (pid {pid}) ended or failed before it was ready ({e:#}); this \
             process goes on serving"
        );
    }
    tracing::info!(pid, "upgrade: the new process is ready; this one stops accepting and drains");
    let (reply, state) = std::sync::mpsc::sync_channel(1);
    let (sent_tx, sent) = tokio::sync::oneshot::channel();
    events.blocking_send(Ready { pid, reply, sent }).context("the serving task is gone")?;
    let state = state.recv().context("the serving task gave no state")?;
    stream.set_write_timeout(Some(HANDOVER_WRITE_TIMEOUT))?;
    let written = write_msg(stream, &Msg::Handover { state: Box::new(state) }, &[])
        .context("sending the hand-over");
    let _ = sent_tx.send(written.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")));
    written
}

/// Starts `rondo serve --upgrade` with this process's own command line, from the executable
/// this process was started from (a new binary at that path is the binary upgrade); returns its
/// pid. A thread reaps it and logs how it ended, if it ends while this process lives.
pub fn spawn_successor(exe: &Path, args: &[std::ffi::OsString]) -> Result<u32, String> {
    let mut args = args.to_vec();
    if !args.iter().any(|a| a == "--upgrade") {
        match args.iter().position(|a| a == "serve") {
            Some(at) => args.insert(at + 1, "--upgrade".into()),
            None => return Err("this process was not started as `rondo serve`".to_owned()),
        }
    }
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let pid = child.id();
    tracing::info!(pid, exe = %exe.display(), "upgrade: new process started");
    let _ = std::thread::Builder::new().name("rondo-upgrade-reap".to_owned()).spawn(move || {
        if let Ok(status) = child.wait() {
            tracing::info!(pid, %status, "upgrade: the process this one started ended");
        }
    });
    Ok(pid)
}

/// Tells a service manager (systemd, `Type=notify`) about this process: `READY=1` once it
/// serves, with `MAINPID` after an upgrade (the new process is the service's main process from
/// then on; the unit needs `NotifyAccess=all`), `STOPPING=1` when it drains. Nothing without
/// `NOTIFY_SOCKET`.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(socket) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
    } else {
        socket.send_to(state.as_bytes(), Path::new(&path))
    };
    if let Err(e) = sent {
        tracing::debug!("NOTIFY_SOCKET: {e}");
    }
}
