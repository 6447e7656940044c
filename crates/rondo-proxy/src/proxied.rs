//! Member connections of HTTP clusters with `proxy_protocol` (the PROXY header sent to members):
//! each starts with one client's address, so it may carry only that client's requests. Both
//! codecs keep them per client connection: hyper's path in a pool of the connection's own
//! ([`PerConn`], in its `ConnState`), the own HTTP/1 path in one slot of its connection loop
//! ([`Kept`]). Keyed by the client connection rather than pooled by address: nothing outlives
//! the client's connection (no table to bound or expire), and two clients can never share a
//! member connection, whatever their addresses. Clusters without the header never look here.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use std::any::Any;

use rondo_core::{ProxyHeader, TlsFailure};
use rondo_runtime::ClusterRt;
use rondo_runtime::pools::{Clients, PoolBody, Sender};
use tokio::net::TcpStream;

/// A client connection's pools for clusters with `proxy_protocol` (hyper's path), at most this
/// many (a client that reaches more clusters, or the same ones over many reloads, drops its
/// oldest pool and with it that pool's member connections).
const MAX_POOLS: usize = 8;

/// A pool for one client's connections to a cluster's members.
type ClientPool<B> = Arc<Sender<'static, B>>;

/// One client connection's pools, per cluster (hyper's path). Each pool is kept as `Any`: the
/// connection's state knows nothing of the request path's body type.
pub(crate) struct PerConn {
    /// The client's address and the one it reached (the header's source and destination).
    addrs: (SocketAddr, SocketAddr),
    pools: Mutex<Vec<(Arc<ClusterRt>, AnyPool)>>,
}

/// A [`ClientPool`] of any body type.
type AnyPool = Arc<dyn Any + Send + Sync>;

impl std::fmt::Debug for PerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerConn").field("addrs", &self.addrs).finish_non_exhaustive()
    }
}

impl PerConn {
    /// No pool yet (nothing is allocated until a request reaches such a cluster).
    pub(crate) fn new(client: SocketAddr, local: SocketAddr) -> Self {
        PerConn { addrs: (client, local), pools: Mutex::default() }
    }

    /// The pool of this client's connections to `rt`'s members, made at its first request.
    pub(crate) fn sender<B>(
        &self,
        clients: &Clients<B>,
        rt: &Arc<ClusterRt>,
        version: ProxyHeader,
    ) -> Result<ClientPool<B>, TlsFailure>
    where
        B: PoolBody + Sync,
        B::Data: Send,
        B::Error: Into<rondo_runtime::pools::BoxError>,
    {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let found = pools.iter().find(|(r, _)| Arc::ptr_eq(r, rt));
        if let Some(sender) =
            found.and_then(|(_, p)| p.clone().downcast::<Sender<'static, B>>().ok())
        {
            return Ok(sender);
        }
        pools.retain(|(r, _)| !Arc::ptr_eq(r, rt));
        let header = crate::proxy_protocol::header(version, self.addrs.0, self.addrs.1);
        let sender = Arc::new(clients.for_client(rt, header.into())?);
        if pools.len() >= MAX_POOLS {
            pools.remove(0);
        }
        pools.push((rt.clone(), sender.clone()));
        Ok(sender)
    }
}

/// The own HTTP/1 path's one member connection kept for its client (a cluster with
/// `proxy_protocol`): the member's address, and the connection, whose PROXY header named this
/// client. A keep-alive client's next request to the same member takes it; one to another
/// member replaces it. Boxed: every idle client connection's future holds one, most of them
/// empty.
#[derive(Default)]
pub(crate) struct Kept(Option<Box<(Box<str>, TcpStream)>>);

impl Kept {
    /// The kept connection when it goes to `address` and is still open and quiet.
    pub(crate) fn take(&mut self, address: &str) -> Option<TcpStream> {
        match self.0.take().map(|kept| *kept) {
            Some((to, conn)) if &*to == address && crate::h1::pool::is_quiet(&conn) => Some(conn),
            _ => None,
        }
    }

    /// Keeps `conn`, to `address`, for this client's next request (closing any kept before).
    pub(crate) fn keep(&mut self, address: &str, conn: TcpStream) {
        self.0 = Some(Box::new((address.into(), conn)));
    }
}
