//! Shared helpers: members, a router from a config text, and small HTTP clients.

#![allow(dead_code)]

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::body::Body;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rondo::member::{self, Member};
use rondo_runtime::{Live, probe};
use tokio::io::AsyncRead;

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

/// `127.0.0.1:0`: any free port.
pub(crate) fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An address nobody listens on (bound once, then released), never the same twice in this
/// process ([`crate::common::free_port`]): two members of one cluster on the same address are a
/// configuration error.
pub(crate) fn dead_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::common::free_port()))
}

#[test]
fn dead_addresses_are_distinct() {
    // 12 in a row once gave the same port twice (`concurrent_weight_changes_all_land`).
    let mut ports: Vec<u16> = (0..500).map(|_| dead_addr().port()).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 500);
}

/// Starts in-process member `name` on a free port, waiting `delay_ms` before each answer.
pub(crate) async fn spawn_member(name: &str, delay_ms: u64) -> Member {
    member::spawn(name, any_port(), Duration::from_millis(delay_ms)).await.expect("member starts")
}

/// Starts `n` in-process members called `m1..mn` on free ports, each waiting `delay`.
pub(crate) async fn members(n: usize, delay: Duration) -> Vec<Member> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.push(member::spawn(&format!("m{i}"), any_port(), delay).await.expect("member starts"));
    }
    v
}

/// `{ name = "NAME", address = "ADDR" }` for a cluster's member list, with `extra` keys.
pub(crate) fn member_entry(name: &str, addr: impl Display, extra: &str) -> String {
    let extra = if extra.is_empty() { String::new() } else { format!(", {extra}") };
    format!("{{ name = \"{name}\", address = \"{addr}\"{extra} }}")
}

/// [`member_entry`] for one running member.
pub(crate) fn entry(m: &Member, extra: &str) -> String {
    member_entry(&m.name, m.addr, extra)
}

/// `members = [...]` from member entries.
pub(crate) fn members_of(entries: impl IntoIterator<Item = String>) -> String {
    format!("members = [{}]", entries.into_iter().collect::<Vec<_>>().join(", "))
}

/// `members = [...]` for a cluster table, from running members, each with `extra` keys.
pub(crate) fn member_list_with(ms: &[Member], extra: &str) -> String {
    members_of(ms.iter().map(|m| entry(m, extra)))
}

/// `members = [...]` for a cluster table, from running members.
pub(crate) fn member_list(ms: &[Member]) -> String {
    member_list_with(ms, "")
}

/// `members = [...]` of `n` members `PREFIX1..PREFIXn` on addresses nobody listens on.
pub(crate) fn dead_members(prefix: &str, n: usize) -> String {
    members_of((1..=n).map(|i| member_entry(&format!("{prefix}{i}"), dead_addr(), "")))
}

/// A member running on a runtime of its own, so that killing it closes its open connections
/// too (like a member process that dies), not only its listener.
pub(crate) struct Killable {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    parts: Option<(tokio::runtime::Runtime, Member)>,
}

impl Killable {
    pub(crate) fn spawn(name: &str) -> Killable {
        let owned = name.to_owned();
        let (runtime, member) = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("member runtime");
            let m = runtime
                .block_on(member::spawn(&owned, any_port(), Duration::ZERO))
                .expect("member starts");
            (runtime, m)
        })
        .join()
        .expect("member thread");
        Killable { name: member.name.clone(), addr: member.addr, parts: Some((runtime, member)) }
    }

    /// Stops the member and closes every connection it has (waits until they are closed).
    pub(crate) async fn kill(&mut self) {
        if let Some((runtime, member)) = self.parts.take() {
            member.stop();
            drop(member);
            tokio::task::spawn_blocking(move || drop(runtime)).await.expect("runtime dropped");
        }
    }
}

impl Drop for Killable {
    fn drop(&mut self) {
        if let Some((runtime, member)) = self.parts.take() {
            drop(member);
            runtime.shutdown_background();
        }
    }
}

/// A `[[listener]]` table: `name` on a free port, with `extra` keys.
pub(crate) fn listener_table(name: &str, extra: &str) -> String {
    format!("[[listener]]\nname = \"{name}\"\nlisten = \"127.0.0.1:0\"\n{extra}\n\n")
}

/// A `[[route]]` table `name` from `listener` to `cluster`, with `extra` keys.
pub(crate) fn route_table(name: &str, listener: &str, cluster: &str, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nlistener = \"{listener}\"\ncluster = \"{cluster}\"\n{extra}\n\n"
    )
}

