//! The `compress` filter through real clients: curl on HTTP/1.1 (handed to hyper's path) and
//! h2c asks for each encoding; the bytes are decoded by curl (`--compressed`) and by
//! async-compression's decoders and must be the member's exactly. Every case that must stay
//! uncompressed stays so; a member's long streamed body arrives whole, its first bytes before
//! the member has sent the rest; trailers pass through; the metrics count both sides.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_compression::tokio::write::{BrotliDecoder, GzipDecoder, ZstdDecoder};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, mpsc};

use rondo_runtime::metrics::Handoff;

use super::support::{TestRouter, client_of, router};

/// The text bodies: lines that compress, but not to nothing.
fn text(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 64);
    let mut i: u64 = 0;
    while out.len() < n {
        let x = i.wrapping_mul(2_654_435_761) % 100_003;
        out.extend_from_slice(format!("line {i}: the quick brown fox {x} jumps\n").as_bytes());
        i += 1;
    }
    out.truncate(n);
    out
}

const STREAM_FIRST: usize = 3_000;
const STREAM_REST: usize = 4 * 1024 * 1024;

/// The test member: answers by path, and streams `/stream` (its first bytes, then the rest
/// once `release` is notified, then trailers).
struct Member {
    addr: SocketAddr,
    release: Arc<Notify>,
}

type Resp = Response<BoxBody<Bytes, Infallible>>;

fn answer(path: &str) -> Option<Resp> {
    let full = |b: Vec<u8>| Full::new(Bytes::from(b)).boxed();
    let mut r = Response::builder().status(200);
    let body = match path {
        "/text" | "/etag" => {
            r = r.header("content-type", "text/plain; charset=utf-8").header("etag", "\"v1\"");
            text(100_000)
        }
        "/weak" => {
            r = r.header("content-type", "text/plain").header("etag", "W/\"v1\"");
            text(5_000)
        }
        "/json" => {
            r = r.header("content-type", "application/json");
            format!("{{\"lines\": {:?}}}", String::from_utf8(text(20_000)).unwrap()).into_bytes()
        }
        "/png" => {
            r = r.header("content-type", "image/png");
            text(20_000)
        }
        "/small" => {
            r = r.header("content-type", "text/plain");
            text(500)
        }
        "/encoded" => {
            r = r.header("content-type", "text/plain").header("content-encoding", "gzip");
            text(20_000)
        }
        "/no-transform" => {
            r = r
                .header("content-type", "text/plain")
                .header("cache-control", "public, no-transform");
            text(20_000)
        }
        "/partial" => {
            r = r
                .status(206)
                .header("content-type", "text/plain")
                .header("content-range", "bytes 0-19999/40000");
            text(20_000)
        }
        "/empty" => {
            r = r.status(204).header("content-type", "text/plain");
            Vec::new()
        }
        "/not-modified" => {
            r = r.status(304).header("content-type", "text/plain");
            Vec::new()
        }
        _ => return None,
    };
    Some(r.body(full(body)).unwrap())
}

fn stream(release: Arc<Notify>) -> Resp {
    let (tx, rx) = mpsc::channel::<Frame<Bytes>>(4);
    tokio::spawn(async move {
        let all = text(STREAM_FIRST + STREAM_REST);
        let _ = tx.send(Frame::data(Bytes::copy_from_slice(&all[..STREAM_FIRST]))).await;
        release.notified().await;
        for chunk in all[STREAM_FIRST..].chunks(64 * 1024) {
            if tx.send(Frame::data(Bytes::copy_from_slice(chunk))).await.is_err() {
                return;
            }
        }
        let mut t = HeaderMap::new();
        t.insert("x-checksum", HeaderValue::from(all.len()));
        let _ = tx.send(Frame::trailers(t)).await;
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (Ok::<_, Infallible>(f), rx))
    });
    Response::builder()
        .header("content-type", "text/plain")
        .body(StreamBody::new(frames).boxed())
        .unwrap()
}

impl Member {
    async fn spawn() -> Member {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let release = Arc::new(Notify::new());
        let rel = release.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else { continue };
                let rel = rel.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let rel = rel.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let resp = match path.as_str() {
                                "/stream" => stream(rel),
                                p => answer(p).unwrap_or_else(|| {
                                    let mut r = Response::new(Empty::new().boxed());
                                    *r.status_mut() = StatusCode::NOT_FOUND;
                                    r
                                }),
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let b = auto::Builder::new(TokioExecutor::new());
                    let _ = b.serve_connection(TokioIo::new(s), svc).await;
                });
            }
        });
        Member { addr, release }
    }
}

async fn start(filter: &str, upstream: &str) -> (TestRouter, Member, String) {
    let m = Member::spawn().await;
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
name = "z"
listener = "web"
cluster = "c"
filters = [ {{ compress = {filter} }} ]

[cluster.c]
{upstream}
members = [ {{ name = "m", address = "{}" }} ]
"#,
        m.addr
    );
    let r = router(&config).await;
    let base = format!("http://127.0.0.1:{}", r.addr("web").port());
    (r, m, base)
}

