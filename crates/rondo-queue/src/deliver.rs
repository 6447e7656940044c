//! Delivery workers: each takes the next due message under a lease ([`Store::next`]), sends it
//! as an HTTP request to a member and finishes the lease by the outcome.
//!
//! One **attempt** is what the router does for one request: the route that matches the message
//! now (routes are matched again at each attempt, so a reload applies to messages waiting), then
//! the core's failover driver over the route's cluster and backups with `ClusterRt::place`
//! picking each member by the cluster's algorithm (the same call the router's HTTP and TCP paths
//! make), within the route's request timeout and the queue's lease. A member's 2xx completes the
//! message; any other answer, a refused connection, a reset or a timeout is that member's
//! failure, and when no member of the attempt answered 2xx the attempt failed with the reason of
//! every member tried. A failed attempt returns the message with exponential backoff
//! (`backoff_initial_ms`, doubled, at most `backoff_max_ms`); the attempt numbered
//! `max_attempts` moves it to the dead-letter queue instead. An attempt still running when the
//! lease ends is abandoned and counts as failed (`lease of N ms expired`).
//!
//! Every request carries the message id in `Idempotency-Key`, the queue in `X-Rondo-Queue` and
//! the attempt's number in `X-Rondo-Attempt`, so members can drop the duplicates that
//! at-least-once delivery makes possible.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use rondo_config::QueueSpec;
use rondo_core::failover::{Placement, TryMaker, drive};
use rondo_core::{Failover, FailureKind, HashKeySource, Outcome, TryFailure};
use rondo_runtime::queues::TryRecord;
use rondo_runtime::{ClusterRt, Refused, Snapshot, clock};

use crate::QueueParts;

use crate::store::{Lease, Message, Store, unix_ms};

/// The HTTP clients deliveries use: the router's pools ([`rondo_runtime::pools`]), so a cluster
/// is reached the same way from a queue as from a request: HTTP/1.1, HTTP/2 with prior
/// knowledge for `upstream_protocol = "http2"`, TLS (members verified against the cluster's
/// `ca`, the router's certificate presented) with `upstream_tls`, pools renewed by
/// `max_connection_age_ms`.
pub type Clients = rondo_runtime::pools::Clients<Full<Bytes>>;

/// How long a delivery waits for a member's TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one worker of `store` until `stop` turns true.
pub async fn worker(
    store: Arc<dyn Store>,
    spec: Arc<QueueSpec>,
    parts: Arc<QueueParts>,
    clients: Clients,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let lease = tokio::select! {
            l = store.next() => l,
            _ = stop.changed() => return,
        };
        let lease = match lease {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(queue = %spec.name, "cannot take the next message: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let attempt = lease.attempts + 1;
        let outcome = tokio::select! {
            r = tokio::time::timeout(spec.lease, attempt_delivery(&parts, &clients, &spec, &lease, attempt)) => {
                r.unwrap_or_else(|_| Err(format!(
                    "lease of {} ms expired before the delivery finished",
                    spec.lease.as_millis()
                )))
            }
            // Shutting down: the lease is dropped with the process; the message stays durable
            // and is delivered again after the restart.
            _ = stop.changed() => return,
        };
        let done = match outcome {
            Ok(member) => {
                tracing::debug!(queue = %spec.name, id = %lease.id, %member, attempt, "delivered");
                store.complete(lease).await
            }
            Err(reason) => {
                let tried = TryRecord { attempt, at_ms: unix_ms(), reason };
                if attempt >= spec.max_attempts {
                    tracing::warn!(queue = %spec.name, id = %lease.id, attempts = attempt, reason = %tried.reason, "message moved to the dead-letter queue");
                    store.dead_letter(lease, tried).await
                } else {
                    let after = spec.backoff(attempt);
                    tracing::debug!(queue = %spec.name, id = %lease.id, attempt, reason = %tried.reason, after_ms = after.as_millis() as u64, "delivery failed; retrying later");
                    store.retry(lease, tried, after).await
                }
            }
        };
        if let Err(e) = done {
            tracing::warn!(queue = %spec.name, "cannot record a delivery's outcome: {e}");
        }
    }
}

/// Header fields of a message for route matching and hash keys.
struct Facts<'a>(&'a Message);

