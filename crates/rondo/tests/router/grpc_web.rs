//! The `grpc_web` filter with real parts: curl sends gRPC-Web calls (binary and text, over
//! HTTP/1.1 and h2c) through the router to grpcio members (`grpc_peer.py`), and the test reads
//! the answer's frames byte for byte; a headless Chromium page makes calls with the grpc-web
//! npm library (`tests/ui/grpc_web.mjs`).

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::grpc::{Peer, peer};
use super::support::{dead_addr, router};
use crate::common::TempDir;
use crate::common::browser::{repo, run_node, tools_or_skip, ui_test_dir};

/// A listener `web` with a gRPC-Web route to the grpcio `peer`, one to a dead member, and
/// `extra` routes before them.
fn config(peer: &Peer, extra: &str) -> String {
    format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

{extra}
[[route]]
listener = "web"
match = {{ path_prefix = "/dead.Echo/" }}
cluster = "dead"
filters = [ {{ grpc_web = {{}} }} ]

[[route]]
listener = "web"
match = {{ path_prefix = "/test.Echo/" }}
cluster = "g"
filters = [ {{ grpc_web = {{ max_body_bytes = 1024 }} }} ]

[cluster.g]
upstream_protocol = "http2"
members = [ {{ name = "{}", address = "{}" }} ]

[cluster.dead]
upstream_protocol = "http2"
members = [ {{ name = "gone", address = "{}" }} ]
"#,
        peer.name,
        peer.addr,
        dead_addr()
    )
}

/// What a call got: the status, the content type, and the frames of the (decoded) body:
/// `(flags, payload)` each.
struct Call {
    status: u16,
    content_type: String,
    head: String,
    frames: Vec<(u8, Vec<u8>)>,
}

impl Call {
    /// The messages (data frames' payloads) as text.
    fn messages(&self) -> Vec<String> {
        let data = self.frames.iter().filter(|(flags, _)| flags & 0x80 == 0);
        data.map(|(_, p)| String::from_utf8_lossy(p).into_owned()).collect()
    }

    /// `grpc-status` and `grpc-message`, from the trailers' frame or else from the head.
    fn status(&self) -> (Option<String>, Option<String>) {
        let trailers = self.frames.iter().find(|(flags, _)| flags & 0x80 != 0);
        let text = match trailers {
            Some((_, p)) => String::from_utf8_lossy(p).into_owned(),
            None => self.head.clone(),
        };
        let field = |name: &str| {
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim().to_owned())
        };
        (field("grpc-status"), field("grpc-message"))
    }
}

/// A message's gRPC frame.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut f = vec![0];
    f.extend_from_slice(&(message.len() as u32).to_be_bytes());
    f.extend_from_slice(message);
    f
}

