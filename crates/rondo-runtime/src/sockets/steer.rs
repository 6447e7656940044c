//! Connection-ID steering of a QUIC listener's UDP socket across a hitless upgrade: the state
//! each such socket shares with the upgrade ([`Steer`]) and the registry of them
//! ([`Steering`], in [`crate::sockets::Sockets`]). The packets themselves are looked at by the
//! listener's socket (`rondo-proxy`'s `h3/socket.rs`); this file owns who reads the socket and
//! the channels between processes.
//!
//! Every process puts a random [`Prefix`] of its own at the start of every connection ID it
//! issues. When a new process asks to take over, the running one makes a Unix datagram socket
//! pair per QUIC socket and hands one end over with the sockets (keyed `"{what} steer
//! {addr}"`), with a duplicate of each channel it has itself to a process before it that still
//! drains (keyed `"{what} steer {addr} N"`): a chain of upgrades reaches the oldest process
//! directly, whether the ones between have exited or not. On the new channel goes first the
//! list of prefixes, the running process's and then those of the channels after it, in order.
//! The new process draws a prefix not in that list and answers with an acknowledgement. It does
//! not read the UDP socket until the hand-over is complete ([`Steering::open`]); the old one
//! stops reading it at the hand-over once the new one has acknowledged
//! ([`Steering::handed_over`]): the kernel socket has one reader at a time. From then on the
//! new process passes the datagrams whose destination connection ID carries an old prefix over
//! that process's channel; the old process answers on its own duplicate of the UDP socket. A
//! channel closes when the old process's QUIC endpoint ends (its last connection closed) or
//! the process exits (its drain deadline).
//!
//! Why not `SO_REUSEPORT` and a BPF program: the socket is handed over, not bound twice, and a
//! reuseport group with a steering program needs the old process to leave the group without
//! losing the datagrams queued on its member socket; a channel between the two processes has
//! neither problem, at the cost of one copy per forwarded datagram while an old process drains.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Waker;

/// Bytes of a connection ID that name the process generation that issued it.
pub const PREFIX_LEN: usize = 4;

/// A process generation's connection-ID prefix.
pub type Prefix = [u8; PREFIX_LEN];

/// A datagram passed to the old process (first byte of a channel message).
pub const MSG_DATAGRAM: u8 = 1;
/// The prefixes the running process answers for (the first message on a new channel).
const MSG_PREFIXES: u8 = 2;
/// The new process steers (its answer to the prefix list).
pub const MSG_ACK: u8 = 3;

/// Older processes, still draining, that one process steers to at most (a chain of upgrades
/// faster than drains); the oldest beyond are let go.
pub const MAX_CHAIN: usize = 8;

/// A process before this one that still drains: its prefix and its channel.
#[derive(Debug)]
struct Predecessor {
    prefix: Prefix,
    channel: UnixDatagram,
}

/// Why a datagram could not be passed to the process before this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardError {
    /// Its channel is full (it is not keeping up): this datagram is dropped.
    Full,
    /// It is gone (its endpoint or the process ended): no more go to it.
    Gone,
}

/// One QUIC socket's steering state (see the module docs).
#[derive(Debug)]
pub struct Steer {
    key: String,
    prefix: Prefix,
    predecessors: Mutex<Vec<Predecessor>>,
    /// Whether this process reads the UDP socket (not while it takes over).
    reading: AtomicBool,
    /// This process handed over: it stops reading once the successor has acknowledged.
    handed_over: AtomicBool,
    /// The successor acknowledged the channel (it steers the old prefixes here).
    acked: AtomicBool,
    /// A channel to a successor made by an offer, not yet taken by the socket.
    offered: Mutex<Option<UnixDatagram>>,
    waker: Mutex<Option<Waker>>,
}

