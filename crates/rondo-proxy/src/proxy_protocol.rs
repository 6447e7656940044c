//! The PROXY protocol header (HAProxy's, v1 text and v2 binary) that a proxy in front (an L4
//! load balancer, another HAProxy) puts before a client's bytes, so the router learns the
//! client's address: the listener's `proxy_protocol` and `trusted_sources`.
//!
//! The header is read with `peek` and then consumed to its exact length, so what follows it (a
//! TLS ClientHello, an HTTP request, a TCP stream's first bytes) stays in the socket for
//! whoever reads next. Parsing is the `ppp` crate's. A trusted source must send the header
//! its mode asks for; anyone else's connection is served with its own address on an `http`
//! listener (and refused if it carries a header: nobody may claim an address but the proxies
//! in front) and refused on a `tcp` listener, whose client may speak only after the server.

use std::net::SocketAddr;
use std::time::Duration;

use ppp::v2;
use rondo_config::{ProxyProtocolMode, ProxyProtocolSpec};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// v2's 12-byte signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// v1's prefix.
const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// v1's longest header (spec section 2.1), CRLF included.
const V1_MAX: usize = 107;
/// The longest v2 header read: the addresses of any family plus room for TLVs. A proxy that
/// sends more (TLVs of kilobytes) is refused rather than buffered.
const V2_MAX: usize = 16 + 536;

/// The header that tells a member (a cluster's `proxy_protocol`) that the client at
/// `client` reached the router at `local`. Addresses of different families are both written as
/// IPv6 (an IPv4 one mapped).
pub(crate) fn header(
    version: rondo_core::ProxyHeader,
    client: SocketAddr,
    local: SocketAddr,
) -> Vec<u8> {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (mut src, mut dst) = (canonical(client), canonical(local));
    if src.is_ipv4() != dst.is_ipv4() {
        let mapped = |a: SocketAddr| match a.ip() {
            std::net::IpAddr::V4(ip) => SocketAddr::new(ip.to_ipv6_mapped().into(), a.port()),
            std::net::IpAddr::V6(_) => a,
        };
        (src, dst) = (mapped(src), mapped(dst));
    }
    match version {
        rondo_core::ProxyHeader::V1 => {
            ppp::v1::Addresses::from((src, dst)).to_string().into_bytes()
        }
        rondo_core::ProxyHeader::V2 => {
            v2::Builder::with_addresses(
                v2::Version::Two | v2::Command::Proxy,
                v2::Protocol::Stream,
                (src, dst),
            )
            .build()
            // Writing into a Vec cannot fail.
            .unwrap_or_default()
        }
    }
}

/// Why a connection was refused (the `result` label of `rondo_proxy_protocol_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A header from a peer outside `trusted_sources`, or any connection from one on a `tcp`
    /// listener.
    Untrusted,
    /// A trusted source's connection without the header its mode asks for.
    Missing,
    /// A header that does not parse, is too long, or did not arrive in time.
    Malformed,
}

impl Refused {
    /// The metric's label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refused::Untrusted => "refused_untrusted",
            Refused::Missing => "refused_missing",
            Refused::Malformed => "refused_malformed",
        }
    }
}

/// What the start of a connection held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A header naming the client: its address.
    Client(SocketAddr),
    /// A header without an address (v2 `LOCAL`, v1 `UNKNOWN`: the proxy's own health check),
    /// or no header where none is needed: the connection's own address stands.
    Own,
}

impl Outcome {
    /// The metric's label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Client(_) => "accepted",
            Outcome::Own => "own_address",
        }
    }
}

/// Which header the first bytes start.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    V1,
    V2,
    None,
    /// Too few bytes to tell.
    Unknown,
}

