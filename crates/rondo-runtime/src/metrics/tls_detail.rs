//! What TLS listeners negotiate and staple: successful handshakes by protocol version and key
//! exchange group (`rondo_tls_key_exchanges_total`, which shows whether browsers get the hybrid
//! post-quantum group X25519MLKEM768 of an `aws-lc` build), and OCSP responses fetched for
//! stapling by result (`rondo_tls_ocsp_fetches_total`). Every label value is a static string
//! from a short list, so the series are bounded by the listeners.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of a successful handshake.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TlsKxLabels {
    /// Listener name.
    pub listener: String,
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: &'static str,
    /// The key exchange group (`X25519MLKEM768`, `X25519`, `secp256r1`, ...: `group_name`).
    pub group: &'static str,
}

/// Labels of an OCSP fetch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OcspLabels {
    /// Listener name.
    pub listener: String,
    /// `ok` (a good response stapled) or `failed` (the last good one stays).
    pub result: &'static str,
}

/// The families of this file (one field of [`super::Metrics`]).
#[derive(Debug, Default)]
pub struct TlsDetail {
    /// Successful handshakes by listener, version and group.
    pub key_exchanges: Family<TlsKxLabels, Counter>,
    /// OCSP fetches by listener and result.
    pub ocsp_fetches: Family<OcspLabels, Counter>,
}

/// The label of a protocol version.
pub fn version_name(v: Option<rustls::ProtocolVersion>) -> &'static str {
    match v {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        Some(_) => "other",
        None => "none",
    }
}

/// The label of a key exchange group: its IANA name, `none` when the handshake used none (a
/// resumed TLS 1.2 session), `other` for a group outside the providers' lists.
pub fn group_name(g: Option<rustls::NamedGroup>) -> &'static str {
    use rustls::NamedGroup as G;
    match g {
        Some(G::X25519MLKEM768) => "X25519MLKEM768",
        Some(G::secp256r1MLKEM768) => "SecP256r1MLKEM768",
        Some(G::MLKEM768) => "MLKEM768",
        Some(G::X25519) => "X25519",
        Some(G::secp256r1) => "secp256r1",
        Some(G::secp384r1) => "secp384r1",
        Some(G::secp521r1) => "secp521r1",
        Some(_) => "other",
        None => "none",
    }
}

impl TlsDetail {
    /// Counts a finished handshake of `listener`.
    pub fn handshake(&self, listener: &str, conn: &rustls::ServerConnection) {
        let labels = TlsKxLabels {
            listener: listener.to_owned(),
            version: version_name(conn.protocol_version()),
            group: group_name(conn.negotiated_key_exchange_group().map(|g| g.name())),
        };
        self.key_exchanges.get_or_create(&labels).inc();
    }

    /// Counts an OCSP fetch of `listener`.
    pub fn ocsp_fetch(&self, listener: &str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.ocsp_fetches
            .get_or_create(&OcspLabels { listener: listener.to_owned(), result })
            .inc();
    }

    /// Registers the families.
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "tls_key_exchanges",
            "Successful TLS handshakes with clients, by listener, protocol version and key exchange group (X25519MLKEM768: hybrid post-quantum)",
            self.key_exchanges.clone(),
        );
        r.register(
            "tls_ocsp_fetches",
            "OCSP responses fetched for stapling (ocsp = \"fetch\"), by listener and result; on failure the last good response stays",
            self.ocsp_fetches.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_the_groups_and_versions() {
        assert_eq!(group_name(Some(rustls::NamedGroup::X25519MLKEM768)), "X25519MLKEM768");
        assert_eq!(group_name(Some(rustls::NamedGroup::X25519)), "X25519");
        assert_eq!(group_name(Some(rustls::NamedGroup::FFDHE2048)), "other");
        assert_eq!(group_name(None), "none");
        assert_eq!(version_name(Some(rustls::ProtocolVersion::TLSv1_2)), "TLSv1.2");
        assert_eq!(version_name(Some(rustls::ProtocolVersion::SSLv3)), "other");
    }
}
