//! The key exchange groups a TLS listener negotiates, read from `rondo_tls_key_exchanges_total`
//! of a real `rondo serve`: headless Chromium (which offers X25519MLKEM768 first) gets the
//! hybrid post-quantum group from a build with the feature `aws-lc` and X25519 from the default
//! ring build; `openssl s_client` of OpenSSL 3.0 (no hybrid groups) gets X25519 from both, and
//! P-256 or TLS 1.2 when it asks for them.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{BIN, Proc, TempDir, start_member};

/// Whether this build has the aws-lc provider (the test binary is built with the same
/// features as the `rondo` it runs).
const AWS_LC: bool = cfg!(feature = "aws-lc");

/// `rondo serve` with a TLS listener `web` (a self-signed certificate for localhost) in front
/// of `member`, and the admin API: (process, listener address, admin address).
fn serve(dir: &Path, member: SocketAddr) -> (Proc, SocketAddr, SocketAddr) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.join("web.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.join("web.key"), cert.signing_key.serialize_pem()).unwrap();
    let config = format!(
        r#"
[admin]
listen = "127.0.0.1:0"
token = "t"

[[listener]]
name = "web"
listen = "127.0.0.1:0"
tls = {{ certs = [ {{ cert = "web.pem", key = "web.key" }} ] }}

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [{{ name = "m1", address = "{member}" }}]
"#
    );
    let path = dir.join("rondo.toml");
    std::fs::write(&path, config).unwrap();
    let mut p = Proc::start(&["serve", "--config", path.to_str().unwrap(), "--workers", "1"]);
    let web = p.addr_after("listener web on");
    let admin = p.addr_after("admin API on");
    (p, web, admin)
}

/// The `/metrics` lines of `rondo_tls_key_exchanges_total`, as (labels, count).
fn key_exchanges(admin: SocketAddr) -> Vec<(String, f64)> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-H", "Authorization: Bearer t"])
        .arg(format!("http://{admin}/metrics"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("rondo_tls_key_exchanges_total"))
        .filter_map(|l| {
            let (labels, n) = l.rsplit_once(' ')?;
            Some((labels.to_owned(), n.parse().ok()?))
        })
        .collect()
}

fn series(version: &str, group: &str) -> String {
    format!("{{listener=\"web\",version=\"{version}\",group=\"{group}\"}}")
}

/// `openssl s_client` to `addr` with `args`, its output.
fn s_client(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", "localhost"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client (apt-get install openssl)");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn openssl_without_hybrid_groups_gets_x25519_or_what_it_asks_for() {
    let dir = TempDir::new("tls-kx");
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let (_serve, web, admin) = serve(&dir.0, member);
    assert!(key_exchanges(admin).is_empty(), "no handshake yet");

    // OpenSSL 3.0's default groups: X25519 first, no hybrid.
    let out = s_client(web, &["-brief"]);
    assert!(out.contains("CONNECTION ESTABLISHED"), "{out}");
    assert!(out.contains("Server Temp Key: X25519"), "{out}");
    let out = s_client(web, &["-brief", "-groups", "P-256"]);
    assert!(out.contains("Server Temp Key: ECDH, prime256v1"), "{out}");
    let out = s_client(web, &["-brief", "-tls1_2"]);
    assert!(out.contains("Protocol version: TLSv1.2"), "{out}");

    let mut got = key_exchanges(admin);
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = vec![
        (series("TLSv1.3", "X25519"), 1.0),
        (series("TLSv1.3", "secp256r1"), 1.0),
        (series("TLSv1.2", "X25519"), 1.0),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want);
}

#[test]
fn headless_chromium_gets_the_hybrid_group_from_an_aws_lc_build() {
    let chromium = std::env::var_os("RONDO_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.is_file() {
        assert!(!common::browser::in_ci(), "CI is set but {} is missing", chromium.display());
        eprintln!("SKIPPED: no chromium at {}", chromium.display());
        return;
    }
    let dir = TempDir::new("tls-kx-chromium");
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let (_serve, web, admin) = serve(&dir.0, member);
    let profile = dir.0.join("profile");
    let out = Command::new(&chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors"])
        .arg("--host-resolver-rules=MAP localhost 127.0.0.1")
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--timeout=15000", "--dump-dom"])
        .arg(format!("https://localhost:{}/", web.port()))
        .stdin(Stdio::null())
        .output()
        .expect("chromium runs");
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains("m1"), "the member's answer: {page}");
    let got = key_exchanges(admin);
    let group = if AWS_LC { "X25519MLKEM768" } else { "X25519" };
    let hybrid = got.iter().find(|(l, _)| *l == series("TLSv1.3", group));
    assert!(hybrid.is_some_and(|(_, n)| *n >= 1.0), "{group} expected (bin {BIN}): {got:?}");
    // Every handshake of the browser got the same group.
    assert!(got.iter().all(|(l, _)| *l == series("TLSv1.3", group)), "{got:?}");
}
