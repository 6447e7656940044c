//! What the own HTTP/1 path keeps between requests: idle upstream connections per member
//! ([`Idle`], indexed by member number in the cluster's view, so taking one hashes nothing),
//! and the per-worker pool of buffers ([`take`], [`give`]) that a connection borrows only while
//! a request is in flight, so an idle keep-alive connection holds no buffer at all.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rondo_core::ConnectionLimits;
use tokio::net::TcpStream;

/// How long an idle upstream connection is kept.
pub const IDLE_FOR: Duration = Duration::from_secs(90);
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
    /// One list per runtime ([`crate::cores`]): a connection is registered with the reactor of
    /// the runtime that opened it, and only that runtime takes it again.
    conns: Box<[IdleList]>,
    /// With the cluster's `max_connection_age_ms` or `max_requests_per_connection`: when each
    /// connection opened and the requests it carried, by descriptor (an entry is made again
    /// when a descriptor number comes back with a new connection, [`Idle::opened`]). `None`:
    /// no limit, nothing counted.
    lives: Option<(ConnectionLimits, Mutex<Lives>)>,
    /// How long a new connection may take to open (the cluster's `connect_timeout`).
    pub connect_timeout: std::time::Duration,
    /// The PROXY header the cluster's connections start with (`proxy_protocol`), and the
    /// member's address: such a connection names one client and is kept for that client only
    /// (`crate::proxied`), never here.
    pub send_proxy: Option<(rondo_core::ProxyHeader, Box<str>)>,
}

/// A runtime's idle connections to one member, each with the time it came back.
type IdleList = Mutex<Vec<(TcpStream, Instant)>>;

/// When each connection opened and the requests it carried, by descriptor.
type Lives = HashMap<RawFd, (Instant, u64)>;

impl Idle {
    /// The pool of the member at `address`, its connections living under `limits` and
    /// opened within `connect_timeout`.
    pub fn new(
        address: &str,
        limits: ConnectionLimits,
        connect_timeout: std::time::Duration,
    ) -> Self {
        let lives = (limits != ConnectionLimits::default()).then(|| (limits, Mutex::default()));
        let conns = (0..crate::cores::count()).map(|_| Mutex::new(Vec::new())).collect();
        Idle { literal: address.parse().ok(), conns, lives, connect_timeout, send_proxy: None }
    }

    /// The same pool of the member at `address`, its connections starting with a PROXY header
    /// of `version`.
    pub fn sending(self, version: Option<rondo_core::ProxyHeader>, address: &str) -> Self {
        Idle { send_proxy: version.map(|v| (v, address.into())), ..self }
    }

    /// This runtime's idle connections (the only list, unless per-core runtimes serve).
    fn mine(&self) -> &IdleList {
        match &*self.conns {
            [one] => one,
            all => &all[crate::cores::index() % all.len()],
        }
    }

    /// A new connection to the member was opened (its age counts from now).
    pub fn opened(&self, conn: &TcpStream) {
        if let Some((_, lives)) = &self.lives {
            let mut lives = lives.lock().unwrap_or_else(|e| e.into_inner());
            lives.insert(conn.as_raw_fd(), (Instant::now(), 0));
        }
    }

    /// Whether `conn` may take another request: younger than the cluster's age limit (and, when
    /// `served`, counting one more request, under its request limit).
    fn lives_on(&self, conn: &TcpStream, now: Instant, served: bool) -> bool {
        let Some((limits, lives)) = &self.lives else { return true };
        let mut lives = lives.lock().unwrap_or_else(|e| e.into_inner());
        let fd = conn.as_raw_fd();
        let Some((born, uses)) = lives.get_mut(&fd) else { return false };
        if served {
            *uses += 1;
        }
        let young = limits.max_age.is_none_or(|age| now.duration_since(*born) < age);
        let fresh = limits.max_requests.is_none_or(|n| *uses < n);
        if !(young && fresh) {
            lives.remove(&fd);
        }
        young && fresh
    }

    /// The newest idle connection that is still open and quiet. A member that closed it, or
    /// sent bytes nobody asked for (a second response, padding), loses it: those bytes would
    /// otherwise be read as the answer to the next request, another client's (`is_quiet`
    /// asks the kernel). `now` is the try's start (a clock reading the caller has made
    /// already).
    pub fn take(&self, now: Instant) -> Option<TcpStream> {
        loop {
            let (conn, since) = self.mine().lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            if now.duration_since(since) > IDLE_FOR || !self.lives_on(&conn, now, false) {
                continue;
            }
            if is_quiet(&conn) {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for a later request (dropped when the member has enough idle ones).
    pub fn give(&self, conn: TcpStream) {
        let now = Instant::now();
        if !self.lives_on(&conn, now, true) {
            // Past the cluster's age or request limit: closed, a new one is opened next time.
            return;
        }
        let mut conns = self.mine().lock().unwrap_or_else(|e| e.into_inner());
        // Oldest first (each is pushed with the time it came back), so the connections idle
        // for too long are at the front: looking there costs one clock comparison per request
        // where a scan of the whole list cost one per idle connection. (With several workers
        // the order can be off by the instant between a clock read and the lock; an expired
        // connection left behind by that is dropped by `take`, which checks every one it pops.)
        let stale = conns.iter().take_while(|(_, since)| now.duration_since(*since) > IDLE_FOR);
        let stale = stale.count();
        if stale > 0 {
            conns.drain(..stale);
        }
        if conns.len() < MAX_IDLE {
            conns.push((conn, now));
        }
    }
}

/// Whether an idle member connection has nothing to read and is still open, asked of the
/// kernel (a peek that must find nothing): tokio's readiness mark is not enough, since a busy
/// worker polls the reactor only now and then, and bytes that came after the last read may
/// not be marked yet. One system call per connection taken.
pub(crate) fn is_quiet(conn: &TcpStream) -> bool {
    use rustix::net::{RecvFlags, recv};
    let mut probe = [0u8; 1];
    let peeked = recv(conn, &mut probe, RecvFlags::PEEK | RecvFlags::DONTWAIT);
    matches!(peeked, Err(e) if e == rustix::io::Errno::AGAIN)
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
