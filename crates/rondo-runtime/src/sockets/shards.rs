//! A router listener's sockets when it is served by several runtimes (`rondo serve --runtime
//! per-core`): one `SO_REUSEPORT` socket per runtime (HAProxy's `shards by-thread`), so that
//! the kernel spreads new connections over the runtimes' accept queues.
//!
//! Shard 0 has the listener's usual key (`"listener web 127.0.0.1:80"`), shard `i` that key
//! with `" shard {i}"`. Every shard is kept for a successor, and every shard a previous process
//! handed over is taken, whatever this process's own count: a socket left behind would close
//! with the old process, and the connections waiting in its accept queue with it. A listener
//! whose inherited shard 0 has no `SO_REUSEPORT` (the previous process ran one socket per
//! listener) cannot get more sockets on its port: it stays one socket, shared by the runtimes.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use super::{Sockets, key};

/// The most shards of one listener taken over (a bound on the keys looked up).
const MAX_SHARDS: usize = 64;

impl Sockets {
    /// The sockets of the listener `what` configured at `listen` (`"listener web"`, as
    /// [`Sockets::config_listener`] names it): `want` of them bound with `SO_REUSEPORT` on the
    /// same address, or fewer when the ones taken over cannot be joined (then the caller shares
    /// them), or more when a previous process handed over more. Each listens with `backlog` and
    /// is non-blocking, for any runtime to register.
    pub fn listener_shards(
        &self,
        what: &str,
        listen: SocketAddr,
        backlog: u32,
        want: usize,
    ) -> io::Result<Vec<std::net::TcpListener>> {
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("cannot bind {what} to {listen}: {e}"));
        let backlog = backlog.clamp(1, i32::MAX as u32) as i32;
        let first_key = key(what, listen);
        let first = match self.take(&first_key) {
            Some(fd) => relisten(fd, backlog)?,
            None => bind_reuseport(listen, backlog, want > 1).map_err(named)?,
        };
        self.keep(first_key.clone(), first.as_fd())?;
        // Port 0 in the configuration: the other shards join the port shard 0 got.
        let port = first.local_addr()?;
        let joinable = want > 1 && rustix::net::sockopt::socket_reuseport(&first).unwrap_or(false);
        let mut all = vec![first];
        for i in 1..MAX_SHARDS {
            let shard_key = format!("{first_key} shard {i}");
            let Some(fd) = self.take(&shard_key) else { break };
            let l = relisten(fd, backlog)?;
            self.keep(shard_key, l.as_fd())?;
            all.push(l);
        }
        if want > 1 && !joinable {
            tracing::info!(
                listener = %what,
                "the listener's socket was taken over without SO_REUSEPORT: the runtimes share it"
            );
        }
        while joinable && all.len() < want {
            let l = bind_reuseport(port, backlog, true).map_err(named)?;
            self.keep(format!("{first_key} shard {}", all.len()), l.as_fd())?;
            all.push(l);
        }
        Ok(all)
    }
}

/// A listening socket taken over, listening with this process's `backlog`.
fn relisten(fd: OwnedFd, backlog: i32) -> io::Result<std::net::TcpListener> {
    // Listening again on a listening socket only sets its backlog (Linux).
    rustix::net::listen(&fd, backlog)?;
    let l = std::net::TcpListener::from(fd);
    l.set_nonblocking(true)?;
    Ok(l)
}

/// A new non-blocking listening socket at `addr` (with `SO_REUSEPORT` when `reuseport`).
fn bind_reuseport(
    addr: SocketAddr,
    backlog: i32,
    reuseport: bool,
) -> io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )?;
    // As `TcpListener::bind` does: a restart can bind again at once.
    sockopt::set_socket_reuseaddr(&fd, true)?;
    if reuseport {
        sockopt::set_socket_reuseport(&fd, true)?;
    }
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, backlog)?;
    Ok(std::net::TcpListener::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockets::{recv_fds, send_fds};
    use std::os::fd::BorrowedFd;
    use std::os::unix::net::UnixStream;

    /// `from`'s sockets, passed to a new `Sockets` as an upgrade does.
    fn hand_over(from: &Sockets) -> Sockets {
        let handed = from.for_successor();
        let (a, b) = UnixStream::pair().unwrap();
        let fds: Vec<BorrowedFd<'_>> = handed.iter().map(|(_, f)| f.as_fd()).collect();
        send_fds(&a, b"x", &fds).unwrap();
        let (_, got) = recv_fds(&b, &mut [0u8; 4]).unwrap();
        let new = Sockets::default();
        new.keep_for_successor();
        new.inherit(handed.into_iter().map(|(k, _)| k).collect(), got);
        new
    }

    #[test]
    fn shards_share_one_port_and_every_one_is_handed_over() {
        let old = Sockets::default();
        old.keep_for_successor();
        let any = "127.0.0.1:0".parse().unwrap();
        let shards = old.listener_shards("listener web", any, 64, 3).unwrap();
        assert_eq!(shards.len(), 3);
        let port = shards[0].local_addr().unwrap();
        assert!(shards.iter().all(|l| l.local_addr().unwrap() == port));
        // A successor with fewer runtimes still takes every shard (their queues hold clients).
        let new = hand_over(&old);
        let taken = new.listener_shards("listener web", any, 64, 2).unwrap();
        assert_eq!(taken.len(), 3);
        assert!(new.unused().is_empty(), "{:?}", new.unused());
        // One with more runtimes joins the same port with new shards.
        let newer = hand_over(&new);
        let more = newer.listener_shards("listener web", any, 64, 5).unwrap();
        assert_eq!(more.len(), 5);
        assert!(more.iter().all(|l| l.local_addr().unwrap() == port));
    }

    #[tokio::test]
    async fn a_socket_taken_over_without_reuseport_stays_one() {
        let old = Sockets::default();
        old.keep_for_successor();
        let any = "127.0.0.1:0".parse().unwrap();
        let plain = old.tcp_listener_at("listener web", any, any, 64).unwrap();
        let port = plain.local_addr().unwrap();
        let new = hand_over(&old);
        let taken = new.listener_shards("listener web", any, 64, 4).unwrap();
        assert_eq!(taken.len(), 1, "no SO_REUSEPORT on the old socket: nothing can join it");
        assert_eq!(taken[0].local_addr().unwrap(), port);
    }
}
