//! The naming service's registry (connection, resynchronisations, registrations, the embedded
//! registry's writes) and the messages of load agents.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Labels of a message from a load agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AgentLabels {
    /// `heartbeat` (UDP) or `hello` (TCP).
    pub kind: &'static str,
    /// What became of it: for heartbeats `accepted`, `bad_mac`, `truncated`, `bad_version`,
    /// `malformed`, `replayed` or `unknown_member`; for hellos `accepted` or `refused`.
    pub result: &'static str,
}

impl Metrics {
    /// The counter of agent messages of `kind` with `result` (shown from zero on once asked
    /// for; a clone counts into the same metric).
    pub fn agent_counter(&self, kind: &'static str, result: &'static str) -> Counter {
        self.agent_messages.get_or_create(&AgentLabels { kind, result }).clone()
    }
}

/// Registers the registry and agent families.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
            "registry_connected",
            "1 while the naming registry backend is reachable, 0 while serving the last view without it",
            m.registry_connected.clone(),
        );
    r.register(
        "tier_routers",
        "Routers of the tier present in the etcd registry, this one included (1 without one)",
        m.tier_routers.clone(),
    );
    r.register(
        "tier_load_routers",
        "Other routers of the tier whose load reports this one counts ([tier])",
        m.tier_load_routers.clone(),
    );
    r.register(
        "registry_resyncs",
        "Full resynchronisations with the naming registry (start, reconnect, compacted watch)",
        m.registry_resyncs.clone(),
    );
    r.register(
        "registry_registrations",
        "Members registered with the naming service",
        m.registrations.clone(),
    );
    r.register(
        "registry_bytes_written",
        "Bytes the embedded naming registry wrote (log appends and snapshots)",
        m.registry_bytes_written.clone(),
    );
    r.register(
        "registry_compactions",
        "Snapshots the embedded naming registry wrote to fold its log",
        m.registry_compactions.clone(),
    );
    r.register(
        "agent_messages",
        "Messages from load agents received, by kind (heartbeat, hello) and result",
        m.agent_messages.clone(),
    );
}