fn kind(start: &[u8]) -> Kind {
    let starts = |sig: &[u8]| {
        let n = start.len().min(sig.len());
        start[..n] == sig[..n]
    };
    match (starts(V1_PREFIX), starts(V2_SIGNATURE)) {
        (false, false) => Kind::None,
        (true, _) if start.len() >= V1_PREFIX.len() => Kind::V1,
        (_, true) if start.len() >= V2_SIGNATURE.len() => Kind::V2,
        _ => Kind::Unknown,
    }
}

/// Reads the header, if any, at the start of `stream` from `peer` (waiting at most `timeout`
/// for it); `tcp`: the listener is a `tcp` one (untrusted peers refused outright).
pub(crate) async fn read(
    stream: &mut TcpStream,
    peer: SocketAddr,
    spec: &ProxyProtocolSpec,
    tcp: bool,
    timeout: Duration,
) -> Result<Outcome, Refused> {
    let ip = peer.ip().to_canonical();
    let trusted = spec.trusted.iter().any(|n| n.contains(&ip));
    if !trusted && tcp {
        return Err(Refused::Untrusted);
    }
    match tokio::time::timeout(timeout, read_header(stream, trusted, spec.mode)).await {
        Ok(r) => r,
        Err(_) => Err(Refused::Malformed),
    }
}

