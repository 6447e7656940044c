//! The four xDS resources of a cluster, built from the live snapshot: the Listener named after
//! the cluster (an `api_listener` whose HttpConnectionManager takes its routes by RDS, the router
//! filter last), its RouteConfiguration (one route to the cluster, or to an aggregate cluster
//! over its backups, with the retry and hash policies), the Cluster (EDS, its LB policy and
//! outlier detection) and the ClusterLoadAssignment (the members a naming answer lists). The
//! mapping of rondo's policies onto what a proxyless gRPC client runs is tabled in
//! docs/naming.md ("xDS: proxyless gRPC").

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::load_balancing_policies as lbp;
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use envoy_types::util::pack_any;
use rondo_core::{AdminState, Algorithm, ClusterSpec, HashKeySource, XdsLb};
use rondo_runtime::Snapshot;

use crate::answer;

/// The suffix of the aggregate cluster over a cluster and its backups (`:` is not allowed in a
/// cluster's name, so it never meets a configured one).
pub const FAILOVER_SUFFIX: &str = ":failover";

/// Largest ring a gRPC client accepts (`maximum_ring_size`, 8M entries).
const MAX_RING: u64 = 8 * 1024 * 1024;

// `xds = { lb = "orca-wrr" }`: how the client weighs members by their ORCA reports (gRFC A58).
// Reports ride on every answer (`endpoint-load-metrics-bin` trailers), not on an out-of-band
// stream that each member would have to serve (see docs/naming.md for the choices).

/// How long a member reports before its weight counts: 2 s (gRPC's 10 s would keep a member
/// that just joined a loaded cluster at the mean weight for long).
const ORCA_BLACKOUT: Duration = Duration::from_secs(2);
/// How often the client recomputes weights (gRPC's default).
const ORCA_WEIGHT_UPDATE: Duration = Duration::from_secs(1);
/// How long a silent member keeps its weight before it goes back to the mean (gRPC's default).
const ORCA_WEIGHT_EXPIRATION: Duration = Duration::from_secs(180);

/// The filter state key gRPC hashes to keep one channel on one member (gRFC A42).
const CHANNEL_ID: &str = "io.grpc.channel_id";

/// The resource types of the aggregated stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Listener (LDS).
    Listener,
    /// RouteConfiguration (RDS).
    Route,
    /// Cluster (CDS).
    Cluster,
    /// ClusterLoadAssignment (EDS).
    Endpoints,
}

impl Kind {
    /// Every kind, in the order a client asks for them.
    pub const ALL: [Kind; 4] = [Kind::Listener, Kind::Route, Kind::Cluster, Kind::Endpoints];

    /// The kind of a `type_url`.
    pub fn of(type_url: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.type_url() == type_url)
    }

    /// The type URL on the wire.
    pub fn type_url(self) -> &'static str {
        match self {
            Kind::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            Kind::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            Kind::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            Kind::Endpoints => "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        }
    }

    /// The short name in logs and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Listener => "lds",
            Kind::Route => "rds",
            Kind::Cluster => "cds",
            Kind::Endpoints => "eds",
        }
    }
}

/// What a resource depends on about the client: its locality zone (`node.locality.zone` of its
/// bootstrap), which `prefer_local` clusters put first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFacts {
    /// The zone of the client's node locality, if it gave one.
    pub zone: Option<String>,
}

/// The resource of `kind` named `name`, packed, or `None` when the view has no such cluster.
pub fn build(snapshot: &Snapshot, kind: Kind, name: &str, client: &ClientFacts) -> Option<Any> {
    match kind {
        Kind::Listener => listener(snapshot, name).map(pack_any),
        Kind::Route => route_config(snapshot, name).map(pack_any),
        Kind::Cluster => cluster(snapshot, name).map(pack_any),
        Kind::Endpoints => load_assignment(snapshot, name, client).map(pack_any),
    }
}

