//! Zero-copy HTTP/1 bodies on `http` listeners (crates/rondo-proxy/src/h1/zero_copy.rs): a
//! real `rondo serve` between raw clients and a member speaking HTTP/1.1 on real loopback
//! sockets. Multi-MiB bodies byte-exact both ways, with `Content-Length` and chunked (with
//! trailers); pipelined requests right behind a spliced body, never swallowed or mixed; the
//! copy fallbacks (a route with a body filter, `splice = "off"`, TLS); the body timeout and
//! size limit during a spliced body; members and clients that leave mid-body, with the right
//! answer and no socket or pipe left behind. Which path moved the bytes is read from
//! `rondo_http_body_bytes_total{listener,path}`, so a splice that silently never runs fails here.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Proc, TempDir, free_port};

const TOKEN: &str = "t";
const MIB: usize = 1 << 20;
/// The most pipe descriptors the router may keep idle: one worker's pool of 16 pipes.
const POOL_FDS: usize = 2 * 16;
/// Longest any socket operation of a test waits, so that a stuck exchange fails the test.
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

/// A message's head: its first line and its fields (names lower case).
struct Head {
    line: String,
    fields: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn chunked(&self) -> bool {
        self.get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    }

    fn length(&self) -> Option<usize> {
        self.get("content-length").map(|v| v.parse().expect("content-length"))
    }
}

/// Reads a head (`None` at a clean end of stream before one).
fn read_head(r: &mut impl BufRead) -> Option<Head> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let line = line.trim_end().to_owned();
    let mut fields = Vec::new();
    loop {
        let mut f = String::new();
        if r.read_line(&mut f).ok()? == 0 {
            return None;
        }
        let f = f.trim_end();
        if f.is_empty() {
            return Some(Head { line, fields });
        }
        let (n, v) = f.split_once(':').expect("a field");
        fields.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
}

/// A body read by its framing, with its trailers (chunked).
struct Body {
    bytes: Vec<u8>,
    trailers: Vec<String>,
}

/// Reads the body `head` frames (no framing: until the end of stream).
fn read_body(r: &mut impl BufRead, head: &Head) -> std::io::Result<Body> {
    let mut bytes = Vec::new();
    let mut trailers = Vec::new();
    if head.chunked() {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let hex = size.trim_end().split(';').next().unwrap_or("");
            let n = usize::from_str_radix(hex, 16)
                .map_err(|_| std::io::Error::other(format!("chunk size {size:?}")))?;
            if n == 0 {
                loop {
                    let mut t = String::new();
                    if r.read_line(&mut t)? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    let t = t.trim_end();
                    if t.is_empty() {
                        return Ok(Body { bytes, trailers });
                    }
                    trailers.push(t.to_owned());
                }
            }
            let at = bytes.len();
            bytes.resize(at + n, 0);
            r.read_exact(&mut bytes[at..])?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
            assert_eq!(&crlf, b"\r\n", "chunk data ends with CRLF");
        }
    } else if let Some(n) = head.length() {
        bytes.resize(n, 0);
        r.read_exact(&mut bytes)?;
    } else if !head.line.starts_with("HTTP/") {
        // A request without framing has no body.
    } else {
        r.read_to_end(&mut bytes)?;
    }
    Ok(Body { bytes, trailers })
}