async fn read_header(
    stream: &mut TcpStream,
    trusted: bool,
    mode: ProxyProtocolMode,
) -> Result<Outcome, Refused> {
    let mut buf = [0u8; V2_MAX];
    let mut seen = 0;
    loop {
        let n = stream.peek(&mut buf).await.map_err(|_| Refused::Malformed)?;
        if n == 0 {
            // Closed before a byte (or before the header was whole).
            return Err(if seen == 0 { Refused::Missing } else { Refused::Malformed });
        }
        let start = &buf[..n];
        let kind = kind(start);
        match (&kind, trusted) {
            (Kind::V1 | Kind::V2, false) => return Err(Refused::Untrusted),
            (Kind::None, false) => return Ok(Outcome::Own),
            (Kind::None, true) if mode == ProxyProtocolMode::Optional => return Ok(Outcome::Own),
            (Kind::None, true) => return Err(Refused::Missing),
            (Kind::V1, true) if mode == ProxyProtocolMode::V2 => return Err(Refused::Missing),
            (Kind::V2, true) if mode == ProxyProtocolMode::V1 => return Err(Refused::Missing),
            _ => {}
        }
        if let Some(len) = header_len(&kind, start)? {
            let outcome = parse(&buf[..len])?;
            // Consumed to its exact length: the client's own bytes stay in the socket.
            stream.read_exact(&mut buf[..len]).await.map_err(|_| Refused::Malformed)?;
            return Ok(outcome);
        }
        if n == buf.len() {
            return Err(Refused::Malformed);
        }
        // The rest has not arrived: `peek` would answer at once with the same bytes, so wait a
        // moment (a proxy sends the header in one segment; this is the rare split one).
        seen = n;
        stream.readable().await.map_err(|_| Refused::Malformed)?;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The header's length once `start` holds all of it; `None` while more is needed.
fn header_len(kind: &Kind, start: &[u8]) -> Result<Option<usize>, Refused> {
    match kind {
        Kind::V1 => match start.windows(2).position(|w| w == b"\r\n") {
            Some(at) if at + 2 <= V1_MAX => Ok(Some(at + 2)),
            Some(_) => Err(Refused::Malformed),
            None if start.len() >= V1_MAX => Err(Refused::Malformed),
            None => Ok(None),
        },
        Kind::V2 if start.len() >= 16 => {
            let len = 16 + usize::from(u16::from_be_bytes([start[14], start[15]]));
            if len > V2_MAX {
                return Err(Refused::Malformed);
            }
            Ok((start.len() >= len).then_some(len))
        }
        _ => Ok(None),
    }
}

/// The client's address in a whole header.
fn parse(header: &[u8]) -> Result<Outcome, Refused> {
    match ppp::HeaderResult::parse(header) {
        ppp::HeaderResult::V1(Ok(h)) => Ok(match h.addresses {
            ppp::v1::Addresses::Tcp4(a) => {
                Outcome::Client(SocketAddr::from((a.source_address, a.source_port)))
            }
            ppp::v1::Addresses::Tcp6(a) => {
                Outcome::Client(SocketAddr::from((a.source_address, a.source_port)))
            }
            ppp::v1::Addresses::Unknown => Outcome::Own,
        }),
        ppp::HeaderResult::V2(Ok(h)) => Ok(match (h.command, h.addresses) {
            (v2::Command::Local, _) => Outcome::Own,
            (v2::Command::Proxy, v2::Addresses::IPv4(a)) => {
                Outcome::Client(SocketAddr::from((a.source_address, a.source_port)))
            }
            (v2::Command::Proxy, v2::Addresses::IPv6(a)) => {
                Outcome::Client(SocketAddr::from((a.source_address, a.source_port)))
            }
            // A Unix socket's or an unspecified address: the proxy's own connection stands.
            (v2::Command::Proxy, _) => Outcome::Own,
        }),
        _ => Err(Refused::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_told_from_the_first_bytes() {
        assert_eq!(kind(b"GET / HTTP/1.1"), Kind::None);
        assert_eq!(kind(b"PUT / HTTP/1.1"), Kind::None);
        assert_eq!(kind(b"\x16\x03\x01"), Kind::None);
        assert_eq!(kind(b"PRO"), Kind::Unknown);
        assert_eq!(kind(b"PROXY TCP4"), Kind::V1);
        assert_eq!(kind(b"\r\n\r\n\0"), Kind::Unknown);
        assert_eq!(kind(V2_SIGNATURE), Kind::V2);
    }

    #[test]
    fn headers_give_the_clients_address() {
        let v1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 443\r\nGET /";
        let len = header_len(&Kind::V1, v1).unwrap().unwrap();
        assert_eq!(&v1[len..], b"GET /");
        assert_eq!(parse(&v1[..len]), Ok(Outcome::Client("192.0.2.7:51000".parse().unwrap())));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n"), Ok(Outcome::Own));
        assert_eq!(parse(b"PROXY TCP4 nonsense\r\n"), Err(Refused::Malformed));

        let src: SocketAddr = "[2001:db8::7]:4000".parse().unwrap();
        let dst: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let v2 = v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Proxy,
            v2::Protocol::Stream,
            (src, dst),
        )
        .build()
        .unwrap();
        let len = header_len(&Kind::V2, &v2).unwrap().unwrap();
        assert_eq!(len, v2.len());
        assert_eq!(header_len(&Kind::V2, &v2[..20]), Ok(None));
        assert_eq!(parse(&v2), Ok(Outcome::Client(src)));
    }

    #[test]
    fn headers_written_for_members_read_back() {
        let client: SocketAddr = "192.0.2.7:5000".parse().unwrap();
        let local: SocketAddr = "[::ffff:10.0.0.1]:443".parse().unwrap();
        for version in [rondo_core::ProxyHeader::V1, rondo_core::ProxyHeader::V2] {
            let h = header(version, client, local);
            assert_eq!(parse(&h), Ok(Outcome::Client(client)), "{version:?}");
        }
        let mixed =
            header(rondo_core::ProxyHeader::V1, client, "[2001:db8::1]:443".parse().unwrap());
        assert_eq!(&mixed[..], b"PROXY TCP6 ::ffff:192.0.2.7 2001:db8::1 5000 443\r\n");
    }

    #[test]
    fn an_overlong_header_is_malformed() {
        let long = [b'A'; 200];
        let mut v1 = b"PROXY ".to_vec();
        v1.extend_from_slice(&long);
        assert_eq!(header_len(&Kind::V1, &v1), Err(Refused::Malformed));
        let mut v2 = V2_SIGNATURE.to_vec();
        v2.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(header_len(&Kind::V2, &v2), Err(Refused::Malformed));
    }
}
