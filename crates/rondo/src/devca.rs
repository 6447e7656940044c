//! `rondo tls dev-ca DIR --name NAME...`: a development certificate authority and certificates
//! signed by it, for trying TLS locally (listeners, client certificates). DEVELOPMENT ONLY: the
//! CA's private key sits unprotected next to the certificates, and anyone who trusts `ca.pem`
//! trusts whatever that key signs. ECDSA P-256 keys, made with rcgen on ring.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// What the development CA signs.
#[derive(Debug, Clone)]
pub struct DevCa {
    /// Server names (DNS names, `*.` wildcards or IP addresses): one certificate each.
    pub names: Vec<String>,
    /// Client certificate subjects (common names): one client certificate each.
    pub clients: Vec<String>,
    /// Days every certificate is valid from today.
    pub days: u32,
}

/// Valid from yesterday (UTC, for clocks a little behind) to `days` days from today.
fn set_validity(p: &mut CertificateParams, days: u32) {
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        .div_euclid(86_400);
    let (y, m, d) = civil_from_days(today - 1);
    p.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = civil_from_days(today + i64::from(days));
    p.not_after = rcgen::date_time_ymd(y, m, d);
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i32, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    ((if m <= 2 { y + 1 } else { y }) as i32, m, d)
}

/// The file stem for a name: `*.example.test` becomes `wildcard.example.test`.
fn stem(name: &str) -> String {
    name.replace("*.", "wildcard.").replace(['/', '\\', ':'], "_")
}

pub(crate) fn write_new(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut f = opts.open(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Writes `ca.pem` and `ca.key`, then `NAME.pem`/`NAME.key` per server name and
/// `client-NAME.pem`/`client-NAME.key` per client into `dir` (created if missing). Refuses to
/// overwrite any file. Returns the files written.
pub fn write(dir: &Path, what: &DevCa) -> anyhow::Result<Vec<PathBuf>> {
    if what.names.is_empty() && what.clients.is_empty() {
        bail!("give at least one --name or --client");
    }
    if what.days == 0 {
        bail!("--days must be greater than 0");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut planned = vec![dir.join("ca.pem"), dir.join("ca.key")];
    for n in &what.names {
        planned.push(dir.join(format!("{}.pem", stem(n))));
        planned.push(dir.join(format!("{}.key", stem(n))));
    }
    for c in &what.clients {
        planned.push(dir.join(format!("client-{}.pem", stem(c))));
        planned.push(dir.join(format!("client-{}.key", stem(c))));
    }
    if let Some(p) = planned.iter().find(|p| p.exists()) {
        bail!("{} already exists; rondo tls dev-ca never overwrites files", p.display());
    }

    let ca_key = KeyPair::generate().context("cannot generate the CA key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, "rondo development CA (not for production)");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut ca, what.days);
    let ca_cert = ca.self_signed(&ca_key).context("cannot sign the CA certificate")?;
    write_new(&planned[0], &ca_cert.pem(), false)?;
    write_new(&planned[1], &ca_key.serialize_pem(), true)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut written = planned[..2].to_vec();
    let leaves =
        what.names.iter().map(|n| (n, false)).chain(what.clients.iter().map(|c| (c, true)));
    for (i, (name, client)) in leaves.enumerate() {
        let key = KeyPair::generate().context("cannot generate a key")?;
        let mut p = if client {
            CertificateParams::new(Vec::<String>::new())?
        } else {
            CertificateParams::new(vec![name.clone()])
                .with_context(|| format!("`{name}` is not a DNS name or IP address"))?
        };
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, name.as_str());
        p.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        set_validity(&mut p, what.days);
        let cert = p.signed_by(&key, &issuer).with_context(|| format!("cannot sign `{name}`"))?;
        let (cert_path, key_path) = (&planned[2 + 2 * i], &planned[3 + 2 * i]);
        write_new(cert_path, &cert.pem(), false)?;
        write_new(key_path, &key.serialize_pem(), true)?;
        written.push(cert_path.clone());
        written.push(key_path.clone());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn stems_are_file_names() {
        assert_eq!(stem("*.example.test"), "wildcard.example.test");
        assert_eq!(stem("::1"), "__1");
    }
}
