//! Session granularity for HTTP: the member chosen when a session is created keeps it.
//!
//! - **Cookie** (default): the router sets `<cookie>=<token>` on the first response, where the
//!   token is an opaque hash of the member's name (members' names and addresses are never shown
//!   to clients). Later requests carrying it go to that member while it can keep sessions
//!   (healthy, not disabled; draining members keep theirs). When it cannot, the session moves
//!   and the response carries a new cookie. With a tier key (`[router] tier_key`) the cookie is
//!   self-contained and signed: `<hash>.<expiry>.<mac>`, the MAC (HMAC-SHA256 under the tier
//!   key, over the cluster, the hash and the expiry) checked by whichever router of the tier the
//!   client reaches next, so a client that moves between routers keeps its member; the expiry is
//!   `session.idle_timeout` ahead and moves forward (a new cookie) once half of it has passed;
//!   an unsigned, forged, expired or other cluster's cookie is ignored (a new placement).
//! - **Header**: with `session.header` set, the header's value is a session id; the router keeps
//!   a table of session -> member, counts each session on its member (for `least-sessions`), and
//!   forgets sessions idle longer than `session.idle_timeout`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderValue;
use rondo_core::ClusterSpec;
use rondo_runtime::ClusterRt;
use rondo_runtime::secret::TierKey;

pub use crate::session_replay::MAX_SESSION_ID;

// The cookie readers are the identity crate's (the tier session is a cookie too); the request
// stages name them here, beside the sticky cookie they read.
pub use rondo_identity::head::{cookie, cookies};

/// The cookie token for a member name: 16 hex digits, stable across routers and restarts.
pub fn token(member: &str) -> String {
    format!("{:016x}", rondo_core::hash::hash_key(member.as_bytes()))
}

/// The member whose token is `t`.
pub fn member_by_token(spec: &ClusterSpec, t: &str) -> Option<usize> {
    spec.members.iter().position(|m| token(&m.name) == t)
}

/// What the MAC of a signed cookie covers: the cluster (a cookie of one cluster is no good in
/// another), the member's hash and the expiry.
fn mac_input(cluster: &str, hash: &str, expires: u64) -> String {
    format!("rondo-sticky-v1\n{cluster}\n{hash}\n{expires}")
}

/// The signed cookie value for `member` of `cluster`, good until `expires` (Unix seconds).
pub fn signed_token(key: &TierKey, cluster: &str, member: &str, expires: u64) -> String {
    let hash = token(member);
    let tag = key.sign(mac_input(cluster, &hash, expires).as_bytes());
    format!("{hash}.{expires}.{}", URL_SAFE_NO_PAD.encode(&tag.as_ref()[..16]))
}

