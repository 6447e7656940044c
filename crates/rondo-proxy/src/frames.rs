//! HTTP/2 frame tracking for client connections, the pure part of [`crate::conn::TimedIo`]'s
//! HTTP/2 protections: [`Frames`] follows frame boundaries in one direction of a connection
//! reading only each frame's 9-byte header (and the error codes of `RST_STREAM` and `GOAWAY`),
//! so the router can check frame sizes the h2 library gets wrong, count stream resets, and put
//! a GOAWAY of its own choosing between two frames; [`ResetBudget`] counts resets per client
//! address and says what a new connection from an address over its budget may do
//! ([`Standing`]: fewer concurrent streams, then none), so that a flood that reconnects after
//! each GOAWAY does not get a whole connection's streams forwarded every time.
//!
//! hyper has no API to close a connection with a chosen error code, and h2 answers a few
//! malformed frames with `PROTOCOL_ERROR` where RFC 9113 requires `FRAME_SIZE_ERROR`; following
//! the frames under hyper costs a few comparisons per frame (payloads are skipped by arithmetic).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rondo_config::Http2Limits;

/// Frame type `HEADERS`.
pub const HEADERS: u8 = 0x1;
/// Frame type `RST_STREAM`.
pub const RST_STREAM: u8 = 0x3;
/// Frame type `SETTINGS`.
pub const SETTINGS: u8 = 0x4;
/// Frame type `PING`.
pub const PING: u8 = 0x6;
/// Frame type `GOAWAY`.
pub const GOAWAY: u8 = 0x7;
/// Frame type `WINDOW_UPDATE`.
pub const WINDOW_UPDATE: u8 = 0x8;
/// The `ACK` flag of `SETTINGS` and `PING`.
pub const ACK: u8 = 0x1;

/// Error code `NO_ERROR`.
pub const NO_ERROR: u32 = 0x0;
/// Error code `FRAME_SIZE_ERROR`.
pub const FRAME_SIZE_ERROR: u32 = 0x6;
/// Error code `ENHANCE_YOUR_CALM`.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A frame header, as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: u32,
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub stream: u32,
}

/// What [`Frames::feed`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A complete frame header.
    Head(Head),
    /// The error code of the `RST_STREAM` frame whose header came last.
    ResetCode(u32),
    /// The error code of the `GOAWAY` frame whose header came last.
    GoawayCode(u32),
}

/// Follows the frames of one direction of an HTTP/2 connection (after the client preface).
#[derive(Debug, Default)]
pub struct Frames {
    head: [u8; 9],
    head_len: u8,
    /// Payload bytes of the current frame still to pass.
    rest: u32,
    /// Whether the current frame's payload holds an error code to collect (`RST_STREAM`,
    /// `GOAWAY`), after `skip` more bytes.
    want_code: bool,
    skip: u8,
    code: [u8; 4],
    code_len: u8,
    /// The current frame's type.
    kind: u8,
}

impl Frames {
    /// Whether the bytes so far end exactly at a frame boundary.
    pub fn at_boundary(&self) -> bool {
        self.head_len == 0 && self.rest == 0
    }

    /// How many bytes at most may pass before the next point where something is known about
    /// the frame (the end of its header, or the end of its payload); 0 at a boundary.
    pub fn to_boundary(&self) -> usize {
        if self.head_len > 0 { usize::from(9 - self.head_len) } else { self.rest as usize }
    }

