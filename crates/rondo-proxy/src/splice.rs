//! Zero-copy forwarding for `tcp` listeners (`splice = "auto"`, the default): a session between
//! two plain TCP sockets moves its bytes socket → pipe → socket with splice(2), so they never
//! cross into userspace. The own HTTP/1 path splices bodies through the same pipes
//! (`Pipe::fill`, `Pipe::drain`; `crate::h1`'s `zero_copy`).
//!
//! The decision follows HAProxy's `option splice-auto`: each direction starts by copying through
//! a 16 KiB buffer (HAProxy's default `tune.bufsize`), and switches to splice once one read
//! fills that buffer, which marks the sender as bulk; a chatty protocol of small messages keeps
//! copying and never pays for a pipe (splicing a few bytes costs two syscalls where a copy
//! costs one). The switch happens only with the buffer written out, so the order of bytes
//! holds.
//!
//! Pipes come from a small pool per worker thread ([`MAX_IDLE_PIPES`]), sized with
//! `F_SETPIPE_SZ` to [`PIPE_SIZE`] like HAProxy's `tune.pipesize`. A pipe goes back to the pool
//! only when empty; one that still holds bytes (the session failed or was dropped mid-way) is
//! closed, so no byte of one session can reach another. When no pipe can be made (out of
//! descriptors), the direction keeps copying.
//!
//! Everything waits on tokio's readiness (`readable`/`writable`, then `try_io` with
//! `SPLICE_F_NONBLOCK`), so nothing blocks a worker. Half-close is that of
//! `tokio::io::copy_bidirectional`: an end of stream one way shuts down the writing side of the
//! other socket and the other direction keeps flowing; an error either way ends the session.

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;

use rustix::net::Shutdown;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The copy buffer of a direction, and the read size that marks it bulk.
pub const COPY_BUFFER: usize = 16 * 1024;

/// What each pipe is sized to: bigger than the kernel's 64 KiB default so that one splice moves
/// what a busy socket holds, small enough that hundreds of sessions stay under the kernel's
/// per-user pipe budget (`fs.pipe-user-pages-soft`, 64 MiB); past that budget the kernel refuses
/// the resize and the pipe keeps its size.
pub const PIPE_SIZE: usize = 256 * 1024;

/// Empty pipes a worker thread keeps for its next sessions; more are closed.
pub const MAX_IDLE_PIPES: usize = 16;

/// Bytes one direction of a session moved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Through a pipe, with splice(2).
    pub spliced: u64,
    /// Through a userspace buffer.
    pub copied: u64,
}

impl Moved {
    /// Both together.
    pub fn total(self) -> u64 {
        self.spliced + self.copied
    }
}

/// A client connection that may be a plain TCP socket, which splice can forward (a TLS one is
/// read and written through rustls, so it copies).
pub trait PlainTcp {
    /// The plain socket, if this is one.
    fn plain(&self) -> Option<&TcpStream> {
        None
    }
}

impl PlainTcp for TcpStream {
    fn plain(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl<S> PlainTcp for tokio_rustls::server::TlsStream<S> {}

/// Forwards both directions between `client` and `member` until each has ended its stream (or
/// either fails); returns what went to the member and what went to the client.
pub async fn forward(client: &TcpStream, member: &TcpStream) -> io::Result<(Moved, Moved)> {
    tokio::try_join!(pump(client, member), pump(member, client))
}

/// One direction: copies until a read fills the buffer, then splices; at the end of `from`'s
/// stream, shuts down `to`'s writing side.
async fn pump(from: &TcpStream, to: &TcpStream) -> io::Result<Moved> {
    let mut moved = Moved::default();
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut bulk = false;
    loop {
        if bulk && let Some(pipe) = Pipe::take() {
            drop(buf);
            return splice_rest(from, to, pipe, moved).await;
        }
        let n = read(from, &mut buf).await?;
        if n == 0 {
            end_of_stream(to);
            return Ok(moved);
        }
        write_all(to, &buf[..n]).await?;
        moved.copied += n as u64;
        bulk = n == buf.len();
    }
}

/// The rest of a direction through `pipe`.
async fn splice_rest(
    from: &TcpStream,
    to: &TcpStream,
    pipe: Pipe,
    mut moved: Moved,
) -> io::Result<Moved> {
    loop {
        let n = pipe.fill(from, PIPE_SIZE).await?;
        if n == 0 {
            pipe.give();
            end_of_stream(to);
            return Ok(moved);
        }
        pipe.drain(to, n, &mut moved.spliced).await?;
    }
}
/// Reads what `from` has, waiting for it.
async fn read(from: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Writes all of `buf` to `to`, waiting for room.
async fn write_all(to: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        to.writable().await?;
        match to.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Passes an end of stream on: `to` sends FIN after what it has. A peer already gone shows in
/// the other direction, so a failure here is not one of this direction.
fn end_of_stream(to: &TcpStream) {
    let _ = rustix::net::shutdown(to, Shutdown::Write);
}

thread_local! {
    /// This worker thread's empty pipes.
    static POOL: RefCell<Vec<(OwnedFd, OwnedFd)>> = const { RefCell::new(Vec::new()) };
}

/// A pipe leased from the thread's pool for one direction of a session (or one HTTP/1 body,
/// `crate::h1`). Dropped (closed) unless [`Pipe::give`] returns it empty, which a session's
/// normal end does; a failed or cancelled one may leave bytes in it, and those must never reach
/// another session.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// An empty pipe: the pool's, or a new one; `None` when the process has no descriptor left.
    pub(crate) fn take() -> Option<Pipe> {
        if let Some((read, write)) = POOL.try_with(|p| p.borrow_mut().pop()).ok().flatten() {
            return Some(Pipe { read, write });
        }
        let (read, write) =
            rustix::pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC).ok()?;
        // Over the per-user budget the kernel refuses; the default size still works.
        let _ = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE);
        Some(Pipe { read, write })
    }

    /// Moves what `from` has, up to `max` bytes, into the pipe, which must be empty, waiting
    /// until it has something: how many (0 at the end of `from`'s stream).
    pub(crate) async fn fill(&self, from: &TcpStream, max: usize) -> io::Result<usize> {
        let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
        // The pipe is empty here, so EAGAIN can only mean that the socket has nothing.
        from.async_io(Interest::READABLE, || {
            Ok(rustix::pipe::splice(from, None, &self.write, None, max, flags)?)
        })
        .await
    }

    /// Moves the `held` bytes the pipe holds to `to`, counting each into `moved` as it goes
    /// (so a failure half-way leaves the count of what went).
    pub(crate) async fn drain(
        &self,
        to: &TcpStream,
        mut held: usize,
        moved: &mut u64,
    ) -> io::Result<()> {
        let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
        while held > 0 {
            let out = to
                .async_io(Interest::WRITABLE, || {
                    Ok(rustix::pipe::splice(&self.read, None, to, None, held, flags)?)
                })
                .await?;
            if out == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            held -= out;
            *moved += out as u64;
        }
        Ok(())
    }

    /// Returns the pipe, empty, to this thread's pool (closes it when the pool is full).
    pub(crate) fn give(self) {
        let _ = POOL.try_with(|p| {
            let mut pool = p.borrow_mut();
            if pool.len() < MAX_IDLE_PIPES {
                pool.push((self.read, self.write));
            }
        });
    }
}
