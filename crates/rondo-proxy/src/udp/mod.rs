//! `udp` listeners (CLB's Network Load Balancing; Envoy's UDP proxy; NGINX `stream` UDP): each
//! client address is a flow, placed once on a member of the route's cluster (then its backups)
//! by the cluster's balancer, as a TCP connection is, and counted in flight on that member while
//! it lasts (so `least-connections` sees open flows). A flow has a socket connected to its
//! member; the member's answers come back on it and leave from the listener's socket to that
//! client alone (`relay.rs`). With `granularity = "request"` every datagram is placed, and a
//! client has a flow per member it was sent to. A flow ends after `idle_timeout` without a
//! datagram either way, when its member refuses a datagram (ICMP port unreachable: a failure
//! charged to the member, and the datagram is placed again, away from it), or when the table is
//! full and a new flow evicts it (`flows.rs`).
//!
//! The hot path (a datagram of an open flow) takes one lock of the flow table for a lookup and
//! sends from the receive buffer: no allocation, no pick. In an upgrade the listener's socket
//! is handed over like HTTP/3's; the old process stops reading it, and its flows go on relaying
//! answers until they are idle for [`DRAIN_IDLE`] (bounded by the process's drain).

mod flows;
mod relay;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rondo_config::{ListenerSpec, UdpGranularity, UdpSpec};
use rondo_core::PickRequest;
use rondo_runtime::metrics::UdpMetrics;
use rondo_runtime::{ClusterRt, Live, clock};
use tokio::net::UdpSocket;
use tokio::sync::{Semaphore, watch};

use flows::{Flow, FlowTable, Key};

/// The largest datagram read: UDP's largest payload.
const MAX_DATAGRAM: usize = 65_535;

/// Once the listener stops (a drain, an upgrade), how long a flow lasts without a datagram.
pub const DRAIN_IDLE: Duration = Duration::from_secs(1);

/// One `udp` listener's state, shared by its receive loop and its flows' relay tasks.
#[derive(Debug)]
struct Shared {
    name: Arc<str>,
    spec: UdpSpec,
    live: Arc<Live>,
    /// The view in effect (loaded once per datagram that opens a flow).
    views: rondo_runtime::Views,
    socket: Arc<UdpSocket>,
    table: Mutex<FlowTable>,
    /// A permit per open flow: the router's drain waits for them.
    slots: Arc<Semaphore>,
    /// The listener's clock starts here ([`Shared::now_ms`]).
    epoch: Instant,
    /// Datagrams no cluster took (no route, no eligible member).
    unplaced: UdpMetrics,
    /// Handles by cluster, resolved once per cluster name.
    by_cluster: Mutex<HashMap<String, UdpMetrics>>,
    stopped: watch::Receiver<bool>,
}

impl Shared {
    /// Milliseconds since the listener started: flows' idle clock.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn metrics(&self, cluster: &str) -> UdpMetrics {
        let mut m = self.by_cluster.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = m.get(cluster) {
            return h.clone();
        }
        let h = self.live.metrics.udp(&self.name, cluster);
        m.insert(cluster.to_owned(), h.clone());
        h
    }

    fn table(&self) -> std::sync::MutexGuard<'_, FlowTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Binds (or takes over) `spec`'s socket and starts its receive loop; returns the bound address,