/// A `[cluster.NAME]` table whose body is `body`.
pub(crate) fn cluster_table(name: &str, body: &str) -> String {
    format!("[cluster.{name}]\n{body}\n\n")
}

/// A listener, a route and a cluster, all called `name`: the listener (with `listener` extra
/// keys) on a free port, its one route (with `route` extra keys) to the cluster, whose body is
/// `cluster`.
pub(crate) fn pipeline(name: &str, listener: &str, route: &str, cluster: &str) -> String {
    listener_table(name, listener)
        + &route_table(name, name, name, route)
        + &cluster_table(name, cluster)
}

/// One listener `web` (with `listener` extra keys), one route `main` (with `route` extra keys)
/// to cluster `c` whose body is `cluster`.
pub(crate) fn web_config(listener: &str, route: &str, cluster: &str) -> String {
    listener_table("web", listener)
        + &route_table("main", "web", "c", route)
        + &cluster_table("c", cluster)
}

/// [`web_config`] with no extra listener or route keys.
pub(crate) fn one_cluster(cluster: &str) -> String {
    web_config("", "", cluster)
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

/// A keep-alive client whose requests carry `B` bodies: HTTP/1.1, or HTTP/2 prior knowledge
/// when `http2_only`.
pub(crate) fn client_of<B>(http2_only: bool) -> Client<HttpConnector, B>
where
    B: Body + Send,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).http2_only(http2_only).build(HttpConnector::new())
}

/// One HTTP/1.1 keep-alive client.
pub(crate) fn client() -> Client<HttpConnector, Empty<Bytes>> {
    client_of(false)
}

/// An HTTP/2 prior-knowledge client.
pub(crate) fn h2_client() -> Client<HttpConnector, Empty<Bytes>> {
    client_of(true)
}

/// A response, collected.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) version: Version,
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
        let (version, status) = (resp.version(), resp.status());
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        Reply { version, status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    };
    tokio::time::timeout(Duration::from_secs(10), fut).await.expect("reply within 10 s")
}