impl Steer {
    /// The state of the socket whose channel is keyed `key`, read by this process at once
    /// unless `inherited`; `channels`: the ends of the older processes' channels handed over
    /// with it, the running process's first.
    fn new(key: String, inherited: bool, channels: Vec<OwnedFd>) -> Steer {
        let predecessors = match greet(channels) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(socket = key.as_str(), "quic steering: no predecessor: {e}");
                Vec::new()
            }
        };
        let prefix = loop {
            let p = random_prefix();
            if !predecessors.iter().any(|x| x.prefix == p) {
                break p;
            }
        };
        Steer {
            key,
            prefix,
            predecessors: Mutex::new(predecessors),
            reading: AtomicBool::new(!inherited),
            handed_over: AtomicBool::new(false),
            acked: AtomicBool::new(false),
            offered: Mutex::new(None),
            waker: Mutex::new(None),
        }
    }

    fn predecessors(&self) -> std::sync::MutexGuard<'_, Vec<Predecessor>> {
        self.predecessors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prefix of this process's connection IDs on this socket.
    pub fn prefix(&self) -> Prefix {
        self.prefix
    }

    /// Whether this process reads the UDP socket now.
    pub fn reads_udp(&self) -> bool {
        self.reading.load(Ordering::Acquire)
            && !(self.handed_over.load(Ordering::Acquire) && self.acked.load(Ordering::Acquire))
    }

    /// The successor acknowledged the channel (read on it by the socket).
    pub fn set_acked(&self) {
        self.acked.store(true, Ordering::Release);
    }

    /// Wakes the socket's reader with `waker` when who reads changes.
    pub fn register(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }

    fn wake(&self) {
        if let Some(w) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }

    /// The channel of the latest offer to a successor, for the socket to read.
    pub fn take_offered(&self) -> Option<UnixDatagram> {
        self.offered.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Whether datagrams to connection IDs starting with `prefix` go to a process before.
    pub fn is_predecessors(&self, prefix: &[u8]) -> bool {
        self.predecessors().iter().any(|p| p.prefix.as_slice() == prefix)
    }

    /// Whether there is a process before this one to steer to.
    pub fn has_predecessor(&self) -> bool {
        !self.predecessors().is_empty()
    }

    /// Passes `message` (a [`MSG_DATAGRAM`]) to the process before this one whose prefix is
    /// `prefix`, without waiting; once it is gone, it is forgotten and its datagrams stay
    /// here.
    pub fn forward(&self, prefix: &[u8], message: &[u8]) -> Result<(), ForwardError> {
        let mut all = self.predecessors();
        let Some(at) = all.iter().position(|p| p.prefix.as_slice() == prefix) else {
            return Err(ForwardError::Gone);
        };
        match all[at].channel.send(message) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(ForwardError::Full),
            Err(e) => {
                tracing::info!(
                    socket = self.key.as_str(),
                    "quic steering: an old process is gone ({e})"
                );
                all.remove(at);
                Err(ForwardError::Gone)
            }
        }
    }

    /// A new channel to a successor, with the prefixes this process and those before it
    /// answer for first on it; returns the channels to hand over: its other end, then a
    /// duplicate of each of this process's own channels to processes before. Replaces the
    /// channel of an earlier offer.
    fn offer(&self) -> io::Result<Vec<OwnedFd>> {
        let (ours, theirs) = UnixDatagram::pair()?;
        let mut hello = vec![MSG_PREFIXES];
        hello.extend_from_slice(&self.prefix);
        let mut fds = vec![OwnedFd::from(theirs)];
        for p in self.predecessors().iter().take(MAX_CHAIN - 1) {
            fds.push(p.channel.try_clone()?.into());
            hello.extend_from_slice(&p.prefix);
        }
        ours.send(&hello)?;
        ours.set_nonblocking(true)?;
        self.acked.store(false, Ordering::Release);
        *self.offered.lock().unwrap_or_else(|e| e.into_inner()) = Some(ours);
        self.wake();
        Ok(fds)
    }
}

/// The older processes of `channels` (the running process's first): the prefixes sent on the
/// first before it was handed over, one per channel, read; the first acknowledged.
fn greet(channels: Vec<OwnedFd>) -> io::Result<Vec<Predecessor>> {
    let mut channels = channels.into_iter().map(UnixDatagram::from);
    let Some(first) = channels.next() else { return Ok(Vec::new()) };
    first.set_nonblocking(true)?;
    let mut buf = [0u8; 1 + PREFIX_LEN * MAX_CHAIN];
    let n = first.recv(&mut buf)?;
    let prefixes = parse_prefixes(&buf[..n])
        .ok_or_else(|| io::Error::other("the channel's first message is no prefix list"))?;
    first.send(&[MSG_ACK])?;
    let mut all = Vec::new();
    for (prefix, channel) in prefixes.into_iter().zip(std::iter::once(first).chain(channels)) {
        channel.set_nonblocking(true)?;
        all.push(Predecessor { prefix, channel });
    }
    Ok(all)
}

/// The prefixes of a [`MSG_PREFIXES`] message.
fn parse_prefixes(msg: &[u8]) -> Option<Vec<Prefix>> {
    let (&kind, rest) = msg.split_first()?;
    if kind != MSG_PREFIXES || rest.is_empty() || rest.len() % PREFIX_LEN != 0 {
        return None;
    }
    Some(rest.chunks_exact(PREFIX_LEN).map(|c| c.try_into().unwrap_or_default()).collect())
}

fn random_prefix() -> Prefix {
    use ring::rand::SecureRandom as _;
    let mut p = [0u8; PREFIX_LEN];
    // The system's generator does not fail on Linux; were it to, the zero prefix still
    // differs from a predecessor's (drawn again if not).
    let _ = ring::rand::SystemRandom::new().fill(&mut p);
    p
}

/// Every QUIC socket's [`Steer`] in this process.
#[derive(Debug, Default)]
pub struct Steering {
    steers: Mutex<Vec<Weak<Steer>>>,
}

impl Steering {
    /// The steering state of a QUIC socket whose channels are handed over keyed `key`:
    /// `channels`, the older processes' handed over with it (the running one's first);
    /// `inherited`, whether the socket itself was (then it is not read until
    /// [`Steering::open`]).
    pub(crate) fn add(&self, key: String, inherited: bool, channels: Vec<OwnedFd>) -> Arc<Steer> {
        let steer = Arc::new(Steer::new(key, inherited, channels));
        let mut steers = self.steers.lock().unwrap_or_else(|e| e.into_inner());
        steers.retain(|s| s.strong_count() > 0);
        steers.push(Arc::downgrade(&steer));
        steer
    }

