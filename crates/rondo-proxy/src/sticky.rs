//! Session granularity for HTTP: the member chosen when a session is created keeps it.
//!
//! - **Cookie** (default): the router sets `<cookie>=<token>` on the first response, where the
//!   token is an opaque hash of the member's name (members' names and addresses are never shown
//!   to clients). Later requests carrying it go to that member while it can keep sessions
//!   (healthy, not disabled; draining members keep theirs). When it cannot, the session moves
//!   and the response carries a new cookie.
//! - **Header**: with `session.header` set, the header's value is a session id; the router keeps
//!   a table of session -> member, counts each session on its member (for `least-sessions`), and
//!   forgets sessions idle longer than `session.idle_timeout`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::head::Headers;
use rondo_core::ClusterSpec;
use rondo_runtime::ClusterRt;

/// The cookie token for a member name: 16 hex digits, stable across routers and restarts.
pub fn token(member: &str) -> String {
    format!("{:016x}", rondo_core::hash::hash_key(member.as_bytes()))
}

/// The member whose token is `t`.
pub fn member_by_token(spec: &ClusterSpec, t: &str) -> Option<usize> {
    spec.members.iter().position(|m| token(&m.name) == t)
}

/// A cookie's value from the request.
pub fn cookie<'a>(headers: &'a impl Headers, name: &str) -> Option<&'a str> {
    headers
        .values("cookie")
        .filter_map(crate::head::visible_ascii)
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then_some(v.trim_matches('"'))
        })
}

/// Session ids longer than this are ignored (the request is placed without a session): ids are
/// client-chosen, so neither their size nor their number may grow the table without bound.
pub const MAX_SESSION_ID: usize = 128;
/// At most this many header sessions are tracked per router; past it, new sessions are placed
/// without being pinned until idle ones are forgotten.
pub const MAX_SESSIONS: usize = 100_000;

struct Entry {
    rt: Arc<ClusterRt>,
    member: usize,
    last: Instant,
}

/// Header-identified sessions.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<(String, String), Entry>>,
    last_sweep: Mutex<Option<Instant>>,
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
