//! The UDP health check (`health.udp`): a datagram sent to the member from a socket connected
//! to it, passing when an answer containing the `expect` bytes comes back within the check's
//! timeout (any answer when `expect` is empty). A member whose port is closed answers with ICMP
//! port unreachable, which the connected socket reports as refused.

use std::net::SocketAddr;

use rondo_core::ProbeFailure;
use tokio::net::UdpSocket;

/// The largest answer read (a datagram's largest payload).
const MAX_ANSWER: usize = 65_535;

/// One UDP probe of the member at `address`, within `timeout` (the caller bounds it).
pub(crate) async fn check(address: &str, send: &[u8], expect: &[u8]) -> Result<(), ProbeFailure> {
    let addr = resolve(address).await?;
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await.map_err(|_| ProbeFailure::Unreachable)?;
    socket.connect(addr).await.map_err(|e| io_failure(&e))?;
    socket.send(send).await.map_err(|e| io_failure(&e))?;
    let mut buf = vec![0u8; MAX_ANSWER];
    let n = socket.recv(&mut buf).await.map_err(|e| io_failure(&e))?;
    if contains(&buf[..n], expect) { Ok(()) } else { Err(ProbeFailure::Unexpected) }
}

async fn resolve(address: &str) -> Result<SocketAddr, ProbeFailure> {
    if let Ok(a) = address.parse() {
        return Ok(a);
    }
    let mut found = tokio::net::lookup_host(address).await.map_err(|_| ProbeFailure::Dns)?;
    found.next().ok_or(ProbeFailure::Dns)
}

fn io_failure(e: &std::io::Error) -> ProbeFailure {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => ProbeFailure::Refused,
        _ => ProbeFailure::Unreachable,
    }
}

/// Whether `expect` occurs in `answer` (an empty `expect` always does).
fn contains(answer: &[u8], expect: &[u8]) -> bool {
    expect.is_empty() || answer.windows(expect.len()).any(|w| w == expect)
}

/// `address` (`host:port`) with its port replaced by `port` (`health.port`).
pub(crate) fn with_port(address: &str, port: u16) -> String {
    match address.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{address}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An echo server on loopback that answers `answer` to every datagram.
    async fn server(answer: &'static [u8]) -> String {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = s.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            for _ in 0..100 {
                let Ok((_, from)) = s.recv_from(&mut buf).await else { return };
                let _ = s.send_to(answer, from).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn answers_are_judged() {
        let ok = server(b"+PONG").await;
        assert_eq!(check(&ok, b"PING", b"PONG").await, Ok(()));
        assert_eq!(check(&ok, b"PING", b"").await, Ok(()));
        assert_eq!(check(&ok, b"PING", b"HELLO").await, Err(ProbeFailure::Unexpected));
        // Nobody on the port: ICMP port unreachable, seen as refused.
        let closed = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap().to_string()
        };
        let r = tokio::time::timeout(Duration::from_secs(2), check(&closed, b"PING", b"")).await;
        assert_eq!(r.ok(), Some(Err(ProbeFailure::Refused)));
        assert_eq!(with_port("10.0.0.1:53", 8080), "10.0.0.1:8080");
        assert_eq!(with_port("[::1]:53", 9), "[::1]:9");
    }
}