/// `data` in the chunked coding, in chunks of the given sizes (cycled), with `trailers`.
fn chunked(data: &[u8], sizes: &[usize], trailers: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1024);
    let mut rest = data;
    for size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = (*size).min(rest.len());
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n");
    for t in trailers {
        out.extend_from_slice(format!("{t}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A query parameter of `target` as a number.
fn param(target: &str, name: &str) -> usize {
    let query = target.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The member's answer to one request on a keep-alive connection; `false`: close it.
///
/// - `POST /echo`: the body back, framed as it came (chunked: other chunk sizes, and the
///   request's trailers with `x-got` added);
/// - `GET /big?n=N&seed=S`: N bytes with a `Content-Length`; `GET /chunked?n=N&seed=S` the
///   same chunked, with a trailer;
/// - `GET /cut?n=N&send=M`: a head for N bytes, M of them, then the connection closes;
/// - `POST /hangup?after=K`: K bytes of the body read, then the connection closes unanswered;
/// - anything else: `<method> <target> <body length>` as the body;
///
/// and the same under `/filtered`.
fn answer(conn: &mut TcpStream, r: &mut BufReader<TcpStream>) -> bool {
    let Some(head) = read_head(r) else { return false };
    let mut parts = head.line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("").to_owned());
    // The filtered route's requests are the others' under `/filtered`.
    let target = target.strip_prefix("/filtered").unwrap_or(&target).to_owned();
    if target.starts_with("/hangup") {
        let mut got = vec![0u8; param(&target, "after")];
        let _ = r.read_exact(&mut got);
        return false;
    }
    let Ok(body) = read_body(r, &head) else { return false };
    let mut out = Vec::new();
    if target.starts_with("/echo") && head.chunked() {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut trailers: Vec<&str> = body.trailers.iter().map(String::as_str).collect();
        let got = format!("x-got: {}", body.bytes.len());
        trailers.push(&got);
        out.extend_from_slice(&chunked(&body.bytes, &[777_777, 5, 2 * MIB], &trailers));
    } else if target.starts_with("/echo") {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.bytes.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&body.bytes);
    } else if target.starts_with("/big") || target.starts_with("/cut") {
        let n = param(&target, "n");
        let data = payload(n, param(&target, "seed") as u64);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
        out.extend_from_slice(head.as_bytes());
        if target.starts_with("/cut") {
            out.extend_from_slice(&data[..param(&target, "send")]);
            let _ = conn.write_all(&out);
            return false;
        }
        out.extend_from_slice(&data);
    } else if target.starts_with("/chunked") {
        let data = payload(param(&target, "n"), param(&target, "seed") as u64);
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        out.extend_from_slice(&chunked(&data, &[MIB + 3, 100, 300_000], &["x-end: yes"]));
    } else {
        let text = format!("{method} {target} {}", body.bytes.len());
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    conn.write_all(&out).is_ok()
}

/// The member on a free loopback port, a thread per connection (the listener thread ends with
/// the test process).
fn member() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind member");
    let addr = listener.local_addr().expect("member address");
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = conn.set_read_timeout(Some(IO_WAIT));
            let _ = conn.set_write_timeout(Some(IO_WAIT));
            thread::spawn(move || {
                let mut w = conn.try_clone().expect("clone");
                let mut r = BufReader::new(conn);
                while answer(&mut w, &mut r) {}
            });
        }
    });
    addr
}

/// A `rondo serve` with one worker: listener `web` (with `listener` lines) routing `/filtered`
/// through a `compress` filter and everything else plainly, and listener `off` with
/// `splice = "off"`, all to the one member.
struct Router {
    proc: Proc,
    admin: SocketAddr,
    web: SocketAddr,
    off: SocketAddr,
    dir: TempDir,
}