impl<'a> Facts<'a> {
    fn header(&self, name: &str) -> Option<&'a str> {
        self.0.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// `Host` without its port.
fn host_of(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    h.rsplit_once(':').map_or(
        h,
        |(host, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) { host } else { h }
        },
    )
}

/// A cookie's value from the `cookie` header fields.
fn cookie<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    m.headers.iter().filter(|(n, _)| n == "cookie").find_map(|(_, v)| {
        std::str::from_utf8(v).ok()?.split(';').find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then_some(v)
        })
    })
}

/// The cluster's hash key read from the message, as the router reads it from a request.
fn hash_key(source: &HashKeySource, m: &Message) -> Option<u64> {
    use rondo_core::hash::hash_key;
    match source {
        HashKeySource::ClientAddress => m.peer.map(|ip| match ip {
            std::net::IpAddr::V4(ip) => hash_key(&ip.octets()),
            std::net::IpAddr::V6(ip) => hash_key(&ip.octets()),
        }),
        HashKeySource::Header(h) => m.header(h.as_str()).map(hash_key),
        HashKeySource::Cookie(c) => cookie(m, c).map(|v| hash_key(v.as_bytes())),
    }
}

/// One delivery attempt of `lease`: the member that answered 2xx, or why none did.
async fn attempt_delivery(
    parts: &QueueParts,
    clients: &Clients,
    spec: &QueueSpec,
    lease: &Lease,
    attempt: u32,
) -> Result<String, String> {
    let m = &lease.message;
    let snapshot = parts.views.load();
    let route = {
        let facts = Facts(m);
        let (path_only, query) = match m.path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (m.path.as_str(), None),
        };
        let header = |name: &str| facts.header(name);
        let present = |name: &str| facts.header(name).is_some();
        let req = rondo_core::RequestFacts {
            host: facts.header("host").map(host_of),
            path: path_only,
            query,
            method: "POST",
            header: &header,
            present: &present,
            body: Some(rondo_core::BodyPeek { bytes: &m.body, complete: true }),
        };
        snapshot.view.route(&m.listener, &req)
    };
    let Some(route) = route else {
        return Err(format!("no route of listener {} matches the message", m.listener));
    };
    // A multicast copy goes to its branch's cluster and backups, the message itself to the
    // route's own.
    let (first, backups) = match &m.branch {
        None => (&route.cluster, route.backups.as_slice()),
        Some(b) => match route.multicast.iter().find(|x| &x.cluster == b) {
            Some(x) => (&x.cluster, x.backups.as_slice()),
            None => return Err(format!("route {} has no multicast branch {b} now", route.name)),
        },
    };
    let timeout = route.request_timeout.min(spec.lease);
    // The message id makes a second delivery recognisable: tries may move on like an
    // idempotent request's.
    let now = clock::now();
    let mut failover = Failover::new(1 + backups.len(), true, now, timeout);
    let mut delivery = Delivery {
        parts,
        clients,
        spec,
        lease,
        attempt,
        snapshot: &snapshot,
        first,
        backups,
        why: Vec::new(),
    };
    if let Ok(Some(member)) = drive(&mut delivery, &mut failover, now).await {
        return Ok(member);
    }
    let mut why = delivery.why;
    if why.is_empty() {
        why.push(format!("route {} found no member", route.name));
    }
    Err(why.join("; "))
}

/// One delivery attempt's tries as the core's failover driver makes them: the message sent to
/// the member each is placed on, and why every member tried did not take it.
struct Delivery<'a> {
    parts: &'a QueueParts,
    clients: &'a Clients,
    spec: &'a QueueSpec,
    lease: &'a Lease,
    attempt: u32,
    snapshot: &'a Snapshot,
    /// The cluster tried first and its backups (the route's, or a multicast branch's).
    first: &'a String,
    backups: &'a [String],
    why: Vec<String>,
}