/// the flow slots (all free when no flow is open) and the loop, which ends on `stopped`.
pub async fn start(
    spec: &ListenerSpec,
    live: Arc<Live>,
    stopped: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, (Arc<Semaphore>, u32), tokio::task::JoinHandle<()>)> {
    let udp = spec.udp.unwrap_or_default();
    let what = format!("listener {} udp", spec.name);
    let socket = live.sockets.udp(&what, spec.listen, spec.listen).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot bind {what} to {}: {e}", spec.listen))
    })?;
    let addr = socket.local_addr()?;
    let slots = Arc::new(Semaphore::new(udp.max_flows as usize));
    let name: Arc<str> = spec.name.as_str().into();
    let shared = Arc::new(Shared {
        unplaced: live.metrics.udp(&name, ""),
        name,
        spec: udp,
        views: live.views.clone(),
        live,
        socket: Arc::new(socket),
        table: Mutex::new(FlowTable::new(udp.max_flows as usize)),
        slots: slots.clone(),
        epoch: Instant::now(),
        by_cluster: Mutex::new(HashMap::new()),
        stopped,
    });
    Ok((addr, (slots, udp.max_flows), tokio::spawn(receive(shared))))
}

/// The listener's receive loop: every datagram to its flow, opened when there is none.
async fn receive(shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut stopped = shared.stopped.clone();
    loop {
        tokio::select! {
            biased;
            _ = stopped.changed() => return,
            r = shared.socket.readable() => {
                if let Err(e) = r {
                    tracing::warn!(listener = %shared.name, "udp socket failed: {e}");
                    return;
                }
            }
        }
        // Everything queued now, then back to waiting (bounded: the stop is seen between
        // batches).
        for _ in 0..1024 {
            match shared.socket.try_recv_from(&mut buf) {
                Ok((n, client)) => forward(&shared, client, &buf[..n]).await,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // An ICMP error for an earlier answer to a client (Linux reports those on the
                // listener's socket too): nothing to do but go on.
                Err(_) => continue,
            }
        }
    }
}

/// Passes `datagram` from `client` to its flow's member: the open flow's, or a new flow's.
/// A member that refuses it (ICMP port unreachable, seen on the flow's socket) ends its flow as
/// a failure; the datagram is then placed once more, on another member.
async fn forward(shared: &Arc<Shared>, client: SocketAddr, datagram: &[u8]) {
    let mut refused: Option<usize> = None;
    for _ in 0..2 {
        let flow = match shared.spec.granularity {
            UdpGranularity::Flow => {
                let key = Key { client, member: u32::MAX };
                let open = shared.table().get(&key).cloned();
                match open {
                    Some(f) if refused.is_none() => Some(f),
                    _ => open_flow(shared, key, refused).await,
                }
            }
            UdpGranularity::Request => per_request(shared, client, refused).await,
        };
        let Some(flow) = flow else {
            shared.unplaced.dropped.inc();
            return;
        };
        flow.touch(shared.now_ms());
        let sent = match flow.socket.try_send(datagram) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                flow.socket.send(datagram).await
            }
            r => r,
        };
        match sent {
            Ok(_) => {
                flow.metrics.datagrams_in.inc();
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = Some(flow.member);
                relay::fail(shared, &flow);
            }
            Err(_) => {
                flow.metrics.dropped.inc();
                return;
            }
        }
    }
    shared.unplaced.dropped.inc();
}

/// `granularity = "request"`: the datagram is placed by the cluster's picker (away from
/// `avoid`), then goes over the client's flow to that member, opened if needed.
async fn per_request(
    shared: &Arc<Shared>,
    client: SocketAddr,
    avoid: Option<usize>,
) -> Option<Arc<Flow>> {
    let (rt, member) = place(shared, client, avoid, false)?;
    let key = Key { client, member: member as u32 };
    let open = shared.table().get(&key).cloned();
    if let Some(f) = open {
        // The same member, unless a reload gave its index to another: that flow ends.
        let name = |rt: &ClusterRt, m: usize| rt.spec.members.get(m).map(|m| m.name.clone());
        if Arc::ptr_eq(&f.rt, &rt) || name(&f.rt, f.member) == name(&rt, member) {
            return Some(f);
        }
        shared.table().remove(&key, f.id);
        relay::stop(&f);
    }
    // Counted in flight on the member for as long as the flow lasts.
    rt.with(|b| b.begin_request(member));
    start_flow(shared, key, (rt, member)).await
}

