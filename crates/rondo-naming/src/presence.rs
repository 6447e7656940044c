//! A router's presence in its tier: a key `P/routers/{id}` under a lease this router keeps
//! alive, so that every router of the tier counts the live ones (the etcd registry's watch
//! reads the keys, `rondo_tier_routers`) and a `rate_limit` with `scope = "tier"` takes its
//! share of the rate. A router that stops revokes its lease; one that dies is forgotten when
//! the lease runs out ([`TTL_SECS`]).

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, PutOptions};

/// How long a dead router still counts.
pub const TTL_SECS: i64 = 10;
/// How often the lease is renewed (a third of its life: two renewals may fail in a row).
const RENEW: Duration = Duration::from_secs(TTL_SECS as u64 / 3);
/// The wait before trying again after etcd failed.
const RETRY: Duration = Duration::from_secs(1);
/// The longest wait for one etcd request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// This router's key under `prefix` (`{prefix}/routers/{id}`): the process id and the time it
/// started, in nanoseconds, so that two routers on one machine, or a restarted one, never share
/// a key.
pub fn key(prefix: &str) -> String {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let nanos = since.map_or(0, |d| d.as_nanos());
    format!("{prefix}/routers/{}-{nanos:x}", std::process::id())
}

/// Keeps `key` present under a lease on `endpoints`, forever (the task is aborted to stop).
pub async fn keep(endpoints: Vec<String>, key: String) {
    loop {
        let err = match present(&endpoints, &key).await {
            Ok(never) => match never {},
            Err(e) => e,
        };
        tracing::debug!(key, error = %err, "tier presence lost: trying again");
        tokio::time::sleep(RETRY).await;
    }
}

/// Puts the key under a new lease and renews it until etcd fails.
async fn present(
    endpoints: &[String],
    key: &str,
) -> Result<std::convert::Infallible, etcd_client::Error> {
    let options =
        ConnectOptions::new().with_connect_timeout(REQUEST_TIMEOUT).with_timeout(REQUEST_TIMEOUT);
    let mut client = Client::connect(endpoints, Some(options)).await?;
    let lease = client.lease_grant(TTL_SECS, None).await?.id();
    let value = format!("{{\"pid\":{}}}", std::process::id());
    client.put(key, value, Some(PutOptions::new().with_lease(lease))).await?;
    tracing::info!(key, "this router counts in its tier");
    let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
    loop {
        tokio::time::sleep(RENEW).await;
        keeper.keep_alive().await?;
        match tokio::time::timeout(REQUEST_TIMEOUT, answers.message()).await {
            Ok(Ok(Some(a))) if a.ttl() > 0 => {}
            // The lease is gone (it ran out while etcd was away): put the key again.
            Ok(Ok(_)) => return Err(etcd_client::Error::LeaseKeepAliveError("expired".into())),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(etcd_client::Error::LeaseKeepAliveError("no answer".into())),
        }
    }
}

/// The router id in a presence key under `routers_prefix`, if it is one.
pub fn id_of<'k>(key: &'k str, routers_prefix: &str) -> Option<&'k str> {
    key.strip_prefix(routers_prefix).filter(|id| !id.is_empty() && !id.contains('/'))
}
