//! TLS: handshakes and certificate reloads of TLS listeners, and tries that failed in TLS to a
//! member, also kept by (cluster, member, reason) for the admin API's explain.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use super::Metrics;

/// A row of TLS failures: (cluster, member, reason).
pub(super) type TlsFailureKey = (String, String, &'static str);

/// Most (cluster, member, reason) rows of TLS failures kept for the admin API's explain.
pub const MAX_TLS_FAILURE_ROWS: usize = 10_000;

/// Labels of a TLS listener event (a handshake, a certificate reload) and its result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TlsListenerLabels {
    /// Listener name.
    pub listener: String,
    /// `ok`, `failed` or `timeout` (handshakes); `accepted` or `rejected` (reloads).
    pub result: &'static str,
}

/// Labels of a failure of TLS to a member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TlsMemberLabels {
    /// Cluster name.
    pub cluster: String,
    /// Member name.
    pub member: String,
    /// [`rondo_core::TlsFailure::as_str`].
    pub reason: &'static str,
}

impl Metrics {
    /// Counts a TLS event of `listener` (a handshake or a reload) with `result`.
    pub fn tls_listener(&self, reloads: bool, listener: &str, result: &'static str) {
        let family = if reloads { &self.tls_reloads } else { &self.tls_handshakes };
        family.get_or_create(&TlsListenerLabels { listener: listener.to_owned(), result }).inc();
    }

    /// Counts a try that failed in TLS to `member` of `cluster`.
    pub fn tls_member_failure(&self, cluster: &str, member: &str, why: rondo_core::TlsFailure) {
        let labels = TlsMemberLabels {
            cluster: cluster.to_owned(),
            member: member.to_owned(),
            reason: why.as_str(),
        };
        self.tls_member_failures.get_or_create(&labels).inc();
        self.departed.tls(&labels.cluster, &labels.member, labels.reason);
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut rows = self.tls_failure_rows.lock().unwrap_or_else(|e| e.into_inner());
        let key = (labels.cluster, labels.member, labels.reason);
        let full = rows.len() >= MAX_TLS_FAILURE_ROWS;
        match rows.get_mut(&key) {
            Some(row) => *row = (row.0 + 1, at),
            // A new row past the cap is dropped (the counter above still counts it).
            None if full => {}
            None => {
                rows.insert(key, (1, at));
            }
        }
    }

    /// Drops the TLS failure rows of a member that left ([`Metrics::members_changed`]).
    pub(super) fn forget_tls_rows(&self, cluster: &str, member: &str) {
        let mut rows = self.tls_failure_rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.retain(|(c, m, _), _| c != cluster || m != member);
    }

    /// The TLS failures of `cluster`'s members since the process started, by member and reason:
    /// `(member, reason, count, last at in Unix ms)`, sorted by member and reason.
    pub fn tls_failures_of(&self, cluster: &str) -> Vec<(String, &'static str, u64, u64)> {
        let rows = self.tls_failure_rows.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = rows
            .iter()
            .filter(|((c, _, _), _)| c == cluster)
            .map(|((_, m, r), (n, at))| (m.clone(), *r, *n, *at))
            .collect();
        out.sort();
        out
    }
}

/// Registers the TLS families.
pub(super) fn register(m: &Metrics, r: &mut Registry) {
    r.register(
            "tls_handshakes",
            "TLS handshakes with clients on TLS listeners, by listener and result (ok, failed: not TLS, no common version, a refused client certificate...; timeout)",
            m.tls_handshakes.clone(),
        );
    r.register(
        "tls_reloads",
        "Certificate reloads of TLS listeners (file change or SIGHUP), by listener and result",
        m.tls_reloads.clone(),
    );
    r.register(
        "tls_member_failures",
        "Tries that failed in TLS to a member, by cluster, member and reason",
        m.tls_member_failures.clone(),
    );
}
