//! One HTTP/1.1 keep-alive client connection (hyper's low-level client).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::header::{HOST, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A keep-alive connection to one target. Dropping it closes the connection.
#[derive(Debug)]
pub struct Conn {
    sender: SendRequest<Empty<Bytes>>,
    host: HeaderValue,
    /// Where it is connected.
    pub target: SocketAddr,
}

impl Conn {
    /// Connects to `target` within `timeout`.
    pub async fn connect(target: SocketAddr, timeout: Duration) -> anyhow::Result<Conn> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(target))
            .await
            .with_context(|| format!("connecting to {target}: timed out"))?
            .with_context(|| format!("connecting to {target}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("handshake with {target}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let host = HeaderValue::from_str(&target.to_string())?;
        Ok(Conn { sender, host, target })
    }

    /// Sends `GET path` and reads the whole response; returns its status.
    pub async fn get(&mut self, path: &str) -> anyhow::Result<StatusCode> {
        self.sender.ready().await.context("connection closed")?;
        let req = Request::get(path).header(HOST, self.host.clone()).body(Empty::new())?;
        let resp = self.sender.send_request(req).await.context("request failed")?;
        let status = resp.status();
        resp.into_body().collect().await.context("reading the response body")?;
        Ok(status)
    }

    /// Whether the connection can still carry requests.
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }
}
