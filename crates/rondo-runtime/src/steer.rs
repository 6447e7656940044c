//! Connection-ID steering of a QUIC listener's UDP socket across a hitless upgrade: the state
//! each such socket shares with the upgrade ([`Steer`]) and the registry of them
//! ([`Steering`], in [`crate::sockets::Sockets`]). The packets themselves are looked at by the
//! listener's socket (`rondo-proxy`'s `h3/socket.rs`); this file owns who reads the socket and
//! the channels between processes.
//!
//! Every process puts a random [`Prefix`] of its own at the start of every connection ID it
//! issues. When a new process asks to take over, the running one makes a Unix datagram socket
//! pair per QUIC socket and hands one end over with the sockets (keyed `"{what} steer
//! {addr}"`); on it goes first the list of prefixes the running process answers for (its own
//! and those it still forwards to a process before it). The new process draws a prefix not in
//! that list and answers with an acknowledgement. It does not read the UDP socket until the
//! hand-over is complete ([`Steering::open`]); the old one stops reading it at the hand-over
//! once the new one has acknowledged ([`Steering::handed_over`]): the kernel socket has one
//! reader at a time. From then on the new process passes the datagrams whose destination
//! connection ID carries an old prefix over the channel; the old process answers on its own
//! duplicate of the UDP socket. The channel closes when the old process's QUIC endpoint ends
//! (its last connection closed) or the process exits (its drain deadline).
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

/// At most this many prefixes go over one channel (a chain of processes still draining).
const MAX_PREFIXES: usize = 64;

/// The process before this one and the prefixes it answers for.
#[derive(Debug)]
struct Predecessor {
    prefixes: Vec<Prefix>,
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
    predecessor: Mutex<Option<Predecessor>>,
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
    /// The state of the socket whose channel is keyed `key`, read by this process at once unless `inherited`;
    /// `channel`: the end of the predecessor's channel handed over with it.
    fn new(key: String, inherited: bool, channel: Option<OwnedFd>) -> Steer {
        let predecessor = channel.and_then(|fd| match Predecessor::greet(fd) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(socket = key.as_str(), "quic steering: no predecessor: {e}");
                None
            }
        });
        let taken: &[Prefix] = predecessor.as_ref().map_or(&[], |p| &p.prefixes);
        let prefix = loop {
            let p = random_prefix();
            if !taken.contains(&p) {
                break p;
            }
        };
        Steer {
            key,
            prefix,
            predecessor: Mutex::new(predecessor),
            reading: AtomicBool::new(!inherited),
            handed_over: AtomicBool::new(false),
            acked: AtomicBool::new(false),
            offered: Mutex::new(None),
            waker: Mutex::new(None),
        }
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

    /// Whether datagrams to connection IDs starting with `prefix` go to the process before.
    pub fn is_predecessors(&self, prefix: &[u8]) -> bool {
        let p = self.predecessor.lock().unwrap_or_else(|e| e.into_inner());
        p.as_ref().is_some_and(|p| p.prefixes.iter().any(|x| x.as_slice() == prefix))
    }

    /// Whether there is a process before this one to steer to.
    pub fn has_predecessor(&self) -> bool {
        self.predecessor.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Passes `message` (a [`MSG_DATAGRAM`]) to the process before, without waiting; once it
    /// is gone, it is forgotten and its datagrams stay here.
    pub fn forward(&self, message: &[u8]) -> Result<(), ForwardError> {
        let mut p = self.predecessor.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pred) = p.as_ref() else { return Err(ForwardError::Gone) };
        match pred.channel.send(message) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(ForwardError::Full),
            Err(e) => {
                tracing::info!(
                    socket = self.key.as_str(),
                    "quic steering: the old process is gone ({e})"
                );
                *p = None;
                Err(ForwardError::Gone)
            }
        }
    }

    /// A new channel to a successor: the prefixes this process answers for go first; the
    /// other end is returned to be handed over. Replaces the channel of an earlier offer.
    fn offer(&self) -> io::Result<OwnedFd> {
        let (ours, theirs) = UnixDatagram::pair()?;
        let mut prefixes = vec![self.prefix];
        if let Some(p) = self.predecessor.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            prefixes.extend(p.prefixes.iter().take(MAX_PREFIXES - 1));
        }
        let mut hello = vec![MSG_PREFIXES];
        for p in &prefixes {
            hello.extend_from_slice(p);
        }
        ours.send(&hello)?;
        ours.set_nonblocking(true)?;
        self.acked.store(false, Ordering::Release);
        *self.offered.lock().unwrap_or_else(|e| e.into_inner()) = Some(ours);
        self.wake();
        Ok(theirs.into())
    }
}