fn router(member: SocketAddr, listener: &str, files: &[(&str, &str)]) -> Router {
    let dir = TempDir::new("http-splice");
    for (name, text) in files {
        std::fs::write(dir.0.join(name), text).expect("write file");
    }
    let admin = free_port();
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:{admin}\"\ntoken = \"{TOKEN}\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n{listener}\n\n\
         [[listener]]\nname = \"off\"\nlisten = \"127.0.0.1:0\"\nsplice = \"off\"\n\n\
         [[route]]\nname = \"filtered\"\nlistener = \"web\"\ncluster = \"c\"\n\
         match = {{ path_prefix = \"/filtered\" }}\nfilters = [ {{ compress = {{}} }} ]\n\n\
         [[route]]\nname = \"r\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [[route]]\nname = \"o\"\nlistener = \"off\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{member}\" }}]\n"
    );
    let path = dir.0.join("rondo.toml");
    std::fs::write(&path, text).expect("write config");
    let mut proc =
        Proc::start(&["serve", "--config", path.to_str().expect("utf-8"), "--workers", "1"]);
    let web = proc.addr_after("listener web on");
    let off = proc.addr_after("listener off on");
    let admin = proc.addr_after("admin API on");
    Router { proc, admin, web, off, dir }
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

    /// Body bytes `listener` moved on `path` (`splice` or `copy`).
    fn bodies(&self, listener: &str, path: &str) -> u64 {
        self.metric(&format!(
            "rondo_http_body_bytes_total{{listener=\"{listener}\",path=\"{path}\"}}"
        ))
    }

    /// (spliced, copied) of `listener`, once (5 s at most) `done` holds of them.
    fn bodies_when(&self, listener: &str, done: impl Fn(u64, u64) -> bool) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let counts = (self.bodies(listener, "splice"), self.bodies(listener, "copy"));
            if done(counts.0, counts.1) || Instant::now() > deadline {
                return counts;
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

/// A client connection to `addr` with the tests' timeouts, and a buffered reader of it.
fn connect(addr: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(addr).expect("connect to the router");
    s.set_read_timeout(Some(IO_WAIT)).expect("timeout");
    s.set_write_timeout(Some(IO_WAIT)).expect("timeout");
    let r = BufReader::new(s.try_clone().expect("clone"));
    (s, r)
}

/// Reads a whole response: its head and body.
fn response(r: &mut impl BufRead) -> (Head, Body) {
    let head = read_head(r).expect("a response head");
    let body = read_body(r, &head).expect("a whole response body");
    (head, body)
}

/// A POST of `body` to `target` with a `Content-Length`.
fn post(target: &str, body: &[u8]) -> Vec<u8> {
    let mut out =
        format!("POST {target} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len())
            .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A POST of `body` to `target`, chunked as `chunked` does, with a trailer.
fn post_chunked(target: &str, body: &[u8]) -> Vec<u8> {
    let mut out =
        format!("POST {target} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            .into_bytes();
    out.extend_from_slice(&chunked(body, &[3 * MIB / 2, 9, 500_000], &["x-sent: trailer"]));
    out
}

fn get(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes()
}

/// Sends `request` from a thread of its own (so that a large one and its answer can cross).
fn send(s: &TcpStream, request: Vec<u8>) -> thread::JoinHandle<()> {
    let mut w = s.try_clone().expect("clone");
    thread::spawn(move || {
        let _ = w.write_all(&request);
    })
}

#[test]
fn large_bodies_are_spliced_byte_exact_both_ways_with_length_and_chunked() {
    let r = router(member(), "", &[]);
    let (s, mut rd) = connect(r.web);
    // A request body with a length, echoed with one.
    let data = payload(8 * MIB, 1);
    let sending = send(&s, post("/echo", &data));
    let (head, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(head.line.starts_with("HTTP/1.1 200"), "{}", head.line);
    assert!(body.bytes == data, "the echo of a length-framed body differs");
    // A chunked request body with a trailer, echoed chunked (other sizes) with its trailers.
    let data = payload(6 * MIB + 17, 2);
    let sending = send(&s, post_chunked("/echo", &data));
    let (head, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(head.chunked(), "the echo is chunked");
    assert!(body.bytes == data, "the echo of a chunked body differs");
    let want = ["x-sent: trailer".to_owned(), format!("x-got: {}", data.len())];
    assert_eq!(body.trailers, want, "the trailers both ways");
    // Response bodies alone: with a length, and chunked.
    s.try_clone().expect("clone").write_all(&get("/big?n=9437184&seed=3")).expect("send");
    let (_, body) = response(&mut rd);
    assert!(body.bytes == payload(9 * MIB, 3), "a long response differs");
    s.try_clone().expect("clone").write_all(&get("/chunked?n=5242880&seed=4")).expect("send");
    let (_, body) = response(&mut rd);
    assert!(body.bytes == payload(5 * MIB, 4), "a long chunked response differs");
    assert_eq!(body.trailers, ["x-end: yes"]);
    // Nearly every byte went through a pipe: only what came with a head, chunk size lines and
    // the short chunks were copied.
    let total = (2 * 8 * MIB + 2 * (6 * MIB + 17) + 9 * MIB + 5 * MIB) as u64;
    let (spliced, copied) = r.bodies_when("web", |s, _| s >= total * 9 / 10);
    assert!(spliced >= total * 9 / 10, "spliced {spliced} of about {total} (copied {copied})");
    assert!(spliced + copied <= total + 64 * 1024, "counted {spliced} + {copied} of {total}");
}

#[test]
fn pipelined_requests_behind_a_spliced_body_are_neither_swallowed_nor_mixed() {
    let r = router(member(), "", &[]);
    // Every request on one connection, written at once: the bytes of the next request follow
    // the last byte of each spliced body in the same segments.
    let bodies = [payload(3 * MIB + 1, 5), payload(2 * MIB + 7, 6), payload(MIB, 7)];
    let mut all = Vec::new();
    all.extend_from_slice(&post("/echo", &bodies[0]));
    all.extend_from_slice(&get("/after-length"));
    all.extend_from_slice(&post_chunked("/echo", &bodies[1]));
    all.extend_from_slice(&get("/after-chunked"));
    all.extend_from_slice(&get("/big?n=3145728&seed=8"));
    all.extend_from_slice(&post("/count", &bodies[2]));
    all.extend_from_slice(&get("/last"));
    for round in 0..3 {
        let (s, mut rd) = connect(r.web);
        let sending = send(&s, all.clone());
        let (_, b) = response(&mut rd);
        assert!(b.bytes == bodies[0], "round {round}: the first echo differs");
        let (_, b) = response(&mut rd);
        assert_eq!(String::from_utf8_lossy(&b.bytes), "GET /after-length 0", "round {round}");
        let (_, b) = response(&mut rd);
        assert!(b.bytes == bodies[1], "round {round}: the chunked echo differs");
        let (_, b) = response(&mut rd);
        assert_eq!(String::from_utf8_lossy(&b.bytes), "GET /after-chunked 0", "round {round}");
        let (_, b) = response(&mut rd);
        assert!(b.bytes == payload(3 * MIB, 8), "round {round}: the long response differs");
        let (_, b) = response(&mut rd);
        let want = format!("POST /count {}", bodies[2].len());
        assert_eq!(String::from_utf8_lossy(&b.bytes), want, "round {round}");
        let (_, b) = response(&mut rd);
        assert_eq!(String::from_utf8_lossy(&b.bytes), "GET /last 0", "round {round}");
        sending.join().expect("sender");
    }
    let (spliced, _) = r.bodies_when("web", |s, _| s >= (3 * 8 * MIB) as u64);
    assert!(spliced >= (3 * 8 * MIB) as u64, "the bodies were spliced: {spliced}");
}

#[test]
fn a_body_filter_route_and_splice_off_copy_byte_exact() {
    let r = router(member(), "", &[]);
    let data = payload(4 * MIB, 9);
    // A route with a body filter (`compress`) is hyper's: its bodies never reach a pipe.
    let (s, mut rd) = connect(r.web);
    let sending = send(&s, post("/filtered/echo", &data));
    let (head, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(head.line.starts_with("HTTP/1.1 200"), "{}", head.line);
    let (got, fields) = (body.bytes.len(), &head.fields);
    assert!(body.bytes == data, "the filtered route's echo differs: {got} bytes, {fields:?}");
    let handed = r.metric("rondo_http1_handoffs_total{listener=\"web\",reason=\"route\"}");
    assert_eq!(handed, 1, "the filtered route's request went to hyper's path");
    assert_eq!(r.bodies("web", "splice"), 0, "a body filter's route spliced");
    // `splice = "off"`: the own path copies every byte, and counts them so.
    let (s, mut rd) = connect(r.off);
    let sending = send(&s, post("/echo", &data));
    let (_, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(body.bytes == data, "the echo with splice off differs");
    let total = (2 * 4 * MIB) as u64;
    let (spliced, copied) = r.bodies_when("off", |_, c| c >= total * 9 / 10);
    assert_eq!(spliced, 0, "splice = \"off\" spliced");
    assert!(copied >= total * 9 / 10 && copied <= total, "copied {copied} of {total}");
    // The same on the splicing listener is spliced (so the zeros above are the fallback's).
    let (s, mut rd) = connect(r.web);
    let sending = send(&s, post("/echo", &data));
    let (_, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(body.bytes == data);
    let (spliced, _) = r.bodies_when("web", |s, _| s >= total * 9 / 10);
    assert!(spliced >= total * 9 / 10, "spliced {spliced} of {total}");
}

#[test]
fn a_tls_client_copies_byte_exact() {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    let made = rcgen::generate_simple_self_signed(vec!["a.test".to_owned()]).expect("certificate");
    let (cert, key) = (made.cert.pem(), made.signing_key.serialize_pem());
    let tls = "tls = { certs = [ { cert = \"a.pem\", key = \"a.key\" } ] }";
    let r = router(member(), tls, &[("a.pem", &cert), ("a.key", &key)]);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem")).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls_pki_types::ServerName::try_from("a.test").expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
    let (tcp, _) = connect(r.web);
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // Small enough for the member to take whole before it answers, so one thread suffices.
    let data = payload(3 * MIB, 10);
    tls.write_all(&post("/echo", &data)).expect("send");
    tls.write_all(&get("/big?n=2097152&seed=11")).expect("send");
    let mut rd = BufReader::new(tls);
    let (_, body) = response(&mut rd);
    assert!(body.bytes == data, "the echo over tls differs");
    let (_, body) = response(&mut rd);
    assert!(body.bytes == payload(2 * MIB, 11), "the long response over tls differs");
    let total = (2 * 3 * MIB + 2 * MIB) as u64;
    let (spliced, copied) = r.bodies_when("web", |_, c| c >= total * 9 / 10);
    assert_eq!(spliced, 0, "tls spliced");
    assert!(copied >= total * 9 / 10, "copied {copied} of {total}");
}

#[test]
fn a_member_that_closes_mid_body_gets_502_or_a_cut_and_nothing_is_held() {
    let r = router(member(), "", &[]);
    // Warm: the pool's pipes exist and the member connection is pooled.
    let (s, mut rd) = connect(r.web);
    let sending = send(&s, post("/echo", &payload(2 * MIB, 12)));
    let _ = response(&mut rd);
    sending.join().expect("sender");
    drop((s, rd));
    thread::sleep(Duration::from_millis(200));
    let before = r.fds();
    for round in 0..20 {
        // The member leaves mid-request-body: the client gets the router's 502 (no byte of a
        // response went), then the connection closes.
        let (s, mut rd) = connect(r.web);
        let mut request = format!(
            "POST /hangup?after=200000 HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            4 * MIB
        )
        .into_bytes();
        request.extend_from_slice(&payload(512 * 1024, 13));
        s.try_clone().expect("clone").write_all(&request).expect("send part of the body");
        let head = read_head(&mut rd).expect("an answer");
        assert!(head.line.starts_with("HTTP/1.1 502"), "round {round}: {}", head.line);
        let _ = read_body(&mut rd, &head);
        // Then the end of the stream (a reset counts), not the test's read timeout.
        let mut rest = Vec::new();
        let end = rd.read_to_end(&mut rest);
        let timed_out = end.as_ref().is_err_and(|e| {
            matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        });
        assert!(!timed_out && rest.is_empty(), "round {round}: {end:?}, {} bytes", rest.len());
        // The member leaves mid-response-body: the client gets the head and part of the body,
        // then the connection closes (never a whole-looking body).
        let (s, mut rd) = connect(r.web);
        s.try_clone().expect("clone").write_all(&get("/cut?n=8388608&send=1048576")).expect("send");
        let head = read_head(&mut rd).expect("the member's head");
        assert!(head.line.starts_with("HTTP/1.1 200"), "round {round}: {}", head.line);
        let mut got = Vec::new();
        let _ = rd.read_to_end(&mut got);
        assert!(got.len() < 8 * MIB, "round {round}: a cut body arrived whole");
        assert!(got == payload(8 * MIB, 0)[..got.len()], "round {round}: the cut body differs");
        drop(s);
    }
    r.assert_nothing_held(before);
}

#[test]
fn a_client_that_leaves_mid_body_leaves_nothing_held() {
    let r = router(member(), "", &[]);
    let (s, mut rd) = connect(r.web);
    s.try_clone().expect("clone").write_all(&get("/big?n=1048576&seed=1")).expect("send");
    let _ = response(&mut rd);
    drop((s, rd));
    thread::sleep(Duration::from_millis(200));
    let before = r.fds();
    for _ in 0..20 {
        // Mid-request-body: half a body sent, then the connection closed.
        let (s, rd) = connect(r.web);
        let mut request = post("/echo", &payload(8 * MIB, 14));
        request.truncate(3 * MIB);
        s.try_clone().expect("clone").write_all(&request).expect("send part");
        drop((s, rd));
        // Mid-response-body: 1 MiB of a 16 MiB response read, then the connection closed.
        let (s, mut rd) = connect(r.web);
        s.try_clone().expect("clone").write_all(&get("/big?n=16777216&seed=15")).expect("send");
        let head = read_head(&mut rd).expect("head");
        assert!(head.line.starts_with("HTTP/1.1 200"));
        let mut part = vec![0u8; MIB];
        rd.read_exact(&mut part).expect("a part");
        drop((s, rd));
    }
    r.assert_nothing_held(before);
    // The router still serves, spliced.
    let (s, mut rd) = connect(r.web);
    let data = payload(2 * MIB, 16);
    let sending = send(&s, post("/echo", &data));
    let (_, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(body.bytes == data);
}

#[test]
fn the_body_timeout_and_the_body_limit_hold_while_splicing() {
    let limits = "body_read_timeout_ms = 300\nmax_body_bytes = 3000000";
    let r = router(member(), limits, &[]);
    // A client that stalls mid-body (after a spliced part) gets 408 and a closed connection.
    let (s, mut rd) = connect(r.web);
    let mut request = post("/echo", &payload(2 * MIB, 17));
    request.truncate(MIB);
    s.try_clone().expect("clone").write_all(&request).expect("send part");
    let started = Instant::now();
    let head = read_head(&mut rd).expect("an answer");
    assert!(head.line.starts_with("HTTP/1.1 408"), "{}", head.line);
    assert!(started.elapsed() < Duration::from_secs(10), "the stall was cut in time");
    // A chunked body over the limit: 413, and the member never gets the bytes past it.
    let (s, mut rd) = connect(r.web);
    let sending = send(&s, post_chunked("/echo", &payload(4 * MIB, 18)));
    let head = read_head(&mut rd).expect("an answer");
    assert!(head.line.starts_with("HTTP/1.1 413"), "{}", head.line);
    drop((s, rd));
    let _ = sending.join();
    // A body within the limit still goes through whole, spliced.
    let (s, mut rd) = connect(r.web);
    let data = payload(2 * MIB, 19);
    let sending = send(&s, post("/echo", &data));
    let (_, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(body.bytes == data);
    assert!(r.bodies("web", "splice") >= MIB as u64, "nothing spliced");
}

#[test]
fn the_access_log_counts_spliced_bytes() {
    let log = "access_log = { path = \"access.log\" }";
    let r = router(member(), log, &[]);
    let (s, mut rd) = connect(r.web);
    let data = payload(5 * MIB + 3, 20);
    let sending = send(&s, post("/echo", &data));
    let (_, body) = response(&mut rd);
    sending.join().expect("sender");
    assert!(body.bytes == data);
    s.try_clone().expect("clone").write_all(&get("/chunked?n=3145728&seed=2")).expect("send");
    let _ = response(&mut rd);
    let path = r.dir.0.join("access.log");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut text = String::new();
    while text.lines().count() < 2 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
        text = std::fs::read_to_string(&path).unwrap_or_default();
    }
    let n = data.len();
    assert!(text.contains(&format!("bytes_in={n} bytes_out={n} ")), "{text}");
    // The chunked response's bytes as sent: data, size lines and trailer.
    let framed = chunked(&payload(3 * MIB, 2), &[MIB + 3, 100, 300_000], &["x-end: yes"]);
    assert!(text.contains(&format!("bytes_in=0 bytes_out={} ", framed.len())), "{text}");
}