/// What curl got: status, header fields (lower-case names), body bytes.
struct Got {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// curl `method url`, with `--compressed` (curl decodes) or without (the bytes as sent).
async fn curl(h2: bool, method: &str, url: String, headers: Vec<String>, decode: bool) -> Got {
    let method = method.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "--max-time", "20", "-D", "-", "-o", "-"]);
        if method != "HEAD" {
            cmd.args(["--request", &method]);
        }
        cmd.arg(if h2 { "--http2-prior-knowledge" } else { "--http1.1" });
        if method == "HEAD" {
            cmd.arg("--head");
        }
        if decode {
            cmd.arg("--compressed");
        }
        for h in &headers {
            cmd.args(["-H", h]);
        }
        let out = cmd.arg(&url).output().expect("curl runs");
        assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
        let at = out.stdout.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
        let head = String::from_utf8_lossy(&out.stdout[..at]).into_owned();
        let mut lines = head.lines();
        let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok());
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Got { status: status.expect("a status"), headers, body: out.stdout[at + 4..].to_vec() }
    })
    .await
    .unwrap()
}

/// `bytes` decoded from `encoding` by async-compression's decoders.
async fn decode(encoding: &str, bytes: &[u8]) -> Vec<u8> {
    macro_rules! run {
        ($d:ident) => {{
            let mut d = $d::new(Vec::new());
            d.write_all(bytes).await.expect("decodes");
            d.shutdown().await.expect("a whole stream");
            d.into_inner()
        }};
    }
    match encoding {
        "gzip" => run!(GzipDecoder),
        "br" => run!(BrotliDecoder),
        "zstd" => run!(ZstdDecoder),
        other => panic!("unexpected encoding {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_encoding_decodes_to_the_members_exact_bytes() {
    let (r, _m, base) =
        start(r#"{ types = ["text/*", "application/json"], min_bytes = 1024, level = 6 }"#, "")
            .await;
    let want = text(100_000);
    for h2 in [false, true] {
        for enc in ["gzip", "br", "zstd"] {
            let url = format!("{base}/text");
            let got =
                curl(h2, "GET", url.clone(), vec![format!("accept-encoding: {enc}")], false).await;
            let what = format!("h2={h2} {enc}");
            assert_eq!(got.status, 200, "{what}");
            assert_eq!(got.header("content-encoding"), Some(enc), "{what}");
            assert_eq!(got.header("content-length"), None, "{what}");
            assert_eq!(got.header("vary"), Some("accept-encoding"), "{what}");
            assert_eq!(got.header("etag"), Some("W/\"v1\""), "{what}: a strong tag made weak");
            assert!(got.body.len() < want.len() / 2, "{what}: {} bytes", got.body.len());
            assert!(decode(enc, &got.body).await == want, "{what}: decoded differs");
            // curl decodes it too.
            let got = curl(h2, "GET", url, vec![format!("accept-encoding: {enc}")], true).await;
            assert!(got.body == want, "{what}: curl's decoding differs");
        }
        // Plain `--compressed` (curl offers every encoding it has): the router's order, br first.
        let got = curl(h2, "GET", format!("{base}/json"), vec![], true).await;
        assert_eq!(got.header("content-encoding"), Some("br"), "h2={h2}");
        assert!(got.body.starts_with(b"{\"lines\": \"line 0:"), "h2={h2}");
        // Ties go to the router's preference, q-values to the client's.
        let cases =
            [("gzip, zstd", "zstd"), ("br;q=0.5, gzip;q=0.9", "gzip"), ("br;q=0, *", "zstd")];
        for (accept, chosen) in cases {
            let got = curl(
                h2,
                "GET",
                format!("{base}/text"),
                vec![format!("accept-encoding: {accept}")],
                false,
            )
            .await;
            assert_eq!(got.header("content-encoding"), Some(chosen), "h2={h2} {accept}");
        }
        let got =
            curl(h2, "GET", format!("{base}/weak"), vec!["accept-encoding: gzip".into()], false)
                .await;
        assert_eq!(got.header("etag"), Some("W/\"v1\""), "h2={h2}: a weak tag stays");
    }
    // Every HTTP/1.1 connection went to hyper's path at its first request, which names a
    // `compress` route.
    let handed = r.live.metrics.listener("web").handoffs.get(Handoff::Route);
    assert!(handed >= 4, "{handed} hand-offs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_must_stay_uncompressed_does() {
    let (_r, _m, base) = start(
        r#"{ types = ["text/*", "application/json"], min_bytes = 1024, encodings = ["gzip"] }"#,
        "",
    )
    .await;
    for h2 in [false, true] {
        let ae = || vec!["accept-encoding: gzip, br, zstd".to_owned()];
        let cases: [(&str, &str, Vec<String>, u16, bool); 9] = [
            ("GET", "/png", ae(), 200, false),
            ("GET", "/small", ae(), 200, false),
            ("GET", "/encoded", ae(), 200, false),
            ("GET", "/no-transform", ae(), 200, false),
            ("GET", "/partial", ae(), 206, false),
            ("GET", "/text", [ae(), vec!["range: bytes=0-99".into()]].concat(), 200, false),
            ("HEAD", "/text", ae(), 200, false),
            ("GET", "/text", vec!["accept-encoding: identity".into()], 200, true),
            ("GET", "/text", vec![], 200, true),
        ];
        for (method, path, headers, status, vary) in cases {
            let what = format!("h2={h2} {method} {path} {headers:?}");
            let got = curl(h2, method, format!("{base}{path}"), headers, false).await;
            assert_eq!(got.status, status, "{what}");
            let ce = got.header("content-encoding");
            if path == "/encoded" {
                assert_eq!(ce, Some("gzip"), "{what}: the member's own encoding stays");
            } else {
                assert_eq!(ce, None, "{what}");
            }
            assert_eq!(got.header("vary").is_some(), vary, "{what}");
            if method == "GET" && path != "/partial" {
                assert!(got.header("content-length").is_some(), "{what}: the length stays");
            }
            if method == "GET" && path == "/text" {
                assert_eq!(got.body, text(100_000), "{what}");
            }
        }
        for path in ["/empty", "/not-modified"] {
            let got = curl(
                h2,
                "GET",
                format!("{base}{path}"),
                vec!["accept-encoding: gzip".into()],
                false,
            )
            .await;
            assert_eq!(got.header("content-encoding"), None, "h2={h2} {path}");
            assert!(got.body.is_empty(), "h2={h2} {path}");
        }
    }
}

/// Reads `body` to its end (bounded), decoding gzip as it comes; once the first
/// `STREAM_FIRST` bytes decode, `release` lets the member send the rest. The decoded body and
/// the trailers.
async fn read_stream(body: Incoming, release: &Notify) -> (Vec<u8>, Option<HeaderMap>) {
    let mut body = body;
    let mut decoder = GzipDecoder::new(Vec::new());
    let mut released = false;
    let mut trailers = None;
    for _ in 0..100_000 {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await;
        let frame = match frame {
            Ok(Some(f)) => f.expect("the body streams"),
            Ok(None) => break,
            Err(_) if !released => {
                panic!("the member's first bytes did not reach the client before its rest")
            }
            Err(_) => panic!("the body stalled"),
        };
        match frame.into_data() {
            Ok(data) => {
                decoder.write_all(&data).await.unwrap();
                decoder.flush().await.unwrap();
                if !released && decoder.get_ref().len() >= STREAM_FIRST {
                    assert_eq!(decoder.get_ref().len(), STREAM_FIRST, "the rest came only after");
                    released = true;
                    release.notify_one();
                }
            }
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    decoder.shutdown().await.expect("a whole gzip stream");
    (decoder.into_inner(), trailers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_is_compressed_as_it_comes_and_arrives_whole_with_its_trailers() {
    for h2 in [false, true] {
        let upstream = if h2 { "upstream_protocol = \"http2\"" } else { "" };
        let (r, m, base) = start(r#"{ encodings = ["gzip"] }"#, upstream).await;
        let client = client_of::<Empty<Bytes>>(h2);
        let req = Request::get(format!("{base}/stream"))
            .header("accept-encoding", "gzip")
            .body(Empty::new())
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
            .await
            .expect("an answer")
            .expect("the request succeeds");
        assert_eq!(resp.headers().get("content-encoding").unwrap(), "gzip", "h2={h2}");
        let (decoded, trailers) = read_stream(resp.into_body(), &m.release).await;
        let want = text(STREAM_FIRST + STREAM_REST);
        assert_eq!(decoded.len(), want.len(), "h2={h2}");
        assert!(decoded == want, "h2={h2}: the stream decodes to the member's bytes");
        if h2 {
            // Member and client both speak HTTP/2: the member's trailers come through.
            let t = trailers.expect("trailers");
            assert_eq!(t.get("x-checksum").unwrap(), &want.len().to_string(), "h2={h2}");
        }
        // Both sides counted: every byte in, fewer out.
        let text = r.live.metrics.render(&r.live.load());
        let count = |name: &str| -> u64 {
            let key =
                format!("rondo_compress_bytes_{name}_total{{route=\"z\",encoding=\"gzip\"}} ");
            let line = text
                .lines()
                .find(|l| l.starts_with(&key))
                .unwrap_or_else(|| panic!("{key} in\n{text}"));
            line[key.len()..].trim().parse().unwrap()
        };
        assert_eq!(count("in"), want.len() as u64, "h2={h2}");
        assert!(count("out") > 0 && count("out") < want.len() as u64 / 2, "h2={h2}");
    }
}
