//! OCSP stapling against a real `rondo serve`, real certificates made with the `openssl` CLI
//! (a CA and a leaf whose authorityInfoAccess names a responder on 127.0.0.1), a real OpenSSL
//! OCSP responder (`openssl ocsp -index ... -port`) and `openssl s_client -status` reading the
//! staple: a response file is stapled, a garbage or revoked one is refused by `rondo check` at
//! its field and at a reload (the staple in force stays); `ocsp = "fetch"` asks the responder,
//! counts a failed try and staples once the responder answers.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{BIN, ChildGuard, Proc, TempDir, collect_lines, free_port};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In `dir`: a CA (`ca.pem`, `ca.key`), a leaf for localhost whose OCSP responder is
/// `http://127.0.0.1:{port}/` (`chain.pem`: leaf then CA; `leaf.pem`, `leaf.key`), the
/// responder's index saying `status` (`V` good, `R` revoked) of the leaf, and a response
/// `good.der` made offline from that index.
fn pki(dir: &Path, port: u16, status: char) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let mut ca = vec!["req", "-x509", "-days", "30", "-subj", "/CN=ocsp-test-ca"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
    ]);
    ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-subj", "/CN=localhost", "-keyout", "leaf.key", "-out", "leaf.csr"];
    csr.extend(ec);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("ext.cnf"),
        format!(
            "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n\
             authorityInfoAccess=OCSP;URI:http://127.0.0.1:{port}/\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &["x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key"]
            .into_iter()
            .chain([
                "-set_serial",
                "0x1234",
                "-days",
                "7",
                "-extfile",
                "ext.cnf",
                "-out",
                "leaf.pem",
            ])
            .collect::<Vec<_>>(),
    );
    let chain = std::fs::read_to_string(dir.join("leaf.pem")).unwrap()
        + &std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    std::fs::write(dir.join("chain.pem"), chain).unwrap();
    let revoked = if status == 'R' { "260101000000Z" } else { "" };
    std::fs::write(
        dir.join("index.txt"),
        format!("{status}\t301231000000Z\t{revoked}\t1234\tunknown\t/CN=localhost\n"),
    )
    .unwrap();
    openssl(
        dir,
        &["ocsp", "-issuer", "ca.pem", "-cert", "leaf.pem", "-reqout", "req.der", "-no_nonce"],
    );
    openssl(
        dir,
        &[
            "ocsp",
            "-index",
            "index.txt",
            "-rsigner",
            "ca.pem",
            "-rkey",
            "ca.key",
            "-CA",
            "ca.pem",
            "-reqin",
            "req.der",
            "-respout",
            "good.der",
            "-ndays",
            "1",
        ],
    );
}

/// A config: TLS listener `web` with `chain.pem` and `ocsp` (a TOML value), and the admin API.
fn config(ocsp: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"t\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\
         tls = {{ certs = [ {{ cert = \"chain.pem\", key = \"leaf.key\", ocsp = {ocsp} }} ] }}\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9\" }}]\n"
    )
}

/// `rondo serve` of `dir/rondo.toml`, its stderr collected: (process, stderr, web, admin).
fn serve(dir: &Path) -> (Proc, Arc<Mutex<Vec<String>>>, SocketAddr, SocketAddr) {
    let path = dir.join("rondo.toml");
    let mut child = Command::new(BIN)
        .args(["serve", "--config", path.to_str().unwrap(), "--workers", "1"])
        .env("NO_COLOR", "1")
        .env("RONDO_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rondo");
    let stderr = collect_lines(child.stderr.take().unwrap());
    let mut p = Proc::from_child(child);
    let web = p.addr_after("listener web on");
    let admin = p.addr_after("admin API on");
    (p, stderr, web, admin)
}