/// The member a session cookie names, and whether its cookie is due for renewal: with a tier
/// key only a signed, unexpired cookie of this cluster counts; without one, the plain token.
pub fn held_by_cookie(
    spec: &ClusterSpec,
    value: &str,
    key: Option<&TierKey>,
    now: u64,
) -> Option<(usize, bool)> {
    let Some(key) = key else { return member_by_token(spec, value).map(|m| (m, false)) };
    let mut parts = value.split('.');
    let (Some(hash), Some(exp), Some(mac), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let expires: u64 = exp.parse().ok()?;
    if expires <= now || hash.len() != 16 {
        return None;
    }
    let tag = URL_SAFE_NO_PAD.decode(mac).ok()?;
    if !key.verify_prefix(mac_input(&spec.name, hash, expires).as_bytes(), &tag) {
        return None;
    }
    let member = member_by_token(spec, hash)?;
    let renew = expires - now < spec.sticky.idle_timeout.as_secs() / 2;
    Some((member, renew))
}

/// The `Set-Cookie` that places a client's session on `member`: signed and with `Max-Age` under
/// a tier key, the plain token otherwise; `Secure` when the client came over TLS.
pub fn set_cookie(
    spec: &ClusterSpec,
    member: usize,
    key: Option<&TierKey>,
    now: u64,
    secure: bool,
) -> Option<HeaderValue> {
    let name = &spec.members.get(member)?.name;
    let cookie = match key {
        Some(key) => {
            let ttl = spec.sticky.idle_timeout.as_secs().max(1);
            let t = signed_token(key, &spec.name, name, now + ttl);
            format!("{}={t}; Path=/; Max-Age={ttl}; HttpOnly; SameSite=Lax", spec.sticky.cookie)
        }
        None => format!("{}={}; Path=/; HttpOnly; SameSite=Lax", spec.sticky.cookie, token(name)),
    };
    let cookie = if secure { format!("{cookie}; Secure") } else { cookie };
    HeaderValue::from_str(&cookie).ok()
}

/// Seconds since the Unix epoch (signed cookies carry wall-clock expiries).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// At most this many header sessions are tracked per router; past it, new sessions are placed
/// without being pinned until idle ones are forgotten.
pub const MAX_SESSIONS: usize = 100_000;

struct Entry {
    rt: Arc<ClusterRt>,
    member: usize,
    last: Instant,
}

/// One header-identified session, as a process hands it to the one that replaces it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// The cluster.
    pub cluster: String,
    /// The session id.
    pub id: String,
    /// The member that holds it, by name.
    pub member: String,
    /// How long (ms) the session has been idle.
    pub idle_ms: u64,
}

/// Header-identified sessions, and the requests kept of sessions on routes with
/// `session_replay`.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<(String, String), Entry>>,
    last_sweep: Mutex<Option<Instant>>,
    /// Sessions' kept requests, for replay ([`crate::session_replay`]).
    pub replay: crate::session_replay::Store,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

impl Sessions {
    /// The member that holds session `id` of `cluster`, if it is still there (by name).
    pub fn get(&self, cluster: &Arc<ClusterRt>, id: &str) -> Option<usize> {
        if id.len() > MAX_SESSION_ID {
            return None;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.get_mut(&(cluster.spec.name.clone(), id.to_owned()))?;
        e.last = Instant::now();
        let name = &e.rt.spec.members.get(e.member)?.name;
        cluster.spec.members.iter().position(|m| &m.name == name)
    }

    /// Pins session `id` to `member`, counting it there and un-counting a previous pin.
    pub fn pin(&self, cluster: &Arc<ClusterRt>, id: &str, member: usize) {
        if id.len() > MAX_SESSION_ID {
            return;
        }
        let key = (cluster.spec.name.clone(), id.to_owned());
        let old = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if map.len() >= MAX_SESSIONS && !map.contains_key(&key) {
                return;
            }
            cluster.open_session(member);
            let entry = Entry { rt: cluster.clone(), member, last: Instant::now() };
            map.insert(key, entry)
        };
        if let Some(old) = old {
            old.rt.close_session(old.member);
        }
    }