    fn each(&self, f: impl Fn(&Steer)) {
        let steers = self.steers.lock().unwrap_or_else(|e| e.into_inner());
        for s in steers.iter().filter_map(Weak::upgrade) {
            f(&s);
        }
    }

    /// A channel per QUIC socket for a successor, by the key it is handed over with.
    pub(crate) fn offer(&self) -> Vec<(String, OwnedFd)> {
        let steers = self.steers.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for s in steers.iter().filter_map(Weak::upgrade) {
            match s.offer() {
                Ok(fds) => out.extend(fds.into_iter().enumerate().map(|(i, fd)| match i {
                    0 => (s.key.clone(), fd),
                    i => (format!("{} {i}", s.key), fd),
                })),
                Err(e) => tracing::warn!(socket = s.key.as_str(), "quic steering: no channel: {e}"),
            }
        }
        out
    }

    /// The hand-over to this process is complete: it reads its QUIC sockets.
    pub fn open(&self) {
        self.each(|s| {
            s.reading.store(true, Ordering::Release);
            s.wake();
        });
    }

    /// This process handed over: each QUIC socket stops being read here once the successor
    /// has acknowledged its channel (a successor that does not steer leaves it read here).
    pub fn handed_over(&self) {
        self.each(|s| {
            s.handed_over.store(true, Ordering::Release);
            s.wake();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `from` offers a successor, taken as the successor's [`Sockets::quic`] would.
    ///
    /// [`Sockets::quic`]: crate::sockets::Sockets::quic
    fn take_over(from: &Steering) -> Arc<Steer> {
        let offered = from.offer();
        let key = offered[0].0.clone();
        for (i, (k, _)) in offered.iter().enumerate().skip(1) {
            assert_eq!(*k, format!("{key} {i}"));
        }
        Steering::default().add(key, true, offered.into_iter().map(|(_, fd)| fd).collect())
    }

    #[test]
    fn a_successor_gets_every_prefix_and_draws_another() {
        let old = Steering::default();
        let a = old.add("listener web quic steer 127.0.0.1:0".to_owned(), false, Vec::new());
        assert!(a.reads_udp());
        let new = Steering::default();
        let offered = old.offer();
        assert_eq!(offered.len(), 1);
        let b = new.add(offered[0].0.clone(), true, offered.into_iter().map(|(_, f)| f).collect());
        assert!(!b.reads_udp(), "a socket taken over is not read before the hand-over");
        assert!(b.is_predecessors(&a.prefix()));
        assert_ne!(a.prefix(), b.prefix());
        // The old process reads the acknowledgement on its channel; handed over, it stops.
        let channel = a.take_offered().unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(channel.recv(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], MSG_ACK);
        a.set_acked();
        assert!(a.reads_udp());
        old.handed_over();
        assert!(!a.reads_udp());
        new.open();
        assert!(b.reads_udp());
        // Forwarded datagrams arrive whole; once the old end is gone, it is forgotten.
        b.forward(&a.prefix(), &[MSG_DATAGRAM, 1, 2, 3]).unwrap();
        assert_eq!(channel.recv(&mut buf).unwrap(), 4);
        drop(channel);
        assert_eq!(b.forward(&a.prefix(), &[MSG_DATAGRAM]), Err(ForwardError::Gone));
        assert!(!b.has_predecessor());
    }

    #[test]
    fn a_handed_over_process_whose_successor_does_not_steer_keeps_reading() {
        let old = Steering::default();
        let a = old.add("k".to_owned(), false, Vec::new());
        let _unused = old.offer();
        old.handed_over();
        assert!(a.reads_udp(), "no acknowledgement: nobody would pass its datagrams on");
    }

    #[test]
    fn a_chain_reaches_the_oldest_process_directly() {
        let first = Steering::default();
        let a = first.add("k".to_owned(), false, Vec::new());
        let second = Steering::default();
        let offered = first.offer();
        let b = second.add("k".to_owned(), true, offered.into_iter().map(|(_, f)| f).collect());
        let c = take_over(&second);
        assert!(c.is_predecessors(&a.prefix()) && c.is_predecessors(&b.prefix()));
        assert!(!c.is_predecessors(&c.prefix()));
        // The second process ends: the third still reaches the first.
        let to_first = a.take_offered().unwrap();
        drop((b, second));
        c.forward(&a.prefix(), &[MSG_DATAGRAM, 7]).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(to_first.recv(&mut buf).unwrap(), 1, "the acknowledgement");
        assert_eq!(to_first.recv(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], &[MSG_DATAGRAM, 7]);
        assert!(parse_prefixes(&[MSG_PREFIXES, 1, 2]).is_none());
        assert!(parse_prefixes(&[MSG_ACK]).is_none());
    }
}
