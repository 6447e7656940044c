//! TLS termination on listeners, against a real `rondo serve` and real clients: curl (SNI with
//! --resolve, HTTP/2 by ALPN, client certificates), `openssl s_client` (TLS 1.1 refused, 1.2
//! and 1.3 served, ALPN) and a rustls client in this file (client certificates, certificate
//! rotation under load). Certificates are made here with rcgen; none is checked in. Also the
//! configuration checks (`rondo check`) of TLS files: missing, not PEM, a key of another
//! certificate, expired, a route host no certificate covers.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{BIN, Proc, TempDir, collect_lines, start_member};

// ---------------------------------------------------------------------------------------------
// Certificates.
// ---------------------------------------------------------------------------------------------

/// A test certificate authority.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = p.self_signed(&key).unwrap();
    Ca { issuer: Issuer::new(p, key), pem: cert.pem() }
}

/// A certificate (PEM) and key (PEM) signed by `ca` for `names` (subject alternative names),
/// with common name `cn`; a client certificate when `client`; expired in 2001 when `expired`.
fn leaf(ca: &Ca, cn: &str, names: &[&str], client: bool, expired: bool) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    p.use_authority_key_identifier_extension = true;
    if expired {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Replaces `name` in `dir` by rename (as deployment tools do), so no reader sees half a file.
fn replace(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The router.
// ---------------------------------------------------------------------------------------------

/// `rondo serve` as a child process, killed on drop, its stderr collected.
struct Serve {
    proc: Proc,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    fn start(config: &Path) -> Serve {
        let mut child = Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap(), "--workers", "1"])
            .env("NO_COLOR", "1")
            .env("RONDO_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rondo");
        let stderr = collect_lines(child.stderr.take().unwrap());
        Serve { proc: Proc::from_child(child), stderr }
    }

    fn addr(&mut self, listener: &str) -> SocketAddr {
        self.proc.addr_after(&format!("listener {listener} on"))
    }

    /// Waits at most 15 s for a stderr line containing every one of `needles`.
    fn stderr_with(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(l) =
                self.stderr.lock().unwrap().iter().find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no stderr line with {needles:?}: {:#?}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.proc.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

/// The files of one TLS setup: a CA, server certificates for `a.test` and `*.b.test`, a client
/// certificate for `alice`, in a temporary directory.
struct Setup {
    dir: TempDir,
    ca: Ca,
}

impl Setup {
    fn new() -> Setup {
        let dir = TempDir::new("tls");
        let ca = ca("rondo test CA");
        write(&dir.0, "ca.pem", &ca.pem);
        let (c, k) = leaf(&ca, "a.test", &["a.test"], false, false);
        write(&dir.0, "a.pem", &c);
        write(&dir.0, "a.key", &k);
        let (c, k) = leaf(&ca, "b wildcard", &["*.b.test"], false, false);
        write(&dir.0, "b.pem", &c);
        write(&dir.0, "b.key", &k);
        let (c, k) = leaf(&ca, "alice", &["alice.clients.test"], true, false);
        write(&dir.0, "alice.pem", &c);
        write(&dir.0, "alice.key", &k);
        Setup { dir, ca }
    }

    fn path(&self, name: &str) -> String {
        self.dir.0.join(name).to_str().unwrap().to_owned()
    }

    /// A config: listener `plain` (optional client certificates) and `strict` (required) in
    /// front of `member`, header timeouts of `header_ms`.
    fn config(&self, member: SocketAddr, header_ms: u64) -> PathBuf {
        let text = format!(
            r#"
[admin]
listen = "127.0.0.1:0"
token = "t"

[[listener]]
name = "opt"
listen = "127.0.0.1:0"
header_read_timeout_ms = {header_ms}
tls = {{ certs = [ {{ cert = "a.pem", key = "a.key" }}, {{ cert = "b.pem", key = "b.key" }} ],
        client_ca = "ca.pem", client_auth = "optional" }}

[[listener]]
name = "strict"
listen = "127.0.0.1:0"
tls = {{ certs = [ {{ cert = "a.pem", key = "a.key" }} ], client_ca = "ca.pem", client_auth = "required" }}

[[route]]
listener = "opt"
cluster = "c"

[[route]]
listener = "strict"
cluster = "c"

[cluster.c]
members = [{{ name = "m1", address = "{member}" }}]
"#
        );
        write(&self.dir.0, "rondo.toml", &text)
    }
}

// ---------------------------------------------------------------------------------------------
// Clients.
// ---------------------------------------------------------------------------------------------

fn curl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s_client(addr: SocketAddr, args: &[&str]) -> String {
    let sni: &[&str] =
        if args.contains(&"-noservername") { &[] } else { &["-servername", "a.test"] };
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args(sni)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client (apt-get install openssl)");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A rustls client configuration trusting `roots` (PEM), presenting `identity` (cert and key
/// PEM) when given.
fn client_config(roots: &[&str], identity: Option<(&str, &str)>) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for pem in roots {
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            store.add(c.unwrap()).unwrap();
        }
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store);
    let config = match identity {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    Arc::new(config)
}

/// One HTTP/1.1 keep-alive connection over TLS.
struct Conn(hyper::client::conn::http1::SendRequest<Empty<Bytes>>);

impl Conn {
    async fn open(
        addr: SocketAddr,
        sni: &str,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Conn, String> {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from(sni.to_owned()).unwrap();
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Conn(send))
    }

    async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<(u16, String), String> {
        let mut req = http::Request::get(path).header("host", "a.test");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self.0.send_request(req.body(Empty::new()).unwrap()).await.map_err(|e| {
            use std::error::Error;
            format!("request: {e} ({:?})", e.source())
        })?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// A whole request on a new connection.
async fn get_once(
    addr: SocketAddr,
    sni: &str,
    config: Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    tokio::time::timeout(Duration::from_secs(10), async {
        Conn::open(addr, sni, config).await?.get(path, headers).await
    })
    .await
    .map_err(|_| "timed out".to_owned())?
}

/// The value of the `/metrics` sample line starting with `series` (0 when absent).
fn metric(admin: SocketAddr, series: &str) -> f64 {
    let (ok, text, err) =
        curl(&["-H", "Authorization: Bearer t", &format!("http://{admin}/metrics")]);
    assert!(ok, "{err}");
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn header_line<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
        .map(|l| l[name.len() + 1..].trim())
}

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

// SNI picks the certificate (each covers only its own names, so curl's verification fails on
// the wrong one); ALPN gives HTTP/2; HTTP/1.1 still works; no SNI gets the first certificate.
#[test]
fn curl_gets_the_certificate_of_its_name_and_h2_by_alpn() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let mut serve = Serve::start(&s.config(member, 10_000));
    let addr = serve.addr("opt");
    let admin = serve.proc.addr_after("admin API on");
    let port = addr.port();
    let ca = s.path("ca.pem");
    for host in ["a.test", "x.b.test"] {
        let resolve = format!("{host}:{port}:127.0.0.1");
        let url = format!("https://{host}:{port}/");
        let (ok, out, err) =
            curl(&["--cacert", &ca, "--resolve", &resolve, "-w", " %{http_version}", &url]);
        assert!(ok, "{host}: {err}");
        assert_eq!(out, "m1\n 2", "{host}: HTTP/2 by ALPN");
        let (ok, out, err) = curl(&[
            "--http1.1",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-w",
            " %{http_version}",
            &url,
        ]);
        assert!(ok, "{host}: {err}");
        assert_eq!(out, "m1\n 1.1");
    }
    // HTTP/1.1 over TLS is served by the router's own HTTP/1 path; only the two HTTP/2
    // connections were handed to hyper.
    let handoffs = |reason: &str| {
        metric(
            admin,
            &format!("rondo_http1_handoffs_total{{listener=\"opt\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(handoffs("h2"), 2.0);
    for reason in ["http10", "target_form", "upgrade", "upstream"] {
        assert_eq!(handoffs(reason), 0.0, "{reason}");
    }
    // A name no certificate has: the default (a.test) certificate, which curl refuses.
    let resolve = format!("c.test:{port}:127.0.0.1");
    let (ok, _, err) =
        curl(&["--cacert", &ca, "--resolve", &resolve, &format!("https://c.test:{port}/")]);
    assert!(!ok);
    assert!(
        err.contains("a.test") || err.contains("no alternative certificate subject name matches"),
        "{err}"
    );
    // No SNI at all (an IP address): the default certificate.
    let out = s_client(addr, &["-noservername", "-CAfile", &ca]);
    assert!(out.contains("CN=a.test") || out.contains("CN = a.test"), "{out}");
}

// TLS 1.0 and 1.1 are refused; 1.2 and 1.3 served; ALPN answers h2.
#[test]
fn openssl_sees_tls12_and_13_only_and_alpn() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let mut serve = Serve::start(&s.config(member, 10_000));
    let addr = serve.addr("opt");
    let ca = s.path("ca.pem");
    for old in ["-tls1", "-tls1_1"] {
        let out = s_client(addr, &["-brief", "-CAfile", &ca, old]);
        assert!(!out.contains("CONNECTION ESTABLISHED"), "{old}: {out}");
    }
    for (v, shown) in [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")] {
        let out = s_client(addr, &["-brief", "-CAfile", &ca, v]);
        assert!(out.contains("CONNECTION ESTABLISHED"), "{v}: {out}");
        assert!(out.contains(&format!("Protocol version: {shown}")), "{v}: {out}");
    }
    let out = s_client(addr, &["-CAfile", &ca, "-alpn", "h2,http/1.1"]);
    assert!(out.contains("ALPN protocol: h2"), "{out}");
    let out = s_client(addr, &["-CAfile", &ca, "-alpn", "http/1.1"]);
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
}

// A verified client certificate's subject and SANs reach the member; a client cannot forge
// them, with or without a certificate of its own; `required` refuses a client without one.
#[test]
fn client_certificates_reach_members_and_forged_headers_do_not() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let mut serve = Serve::start(&s.config(member, 10_000));
    let opt = serve.addr("opt");
    let strict = serve.addr("strict");
    let alice = (
        std::fs::read_to_string(s.path("alice.pem")).unwrap(),
        std::fs::read_to_string(s.path("alice.key")).unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let forged = [("x-client-cert-subject", "CN=mallory"), ("x-client-cert-san", "DNS:evil")];
        let anon = client_config(&[&s.ca.pem], None);
        let with = client_config(&[&s.ca.pem], Some((&alice.0, &alice.1)));

        let (status, headers) =
            get_once(opt, "a.test", anon.clone(), "/headers", &forged).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(header_line(&headers, "x-client-cert-subject"), None, "{headers}");
        assert_eq!(header_line(&headers, "x-client-cert-san"), None, "{headers}");
        assert_eq!(header_line(&headers, "x-forwarded-proto"), Some("https"), "{headers}");

        for addr in [opt, strict] {
            let (status, headers) =
                get_once(addr, "a.test", with.clone(), "/headers", &forged).await.unwrap();
            assert_eq!(status, 200);
            assert_eq!(
                header_line(&headers, "x-client-cert-subject"),
                Some("CN=alice"),
                "{headers}"
            );
            assert_eq!(
                header_line(&headers, "x-client-cert-san"),
                Some("DNS:alice.clients.test"),
                "{headers}"
            );
        }

        // `required`: no certificate, no request (TLS 1.3 reports the refusal on first use).
        let refused = get_once(strict, "a.test", anon.clone(), "/", &[]).await;
        assert!(refused.is_err(), "{refused:?}");
        // A certificate from another CA is refused on both listeners.
        let other = ca("another CA");
        let (c, k) = leaf(&other, "eve", &["eve.test"], true, false);
        let eve = client_config(&[&s.ca.pem], Some((&c, &k)));
        for addr in [opt, strict] {
            let r = get_once(addr, "a.test", eve.clone(), "/", &[]).await;
            assert!(r.is_err(), "{r:?}");
        }
    });
    // curl with a client certificate.
    let port = strict.port();
    let resolve = format!("a.test:{port}:127.0.0.1");
    let url = format!("https://a.test:{port}/headers");
    let (ok, out, err) = curl(&[
        "--cacert",
        &s.path("ca.pem"),
        "--resolve",
        &resolve,
        "--cert",
        &s.path("alice.pem"),
        "--key",
        &s.path("alice.key"),
        &url,
    ]);
    assert!(ok, "{err}");
    assert_eq!(header_line(&out, "x-client-cert-subject"), Some("CN=alice"), "{out}");
    let (ok, _, _) = curl(&["--cacert", &s.path("ca.pem"), "--resolve", &resolve, &url]);
    assert!(!ok, "required refuses curl without a certificate");
}

// Plain HTTP and garbage sent to a TLS port are refused; a client that never starts its
// handshake is closed after the header read timeout; a stalled request head over TLS gets the
// 408; the router keeps serving, and counts each handshake's result.
#[test]
fn plain_http_garbage_and_silence_are_refused_without_harm() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let mut serve = Serve::start(&s.config(member, 500));
    let addr = serve.addr("opt");
    let admin = serve.proc.addr_after("admin API on");
    let (ok, _, _) = curl(&[&format!("http://{addr}/")]);
    assert!(!ok, "plain HTTP is not served on a TLS port");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut garbage = tokio::net::TcpStream::connect(addr).await.unwrap();
        garbage.write_all(&[0xff; 2048]).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match garbage.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "garbage connection left open");

        let started = Instant::now();
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
        assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
        assert!(started.elapsed() >= Duration::from_millis(400));

        // The header timer works over TLS: a request head that stalls gets the 408, encrypted.
        let config = client_config(&[&s.ca.pem], None);
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("a.test".to_owned()).unwrap();
        let mut tls =
            tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp).await.unwrap();
        tls.write_all(b"GET / HTTP/1.1\r\nHost: a.te").await.unwrap();
        let mut answer = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
        assert!(r.is_ok(), "no answer to a stalled request head");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{answer}");

        let (status, body) = get_once(addr, "a.test", config, "/", &[]).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "m1\n"));
    });
    assert!(serve.proc.child.try_wait().unwrap().is_none(), "rondo serve exited");
    // Counted: plain HTTP and garbage failed, the silent client timed out, the last one ok.
    let series = |result: &str| {
        format!("rondo_tls_handshakes_total{{listener=\"opt\",result=\"{result}\"}}")
    };
    assert_eq!(metric(admin, &series("failed")), 2.0);
    assert_eq!(metric(admin, &series("timeout")), 1.0);
    assert_eq!(metric(admin, &series("ok")), 2.0);
}

