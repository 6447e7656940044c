//! What an idle client connection holds on the router's own HTTP/1 path: no buffer. Its own
//! test binary (one router in the process), since the count of lent buffers is process-wide.

mod common;

#[path = "router/support.rs"]
mod support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_hold_no_buffer() {
    let ms = support::members(1, Duration::ZERO).await;
    let r = support::router(&support::one_cluster(&support::member_list(&ms))).await;
    let addr = r.addr("web");
    // Silent connections (never a byte), and keep-alive connections after one request each.
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    let mut kept = Vec::new();
    for _ in 0..50 {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
            let n = s.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed before the response");
            got.extend_from_slice(&chunk[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
        kept.push(s);
    }
    // Every response is over; give the connections' tasks a moment to settle.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rondo_proxy::h1::pool::in_use() != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        rondo_proxy::h1::pool::in_use(),
        0,
        "buffers held by 100 idle connections (50 silent, 50 after a request)"
    );
    drop((silent, kept));
}
