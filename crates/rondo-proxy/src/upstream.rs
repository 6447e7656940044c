//! Connections to members: one keep-alive pool per member address (hyper-util's pooled client,
//! keyed by authority), HTTP/1.1 or HTTP/2 prior knowledge per cluster.

use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rondo_core::UpstreamProtocol;

use crate::body::UpstreamBody;

/// A pooled client.
pub type Pool = Client<HttpConnector, UpstreamBody>;

/// The pools of one router.
#[derive(Debug, Clone)]
pub struct Clients {
    h1: Pool,
    h2: Pool,
}

impl Clients {
    /// Pools with `connect_timeout` for new connections.
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        connector.enforce_http(true);
        let h1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_timer(TokioTimer::new())
            .build(connector.clone());
        let h2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        Clients { h1, h2 }
    }

    /// The pool for a cluster's protocol.
    pub fn for_protocol(&self, p: UpstreamProtocol) -> &Pool {
        match p {
            UpstreamProtocol::Http2 => &self.h2,
            UpstreamProtocol::Http1 | UpstreamProtocol::Tcp => &self.h1,
        }
    }
}
