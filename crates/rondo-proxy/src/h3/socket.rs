//! The HTTP/3 listener's UDP socket as quinn sees it: quinn's own tokio socket wrapped to
//! steer datagrams between processes during a hitless upgrade ([`rondo_runtime::sockets::steer`]) and
//! to count the anti-amplification limit ([`super::amplify`]).
//!
//! Steering: the connection IDs this process issues start with its prefix ([`Cids`]). While
//! a process it replaced still drains, a datagram whose destination connection ID (short
//! header: the bytes after the first; long header: after the length at byte 5) starts with
//! one of that process's prefixes is passed to it over the steering channel instead of to
//! quinn here. The old process reads such datagrams from the channel as if from the UDP
//! socket, and sends its answers on its own duplicate of it. A new connection's first
//! Initials carry a connection ID the client chose at random: they stay here unless their
//! first four bytes happen to equal an old prefix (one chance in 2^32).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, ConnectionId, ConnectionIdGenerator, UdpPoller};
use rondo_runtime::metrics::{Counter, Http3Metrics};
use rondo_runtime::sockets::steer::{
    ForwardError, MSG_ACK, MSG_DATAGRAM, PREFIX_LEN, Prefix, Steer,
};

use super::amplify::{self, Amplification};

/// Bytes of this listener's connection IDs: the prefix and 8 random bytes (quinn's default
/// length, all random).
const CID_LEN: usize = PREFIX_LEN + 8;

/// Batches read from the UDP socket in one call, at most, when every datagram of them went
/// to another process (the endpoint's other work then gets its turn).
const MAX_EMPTY_BATCHES: usize = 16;

/// The largest steering message: a UDP datagram's largest payload and the header.
const MAX_MESSAGE: usize = 65_535 + 64;

/// Messages read from the steering channel in one call, at most, when none was a datagram.
const MAX_CONTROL_MESSAGES: usize = 16;

/// This process's connection IDs: its prefix, then random bytes.
pub(super) struct Cids(pub(super) Prefix);

impl ConnectionIdGenerator for Cids {
    fn generate_cid(&mut self) -> ConnectionId {
        use ring::rand::SecureRandom as _;
        let mut id = [0u8; CID_LEN];
        id[..PREFIX_LEN].copy_from_slice(&self.0);
        // The system's generator does not fail on Linux; the prefix keeps the id ours anyway.
        let _ = ring::rand::SystemRandom::new().fill(&mut id[PREFIX_LEN..]);
        ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The first [`PREFIX_LEN`] bytes of `datagram`'s destination connection ID, if it has that
/// many.
pub(super) fn dcid_prefix(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    let start = if first & 0x80 == 0 {
        1
    } else {
        if usize::from(*datagram.get(5)?) < PREFIX_LEN {
            return None;
        }
        6
    };
    datagram.get(start..start + PREFIX_LEN)
}

/// A datagram for the steering channel: the message kind, ECN (255: none), the source
/// address, the local address it came to (family 0: unknown), then the datagram.
pub(super) fn encode(
    from: SocketAddr,
    dst_ip: Option<IpAddr>,
    ecn: Option<EcnCodepoint>,
    datagram: &[u8],
) -> Vec<u8> {
    let mut m = Vec::with_capacity(datagram.len() + 40);
    m.push(MSG_DATAGRAM);
    m.push(ecn.map_or(255, |e| e as u8));
    push_ip(&mut m, Some(from.ip()));
    m.extend_from_slice(&from.port().to_be_bytes());
    push_ip(&mut m, dst_ip);
    m.extend_from_slice(datagram);
    m
}

fn push_ip(m: &mut Vec<u8>, ip: Option<IpAddr>) {
    match ip {
        None => m.push(0),
        Some(IpAddr::V4(v4)) => {
            m.push(4);
            m.extend_from_slice(&v4.octets());
        }
        Some(IpAddr::V6(v6)) => {
            m.push(6);
            m.extend_from_slice(&v6.octets());
        }
    }
}

/// What [`encode`] wrote: the source, the local address, ECN and where the datagram starts.
pub(super) fn decode(
    m: &[u8],
) -> Option<(SocketAddr, Option<IpAddr>, Option<EcnCodepoint>, usize)> {
    if *m.first()? != MSG_DATAGRAM {
        return None;
    }
    let ecn = match *m.get(1)? {
        255 => None,
        bits => EcnCodepoint::from_bits(bits),
    };
    let (from, at) = take_ip(m, 2)?;
    let port = u16::from_be_bytes(m.get(at..at + 2)?.try_into().ok()?);
    let (dst, at) = take_ip(m, at + 2)?;
    Some((SocketAddr::new(from?, port), dst, ecn, at))
}

fn take_ip(m: &[u8], at: usize) -> Option<(Option<IpAddr>, usize)> {
    match *m.get(at)? {
        0 => Some((None, at + 1)),
        4 => {
            let o: [u8; 4] = m.get(at + 1..at + 5)?.try_into().ok()?;
            Some((Some(IpAddr::from(o)), at + 5))
        }
        6 => {
            let o: [u8; 16] = m.get(at + 1..at + 17)?.try_into().ok()?;
            Some((Some(IpAddr::from(o)), at + 17))
        }
        _ => None,
    }
}

/// What the socket counts, in the listener's HTTP/3 events.
#[derive(Debug)]
struct Counters {
    amplification_limited: Counter,
    forwarded: Counter,
    forward_dropped: Counter,
    forwarded_in: Counter,
}

/// The steering channel from the process that took over, once there is one.
#[derive(Debug, Default)]
struct FromSuccessor {
    channel: Option<tokio::net::UnixDatagram>,
    /// Which source the next call reads first: neither starves the other.
    channel_first: bool,
    /// Where a message is read whole (a datagram and its header), made when the channel is.
    scratch: Vec<u8>,
}

/// See the module docs.
pub(super) struct Socket {
    inner: Arc<dyn AsyncUdpSocket>,
    steer: Arc<Steer>,
    successor: Mutex<FromSuccessor>,
    amplification: Mutex<Amplification>,
    counters: Counters,
}

impl fmt::Debug for Socket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Socket").field("inner", &self.inner).field("steer", &self.steer).finish()
    }
}

