//! The naming endpoints of `rondo ctl lookup` and `rondo agent --register`: `--naming`, else
//! `RONDO_NAMING_ENDPOINTS` (parsed by the client library's parser, so the binary and the
//! library accept the same lists), the lookup itself, and the agent's registration kept alive
//! with its lease while the agent runs.

use std::time::Duration;

use rondo_client::NamingClient;
use rondo_client::wire::Register;

/// Timeout of one naming request.
const NAMING_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait between two registration attempts while no endpoint answers.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The endpoints: the flag's list when given (the variable is then not read), else the
/// variable's; an error naming the flag or the variable when the list is malformed or missing.
pub fn endpoints(flag: Option<&str>) -> Result<Vec<NamingClient>, String> {
    let list = match flag {
        Some(f) => {
            rondo_client::parse_endpoints(f).map_err(|why| format!("--naming `{f}`: {why}"))?
        }
        None => rondo_client::endpoints_from_env()?.ok_or_else(|| {
            format!(
                "no naming endpoint: give --naming HOST:PORT,... or set {}",
                rondo_client::NAMING_ENDPOINTS_ENV
            )
        })?,
    };
    list.iter()
        .map(|e| {
            NamingClient::new(e, NAMING_TIMEOUT).ok_or_else(|| {
                format!("naming endpoint `{e}`: https endpoints are not supported here")
            })
        })
        .collect()
}

/// `rondo ctl lookup`: the first endpoint's answer that is not a transport failure (an answer
/// such as 404 for an unknown service is final: every endpoint of a tier would say the same),
/// as `member NAME at ADDRESS (view N, why)`.
pub async fn lookup(
    naming: &[NamingClient],
    service: &str,
    key: Option<&str>,
    group: Option<&str>,
) -> Result<String, String> {
    let mut failures = Vec::new();
    for n in naming {
        match n.lookup(service, key, group).await {
            Ok(l) => {
                return Ok(format!(
                    "member {} at {} (view {}, {}; from {})\n",
                    l.member.name,
                    l.member.address,
                    l.view_id,
                    l.why,
                    n.endpoint()
                ));
            }
            Err(e) if e.status.is_some() => return Err(e.to_string()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(format!("no naming endpoint answered: {}", failures.join("; ")))
}

/// Registers `member` of `cluster` at `address` with the first endpoint that takes it and
/// renews the lease every third of its time; a lease the endpoint lost (404) is registered
/// again there, an endpoint that fails is left for the next one (doubling backoff up to
/// 5 s). Runs until dropped.
pub async fn keep_registered(
    naming: Vec<NamingClient>,
    cluster: String,
    member: String,
    address: String,
    lease: Duration,
) {
    let reg = Register {
        address,
        weight: None,
        group: None,
        ttl_ms: Some(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)),
    };
    let mut at = 0;
    let mut backoff = Duration::from_millis(100);
    loop {
        let n = &naming[at % naming.len()];
        match n.register(&cluster, &member, &reg).await {
            Ok(l) => {
                tracing::info!(
                    endpoint = n.endpoint(),
                    cluster,
                    member,
                    lease = l.lease,
                    "registered"
                );
                backoff = Duration::from_millis(100);
                loop {
                    tokio::time::sleep(lease / 3).await;
                    match n.keepalive(&l.lease).await {
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "naming keepalive failed");
                            if e.status != Some(404) {
                                at += 1;
                            }
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "naming registration failed");
                at += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Removes the registration at every endpoint (best effort, when the agent stops).
pub async fn deregister(naming: &[NamingClient], cluster: &str, member: &str) {
    for n in naming {
        let _ = n.deregister(cluster, member).await;
    }
}
