//! Every socket the process listens on, by what it is for and the address the configuration
//! gave it: bound here, or taken over from the process this one replaces (a hitless upgrade
//! passes them over a Unix socket with `SCM_RIGHTS`, [`send_fds`] / [`recv_fds`]). A socket
//! taken over is the same kernel socket, with the same accept queue, so no connection is refused
//! while the two processes overlap.
//!
//! The key of a socket is `what` and its configured address (`"listener web 127.0.0.1:0"`): a
//! new configuration that keeps both gets the old socket, even one bound to port 0 (it keeps its
//! port); one that changes either binds anew, and the old socket closes with the old process.
//! A process that can be upgraded ([`Sockets::keep_for_successor`]) keeps a duplicate of each
//! socket it uses ([`Sockets::for_successor`]) until the drain releases them
//! ([`Sockets::release`]); any other closes a socket when the part using it stops.
//! Beside them: the process-wide drain (`drain.rs`), the state handed to a successor
//! (`handoff.rs`), QUIC connection-ID steering across an upgrade (`steer.rs`) and a listener's
//! `SO_REUSEPORT` shards, one per runtime (`shards.rs`).

pub mod drain;
pub mod handoff;
mod shards;
pub mod steer;

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

/// The listen backlog of a TCP socket bound without one of its own (admin, naming, DNS,
/// agents): a router listener's default `backlog`, Linux's default `net.core.somaxconn`.
/// tokio's `TcpListener::bind` listens with 128 (the standard library's choice), which a burst
/// of new connections overflows between two accepts: the kernel then drops their SYNs and each
/// such client waits a second or more for its retransmission.
pub const DEFAULT_BACKLOG: u32 = rondo_config::ListenerSpec::DEFAULT_BACKLOG;

/// The most descriptors one hand-off carries (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 200;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Sockets {
    inherited: Mutex<HashMap<String, OwnedFd>>,
    bound: Mutex<Vec<(String, OwnedFd)>>,
    /// Whether duplicates are kept for a successor (a process with `[router] upgrade_socket`);
    /// otherwise a part that stops closes its sockets for good.
    keep: std::sync::atomic::AtomicBool,
    /// The QUIC sockets' connection-ID steering between this process and the ones before and
    /// after it.
    pub steering: crate::sockets::steer::Steering,
}

fn key(what: &str, addr: impl std::fmt::Display) -> String {
    format!("{what} {addr}")
}

impl Sockets {
    /// The sockets a previous process handed over, by key (parallel lists).
    pub fn inherit(&self, keys: Vec<String>, fds: Vec<OwnedFd>) {
        let mut inherited = self.inherited.lock().unwrap_or_else(|e| e.into_inner());
        inherited.extend(keys.into_iter().zip(fds));
    }

    fn take(&self, key: &str) -> Option<OwnedFd> {
        self.inherited.lock().unwrap_or_else(|e| e.into_inner()).remove(key)
    }

