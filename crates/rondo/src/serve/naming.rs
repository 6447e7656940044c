//! `rondo serve`'s naming service part (`[naming]`): the registry, its HTTP API, DNS answers
//! and the xDS server, started together and stopped when dropped.

use std::io::Write;

use anyhow::Context;

/// What the naming service runs; dropping it stops all of it.
#[derive(Debug)]
pub(super) struct Naming {
    registry: rondo_naming::Registry,
    _api: rondo_naming::api::NamingServer,
    #[cfg(feature = "dns")]
    _dns: Option<rondo_naming::dns::DnsServer>,
    #[cfg(feature = "xds")]
    _xds: Option<rondo_naming::xds::XdsServer>,
}

impl Naming {
    /// Stops the registry for a hitless upgrade's hand-off (its writer ends, so the new process
    /// can open the files).
    pub(super) fn release(&self) {
        if !self.registry.release(std::time::Duration::from_secs(2)) {
            tracing::warn!("upgrade: the registry's writer did not end within 2 s");
        }
        // xDS clients reconnect, to the new process (their streams would otherwise stay here).
        #[cfg(feature = "xds")]
        if let Some(x) = &self._xds {
            x.stop();
        }
    }
}

impl Drop for Naming {
    fn drop(&mut self) {
        self.registry.stop();
    }
}

/// The error of a setting (`what`) this build cannot serve: it lacks cargo feature `feature`
/// (`rondo check` refuses the same setting first, naming the feature).
#[cfg(not(all(feature = "dns", feature = "xds")))]
fn without_feature(what: &str, feature: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what}: this rondo was built without the `{feature}` feature (cargo build --features {feature})"
    )
}

pub(super) async fn start_naming(
    spec: &rondo_config::NamingSpec,
    parts: rondo_naming::NamingParts,
    own: Vec<rondo_naming::api::OwnAddress>,
    out: &mut dyn Write,
) -> anyhow::Result<Naming> {
    let limits = rondo_naming::Limits::of(spec);
    parts.registrations.allow_declared(spec.allow_registered_clusters);
    let registry = rondo_naming::start_registry_with(&spec.registry, limits, &parts)
        .map_err(|e| anyhow::anyhow!("naming registry: {e}"))?;
    let token = match &spec.token {
        Some(t) => Some(rondo_runtime::secret::read_token(t).context("[naming] token")?),
        None => None,
    };
    let opts = rondo_naming::api::ApiOptions {
        token,
        allowed_hosts: spec.allowed_hosts.clone(),
        own,
        tls: spec.tls.clone(),
        allow_registered_clusters: spec.allow_registered_clusters,
        parent: spec.parent.clone(),
    };
    let api = rondo_naming::api::start_with(spec.listen, &parts, registry.clone(), opts)
        .await
        .with_context(|| format!("naming API on {}", spec.listen))?;
    writeln!(out, "rondo: naming API (registry {}) on {}", registry.status().backend, api.addr)?;
    #[cfg(feature = "dns")]
    let dns = match &spec.dns {
        Some(d) => {
            let server = rondo_naming::dns::start(d.listen, &d.zone, &parts)
                .await
                .with_context(|| format!("naming DNS on {}", d.listen))?;
            writeln!(out, "rondo: naming DNS (udp and tcp, zone {}) on {}", d.zone, server.addr)?;
            Some(server)
        }
        None => None,
    };
    #[cfg(not(feature = "dns"))]
    if spec.dns.is_some() {
        return Err(without_feature("[naming] dns_listen", "dns"));
    }
    #[cfg(feature = "xds")]
    let xds = match &spec.xds {
        Some(x) => {
            let server = rondo_naming::xds::start(x.listen, &parts, x.max_clients as usize)
                .await
                .with_context(|| format!("naming xDS on {}", x.listen))?;
            writeln!(out, "rondo: naming xDS (ADS) on {}", server.addr)?;
            Some(server)
        }
        None => None,
    };
    #[cfg(not(feature = "xds"))]
    if spec.xds.is_some() {
        return Err(without_feature("[naming] xds", "xds"));
    }
    Ok(Naming {
        registry,
        _api: api,
        #[cfg(feature = "dns")]
        _dns: dns,
        #[cfg(feature = "xds")]
        _xds: xds,
    })
}
