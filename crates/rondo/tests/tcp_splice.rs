//! Zero-copy forwarding on `tcp` listeners (splice(2) through pooled pipes,
//! crates/rondo-proxy/src/splice.rs) against a real `rondo serve`, members on real loopback
//! sockets: multi-MiB payloads byte-exact both ways at once, half-close each way, members that
//! close and clients that reset mid-stream without a socket or pipe left behind, more sessions
//! than the pipe pool holds, and the copy fallbacks (`splice = "off"`, TLS). Which path ran is
//! read from `rondo_tcp_forwarded_bytes_total{listener,path}`, so a splice that silently never
//! runs fails here.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Proc, TempDir, free_port};

const TOKEN: &str = "t";
const MIB: usize = 1 << 20;
/// The most pipe descriptors the router may keep idle: one worker's pool of 16 pipes.
const POOL_FDS: usize = 2 * 16;
/// Longest any socket operation of a test waits, so that a stuck session fails the test.
const IO_WAIT: Duration = Duration::from_secs(30);

/// `len` deterministic bytes from `seed` (xorshift), different for each seed.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A member on a free loopback port whose every connection `serve` handles on a thread of its
/// own (the listener thread ends with the test process).
fn member(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind member");
    let addr = listener.local_addr().expect("member address");
    let serve = Arc::new(serve);
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let serve = serve.clone();
            let _ = conn.set_read_timeout(Some(IO_WAIT));
            let _ = conn.set_write_timeout(Some(IO_WAIT));
            thread::spawn(move || serve(conn));
        }
    });
    addr
}

/// Sends back what arrives; at its end of stream, ends its own.
fn echo(conn: TcpStream) {
    let mut from = conn.try_clone().expect("clone");
    let mut to = conn;
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// A `rondo serve` with one worker, tcp listener `raw` to cluster `c` of `member`.
struct Router {
    proc: Proc,
    admin: SocketAddr,
    raw: SocketAddr,
    _dir: TempDir,
}

/// Starts the router; `listener` and `cluster` are more lines of the listener and the cluster.
fn router(member: SocketAddr, listener: &str, cluster: &str, files: &[(&str, &str)]) -> Router {
    let dir = TempDir::new("splice");
    for (name, text) in files {
        std::fs::write(dir.0.join(name), text).expect("write file");
    }
    let admin = free_port();
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:{admin}\"\ntoken = \"{TOKEN}\"\n\n\
         [[listener]]\nname = \"raw\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n{listener}\n\n\
         [[route]]\nname = \"r\"\nlistener = \"raw\"\ncluster = \"c\"\n\n\
         [cluster.c]\nupstream_protocol = \"tcp\"\n{cluster}\n\
         members = [{{ name = \"m1\", address = \"{member}\" }}]\n"
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, text).expect("write config");
    let mut proc =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    let raw = proc.addr_after("listener raw on");
    let admin = proc.addr_after("admin API on");
    Router { proc, admin, raw, _dir: dir }
}

impl Router {
    /// The value of the series that starts with `series` (0 when absent).
    fn metric(&self, series: &str) -> u64 {
        let mut s = TcpStream::connect(self.admin).expect("connect to admin");
        s.set_read_timeout(Some(IO_WAIT)).expect("timeout");
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).expect("ask for metrics");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read metrics");
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// Bytes `raw` forwarded on `path` (`splice` or `copy`).
    fn forwarded(&self, path: &str) -> u64 {
        self.metric(&format!("rondo_tcp_forwarded_bytes_total{{listener=\"raw\",path=\"{path}\"}}"))
    }

    /// Waits (5 s at most) until `done` holds of the metrics, then returns (spliced, copied).
    fn forwarded_when(&self, done: impl Fn(u64, u64) -> bool) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (spliced, copied) = (self.forwarded("splice"), self.forwarded("copy"));
            if done(spliced, copied) || Instant::now() > deadline {
                return (spliced, copied);
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The router's open sockets and pipes.
    fn fds(&self) -> (usize, usize) {
        common::sockets_and_pipes(self.proc.child.id())
    }

    /// Waits until the router holds no more sockets than before, its pipes at most one pool more.
    fn assert_nothing_held(&self, before: (usize, usize)) {
        common::assert_nothing_held(self.proc.child.id(), before, POOL_FDS);
    }
}

/// A client connection to `addr` with the tests' timeouts.
fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to the router");
    s.set_read_timeout(Some(IO_WAIT)).expect("timeout");
    s.set_write_timeout(Some(IO_WAIT)).expect("timeout");
    s
}

