//! OCSP stapling's pure part: where a certificate's staple comes from ([`OcspSource`], the
//! `ocsp` field of a `tls.certs` entry), checking a DER OCSP response against the certificate
//! it is for ([`check_response`]: successful, about this certificate's serial number, `good`,
//! current), the responder a certificate names ([`responder_url`], its authorityInfoAccess) and
//! the request to send it ([`request`]). `rondo check` and the router at start and at reload
//! check a response file with the same function as the router's fetcher
//! (`rondo_runtime::tls::ocsp_fetch`) checks what a responder answers, so a staple that would be
//! refused is never sent. The response's signature is not verified here: the client checks it
//! against the issuer, and a staple is only as good as the responder that signed it.

use std::path::{Path, PathBuf};

use der::{Decode, Encode};
use x509_ocsp::{
    BasicOcspResponse, CertId, CertStatus, OcspRequest, OcspResponse, OcspResponseStatus, Request,
    TbsRequest, Version,
};

/// Where a certificate's OCSP staple comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OcspSource {
    /// A DER OCSP response in this file, read at load and at every reload.
    File(PathBuf),
    /// Fetched from the certificate's OCSP responder and refreshed before it expires.
    Fetch,
}

/// A checked OCSP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staple {
    /// The response as the client gets it.
    pub der: Vec<u8>,
    /// Its `thisUpdate`, seconds since the Unix epoch.
    pub this_update: i64,
    /// Its `nextUpdate`, when it has one.
    pub next_update: Option<i64>,
}

/// How far a response's `thisUpdate` may lie in the future (clocks differ).
const SKEW: i64 = 300;

/// `id-pkix-ocsp-basic`, the one response type there is (RFC 6960 §4.2.1).
const OCSP_BASIC: der::asn1::ObjectIdentifier =
    der::asn1::ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.1.1");
/// SHA-1, the CertID hash every responder answers (RFC 5019 §2.1.1).
const SHA1: der::asn1::ObjectIdentifier = der::asn1::ObjectIdentifier::new_unwrap("1.3.14.3.2.26");
/// SHA-256, which some responders take as well.
const SHA256: der::asn1::ObjectIdentifier =
    der::asn1::ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");

fn unix(t: &x509_ocsp::OcspGeneralizedTime) -> i64 {
    t.0.to_unix_duration().as_secs() as i64
}

fn date(t: i64) -> String {
    x509_parser::time::ASN1Time::from_timestamp(t).map_or_else(|_| t.to_string(), |t| t.to_string())
}

/// Checks that `der` is a successful OCSP response saying the certificate `leaf` (DER), issued
/// by `issuer` when known, is good at `now` (seconds since the Unix epoch); the error says what
/// is wrong.
pub fn check_response(
    der: &[u8],
    leaf: &[u8],
    issuer: Option<&[u8]>,
    now: i64,
) -> Result<Staple, String> {
    let response =
        OcspResponse::from_der(der).map_err(|e| format!("not a DER OCSP response: {e}"))?;
    if response.response_status != OcspResponseStatus::Successful {
        return Err(format!("the responder answered {:?}", response.response_status));
    }
    let bytes = response.response_bytes.ok_or("a successful OCSP response without a body")?;
    if bytes.response_type != OCSP_BASIC {
        return Err(format!("unknown OCSP response type {}", bytes.response_type));
    }
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes())
        .map_err(|e| format!("not a basic OCSP response: {e}"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("not a valid X.509 certificate: {e}"))?;
    let serial = cert.raw_serial();
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| r.cert_id.serial_number.as_bytes() == serial)
        .ok_or_else(|| {
            format!(
                "the OCSP response is not about this certificate (serial {})",
                cert.raw_serial_as_string()
            )
        })?;
    if let Some(issuer) = issuer
        && !same_issuer_key(&single.cert_id, issuer)?
    {
        return Err("the OCSP response is about a certificate of another issuer".to_owned());
    }
    match &single.cert_status {
        CertStatus::Good(_) => {}
        CertStatus::Revoked(r) => {
            return Err(format!(
                "the OCSP response says the certificate was revoked on {}",
                date(unix(&r.revocation_time))
            ));
        }
        CertStatus::Unknown(_) => {
            return Err("the OCSP response says the certificate is unknown to the responder".into());
        }
    }
    let this_update = unix(&single.this_update);
    let next_update = single.next_update.as_ref().map(unix);
    if this_update > now + SKEW {
        return Err(format!("the OCSP response is not valid before {}", date(this_update)));
    }
    if let Some(next) = next_update
        && next <= now
    {
        return Err(format!("the OCSP response expired on {}", date(next)));
    }
    Ok(Staple { der: der.to_vec(), this_update, next_update })
}

