//! The `Host` check of the HTTP APIs that listen on loopback (the naming API now, the admin API
//! later): a web page can make a browser send requests to `127.0.0.1` through a name it controls
//! (DNS rebinding); such requests carry that name in `Host`, so an API answers only the names it
//! is configured for: the loopback names and addresses, its own bound address, and an
//! `allowed_hosts` list.

use std::net::{IpAddr, SocketAddr};

/// Names any API listener answers (with any port).
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Whether a request whose `Host` header (or `:authority`) is `host` may be answered by a
/// listener bound at `listen` with the extra names `allowed` (lower case, without port). The
/// port is not compared. `None` (no `Host` at all: HTTP/1.0 clients; browsers always send one)
/// is allowed. `Err` names the host, ready for a 403 body.
pub fn check_host(
    host: Option<&[u8]>,
    listen: SocketAddr,
    allowed: &[String],
) -> Result<(), String> {
    let Some(raw) = host else { return Ok(()) };
    let text = String::from_utf8_lossy(raw);
    let name = host_name(&text).to_ascii_lowercase();
    let name = name.trim_end_matches('.');
    let ip = name.parse::<IpAddr>().ok();
    let ok = LOOPBACK_HOSTS.contains(&name)
        || ip.is_some_and(|ip| ip.is_loopback())
        || ip.is_some_and(|ip| ip == listen.ip() && !ip.is_unspecified())
        || allowed.iter().any(|a| a.trim_start_matches('[').trim_end_matches(']') == name);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "host `{}` is not a name of this API (it answers localhost, 127.0.0.1, [::1]{}{}): \
             add it to `allowed_hosts` if it is yours",
            text.trim(),
            if listen.ip().is_unspecified() || listen.ip().is_loopback() {
                String::new()
            } else {
                format!(", {}", listen.ip())
            },
            allowed.iter().map(|a| format!(", {a}")).collect::<String>(),
        ))
    }
}

/// The host of a `Host` value: without its port, and without the brackets of an IPv6 address.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_own_address_and_allowed_names_pass() {
        let lo: SocketAddr = "127.0.0.1:9901".parse().unwrap();
        for h in [
            "localhost",
            "localhost:9901",
            "LOCALHOST:1",
            "127.0.0.1:9901",
            "[::1]:80",
            "[::1]",
            "127.0.0.2",
        ] {
            assert_eq!(check_host(Some(h.as_bytes()), lo, &[]), Ok(()), "{h}");
        }
        assert_eq!(check_host(None, lo, &[]), Ok(()));
        let own: SocketAddr = "10.1.2.3:9901".parse().unwrap();
        assert_eq!(check_host(Some(b"10.1.2.3:9901"), own, &[]), Ok(()));
        let allowed = ["naming.internal".to_owned()];
        assert_eq!(check_host(Some(b"naming.internal:9901"), lo, &allowed), Ok(()));
    }

    #[test]
    fn other_hosts_are_named_in_the_error() {
        let any: SocketAddr = "0.0.0.0:9901".parse().unwrap();
        let e = check_host(Some(b"evil.example:9901"), any, &[]).unwrap_err();
        assert!(e.starts_with("host `evil.example:9901` is not a name of this API"), "{e}");
        assert!(check_host(Some(b"0.0.0.0:9901"), any, &[]).is_err());
        assert!(check_host(Some(b"localhost.evil.example"), any, &[]).is_err());
        assert!(check_host(Some(b"127.0.0.1.evil.example"), any, &[]).is_err());
    }
}
