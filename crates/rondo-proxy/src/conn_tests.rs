//! `conn.rs`'s tests against a real loopback connection: an HTTP/2 connection error's GOAWAY
//! between frames, and an oversized frame cut off with `FRAME_SIZE_ERROR`.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TimedIo on the router's end of a loopback connection already known to speak HTTP/2,
/// and the client's end.
async fn pair() -> (TimedIo, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    let metrics = rondo_runtime::metrics::Metrics::new().listener("test");
    let state = ConnState::with_tls(
        Duration::from_secs(30),
        (http::HeaderValue::from_static("x"), false),
        metrics,
        None,
        (peer, peer),
    );
    let budget = Arc::new(ResetBudget::new(rondo_config::Http2Limits::default()));
    let mut io = TimedIo::new(server, state, Duration::from_secs(30), budget, peer.ip());
    io.h2 = Some(true);
    io.preface = H2_PREFACE.len();
    (io, client)
}

fn data_frame(stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([0, 0]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

// The GOAWAY of a connection error goes between two frames, never inside one: a write that
// ends mid-frame is finished first (and no further), then the GOAWAY, then the close.
#[tokio::test]
async fn goaway_waits_for_the_frame_being_written() {
    let (mut io, mut client) = pair().await;
    let first = data_frame(1, &[b'a'; 1000]);
    let second = data_frame(3, &[b'b'; 50]);
    // hyper got 100 bytes of the first frame out, then the connection error began.
    io.write_all(&first[..100]).await.unwrap();
    io.side.last_stream = 3;
    io.start_abort(frames::ENHANCE_YOUR_CALM);
    let mut rest = first[100..].to_vec();
    rest.extend(&second);
    let n = io.write(&rest).await.unwrap();
    assert_eq!(n, first.len() - 100, "only the rest of the frame being written passes");
    let server = tokio::spawn(async move { io.write(&second).await });
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(&got[..first.len()], &first[..]);
    assert_eq!(&got[first.len()..], &frames::goaway(3, frames::ENHANCE_YOUR_CALM)[..]);
    // The client closing ends the lingering read; hyper's write then fails.
    drop(client);
    let failed = tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert_eq!(failed.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
}

// A frame the client may not send is not passed on: hyper reads the frames before it, then
// an error; the client reads GOAWAY FRAME_SIZE_ERROR naming its last stream.
#[tokio::test]
async fn a_bad_frame_is_cut_off_and_answered_with_frame_size_error() {
    let (mut io, mut client) = pair().await;
    let mut headers = data_frame(5, &[0x82]);
    headers[3] = frames::HEADERS;
    let mut wire = headers.clone();
    let mut ping = data_frame(0, &[0; 6]);
    ping[3] = frames::PING;
    wire.extend(&ping);
    client.write_all(&wire).await.unwrap();
    let mut buf = vec![0u8; 100];
    let n = io.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], &headers[..]);
    let server = tokio::spawn(async move { io.read(&mut buf).await });
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, frames::goaway(5, frames::FRAME_SIZE_ERROR));
    drop(client);
    let failed = tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert_eq!(failed.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
}