impl Predecessor {
    /// Reads the predecessor's prefixes (sent before the channel was handed over) and
    /// acknowledges them.
    fn greet(fd: OwnedFd) -> io::Result<Predecessor> {
        let channel = UnixDatagram::from(fd);
        channel.set_nonblocking(true)?;
        let mut buf = [0u8; 1 + PREFIX_LEN * MAX_PREFIXES];
        let n = channel.recv(&mut buf)?;
        let prefixes = parse_prefixes(&buf[..n])
            .ok_or_else(|| io::Error::other("the channel's first message is no prefix list"))?;
        channel.send(&[MSG_ACK])?;
        Ok(Predecessor { prefixes, channel })
    }
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
    /// The steering state of a QUIC socket whose channel is handed over keyed `key`:
    /// `channel`, the predecessor's end handed over with it; `inherited`, whether the socket itself was (then it is not read until
    /// [`Steering::open`]).
    pub(crate) fn add(&self, key: String, inherited: bool, channel: Option<OwnedFd>) -> Arc<Steer> {
        let steer = Arc::new(Steer::new(key, inherited, channel));
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
                Ok(fd) => out.push((s.key.clone(), fd)),
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

    #[test]
    fn a_successor_gets_every_prefix_and_draws_another() {
        let old = Steering::default();
        let a = old.add("listener web quic 127.0.0.1:0".to_owned(), false, None);
        assert!(a.reads_udp());
        let offered = old.offer();
        assert_eq!(offered.len(), 1);
        let (key, fd) = offered.into_iter().next().unwrap();
        let new = Steering::default();
        let b = new.add(key, true, Some(fd));
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
        b.forward(&[MSG_DATAGRAM, 1, 2, 3]).unwrap();
        assert_eq!(channel.recv(&mut buf).unwrap(), 4);
        drop(channel);
        assert_eq!(b.forward(&[MSG_DATAGRAM]), Err(ForwardError::Gone));
        assert!(!b.has_predecessor());
    }

    #[test]
    fn a_handed_over_process_whose_successor_does_not_steer_keeps_reading() {
        let old = Steering::default();
        let a = old.add("k".to_owned(), false, None);
        let _unused = old.offer();
        old.handed_over();
        assert!(a.reads_udp(), "no acknowledgement: nobody would pass its datagrams on");
    }

    #[test]
    fn a_chain_passes_the_oldest_prefixes_on() {
        let first = Steering::default();
        let a = first.add("k".to_owned(), false, None);
        let (_, fd) = first.offer().pop().unwrap();
        let second = Steering::default();
        let b = second.add("k".to_owned(), true, Some(fd));
        let (_, fd) = second.offer().pop().unwrap();
        let c = Steering::default().add("k".to_owned(), true, Some(fd));
        assert!(c.is_predecessors(&a.prefix()) && c.is_predecessors(&b.prefix()));
        assert!(!c.is_predecessors(&c.prefix()));
        assert!(parse_prefixes(&[MSG_PREFIXES, 1, 2]).is_none());
        assert!(parse_prefixes(&[MSG_ACK]).is_none());
    }
}