/// A placed try: the cluster, by name and run-time state, and the member.
struct Underway<'a> {
    cluster: &'a String,
    rt: &'a Arc<ClusterRt>,
    member: usize,
}

impl<'a> TryMaker for Delivery<'a> {
    type Placed = Underway<'a>;
    type Held = ();
    type Tried = Result<Option<String>, TryFailure>;
    /// The member that answered 2xx, or `None` when a member answered otherwise but not with a
    /// 5xx (it is up, and another would likely answer the same: the attempt ends there).
    type Value = Option<String>;

    fn now(&mut self) -> rondo_core::Instant {
        clock::now()
    }

    fn place(
        &mut self,
        i: usize,
        failover: &mut Failover,
        now: rondo_core::Instant,
    ) -> Placement<Underway<'a>> {
        let cluster = if i == 0 { self.first } else { &self.backups[i - 1] };
        let Some(rt) = self.snapshot.clusters.get(cluster) else {
            self.why.push(format!("cluster {cluster} is not in the view"));
            return Placement::NoEligible;
        };
        let hash = (rt.spec.policy.algorithm == rondo_core::Algorithm::Hash)
            .then(|| hash_key(&rt.spec.policy.hash.key, &self.lease.message))
            .flatten();
        match rt.place(failover, now, self.parts.group.as_deref(), hash, None) {
            Ok(placed) => Placement::Placed(Underway { cluster, rt, member: placed.member() }),
            Err(Refused::NoEligible(e)) => {
                self.why.push(e.to_string());
                Placement::NoEligible
            }
            Err(Refused::Stop(stop)) => {
                self.why.push(format!("cluster {cluster}: retry budget spent"));
                Placement::Stop(stop)
            }
        }
    }

    fn hold(&mut self, _: &Underway<'a>) {}

    fn attempt(
        &mut self,
        placed: Underway<'a>,
        failover: &mut Failover,
    ) -> impl Future<Output = Result<Option<String>, TryFailure>> {
        self.send(placed, failover)
    }

    fn judge(&mut self, _: (), tried: Self::Tried) -> Result<Option<String>, TryFailure> {
        tried
    }
}