/// Sends `data` through `addr` while reading what comes back, ends its stream after it, and
/// returns everything read until the other side's end of stream.
fn through(addr: SocketAddr, data: Arc<Vec<u8>>) -> Vec<u8> {
    let mut s = connect(addr);
    let mut w = s.try_clone().expect("clone");
    let writer = thread::spawn(move || {
        w.write_all(&data).expect("send");
        w.shutdown(Shutdown::Write).expect("shutdown");
    });
    let mut back = Vec::new();
    s.read_to_end(&mut back).expect("read the echo");
    writer.join().expect("writer");
    back
}

#[test]
fn bulk_is_spliced_byte_exact_both_ways_at_once_and_small_exchanges_copy() {
    let r = router(member(echo), "", "", &[]);
    // Three sessions at once, 8 MiB each way in each, the two directions flowing together.
    let sessions: Vec<_> = (0..3u64)
        .map(|seed| {
            let (addr, data) = (r.raw, Arc::new(payload(8 * MIB, seed)));
            thread::spawn(move || (through(addr, data.clone()) == *data, seed))
        })
        .collect();
    for s in sessions {
        let (same, seed) = s.join().expect("session");
        assert!(same, "session {seed}: the echo differs from what was sent");
    }
    let total = (3 * 2 * 8 * MIB) as u64;
    let (spliced, copied) = r.forwarded_when(|s, c| s + c >= total);
    assert_eq!(spliced + copied, total, "every byte counted once");
    // Only what came before a read filled the 16 KiB buffer is copied (the echo member writes
    // 8 KiB at a time, so a few reads may come short first): well under 1 % of the bytes.
    assert!(copied <= total / 100, "bulk went through the copy path: {copied} bytes copied");

    // A chatty session of small messages never fills the buffer: copied, no pipe taken.
    let mut s = connect(r.raw);
    let mut back = [0u8; 100];
    for i in 0..10u8 {
        s.write_all(&[i; 100]).expect("send");
        s.read_exact(&mut back).expect("echo");
        assert_eq!(back, [i; 100]);
    }
    s.shutdown(Shutdown::Write).expect("shutdown");
    assert_eq!(s.read(&mut back).expect("end of stream"), 0);
    let (spliced_after, copied_after) = r.forwarded_when(|_, c| c >= copied + 2000);
    assert_eq!((spliced_after, copied_after), (spliced, copied + 2000));
}

#[test]
fn half_close_each_way_keeps_the_other_direction_flowing() {
    // The client ends its stream first; the member answers after it has seen that end.
    let (got, seen) = mpsc::channel();
    let answer = Arc::new(payload(4 * MIB, 7));
    let reply = answer.clone();
    let addr = member(move |mut conn| {
        let mut all = Vec::new();
        let _ = conn.read_to_end(&mut all);
        let _ = conn.write_all(&reply);
        let _ = got.send(all);
    });
    let r = router(addr, "", "", &[]);
    let sent = Arc::new(payload(4 * MIB, 8));
    let back = through(r.raw, sent.clone());
    assert!(back == *answer, "the member's answer after the client's end of stream differs");
    assert!(seen.recv_timeout(IO_WAIT).expect("member saw the end") == *sent);

    // The member ends its stream first; the client sends after it has seen that end.
    let (got, seen) = mpsc::channel();
    let first = Arc::new(payload(4 * MIB, 9));
    let sent = first.clone();
    let addr = member(move |mut conn| {
        let _ = conn.write_all(&sent);
        let _ = conn.shutdown(Shutdown::Write);
        let mut all = Vec::new();
        let _ = conn.read_to_end(&mut all);
        let _ = got.send(all);
    });
    let r = router(addr, "", "", &[]);
    let mut s = connect(r.raw);
    let mut back = Vec::new();
    s.read_to_end(&mut back).expect("the member's bytes and its end of stream");
    assert!(back == *first, "the member's bytes differ");
    let late = payload(4 * MIB, 10);
    s.write_all(&late).expect("the client still sends after the member's end");
    s.shutdown(Shutdown::Write).expect("shutdown");
    assert!(seen.recv_timeout(IO_WAIT).expect("member got the late bytes") == late);
    let (spliced, _) = r.forwarded_when(|s, c| s + c >= (8 * MIB) as u64);
    assert!(spliced > (7 * MIB) as u64, "both directions spliced: {spliced}");
}