fn ads() -> core::ConfigSource {
    core::ConfigSource {
        resource_api_version: core::ApiVersion::V3 as i32,
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

fn u32v(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

fn duration(d: Duration) -> Option<envoy_types::pb::google::protobuf::Duration> {
    Some(envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    })
}

/// The Listener gRPC asks for with the target `xds:///NAME`.
fn listener(snapshot: &Snapshot, name: &str) -> Option<listener::Listener> {
    snapshot.view.clusters.get(name)?;
    let router = hcm::HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack_any(Router::default()))),
        ..Default::default()
    };
    let manager = hcm::HttpConnectionManager {
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(hcm::Rds {
            config_source: Some(ads()),
            route_config_name: name.to_owned(),
        })),
        // gRPC requires the router filter, and requires it last.
        http_filters: vec![router],
        ..Default::default()
    };
    Some(listener::Listener {
        name: name.to_owned(),
        api_listener: Some(listener::ApiListener { api_listener: Some(pack_any(manager)) }),
        ..Default::default()
    })
}

/// The backups of `name`: those of the first route whose primary it is (the router tries them
/// in order when the cluster cannot serve).
fn backups<'a>(snapshot: &'a Snapshot, name: &str) -> &'a [String] {
    snapshot
        .view
        .routes
        .iter()
        .find(|r| r.cluster == name && !r.backups.is_empty())
        .map_or(&[], |r| &r.backups)
}

fn route_config(snapshot: &Snapshot, name: &str) -> Option<route::RouteConfiguration> {
    let spec = snapshot.view.clusters.get(name)?;
    let policy = &spec.policy;
    let target = if backups(snapshot, name).is_empty() {
        name.to_owned()
    } else {
        format!("{name}{FAILOVER_SUFFIX}")
    };
    // Attempts are tries in all; gRPC caps them at 5.
    let retry_policy = (policy.retry.attempts > 1).then(|| route::RetryPolicy {
        retry_on: "unavailable".to_owned(),
        num_retries: u32v(policy.retry.attempts - 1),
        ..Default::default()
    });
    let hash_policy = if policy.algorithm == Algorithm::Hash {
        use route::route_action::hash_policy::{FilterState, Header, PolicySpecifier};
        let specifier = match &policy.hash.key {
            HashKeySource::Header(h) => PolicySpecifier::Header(Header {
                header_name: h.to_ascii_lowercase(),
                ..Default::default()
            }),
            // No client address nor cookie on a gRPC client's side: the channel is the key.
            HashKeySource::ClientAddress | HashKeySource::Cookie(_) => {
                PolicySpecifier::FilterState(FilterState { key: CHANNEL_ID.to_owned() })
            }
        };
        vec![route::route_action::HashPolicy {
            policy_specifier: Some(specifier),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    let action = route::RouteAction {
        cluster_specifier: Some(route::route_action::ClusterSpecifier::Cluster(target)),
        retry_policy,
        hash_policy,
        ..Default::default()
    };
    let route = route::Route {
        r#match: Some(route::RouteMatch {
            path_specifier: Some(route::route_match::PathSpecifier::Prefix(String::new())),
            ..Default::default()
        }),
        action: Some(route::route::Action::Route(action)),
        ..Default::default()
    };
    Some(route::RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![route::VirtualHost {
            name: name.to_owned(),
            domains: vec!["*".to_owned()],
            routes: vec![route],
            ..Default::default()
        }],
        ..Default::default()
    })
}

fn cluster(snapshot: &Snapshot, name: &str) -> Option<cluster::Cluster> {
    if let Some(primary) = name.strip_suffix(FAILOVER_SUFFIX) {
        let backups = backups(snapshot, primary);
        if backups.is_empty() {
            return None;
        }
        let mut clusters = vec![primary.to_owned()];
        clusters.extend(backups.iter().cloned());
        let kind = cluster::cluster::CustomClusterType {
            name: "envoy.clusters.aggregate".to_owned(),
            typed_config: Some(pack_any(AggregateConfig { clusters })),
        };
        return Some(cluster::Cluster {
            name: name.to_owned(),
            cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::ClusterType(kind)),
            ..Default::default()
        });
    }
    let spec = snapshot.view.clusters.get(name)?;
    let mut c = cluster::Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: name.to_owned(),
        }),
        outlier_detection: outlier(spec),
        ..Default::default()
    };
    lb_policy(spec, &mut c);
    Some(c)
}