impl<'a> Delivery<'a> {
    /// Sends the message to the placed member: the member that answered 2xx, `None` for another
    /// answer that is not a 5xx, or the failure.
    async fn send(
        &mut self,
        placed: Underway<'a>,
        failover: &Failover,
    ) -> Result<Option<String>, TryFailure> {
        let Underway { cluster, rt, member } = placed;
        let (parts, why) = (self.parts, &mut self.why);
        let ms = &rt.spec.members[member];
        let started = Instant::now();
        let try_timeout = failover.try_timeout(clock::from_std(started));
        let client = match self.clients.for_cluster(rt) {
            Ok(c) => c,
            Err(why_not) => {
                // The cluster's `upstream_tls` files could not be loaded with this view: no
                // member of it can be reached (the router's requests get the same 502).
                why.push(format!("{cluster}/{}: {why_not}", ms.name));
                parts.metrics.tls_member_failure(cluster, &ms.name, why_not);
                let latency = Duration::ZERO;
                rt.end_request(member, Outcome::Failure { kind: FailureKind::Connect, latency });
                return Err(TryFailure::NOTHING_SENT);
            }
        };
        let m = &self.lease.message;
        let request = build(m, &ms.address, &self.spec.name, &self.lease.id, self.attempt);
        let sent = tokio::time::timeout(try_timeout, async {
            let resp = client.request(request).await?;
            let status = resp.status();
            // The body is read (and dropped) so the connection goes back to the pool.
            let _ = resp.into_body().collect().await;
            Ok::<_, rondo_runtime::pools::SendError>(status)
        })
        .await;
        let latency = started.elapsed();
        let (failure, kind) = match sent {
            Ok(Ok(status)) if status.is_success() => {
                rt.end_request(member, Outcome::Success { latency });
                return Ok(Some(ms.name.clone()));
            }
            Ok(Ok(status)) => {
                why.push(format!("{cluster}/{}: answered {}", ms.name, status.as_u16()));
                if status.is_server_error() {
                    (TryFailure::after_sending(true), FailureKind::Status5xx)
                } else {
                    // The member answered: it is up, and another would likely answer the same.
                    rt.end_request(member, Outcome::Success { latency });
                    return Ok(None);
                }
            }
            Ok(Err(e)) if e.is_connect() => {
                match rondo_runtime::pools::tls_failure(&e) {
                    Some(tls) => {
                        parts.metrics.tls_member_failure(cluster, &ms.name, tls);
                        why.push(format!("{cluster}/{}: {tls} ({})", ms.name, root_cause(&e)));
                    }
                    None => why.push(format!(
                        "{cluster}/{}: cannot connect ({})",
                        ms.name,
                        root_cause(&e)
                    )),
                }
                (TryFailure::NOTHING_SENT, FailureKind::Connect)
            }
            Ok(Err(e)) => {
                // A TLS 1.3 member refuses the router's certificate (or its lack of one) only
                // after the handshake: the refusal comes as the request's error.
                match rondo_runtime::pools::tls_failure(&e) {
                    Some(tls) => {
                        parts.metrics.tls_member_failure(cluster, &ms.name, tls);
                        why.push(format!("{cluster}/{}: {tls} ({})", ms.name, root_cause(&e)));
                    }
                    None => why.push(format!("{cluster}/{}: {}", ms.name, root_cause(&e))),
                }
                (TryFailure::after_sending(true), FailureKind::Reset)
            }
            Err(_) => {
                why.push(format!(
                    "{cluster}/{}: no answer within {} ms",
                    ms.name,
                    try_timeout.as_millis()
                ));
                (TryFailure::after_sending(true), FailureKind::Timeout)
            }
        };
        rt.end_request(member, Outcome::Failure { kind, latency });
        Err(failure)
    }
}

/// The innermost error's text (hyper-util wraps the I/O error that says what happened).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The request a member gets for `m`.
fn build(m: &Message, address: &str, queue: &str, id: &str, attempt: u32) -> Request<Full<Bytes>> {
    let uri = format!("http://{address}{}", m.path);
    let mut req = Request::new(Full::new(m.body.clone()));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = uri.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
    let h = req.headers_mut();
    for (name, value) in &m.headers {
        if let (Ok(n), Ok(v)) =
            (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value))
        {
            h.append(n, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(id) {
        h.insert(HeaderName::from_static("idempotency-key"), v);
    }
    if let Ok(v) = HeaderValue::from_str(queue) {
        h.insert(HeaderName::from_static("x-rondo-queue"), v);
    }
    h.insert(HeaderName::from_static("x-rondo-attempt"), HeaderValue::from(attempt));
    if let Some(peer) = m.peer
        && let Ok(v) = HeaderValue::from_str(&peer.to_string())
    {
        h.insert(HeaderName::from_static("x-forwarded-for"), v);
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_their_port() {
        assert_eq!(host_of("a.example:8080"), "a.example");
        assert_eq!(host_of("a.example"), "a.example");
        assert_eq!(host_of("[::1]:80"), "::1");
    }

    #[test]
    fn requests_carry_the_message_id() {
        let m = Message {
            listener: "in".into(),
            path: "/queues/q?x=1".into(),
            headers: vec![("x-a".into(), Bytes::from_static(b"1"))],
            body: Bytes::from_static(b"hi"),
            peer: Some("127.0.0.1".parse().unwrap()),
            branch: None,
        };
        let r = build(&m, "127.0.0.1:9", "q", "ab-7", 3);
        assert_eq!(r.uri().to_string(), "http://127.0.0.1:9/queues/q?x=1");
        assert_eq!(r.headers()["idempotency-key"], "ab-7");
        assert_eq!(r.headers()["x-rondo-attempt"], "3");
        assert_eq!(r.headers()["x-a"], "1");
        assert_eq!(cookie(&m, "s"), None);
    }
}