impl Socket {
    /// `inner` (quinn's socket over the listener's UDP socket) with `steer`'s steering,
    /// counted in `metrics`.
    pub(super) fn new(
        inner: Arc<dyn AsyncUdpSocket>,
        steer: Arc<Steer>,
        metrics: &Http3Metrics,
    ) -> Socket {
        Socket {
            inner,
            steer,
            successor: Mutex::new(FromSuccessor::default()),
            amplification: Mutex::new(Amplification::default()),
            counters: Counters {
                amplification_limited: metrics.amplification_limited.clone(),
                forwarded: metrics.forwarded.clone(),
                forward_dropped: metrics.forward_dropped.clone(),
                forwarded_in: metrics.forwarded_in.clone(),
            },
        }
    }

    /// `addr` is validated, or its handshake is over: its amplification is no longer counted.
    pub(super) fn forget(&self, addr: SocketAddr) {
        self.amplification.lock().unwrap_or_else(|e| e.into_inner()).forget(addr);
    }

    fn received(&self, from: SocketAddr, data: &[u8], stride: usize) {
        let mut a = self.amplification.lock().unwrap_or_else(|e| e.into_inner());
        for segment in data.chunks(stride.max(1)) {
            a.received(from, amplify::kind(segment), segment.len());
        }
    }