/// GET `url`.
pub(crate) async fn get(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> Reply {
    get_with(client, url, &[]).await
}

/// GET `url` with extra headers through `client`, which must answer 200: the name of the
/// member that served it.
pub(crate) async fn served_name_with(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    headers: &[(&str, &str)],
) -> String {
    let r = get_with(client, url, headers).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body.trim().to_owned()
}

/// GET `url`, which must answer 200: the name of the member that served it.
pub(crate) async fn served_name(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> String {
    served_name_with(client, url, &[]).await
}

/// The member names that served `count` sequential GETs of `url` (each must answer 200).
pub(crate) async fn served_by(url: &str, count: usize) -> Vec<String> {
    let c = client();
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        v.push(served_name(&c, url).await);
    }
    v
}

/// GETs `url` every 20 ms until `done` holds for the reply (at most 5 s, else the test fails
/// saying `what`): that reply.
pub(crate) async fn get_until(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    done: impl Fn(&Reply) -> bool,
    what: &str,
) -> Reply {
    let start = Instant::now();
    loop {
        let reply = get(client, url).await;
        if done(&reply) {
            return reply;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{what}: {reply:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many of `names` equal `name`.
pub(crate) fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

/// Sends `bytes` on a new connection; returns what came back and whether the peer closed the
/// connection cleanly (a reset does not count) within `wait`.
pub(crate) async fn raw_until_closed(
    addr: SocketAddr,
    bytes: &[u8],
    wait: Duration,
) -> (String, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let closed = matches!(tokio::time::timeout(wait, s.read_to_end(&mut out)).await, Ok(Ok(_)));
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

// Raw HTTP/1.1 on a socket, for tests that must see exactly what goes over the wire (status
// lines, hop-by-hop headers, chunk boundaries, whether and when the router closes).

/// A raw client connection (buffered for reading; write through `get_mut()`).
pub(crate) type RawConn = tokio::io::BufReader<tokio::net::TcpStream>;

/// A response read off a raw connection.
#[derive(Debug)]
pub(crate) struct RawResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl RawResponse {
    /// The first value of header `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Connects a raw client.
pub(crate) async fn raw_connect(addr: SocketAddr) -> RawConn {
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tokio::io::BufReader::new(s)
}

/// Writes `bytes` on a raw connection.
pub(crate) async fn raw_send(conn: &mut RawConn, bytes: &[u8]) {
    use tokio::io::AsyncWriteExt;
    conn.get_mut().write_all(bytes).await.expect("write");
}

/// Writes a request on a raw connection and reads the whole response.
pub(crate) async fn raw_request(conn: &mut RawConn, request: impl AsRef<[u8]>) -> RawResponse {
    raw_send(conn, request.as_ref()).await;
    read_response(conn).await.expect("response")
}

async fn guarded<T>(
    fut: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(Duration::from_secs(10), fut).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "nothing within 10 s"))
    })
}

async fn read_line(conn: &mut RawConn) -> std::io::Result<String> {
    use tokio::io::AsyncBufReadExt;
    let mut line = Vec::new();
    if conn.read_until(b'\n', &mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(String::from_utf8_lossy(&line).trim_end_matches(['\r', '\n']).to_owned())
}

/// Reads a response head: the status and the headers (10 s guard).
pub(crate) async fn read_head(conn: &mut RawConn) -> std::io::Result<(u16, Vec<(String, String)>)> {
    guarded(async {
        let status_line = read_line(conn).await?;
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
        let mut headers = Vec::new();
        for _ in 0..1000 {
            let line = read_line(conn).await?;
            if line.is_empty() {
                return Ok((status, headers));
            }
            let (k, v) = line.split_once(':').unwrap_or((&line, ""));
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        Err(std::io::Error::other("over 1000 header lines"))
    })
    .await
}

/// Reads one chunk of a chunked body: `Some(data)`, or `None` for the last chunk (trailers
/// skipped). The connection ending first is an error (10 s guard).
pub(crate) async fn read_chunk(conn: &mut RawConn) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    guarded(async {
        let size_line = read_line(conn).await?;
        let hex = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            for _ in 0..1000 {
                if read_line(conn).await?.is_empty() {
                    return Ok(None);
                }
            }
            return Err(std::io::Error::other("over 1000 trailer lines"));
        }
        let mut data = vec![0; size];
        conn.read_exact(&mut data).await?;
        if !read_line(conn).await?.is_empty() {
            return Err(std::io::Error::other("chunk not followed by CRLF"));
        }
        Ok(Some(data))
    })
    .await
}

/// Reads one whole response: by Content-Length, chunked, or up to the close (10 s guard per
/// step; at most 100,000 chunks).
pub(crate) async fn read_response(conn: &mut RawConn) -> std::io::Result<RawResponse> {
    use tokio::io::AsyncReadExt;
    let (status, headers) = read_head(conn).await?;
    let mut resp = RawResponse { status, headers, body: Vec::new() };
    if status < 200 || status == 204 || status == 304 {
        return Ok(resp);
    }
    let chunked = resp
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        for _ in 0..100_000 {
            match read_chunk(conn).await? {
                Some(data) => resp.body.extend_from_slice(&data),
                None => return Ok(resp),
            }
        }
        return Err(std::io::Error::other("over 100000 chunks"));
    }
    if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().map_err(|_| std::io::Error::other("bad content-length"))?;
        resp.body = vec![0; len];
        guarded(conn.read_exact(&mut resp.body)).await?;
        return Ok(resp);
    }
    guarded(conn.read_to_end(&mut resp.body)).await?;
    Ok(resp)
}

/// Reads until the peer closes or `wait` passes: the bytes read and whether it closed (a reset
/// counts as closed; the bytes before it are kept).
pub(crate) async fn read_until_closed<R: AsyncRead + Unpin>(
    conn: &mut R,
    wait: Duration,
) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let closed = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 8192];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (out, closed)
}

/// A call whose answer must be JSON, with a 10 s guard: status, headers and the parsed body.
pub(crate) async fn json_call(
    method: http::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (StatusCode, HeaderMap, serde_json::Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = http_body_util::Full::new(Bytes::from(body.unwrap_or_default().to_owned()));
    let resp =
        tokio::time::timeout(Duration::from_secs(10), client.request(req.body(body).unwrap()))
            .await
            .expect("answer within 10 s")
            .expect("the API answers");
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    (status, headers, v)
}

/// Reads the next request head a member got on `s` (at most 64 KiB), what follows it kept in
/// `buf` for the next call; `None` once the connection ends or the head is over the bound.
pub(crate) async fn next_head(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..at + 4]).into_owned();
            buf.drain(..at + 4);
            return Some(head);
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 65536 {
            return None;
        }
    }
}
