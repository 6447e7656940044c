//! PROXY protocol on listeners (issue 38): a real HAProxy in front sending v2, raw v1 headers,
//! and the refusals: a header from outside `trusted_sources`, a trusted proxy's connection
//! without its header, a `tcp` listener's untrusted client. Clients connect from other
//! loopback addresses (127.0.0.5, 127.0.0.9) than the proxy's (127.0.0.1), so the address a
//! member is told says which one the router believed.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::recorder::Recorder;
use super::support::*;

/// Four listeners, each with its mode, trusting 127.0.0.1 only, routed to `rec`.
fn config(rec: &Recorder) -> String {
    let trusted = "trusted_sources = [\"127.0.0.1\"]";
    let listener = |name: &str, extra: &str, cluster: &str| {
        format!(
            "[[listener]]\nname = \"{name}\"\nlisten = \"127.0.0.1:0\"\n{extra}\n{trusted}\n\n\
             [[route]]\nlistener = \"{name}\"\ncluster = \"{cluster}\"\n\n"
        )
    };
    format!(
        "{}{}{}{}[cluster.c]\nmembers = [{}]\n\n\
         [cluster.t]\nupstream_protocol = \"tcp\"\nmembers = [{}]\n",
        listener("v2", "proxy_protocol = \"v2\"", "c"),
        listener("v1", "proxy_protocol = \"v1\"", "c"),
        listener("opt", "proxy_protocol = \"optional\"", "c"),
        listener("tcp", "protocol = \"tcp\"\nproxy_protocol = \"v2\"", "t"),
        rec.entry(),
        rec.entry()
    )
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{from}:0").parse().unwrap()).expect("bind a loopback source");
    socket.connect(to).await.expect("connect")
}

/// Sends `prefix` then a GET of `path` on `s`; the answer's status, or `None` when the router
/// closed the connection without one.
async fn get_after(mut s: TcpStream, prefix: &[u8], path: &str) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let mut bytes = prefix.to_vec();
    bytes.extend_from_slice(request.as_bytes());
    // A refused connection may be closed before the write lands: that is a refusal too.
    if s.write_all(&bytes).await.is_err() {
        return None;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
    let _ = read.expect("the router answered or closed within 10 s");
    let text = String::from_utf8_lossy(&answer);
    text.split(' ').nth(1).and_then(|s| s.parse().ok())
}

/// The `x-forwarded-for` the member saw on the request for `path`.
fn forwarded_for(rec: &Recorder, path: &str) -> Option<String> {
    rec.seen().into_iter().find(|s| s.path == path).map(|s| {
        s.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    })
}

/// A v2 PROXY header for a TCP connection from `src` to `dst`.
fn v2_header(src: &str, dst: &str) -> Vec<u8> {
    use ppp::v2;
    let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
    v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        (src, dst),
    )
    .build()
    .expect("header")
}

/// HAProxy on a free port (killed on drop): `.1` the address it listens on.
pub(crate) struct Haproxy(Child, pub(crate) SocketAddr, std::path::PathBuf);

impl Haproxy {
    /// In TCP mode, sending PROXY v2 to `to`.
    fn start(to: SocketAddr) -> Haproxy {
        Haproxy::with(
            "mode tcp",
            "",
            &format!("default_backend b\nbackend b\n  server r {to} send-proxy-v2"),
        )
    }