    /// Follows `bytes`, calling `on` with each complete frame header and, when `reset_codes`,
    /// each `RST_STREAM` and `GOAWAY` error code. When `on` returns `true` for a header,
    /// following stops and the offset in `bytes` where that frame began is returned (0 when it
    /// began in an earlier chunk); the tracker is then left inside that frame.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        reset_codes: bool,
        mut on: impl FnMut(Seen) -> bool,
    ) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            if self.rest > 0 {
                if self.want_code {
                    // A GOAWAY's code follows its last stream identifier.
                    let n = usize::from(self.skip).min(bytes.len() - i);
                    self.skip -= n as u8;
                    self.rest -= n as u32;
                    i += n;
                    while self.skip == 0 && self.code_len < 4 && self.rest > 0 && i < bytes.len() {
                        self.code[usize::from(self.code_len)] = bytes[i];
                        self.code_len += 1;
                        self.rest -= 1;
                        i += 1;
                    }
                    if self.code_len == 4 {
                        self.want_code = false;
                        let code = u32::from_be_bytes(self.code);
                        on(if self.kind == GOAWAY {
                            Seen::GoawayCode(code)
                        } else {
                            Seen::ResetCode(code)
                        });
                    }
                    continue;
                }
                let n = (self.rest as usize).min(bytes.len() - i);
                i += n;
                self.rest -= n as u32;
                continue;
            }
            let start = if self.head_len > 0 { 0 } else { i };
            let have = usize::from(self.head_len);
            let take = (9 - have).min(bytes.len() - i);
            self.head[have..have + take].copy_from_slice(&bytes[i..i + take]);
            self.head_len += take as u8;
            i += take;
            if self.head_len < 9 {
                break;
            }
            self.head_len = 0;
            let h = &self.head;
            let head = Head {
                len: u32::from_be_bytes([0, h[0], h[1], h[2]]),
                kind: h[3],
                flags: h[4],
                stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            };
            self.rest = head.len;
            self.want_code = reset_codes
                && ((head.kind == RST_STREAM && head.len == 4)
                    || (head.kind == GOAWAY && head.len >= 8));
            self.skip = if head.kind == GOAWAY { 4 } else { 0 };
            self.kind = head.kind;
            self.code_len = 0;
            if on(Seen::Head(head)) {
                return Some(start);
            }
        }
        None
    }
}

/// Whether a frame header alone makes a connection error `FRAME_SIZE_ERROR` (RFC 9113 §6.3,
/// §6.4, §6.5, §6.7, §6.9), which h2 reports as `PROTOCOL_ERROR` instead.
pub fn frame_size_error(h: &Head) -> bool {
    match h.kind {
        PING => h.len != 8,
        SETTINGS => (h.flags & ACK != 0 && h.len != 0) || !h.len.is_multiple_of(6),
        RST_STREAM => h.len != 4,
        WINDOW_UPDATE => h.len != 4,
        GOAWAY => h.len < 8,
        _ => false,
    }
}

/// Whether an `RST_STREAM` the router sends with `code` is the client's doing (a protocol,
/// flow-control or concurrency error of its stream, as in "made you reset"): counted in its
/// reset budget. `NO_ERROR`, `INTERNAL_ERROR` and `CANCEL` are the router's or the member's.
pub fn counts_against_client(code: u32) -> bool {
    !matches!(code, 0x0 | 0x2 | 0x8)
}

/// A GOAWAY frame with `code`, naming `last_stream` as the last stream the router may act on.
pub fn goaway(last_stream: u32, code: u32) -> [u8; 17] {
    let mut f = [0u8; 17];
    f[2] = 8;
    f[3] = GOAWAY;
    f[9..13].copy_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    f[13..17].copy_from_slice(&code.to_be_bytes());
    f
}

/// Client addresses tracked at once for the per-address reset budget; past that, new
/// addresses are not tracked until old windows expire (each connection keeps its own budget).
const MAX_TRACKED_ADDRESSES: usize = 4096;

