//! A cluster's `connect_timeout` (issue 38): a member whose listen queue is full drops SYNs, so
//! a connection to it neither opens nor fails; the try ends at the cluster's timeout instead of
//! the default 5 s, on the own HTTP/1 path, on hyper's (h2c) and on a `tcp` listener.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::support::*;

/// A socket listening with a backlog of 1 that never accepts, its queue filled: further SYNs
/// are dropped. Kept alive with the connections that fill it.
fn black_hole() -> (SocketAddr, Vec<std::net::TcpStream>, tokio::net::TcpListener) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let addr = socket.local_addr().unwrap();
    let listener = socket.listen(1).expect("listen");
    let mut fill = Vec::new();
    for _ in 0..16 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => fill.push(s),
            Err(_) => return (addr, fill, listener),
        }
    }
    panic!("the listen queue never filled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_never_answers_the_syn_fails_at_the_clusters_connect_timeout() {
    let (hole, _fill, _listener) = black_hole();
    let member = format!("{{ name = \"hole\", address = \"{hole}\" }}");
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[listener]]\nname = \"raw\"\nlisten = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [[route]]\nlistener = \"raw\"\ncluster = \"t\"\n\n\
         [cluster.c]\nconnect_timeout = \"300ms\"\nretry = {{ attempts = 1 }}\nmembers = [{member}]\n\n\
         [cluster.t]\nupstream_protocol = \"tcp\"\nconnect_timeout = \"300ms\"\nmembers = [{member}]\n"
    );
    let r = router(&config).await;
    // The default would hold each of these for 5 s; the cluster says 300 ms.
    let started = Instant::now();
    let reply = get(&client(), &r.url("web", "/own")).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert!(started.elapsed() < Duration::from_secs(3), "own path: {:?}", started.elapsed());

    let started = Instant::now();
    let reply = get(&h2_client(), &r.url("web", "/hyper")).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert!(started.elapsed() < Duration::from_secs(3), "hyper's path: {:?}", started.elapsed());

    let started = Instant::now();
    let mut conn = raw_connect(r.addr("raw")).await;
    raw_send(&mut conn, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
    let mut rest = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut rest);
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await.expect("closed");
    assert!(started.elapsed() < Duration::from_secs(3), "tcp: {:?}", started.elapsed());
}