    /// Keeps a duplicate of every socket bound or taken from now on, for a successor (call it
    /// before anything binds).
    pub fn keep_for_successor(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::Release);
    }

    fn keep(&self, key: String, fd: BorrowedFd<'_>) -> io::Result<()> {
        if !self.keep.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let dup = fd.try_clone_to_owned()?;
        self.bound.lock().unwrap_or_else(|e| e.into_inner()).push((key, dup));
        Ok(())
    }

    /// Whether the socket `what` at `addr` was handed over by a previous process.
    pub fn is_inherited(&self, what: &str, addr: impl std::fmt::Display) -> bool {
        self.inherited.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key(what, addr))
    }

    /// The TCP listener for `what` at `addr`: the previous process's, or bound now, with the
    /// [`DEFAULT_BACKLOG`].
    pub fn tcp_listener(
        &self,
        what: &str,
        addr: SocketAddr,
    ) -> io::Result<tokio::net::TcpListener> {
        self.tcp_listener_at(what, addr, addr, DEFAULT_BACKLOG)
    }

    /// The socket of a `[[listener]]` of `kind` (`"listener"`, `"queue listener"`), keyed
    /// `"{kind} {name}"` at its configured address, with its `backlog`; an error names the
    /// listener and the address.
    pub fn config_listener(
        &self,
        kind: &str,
        spec: &rondo_config::ListenerSpec,
    ) -> io::Result<tokio::net::TcpListener> {
        let what = format!("{kind} {}", spec.name);
        self.tcp_listener_at(&what, spec.listen, spec.listen, spec.backlog).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot bind {what} to {}: {e}", spec.listen))
        })
    }

    /// The TCP listener for `what` configured at `addr`: the previous process's, or bound now
    /// to `bind` (the port of a socket beside it when `addr` has port 0). Either way it listens
    /// with `backlog` (the kernel caps it at `net.core.somaxconn`): a socket taken over is set
    /// to this process's backlog, which the process it replaces then shares.
    pub fn tcp_listener_at(
        &self,
        what: &str,
        addr: SocketAddr,
        bind: SocketAddr,
        backlog: u32,
    ) -> io::Result<tokio::net::TcpListener> {
        let key = key(what, addr);
        let backlog = backlog.clamp(1, i32::MAX as u32);
        let listener = match self.take(&key) {
            Some(fd) => {
                // Listening again on a listening socket only sets its backlog (Linux).
                rustix::net::listen(&fd, backlog as i32)?;
                let std = std::net::TcpListener::from(fd);
                std.set_nonblocking(true)?;
                tokio::net::TcpListener::from_std(std)?
            }
            None => {
                let socket = match bind {
                    SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                    SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
                };
                // As `TcpListener::bind` does: a restart can bind again at once.
                socket.set_reuseaddr(true)?;
                socket.bind(bind)?;
                socket.listen(backlog)?
            }
        };
        self.keep(key, listener.as_fd())?;
        Ok(listener)
    }

    /// The UDP socket for `what` configured at `addr`: the previous process's, or bound now to
    /// `bind`.
    pub async fn udp(
        &self,
        what: &str,
        addr: SocketAddr,
        bind: SocketAddr,
    ) -> io::Result<tokio::net::UdpSocket> {
        let key = key(what, addr);
        let socket = match self.take(&key) {
            Some(fd) => {
                let std = std::net::UdpSocket::from(fd);
                std.set_nonblocking(true)?;
                tokio::net::UdpSocket::from_std(std)?
            }
            None => tokio::net::UdpSocket::bind(bind).await?,
        };
        self.keep(key, socket.as_fd())?;
        Ok(socket)
    }

    /// The UDP socket of the QUIC listener `what` configured at `addr` ([`Sockets::udp`]) and
    /// its connection-ID steering ([`crate::sockets::steer`]): with the channels to the processes
    /// before when the running one handed them over, and not read until [`crate::sockets::steer::Steering::open`] when
    /// the socket was taken over.
    pub async fn quic(
        &self,
        what: &str,
        addr: SocketAddr,
        bind: SocketAddr,
    ) -> io::Result<(tokio::net::UdpSocket, std::sync::Arc<crate::sockets::steer::Steer>)> {
        let inherited = self.is_inherited(what, addr);
        let socket = self.udp(what, addr, bind).await?;
        let channel_key = key(&format!("{what} steer"), addr);
        let mut channels: Vec<OwnedFd> = self.take(&channel_key).into_iter().collect();
        for i in 1..crate::sockets::steer::MAX_CHAIN {
            match self.take(&format!("{channel_key} {i}")) {
                Some(fd) if !channels.is_empty() => channels.push(fd),
                _ => break,
            }
        }
        Ok((socket, self.steering.add(channel_key, inherited, channels)))
    }

    /// The Unix listener for `what` at `path`: the previous process's, or bound now (a stale
    /// socket file that nobody answers on is removed first; one that answers is an error).
    pub fn unix_listener(
        &self,
        what: &str,
        path: &std::path::Path,
    ) -> io::Result<std::os::unix::net::UnixListener> {
        let key = key(what, path.display());
        let listener = match self.take(&key) {
            Some(fd) => std::os::unix::net::UnixListener::from(fd),
            None => {
                if path.exists() {
                    if UnixStream::connect(path).is_ok() {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!(
                                "{} is the upgrade socket of a running rondo (upgrade it with \
                                 `rondo serve --upgrade`)",
                                path.display()
                            ),
                        ));
                    }
                    std::fs::remove_file(path)?;
                }
                std::os::unix::net::UnixListener::bind(path)?
            }
        };
        self.keep(key, listener.as_fd())?;
        Ok(listener)
    }

    /// Every socket this process uses, by key, for the process that replaces it, and a new
    /// steering channel per QUIC socket ([`crate::sockets::steer`]).
    pub fn for_successor(&self) -> Vec<(String, OwnedFd)> {
        let bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(String, OwnedFd)> =
            bound.iter().filter_map(|(k, fd)| Some((k.clone(), fd.try_clone().ok()?))).collect();
        all.extend(self.steering.offer());
        all
    }

    /// Closes the duplicates [`Sockets::for_successor`] would hand over, and what was inherited
    /// and not used (a listener the new configuration dropped).
    pub fn release(&self) {
        self.bound.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.inherited.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The keys of inherited sockets no part of this process has taken (yet).
    pub fn unused(&self) -> Vec<String> {
        let inherited = self.inherited.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<String> = inherited.keys().cloned().collect();
        keys.sort();
        keys
    }
}

