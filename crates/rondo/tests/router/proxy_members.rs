//! PROXY protocol sent to the members of HTTP clusters (issue 38 item 1): the member side is a
//! real HAProxy that accepts PROXY headers (`accept-proxy`, HTTP/1.1 or HTTP/2 with `proto h2`)
//! and tells its own server (a recorder) the address each header named, in `x-proxied-src`
//! (a second rondo in this process would refuse the requests as a loop). Two clients on other
//! loopback addresses (127.0.0.5, 127.0.0.9) take turns on keep-alive connections: a member
//! connection opened for one of them must never carry the other's request, on the own HTTP/1
//! path, on hyper's (HTTP/2 clients), and to HTTP/2 members.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpSocket;

use super::proxy_protocol::Haproxy;
use super::recorder::Recorder;
use super::support::*;

/// The member side: HAProxy accepting PROXY headers of either version, speaking HTTP/1.1 or
/// (`h2`) HTTP/2, and passing each request to `rec` with the header's source address.
fn inner(rec: &Recorder, h2: bool) -> Haproxy {
    let rest = format!(
        "http-request set-header x-proxied-src %[src]\n  default_backend b\n\
         backend b\n  server m {}",
        rec.addr
    );
    Haproxy::with("mode http", if h2 { "accept-proxy proto h2" } else { "accept-proxy" }, &rest)
}

/// The edge: its cluster sends `version` headers to `member` over `protocol`.
async fn edge(member: SocketAddr, version: &str, protocol: &str) -> TestRouter {
    let config = format!(
        "[[listener]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"edge\"\ncluster = \"b\"\n\n\
         [cluster.b]\nupstream_protocol = \"{protocol}\"\nproxy_protocol = \"{version}\"\n\
         members = [{{ name = \"inner\", address = \"{member}\" }}]\n"
    );
    router(&config).await
}

/// The source address HAProxy read from the PROXY header of the connection that carried the
/// request for `path`.
fn forwarded_for(rec: &Recorder, path: &str) -> String {
    let seen = rec.seen().into_iter().find(|s| s.path == path);
    let seen = seen.unwrap_or_else(|| panic!("{path} did not reach the member"));
    seen.headers.get("x-proxied-src").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
}

/// A keep-alive HTTP/1.1 connection to `to` from the loopback address `from`.
async fn raw_from(from: &str, to: SocketAddr) -> RawConn {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{from}:0").parse().unwrap()).expect("bind a loopback source");
    tokio::io::BufReader::new(socket.connect(to).await.expect("connect"))
}

/// An HTTP/2 prior-knowledge client whose connections come from `from`.
fn h2_from(from: &str) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(from.parse().unwrap()));
    Client::builder(TokioExecutor::new()).http2_only(true).build(connector)
}

/// The two clients' turns: each request's path names its client, and the member must have
/// been told that client's address, never the other's.
const TURNS: [(usize, &str); 6] =
    [(0, "a1"), (1, "b1"), (0, "a2"), (1, "b2"), (1, "b3"), (0, "a3")];
const FROM: [&str; 2] = ["127.0.0.5", "127.0.0.9"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_own_path_keeps_a_clients_member_connection_for_that_client_alone() {
    let rec = Recorder::spawn("m");
    let inner = inner(&rec, false);
    for version in ["v1", "v2"] {
        let edge = edge(inner.1, version, "http1").await;
        let to = edge.addr("edge");
        let mut conns = [raw_from(FROM[0], to).await, raw_from(FROM[1], to).await];
        for (who, name) in TURNS {
            let path = format!("/own-{version}-{name}");
            let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
            let resp = raw_request(&mut conns[who], request).await;
            assert_eq!(resp.status, 200, "{path}: {}", resp.text());
            assert_eq!(forwarded_for(&rec, &path), FROM[who], "{path}");
        }
        // A client's keep-alive requests went on its one member connection: the edge's own
        // path served them all (nothing was handed to hyper).
        let text = edge.live.metrics.render(&edge.live.load());
        let handed = text.lines().filter(|l| l.starts_with("rondo_http1_handoffs_total{"));
        for line in handed.filter(|l| l.contains("listener=\"edge\"")) {
            assert!(line.ends_with(" 0"), "{line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_clients_and_http2_members_get_their_own_clients_header() {
    let rec = Recorder::spawn("m");
    let (h1, h2) = (inner(&rec, false), inner(&rec, true));
    for (protocol, member) in [("http1", h1.1), ("http2", h2.1)] {
        let edge = edge(member, "v2", protocol).await;
        let clients = [h2_from(FROM[0]), h2_from(FROM[1])];
        for (who, name) in TURNS {
            let path = format!("/hyper-{protocol}-{name}");
            let url = edge.url("edge", &path);
            let req = http::Request::get(&url).body(Empty::new()).unwrap();
            let fut = async {
                let resp = clients[who].request(req).await.expect("answered");
                let status = resp.status();
                let _ = resp.into_body().collect().await;
                status
            };
            let status = tokio::time::timeout(Duration::from_secs(10), fut).await.expect("in time");
            assert_eq!(status, 200, "{path}");
            assert_eq!(forwarded_for(&rec, &path), FROM[who], "{path}");
        }
    }
    // An HTTP/1 client to an HTTP/2 member goes to hyper's path: the same holds there.
    let edge = edge(h2.1, "v1", "http2").await;
    let to = edge.addr("edge");
    let mut conns = [raw_from(FROM[0], to).await, raw_from(FROM[1], to).await];
    for (who, name) in TURNS {
        let path = format!("/handed-{name}");
        let resp = raw_request(&mut conns[who], format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"));
        assert_eq!(resp.await.status, 200, "{path}");
        assert_eq!(forwarded_for(&rec, &path), FROM[who], "{path}");
    }
}