/// The LB policy: the `lb_policy` enum where one says it, else `load_balancing_policy` (gRFC
/// A52: the client takes the first policy of the list it supports).
fn lb_policy(spec: &ClusterSpec, c: &mut cluster::Cluster) {
    use cluster::cluster::LbPolicy;
    let ext = |name: &str, typed_config: Any| cluster::load_balancing_policy::Policy {
        typed_extension_config: Some(core::TypedExtensionConfig {
            name: name.to_owned(),
            typed_config: Some(typed_config),
        }),
    };
    if spec.policy.xds.lb == XdsLb::OrcaWrr {
        // Weighted by the members' own load reports where the client has it (gRFC A58), round
        // robin otherwise, each inside the group localities' weights.
        let orca = lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin {
            enable_oob_load_report: Some(envoy_types::pb::google::protobuf::BoolValue {
                value: false,
            }),
            blackout_period: duration(ORCA_BLACKOUT),
            weight_update_period: duration(ORCA_WEIGHT_UPDATE),
            weight_expiration_period: duration(ORCA_WEIGHT_EXPIRATION),
            ..Default::default()
        };
        let rr = lbp::round_robin::v3::RoundRobin::default();
        let inner = cluster::LoadBalancingPolicy {
            policies: vec![
                ext(
                    "envoy.load_balancing_policies.client_side_weighted_round_robin",
                    pack_any(orca),
                ),
                ext("envoy.load_balancing_policies.round_robin", pack_any(rr)),
            ],
        };
        let wrr = lbp::wrr_locality::v3::WrrLocality { endpoint_picking_policy: Some(inner) };
        c.load_balancing_policy = Some(cluster::LoadBalancingPolicy {
            policies: vec![ext("envoy.load_balancing_policies.wrr_locality", pack_any(wrr))],
        });
        return;
    }
    match spec.policy.algorithm {
        Algorithm::Hash => {
            let members = u64::try_from(spec.members.len()).unwrap_or(u64::MAX).max(1);
            let ring = (u64::from(spec.policy.hash.ring_vnodes) * members).clamp(1, MAX_RING);
            c.lb_policy = LbPolicy::RingHash as i32;
            c.lb_config = Some(cluster::cluster::LbConfig::RingHashLbConfig(
                cluster::cluster::RingHashLbConfig {
                    minimum_ring_size: Some(envoy_types::pb::google::protobuf::UInt64Value {
                        value: ring,
                    }),
                    maximum_ring_size: Some(envoy_types::pb::google::protobuf::UInt64Value {
                        value: MAX_RING,
                    }),
                    ..Default::default()
                },
            ));
        }
        Algorithm::Rotating => {
            // GlassFish's list randomised once per client, failing over down it.
            let first = lbp::pick_first::v3::PickFirst { shuffle_address_list: true };
            c.load_balancing_policy = Some(cluster::LoadBalancingPolicy {
                policies: vec![ext("envoy.load_balancing_policies.pick_first", pack_any(first))],
            });
        }
        Algorithm::LeastSessions | Algorithm::LeastCpu | Algorithm::MostFreeMemory => {
            // Fewest outstanding requests where the client has it, round robin otherwise, each
            // inside the locality weights.
            let least = lbp::least_request::v3::LeastRequest::default();
            let rr = lbp::round_robin::v3::RoundRobin::default();
            let inner = cluster::LoadBalancingPolicy {
                policies: vec![
                    ext("envoy.load_balancing_policies.least_request", pack_any(least)),
                    ext("envoy.load_balancing_policies.round_robin", pack_any(rr)),
                ],
            };
            let wrr = lbp::wrr_locality::v3::WrrLocality { endpoint_picking_policy: Some(inner) };
            c.load_balancing_policy = Some(cluster::LoadBalancingPolicy {
                policies: vec![ext("envoy.load_balancing_policies.wrr_locality", pack_any(wrr))],
            });
        }
        // Round robin over localities weighted per member (see `locality_weight`).
        _ => c.lb_policy = LbPolicy::RoundRobin as i32,
    }
}

