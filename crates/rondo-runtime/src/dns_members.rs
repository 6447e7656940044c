//! Members discovered through DNS (`[cluster.NAME] members_dns`): one task per such cluster
//! asks hickory's resolver for the name's A and AAAA records (or the SRV records and their
//! targets' addresses), makes each address a member named `IP:PORT`, and swaps a changed answer
//! into its cluster with [`Registrations::update_dns`](crate::Registrations::update_dns), the registry's partial rebuild, so surviving
//! members keep their health, load and sessions. It asks again when the answer's TTL runs out,
//! within [`MembersDnsSpec::MIN_REFRESH`] and the cluster's `refresh`. A failed resolution keeps
//! the last answer, is logged once per streak of failures and counted
//! (`rondo_dns_resolutions_total`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use rondo_config::{DnsQuery, MembersDnsSpec};
use rondo_core::MemberSpec;

use crate::live::Registrations;
use crate::metrics::Metrics;

/// How long a failed resolution waits before asking again, at most (a shorter `refresh` asks
/// sooner).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// How long one question may take (each of an SRV answer's targets is one more).
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// The resolver tasks of the clusters with `members_dns`, by cluster. Dropping it stops them.
#[derive(Debug, Default)]
pub struct DnsMembers {
    tasks: Mutex<HashMap<String, (MembersDnsSpec, tokio::task::AbortHandle)>>,
}

impl Drop for DnsMembers {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, (_, task)) in tasks.drain() {
            task.abort();
        }
    }
}

impl DnsMembers {
    /// Makes the running tasks those of `specs` (the config just applied; must run inside a
    /// tokio runtime): a cluster whose `members_dns` is unchanged keeps its task and its
    /// members; a changed one is asked again at once (its last members stay until the answer);
    /// a cluster without it any more loses its members from DNS and their series.
    pub fn apply(
        &self,
        registrations: &Registrations,
        metrics: &Arc<Metrics>,
        specs: &BTreeMap<String, MembersDnsSpec>,
    ) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|cluster, (spec, task)| {
            let keep = specs.get(cluster) == Some(spec);
            if !keep {
                task.abort();
                if !specs.contains_key(cluster) {
                    let (_, built) = registrations.update_dns(cluster, Vec::new());
                    crate::probe::spawn_clusters(&built);
                    metrics.dns_forget(cluster);
                }
            }
            keep
        });
        for (cluster, spec) in specs {
            if tasks.contains_key(cluster) {
                continue;
            }
            let (regs, metrics) = (registrations.clone(), metrics.clone());
            let task = tokio::spawn(run(regs, metrics, cluster.clone(), spec.clone()));
            tasks.insert(cluster.clone(), (spec.clone(), task.abort_handle()));
        }
    }
}

/// One cluster's resolution loop, until the task is aborted (the [`DnsMembers`] dropped or the
/// cluster's `members_dns` changed).
async fn run(
    registrations: Registrations,
    metrics: Arc<Metrics>,
    cluster: String,
    spec: MembersDnsSpec,
) {
    let asked = match &spec.query {
        DnsQuery::Address { name, .. } | DnsQuery::Srv { name } => name.clone(),
    };
    let mut resolver: Option<TokioResolver> = None;
    // Whether the last resolution failed: only the first failure of a streak is logged.
    let mut failing = false;
    let mut last: Option<Vec<MemberSpec>> = None;
    // Whether the last answer was cut to `max_members`: logged when that starts.
    let mut cut = false;
    loop {
        let answer = match &resolver {
            Some(r) => resolve(r, &spec).await,
            None => match build_resolver(spec.resolver) {
                Ok(r) => resolve(resolver.insert(r), &spec).await,
                Err(e) => Err(format!("cannot set up the resolver: {e}")),
            },
        };
        let wait = match answer {
            Ok(Answer { mut members, valid_for }) => {
                metrics.dns_resolved(&cluster, true);
                if failing {
                    tracing::info!(cluster, name = asked, "members_dns resolves again");
                    failing = false;
                }
                let over = members.len() > spec.max_members as usize;
                if over && !cut {
                    tracing::warn!(
                        cluster,
                        name = asked,
                        answered = members.len(),
                        kept = spec.max_members,
                        "members_dns answer has more addresses than max_members: the rest are \
                         left out"
                    );
                }
                cut = over;
                members.truncate(spec.max_members as usize);
                if last.as_ref() != Some(&members) {
                    tracing::info!(
                        cluster,
                        name = asked,
                        members = members.len(),
                        "members from dns"
                    );
                    metrics.dns_members(&cluster, members.len());
                    let (_, built) = registrations.update_dns(&cluster, members.clone());
                    crate::probe::spawn_clusters(&built);
                    last = Some(members);
                }
                valid_for.clamp(MembersDnsSpec::MIN_REFRESH, spec.refresh)
            }
            Err(e) => {
                metrics.dns_resolved(&cluster, false);
                if !failing {
                    let kept = last.as_ref().map_or(0, Vec::len);
                    tracing::warn!(
                        cluster,
                        name = asked,
                        kept,
                        "members_dns resolution failed, the last answer stays: {e}"
                    );
                    failing = true;
                }
                spec.refresh.min(RETRY_AFTER_FAILURE)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// A resolver asking `server` (UDP, then TCP for a truncated answer), else the system's
/// (`/etc/resolv.conf`). It caches nothing: each loop asks the server, and the TTL it answers
/// is what the loop waits for.
fn build_resolver(server: Option<SocketAddr>) -> Result<TokioResolver, NetError> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = match server {
        Some(addr) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = addr.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = addr.port();
            let ns = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![ns]),
                provider,
            )
        }
        None => TokioResolver::builder(provider)?,
    };
    let opts = builder.options_mut();
    opts.timeout = QUERY_TIMEOUT;
    opts.attempts = 2;
    opts.cache_size = 0;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    builder.build()
}