    /// Every session, for the process that replaces this one.
    pub fn export(&self, now: Instant) -> Vec<Handoff> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter_map(|((cluster, id), e)| {
                Some(Handoff {
                    cluster: cluster.clone(),
                    id: id.clone(),
                    member: e.rt.spec.members.get(e.member)?.name.clone(),
                    idle_ms: now.saturating_duration_since(e.last).as_millis() as u64,
                })
            })
            .collect()
    }

    /// Pins the sessions a previous process exported, each to its member by name in
    /// `snapshot` (a member or cluster gone, a session idle past its timeout, or one used here
    /// since it was last used there, is skipped); returns how many were pinned.
    pub fn import(
        &self,
        list: &[Handoff],
        snapshot: &rondo_runtime::live::Snapshot,
        now: Instant,
    ) -> usize {
        let mut pinned = 0;
        for h in list {
            let Some(rt) = snapshot.clusters.get(&h.cluster) else { continue };
            let Some(member) = rt.spec.members.iter().position(|m| m.name == h.member) else {
                continue;
            };
            let idle = Duration::from_millis(h.idle_ms);
            if idle >= rt.spec.sticky.idle_timeout || h.id.len() > MAX_SESSION_ID {
                continue;
            }
            let last = now.checked_sub(idle).unwrap_or(now);
            let key = (h.cluster.clone(), h.id.clone());
            // Taken over again at the hand-over: a session this process moved since wins.
            let newer_here = self
                .map
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .is_some_and(|e| e.last >= last);
            if newer_here {
                continue;
            }
            self.pin(rt, &h.id, member);
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = map.get_mut(&key) {
                e.last = last;
                pinned += 1;
            }
        }
        pinned
    }

    /// Forgets sessions idle longer than their cluster's idle timeout (at most once a second).
    pub fn sweep(&self) {
        let now = Instant::now();
        {
            let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|l| now.duration_since(l) < Duration::from_secs(1)) {
                return;
            }
            *last = Some(now);
        }
        let mut expired = Vec::new();
        self.map.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, e| {
            let keep = now.duration_since(e.last) < e.rt.spec.sticky.idle_timeout;
            if !keep {
                expired.push((e.rt.clone(), e.member));
            }
            keep
        });
        for (rt, member) in expired {
            rt.close_session(member);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ClusterSpec {
        let text = format!(
            "[cluster.{name}]\ngranularity = \"session\"\nmembers = [\
             {{ name = \"m1\", address = \"127.0.0.1:1\" }}, \
             {{ name = \"m2\", address = \"127.0.0.1:2\" }}]\n"
        );
        let c = rondo_config::parse_str(&text, std::path::Path::new("t.toml"), 1).unwrap();
        (*c.view.clusters[name]).clone()
    }

    #[test]
    fn signed_cookies_hold_only_under_their_key_cluster_and_time() {
        let key = TierKey::new(b"tier key of the test, 32 bytes!!");
        let (c, now) = (spec("c"), 1_800_000_000);
        let good = signed_token(&key, "c", "m2", now + 600);
        assert_eq!(held_by_cookie(&c, &good, Some(&key), now), Some((1, false)));
        // Past half its life it is renewed; past its expiry it is ignored.
        assert_eq!(held_by_cookie(&c, &good, Some(&key), now + 400), Some((1, true)));
        assert_eq!(held_by_cookie(&c, &good, Some(&key), now + 600), None);
        // Another key, another cluster, a moved expiry, the plain token: ignored.
        let other = TierKey::new(b"another tier key, also 32 bytes!");
        assert_eq!(held_by_cookie(&c, &good, Some(&other), now), None);
        assert_eq!(held_by_cookie(&spec("d"), &good, Some(&key), now), None);
        let moved = good.replace(&format!(".{}.", now + 600), &format!(".{}.", now + 9999));
        assert_eq!(held_by_cookie(&c, &moved, Some(&key), now), None);
        assert_eq!(held_by_cookie(&c, &token("m2"), Some(&key), now), None);
        // Without a tier key, the plain token as before.
        assert_eq!(held_by_cookie(&c, &token("m2"), None, now), Some((1, false)));
    }

    #[test]
    fn cookies_are_secure_over_tls_and_signed_with_a_key() {
        let key = TierKey::new(b"tier key of the test, 32 bytes!!");
        let c = spec("c");
        let v = set_cookie(&c, 0, Some(&key), 1000, true).unwrap();
        let v = v.to_str().unwrap();
        assert!(v.starts_with("rondo-member=") && v.ends_with("; Secure"), "{v}");
        assert!(v.contains("Max-Age=600"), "{v}");
        let value = v.split(';').next().unwrap().trim_start_matches("rondo-member=");
        assert_eq!(held_by_cookie(&c, value, Some(&key), 1000), Some((0, false)));
        let plain = set_cookie(&c, 0, None, 1000, false).unwrap();
        assert_eq!(
            plain.to_str().unwrap(),
            format!("rondo-member={}; Path=/; HttpOnly; SameSite=Lax", token("m1"))
        );
    }
}