#[test]
fn members_closing_and_clients_resetting_mid_stream_leave_nothing_open() {
    // The member takes 1 MiB, then closes with bytes unread (a reset).
    let short = member(|mut conn| {
        let mut buf = vec![0u8; MIB];
        let _ = conn.read_exact(&mut buf);
    });
    let r = router(short, "", "", &[]);
    let before = r.fds();
    for seed in 0..10 {
        let mut s = connect(r.raw);
        let mut w = s.try_clone().expect("clone");
        let writer = thread::spawn(move || {
            // Fails once the session is gone: that is the point.
            let _ = w.write_all(&payload(16 * MIB, seed));
        });
        let mut sink = Vec::new();
        // The session ends (end of stream or reset) instead of hanging.
        let ended = s.read_to_end(&mut sink);
        assert!(
            !matches!(&ended, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "session {seed} still open after {IO_WAIT:?}"
        );
        drop(s);
        writer.join().expect("writer");
    }
    r.assert_nothing_held(before);

    // A member that streams 64 MiB; each client reads 1 MiB of it and closes with bytes unread,
    // which resets the connection mid-stream.
    let stream = member(|mut conn| {
        let chunk = payload(MIB, 3);
        for _ in 0..64 {
            if conn.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let r = router(stream, "", "", &[]);
    let before = r.fds();
    for _ in 0..40 {
        let mut s = connect(r.raw);
        s.write_all(&payload(64 * 1024, 1)).expect("send");
        let mut buf = vec![0u8; MIB];
        s.read_exact(&mut buf).expect("read 1 MiB");
        drop(s);
    }
    r.assert_nothing_held(before);
    // Sessions that failed lose their counts, but the router still serves a full one.
    let ok = member(echo);
    let r2 = router(ok, "", "", &[]);
    let data = Arc::new(payload(2 * MIB, 4));
    assert!(through(r2.raw, data.clone()) == *data);
}

#[test]
fn more_sessions_than_the_pipe_pool_holds_are_all_byte_exact() {
    let r = router(member(echo), "", "", &[]);
    let before = r.fds();
    // 40 sessions at once take 80 pipes, five times the pool.
    let sessions: Vec<_> = (0..40u64)
        .map(|seed| {
            let (addr, data) = (r.raw, Arc::new(payload(MIB, 100 + seed)));
            thread::spawn(move || through(addr, data.clone()) == *data)
        })
        .collect();
    let exact = sessions.into_iter().map(|s| s.join()).filter(|r| matches!(r, Ok(true))).count();
    assert_eq!(exact, 40, "sessions whose echo differs");
    let total = (40 * 2 * MIB) as u64;
    let (spliced, copied) = r.forwarded_when(|s, c| s + c >= total);
    assert_eq!(spliced + copied, total);
    // Each direction copies until a read fills its buffer (a few reads): nearly all is spliced.
    assert!(copied <= total / 20, "spliced {spliced} of {total}");
    r.assert_nothing_held(before);
}

#[test]
fn splice_off_copies_byte_exact() {
    let r = router(member(echo), "splice = \"off\"", "", &[]);
    let data = Arc::new(payload(8 * MIB, 21));
    assert!(through(r.raw, data.clone()) == *data, "the echo differs");
    let total = (2 * 8 * MIB) as u64;
    let (spliced, copied) = r.forwarded_when(|_, c| c >= total);
    assert_eq!((spliced, copied), (0, total));
}

#[test]
fn splice_is_checked_at_its_field() {
    let file = std::path::Path::new("rondo.toml");
    let bad = |listener: &str| {
        let text = format!(
            "[[listener]]\nname = \"raw\"\nlisten = \"127.0.0.1:0\"\n{listener}\n\n\
             [[route]]\nlistener = \"raw\"\ncluster = \"c\"\n\n\
             [cluster.c]\nupstream_protocol = \"tcp\"\nmembers = [{{ name = \"m\", address = \"127.0.0.1:9\" }}]\n"
        );
        rondo_config::parse_str(&text, file, 1).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let unknown = bad("protocol = \"tcp\"\nsplice = \"always\"");
    assert!(
        unknown.contains("rondo.toml:5:10: field `listener[0].splice`: unknown splice `always`, expected `auto` or `off`"),
        "{unknown}"
    );
    // `http` listeners splice their HTTP/1 bodies (tests/http_splice.rs); `queue` ones read them.
    let queue = bad("protocol = \"queue\"\nsplice = \"auto\"");
    assert!(
        queue.contains(
            "rondo.toml:5:10: field `listener[0].splice`: only tcp and http listeners splice"
        ),
        "{queue}"
    );
    assert_eq!(bad("protocol = \"tcp\"\nsplice = \"off\""), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_falls_back_to_copy_byte_exact() {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let made = rcgen::generate_simple_self_signed(vec!["a.test".to_owned()]).expect("certificate");
    let (cert, key) = (made.cert.pem(), made.signing_key.serialize_pem());
    let tls = "tls = { certs = [ { cert = \"a.pem\", key = \"a.key\" } ] }";
    let r = router(member(echo), tls, "", &[("a.pem", &cert), ("a.key", &key)]);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem")).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(r.raw).await.expect("connect");
    let name = ServerName::try_from("a.test").expect("name");
    let conn = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    let conn = tokio::time::timeout(IO_WAIT, conn).await.expect("in time").expect("handshake");
    let (mut rd, mut wr) = tokio::io::split(conn);
    let data = payload(4 * MIB, 31);
    let send = async {
        wr.write_all(&data).await.expect("send");
        wr.shutdown().await.expect("end of stream");
    };
    let mut back = Vec::new();
    let recv = async { rd.read_to_end(&mut back).await.expect("read the echo") };
    tokio::time::timeout(IO_WAIT, async { tokio::join!(send, recv) }).await.expect("in time");
    assert!(back == data, "the echo over tls differs");
    let total = (2 * 4 * MIB) as u64;
    let (spliced, copied) = tokio::task::block_in_place(|| r.forwarded_when(|_, c| c >= total));
    assert_eq!((spliced, copied), (0, total), "tls copies: no splice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_member_falls_back_to_copy_byte_exact() {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;

    let made = rcgen::generate_simple_self_signed(vec!["a.test".to_owned()]).expect("certificate");
    let (cert, key) = (made.cert.pem(), made.signing_key.serialize_pem());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).expect("cert")],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
        )
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind member");
    let addr = listener.local_addr().expect("member address");
    // A TLS echo member: what arrives goes back; its end of stream ends the answer.
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let (mut rd, mut wr) = tokio::io::split(tls);
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
            });
        }
    });
    let upstream = "upstream_tls = { ca = \"a.pem\", server_name = \"a.test\" }";
    let r = router(addr, "", upstream, &[("a.pem", &cert)]);
    let data = Arc::new(payload(4 * MIB, 41));
    let (raw, sent) = (r.raw, data.clone());
    let back = tokio::task::spawn_blocking(move || through(raw, sent)).await.expect("client");
    assert!(back == *data, "the echo through a tls member differs");
    let total = (2 * 4 * MIB) as u64;
    let (spliced, copied) = tokio::task::block_in_place(|| r.forwarded_when(|_, c| c >= total));
    assert_eq!((spliced, copied), (0, total), "tls to the member copies: no splice");
}
