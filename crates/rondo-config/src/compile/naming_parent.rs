//! `[naming] parent`: the endpoints of the naming service one level up (PKUAS's naming
//! hierarchy), each `host:port` or `http://host:port`; not this service's own address (a
//! lookup would ask itself), at most [`MAX_PARENTS`].

use std::net::SocketAddr;

use super::Compiler;
use crate::path::FieldPath;

/// Most parent endpoints (a parent is one service, reached at a few addresses).
pub(crate) const MAX_PARENTS: usize = 16;

/// The checked list, in order.
pub(super) fn parent(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    raw: Option<&[String]>,
    listen: SocketAddr,
) -> Vec<String> {
    let raw = raw.unwrap_or_default();
    let path = path.key("parent");
    if raw.len() > MAX_PARENTS {
        c.err(path.clone(), format!("at most {MAX_PARENTS} endpoints, got {}", raw.len()));
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, e) in raw.iter().enumerate() {
        match check(e, listen) {
            Ok(()) => out.push(e.trim_end_matches('/').to_owned()),
            Err(why) => c.err(path.index(i), format!("`{e}`: {why}")),
        }
    }
    out
}

fn check(endpoint: &str, listen: SocketAddr) -> Result<(), String> {
    if endpoint.starts_with("https://") {
        return Err("parents are reached over plain HTTP (write host:port)".to_owned());
    }
    let rest = endpoint.strip_prefix("http://").unwrap_or(endpoint).trim_end_matches('/');
    if rest.contains("://") {
        return Err("the scheme must be http".to_owned());
    }
    let (host, port) = rest.rsplit_once(':').ok_or("no port (write host:port)")?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or("the port is not 1 to 65535")?;
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let name_ok = !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
    if !name_ok {
        return Err("not a host name or IP address".to_owned());
    }
    if crate::address_reaches(&format!("{host}:{port}"), listen) {
        return Err("is this naming service's own `listen`: a lookup would ask itself".to_owned());
    }
    Ok(())
}
