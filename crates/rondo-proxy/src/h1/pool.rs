//! What the own HTTP/1 path keeps between requests: idle upstream connections per member
//! ([`Idle`], indexed by member number in the cluster's view, so taking one hashes nothing),
//! and the per-worker pool of buffers ([`take`], [`give`]) that a connection borrows only while
//! a request is in flight, so an idle keep-alive connection holds no buffer at all.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// How long an idle upstream connection is kept.
pub const IDLE_FOR: Duration = Duration::from_secs(90);
/// An idle upstream connection older than this is checked (a read that must find nothing)
/// before it is used again.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);
/// Idle upstream connections kept per member, at most.
const MAX_IDLE: usize = 256;
/// A buffer's size when it is made.
pub const BUF_SIZE: usize = 16 * 1024;
/// Buffers kept per worker thread, at most.
const MAX_POOLED: usize = 256;
/// A buffer grown beyond this (a large head) is not pooled again.
const MAX_POOLED_SIZE: usize = 64 * 1024;

/// One member's idle upstream connections (newest last), and its address parsed once.
#[derive(Debug)]
pub struct Idle {
    /// The member's address when it is an IP literal (no resolution needed).
    pub literal: Option<SocketAddr>,
    conns: Mutex<Vec<(TcpStream, Instant)>>,
}

impl Idle {
    /// The pool of the member at `address`.
    pub fn new(address: &str) -> Self {
        Idle { literal: address.parse().ok(), conns: Mutex::new(Vec::new()) }
    }

    /// The newest idle connection that is still open and quiet (a member that closed it, or
    /// sent bytes nobody asked for, loses it). One idle for less than [`PROBE_AFTER`] is taken
    /// without the system call that checks: a member closes a keep-alive connection after an
    /// idle time of its own, not within a second of its last answer.
    pub fn take(&self) -> Option<TcpStream> {
        let now = Instant::now();
        loop {
            let (conn, since) = self.conns.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            let idle = now.duration_since(since);
            if idle > IDLE_FOR {
                continue;
            }
            if idle < PROBE_AFTER {
                return Some(conn);
            }
            let mut probe = [0u8; 1];
            match conn.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(conn),
                _ => continue,
            }
        }
    }

    /// Keeps `conn` for a later request (dropped when the member has enough idle ones).
    pub fn give(&self, conn: TcpStream) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        conns.retain(|(_, since)| now.duration_since(*since) <= IDLE_FOR);
        if conns.len() < MAX_IDLE {
            conns.push((conn, now));
        }
    }
}

/// Buffers lent by [`take`] and not yet given back: with every connection idle, none.
static LENT: AtomicUsize = AtomicUsize::new(0);

/// Buffers lent now, over every worker (what connections hold while requests are in flight).
pub fn in_use() -> usize {
    LENT.load(Ordering::Relaxed)
}

/// A lent buffer left the pool's care for good (handed to hyper with the connection).
pub fn disown() {
    LENT.fetch_sub(1, Ordering::Relaxed);
}

thread_local! {
    static BUFFERS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer of at least [`BUF_SIZE`] bytes' capacity, from this worker's pool.
pub fn take() -> Vec<u8> {
    LENT.fetch_add(1, Ordering::Relaxed);
    BUFFERS.with(|b| b.borrow_mut().pop()).unwrap_or_else(|| Vec::with_capacity(BUF_SIZE))
}

/// Gives `buf` back to this worker's pool.
pub fn give(mut buf: Vec<u8>) {
    LENT.fetch_sub(1, Ordering::Relaxed);
    if buf.capacity() > MAX_POOLED_SIZE || buf.capacity() < BUF_SIZE {
        return;
    }
    buf.clear();
    BUFFERS.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < MAX_POOLED {
            b.push(buf);
        }
    });
}