/// Consecutive failures become gRPC's failure-percentage ejection (gRFC A50 has no
/// consecutive-failure ejection): a member failing half of at least that many calls in a
/// second is ejected for the cluster's ejection times.
fn outlier(spec: &ClusterSpec) -> Option<cluster::OutlierDetection> {
    let o = &spec.policy.outlier;
    if o.consecutive_failures == 0 {
        return None;
    }
    Some(cluster::OutlierDetection {
        consecutive_5xx: u32v(o.consecutive_failures),
        interval: duration(Duration::from_secs(1)),
        base_ejection_time: duration(o.base_ejection),
        max_ejection_time: duration(o.max_ejection),
        max_ejection_percent: u32v(u32::from(o.max_ejected_percent)),
        enforcing_success_rate: u32v(0),
        failure_percentage_threshold: u32v(50),
        enforcing_failure_percentage: u32v(100),
        failure_percentage_minimum_hosts: u32v(1),
        failure_percentage_request_volume: u32v(o.consecutive_failures),
        ..Default::default()
    })
}

/// Whether the algorithm weighs members: each member is then a locality of its own with its
/// weight as the locality's weight (gRPC balances across localities by weight, at random);
/// otherwise the members of a group share a locality, and the client's policy takes them in
/// turn inside it, as the router does. `least-sessions` shares localities so that the client's
/// least_request chooses among the members (their weights go on the endpoints), and so does
/// `orca-wrr`, whose client weighs the members of a locality by their load reports.
fn weighs_members(spec: &ClusterSpec) -> bool {
    spec.policy.xds.lb == XdsLb::Auto
        && matches!(
            spec.policy.algorithm,
            Algorithm::Weighted
                | Algorithm::Random
                | Algorithm::Hash
                | Algorithm::ResponseTime
                | Algorithm::ResponseTimeClb
                | Algorithm::LeastCpu
                | Algorithm::MostFreeMemory
        )
}

/// The members of a naming answer as endpoints (draining ones as DRAINING), in localities
/// (zone: the member's group; sub-zone: the member's name where the algorithm weighs members,
/// see [`weighs_members`]). `prefer_local` clusters put the localities of the client's zone at
/// priority 0 and the rest at 1, when that zone has members.
fn load_assignment(
    snapshot: &Snapshot,
    name: &str,
    client: &ClientFacts,
) -> Option<endpoint::ClusterLoadAssignment> {
    let spec = snapshot.view.clusters.get(name)?;
    let answer = answer::answer(snapshot, name).ok()?;
    let per_member = weighs_members(spec);
    // An `orca-wrr` client weighs members by their own reports, not by rondo's figures.
    let live = (spec.policy.xds.lb == XdsLb::Auto).then(|| live_weights(snapshot, name)).flatten();
    let local = |group: &Option<String>| group.is_some() && *group == client.zone;
    let split = spec.policy.locality.prefer_local
        && client.zone.is_some()
        && answer.members.iter().any(|m| local(&m.group));
    // Localities in first-seen order: (zone, sub-zone) -> (weight, endpoints).
    let mut localities: Vec<((String, String), u32, Vec<endpoint::LbEndpoint>)> = Vec::new();
    for m in &answer.members {
        let health = if m.state == AdminState::Draining {
            core::HealthStatus::Draining
        } else {
            core::HealthStatus::Healthy
        };
        let lb = endpoint::LbEndpoint {
            host_identifier: Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(
                endpoint::Endpoint { address: Some(address(&m.address)), ..Default::default() },
            )),
            health_status: health as i32,
            load_balancing_weight: (spec.policy.algorithm == Algorithm::LeastSessions)
                .then(|| UInt32Value { value: m.weight.max(1) }),
            ..Default::default()
        };
        let zone = m.group.clone().unwrap_or_default();
        let key = if per_member { (zone, m.name.clone()) } else { (zone, String::new()) };
        // A group's locality weighs as many members as it has: members get even shares.
        let weight = match (&live, per_member) {
            (Some(w), _) => w.get(&m.name).copied().unwrap_or(m.weight).max(1),
            (None, true) => m.weight.max(1),
            (None, false) => 1,
        };
        match localities.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, w, eps)) => {
                *w = w.saturating_add(weight);
                eps.push(lb);
            }
            None => localities.push((key, weight, vec![lb])),
        }
    }
    let endpoints = localities
        .into_iter()
        .map(|((zone, sub_zone), weight, lb_endpoints)| {
            let group = (!zone.is_empty()).then(|| zone.clone());
            endpoint::LocalityLbEndpoints {
                priority: u32::from(split && !local(&group)),
                locality: Some(core::Locality { region: String::new(), zone, sub_zone }),
                lb_endpoints,
                load_balancing_weight: u32v(weight),
                ..Default::default()
            }
        })
        .collect();
    Some(endpoint::ClusterLoadAssignment {
        cluster_name: name.to_owned(),
        endpoints,
        ..Default::default()
    })
}

