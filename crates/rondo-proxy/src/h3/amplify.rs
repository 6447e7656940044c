//! Counting the anti-amplification limit (RFC 9000 8.1) that quinn enforces but does not
//! report: per remote address not yet validated, the bytes the listener's socket received
//! from it and sent to it, and whether the sent bytes reached three times the received ones
//! (quinn's own rule: it sends nothing more once `sent >= 3 * received`, and lifts the limit
//! when a Handshake packet arrives or a Retry token validated the address).
//!
//! This mirrors quinn's per-connection accounting per address, from the packets' headers
//! alone: an address is tracked from its first Initial and forgotten once it sends a
//! Handshake or 1-RTT packet, once quinn accepts a Retry token from it, or once its handshake
//! ends; at most [`MAX_TRACKED`] addresses are (the oldest is forgotten first), so a flood of
//! Initials from spoofed addresses holds a bounded table.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

/// Addresses tracked at most.
pub(super) const MAX_TRACKED: usize = 4096;

/// What a datagram's first packet is, as far as address validation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Initial,
    /// A Handshake packet: the client could decrypt the server's Initial (RFC 9000 8.1).
    Handshake,
    /// A 1-RTT packet: the handshake is behind.
    Short,
    Other,
}

/// The kind of `datagram`'s first packet (QUIC version 1's long header types).
pub(super) fn kind(datagram: &[u8]) -> Kind {
    let Some(&first) = datagram.first() else { return Kind::Other };
    if first & 0x80 == 0 {
        return Kind::Short;
    }
    if datagram.len() < 5 || datagram[1..5] == [0, 0, 0, 0] {
        return Kind::Other;
    }
    match (first >> 4) & 0x3 {
        0 => Kind::Initial,
        2 => Kind::Handshake,
        _ => Kind::Other,
    }
}

#[derive(Debug)]
struct Entry {
    received: u64,
    sent: u64,
    /// The limit was reached and nothing came since that would lift it.
    limited: bool,
    /// Its place in `order`.
    serial: u64,
}

/// The addresses not validated yet (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Amplification {
    entries: HashMap<SocketAddr, Entry>,
    /// Addresses by age; entries forgotten since stay until they come up (`serial` tells).
    order: VecDeque<(SocketAddr, u64)>,
    serial: u64,
}

impl Amplification {
    /// A datagram of `len` bytes from `from`, its first packet of `kind`.
    pub(super) fn received(&mut self, from: SocketAddr, kind: Kind, len: usize) {
        match kind {
            Kind::Handshake | Kind::Short => {
                self.entries.remove(&from);
            }
            Kind::Initial => {
                if !self.entries.contains_key(&from) {
                    self.insert(from);
                }
                self.add(from, len);
            }
            Kind::Other => self.add(from, len),
        }
    }

    fn add(&mut self, from: SocketAddr, len: usize) {
        if let Some(e) = self.entries.get_mut(&from) {
            e.received += len as u64;
            // More received: quinn may send again, and another stop counts again.
            e.limited = e.sent >= 3 * e.received;
        }
    }

    fn insert(&mut self, from: SocketAddr) {
        while self.entries.len() >= MAX_TRACKED {
            let Some((oldest, serial)) = self.order.pop_front() else { break };
            if self.entries.get(&oldest).is_some_and(|e| e.serial == serial) {
                self.entries.remove(&oldest);
            }
        }
        if self.order.len() >= 2 * MAX_TRACKED {
            let entries = &self.entries;
            self.order.retain(|(a, s)| entries.get(a).is_some_and(|e| e.serial == *s));
        }
        self.serial += 1;
        self.order.push_back((from, self.serial));
        let entry = Entry { received: 0, sent: 0, limited: false, serial: self.serial };
        self.entries.insert(from, entry);
    }

    /// `len` bytes sent to `to`; whether that reached the limit (it was not reached before).
    pub(super) fn sent(&mut self, to: SocketAddr, len: usize) -> bool {
        let Some(e) = self.entries.get_mut(&to) else { return false };
        e.sent += len as u64;
        if e.limited || e.sent < 3 * e.received {
            return false;
        }
        e.limited = true;
        true
    }

    /// `addr` is validated (a Retry token), or its handshake is over: no longer tracked.
    pub(super) fn forget(&mut self, addr: SocketAddr) {
        self.entries.remove(&addr);
    }

    /// Addresses tracked now.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(n: u32) -> SocketAddr {
        SocketAddr::from((std::net::Ipv4Addr::from(0x0a00_0000 + n), 4433))
    }

    #[test]
    fn the_limit_is_counted_once_until_more_comes() {
        let mut a = Amplification::default();
        a.received(addr(1), Kind::Initial, 1200);
        assert!(!a.sent(addr(1), 1200));
        assert!(!a.sent(addr(1), 1200));
        assert!(a.sent(addr(1), 1200), "3600 sent for 1200 received");
        assert!(!a.sent(addr(1), 40), "the same stop is counted once");
        a.received(addr(1), Kind::Initial, 1200);
        assert!(!a.sent(addr(1), 1200), "3640 sent for 2400 received");
        assert!(a.sent(addr(1), 2400), "a second stop after more came");
        // Validated: no longer counted.
        a.received(addr(1), Kind::Handshake, 50);
        assert!(!a.sent(addr(1), 100_000));
        // Addresses never seen are not tracked.
        assert!(!a.sent(addr(2), 100_000));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest() {
        let mut a = Amplification::default();
        for n in 0..(3 * MAX_TRACKED as u32) {
            a.received(addr(n), Kind::Initial, 1200);
            if n % 3 == 0 {
                a.forget(addr(n));
            }
        }
        assert!(a.len() <= MAX_TRACKED);
        assert!(a.order.len() <= 2 * MAX_TRACKED + 1);
        assert!(!a.sent(addr(1), 4000), "the oldest were forgotten");
        let last = 3 * MAX_TRACKED as u32 - 1;
        assert!(a.sent(addr(last), 4000));
    }

    #[test]
    fn packet_kinds_from_the_first_byte() {
        assert_eq!(kind(&[0xc3, 0, 0, 0, 1, 8]), Kind::Initial);
        assert_eq!(kind(&[0xe3, 0, 0, 0, 1, 8]), Kind::Handshake);
        assert_eq!(kind(&[0xd3, 0, 0, 0, 1, 8]), Kind::Other);
        assert_eq!(kind(&[0x43, 1, 2]), Kind::Short);
        assert_eq!(kind(&[0xc3, 0, 0, 0, 0]), Kind::Other, "version negotiation");
        assert_eq!(kind(&[0xc3]), Kind::Other);
        assert_eq!(kind(&[]), Kind::Other);
    }
}