    /// With `mode` in its defaults, its frontend bound with `bind` options and the rest of its
    /// configuration after the `bind` line (`rest`).
    pub(crate) fn with(mode: &str, bind: &str, rest: &str) -> Haproxy {
        let port = crate::common::free_port();
        let dir = std::env::temp_dir().join(format!("rondo-pp-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "global\n  maxconn 100\ndefaults\n  {mode}\n  timeout connect 5s\n  \
                 timeout client 10s\n  timeout server 10s\nfrontend f\n  \
                 bind 127.0.0.1:{port} {bind}\n  {rest}\n"
            ),
        )
        .unwrap();
        let child = Command::new("haproxy")
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start haproxy (apt-get install haproxy)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(std::time::Instant::now() < deadline, "haproxy did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Haproxy(child, addr, dir)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_header_names_the_client_and_nobody_else_may_send_one() {
    let rec = Recorder::spawn("m");
    let r = router(&config(&rec)).await;
    let v2 = r.addr("v2");
    let haproxy = Haproxy::start(v2);

    // Through HAProxy (from 127.0.0.1, trusted): the member is told the client's address.
    let s = connect_from("127.0.0.5", haproxy.1).await;
    assert_eq!(get_after(s, b"", "/via-haproxy").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/via-haproxy").as_deref(), Some("127.0.0.5"));

    // An untrusted client without a header: served with its own address.
    let s = connect_from("127.0.0.9", v2).await;
    assert_eq!(get_after(s, b"", "/direct").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/direct").as_deref(), Some("127.0.0.9"));

    // An untrusted client claiming an address: refused, closed, nothing forwarded.
    let s = connect_from("127.0.0.9", v2).await;
    assert_eq!(get_after(s, &v2_header("192.0.2.66:4000", &v2.to_string()), "/forged").await, None);
    assert_eq!(forwarded_for(&rec, "/forged"), None);

    // The trusted proxy's own address without a header (mode v2 requires one): refused.
    let s = connect_from("127.0.0.1", v2).await;
    assert_eq!(get_after(s, b"", "/bare").await, None);
    assert_eq!(forwarded_for(&rec, "/bare"), None);

    // A v1 header where v2 is required: refused.
    let s = connect_from("127.0.0.1", v2).await;
    let v1 = format!("PROXY TCP4 192.0.2.7 127.0.0.1 5000 {}\r\n", v2.port());
    assert_eq!(get_after(s, v1.as_bytes(), "/wrong-version").await, None);

    let text = r.live.metrics.render(&r.live.load());
    for (result, at_least) in [("accepted", 1), ("own_address", 1), ("refused_untrusted", 1)] {
        let line = format!("rondo_proxy_protocol_total{{listener=\"v2\",result=\"{result}\"}}");
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line).map(|v| v.trim().parse().unwrap()))
            .unwrap_or_else(|| panic!("no {line} in\n{text}"));
        assert!(n >= at_least, "{line} {n}");
    }
    let missing = "rondo_proxy_protocol_total{listener=\"v2\",result=\"refused_missing\"} 2";
    assert!(text.contains(missing), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_headers_and_the_optional_mode() {
    let rec = Recorder::spawn("m");
    let r = router(&config(&rec)).await;
    let (v1, opt) = (r.addr("v1"), r.addr("opt"));

    // v1, whole or split over two writes.
    let header = format!("PROXY TCP4 192.0.2.7 127.0.0.1 5000 {}\r\n", v1.port());
    let s = connect_from("127.0.0.1", v1).await;
    assert_eq!(get_after(s, header.as_bytes(), "/v1").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/v1").as_deref(), Some("192.0.2.7"));
    let mut s = connect_from("127.0.0.1", v1).await;
    s.write_all(b"PROXY TCP6 2001:db8::5 ").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rest = format!("::1 5000 {}\r\n", v1.port());
    assert_eq!(get_after(s, rest.as_bytes(), "/v1-split").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/v1-split").as_deref(), Some("2001:db8::5"));
    // `UNKNOWN` (a proxy's own check): the connection's address stands.
    let s = connect_from("127.0.0.1", v1).await;
    assert_eq!(get_after(s, b"PROXY UNKNOWN\r\n", "/unknown").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/unknown").as_deref(), Some("127.0.0.1"));
    // Garbage after the prefix: refused.
    let s = connect_from("127.0.0.1", v1).await;
    assert_eq!(get_after(s, b"PROXY TCP4 not an address\r\n", "/garbage").await, None);

    // Optional: a trusted proxy may send either version, or none.
    let s = connect_from("127.0.0.1", opt).await;
    assert_eq!(get_after(s, b"", "/opt-none").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/opt-none").as_deref(), Some("127.0.0.1"));
    let s = connect_from("127.0.0.1", opt).await;
    assert_eq!(get_after(s, &v2_header("[2001:db8::9]:1", "[::1]:80"), "/opt-v2").await, Some(200));
    assert_eq!(forwarded_for(&rec, "/opt-v2").as_deref(), Some("2001:db8::9"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_listener_takes_only_its_proxies_connections() {
    let rec = Recorder::spawn("m");
    let r = router(&config(&rec)).await;
    let tcp = r.addr("tcp");
    let haproxy = Haproxy::start(tcp);
    // Through HAProxy: the tunnel carries the client's bytes, header removed.
    let s = connect_from("127.0.0.5", haproxy.1).await;
    assert_eq!(get_after(s, b"", "/tunnel").await, Some(200));
    assert!(forwarded_for(&rec, "/tunnel").is_some());
    // Straight from an untrusted client: refused.
    let s = connect_from("127.0.0.9", tcp).await;
    assert_eq!(get_after(s, b"", "/untrusted-tcp").await, None);
    assert_eq!(forwarded_for(&rec, "/untrusted-tcp"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_are_kept_only_from_trusted_networks() {
    let rec = Recorder::spawn("m");
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\
         trust_forwarded_for = [\"127.0.0.4/31\"]\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n[cluster.c]\nmembers = [{}]\n",
        rec.entry()
    );
    let r = router(&config).await;
    let web = r.addr("web");
    for (from, path, xff, forwarded) in [
        ("127.0.0.5", "/trusted", "10.1.1.1, 127.0.0.5", Some("for=10.1.1.1")),
        ("127.0.0.9", "/untrusted", "127.0.0.9", None),
    ] {
        let mut s = connect_from(from, web).await;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 10.1.1.1\r\n\
             Forwarded: for=10.1.1.1\r\nConnection: close\r\n\r\n"
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
        let seen = rec.seen().into_iter().find(|s| s.path == path).expect("forwarded");
        assert_eq!(seen.headers.get("x-forwarded-for").unwrap(), xff, "{path}");
        let got = seen.headers.get("forwarded").map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(got.as_deref(), forwarded, "{path}");
    }
    // hyper's path (h2c) from 127.0.0.1, which the list does not trust.
    let headers = [("x-forwarded-for", "10.1.1.1"), ("forwarded", "for=10.1.1.1")];
    let reply = get_with(&h2_client(), &r.url("web", "/h2c"), &headers).await;
    assert_eq!(reply.status, 200);
    let seen = rec.seen().into_iter().find(|s| s.path == "/h2c").expect("forwarded");
    assert_eq!(seen.headers.get("x-forwarded-for").unwrap(), "127.0.0.1");
    assert_eq!(seen.headers.get("forwarded"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_cluster_tells_its_members_the_client_with_either_version() {
    let rec = Recorder::spawn("m");
    // The member side: a router whose listener believes PROXY headers from 127.0.0.1.
    let inner = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"optional\"\n\
         trusted_sources = [\"127.0.0.1\"]\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n[cluster.c]\nmembers = [{}]\n",
        rec.entry()
    );
    let inner = router(&inner).await;
    for version in ["v1", "v2"] {
        let edge = format!(
            "[[listener]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
             [[route]]\nlistener = \"edge\"\ncluster = \"b\"\n\n\
             [cluster.b]\nupstream_protocol = \"tcp\"\nproxy_protocol = \"{version}\"\n\
             members = [{{ name = \"inner\", address = \"{}\" }}]\n",
            inner.addr("web")
        );
        let edge = router(&edge).await;
        let s = connect_from("127.0.0.5", edge.addr("edge")).await;
        let path = format!("/through-{version}");
        assert_eq!(get_after(s, b"", &path).await, Some(200));
        assert_eq!(forwarded_for(&rec, &path).as_deref(), Some("127.0.0.5"), "{version}");
    }
}
