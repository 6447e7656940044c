//! Real handshakes on 127.0.0.1 between rondo-tls's [`Connector`] and a rustls server holding
//! certificates made with rcgen: what succeeds, and the sentence each kind of failure becomes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rondo_tls::{ClientFiles, Connector, describe_rustls, rustls_in};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

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

/// A leaf (certificate PEM, key PEM) signed by `ca` for `names`; a client certificate when
/// `client`; expired in 2001 when `expired`.
fn leaf(ca: &Ca, names: &[&str], client: bool, expired: bool) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.extended_key_usages = vec![if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    if expired {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A fresh directory for one test's files, removed when the test ends.
struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(test: &str) -> TestDir {
    let d = std::env::temp_dir().join(format!("rondo-tls-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TestDir(d)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A TLS server on 127.0.0.1 for one connection: it serves `leaf`, asks for a client
/// certificate signed by `client_ca` when given, and answers `hello` after the handshake.
async fn server(leaf: &(String, String), client_ca: Option<&Ca>) -> SocketAddr {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(leaf.0.as_bytes()).collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_slice(leaf.1.as_bytes()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(rondo_tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                rondo_tls::crypto_provider(),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        if let Ok(mut tls) = acceptor.accept(tcp).await {
            let _ = tls.write_all(b"hello").await;
            let _ = tls.shutdown().await;
        }
    });
    addr
}

/// A plain TCP server for one connection that writes `answer` and closes its side, then reads
/// until the client closes (so that the client sees an end, not a reset for unread bytes).
async fn plain_server(answer: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let _ = tcp.write_all(answer).await;
        let _ = tcp.shutdown().await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(LIMIT, tcp.read_to_end(&mut sink)).await;
    });
    addr
}

/// Connects `connector` to `addr` and reads what the server says; the error text otherwise.
async fn exchange(connector: &Connector, addr: SocketAddr) -> Result<String, String> {
    let target = addr.to_string();
    let run = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let mut tls =
            connector.connect(tcp, "127.0.0.1", &target).await.map_err(|e| e.to_string())?;
        let mut got = String::new();
        // With TLS 1.3 a server refuses a client certificate after the client's side of the
        // handshake is done: the alert comes with the first read.
        tls.read_to_string(&mut got).await.map_err(|e| match rustls_in(&e) {
            Some(t) => format!(
                "tls to {target}: {}",
                describe_rustls(t, connector.name_for("127.0.0.1"), connector.roots())
            ),
            None => e.to_string(),
        })?;
        Ok(got)
    };
    tokio::time::timeout(LIMIT, run).await.expect("the exchange finishes in time")
}

fn files(ca: &Path) -> ClientFiles {
    ClientFiles { ca: ca.to_owned(), ..ClientFiles::default() }
}

#[tokio::test]
async fn a_certificate_for_the_address_verifies() {
    let d = dir("ok");
    let ca = ca("test ca");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let addr = server(&leaf(&ca, &["127.0.0.1"], false, false), None).await;
    let c = Connector::load(&files(&ca_file), &[]).unwrap();
    assert_eq!(exchange(&c, addr).await, Ok("hello".to_owned()));
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_naming_both() {
    let d = dir("name");
    let ca = ca("test ca");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let addr = server(&leaf(&ca, &["api.test", "web.test"], false, false), None).await;
    let c = Connector::load(&files(&ca_file), &[]).unwrap();
    assert_eq!(
        exchange(&c, addr).await,
        Err(format!(
            "tls to {addr}: certificate not valid for 127.0.0.1 (it is for api.test, web.test)"
        ))
    );
}

#[tokio::test]
async fn a_fixed_server_name_is_verified_instead_of_the_host() {
    let d = dir("server-name");
    let ca = ca("test ca");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let addr = server(&leaf(&ca, &["api.test"], false, false), None).await;
    let named = ClientFiles { server_name: Some("api.test".to_owned()), ..files(&ca_file) };
    let c = Connector::load(&named, &[]).unwrap();
    assert_eq!(c.name_for("127.0.0.1"), "api.test");
    assert_eq!(exchange(&c, addr).await, Ok("hello".to_owned()));
}

#[tokio::test]
async fn a_certificate_of_another_ca_names_the_roots() {
    let d = dir("issuer");
    let (ours, theirs) = (ca("our ca"), ca("their ca"));
    let ca_file = write(&d, "ca.pem", &ours.pem);
    let addr = server(&leaf(&theirs, &["127.0.0.1"], false, false), None).await;
    let c = Connector::load(&files(&ca_file), &[]).unwrap();
    assert_eq!(
        exchange(&c, addr).await,
        Err(format!("tls to {addr}: certificate not signed by a ca in {}", ca_file.display()))
    );
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let d = dir("expired");
    let ca = ca("test ca");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let addr = server(&leaf(&ca, &["127.0.0.1"], false, true), None).await;
    let c = Connector::load(&files(&ca_file), &[]).unwrap();
    assert_eq!(exchange(&c, addr).await, Err(format!("tls to {addr}: certificate expired")));
}

#[tokio::test]
async fn servers_that_do_not_speak_tls_are_named() {
    let d = dir("plain");
    let ca = ca("test ca");
    let c = Connector::load(&files(&write(&d, "ca.pem", &ca.pem)), &[]).unwrap();
    let http = plain_server(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
    assert_eq!(
        exchange(&c, http).await,
        Err(format!("tls to {http}: the server does not speak tls (or not tls 1.2 or 1.3)"))
    );
    let closing = plain_server(b"").await;
    assert_eq!(
        exchange(&c, closing).await,
        Err(format!(
            "tls to {closing}: the server closed the connection in the handshake (does it \
             speak tls?)"
        ))
    );
}

#[tokio::test]
async fn a_client_certificate_is_presented_when_given_and_missed_when_not() {
    let d = dir("client-cert");
    let ca = ca("test ca");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let (cert, key) = leaf(&ca, &["client.test"], true, false);
    let identity = Some((write(&d, "client.pem", &cert), write(&d, "client.key", &key)));
    let server_leaf = leaf(&ca, &["127.0.0.1"], false, false);

    let with = Connector::load(&ClientFiles { identity, ..files(&ca_file) }, &[]).unwrap();
    let addr = server(&server_leaf, Some(&ca)).await;
    assert_eq!(exchange(&with, addr).await, Ok("hello".to_owned()));

    let without = Connector::load(&files(&ca_file), &[]).unwrap();
    let addr = server(&server_leaf, Some(&ca)).await;
    let err = exchange(&without, addr).await.unwrap_err();
    assert!(
        err.starts_with(&format!("tls to {addr}: the server refused the handshake (")),
        "{err}"
    );
    assert!(err.ends_with("): it may want a client certificate it trusts"), "{err}");
}

#[test]
fn unusable_files_are_named_with_the_reason() {
    let d = dir("files");
    let ca = ca("test ca");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let junk = write(&d, "junk.pem", "not pem at all\n");
    let missing = d.join("missing.pem");
    let load = |f: ClientFiles| Connector::load(&f, &[]).map(|_| ()).unwrap_err();

    let err = load(files(&missing));
    assert!(err.starts_with(&format!("cannot read ca file {}: ", missing.display())), "{err}");
    assert_eq!(load(files(&junk)), format!("ca file {} holds no PEM certificate", junk.display()));
    let (cert, _) = leaf(&ca, &["client.test"], true, false);
    let cert = write(&d, "client.pem", &cert);
    assert_eq!(
        load(ClientFiles { identity: Some((cert.clone(), junk.clone())), ..files(&ca_file) }),
        format!("key file {} holds no PEM private key", junk.display())
    );
    assert_eq!(
        load(ClientFiles { identity: Some((junk.clone(), cert)), ..files(&ca_file) }),
        format!("certificate file {} holds no PEM certificate", junk.display())
    );
    assert_eq!(
        load(ClientFiles { server_name: Some("not a name".to_owned()), ..files(&ca_file) }),
        "server name `not a name` is not a DNS name or IP address"
    );
}

#[test]
fn alpn_is_offered_as_set() {
    let d = dir("alpn");
    let ca = ca("test ca");
    let c = Connector::load(&files(&write(&d, "ca.pem", &ca.pem)), &[b"h2"]).unwrap();
    assert_eq!(c.config().alpn_protocols, [b"h2".to_vec()]);
    let c = c.with_alpn(&[b"http/1.1", b"h2"]);
    assert_eq!(c.config().alpn_protocols, [b"http/1.1".to_vec(), b"h2".to_vec()]);
}
