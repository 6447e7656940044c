//! TCP listeners: each connection is one session, placed once by the route's cluster (then its
//! backups) and spliced to the member until either side closes. Where a connection goes when a
//! member does not take it is the core's failover driver's decision ([`drive()`]), as for HTTP:
//! a refused connection moves on for free; a connect that timed out (the member may be
//! overloaded) moves on as a retry, within the cluster's retry budget; at most the cluster's
//! retry attempts each. A plain session is forwarded with splice(2) ([`crate::splice`]) unless
//! the listener says `splice = "off"`; TLS on either side copies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rondo_config::Splice;
use rondo_core::failover::{Placement, TryMaker, drive};
use rondo_core::{Failover, FailureKind, Outcome, Route, Stop, TryFailure};
use rondo_runtime::{ClusterRt, Live, Refused, Snapshot, clock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::sni;
use crate::splice::{Moved, PlainTcp};

/// A member's end of a session: plain TCP, or TLS (`upstream_tls`).
trait Upstream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Upstream for T {}

/// Serves one plain client connection of TCP listener `listener`. When the listener has routes
/// that match on `sni`, the client's first bytes (its TLS ClientHello) are read, within
/// `hello_timeout`, to route on its server name, and sent on to the member first. `splice` is the
/// listener's.
pub async fn handle_plain(
    live: Arc<Live>,
    listener: Arc<str>,
    mut client: TcpStream,
    (peer, local): (SocketAddr, SocketAddr),
    (hello_timeout, splice): (Duration, Splice),
) {
    let by_sni =
        live.load().view.routes.iter().any(|r| *r.listener == *listener && r.matcher.sni.is_some());
    if !by_sni {
        return handle(live, listener, client, (peer, local), (None, splice), &[]).await;
    }
    let mut hello = Vec::with_capacity(1024);
    let read = tokio::time::timeout(hello_timeout, async {
        loop {
            match sni::parse(&hello) {
                sni::Hello::Incomplete if hello.len() < sni::MAX_HELLO => {}
                sni::Hello::Sni(name) => return Some(name),
                _ => return None,
            }
            let mut chunk = [0u8; 4096];
            let want = chunk.len().min(sni::MAX_HELLO - hello.len());
            match client.read(&mut chunk[..want]).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => hello.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let name = match read {
        Ok(name) => name,
        Err(_) if hello.is_empty() => {
            tracing::debug!(%listener, %peer, "no client hello in time; closing");
            return;
        }
        Err(_) => None,
    };
    handle(live, listener, client, (peer, local), (name.as_deref(), splice), &hello).await;
}

/// Serves one client connection of TCP listener `listener` from `peer`, reached at `local`,
/// whose TLS server name is `sni` (if any), with the listener's `splice`; `first` is what the
/// client already sent, passed on to the member before the rest.
pub async fn handle<C>(
    live: Arc<Live>,
    listener: Arc<str>,
    client: C,
    (peer, local): (SocketAddr, SocketAddr),
    (sni, splice): (Option<&str>, Splice),
    first: &[u8],
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + PlainTcp,
{
    let snapshot = live.load();
    let mut routes = snapshot.view.routes.iter().filter(|r| *r.listener == *listener);
    // `sni` routes in file order, then the one without.
    let chosen = routes
        .clone()
        .find(|r| r.matcher.sni.is_some() && r.matcher.matches_sni(sni))
        .or_else(|| routes.find(|r| r.matcher.sni.is_none()));
    let Some(route) = chosen else {
        tracing::warn!(%listener, sni = sni.unwrap_or("(none)"), "no route of the tcp listener matches; closing connection");
        return;
    };
    let hash = Some(match peer.ip() {
        std::net::IpAddr::V4(ip) => rondo_core::hash::hash_key(&ip.octets()),
        std::net::IpAddr::V6(ip) => rondo_core::hash::hash_key(&ip.octets()),
    });
    // Nothing of the stream is sent before a member takes the connection: any member may take
    // it, so it is "idempotent"; the route's request timeout bounds the placing, not the session.
    let now = clock::now();
    let mut failover = Failover::new(1 + route.backups.len(), true, now, route.request_timeout);
    let mut connecting = Connecting {
        live: &live,
        listener: &listener,
        snapshot: &snapshot,
        route,
        hash,
        client,
        first,
        addrs: (peer, local),
        splice,
    };
    match drive(&mut connecting, &mut failover, now).await {
        // Told where the budget ran out.
        Ok(()) | Err(Stop::Budget) => {}
        Err(_) => {
            tracing::warn!(%listener, route = %route.name, "no member accepted the tcp connection; closing")
        }
    }
}

/// One client connection's tries as the core's failover driver makes them: a connection to the
/// member each is placed on (then TLS with `upstream_tls`), and the session spliced to the first
/// member that takes it.
struct Connecting<'a, C> {
    live: &'a Live,
    listener: &'a str,
    snapshot: &'a Snapshot,
    route: &'a Route,
    hash: Option<u64>,
    client: C,
    first: &'a [u8],
    /// The client's address and the one it reached, for a member's PROXY header.
    addrs: (SocketAddr, SocketAddr),
    /// The listener's `splice`.
    splice: Splice,
}

/// A placed try: the cluster, by name and run-time state, and the member.
struct Underway<'a> {
    cluster: &'a String,
    rt: &'a Arc<ClusterRt>,
    member: usize,
}

impl<'a, C> TryMaker for Connecting<'a, C>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + PlainTcp,
{
    type Placed = Underway<'a>;
    type Held = ();
    type Tried = Result<(), TryFailure>;
    /// The session ran (or its first bytes could not be passed on): the connection is done.
    type Value = ();

    fn now(&mut self) -> rondo_core::Instant {
        clock::now()
    }

    fn place(
        &mut self,
        i: usize,
        failover: &mut Failover,
        now: rondo_core::Instant,
    ) -> Placement<Underway<'a>> {
        let (route, listener) = (self.route, self.listener);
        let cluster = if i == 0 { &route.cluster } else { &route.backups[i - 1] };
        let Some(rt) = self.snapshot.clusters.get(cluster) else {
            return Placement::NoEligible;
        };
        match rt.place(failover, now, self.live.group.as_deref(), self.hash, None) {
            Ok(placed) => Placement::Placed(Underway { cluster, rt, member: placed.member() }),
            Err(Refused::NoEligible(e)) => {
                if let Some(b) = crate::error::Breaker::of(&e) {
                    self.live.metrics.breaker(cluster, b.as_str());
                }
                Placement::NoEligible
            }
            Err(Refused::Stop(stop)) => {
                tracing::warn!(%listener, route = %route.name, cluster = %cluster, "retry budget exhausted; closing the tcp connection");
                Placement::Stop(stop)
            }
        }
    }

    fn hold(&mut self, _: &Underway<'a>) {}

    fn attempt(
        &mut self,
        placed: Underway<'a>,
        failover: &mut Failover,
    ) -> impl Future<Output = Result<(), TryFailure>> {
        self.connect(placed, failover)
    }

    fn judge(&mut self, _: (), tried: Self::Tried) -> Result<(), TryFailure> {
        tried
    }
}

impl<'a, C> Connecting<'a, C>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + PlainTcp,
{
    /// Connects to the placed member (then TLS with `upstream_tls`) and, when it takes the
    /// connection, splices the session to it.
    async fn connect(
        &mut self,
        placed: Underway<'a>,
        failover: &Failover,
    ) -> Result<(), TryFailure> {
        let Underway { cluster, rt, member } = placed;
        let listener = self.listener;
        if let Some(pause) = crate::http::backoff(rt, failover) {
            tokio::time::sleep(pause).await;
        }
        let m = &rt.spec.members[member];
        let started = Instant::now();
        // The connection (and its TLS handshake) within the cluster's `connect_timeout`, and
        // within the per-try timeout and the request's deadline when those are shorter.
        let policy = &rt.spec.policy;
        let timeout = failover
            .try_timeout(clock::from_std(started))
            .min(policy.connect_timeout)
            .min(policy.retry.per_try_timeout.unwrap_or(Duration::MAX));
        let connect_failed = || {
            let latency = started.elapsed();
            rt.end_request(member, Outcome::Failure { kind: FailureKind::Connect, latency });
            Err(TryFailure::NOTHING_SENT)
        };
        let (kind, failure) = match tokio::time::timeout(timeout, TcpStream::connect(&m.address))
            .await
        {
            Ok(Ok(mut upstream)) => {
                let _ = upstream.set_nodelay(true);
                if let Some(version) = rt.spec.policy.send_proxy {
                    let (client, local) = self.addrs;
                    let header = crate::proxy_protocol::header(version, client, local);
                    if upstream.write_all(&header).await.is_err() {
                        return connect_failed();
                    }
                }
                let mut upstream = match &rt.tls {
                    None => MemberConn::Plain(upstream),
                    Some(Err(_)) => {
                        tracing::warn!(%listener, cluster = %cluster, member = %m.name, "upstream_tls files could not be loaded");
                        return connect_failed();
                    }
                    Some(Ok(tls)) => {
                        let host = rondo_runtime::tls::upstream::host_of(&m.address);
                        match tokio::time::timeout(timeout, tls.connect(upstream, host)).await {
                            Ok(Ok(s)) => MemberConn::Tls(Box::new(s)),
                            failed => {
                                let why = match failed {
                                    Ok(Err(e)) => {
                                        self.live
                                            .metrics
                                            .tls_member_failure(cluster, &m.name, e.why);
                                        e.to_string()
                                    }
                                    _ => "tls handshake timed out".to_owned(),
                                };
                                tracing::warn!(%listener, cluster = %cluster, member = %m.name, "tls to the member failed: {why}");
                                return connect_failed();
                            }
                        }
                    }
                };
                if !self.first.is_empty() && upstream.write_all(self.first).await.is_err() {
                    let latency = started.elapsed();
                    rt.end_request(member, Outcome::Failure { kind: FailureKind::Reset, latency });
                    return Ok(());
                }
                rt.end_request(member, Outcome::Success { latency: started.elapsed() });
                rt.open_session(member);
                let moved = forward(&mut self.client, &mut upstream, self.splice).await;
                rt.close_session(member);
                // Counted when the connection ends (an error loses its counts).
                if let Ok((to_member, to_client)) = moved {
                    let counted = crate::http::route_metrics(rt, &self.route.name);
                    counted.bytes_in.inc_by(to_member.total());
                    counted.bytes_out.inc_by(to_client.total());
                    let spliced = to_member.spliced + to_client.spliced;
                    let copied = to_member.copied + to_client.copied;
                    self.live.metrics.tcp_forwarded(listener, spliced, copied);
                }
                return Ok(());
            }
            Ok(Err(_)) => (FailureKind::Connect, TryFailure::NOTHING_SENT),
            // The member may be overloaded: moving on is a retry, paid from the budget.
            Err(_) => (FailureKind::Timeout, TryFailure::after_sending(true)),
        };
        rt.end_request(member, Outcome::Failure { kind, latency: started.elapsed() });
        tracing::debug!(%listener, cluster = %cluster, member = %m.name, ?kind, "tcp connect failed");
        Err(failure)
    }
}

/// A member's end of a session once connected.
enum MemberConn {
    /// Plain TCP, which splice can forward.
    Plain(TcpStream),
    /// TLS (`upstream_tls`).
    Tls(Box<dyn Upstream>),
}

impl MemberConn {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            MemberConn::Plain(s) => s.write_all(bytes).await,
            MemberConn::Tls(s) => s.write_all(bytes).await,
        }
    }
}

/// Forwards a session both ways until both have ended (or either fails): spliced when both ends
/// are plain TCP and the listener allows it, else copied as `copy_bidirectional` does. Returns
/// what went to the member and what went to the client.
async fn forward<C>(
    client: &mut C,
    member: &mut MemberConn,
    splice: Splice,
) -> std::io::Result<(Moved, Moved)>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + PlainTcp,
{
    if splice == Splice::Auto
        && let (Some(c), MemberConn::Plain(m)) = (client.plain(), &*member)
    {
        return crate::splice::forward(c, m).await;
    }
    let (up, down) = match member {
        MemberConn::Plain(m) => tokio::io::copy_bidirectional(client, m).await?,
        MemberConn::Tls(m) => tokio::io::copy_bidirectional(client, m).await?,
    };
    let copied = |n| Moved { spliced: 0, copied: n };
    Ok((copied(up), copied(down)))
}