/// Whether `id` names `issuer`'s key (SHA-1 or SHA-256 CertIDs; another hash is not checked).
fn same_issuer_key(id: &CertId, issuer: &[u8]) -> Result<bool, String> {
    let (_, issuer) = x509_parser::parse_x509_certificate(issuer)
        .map_err(|e| format!("issuer: not a valid X.509 certificate: {e}"))?;
    let alg = if id.hash_algorithm.oid == SHA1 {
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY
    } else if id.hash_algorithm.oid == SHA256 {
        &ring::digest::SHA256
    } else {
        return Ok(true);
    };
    let key = ring::digest::digest(alg, &issuer.public_key().subject_public_key.data);
    Ok(key.as_ref() == id.issuer_key_hash.as_bytes())
}

/// Reads and checks the response file `path` for the certificate `leaf` of `issuer`.
pub fn load_file(
    path: &Path,
    leaf: &[u8],
    issuer: Option<&[u8]>,
    now: i64,
) -> Result<Staple, String> {
    let der = std::fs::read(path)
        .map_err(|e| format!("cannot read ocsp file {}: {e}", path.display()))?;
    check_response(&der, leaf, issuer, now)
        .map_err(|e| format!("ocsp file {}: {e}", path.display()))
}

/// The `http://` URL of the OCSP responder the certificate `leaf` names in its
/// authorityInfoAccess.
pub fn responder_url(leaf: &[u8]) -> Result<String, String> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("not a valid X.509 certificate: {e}"))?;
    for ext in cert.extensions() {
        if let ParsedExtension::AuthorityInfoAccess(aia) = ext.parsed_extension() {
            for d in &aia.accessdescs {
                if d.access_method == x509_parser::oid_registry::OID_PKIX_ACCESS_DESCRIPTOR_OCSP
                    && let GeneralName::URI(u) = &d.access_location
                    && u.starts_with("http://")
                {
                    return Ok((*u).to_owned());
                }
            }
        }
    }
    Err("the certificate names no http:// OCSP responder (authorityInfoAccess)".to_owned())
}

/// The DER OCSP request for `leaf`, issued by `issuer` (both DER): one SHA-1 CertID, no nonce
/// (RFC 5019, as responders and their caches expect).
pub fn request(leaf: &[u8], issuer: &[u8]) -> Result<Vec<u8>, String> {
    let parse = |der| {
        x509_parser::parse_x509_certificate(der)
            .map(|(_, c)| c)
            .map_err(|e| format!("not a valid X.509 certificate: {e}"))
    };
    let (cert, issuer) = (parse(leaf)?, parse(issuer)?);
    let sha1 = |b: &[u8]| {
        let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, b);
        der::asn1::OctetString::new(d.as_ref()).map_err(|e| e.to_string())
    };
    let cert_id = CertId {
        hash_algorithm: spki::AlgorithmIdentifierOwned {
            oid: SHA1,
            parameters: Some(der::asn1::Null.into()),
        },
        issuer_name_hash: sha1(issuer.subject().as_raw())?,
        issuer_key_hash: sha1(&issuer.public_key().subject_public_key.data)?,
        serial_number: x509_cert::serial_number::SerialNumber::new(cert.raw_serial())
            .map_err(|e| format!("serial number: {e}"))?,
    };
    let request = OcspRequest {
        tbs_request: TbsRequest {
            version: Version::V1,
            requestor_name: None,
            request_list: vec![Request { req_cert: cert_id, single_request_extensions: None }],
            request_extensions: None,
        },
        optional_signature: None,
    };
    request.to_der().map_err(|e| format!("encoding the OCSP request: {e}"))
}

/// When to fetch again a response fetched at `now`: half way from its `thisUpdate` to its
/// `nextUpdate` (RFC 5019's advice to refresh well before expiry), at least a minute from now;
/// an hour from now for a response without `nextUpdate`.
pub fn refresh_at(staple: &Staple, now: i64) -> i64 {
    let half = staple
        .next_update
        .map_or(now + 3600, |n| staple.this_update + (n - staple.this_update).max(0) / 2);
    half.max(now + 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_not_a_response() {
        let e = check_response(b"not der", b"", None, 0).unwrap_err();
        assert!(e.starts_with("not a DER OCSP response"), "{e}");
    }

    #[test]
    fn refreshes_half_way_and_never_sooner_than_a_minute() {
        let s = |this, next| Staple { der: vec![], this_update: this, next_update: next };
        assert_eq!(refresh_at(&s(1000, Some(1000 + 7200)), 1000), 1000 + 3600);
        assert_eq!(refresh_at(&s(1000, Some(1010)), 1000), 1060);
        assert_eq!(refresh_at(&s(1000, None), 2000), 5600);
    }
}