// Certificates rotated (by rename, as deployment tools do) while requests run, on new and on
// kept-alive connections: no request fails, new handshakes get the new certificate, a bad new
// file keeps the old certificate and says why, and SIGHUP reloads too.
#[test]
fn certificate_rotation_under_load_loses_no_request() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let mut serve = Serve::start(&s.config(member, 10_000));
    let addr = serve.addr("opt");
    let next = ca("rondo next CA");
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let both = client_config(&[&s.ca.pem, &next.pem], None);
        let only_next = client_config(&[&next.pem], None);
        assert!(get_once(addr, "a.test", only_next.clone(), "/", &[]).await.is_err());

        let mut kept = Conn::open(addr, "a.test", both.clone()).await.unwrap();
        assert_eq!(kept.get("/", &[]).await.unwrap().0, 200);

        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let mut load = Vec::new();
        for _ in 0..3 {
            let (both, done, failed) = (both.clone(), done.clone(), failed.clone());
            load.push(tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                for _ in 0..60 {
                    if Instant::now() > deadline {
                        break;
                    }
                    match get_once(addr, "a.test", both.clone(), "/", &[]).await {
                        Ok((200, _)) => {}
                        other => failed.lock().unwrap().push(format!("{other:?}")),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
        // Rotate to the next CA's certificate once the load is under way.
        while done.load(Ordering::Relaxed) < 20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (c, k) = leaf(&next, "a.test", &["a.test"], false, false);
        replace(&s.dir.0, "a.key", &k);
        replace(&s.dir.0, "a.pem", &c);
        let deadline = Instant::now() + Duration::from_secs(15);
        while get_once(addr, "a.test", only_next.clone(), "/", &[]).await.is_err() {
            assert!(Instant::now() < deadline, "the new certificate was never served");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for t in load {
            t.await.unwrap();
        }
        assert!(failed.lock().unwrap().is_empty(), "failed: {:?}", failed.lock().unwrap());
        assert!(done.load(Ordering::Relaxed) >= 60);
        // The connection from before the rotation is still up.
        assert_eq!(kept.get("/", &[]).await.unwrap().0, 200);

        // A bad new file: the old certificate stays, and the log says why.
        replace(&s.dir.0, "a.pem", "not a certificate\n");
        serve.stderr_with(&["tls reload (file change) rejected", "holds no PEM certificate"]);
        let r = get_once(addr, "a.test", only_next.clone(), "/", &[]).await;
        assert_eq!(r.unwrap().0, 200);

        // SIGHUP reloads (and again keeps the old certificate: the file is still bad).
        serve.signal("-HUP");
        serve.stderr_with(&["tls reload (SIGHUP) rejected"]);
        replace(&s.dir.0, "a.pem", &c);
        serve.signal("-HUP");
        serve.stderr_with(&["tls certificates reloaded (SIGHUP)"]);
        assert_eq!(get_once(addr, "a.test", only_next, "/", &[]).await.unwrap().0, 200);
    });
}

// ---------------------------------------------------------------------------------------------
// Configuration checks.
// ---------------------------------------------------------------------------------------------

/// A config with one TLS listener whose certificate entry is `certs` (TOML), and a route with
/// `host` when given.
fn tls_config(certs: &str, extra: &str, host: Option<&str>) -> String {
    let m = host.map_or(String::new(), |h| format!("match = {{ host = \"{h}\" }}\n"));
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\ntls = {{ certs = [ {certs} ]{extra} }}\n\n\
         [[route]]\nlistener = \"web\"\n{m}cluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9101\" }}]\n"
    )
}

/// 1-based line and column of `needle` in `text`.
fn pos(text: &str, needle: &str) -> (usize, usize) {
    let at = text.find(needle).expect("needle in text");
    let before = &text[..at];
    (before.matches('\n').count() + 1, at - before.rfind('\n').map_or(0, |i| i + 1) + 1)
}

#[test]
fn check_finds_every_tls_file_problem_at_its_field() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("check CA");
    let (c, k) = leaf(&root, "a.test", &["a.test"], false, false);
    write(d, "a.pem", &c);
    write(d, "a.key", &k);
    let (_, other_key) = leaf(&root, "b.test", &["b.test"], false, false);
    write(d, "other.key", &other_key);
    let (old, old_key) = leaf(&root, "a.test", &["a.test"], false, true);
    write(d, "old.pem", &old);
    write(d, "old.key", &old_key);
    write(d, "junk.pem", "hello\n");
    write(d, "ca.pem", &root.pem);

    let cases: [(&str, &str, &str, &str); 6] = [
        (
            r#"{ cert = "missing.pem", key = "a.key" }"#,
            "",
            "\"missing.pem\"",
            "cannot read certificate file",
        ),
        (r#"{ cert = "junk.pem", key = "a.key" }"#, "", "\"junk.pem\"", "holds no PEM certificate"),
        (r#"{ cert = "a.pem", key = "junk.pem" }"#, "", "\"junk.pem\"", "holds no PEM private key"),
        (
            r#"{ cert = "a.pem", key = "other.key" }"#,
            "",
            "\"other.key\"",
            "does not match the certificate",
        ),
        (
            r#"{ cert = "old.pem", key = "old.key" }"#,
            "",
            "\"old.pem\"",
            "expired on Jan  1 00:00:00 2001 +00:00",
        ),
        (
            r#"{ cert = "a.pem", key = "a.key" }"#,
            r#", client_auth = "required""#,
            "\"required\"",
            "needs `client_ca`",
        ),
    ];
    for (certs, extra, at, want) in cases {
        let text = tls_config(certs, extra, None);
        let file = d.join("rondo.toml");
        let errors = rondo_config::parse_str(&text, &file, 1).expect_err(certs);
        assert_eq!(errors.errors.len(), 1, "{certs}: {errors:?}");
        let e = &errors.errors[0];
        assert!(e.message.contains(want), "{certs}: {e}");
        assert_eq!((e.line, e.column), pos(&text, at), "{certs}: {e}");
        let field = match at {
            "\"required\"" => "listener[0].tls.client_auth".to_owned(),
            _ if certs.contains(&format!("cert = {at}")) => "listener[0].tls.certs[0].cert".into(),
            _ => "listener[0].tls.certs[0].key".into(),
        };
        assert_eq!(e.field, field, "{certs}");
    }
    // `client_ca` that asks for nothing is a warning.
    let text =
        tls_config(r#"{ cert = "a.pem", key = "a.key" }"#, r#", client_ca = "ca.pem""#, None);
    let config = rondo_config::parse_str(&text, &d.join("rondo.toml"), 1).unwrap();
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert_eq!(config.warnings[0].field, "listener[0].tls.client_ca");
    // Valid; a route for a name no certificate has is a warning at its host.
    let ok = r#"{ cert = "a.pem", key = "a.key" }"#;
    let text =
        tls_config(ok, r#", client_ca = "ca.pem", client_auth = "optional""#, Some("a.test"));
    let config = rondo_config::parse_str(&text, &d.join("rondo.toml"), 1).unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let text = tls_config(ok, "", Some("www.test"));
    let config = rondo_config::parse_str(&text, &d.join("rondo.toml"), 1).unwrap();
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    let w = &config.warnings[0];
    assert_eq!(w.field, "route[0].match.host");
    assert!(w.message.contains("no certificate of tls listener `web` is for `www.test`"), "{w}");

    // `rondo check` prints the error with the file, line and column.
    let text = tls_config(r#"{ cert = "a.pem", key = "other.key" }"#, "", None);
    let file = write(d, "bad.toml", &text);
    let out = Command::new(BIN).args(["check", file.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let (l, col) = pos(&text, "\"other.key\"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:{l}:{col}: field `listener[0].tls.certs[0].key`: the key in",
            file.display()
        )),
        "{stderr}"
    );
}

// `rondo tls dev-ca` writes a CA, server and client certificates that a TLS listener serves
// and curl trusts; it never overwrites.
#[test]
fn dev_ca_certificates_serve_a_tls_listener() {
    let dir = TempDir::new("tls");
    let certs = dir.0.join("certs");
    let out = Command::new(BIN)
        .args(["tls", "dev-ca", certs.to_str().unwrap(), "--name", "localhost", "--client", "bob"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("development only"));
    let again = Command::new(BIN)
        .args(["tls", "dev-ca", certs.to_str().unwrap(), "--name", "localhost"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwrites"));

    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\
         tls = {{ certs = [ {{ cert = \"certs/localhost.pem\", key = \"certs/localhost.key\" }} ], \
         client_ca = \"certs/ca.pem\", client_auth = \"required\" }}\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{member}\" }}]\n"
    );
    let path = write(&dir.0, "rondo.toml", &config);
    let check =
        Command::new(BIN).args(["check", "--strict", path.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut serve = Serve::start(&path);
    let port = serve.addr("web").port();
    let c = |f: &str| certs.join(f).to_str().unwrap().to_owned();
    let (ok, out, err) = curl(&[
        "--cacert",
        &c("ca.pem"),
        "--cert",
        &c("client-bob.pem"),
        "--key",
        &c("client-bob.key"),
        &format!("https://localhost:{port}/headers"),
    ]);
    assert!(ok, "{err}");
    assert_eq!(header_line(&out, "x-client-cert-subject"), Some("CN=bob"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// TLS to members (`upstream_tls`).
// ---------------------------------------------------------------------------------------------

/// The kind of each handshake the member named `resume` completed (`Some(Full)`, `Some(Resumed)`).
static RESUME_KINDS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What the member named `record` was sent: one line per request.
static RECORDED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Handshakes completed by the member named `pooled`.
static POOLED_HANDSHAKES: AtomicU64 = AtomicU64::new(0);

/// A member speaking TLS (HTTP/2 when ALPN says `h2`, else HTTP/1.1) with `cert`/`key`; with `client_ca` it
/// requires a client certificate signed by it. Answers `NAME client=yes|no version=V`. Runs on
/// `rt` until the runtime is dropped.
fn tls_member(
    rt: &tokio::runtime::Runtime,
    name: &'static str,
    (cert, key): (&str, &str),
    client_ca: Option<&str>,
) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let b = match client_ca {
        None => b.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap()).unwrap();
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            b.with_client_cert_verifier(v)
        }
    };
    let mut config = b
        .with_single_cert(
            CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect(),
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                if name == "pooled" {
                    POOLED_HANDSHAKES.fetch_add(1, Ordering::Relaxed);
                }
                if name == "resume" {
                    let kind = tls.get_ref().1.handshake_kind();
                    RESUME_KINDS.lock().unwrap().push(format!("{kind:?}"));
                }
                let client =
                    if tls.get_ref().1.peer_certificates().is_some() { "yes" } else { "no" };
                let service = hyper::service::service_fn(move |req: http::Request<_>| async move {
                    if name == "record" {
                        let h = |n: &str| {
                            req.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("-")
                        };
                        RECORDED.lock().unwrap().push(format!(
                            "{} {} subject={} san={} proto={} key={} client={client}",
                            req.method(),
                            req.uri().path(),
                            h("x-client-cert-subject"),
                            h("x-client-cert-san"),
                            h("x-forwarded-proto"),
                            h("idempotency-key"),
                        ));
                    }
                    let body = format!("{name} client={client} version={:?}\n", req.version());
                    let mut resp =
                        http::Response::new(http_body_util::Full::new(Bytes::from(body)));
                    if name == "resume" {
                        // One request per connection: every request needs a new handshake.
                        resp.headers_mut()
                            .insert("connection", http::HeaderValue::from_static("close"));
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                });
                // As strict servers do: the protocol ALPN chose, and no other.
                if tls.get_ref().1.alpn_protocol() == Some(&b"h2"[..]) {
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                }
            });
        }
    });
    addr
}

// Members reached over TLS, verified against the cluster's CA for its server_name (or the
// member's address), with the router's certificate for members that require one; HTTP/1.1,
// HTTP/2 by ALPN and TCP sessions; an expired, a wrong-name and an untrusted member
// certificate, and a member refusing a router without a certificate, each give a 502 saying
// why; health checks verify the same way.
#[test]
fn members_are_reached_over_mtls_and_bad_certificates_get_a_502_that_says_why() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let members_ca = ca("members CA");
    let routers_ca = ca("routers CA");
    let rogue_ca = ca("rogue CA");
    write(d, "members-ca.pem", &members_ca.pem);
    let (rc, rk) = leaf(&routers_ca, "router", &["router.internal"], true, false);
    write(d, "router.pem", &rc);
    write(d, "router.key", &rk);

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let good = leaf(&members_ca, "api.internal", &["api.internal", "127.0.0.1"], false, false);
    let wrong = leaf(&members_ca, "other", &["other.internal"], false, false);
    let expired = leaf(&members_ca, "api.internal", &["api.internal"], false, true);
    let rogue = leaf(&rogue_ca, "api.internal", &["api.internal"], false, false);
    let m_good = tls_member(&rt, "good", (&good.0, &good.1), Some(&routers_ca.pem));
    let m_wrong = tls_member(&rt, "wrong", (&wrong.0, &wrong.1), None);
    let m_expired = tls_member(&rt, "expired", (&expired.0, &expired.1), None);
    let m_rogue = tls_member(&rt, "rogue", (&rogue.0, &rogue.1), None);

    let mtls = r#"upstream_tls = { ca = "members-ca.pem", server_name = "api.internal", cert = "router.pem", key = "router.key" }"#;
    let ca_only = r#"upstream_tls = { ca = "members-ca.pem", server_name = "api.internal" }"#;
    let mut config = String::from(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"t\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nname = \"tcp\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
         [[route]]\nlistener = \"tcp\"\ncluster = \"tcp\"\n\n\
         [[listener]]\nname = \"tcpwrong\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
         [[route]]\nlistener = \"tcpwrong\"\ncluster = \"tcpwrong\"\n\n",
    );
    let clusters: [(&str, SocketAddr, &str, &str); 7] = [
        ("good", m_good, mtls, ""),
        // Its health check speaks HTTP/2 over TLS, offering `h2` as its requests do (no panic
        // mode, so a member the checks take down gets no request).
        (
            "h2",
            m_good,
            mtls,
            "upstream_protocol = \"http2\"\npanic_threshold_percent = 0\n\
             health = { kind = \"http\", path = \"/\", interval_ms = 100, fall = 1 }\n",
        ),
        (
            "byaddress",
            m_good,
            r#"upstream_tls = { ca = "members-ca.pem", cert = "router.pem", key = "router.key" }"#,
            "",
        ),
        ("nocert", m_good, ca_only, ""),
        ("wrong", m_wrong, ca_only, ""),
        ("expired", m_expired, ca_only, ""),
        ("rogue", m_rogue, ca_only, ""),
    ];
    for (name, addr, tls, extra) in clusters {
        config.push_str(&format!(
            "[[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/{name}\" }}\ncluster = \"{name}\"\n\n\
             [cluster.{name}]\n{extra}{tls}\nmembers = [{{ name = \"{name}-1\", address = \"{addr}\" }}]\n\n"
        ));
    }
    config.push_str(&format!(
        "[cluster.tcp]\nupstream_protocol = \"tcp\"\n{mtls}\nmembers = [{{ name = \"t1\", address = \"{m_good}\" }}]\n\n\
         [cluster.tcpwrong]\nupstream_protocol = \"tcp\"\n{ca_only}\nmembers = [{{ name = \"tcpwrong-1\", address = \"{m_wrong}\" }}]\n\n\
         [cluster.checked]\n{ca_only}\nmembers = [{{ name = \"checked-1\", address = \"{m_wrong}\" }}]\n\
         health = {{ kind = \"http\", path = \"/\", interval_ms = 100, fall = 1 }}\n\n\
         [[route]]\nlistener = \"web\"\nmatch = {{ path_prefix = \"/checked\" }}\ncluster = \"checked\"\n"
    ));
    let path = write(d, "rondo.toml", &config);
    let check = Command::new(BIN).args(["check", path.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut serve = Serve::start(&path);
    let web = serve.addr("web");
    let tcp = serve.addr("tcp");
    let tcpwrong = serve.addr("tcpwrong");
    let admin = serve.proc.addr_after("admin API on");

    let get = |p: &str| {
        let (ok, out, err) = curl(&["-w", "\n%{http_code}", &format!("http://{web}{p}")]);
        assert!(ok, "{p}: {err}");
        let (body, code) = out.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    assert_eq!(get("/good"), ("200".into(), "good client=yes version=HTTP/1.1\n".into()));
    // A few rounds of the `h2` cluster's health checks (a failed one takes its member down).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get("/h2"), ("200".into(), "good client=yes version=HTTP/2.0\n".into()));
    assert_eq!(get("/byaddress"), ("200".into(), "good client=yes version=HTTP/1.1\n".into()));
    for (p, why) in [
        ("/wrong", "wrong-1: tls: certificate not valid for api.internal"),
        ("/expired", "expired-1: tls: certificate expired"),
        ("/rogue", "rogue-1: tls: certificate not signed by the cluster's ca"),
        ("/nocert", "nocert-1: tls: the member refused the router's handshake"),
    ] {
        let (code, body) = get(p);
        assert_eq!(code, "502", "{p}: {body}");
        assert!(body.contains("bad gateway") && body.contains(why), "{p}: {body}");
    }

    for (cluster, reason) in [
        ("wrong", "not_valid_for_name"),
        ("expired", "expired"),
        ("rogue", "unknown_issuer"),
        ("nocert", "refused"),
    ] {
        let series = format!(
            "rondo_tls_member_failures_total{{cluster=\"{cluster}\",member=\"{cluster}-1\",reason=\"{reason}\"}}"
        );
        assert!(metric(admin, &series) >= 1.0, "{series}");
        // The admin API's explain shows them too.
        let (ok, text, err) = curl(&[
            "-H",
            "Authorization: Bearer t",
            &format!("http://{admin}/api/v1/clusters/{cluster}/explain"),
        ]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let row = &v["tls_failures"][0];
        assert_eq!(row["member"], format!("{cluster}-1"), "{text}");
        assert_eq!(row["reason"], reason, "{text}");
        assert!(
            row["count"].as_u64() >= Some(1) && row["last_unix_ms"].as_u64() > Some(0),
            "{text}"
        );
    }

    // A TCP session over TLS to the member.
    let (ok, out, err) = curl(&[&format!("http://{tcp}/")]);
    assert!(ok, "{err}");
    assert_eq!(out, "good client=yes version=HTTP/1.1\n");
    // A TCP session to a member of the wrong name is closed, and counted like a request's.
    let (ok, out, _) = curl(&[&format!("http://{tcpwrong}/")]);
    assert!(!ok && out.is_empty(), "{out}");
    let series = "rondo_tls_member_failures_total{cluster=\"tcpwrong\",member=\"tcpwrong-1\",reason=\"not_valid_for_name\"}";
    assert!(metric(admin, series) >= 1.0, "{series}");

    // Health checks verify the same way: the wrong-name member goes down, saying why.
    serve.stderr_with(&["member down", "the last: tls: certificate not valid for the server name"]);
}

#[test]
fn check_finds_upstream_tls_problems_at_their_field() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("check CA");
    write(d, "ca.pem", &root.pem);
    let (c, k) = leaf(&root, "router", &["router.test"], true, false);
    write(d, "r.pem", &c);
    write(d, "r.key", &k);
    let (_, other) = leaf(&root, "x", &["x.test"], true, false);
    write(d, "other.key", &other);
    let config = |tls: &str| {
        format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n[[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
             [cluster.c]\nupstream_tls = {tls}\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9101\" }}]\n"
        )
    };
    for (tls, field, want) in [
        (r#"{ ca = "nope.pem" }"#, "cluster.c.upstream_tls.ca", "cannot read ca file"),
        (
            r#"{ ca = "ca.pem", server_name = "not a name" }"#,
            "cluster.c.upstream_tls.server_name",
            "is not a DNS name or IP address",
        ),
        (
            r#"{ ca = "ca.pem", cert = "r.pem" }"#,
            "cluster.c.upstream_tls.cert",
            "`cert` needs `key`",
        ),
        (
            r#"{ ca = "ca.pem", cert = "r.pem", key = "other.key" }"#,
            "cluster.c.upstream_tls.key",
            "does not match the certificate",
        ),
        (r#"{ server_name = "a.test" }"#, "cluster.c.upstream_tls.ca", "missing field `ca`"),
    ] {
        let text = config(tls);
        let errors = rondo_config::parse_str(&text, &d.join("rondo.toml"), 1).expect_err(tls);
        let e = &errors.errors[0];
        assert_eq!((errors.errors.len(), e.field.as_str()), (1, field), "{tls}: {errors:?}");
        assert!(e.message.contains(want), "{tls}: {e}");
    }
    let ok =
        config(r#"{ ca = "ca.pem", server_name = "api.internal", cert = "r.pem", key = "r.key" }"#);
    let c = rondo_config::parse_str(&ok, &d.join("rondo.toml"), 1).unwrap();
    let tls = c.view.clusters["c"].upstream_tls.clone().unwrap();
    assert_eq!(tls.ca, d.join("ca.pem"));
    assert_eq!(tls.server_name.as_deref(), Some("api.internal"));
    assert_eq!(tls.key, Some(d.join("r.key")));
}

// A tcp listener routes TLS connections by the ClientHello's server name without terminating
// them: each member does its own handshake (curl verifies the member's certificate); a client
// without TLS goes to the route without `sni`.
#[test]
fn tcp_listener_routes_tls_by_sni_without_terminating() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("passthrough CA");
    write(d, "ca.pem", &root.pem);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let a = leaf(&root, "a.test", &["a.test"], false, false);
    let b = leaf(&root, "b wildcard", &["*.b.test"], false, false);
    let m_a = tls_member(&rt, "member-a", (&a.0, &a.1), None);
    let m_b = tls_member(&rt, "member-b", (&b.0, &b.1), None);
    let (_plain, m_plain) = start_member("plain", "127.0.0.1:0");
    let config = format!(
        "[[listener]]\nname = \"pass\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
         [[route]]\nlistener = \"pass\"\ncluster = \"plain\"\n\n\
         [[route]]\nlistener = \"pass\"\nmatch = {{ sni = \"a.test\" }}\ncluster = \"a\"\n\n\
         [[route]]\nlistener = \"pass\"\nmatch = {{ sni = \"*.b.test\" }}\ncluster = \"b\"\n\n\
         [cluster.a]\nupstream_protocol = \"tcp\"\nmembers = [{{ name = \"a1\", address = \"{m_a}\" }}]\n\
         [cluster.b]\nupstream_protocol = \"tcp\"\nmembers = [{{ name = \"b1\", address = \"{m_b}\" }}]\n\
         [cluster.plain]\nupstream_protocol = \"tcp\"\nmembers = [{{ name = \"p1\", address = \"{m_plain}\" }}]\n"
    );
    let path = write(d, "rondo.toml", &config);
    let check =
        Command::new(BIN).args(["check", "--strict", path.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut serve = Serve::start(&path);
    let port = serve.addr("pass").port();
    let ca_path = d.join("ca.pem").to_str().unwrap().to_owned();
    for (host, want) in [("a.test", "member-a"), ("x.b.test", "member-b")] {
        let resolve = format!("{host}:{port}:127.0.0.1");
        let (ok, out, err) = curl(&[
            "--http1.1",
            "--cacert",
            &ca_path,
            "--resolve",
            &resolve,
            &format!("https://{host}:{port}/"),
        ]);
        assert!(ok, "{host}: {err}");
        assert_eq!(out, format!("{want} client=no version=HTTP/1.1\n"), "{host}");
    }
    // Plain HTTP: no ClientHello, the route without `sni`.
    let (ok, out, err) = curl(&[&format!("http://127.0.0.1:{port}/")]);
    assert!(ok, "{err}");
    assert_eq!(out, "plain\n");
    // A name no route has: the route without `sni` too (a plain member: the handshake fails).
    let resolve = format!("c.test:{port}:127.0.0.1");
    let (ok, _, _) =
        curl(&["--cacert", &ca_path, "--resolve", &resolve, &format!("https://c.test:{port}/")]);
    assert!(!ok);
}

// A tcp listener with `tls` terminates it and splices the plaintext to a plain member; a config
// reload that names a TLS file that does not load is rejected whole, saying why, and the running
// configuration stays.
#[test]
fn tcp_termination_and_a_reload_with_a_bad_tls_file_keeps_the_old_state() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let config = format!(
        "[[listener]]\nname = \"tls-tcp\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         tls = {{ certs = [ {{ cert = \"a.pem\", key = \"a.key\" }} ] }}\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"tls-tcp\"\ncluster = \"t\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.t]\nupstream_protocol = \"tcp\"\nmembers = [{{ name = \"t1\", address = \"{member}\" }}]\n\n\
         [cluster.c]\nmembers = [{{ name = \"c1\", address = \"{member}\" }}]\n"
    );
    let path = write(&s.dir.0, "rondo.toml", &config);
    let mut serve = Serve::start(&path);
    let port = serve.addr("tls-tcp").port();
    let web = serve.addr("web");
    let resolve = format!("a.test:{port}:127.0.0.1");
    let (ok, out, err) = curl(&[
        "--cacert",
        &s.path("ca.pem"),
        "--resolve",
        &resolve,
        &format!("https://a.test:{port}/"),
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "m1\n");

    // The new config sends cluster `c` to members over TLS with a CA file that is not there.
    let bad = config
        .replace("[cluster.c]\n", "[cluster.c]\nupstream_tls = { ca = \"missing-ca.pem\" }\n");
    std::fs::write(&path, bad).unwrap();
    serve.stderr_with(&["config reload (file change) rejected", "cannot read ca file"]);
    let (ok, out, err) = curl(&[&format!("http://{web}/")]);
    assert!(ok, "{err}");
    assert_eq!(out, "m1\n", "the old view (plain to members) stays");
}

// A TLS listener at its connection limit closes new connections at once instead of writing the
// plain-text 503 the plain listeners send, which a TLS client could not read.
#[test]
fn a_tls_listener_at_its_limit_closes_without_plain_text() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let config = std::fs::read_to_string(s.config(member, 10_000)).unwrap().replacen(
        "name = \"opt\"\n",
        "name = \"opt\"\nmax_connections = 1\n",
        1,
    );
    let path = write(&s.dir.0, "limited.toml", &config);
    let mut serve = Serve::start(&path);
    let addr = serve.addr("opt");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let config = client_config(&[&s.ca.pem], None);
        let mut held = Conn::open(addr, "a.test", config).await.unwrap();
        assert_eq!(held.get("/", &[]).await.unwrap().0, 200);
        let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(10), over.read_to_end(&mut got)).await;
        assert!(r.is_ok(), "the connection over the limit was left open");
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
        assert_eq!(held.get("/", &[]).await.unwrap().0, 200);
    });
}

// ---------------------------------------------------------------------------------------------
// gRPC over TLS.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
struct HelloRequest {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HelloReply {
    #[prost(string, tag = "1")]
    message: String,
}

/// A gRPC member over h2c answering `/test.Greeter/Hello` with `hello NAME over VERSION`.
fn grpc_member(rt: &tokio::runtime::Runtime) -> SocketAddr {
    use bytes::{Buf, BufMut};
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let version = req.version();
                        let mut body = req.into_body().collect().await.unwrap().to_bytes();
                        assert_eq!(body.get_u8(), 0);
                        let len = body.get_u32() as usize;
                        let hello = <HelloRequest as prost::Message>::decode(&body[..len]).unwrap();
                        let reply = HelloReply {
                            message: format!("hello {} over {version:?}", hello.name),
                        };
                        let encoded = prost::Message::encode_to_vec(&reply);
                        let mut frame = bytes::BytesMut::new();
                        frame.put_u8(0);
                        frame.put_u32(encoded.len() as u32);
                        frame.put_slice(&encoded);
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let body = http_body_util::StreamBody::new(futures_util::stream::iter([
                            Ok::<_, std::convert::Infallible>(http_body::Frame::data(
                                frame.freeze(),
                            )),
                            Ok(http_body::Frame::trailers(trailers)),
                        ]));
                        let resp = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(body)
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
            });
        }
    });
    addr
}

/// A TLS connection to the router as hyper-util's client pool wants it.
struct TlsIo(TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>);

impl hyper::rt::Read for TlsIo {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl hyper_util::client::legacy::connect::Connection for TlsIo {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

/// Connects every request to the router's `addr` over TLS for `a.test`, offering ALPN `h2`.
#[derive(Clone)]
struct ToRouter {
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for ToRouter {
    type Response = TlsIo;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<TlsIo, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect(this.addr).await?;
            let name = ServerName::try_from("a.test".to_owned())?;
            let tls = tokio_rustls::TlsConnector::from(this.config).connect(name, tcp).await?;
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "ALPN h2");
            Ok(TlsIo(TokioIo::new(tls)))
        })
    }
}

// A gRPC client speaks HTTP/2 over TLS (ALPN h2) to the router, which sends the calls on to an
// HTTP/2 member.
#[test]
fn grpc_over_tls_reaches_an_http2_member() {
    let s = Setup::new();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let member = grpc_member(&rt);
    let config = std::fs::read_to_string(s.config(member, 10_000))
        .unwrap()
        .replace("[cluster.c]\n", "[cluster.c]\nupstream_protocol = \"http2\"\n");
    let path = write(&s.dir.0, "grpc.toml", &config);
    let mut serve = Serve::start(&path);
    let addr = serve.addr("opt");
    rt.block_on(async {
        let mut tls = (*client_config(&[&s.ca.pem], None)).clone();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let connector = ToRouter { addr, config: Arc::new(tls) };
        let client: hyper_util::client::legacy::Client<ToRouter, tonic::body::Body> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build(connector);
        let mut grpc =
            tonic::client::Grpc::with_origin(client, http::Uri::from_static("https://a.test"));
        let path = http::uri::PathAndQuery::from_static("/test.Greeter/Hello");
        for i in 0..5 {
            grpc.ready().await.unwrap();
            let request = tonic::Request::new(HelloRequest { name: format!("caller{i}") });
            let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                grpc.unary(request, path.clone(), codec),
            )
            .await
            .expect("in time")
            .expect("gRPC call");
            assert_eq!(reply.into_inner().message, format!("hello caller{i} over HTTP/2.0"));
        }
    });
}

// The HTTP/2 frame checks sit above TLS: a PING of 6 bytes sent over TLS (ALPN h2) gets GOAWAY
// FRAME_SIZE_ERROR, encrypted, and the connection ends.
#[test]
fn http2_frame_checks_work_over_tls() {
    let s = Setup::new();
    let (_m, member) = start_member("m1", "127.0.0.1:0");
    let mut serve = Serve::start(&s.config(member, 10_000));
    let addr = serve.addr("opt");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut config = (*client_config(&[&s.ca.pem], None)).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("a.test".to_owned()).unwrap();
        let mut tls =
            tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let frame = |kind: u8, payload: &[u8]| {
            let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
            f.extend([kind, 0, 0, 0, 0, 0]);
            f.extend(payload);
            f
        };
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(4, &[])); // SETTINGS
        hello.extend(frame(6, &[0; 6])); // PING of 6 bytes
        tls.write_all(&hello).await.unwrap();
        let mut codes = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let mut head = [0u8; 9];
                if tls.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let mut payload = vec![0u8; len];
                if tls.read_exact(&mut payload).await.is_err() {
                    return;
                }
                if head[3] == 7 && len >= 8 {
                    codes.push(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "connection left open");
        assert_eq!(codes, [6], "GOAWAY FRAME_SIZE_ERROR");
    });
}

// Connections to a TLS member are pooled: sequential requests from separate clients share one
// TLS connection (one handshake), as with plain members.
#[test]
fn connections_to_tls_members_are_pooled() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("pool CA");
    write(d, "ca.pem", &root.pem);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cert = leaf(&root, "pool.internal", &["pool.internal"], false, false);
    let member = tls_member(&rt, "pooled", (&cert.0, &cert.1), None);
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nupstream_tls = {{ ca = \"ca.pem\", server_name = \"pool.internal\" }}\n\
         members = [{{ name = \"p1\", address = \"{member}\" }}]\n"
    );
    let path = write(d, "rondo.toml", &config);
    let mut serve = Serve::start(&path);
    let web = serve.addr("web");
    for _ in 0..10 {
        let (ok, out, err) = curl(&[&format!("http://{web}/")]);
        assert!(ok, "{err}");
        assert_eq!(out, "pooled client=no version=HTTP/1.1\n");
    }
    assert_eq!(POOLED_HANDSHAKES.load(Ordering::Relaxed), 1);
}

// A new TLS connection to a member resumes the session of an earlier one (rustls's session
// cache in the cluster's client configuration): a member closing after every response sees one
// full handshake, then resumed ones.
#[test]
fn new_connections_to_a_tls_member_resume_the_session() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("resume CA");
    write(d, "ca.pem", &root.pem);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cert = leaf(&root, "resume.internal", &["resume.internal"], false, false);
    let member = tls_member(&rt, "resume", (&cert.0, &cert.1), None);
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nupstream_tls = {{ ca = \"ca.pem\", server_name = \"resume.internal\" }}\n\
         members = [{{ name = \"r1\", address = \"{member}\" }}]\n"
    );
    let path = write(d, "rondo.toml", &config);
    let mut serve = Serve::start(&path);
    let web = serve.addr("web");
    for _ in 0..4 {
        let (ok, out, err) = curl(&[&format!("http://{web}/")]);
        assert!(ok, "{err}");
        assert_eq!(out, "resume client=no version=HTTP/1.1\n");
    }
    let kinds = RESUME_KINDS.lock().unwrap().clone();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert_eq!(kinds[0], "Some(Full)", "{kinds:?}");
    assert!(kinds[1..].iter().all(|k| k == "Some(Resumed)"), "{kinds:?}");
}

// ---------------------------------------------------------------------------------------------
// The control plane over TLS: the admin API, the naming service, the agents' first contact;
// `rondo ctl`, `rondo agent` and the client library as their TLS clients.
// ---------------------------------------------------------------------------------------------

fn ctl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("ctl")
        .args(args)
        .env_remove("RONDO_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run rondo ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// The admin API, the naming service and the agent receiver each serve TLS with the `tls` table
// of a listener: curl, `rondo ctl`, `rondo agent` and the client library reach them with the
// CA; a wrong CA or name is refused naming the host and why; client certificates are asked for
// as configured; plain HTTP gets no answer; a new certificate is taken without a restart and a
// bad one keeps the old.
#[test]
fn admin_naming_and_agent_speak_tls_to_ctl_agent_and_the_client_library() {
    let dir = TempDir::new("tls-control");
    let d = &dir.0;
    let ca_ = ca("control CA");
    let other = ca("other CA");
    write(d, "ca.pem", &ca_.pem);
    write(d, "other-ca.pem", &other.pem);
    let (c, k) = leaf(&ca_, "control", &["control.test", "127.0.0.1"], false, false);
    write(d, "control.pem", &c);
    write(d, "control.key", &k);
    let (c, k) = leaf(&ca_, "alice", &["alice.clients.test"], true, false);
    write(d, "alice.pem", &c);
    write(d, "alice.key", &k);
    let config = "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"t\"\n\
        tls = { certs = [ { cert = \"control.pem\", key = \"control.key\" } ], client_ca = \"ca.pem\", client_auth = \"required\" }\n\n\
        [naming]\nlisten = \"127.0.0.1:0\"\n\
        tls = { certs = [ { cert = \"control.pem\", key = \"control.key\" } ], client_ca = \"ca.pem\", client_auth = \"required\" }\n\n\
        [agent]\nlisten = \"127.0.0.1:0\"\nkey = \"k\"\n\
        tls = { certs = [ { cert = \"control.pem\", key = \"control.key\" } ], client_ca = \"ca.pem\", client_auth = \"required\" }\n\n\
        [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
        [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
        [cluster.c]\nalgorithm = \"least-sessions\"\nmembers = [{ name = \"m1\", address = \"127.0.0.1:9\" }]\n";
    let path = write(d, "rondo.toml", config);
    let check = Command::new(BIN).args(["check", path.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut serve = Serve::start(&path);
    let line = serve.proc.line_with("agent receiver on", Duration::from_secs(10));
    assert!(line.ends_with("(tcp and udp, tls on tcp)"), "{line}");
    let agent_addr: SocketAddr =
        line.split(' ').skip_while(|w| *w != "on").nth(1).and_then(|a| a.parse().ok()).unwrap();
    let admin = serve.proc.addr_after("admin API on");
    let dashboard = serve.proc.line_with("dashboard on", Duration::from_secs(10));
    assert!(dashboard.contains(&format!("https://{admin}/")), "{dashboard}");
    let naming = serve.proc.addr_after("naming API");
    let ca_file = d.join("ca.pem");
    let ca_file = ca_file.to_str().unwrap();
    let alice = (d.join("alice.pem"), d.join("alice.key"));
    let (alice_cert, alice_key) = (alice.0.to_str().unwrap(), alice.1.to_str().unwrap());
    // The admin API requires a client certificate: curl's and ctl's options for alice's.
    let curl_id = ["--cert", alice_cert, "--key", alice_key];
    let ctl_id = ["--tls-cert", alice_cert, "--tls-key", alice_key];

    // The admin API: curl with the CA; plain HTTP gets no answer.
    let url = format!("https://{admin}/api/v1/status");
    let (ok, out, err) = curl(
        &[&curl_id[..], &["--cacert", ca_file, "-H", "Authorization: Bearer t", &url]].concat(),
    );
    assert!(ok && out.contains("\"view\""), "{out} {err}");
    let (_, out, _) =
        curl(&["-H", "Authorization: Bearer t", &format!("http://{admin}/api/v1/status")]);
    assert!(!out.contains("\"view\""), "plain http answered: {out}");

    // rondo ctl: https with --tls-ca; a wrong CA and a wrong name are refused saying why.
    let https = format!("https://{admin}");
    let (ok, out, err) =
        ctl(&[&ctl_id[..], &["--admin", &https, "--tls-ca", ca_file, "--token", "t", "status"]]
            .concat());
    assert!(ok && out.starts_with("view "), "{out} {err}");
    // Without its certificate ctl is refused, and says so.
    let (ok, _, err) = ctl(&["--admin", &https, "--tls-ca", ca_file, "--token", "t", "status"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("tls to {admin}: the server refused the handshake"))
            && err.contains("client certificate"),
        "{err}"
    );
    let other_ca = d.join("other-ca.pem");
    let (ok, _, err) =
        ctl(&["--admin", &https, "--tls-ca", other_ca.to_str().unwrap(), "--token", "t", "status"]);
    assert!(!ok, "a wrong ca was accepted");
    assert!(
        err.contains(&format!("tls to {admin}: certificate not signed by a ca in"))
            && err.contains("other-ca.pem"),
        "{err}"
    );
    let (ok, _, err) = ctl(&[
        "--admin",
        &https,
        "--tls-ca",
        ca_file,
        "--tls-server-name",
        "wrong.test",
        "--token",
        "t",
        "status",
    ]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "tls to {admin}: certificate not valid for wrong.test (it is for control.test, 127.0.0.1)"
        )),
        "{err}"
    );
    let (ok, _, err) = ctl(&["--admin", &https, "--token", "t", "status"]);
    assert!(!ok && err.contains("needs --tls-ca"), "{err}");

    // The naming service requires a client certificate.
    let services = format!("https://{naming}/v1/services/c");
    let (ok, out, err) = curl(&[
        "--cacert",
        ca_file,
        "--cert",
        alice.0.to_str().unwrap(),
        "--key",
        alice.1.to_str().unwrap(),
        &services,
    ]);
    assert!(ok && out.contains("\"members\""), "{out} {err}");
    let (ok, out, _) = curl(&["--cacert", ca_file, &services]);
    assert!(!ok && !out.contains("\"members\""), "served without a client certificate: {out}");

    // The client library over https, with and without its certificate.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tls = rondo_client::TlsConfig::with_identity_files(ca_file, &alice.0, &alice.1)
            .expect("tls config");
        let client = rondo_client::Client::builder("c")
            .endpoint(format!("https://{naming}"))
            .tls(tls)
            .connect()
            .await
            .expect("bootstrap over https");
        assert_eq!(client.members().len(), 1);
        let e = rondo_client::Client::builder("c")
            .endpoint(format!("https://{naming}"))
            .tls(rondo_client::TlsConfig::from_ca_file(&other_ca).unwrap())
            .connect()
            .await
            .expect_err("a wrong ca");
        let text = e.to_string();
        assert!(
            text.contains(&format!("tls to {naming}: certificate not signed by a ca in")),
            "{text}"
        );
        let e = rondo_client::Client::builder("c")
            .endpoint(format!("https://{naming}"))
            .connect()
            .await
            .expect_err("https without tls settings");
        assert!(e.to_string().contains("Builder::tls"), "{e}");
    });

    // rondo agent's hello over TLS, with its client certificate.
    let mut agent = Proc::from_child(
        Command::new(BIN)
            .args(["agent", "--report-to", &agent_addr.to_string(), "--tls-ca", ca_file])
            .args(ctl_id)
            .args(["--cluster", "c", "--member", "m1", "--key", "k", "--fixed-cpu", "0.25"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rondo agent"),
    );
    serve.stderr_with(&["agent accepted", "m1"]);
    agent.kill();
    for listener in ["[admin]", "[naming]", "[agent]"] {
        let series = format!("rondo_tls_handshakes_total{{listener=\"{listener}\",result=\"ok\"}}");
        let metrics = format!("https://{admin}/metrics");
        let (ok, text, err) = curl(
            &[&curl_id[..], &["--cacert", ca_file, "-H", "Authorization: Bearer t", &metrics]]
                .concat(),
        );
        assert!(ok, "{err}");
        assert!(text.lines().any(|l| l.starts_with(&series)), "no {series} in\n{text}");
    }

    // A new certificate (with one more name) is taken without a restart; a bad one is refused
    // and the one in force stays.
    let (c, k) = leaf(&ca_, "control", &["control.test", "admin2.test", "127.0.0.1"], false, false);
    replace(d, "control.key", &k);
    replace(d, "control.pem", &c);
    serve.stderr_with(&["[admin]", "tls certificates reloaded"]);
    let port = admin.port();
    let resolve = format!("admin2.test:{port}:127.0.0.1");
    let url2 = format!("https://admin2.test:{port}/api/v1/status");
    let get2 = || {
        curl(
            &[
                &curl_id[..],
                &[
                    "--cacert",
                    ca_file,
                    "--resolve",
                    &resolve,
                    "-H",
                    "Authorization: Bearer t",
                    &url2,
                ],
            ]
            .concat(),
        )
    };
    let (ok, out, err) = get2();
    assert!(ok && out.contains("\"view\""), "{out} {err}");
    replace(d, "control.pem", "not a certificate\n");
    serve.stderr_with(&[
        "[admin]",
        "tls reload (file change) rejected",
        "holds no PEM certificate",
    ]);
    let (ok, out, err) = get2();
    assert!(ok && out.contains("\"view\""), "{out} {err}");
}

// The client library reaches members that speak TLS through its tower layer over a hyper-util
// client with `TlsConfig::connector`: `https://service/...` goes to `https://member/...`,
// verified for the configured server name; a member with a certificate of another name fails
// the call naming the host and why.
#[test]
fn the_client_library_reaches_tls_members() {
    use tower::{Layer, Service};
    let dir = TempDir::new("tls-client");
    let d = &dir.0;
    let members_ca = ca("members CA");
    write(d, "members-ca.pem", &members_ca.pem);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let good = leaf(&members_ca, "api.internal", &["api.internal"], false, false);
    let wrong = leaf(&members_ca, "other", &["other.internal"], false, false);
    let m_good = tls_member(&rt, "good", (&good.0, &good.1), None);
    let m_wrong = tls_member(&rt, "wrong", (&wrong.0, &wrong.1), None);
    let config = format!(
        "[naming]\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"api\"\n\n\
         [cluster.api]\nmembers = [{{ name = \"good-1\", address = \"{m_good}\" }}]\n\n\
         [cluster.bad]\nmembers = [{{ name = \"wrong-1\", address = \"{m_wrong}\" }}]\n"
    );
    let path = write(d, "rondo.toml", &config);
    let mut serve = Serve::start(&path);
    let naming = serve.proc.addr_after("naming API");
    let ca_file = d.join("members-ca.pem");
    rt.block_on(async {
        let tls = rondo_client::TlsConfig::from_ca_file(&ca_file)
            .unwrap()
            .server_name("api.internal")
            .unwrap();
        for (service, want) in
            [("api", Ok("good client=no")), ("bad", Err("certificate not valid for api.internal"))]
        {
            let client = rondo_client::Client::builder(service)
                .endpoint(naming.to_string())
                .connect()
                .await
                .expect("bootstrap");
            let http: hyper_util::client::legacy::Client<_, rondo_client::SlotBody<Empty<Bytes>>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build(tls.connector());
            let mut svc = client.layer().layer(http);
            let req = http::Request::get(format!("https://{service}/hello"))
                .body(Empty::<Bytes>::new())
                .unwrap();
            let got = tokio::time::timeout(Duration::from_secs(10), svc.call(req)).await.unwrap();
            match (got, want) {
                (Ok(resp), Ok(body)) => {
                    let text = resp.into_body().collect().await.unwrap().to_bytes();
                    assert!(String::from_utf8_lossy(&text).starts_with(body), "{text:?}");
                }
                (Err(e), Err(why)) => {
                    let mut text = e.to_string();
                    let mut cur = std::error::Error::source(&*e);
                    while let Some(s) = cur {
                        text.push_str(&format!(": {s}"));
                        cur = s.source();
                    }
                    assert!(text.contains(&format!("tls to {m_wrong}: {why}")), "{text}");
                }
                (Ok(r), Err(_)) => panic!("{service}: answered {}", r.status()),
                (Err(e), Ok(_)) => panic!("{service}: {e}"),
            }
        }
    });
}

// `[admin]`, `[naming]` and `[agent]` take the `tls` table of a listener, checked the same way:
// each problem at the field that names it.
#[test]
fn check_finds_control_plane_tls_problems_at_their_field() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("check CA");
    let (c, k) = leaf(&root, "a.test", &["a.test"], false, false);
    write(d, "a.pem", &c);
    write(d, "a.key", &k);
    let (_, other_key) = leaf(&root, "b.test", &["b.test"], false, false);
    write(d, "other.key", &other_key);
    write(d, "ca.pem", &root.pem);
    let text = "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"t\"\n\
        tls = { certs = [ { cert = \"missing.pem\", key = \"a.key\" } ] }\n\n\
        [naming]\nlisten = \"127.0.0.1:0\"\n\
        tls = { certs = [ { cert = \"a.pem\", key = \"a.key\" } ], client_auth = \"required\" }\n\n\
        [agent]\nkey = \"k\"\n\
        tls = { certs = [ { cert = \"a.pem\", key = \"other.key\" } ], client_ca = \"ca.pem\" }\n";
    let errors = rondo_config::parse_str(text, &d.join("rondo.toml"), 1).expect_err("errors");
    let found: Vec<(String, String)> =
        errors.errors.iter().map(|e| (e.field.clone(), e.message.clone())).collect();
    for (field, want) in [
        ("admin.tls.certs[0].cert", "cannot read certificate file"),
        ("naming.tls.client_auth", "needs `client_ca`"),
        ("agent.tls.certs[0].key", "does not match the certificate"),
    ] {
        assert!(
            found.iter().any(|(f, m)| f == field && m.contains(want)),
            "no {field}: {want} in {found:#?}"
        );
    }
    // A `client_ca` that asks for nothing is a warning there too.
    let ok = "[agent]\nkey = \"k\"\n\
        tls = { certs = [ { cert = \"a.pem\", key = \"a.key\" } ], client_ca = \"ca.pem\" }\n";
    let config = rondo_config::parse_str(ok, &d.join("rondo.toml"), 1).expect("valid");
    assert!(
        config.warnings.iter().any(|w| w.as_warning().contains("agent.tls.client_ca")),
        "{:?}",
        config.warnings.iter().map(|w| w.as_warning()).collect::<Vec<_>>()
    );
}

// A `queue` listener terminates TLS (a required client certificate, reloadable files, ALPN
// http/1.1): curl posts messages over HTTPS with a certificate, and the messages are delivered
// over mTLS to a member of an `upstream_tls` cluster, carrying what the poster's certificate
// says (forged copies dropped); a client without a certificate gets no message in; a cluster
// whose member's certificate is for another name dead-letters the message with the TLS reason.
#[test]
fn queue_listeners_take_messages_over_mtls_and_deliver_them_to_tls_members() {
    let s = Setup::new();
    let d = &s.dir.0;
    let members_ca = ca("members CA");
    write(d, "members-ca.pem", &members_ca.pem);
    let (rc, rk) = leaf(&s.ca, "router", &["router.internal"], true, false);
    write(d, "router.pem", &rc);
    write(d, "router.key", &rk);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let good = leaf(&members_ca, "api.internal", &["api.internal"], false, false);
    let wrong = leaf(&members_ca, "other", &["other.internal"], false, false);
    // The member requires the router's certificate (signed by the test CA).
    let m_good = tls_member(&rt, "record", (&good.0, &good.1), Some(&s.ca.pem));
    let m_wrong = tls_member(&rt, "wrong", (&wrong.0, &wrong.1), None);
    let tls_to = r#"upstream_tls = { ca = "members-ca.pem", server_name = "api.internal", cert = "router.pem", key = "router.key" }"#;
    let config = format!(
        r#"
[admin]
listen = "127.0.0.1:0"
token = "t"

[[listener]]
name = "intake"
listen = "127.0.0.1:0"
protocol = "queue"
tls = {{ certs = [ {{ cert = "a.pem", key = "a.key" }} ], client_ca = "ca.pem", client_auth = "required" }}

[[route]]
listener = "intake"
match = {{ path_prefix = "/queues/orders" }}
cluster = "good"

[[route]]
listener = "intake"
match = {{ path_prefix = "/queues/misnamed" }}
cluster = "wrong"

[cluster.good]
{tls_to}
members = [{{ name = "good-1", address = "{m_good}" }}]

[cluster.wrong]
{tls_to}
members = [{{ name = "wrong-1", address = "{m_wrong}" }}]

[[queue]]
name = "orders"
directory = "{store}"

[[queue]]
name = "misnamed"
directory = "{store}"
max_attempts = 1
"#,
        store = d.join("store").display()
    );
    let path = write(d, "rondo.toml", &config);
    let check = Command::new(BIN).args(["check", path.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let mut serve = Serve::start(&path);
    let admin = serve.proc.addr_after("admin API on");
    let intake = serve.addr("intake");
    let port = intake.port();
    let resolve = format!("a.test:{port}:127.0.0.1");
    let post = |queue: &str, cert: bool| {
        let url = format!("https://a.test:{port}/queues/{queue}");
        let mut args = vec![
            "--cacert".to_owned(),
            s.path("ca.pem"),
            "--resolve".to_owned(),
            resolve.clone(),
            "-H".to_owned(),
            "x-client-cert-subject: CN=mallory".to_owned(),
            "--data".to_owned(),
            "one order".to_owned(),
            "-w".to_owned(),
            "\n%{http_code}".to_owned(),
        ];
        if cert {
            args.extend(["--cert".to_owned(), s.path("alice.pem")]);
            args.extend(["--key".to_owned(), s.path("alice.key")]);
        }
        args.push(url);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(&args)
    };

    let (ok, out, err) = post("orders", true);
    assert!(ok, "{err}");
    let (body, code) = out.rsplit_once('\n').unwrap();
    assert_eq!(code, "202", "{body}");
    let id =
        serde_json::from_str::<serde_json::Value>(body).unwrap()["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    while RECORDED.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the message never reached the member");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        RECORDED.lock().unwrap().clone(),
        [format!(
            "POST /queues/orders subject=CN=alice san=DNS:alice.clients.test proto=https \
             key={id} client=yes"
        )]
    );

    // No certificate: refused in the handshake, nothing accepted.
    let (ok, _, _) = post("orders", false);
    assert!(!ok, "a client without a certificate got a message in");

    // A member whose certificate is for another name: the attempt fails with the TLS reason,
    // and with `max_attempts = 1` the message is a dead letter saying so.
    let (ok, out, err) = post("misnamed", true);
    assert!(ok && out.ends_with("202"), "{out} {err}");
    let dead = |path: &str| {
        let (ok, out, err) =
            curl(&["-H", "authorization: Bearer t", &format!("http://{admin}{path}")]);
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let letters = loop {
        let v = dead("/api/v1/queues/misnamed/dead");
        if !v["dead_letters"].as_array().unwrap().is_empty() {
            break v;
        }
        assert!(Instant::now() < deadline, "no dead letter: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let one = dead(&format!(
        "/api/v1/queues/misnamed/dead/{}",
        letters["dead_letters"][0]["id"].as_str().unwrap()
    ));
    let reason = one["tries"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("wrong/wrong-1: tls: certificate not valid for the server name"),
        "{reason}"
    );
    let series = "rondo_tls_member_failures_total{cluster=\"wrong\",member=\"wrong-1\",reason=\"not_valid_for_name\"}";
    assert!(metric(admin, series) >= 1.0, "{series}");
    assert_eq!(RECORDED.lock().unwrap().len(), 1, "the wrong member is not the recording one");
    drop(rt);
}

// PROXY protocol to TLS members (issue 38 item 1): the header goes before the handshake, and a
// member connection opened for one client never carries another's request. The member is a real
// HAProxy (`accept-proxy ssl`) answering each request with the source address its connection's
// PROXY header named; two clients on other loopback addresses take turns.
#[test]
fn proxy_headers_reach_tls_members_per_client() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let root = ca("pp CA");
    write(d, "ca.pem", &root.pem);
    let (cert, key) = leaf(&root, "pp.internal", &["pp.internal"], false, false);
    let pem = write(d, "member.pem", &format!("{cert}{key}"));
    let port = common::free_port();
    let cfg = write(
        d,
        "haproxy.cfg",
        &format!(
            "global\n  maxconn 100\ndefaults\n  mode http\n  timeout connect 5s\n  \
             timeout client 10s\n  timeout server 10s\nfrontend f\n  \
             bind 127.0.0.1:{port} accept-proxy ssl crt {}\n  \
             http-request return status 200 content-type text/plain lf-string \"%[src]\"\n",
            pem.display()
        ),
    );
    let mut haproxy = Command::new("haproxy")
        .arg("-f")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start haproxy");
    let member: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(member).is_err() {
        assert!(Instant::now() < deadline, "haproxy did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nproxy_protocol = \"v2\"\n\
         upstream_tls = {{ ca = \"ca.pem\", server_name = \"pp.internal\" }}\n\
         members = [{{ name = \"h\", address = \"{member}\" }}]\n"
    );
    let path = write(d, "rondo.toml", &config);
    let mut serve = Serve::start(&path);
    let web = serve.addr("web");
    for from in ["127.0.0.5", "127.0.0.9", "127.0.0.5", "127.0.0.9"] {
        let (ok, out, err) = curl(&["--interface", from, &format!("http://{web}/")]);
        assert!(ok, "{err}");
        assert_eq!(out, from, "the member was told another client's address");
    }
    let _ = haproxy.kill();
    let _ = haproxy.wait();
}