/// The members an answer gives, in name order without repeats, and how long it is valid.
struct Answer {
    members: Vec<MemberSpec>,
    valid_for: Duration,
}

/// Asks `spec`'s question. A name with no records (NXDOMAIN, or no A, AAAA or SRV record) is an
/// answer with no members, as Envoy's `STRICT_DNS` takes it; any other failure is an error.
async fn resolve(resolver: &TokioResolver, spec: &MembersDnsSpec) -> Result<Answer, String> {
    match &spec.query {
        DnsQuery::Address { name, port } => {
            let (ips, valid_for) = addresses(resolver, name, spec.refresh).await?;
            let members = ips.into_iter().map(|ip| member(ip, *port, 100)).collect();
            Ok(Answer { members: dedup(members), valid_for })
        }
        DnsQuery::Srv { name } => srv(resolver, name, spec).await,
    }
}

/// The addresses of `name` and how long they are valid (`empty_for` when it has none).
async fn addresses(
    resolver: &TokioResolver,
    name: &str,
    empty_for: Duration,
) -> Result<(BTreeSet<IpAddr>, Duration), String> {
    match resolver.lookup_ip(name).await {
        Ok(lookup) => {
            let valid_for = lookup.valid_until().saturating_duration_since(Instant::now());
            Ok((lookup.iter().collect(), valid_for))
        }
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok((BTreeSet::new(), empty_for)),
        Err(e) => Err(format!("looking up `{name}`: {e}")),
    }
}

/// SRV records of `name`: the lowest priority's targets, each address a member on the record's
/// port with its weight (at least 1). A target's addresses come from the answer's additional
/// records when it has them, else from a lookup of their own.
async fn srv(
    resolver: &TokioResolver,
    name: &str,
    spec: &MembersDnsSpec,
) -> Result<Answer, String> {
    let lookup = match resolver.srv_lookup(name).await {
        Ok(l) => l,
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => {
            return Ok(Answer { members: Vec::new(), valid_for: spec.refresh });
        }
        Err(e) => return Err(format!("looking up SRV `{name}`: {e}")),
    };
    let mut valid_for = lookup.valid_until().saturating_duration_since(Instant::now());
    let records: Vec<_> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let Some(lowest) = records.iter().map(|s| s.priority).min() else {
        return Ok(Answer { members: Vec::new(), valid_for });
    };
    // Addresses the server sent along, by target name.
    let mut known: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for r in lookup.additionals() {
        let ip = match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        known.entry(r.name.to_ascii().to_ascii_lowercase()).or_default().insert(ip);
    }
    let mut members = Vec::new();
    // Bounded: no more targets than members may come from one answer.
    for s in records.iter().filter(|s| s.priority == lowest).take(spec.max_members as usize) {
        let target = s.target.to_ascii().to_ascii_lowercase();
        let ips = match known.get(&target) {
            Some(ips) => ips.clone(),
            None => {
                let (ips, for_target) = addresses(resolver, &target, spec.refresh).await?;
                valid_for = valid_for.min(for_target);
                ips
            }
        };
        let weight = u32::from(s.weight.max(1));
        members.extend(ips.into_iter().map(|ip| member(ip, s.port, weight)));
    }
    Ok(Answer { members: dedup(members), valid_for })
}

/// A member at `ip:port`, named by its address.
fn member(ip: IpAddr, port: u16, weight: u32) -> MemberSpec {
    let address = SocketAddr::new(ip, port).to_string();
    MemberSpec { name: address.clone(), address, weight, group: None, admin: Default::default() }
}

/// Members in name order, the first of a repeated name kept (two SRV records naming one
/// address and port).
fn dedup(mut members: Vec<MemberSpec>) -> Vec<MemberSpec> {
    members.sort_by(|a, b| a.name.cmp(&b.name));
    members.dedup_by(|b, a| a.name == b.name);
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_named_by_address_and_in_order_once() {
        let v6: IpAddr = "::1".parse().unwrap();
        let v4: IpAddr = "10.0.0.7".parse().unwrap();
        let got = dedup(vec![member(v6, 80, 1), member(v4, 8080, 5), member(v4, 8080, 9)]);
        let names: Vec<_> = got.iter().map(|m| (m.name.as_str(), m.weight)).collect();
        assert_eq!(names, [("10.0.0.7:8080", 5), ("[::1]:80", 1)]);
        assert_eq!(got[1].address, "[::1]:80");
    }
}