/// Sends `data` with `fds` attached (`SCM_RIGHTS`) over `stream`, whole.
pub fn send_fds(stream: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    if fds.len() > MAX_FDS {
        return Err(io::Error::other(format!(
            "{} sockets to hand over, at most {MAX_FDS} can be",
            fds.len()
        )));
    }
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("the descriptors do not fit the control message"));
    }
    let sent = sendmsg(stream, &[io::IoSlice::new(data)], &mut control, SendFlags::empty())?;
    // The descriptors went with the first bytes; the rest is plain data.
    if sent < data.len() {
        use std::io::Write;
        (&*stream).write_all(&data[sent..])?;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and the descriptors attached to them (close-on-exec).
pub fn recv_fds(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got =
        recvmsg(stream, &mut [io::IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok((got.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listener_handed_over_keeps_its_port_and_its_accept_queue() {
        let old = Sockets::default();
        old.keep_for_successor();
        let listener = old.tcp_listener("listener web", "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        // A client connects before the hand-off: it waits in the queue the new process shares.
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let handed = old.for_successor();
        let fds: Vec<BorrowedFd<'_>> = handed.iter().map(|(_, f)| f.as_fd()).collect();
        send_fds(&a, b"web", &fds).unwrap();
        drop(listener);
        old.release();
        let mut buf = [0u8; 16];
        let (n, got) = recv_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"web");
        assert_eq!(got.len(), 1);
        let new = Sockets::default();
        new.inherit(vec![handed[0].0.clone()], got);
        assert!(new.is_inherited("listener web", "127.0.0.1:0"));
        let taken = new.tcp_listener("listener web", "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(taken.local_addr().unwrap(), addr);
        let (_, peer) = taken.accept().await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(new.unused().is_empty());
    }

    /// How many connections to `addr` complete, one after another, while nobody accepts: the
    /// accept queue's room (Linux queues `backlog + 1`, then drops SYNs, so the next connect
    /// times out). At most `most` are tried.
    fn queued_connections(addr: SocketAddr, most: usize) -> usize {
        let mut held = Vec::new();
        while held.len() < most {
            match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300))
            {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        held.len()
    }

    #[tokio::test]
    async fn a_listener_listens_with_its_backlog_and_one_taken_over_with_the_new_one() {
        let old = Sockets::default();
        old.keep_for_successor();
        let any = "127.0.0.1:0".parse().unwrap();
        let listener = old.tcp_listener_at("listener web", any, any, 2).unwrap();
        let addr = listener.local_addr().unwrap();
        // tokio's `bind` would have queued 128.
        assert_eq!(queued_connections(addr, 20), 3, "backlog 2 queues 3");
        // Taken over by a process whose backlog is 6: the same queue, with room for 7.
        let (a, b) = UnixStream::pair().unwrap();
        let handed = old.for_successor();
        send_fds(&a, b"web", &[handed[0].1.as_fd()]).unwrap();
        let (_, got) = recv_fds(&b, &mut [0u8; 4]).unwrap();
        let new = Sockets::default();
        new.inherit(vec![handed[0].0.clone()], got);
        let taken = new.tcp_listener_at("listener web", any, any, 6).unwrap();
        assert_eq!(taken.local_addr().unwrap(), addr);
        // The 3 connections of the first check, closed by their clients, are still queued.
        assert_eq!(queued_connections(addr, 20), 4, "backlog 6 queues 7, 3 of them taken");
        drop(listener);
        drop(taken);
        old.release();
        // Bound without a backlog of its own: the default, far above tokio's 128.
        let plain = Sockets::default().tcp_listener("admin", any).unwrap();
        let many = queued_connections(plain.local_addr().unwrap(), 200);
        assert_eq!(many, 200, "the default backlog queues more than 128");
    }

    #[tokio::test]
    async fn another_address_binds_anew() {
        let s = Sockets::default();
        s.keep_for_successor();
        let (a, b) = UnixStream::pair().unwrap();
        let first = s.tcp_listener("admin", "127.0.0.1:0".parse().unwrap()).unwrap();
        let handed = s.for_successor();
        send_fds(&a, b"x", &[handed[0].1.as_fd()]).unwrap();
        let (_, got) = recv_fds(&b, &mut [0u8; 4]).unwrap();
        let new = Sockets::default();
        new.inherit(vec!["admin 127.0.0.1:0".to_owned()], got);
        // The same `what` at another configured address is not the old socket.
        let other = new.tcp_listener("naming", "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_ne!(other.local_addr().unwrap(), first.local_addr().unwrap());
        assert_eq!(new.unused(), vec!["admin 127.0.0.1:0".to_owned()]);
    }
}