/// Opens a flow for `key` on a member the route's clusters place it on (away from `avoid`).
async fn open_flow(shared: &Arc<Shared>, key: Key, avoid: Option<usize>) -> Option<Arc<Flow>> {
    let placed = place(shared, key.client, avoid, true)?;
    start_flow(shared, key, placed).await
}

/// Picks a member for `client`'s datagram from the route's cluster, then its backups in order
/// (hashing on the client's address for `hash`), away from `avoid`; `begin`: counted in flight
/// on it at once, in the same lock as the pick.
fn place(
    shared: &Shared,
    client: SocketAddr,
    avoid: Option<usize>,
    begin: bool,
) -> Option<(Arc<ClusterRt>, usize)> {
    let snapshot = shared.views.load();
    let Some(route) = snapshot.view.routes.iter().find(|r| *r.listener == *shared.name) else {
        tracing::debug!(listener = %shared.name, "no route for the udp listener; datagram dropped");
        return None;
    };
    let hash = Some(match client.ip() {
        std::net::IpAddr::V4(ip) => rondo_core::hash::hash_key(&ip.octets()),
        std::net::IpAddr::V6(ip) => rondo_core::hash::hash_key(&ip.octets()),
    });
    let exclude = avoid.as_slice();
    let group = shared.live.group.as_deref();
    for cluster in std::iter::once(&route.cluster).chain(&route.backups) {
        let Some(rt) = snapshot.clusters.get(cluster) else { continue };
        let req = PickRequest { now: clock::now(), group, hash, context: None, exclude };
        let picked = if begin { rt.pick_and_begin(&req) } else { rt.pick(&req) };
        match picked {
            Ok(d) => return Some((rt.clone(), d.member)),
            Err(e) => {
                if let Some(b) = crate::error::Breaker::of(&e) {
                    shared.live.metrics.breaker(cluster, b.as_str());
                }
            }
        }
    }
    None
}

/// A flow for `key` to `member` of `rt` (already counted in flight there): its socket connected
/// to the member, kept in the table (making room if it is full) and its relay task started.
/// `None` (the in-flight count given back) when no socket could be had.
async fn start_flow(
    shared: &Arc<Shared>,
    key: Key,
    (rt, member): (Arc<ClusterRt>, usize),
) -> Option<Arc<Flow>> {
    let metrics = shared.metrics(&rt.spec.name);
    let socket = match connect(&rt.spec.members[member].address).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(listener = %shared.name, member = %rt.spec.members[member].name, "no udp socket for a new flow: {e}");
            rt.end_request(member, rondo_core::Outcome::Cancelled);
            return None;
        }
    };
    let flow = Flow::new(key, socket, (rt, member), metrics, shared.now_ms());
    let (flow, evicted) = {
        let mut table = shared.table();
        let evicted = if table.is_full() { table.evict() } else { None };
        (table.insert(flow), evicted)
    };
    if let Some(old) = evicted {
        old.metrics.evicted.inc();
        relay::stop(&old);
    }
    // The table holds at most `max_flows`, so a permit is free unless an evicted flow's task
    // has not ended yet: the flow runs without one then (the drain waits for the others).
    let permit = shared.slots.clone().try_acquire_owned().ok();
    flow.metrics.flows_started.inc();
    flow.metrics.flows.inc();
    let ending = relay::Ending::new(shared.clone(), flow.clone(), permit);
    let task = tokio::spawn(relay::run(ending));
    let _ = flow.task.set(task.abort_handle());
    Some(flow)
}

/// A socket connected to the member at `address` (resolved when it is a name).
async fn connect(address: &str) -> std::io::Result<UdpSocket> {
    let to: SocketAddr = match address.parse() {
        Ok(a) => a,
        Err(_) => tokio::net::lookup_host(address)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{address} does not resolve")))?,
    };
    let local: SocketAddr = match to {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(to).await?;
    Ok(socket)
}