/// A gRPC-Web call of `method` with `body` (already framed, and base64 for text) by curl.
fn call(addr: SocketAddr, h2: bool, text: bool, method: &str, body: &[u8]) -> Call {
    let dir = TempDir::new("grpc-web-call");
    let (req, head, out) = (dir.0.join("req"), dir.0.join("head"), dir.0.join("out"));
    std::fs::write(&req, body).unwrap();
    let content_type =
        if text { "application/grpc-web-text+proto" } else { "application/grpc-web+proto" };
    let status = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-X", "POST"])
        .arg(if h2 { "--http2-prior-knowledge" } else { "--http1.1" })
        .args(["-H", &format!("content-type: {content_type}"), "-H", "x-grpc-web: 1"])
        .arg("--data-binary")
        .arg(format!("@{}", req.display()))
        .arg("-D")
        .arg(&head)
        .arg("-o")
        .arg(&out)
        .arg(format!("http://{addr}/{method}"))
        .status()
        .expect("curl runs");
    assert!(status.success(), "curl failed on {method}");
    let head = std::fs::read_to_string(&head).unwrap();
    let mut body = std::fs::read(&out).unwrap();
    let code = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: ").or_else(|| l.strip_prefix("Content-Type: ")))
        .unwrap_or_default()
        .trim()
        .to_owned();
    if text && code == 200 {
        body = STANDARD.decode(&body).unwrap_or_else(|e| panic!("no base64 ({e}): {body:?}"));
    }
    let mut frames = Vec::new();
    let mut rest = &body[..];
    while rest.len() >= 5 && code == 200 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        assert!(rest.len() >= 5 + len, "a cut frame in {body:?}");
        frames.push((rest[0], rest[5..5 + len].to_vec()));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty() || code != 200, "bytes after the frames: {rest:?}");
    Call { status: code, content_type, head, frames }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_calls_reach_grpc_members_and_come_back_framed() {
    let member = peer("m1", "ok", "serving");
    let r = router(&config(&member, "")).await;
    let addr = r.addr("web");
    let run = tokio::task::spawn_blocking(move || {
        for h2 in [false, true] {
            for text in [false, true] {
                let how = format!("h2={h2} text={text}");
                let body = |m: &[u8]| {
                    let f = frame(m);
                    if text { STANDARD.encode(f).into_bytes() } else { f }
                };
                let want_type = if text {
                    "application/grpc-web-text+proto"
                } else {
                    "application/grpc-web+proto"
                };
                // Unary: the member got the message (it echoes it), the status is a frame.
                let c = call(addr, h2, text, "test.Echo/Echo", &body(b"hello"));
                assert_eq!(c.status, 200, "{how}: {}", c.head);
                assert_eq!(c.content_type, want_type, "{how}");
                assert_eq!(c.messages(), ["m1:hello"], "{how}");
                assert_eq!(c.frames.last().map(|f| f.0), Some(0x80), "{how}: trailers last");
                assert_eq!(c.status().0.as_deref(), Some("0"), "{how}");
                // Server streaming: five messages, then the trailers.
                let c = call(addr, h2, text, "test.Echo/Many", &body(b"x"));
                let want: Vec<String> = (0..5).map(|i| format!("m1:{i}")).collect();
                assert_eq!(c.messages(), want, "{how}");
                assert_eq!(c.status().0.as_deref(), Some("0"), "{how}");
                // A member's error status reaches the client as gRPC-Web has it.
                let c = call(addr, h2, text, "test.Echo/Deny", &body(b"bob"));
                assert_eq!(c.status, 200, "{how}");
                let (code, message) = c.status();
                assert_eq!(code.as_deref(), Some("7"), "{how}: {}", c.head);
                assert!(message.is_some_and(|m| m.contains("no entry for bob")), "{how}");
                // The router's own error: a gRPC status in the head, in the client's type. No
                // body: the router answers before reading one, and then (RFC 9113 8.1) resets
                // the stream with NO_ERROR to stop the upload, which Debian's curl 7.88 reports
                // as error 92 when its upload had not finished (browsers take the answer).
                let c = call(addr, h2, text, "dead.Echo/Echo", b"");
                assert_eq!(c.status, 200, "{how}: {}", c.head);
                assert_eq!(c.status().0.as_deref(), Some("14"), "{how}: {}", c.head);
                assert!(c.content_type.starts_with("application/grpc-web"), "{how}: {}", c.head);
            }
            // A text body that is no base64 (INTERNAL, as for any malformed call), and one over
            // the filter's limit (RESOURCE_EXHAUSTED): the router's answers, in gRPC's terms.
            let c = call(addr, h2, true, "test.Echo/Echo", b"%%% not base64 %%%");
            assert_eq!(c.status().0.as_deref(), Some("13"), "{}", c.head);
            assert!(c.status().1.is_some_and(|m| m.contains("no base64")), "{}", c.head);
            let big = STANDARD.encode(frame(&[b'a'; 2048]));
            let c = call(addr, h2, true, "test.Echo/Echo", big.as_bytes());
            assert_eq!(c.status().0.as_deref(), Some("8"), "{}", c.head);
        }
    });
    run.await.unwrap();
}

/// Headless Chromium with the grpc-web npm library (its ES module bundle, which the router
/// itself serves with a `respond` filter): unary calls in both formats, a server stream, a
/// member's error and the router's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_calls_through_the_grpc_web_filter_with_the_grpc_web_library() {
    let Some(tools) = tools_or_skip("grpc-web browser test") else { return };
    let library = ui_test_dir().join("node_modules/grpc-web/index.esm.js");
    assert!(
        library.is_file(),
        "grpc-web is not installed: npm install --prefix {} grpc-web@2",
        ui_test_dir().display()
    );
    let member = peer("m1", "ok", "serving");
    let page = format!(
        r#"[[route]]
listener = "web"
match = {{ path = "/" }}
filters = [ {{ respond = {{ status = 200, body = "<!doctype html><title>grpc-web page</title>", headers = {{ "content-type" = "text/html" }} }} }} ]

[[route]]
listener = "web"
match = {{ path = "/grpc-web.js" }}
filters = [ {{ respond = {{ status = 200, body_file = "{}", headers = {{ "content-type" = "text/javascript" }} }} }} ]
"#,
        library.display()
    );
    let r = router(&config(&member, &page)).await;
    let dir = TempDir::new("grpc-web-browser");
    let env = [("PAGE_URL", format!("http://127.0.0.1:{}/", r.addr("web").port()))];
    let script = repo().join("crates/rondo/tests/ui/grpc_web.mjs");
    let run = tokio::task::spawn_blocking(move || {
        run_node(&tools, &script, &env, &dir.0, Duration::from_secs(90))
    });
    if let Err(why) = run.await.unwrap() {
        panic!("{why}");
    }
}