/// Waits at most 20 s for a stderr line with every one of `needles`.
fn stderr_with(stderr: &Mutex<Vec<String>>, needles: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) =
            stderr.lock().unwrap().iter().find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no stderr line with {needles:?}: {:#?}",
            stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `openssl s_client -status` to `addr`: its output (the OCSP part says what was stapled).
fn status(dir: &Path, addr: SocketAddr) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", "localhost", "-status"])
        .args(["-CAfile", dir.join("ca.pem").to_str().unwrap(), "-verify_return_error"])
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn assert_good_staple(out: &str) {
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");
    assert!(out.contains("Serial Number: 1234"), "{out}");
}

/// The value of the `/metrics` sample `series` (0 when absent).
fn metric(admin: SocketAddr, series: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-H", "Authorization: Bearer t"])
        .arg(format!("http://{admin}/metrics"))
        .output()
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// `rondo check` of `dir/rondo.toml`: (success, stderr).
fn check(dir: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["check", dir.join("rondo.toml").to_str().unwrap()])
        .output()
        .expect("run rondo check");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_response_file_is_stapled_and_a_bad_one_is_refused_at_check_and_at_reload() {
    let dir = TempDir::new("ocsp-file");
    let d = &dir.0;
    pki(d, free_port(), 'V');
    std::fs::write(d.join("garbage.der"), b"this is no OCSP response").unwrap();

    // `rondo check` names the file, the field and what is wrong.
    std::fs::write(d.join("rondo.toml"), config("\"garbage.der\"")).unwrap();
    let (ok, err) = check(d);
    assert!(!ok, "{err}");
    let text = config("\"garbage.der\"");
    let at = text.find("\"garbage.der\"").unwrap();
    let line = text[..at].matches('\n').count() + 1;
    let column = at - text[..at].rfind('\n').map_or(0, |i| i + 1) + 1;
    assert!(err.contains(&format!("rondo.toml:{line}:{column}: ")), "at the value: {err}");
    assert!(err.contains("listener[0].tls.certs[0].ocsp"), "{err}");
    assert!(err.contains("not a DER OCSP response"), "{err}");
    // A response of another CA for the same serial number (a second PKI's) is refused too.
    let other = TempDir::new("ocsp-other");
    pki(&other.0, free_port(), 'V');
    std::fs::copy(other.0.join("good.der"), d.join("other.der")).unwrap();
    std::fs::write(d.join("rondo.toml"), config("\"other.der\"")).unwrap();
    let (ok, err) = check(d);
    assert!(!ok, "{err}");
    assert!(err.contains("about a certificate of another issuer"), "{err}");

    // A good response is stapled.
    std::fs::write(d.join("rondo.toml"), config("\"good.der\"")).unwrap();
    let (ok, err) = check(d);
    assert!(ok, "{err}");
    let (_serve, stderr, web, _admin) = serve(d);
    assert_good_staple(&status(d, web));

    // Garbage in its place: the reload is refused, saying why, and the good staple stays.
    std::fs::write(d.join("good.der"), b"garbage").unwrap();
    stderr_with(&stderr, &["tls reload (file change) rejected", "not a DER OCSP response"]);
    assert_good_staple(&status(d, web));
}

#[test]
fn a_revoked_response_file_is_refused() {
    let dir = TempDir::new("ocsp-revoked");
    let d = &dir.0;
    pki(d, free_port(), 'R');
    std::fs::write(d.join("rondo.toml"), config("\"good.der\"")).unwrap();
    let (ok, err) = check(d);
    assert!(!ok, "{err}");
    assert!(err.contains("listener[0].tls.certs[0].ocsp"), "{err}");
    assert!(err.contains("revoked on"), "{err}");
}

#[test]
fn fetched_responses_are_stapled_after_a_failed_try_is_counted() {
    let dir = TempDir::new("ocsp-fetch");
    let d = &dir.0;
    let port = free_port();
    pki(d, port, 'V');
    // A certificate without a responder cannot fetch: an error at the field.
    std::fs::write(
        d.join("rondo.toml"),
        config("\"fetch\"").replace("chain.pem", "ca.pem").replace("leaf.key", "ca.key"),
    )
    .unwrap();
    let (ok, err) = check(d);
    assert!(!ok && err.contains("listener[0].tls.certs[0].ocsp"), "{err}");
    assert!(err.contains("ocsp = \"fetch\" needs the issuer"), "{err}");

    // The responder is not up yet: the first fetch fails and is counted, nothing is stapled.
    std::fs::write(d.join("rondo.toml"), config("\"fetch\"")).unwrap();
    let (ok, err) = check(d);
    assert!(ok, "{err}");
    let (serve, stderr, web, admin) = serve(d);
    stderr_with(&stderr, &["ocsp fetch for", "failed, the last good response stays"]);
    let failed = "rondo_tls_ocsp_fetches_total{listener=\"web\",result=\"failed\"}";
    assert!(metric(admin, failed) >= 1.0);
    let out = status(d, web);
    assert!(out.contains("OCSP response: no response sent"), "{out}");

    // Once the responder answers, the next try (5 s later) staples its response.
    let responder = ChildGuard(
        Command::new("openssl")
            .args(["ocsp", "-index", "index.txt", "-port", &port.to_string()])
            .args(["-rsigner", "ca.pem", "-rkey", "ca.key", "-CA", "ca.pem", "-nmin", "10"])
            .args(["-nrequest", "20"])
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start openssl ocsp"),
    );
    stderr_with(&stderr, &["ocsp response for", "stapled, next fetch in"]);
    let ok = "rondo_tls_ocsp_fetches_total{listener=\"web\",result=\"ok\"}";
    assert_eq!(metric(admin, ok), 1.0);
    assert_good_staple(&status(d, web));

    // The responder goes away; SIGHUP fetches at once, the fetch fails, the staple stays.
    drop(responder);
    let before = metric(admin, failed);
    let hup = Command::new("kill").args(["-HUP", &serve.child.id().to_string()]).status();
    assert!(hup.unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(admin, failed) <= before {
        assert!(Instant::now() < deadline, "no failed fetch after SIGHUP");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(admin, ok), 1.0);
    assert_good_staple(&status(d, web));
}
