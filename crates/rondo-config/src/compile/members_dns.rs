//! A cluster's `members_dns`: the name (A and AAAA) or SRV name its members are discovered
//! from, how often it is asked again, which server is asked and how many members one answer
//! may give.

use super::*;

use crate::raw::RawMembersDns;
use crate::spec::{DnsQuery, MembersDnsSpec};

/// Compiles `members_dns` at `path` (`cluster.NAME.members_dns`); `None` after an error.
pub(super) fn compile_members_dns(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    raw: &RawMembersDns,
) -> Option<MembersDnsSpec> {
    let before = c.problems.len();
    let query = match (&raw.name, &raw.srv) {
        (Some(name), None) => {
            check_dns_name(c, path.key("name"), name);
            let port = match raw.port {
                None => {
                    c.err(path.key("port"), "members_dns with `name` needs the members' `port`");
                    0
                }
                Some(p) => c.int(path.key("port"), Some(p), 0, 1, 65_535) as u16,
            };
            DnsQuery::Address { name: name.clone(), port }
        }
        (None, Some(srv)) => {
            check_dns_name(c, path.key("srv"), srv);
            if raw.port.is_some() {
                c.err(
                    path.key("port"),
                    "with `srv`, the records give the members' ports: drop `port`",
                );
            }
            DnsQuery::Srv { name: srv.clone() }
        }
        (Some(_), Some(_)) => {
            c.err(
                path.key("srv"),
                "members_dns takes `name` (A and AAAA records) or `srv`, not both",
            );
            return None;
        }
        (None, None) => {
            c.err(
                path.clone(),
                "members_dns needs `name` (A and AAAA records, with `port`) or `srv` (SRV records)",
            );
            return None;
        }
    };
    let refresh =
        c.ms(path.key("refresh_ms"), raw.refresh_ms, MembersDnsSpec::DEFAULT_REFRESH, false);
    if !(MembersDnsSpec::MIN_REFRESH..=MembersDnsSpec::MAX_REFRESH).contains(&refresh) {
        c.err(path.key("refresh_ms"), "refresh_ms must be between 1000 (1s) and 86400000 (24h)");
    }
    let resolver = raw.resolver.as_deref().and_then(|s| match s.parse::<IpAddr>() {
        // An address alone is asked on port 53.
        Ok(ip) => Some(SocketAddr::new(ip, 53)),
        Err(_) => c.socket_addr(path.key("resolver"), s),
    });
    let max = MembersDnsSpec::MAX_MAX_MEMBERS;
    let max_members = c.int(
        path.key("max_members"),
        raw.max_members,
        u64::from(MembersDnsSpec::DEFAULT_MAX_MEMBERS),
        1,
        u64::from(max),
    ) as u32;
    (c.problems.len() == before).then_some(MembersDnsSpec { query, refresh, resolver, max_members })
}

/// A DNS name: labels of letters, digits, `-` and `_` (SRV's `_http._tcp`), each 1 to 63
/// characters, 253 in all; a final dot is allowed.
fn check_dns_name(c: &mut Compiler<'_>, path: FieldPath, name: &str) {
    let bare = name.strip_suffix('.').unwrap_or(name);
    let problem = if bare.is_empty() {
        Some("must not be empty".to_owned())
    } else if bare.len() > 253 {
        Some(format!("is {} characters long, at most 253 are allowed", bare.len()))
    } else if bare.parse::<IpAddr>().is_ok() {
        Some("is an IP address: list it in `members` instead".to_owned())
    } else {
        bare.split('.').find_map(|label| {
            let ok = (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-');
            (!ok).then(|| format!("has a bad label `{}`", label.escape_debug()))
        })
    };
    if let Some(p) = problem {
        c.err(path, format!("`{}` is not a DNS name: it {p}", name.escape_debug()));
    }
}