/// Streams a new connection from an address over its budget may have open at once
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`), instead of hyper's 200.
pub const REDUCED_STREAMS: u32 = 8;

/// Connections from an address over its budget that get [`REDUCED_STREAMS`] and are still
/// ended for their resets; after that many, its new HTTP/2 connections are refused until the
/// window ends.
const REDUCED_CHANCES: u32 = 3;

/// What a new HTTP/2 connection from a client address may do, by the address's reset budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Within its budget: the listener's usual limits.
    Good,
    /// Over its budget: at most [`REDUCED_STREAMS`] concurrent streams.
    Reduced,
    /// Over its budget and still resetting on reduced connections: GOAWAY `ENHANCE_YOUR_CALM`
    /// before any stream.
    Refused,
}

/// Resets and streams counted over one window.
#[derive(Debug, Clone, Copy)]
struct Tally {
    end: Instant,
    resets: u32,
    streams: u32,
    /// Connections ended for their resets while the address was over its budget.
    strikes: u32,
}

impl Tally {
    fn new(now: Instant) -> Self {
        Tally { end: now + Http2Limits::RESET_WINDOW, resets: 0, streams: 0, strikes: 0 }
    }

    /// Starts a new window if this one is over.
    fn roll(&mut self, now: Instant) {
        if now >= self.end {
            *self = Tally::new(now);
        }
    }

    /// Over `max` resets, and the resets are more than half the streams opened: a client that
    /// resets a small share of many streams (cancelled RPCs) stays, a flood of resets does not
    /// (its resets are bounded by the streams it lets finish, which its members answer at their
    /// own pace).
    fn over(&self, max: u32) -> bool {
        self.resets > max && u64::from(self.resets) * 2 > u64::from(self.streams)
    }
}

/// A listener's HTTP/2 reset budgets: per connection ([`ConnResets`]) and per client address.
#[derive(Debug)]
pub struct ResetBudget {
    /// The listener's limits.
    pub limits: Http2Limits,
    by_address: Mutex<Addresses>,
}

#[derive(Debug, Default)]
struct Addresses {
    tallies: HashMap<IpAddr, Tally>,
    last_sweep: Option<Instant>,
}

impl ResetBudget {
    /// Budgets for `limits`.
    pub fn new(limits: Http2Limits) -> Self {
        ResetBudget { limits, by_address: Mutex::default() }
    }

    /// What a new HTTP/2 connection from `ip` may do at `now`: the address's standing stays
    /// until its window ends (the budget recovers with the next window).
    pub fn standing(&self, ip: IpAddr, now: Instant) -> Standing {
        let a = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
        match a.tallies.get(&client_key(ip)) {
            Some(t) if t.end > now && t.over(self.limits.max_resets_per_address) => {
                if t.strikes > REDUCED_CHANCES { Standing::Refused } else { Standing::Reduced }
            }
            _ => Standing::Good,
        }
    }

    /// Counts `resets` resets from `ip` at `now`, and `streams` streams it opened since its
    /// last report: whether the address is over its budget (then a connection of it is ended,
    /// a strike against it when `strike`). Locked once per reset, never per stream.
    fn note(&self, ip: IpAddr, now: Instant, resets: u32, streams: u32, strike: bool) -> bool {
        let ip = client_key(ip);
        let mut a = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
        if a.tallies.len() >= MAX_TRACKED_ADDRESSES && !a.tallies.contains_key(&ip) {
            // Sweep expired windows at most once a second, so a crowd of addresses cannot make
            // every reset scan the table.
            if a.last_sweep.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
                return false;
            }
            a.last_sweep = Some(now);
            a.tallies.retain(|_, t| t.end > now);
            if a.tallies.len() >= MAX_TRACKED_ADDRESSES {
                return false;
            }
        }
        let t = a.tallies.entry(ip).or_insert_with(|| Tally::new(now));
        t.roll(now);
        t.resets = t.resets.saturating_add(resets);
        t.streams = t.streams.saturating_add(streams);
        let over = t.over(self.limits.max_resets_per_address);
        if over && strike {
            t.strikes = t.strikes.saturating_add(1);
        }
        over
    }
}

/// The address a client's resets are counted under: IPv4 addresses as they are, IPv6 ones by
/// their /64 prefix (one subscriber's or host's network: rotating through it is free).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

/// One connection's resets and streams over the current window.
#[derive(Debug, Default)]
pub struct ConnResets {
    tally: Option<Tally>,
    /// Streams opened since the address's tally last heard from this connection.
    unreported: u32,
    /// The connection was over its address's budget (counted as a strike once).
    struck: bool,
}

impl ConnResets {
    /// The client opened a stream.
    pub fn stream_opened(&mut self, now: Instant) {
        let t = self.tally.get_or_insert_with(|| Tally::new(now));
        t.roll(now);
        t.streams = t.streams.saturating_add(1);
        self.unreported = self.unreported.saturating_add(1);
    }

    /// Counts one reset on this connection from `ip`: whether the connection or its address
    /// is now over budget.
    pub fn note(&mut self, budget: &ResetBudget, ip: IpAddr, now: Instant) -> bool {
        self.note_many(budget, ip, now, 1)
    }

    /// Counts `resets` resets at once (a connection error of the client's counts as its whole
    /// budget): whether the connection or its address is now over budget.
    pub fn note_many(
        &mut self,
        budget: &ResetBudget,
        ip: IpAddr,
        now: Instant,
        resets: u32,
    ) -> bool {
        let t = self.tally.get_or_insert_with(|| Tally::new(now));
        t.roll(now);
        t.resets = t.resets.saturating_add(resets);
        let conn_over = t.over(budget.limits.max_resets);
        let streams = std::mem::take(&mut self.unreported);
        let address_over = budget.note(ip, now, resets, streams, !self.struck);
        // One strike per connection, however many of its resets come after the address is over.
        self.struck |= address_over;
        conn_over || address_over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    fn all_seen(f: &mut Frames, chunks: &[&[u8]]) -> Vec<Seen> {
        let mut seen = Vec::new();
        for c in chunks {
            assert_eq!(
                f.feed(c, true, |s| {
                    seen.push(s);
                    false
                }),
                None
            );
        }
        seen
    }

    #[test]
    fn follows_frames_split_anywhere() {
        let mut wire = frame(0x0, 0, 1, &[7; 100]);
        wire.extend(frame(RST_STREAM, 0, 3, &8u32.to_be_bytes()));
        wire.extend(frame(PING, 0, 0, &[1; 8]));
        wire.extend(&goaway(7, 1));
        let whole = all_seen(&mut Frames::default(), &[&wire]);
        assert_eq!(whole.len(), 6, "{whole:?}");
        assert_eq!(whole[2], Seen::ResetCode(8));
        assert!(matches!(whole[3], Seen::Head(Head { kind: PING, len: 8, .. })));
        assert_eq!(whole[5], Seen::GoawayCode(1));
        for cut in 1..wire.len() {
            let mut f = Frames::default();
            let (a, b) = wire.split_at(cut);
            assert_eq!(all_seen(&mut f, &[a, b]), whole, "cut at {cut}");
            assert!(f.at_boundary());
        }
        let mut f = Frames::default();
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(all_seen(&mut f, &bytes), whole);
    }

    #[test]
    fn stops_at_the_start_of_the_frame_asked_for() {
        let mut wire = frame(SETTINGS, 0, 0, &[]);
        let bad_at = wire.len();
        wire.extend(frame(PING, 0, 0, &[1; 6]));
        let mut f = Frames::default();
        let stop = f.feed(&wire, false, |s| matches!(s, Seen::Head(h) if frame_size_error(&h)));
        assert_eq!(stop, Some(bad_at));
        // A header split over two reads: the frame began in the earlier one.
        let mut f = Frames::default();
        assert_eq!(f.feed(&wire[..bad_at + 4], false, |_| false), None);
        assert_eq!(f.to_boundary(), 5);
        let stop =
            f.feed(&wire[bad_at + 4..], false, |s| matches!(s, Seen::Head(h) if h.kind == PING));
        assert_eq!(stop, Some(0));
    }

    #[test]
    fn frame_sizes_rfc_9113_requires() {
        let h = |kind, flags, len| Head { len, kind, flags, stream: 0 };
        assert!(frame_size_error(&h(PING, 0, 6)));
        assert!(frame_size_error(&h(PING, ACK, 9)));
        assert!(!frame_size_error(&h(PING, 0, 8)));
        assert!(frame_size_error(&h(SETTINGS, ACK, 6)));
        assert!(frame_size_error(&h(SETTINGS, 0, 7)));
        assert!(!frame_size_error(&h(SETTINGS, 0, 12)));
        assert!(!frame_size_error(&h(SETTINGS, ACK, 0)));
        assert!(frame_size_error(&h(RST_STREAM, 0, 5)));
        assert!(frame_size_error(&h(WINDOW_UPDATE, 0, 3)));
        assert!(frame_size_error(&h(GOAWAY, 0, 7)));
        assert!(!frame_size_error(&h(HEADERS, 0, 0)));
    }

    #[test]
    fn goaway_frame_layout() {
        let g = goaway(0x8000_0005, ENHANCE_YOUR_CALM);
        assert_eq!(&g[..9], &[0, 0, 8, GOAWAY, 0, 0, 0, 0, 0]);
        assert_eq!(&g[9..13], &5u32.to_be_bytes());
        assert_eq!(&g[13..], &0xbu32.to_be_bytes());
    }

    #[test]
    fn reset_budgets_per_connection_per_address_and_window() {
        let limits = Http2Limits { max_resets: 3, max_resets_per_address: 5, ..Default::default() };
        let budget = ResetBudget::new(limits);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        let mut a = ConnResets::default();
        assert!((0..3).all(|_| !a.note(&budget, ip, t0)));
        assert!(a.note(&budget, ip, t0), "the 4th reset on one connection is over");
        // A second connection from the same address: 4 so far, the 6th in all is over.
        let mut b = ConnResets::default();
        assert!(!b.note(&budget, ip, t0));
        assert!(b.note(&budget, ip, t0));
        // Another address has its own budget; a new window starts afresh.
        let mut c = ConnResets::default();
        assert!(!c.note(&budget, "192.0.2.2".parse().unwrap(), t0));
        let later = t0 + Http2Limits::RESET_WINDOW;
        assert!(!a.note(&budget, ip, later));
    }

    // Issue 41 item 5: an address over its budget had every new connection served as the
    // first, so a flood that reconnected after each GOAWAY got a whole connection's streams
    // forwarded every time.
    #[test]
    fn an_address_over_its_budget_gets_fewer_streams_then_none_until_its_window_ends() {
        let limits = Http2Limits { max_resets: 2, max_resets_per_address: 4, ..Default::default() };
        let budget = ResetBudget::new(limits);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        assert_eq!(budget.standing(ip, t0), Standing::Good);
        let mut first = ConnResets::default();
        assert!((0..2).all(|_| !first.note(&budget, ip, t0)));
        let mut second = ConnResets::default();
        assert!((0..2).all(|_| !second.note(&budget, ip, t0)));
        assert_eq!(budget.standing(ip, t0), Standing::Good, "at its budget, not over");
        // The 5th reset is over: a strike, and the address's new connections are reduced.
        assert!(second.note(&budget, ip, t0));
        assert!(second.note(&budget, ip, t0), "one strike per connection however many resets");
        assert_eq!(budget.standing(ip, t0), Standing::Reduced);
        assert_eq!(budget.standing("192.0.2.2".parse().unwrap(), t0), Standing::Good);
        // Reduced connections still ended for their resets: after REDUCED_CHANCES more, refused.
        for i in 0..REDUCED_CHANCES {
            assert_eq!(budget.standing(ip, t0), Standing::Reduced, "strike {}", i + 2);
            assert!(ConnResets::default().note(&budget, ip, t0));
        }
        assert_eq!(budget.standing(ip, t0), Standing::Refused);
        // The budget recovers with the next window.
        assert_eq!(budget.standing(ip, t0 + Http2Limits::RESET_WINDOW), Standing::Good);
        // A connection error counts as a connection's whole budget: the third puts the
        // address over its 4.
        let later = t0 + Http2Limits::RESET_WINDOW;
        let errors: Vec<bool> = (0..3)
            .map(|_| ConnResets::default().note_many(&budget, ip, later, limits.max_resets))
            .collect();
        assert_eq!(errors, [false, false, true]);
        assert_eq!(budget.standing(ip, later), Standing::Reduced);
    }

    #[test]
    fn resets_of_a_minority_of_streams_are_not_over() {
        let limits = Http2Limits { max_resets: 3, max_resets_per_address: 5, ..Default::default() };
        let budget = ResetBudget::new(limits);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        let mut a = ConnResets::default();
        // 10 resets of 30 streams: a third were cancelled.
        for i in 0..30 {
            a.stream_opened(t0);
            if i % 3 == 0 {
                assert!(!a.note(&budget, ip, t0), "reset {}", i / 3 + 1);
            }
        }
        // Resets of the next streams tip the balance: 16 resets of 36 streams is not over yet,
        // 19 of 39 neither, 20 of 40 neither, the 21st is.
        let mut over_at = None;
        for i in 0..20 {
            a.stream_opened(t0);
            if a.note(&budget, ip, t0) {
                over_at = Some(i);
                break;
            }
        }
        assert_eq!(over_at, Some(10), "11 more resets: 21 of 41 streams");
        // The streams expire with their window.
        let later = t0 + Http2Limits::RESET_WINDOW;
        let other: IpAddr = "192.0.2.9".parse().unwrap();
        assert!((0..3).all(|_| !a.note(&budget, other, later)));
        assert!(a.note(&budget, other, later));
    }

    #[test]
    fn ipv6_clients_count_by_their_64_prefix() {
        let limits =
            Http2Limits { max_resets: 100, max_resets_per_address: 2, ..Default::default() };
        let budget = ResetBudget::new(limits);
        let t0 = Instant::now();
        let mut c = ConnResets::default();
        assert!(!c.note(&budget, "2001:db8:1:2::1".parse().unwrap(), t0));
        assert!(!c.note(&budget, "2001:db8:1:2:ffff::9".parse().unwrap(), t0));
        assert!(c.note(&budget, "2001:db8:1:2:abcd::".parse().unwrap(), t0), "same /64");
        assert!(!c.note(&budget, "2001:db8:1:3::1".parse().unwrap(), t0), "another /64");
        // IPv4 clients on an IPv6 socket count as themselves.
        assert!(!c.note(&budget, "::ffff:192.0.2.7".parse().unwrap(), t0));
        assert!(!c.note(&budget, "192.0.2.7".parse().unwrap(), t0));
        assert!(c.note(&budget, "::ffff:192.0.2.7".parse().unwrap(), t0));
    }

    #[test]
    fn only_client_caused_resets_count() {
        assert!(counts_against_client(0x1));
        assert!(counts_against_client(0x7));
        assert!(!counts_against_client(0x0));
        assert!(!counts_against_client(0x2));
        assert!(!counts_against_client(0x8));
    }
}