/// The weights of algorithms that follow measured load, recomputed from the member state
/// whenever the assignment is built (the streams rebuild it every few seconds): `least-cpu`
/// 1 − CPU use, `most-free-memory` free memory, from fresh agent reports (`agent.timeout_ms`);
/// `response-time` and `response-time-clb` the inverse of the latest probe round trip. The
/// best member gets 100, the others their share of it (at least 1); a member without a
/// figure gets its configured weight. `None` for other algorithms, or when no member has a
/// figure.
fn live_weights(snapshot: &Snapshot, name: &str) -> Option<HashMap<String, u32>> {
    let rt = snapshot.clusters.get(name)?;
    let policy = &rt.spec.policy;
    let now = rondo_runtime::clock::now();
    let score = |load: &rondo_core::load::Load| -> Option<f64> {
        let fresh = load.agent.filter(|r| now.since(r.at) <= policy.agent.timeout);
        match policy.algorithm {
            Algorithm::LeastCpu => fresh.map(|r| (1.0 - f64::from(r.cpu_used)).max(0.01)),
            Algorithm::MostFreeMemory => fresh.map(|r| r.mem_free as f64),
            Algorithm::ResponseTime | Algorithm::ResponseTimeClb => {
                load.probe_rtt.map(|rtt| 1.0 / rtt.as_secs_f64().max(1e-6))
            }
            _ => None,
        }
    };
    let scores: Vec<(String, f64)> = rt.with(|b| {
        b.spec()
            .members
            .iter()
            .zip(b.states())
            .filter_map(|(m, s)| Some((m.name.clone(), score(&s.load)?)))
            .collect()
    });
    let best = scores.iter().map(|(_, s)| *s).fold(0.0, f64::max);
    if best <= 0.0 {
        return None;
    }
    Some(
        scores
            .into_iter()
            .map(|(n, s)| (n, ((100.0 * s / best).round() as u32).clamp(1, 100)))
            .collect(),
    )
}

/// A member's `host:port` as a socket address. A host name is passed as it is: gRPC clients
/// take IP addresses only and reject (NACK) the assignment, keeping their last good one.
fn address(host_port: &str) -> core::Address {
    let (host, port) = match host_port.parse::<std::net::SocketAddr>() {
        Ok(a) => (a.ip().to_string(), u32::from(a.port())),
        Err(_) => {
            let (h, p) = host_port.rsplit_once(':').unwrap_or((host_port, "0"));
            (h.to_owned(), p.parse().unwrap_or(0))
        }
    };
    core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: host,
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_their_type_urls() {
        for k in Kind::ALL {
            assert_eq!(Kind::of(k.type_url()), Some(k));
        }
        assert_eq!(Kind::of("type.googleapis.com/envoy.config.core.v3.Node"), None);
    }

    #[test]
    fn addresses_keep_ip_and_port_and_pass_host_names_as_they_are() {
        let socket = |a: core::Address| match a.address {
            Some(core::address::Address::SocketAddress(s)) => match s.port_specifier {
                Some(core::socket_address::PortSpecifier::PortValue(p)) => (s.address, p),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        assert_eq!(socket(address("127.0.0.1:8001")), ("127.0.0.1".to_owned(), 8001));
        assert_eq!(socket(address("[::1]:8002")), ("::1".to_owned(), 8002));
        assert_eq!(socket(address("localhost:9")), ("localhost".to_owned(), 9));
    }
}
