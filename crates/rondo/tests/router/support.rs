//! Shared helpers: members, a router from a config text, and small HTTP clients.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rondo::member::{self, Member};
use rondo_runtime::{Live, probe};

/// A running router and its live state.
pub(crate) struct TestRouter {
    pub(crate) router: rondo_proxy::Router,
    pub(crate) live: Arc<Live>,
}

impl TestRouter {
    /// The bound address of listener `name`.
    pub(crate) fn addr(&self, name: &str) -> SocketAddr {
        self.router.addr(name).expect("listener exists")
    }

    /// `http://ADDR` of listener `name`.
    pub(crate) fn url(&self, name: &str, path: &str) -> String {
        format!("http://{}{}", self.addr(name), path)
    }
}

/// Starts `n` in-process members called `m1..mn` on free ports, each waiting `delay`.
pub(crate) async fn members(n: usize, delay: Duration) -> Vec<Member> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.push(
            member::spawn(&format!("m{i}"), "127.0.0.1:0".parse().unwrap(), delay)
                .await
                .expect("member starts"),
        );
    }
    v
}

/// `members = [...]` for a cluster table, from running members.
pub(crate) fn member_list(ms: &[Member]) -> String {
    let items: Vec<String> = ms
        .iter()
        .map(|m| format!("{{ name = \"{}\", address = \"{}\" }}", m.name, m.addr))
        .collect();
    format!("members = [{}]", items.join(", "))
}

/// Starts a router from a config text (listeners should listen on `127.0.0.1:0`), with probes.
pub(crate) async fn router(config: &str) -> TestRouter {
    let config = rondo_config::parse_str(config, std::path::Path::new("test.toml"), 1)
        .unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
    let live = Arc::new(Live::new(config.view.clone(), config.router.group.clone()));
    probe::spawn(&live.load());
    let router = rondo_proxy::start(&config.listeners, live.clone()).await.expect("router starts");
    TestRouter { router, live }
}

/// One HTTP/1.1 keep-alive client.
pub(crate) fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// An HTTP/2 prior-knowledge client.
pub(crate) fn h2_client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).http2_only(true).build(HttpConnector::new())
}

/// A response, collected.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

/// GET `url` with extra headers through `client`, with a 10 s guard.
pub(crate) async fn get_with(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::new()).expect("request builds");
    let fut = async {
        let resp = client.request(req).await.expect("request succeeds");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    };
    tokio::time::timeout(Duration::from_secs(10), fut).await.expect("reply within 10 s")
}

/// GET `url`.
pub(crate) async fn get(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> Reply {
    get_with(client, url, &[]).await
}

/// The member names that served `count` sequential GETs of `url`.
pub(crate) async fn served_by(url: &str, count: usize) -> Vec<String> {
    let c = client();
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        let r = get(&c, url).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        v.push(r.body.trim().to_owned());
    }
    v
}

/// How many of `names` equal `name`.
pub(crate) fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

/// Sends raw bytes on a new connection and reads until the server closes or `wait` passes.
pub(crate) async fn raw(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
