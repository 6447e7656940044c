//! `[naming]`: the naming API's address and token, its registry (embedded or etcd), its DNS
//! server and zone, its xDS server, and the hosts and counts registrations may have.

use super::services::compile_token;
use super::*;

pub(super) fn compile_naming(c: &mut Compiler<'_>, n: &RawNaming) -> NamingSpec {
    let path = FieldPath::root().key("naming");
    let listen = n.listen.as_deref().unwrap_or(NamingSpec::DEFAULT_LISTEN);
    let listen = c
        .socket_addr(path.key("listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let registry = match n.registry.as_deref().unwrap_or("embedded") {
        "embedded" => embedded_registry(c, &path, n),
        "etcd" => etcd_registry(c, &path, n),
        other => {
            c.err(
                path.key("registry"),
                format!("unknown registry `{other}`, expected {}", one_of(REGISTRIES)),
            );
            RegistrySpec::Embedded { snapshot: None }
        }
    };
    let dns = n.dns_listen.as_deref().map(|l| compile_dns(c, &path, l, n.dns_zone.as_deref()));
    if dns.is_none() && n.dns_zone.is_some() {
        c.err(path.key("dns_zone"), "only applies with `dns_listen`");
    }
    let token = compile_token(c, &path, n.token.as_ref(), n.token_file.as_ref());
    // An open naming API beyond loopback lets anyone who reaches it register members, that is
    // take a share of the traffic: refused rather than warned, so it cannot go unnoticed.
    if token.is_none() && !listen.ip().is_loopback() {
        c.err(
            path.key("listen"),
            format!(
                "the naming API on `{listen}` is reachable beyond loopback: set `token` or \
                 `token_file` (without one anyone who reaches it can register members)"
            ),
        );
    }
    let max = NamingSpec::MAX_MAX_REGISTRATIONS;
    let max_registrations_per_service = c.int(
        path.key("max_registrations_per_service"),
        n.max_registrations_per_service,
        u64::from(NamingSpec::DEFAULT_MAX_REGISTRATIONS_PER_SERVICE),
        1,
        max,
    ) as u32;
    let max_registrations = c.int(
        path.key("max_registrations"),
        n.max_registrations,
        u64::from(NamingSpec::DEFAULT_MAX_REGISTRATIONS),
        1,
        max,
    ) as u32;
    let allowed_hosts = allowed_hosts(c, &path, n.allowed_hosts.as_deref());
    let tls = n.tls.as_ref().map(|t| compile_listener_tls(c, &path.key("tls"), t));
    let xds = n.xds.as_ref().map(|x| compile_xds(c, &path.key("xds"), x));
    let parent = super::naming_parent::parent(c, &path, n.parent.as_deref(), listen);
    NamingSpec {
        parent,
        tls,
        xds,
        listen,
        registry,
        dns,
        token,
        max_registrations_per_service,
        max_registrations,
        allowed_hosts,
        allow_registered_clusters: n.allow_registered_clusters.unwrap_or(false),
    }
}

/// `registry = "embedded"`: an optional snapshot file, none of the etcd fields.
fn embedded_registry(c: &mut Compiler<'_>, path: &FieldPath, n: &RawNaming) -> RegistrySpec {
    if n.etcd_endpoints.is_some() {
        c.err(path.key("etcd_endpoints"), "only applies to registry `etcd`");
    }
    if n.etcd_prefix.is_some() {
        c.err(path.key("etcd_prefix"), "only applies to registry `etcd`");
    }
    let snapshot = n.snapshot.as_deref().and_then(|s| c.file_path(path.key("snapshot"), s));
    RegistrySpec::Embedded { snapshot }
}

/// `registry = "etcd"`: its endpoints and key prefix, no snapshot.
fn etcd_registry(c: &mut Compiler<'_>, path: &FieldPath, n: &RawNaming) -> RegistrySpec {
    if n.snapshot.is_some() {
        c.err(path.key("snapshot"), "only applies to registry `embedded`");
    }
    let endpoints = n.etcd_endpoints.clone().unwrap_or_default();
    if endpoints.is_empty() {
        c.err(path.key("registry"), "registry `etcd` needs `etcd_endpoints`");
    }
    for (i, e) in endpoints.iter().enumerate() {
        if let Err(msg) = check_host_port(e) {
            c.err(path.key("etcd_endpoints").index(i), msg);
        }
    }
    let prefix =
        n.etcd_prefix.clone().unwrap_or_else(|| NamingSpec::DEFAULT_ETCD_PREFIX.to_owned());
    if !prefix.starts_with('/') {
        c.err(path.key("etcd_prefix"), format!("`{prefix}` must start with `/`"));
    }
    RegistrySpec::Etcd { endpoints, prefix }
}

/// `dns_listen` and `dns_zone`: the DNS server that answers for the registered services.
fn compile_dns(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    listen: &str,
    zone: Option<&str>,
) -> DnsSpec {
    let listen = c
        .socket_addr(path.key("dns_listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let zone = zone.unwrap_or(NamingSpec::DEFAULT_DNS_ZONE);
    let zone = match dns_zone(zone) {
        Ok(z) => z,
        Err(msg) => {
            c.err(path.key("dns_zone"), msg);
            NamingSpec::DEFAULT_DNS_ZONE.to_owned()
        }
    };
    DnsSpec { listen, zone }
}

/// `allowed_hosts`: the hosts (names or IPs, without a port) registrations may name, lower-cased.
fn allowed_hosts(c: &mut Compiler<'_>, path: &FieldPath, hosts: Option<&[String]>) -> Vec<String> {
    let mut allowed_hosts = Vec::new();
    for (i, h) in hosts.into_iter().flatten().enumerate() {
        let bare = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h);
        let ok = bare.parse::<IpAddr>().is_ok()
            || (!h.is_empty()
                && h.len() <= 253
                && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')));
        if ok {
            allowed_hosts.push(h.to_ascii_lowercase());
        } else {
            c.err(
                path.key("allowed_hosts").index(i),
                format!("`{h}` is not a host name or IP address (without a port)"),
            );
        }
    }
    allowed_hosts
}

/// `[naming] xds`: where the ADS server listens and how many clients it holds.
fn compile_xds(c: &mut Compiler<'_>, path: &FieldPath, x: &RawXds) -> XdsSpec {
    let listen = x.listen.as_deref().unwrap_or(XdsSpec::DEFAULT_LISTEN);
    let listen = c
        .socket_addr(path.key("listen"), listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let max_clients = c.int(
        path.key("max_clients"),
        x.max_clients,
        u64::from(XdsSpec::DEFAULT_MAX_CLIENTS),
        1,
        XdsSpec::MAX_MAX_CLIENTS,
    ) as u32;
    XdsSpec { listen, max_clients }
}

/// A DNS zone name, lower-cased, with its final dot.
pub(super) fn dns_zone(zone: &str) -> Result<String, String> {
    let z = zone.trim_end_matches('.').to_ascii_lowercase();
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if z.is_empty() || z.len() > 253 || !z.split('.').all(ok_label) {
        return Err(format!(
            "`{zone}` is not a DNS zone name (labels of letters, digits and `-`, e.g. `rondo.`)"
        ));
    }
    Ok(format!("{z}."))
}