    /// Datagrams from the UDP socket, those of older processes' connections passed on; none
    /// while this process does not read it (taking over, or handed over).
    fn poll_udp(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        if !self.steer.reads_udp() {
            return Poll::Pending;
        }
        for _ in 0..MAX_EMPTY_BATCHES {
            let n = ready!(self.inner.poll_recv(cx, bufs, meta))?;
            let kept = self.sort(bufs, meta, n);
            if kept > 0 {
                return Poll::Ready(Ok(kept));
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Passes on the datagrams of `n` buffers that are older processes', moves the rest to
    /// the front; how many buffers are left.
    fn sort(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta], n: usize) -> usize {
        let steering = self.steer.has_predecessor();
        let mut kept = 0;
        for i in 0..n {
            let m = meta[i];
            let len = if steering { self.pass_on(&mut bufs[i], m) } else { m.len };
            if len == 0 {
                continue;
            }
            if kept != i {
                let (head, tail) = bufs.split_at_mut(i);
                head[kept][..len].copy_from_slice(&tail[0][..len]);
            }
            self.received(m.addr, &bufs[kept][..len], m.stride);
            meta[kept] = RecvMeta { len, ..m };
            kept += 1;
        }
        kept
    }

    /// Passes on the datagrams of `buf` (`m.len` bytes, `m.stride` each) that are an older
    /// process's; the others are moved together at its start (all but the last stay
    /// `stride` long); their length.
    fn pass_on(&self, buf: &mut [u8], m: RecvMeta) -> usize {
        let stride = if m.stride == 0 { m.len } else { m.stride };
        let (mut read, mut write) = (0, 0);
        while read < m.len {
            let end = (read + stride).min(m.len);
            let theirs = dcid_prefix(&buf[read..end]).filter(|p| self.steer.is_predecessors(p));
            if let Some(prefix) = theirs {
                let prefix: Prefix = prefix.try_into().unwrap_or_default();
                self.pass(&prefix, &encode(m.addr, m.dst_ip, m.ecn, &buf[read..end]));
            } else {
                buf.copy_within(read..end, write);
                write += end - read;
            }
            read = end;
        }
        write
    }

    /// Passes `message` (an [`encode`]d datagram) to the process before this one whose
    /// prefix is `prefix`, counted.
    fn pass(&self, prefix: &Prefix, message: &[u8]) {
        match self.steer.forward(prefix, message) {
            Ok(()) => self.counters.forwarded.inc(),
            Err(ForwardError::Full | ForwardError::Gone) => self.counters.forward_dropped.inc(),
        };
    }

    /// A datagram the process that took over passed here, into `bufs[0]`.
    fn poll_successor(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<usize> {
        let mut from = self.successor.lock().unwrap_or_else(|e| e.into_inner());
        let from = &mut *from;
        for _ in 0..MAX_CONTROL_MESSAGES {
            let Some(channel) = &from.channel else { return Poll::Pending };
            let mut read = tokio::io::ReadBuf::new(&mut from.scratch);
            match channel.poll_recv(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    tracing::debug!("quic steering: the channel from the new process: {e}");
                    from.channel = None;
                    return Poll::Pending;
                }
                Poll::Ready(Ok(())) => {}
            }
            let message = read.filled();
            if message.first() == Some(&MSG_ACK) {
                self.steer.set_acked();
                continue;
            }
            let Some((addr, dst_ip, ecn, at)) = decode(message) else { continue };
            let datagram = &message[at..];
            let Some(buf) = bufs[0].get_mut(..datagram.len()) else { continue };
            buf.copy_from_slice(datagram);
            let len = datagram.len();
            meta[0] = RecvMeta { addr, len, stride: len, ecn, dst_ip };
            self.counters.forwarded_in.inc();
            self.received(addr, &bufs[0][..len], len);
            return Poll::Ready(1);
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl AsyncUdpSocket for Socket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)?;
        let mut a = self.amplification.lock().unwrap_or_else(|e| e.into_inner());
        if a.len() > 0 && a.sent(transmit.destination, transmit.contents.len()) {
            self.counters.amplification_limited.inc();
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.steer.register(cx.waker());
        let channel_first = {
            let mut from = self.successor.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(channel) = self.steer.take_offered() {
                match tokio::net::UnixDatagram::from_std(channel) {
                    Ok(c) => {
                        from.channel = Some(c);
                        from.scratch.resize(MAX_MESSAGE, 0);
                    }
                    Err(e) => tracing::warn!("quic steering: the channel to the new process: {e}"),
                }
            }
            from.channel_first = !from.channel_first;
            from.channel_first
        };
        if channel_first && let Poll::Ready(n) = self.poll_successor(cx, bufs, meta) {
            return Poll::Ready(Ok(n));
        }
        if let Poll::Ready(r) = self.poll_udp(cx, bufs, meta) {
            return Poll::Ready(r);
        }
        if !channel_first && let Poll::Ready(n) = self.poll_successor(cx, bufs, meta) {
            return Poll::Ready(Ok(n));
        }
        Poll::Pending
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_of_short_and_long_headers() {
        let short = [0x43, 9, 8, 7, 6, 5, 4];
        assert_eq!(dcid_prefix(&short), Some(&[9u8, 8, 7, 6][..]));
        let long = [0xc3, 0, 0, 0, 1, 12, 1, 2, 3, 4, 5, 6];
        assert_eq!(dcid_prefix(&long), Some(&[1u8, 2, 3, 4][..]));
        // Too short an id, a datagram cut short.
        assert_eq!(dcid_prefix(&[0xc3, 0, 0, 0, 1, 3, 1, 2, 3]), None);
        assert_eq!(dcid_prefix(&[0xc3, 0, 0, 0, 1, 12, 1, 2]), None);
        assert_eq!(dcid_prefix(&[0x43, 1]), None);
        assert_eq!(dcid_prefix(&[]), None);
    }

    #[test]
    fn generated_ids_carry_the_prefix() {
        let mut g = Cids([1, 2, 3, 4]);
        let (a, b) = (g.generate_cid(), g.generate_cid());
        assert_eq!(a.len(), CID_LEN);
        assert_eq!(&a[..PREFIX_LEN], &[1, 2, 3, 4]);
        assert_ne!(a, b);
        let mut short = vec![0x40];
        short.extend_from_slice(&a);
        assert_eq!(dcid_prefix(&short), Some(&[1u8, 2, 3, 4][..]));
    }

    #[test]
    fn a_datagram_crosses_the_channel_whole() {
        for (from, dst) in [
            ("10.1.2.3:4433".parse().unwrap(), Some("127.0.0.1".parse().unwrap())),
            ("[::1]:9".parse().unwrap(), None),
        ] {
            let m = encode(from, dst, Some(EcnCodepoint::Ect0), b"quic");
            let (f, d, e, at) = decode(&m).unwrap();
            assert_eq!((f, d, e, &m[at..]), (from, dst, Some(EcnCodepoint::Ect0), &b"quic"[..]));
        }
        let m = encode("10.0.0.1:1".parse().unwrap(), None, None, b"");
        assert_eq!(decode(&m).map(|d| d.2), Some(None));
        for cut in 0..m.len() - 1 {
            assert!(decode(&m[..cut]).is_none(), "cut at {cut}");
        }
        assert!(decode(&[MSG_ACK]).is_none());
    }
}
