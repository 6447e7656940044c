//! Session replay (WCF's session recovery): on a route with `session_replay` and a sticky
//! session (cookie or header), the router keeps the requests of each session (method, target,
//! headers as members get them, body), bounded per session (`max_messages`, `max_bytes`) and
//! over the route (`max_total_bytes`). When the session's member fails and another member takes
//! the session over, the kept requests are replayed to it, in order, before the new request;
//! a replay that fails makes that try fail ([`crate::error::Kind::Replay`]) and the failover
//! engine moves on down the failover order, where the next member gets the replay in turn.
//!
//! A member marks the point from which earlier requests need not be replayed by answering
//! `x-rondo-checkpoint` (any value): the session's log is emptied (that request included), and
//! its limits count from there. A session whose log would pass a limit is no longer kept (its
//! log is dropped): should its member fail, the session fails over without replay, and that
//! response says so in `x-rondo-replay: skipped`; its log then starts again on the new member.
//! A response after a replay carries `x-rondo-replayed: N`; each replayed request carries
//! `x-rondo-replay: 1`, so a member can tell a replay from a new request.
//!
//! A session is recognised by its header (`session.header`) or, for cookie sessions, by a
//! `rondo-replay` cookie the router sets (a random id: the member cookie names a member, not a
//! session). Logs idle for the cluster's `session.idle_timeout` are forgotten; at most
//! [`MAX_LOGS`] sessions are kept per listener.
//!
//! The logs go to the process that replaces this one in a hitless upgrade ([`Handoff`]), at
//! most [`MAX_HANDOFF_BYTES`] of kept requests in all (a session past it goes as over its
//! limits: it fails over without replay, and says so); the new process keeps them under its
//! own view's limits.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method};
use rondo_core::SessionReplay;

/// The cookie that names a cookie session for replay.
pub const REPLAY_COOKIE: &str = "rondo-replay";
/// The response header by which a member marks a checkpoint.
pub const CHECKPOINT_HEADER: &str = "x-rondo-checkpoint";
/// On a replayed request (`1`); on a response whose session failed over without replay
/// (`skipped`).
pub const REPLAY_HEADER: &str = "x-rondo-replay";
/// On a response after a replay: how many requests were replayed.
pub const REPLAYED_HEADER: &str = "x-rondo-replayed";
/// Sessions kept at most per listener; past it new sessions are not kept (as over the limits).
pub const MAX_LOGS: usize = 100_000;
/// Session ids longer than this are ignored (the request is placed without a session, and its
/// requests are not kept): ids are client-chosen, so neither their size nor their number may
/// grow the sticky table or the replay logs without bound. Sticky sessions' limit too
/// (`crate::sticky` re-exports it); defined here, below `sticky`, which holds the replay [`Store`].
pub const MAX_SESSION_ID: usize = 128;
/// Bytes of kept requests handed to a new process at most, over every listener: the state
/// travels in one frame of the upgrade socket.
pub const MAX_HANDOFF_BYTES: u64 = 64 << 20;

/// One kept request, compact: its header fields in one buffer (`name:value` lines), not a
/// `HeaderMap` (a map of ten fields costs several times the bytes it holds, and a replay,
/// which rebuilds it, is rare).
#[derive(Debug)]
pub struct Kept {
    /// Its method.
    pub method: Method,
    /// Its target.
    pub path_and_query: PathAndQuery,
    fields: Bytes,
    /// Its whole body.
    pub body: Bytes,
    /// Its trailers, if any.
    pub trailers: Option<HeaderMap>,
    size: u64,
}

/// What a kept request costs besides its bytes (the record, its `Arc` and its queue slot),
/// counted against the limits with them.
pub const KEPT_OVERHEAD: u64 = 160;

impl Kept {
    /// A request to keep; its size counts the method, target, header names and values, body
    /// and [`KEPT_OVERHEAD`].
    pub fn new(
        method: Method,
        path_and_query: PathAndQuery,
        headers: HeaderMap,
        body: Bytes,
        trailers: Option<HeaderMap>,
    ) -> Kept {
        let fields = field_lines(&headers);
        let trailer_bytes = trailers
            .as_ref()
            .map_or(0, |t| t.iter().map(|(k, v)| (k.as_str().len() + v.len() + 64) as u64).sum());
        let size = (method.as_str().len() + path_and_query.as_str().len() + fields.len()) as u64
            + trailer_bytes
            + body.len() as u64
            + KEPT_OVERHEAD;
        Kept { method, path_and_query, fields: Bytes::from(fields), body, trailers, size }
    }

    /// Its header fields as members got them.
    pub fn headers(&self) -> HeaderMap {
        headers_of(&self.fields)
    }

    /// As it goes to the process that replaces this one.
    fn handoff(&self) -> KeptHandoff {
        KeptHandoff {
            method: self.method.as_str().to_owned(),
            target: self.path_and_query.as_str().to_owned(),
            fields: B64.encode(&self.fields),
            body: B64.encode(&self.body),
            trailers: self.trailers.as_ref().map(|t| B64.encode(field_lines(t))),
        }
    }

    /// A request a previous process kept, or why it cannot be kept.
    fn from_handoff(h: &KeptHandoff) -> Result<Kept, String> {
        let method = Method::from_bytes(h.method.as_bytes())
            .map_err(|_| format!("method {:?} is not a method", h.method))?;
        let target = PathAndQuery::try_from(h.target.as_str())
            .map_err(|_| format!("target {:?} is not a request target", h.target))?;
        let bytes = |what: &str, b64: &str| {
            B64.decode(b64).map_err(|e| format!("{what} of {} is not base64: {e}", h.target))
        };
        let fields = headers_of(&bytes("the header fields", &h.fields)?);
        let body = Bytes::from(bytes("the body", &h.body)?);
        let trailers = match &h.trailers {
            Some(t) => Some(headers_of(&bytes("the trailers", t)?)),
            None => None,
        };
        Ok(Kept::new(method, target, fields, body, trailers))
    }

    /// Bytes it counts for against the limits.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Header fields as `name:value` lines (values hold no newline: `HeaderValue` refuses it).
fn field_lines(headers: &HeaderMap) -> Vec<u8> {
    let mut fields =
        Vec::with_capacity(headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 2).sum());
    for (k, v) in headers {
        fields.extend_from_slice(k.as_str().as_bytes());
        fields.push(b':');
        fields.extend_from_slice(v.as_bytes());
        fields.push(b'\n');
    }
    fields
}

/// [`field_lines`] read back (a line that is not a header field is skipped).
fn headers_of(lines: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for line in lines.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(&line[..colon]),
            http::HeaderValue::from_bytes(&line[colon + 1..]),
        ) {
            h.append(k, v);
        }
    }
    h
}

/// One kept request as a process hands it to the one that replaces it (bytes in base64).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeptHandoff {
    /// Its method.
    pub method: String,
    /// Its target.
    pub target: String,
    /// Its header fields as members got them, `name:value` lines.
    pub fields: String,
    /// Its whole body.
    pub body: String,
    /// Its trailers, as the fields.
    #[serde(default)]
    pub trailers: Option<String>,
}

/// One session's log as a process hands it to the one that replaces it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// The route.
    pub route: String,
    /// The session's id (its header's value, or its replay cookie's).
    pub session: String,
    /// The member that holds the session, by name.
    pub member: String,
    /// How long (ms) the session has been idle.
    pub idle_ms: u64,
    /// Over its limits: it fails over without replay.
    pub over: bool,
    /// Requests recorded in the log's life, over every process (tells which process changed a
    /// session both held during an upgrade).
    pub seq: u64,
    /// The kept requests, in order.
    pub kept: Vec<KeptHandoff>,
}

/// What a try must do before it sends a session's request to `member`.
#[derive(Debug)]
pub enum Plan {
    /// Nothing: a new session, or the member already holds the session.
    Nothing,
    /// The session moved: replay these to the member first, in order.
    Replay(Vec<Arc<Kept>>),
    /// The session moved but went over its limits: no replay (say so).
    Skipped,
}

/// How a request was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Kept.
    Kept,
    /// A checkpoint emptied the log.
    Checkpoint,
    /// Over a limit: the session is no longer kept.
    Over,
}

#[derive(Debug)]
struct Log {
    member: String,
    kept: VecDeque<Arc<Kept>>,
    bytes: u64,
    over: bool,
    last: Instant,
    idle: Duration,
    /// Requests recorded over the log's life (carried across upgrades).
    seq: u64,
    /// `seq` when the log was taken over from a previous process (`None`: begun here).
    base: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    /// (route, session) -> its log.
    logs: HashMap<(String, String), Log>,
    /// Bytes kept per route.
    totals: HashMap<String, u64>,
    /// Bytes kept in all.
    bytes: u64,
    last_sweep: Option<Instant>,
}

/// Every kept session of a listener.
#[derive(Debug, Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

impl Inner {
    fn drop_kept(&mut self, route: &str, freed: u64) {
        self.bytes -= freed;
        if let Some(t) = self.totals.get_mut(route) {
            *t -= freed;
        }
    }

    /// Empties the log of `id`; `over`: as past its limits.
    fn clear(&mut self, id: &(String, String), over: bool) {
        let Some(log) = self.logs.get_mut(id) else { return };
        let freed = log.bytes;
        log.kept.clear();
        log.bytes = 0;
        log.over = over;
        self.drop_kept(&id.0, freed);
    }

    /// Keeps `request` (`None`: too large) in the log of `id` if it stays within `limits`;
    /// past them the log is useless: emptied, and the session marked.
    fn keep(
        &mut self,
        id: &(String, String),
        limits: SessionReplay,
        request: Option<Kept>,
    ) -> Recorded {
        let total = self.totals.get(&id.0).copied().unwrap_or(0);
        let Some(log) = self.logs.get_mut(id) else { return Recorded::Over };
        if log.over {
            return Recorded::Over;
        }
        match request {
            Some(req)
                if log.kept.len() < limits.max_messages as usize
                    && log.bytes + req.size <= limits.max_bytes
                    && total + req.size <= limits.max_total_bytes =>
            {
                let size = req.size;
                log.bytes += size;
                log.kept.push_back(Arc::new(req));
                self.bytes += size;
                *self.totals.entry(id.0.clone()).or_default() += size;
                Recorded::Kept
            }
            _ => {
                self.clear(id, true);
                Recorded::Over
            }
        }
    }

    /// Forgets the log of `id`.
    fn remove(&mut self, id: &(String, String)) {
        if let Some(log) = self.logs.remove(id) {
            self.drop_kept(&id.0, log.bytes);
        }
    }
}

/// What the new process's view says of a route's session replay: its limits and its cluster's
/// session idle timeout (`None`: the route is gone or keeps nothing now).
pub type RouteLimits<'a> = &'a dyn Fn(&str) -> Option<(SessionReplay, Duration)>;

impl Store {
    /// What a try of session `key` on `route` must do before it goes to `member` (by name).
    pub fn plan(&self, route: &str, key: &str, member: &str) -> Plan {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(log) = inner.logs.get_mut(&(route.to_owned(), key.to_owned())) else {
            return Plan::Nothing;
        };
        log.last = Instant::now();
        if log.member == member {
            return Plan::Nothing;
        }
        if log.over {
            return Plan::Skipped;
        }
        if log.kept.is_empty() {
            log.member = member.to_owned();
            return Plan::Nothing;
        }
        Plan::Replay(log.kept.iter().cloned().collect())
    }

    /// Session `key` of `route` is on `member` now (its log was replayed there, or it failed
    /// over without replay: then its log starts again, empty).
    pub fn moved(&self, route: &str, key: &str, member: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(log) = inner.logs.get_mut(&(route.to_owned(), key.to_owned())) {
            log.member = member.to_owned();
            log.over = false;
        }
    }

    /// Records `request` (`None`: its body was too large to keep) of session `key` of `route`,
    /// answered by `member`; `checkpoint`: the member's answer marked a checkpoint.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        route: &str,
        limits: SessionReplay,
        idle: Duration,
        key: &str,
        member: &str,
        request: Option<Kept>,
        checkpoint: bool,
    ) -> Recorded {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        sweep(&mut inner, now);
        let id = (route.to_owned(), key.to_owned());
        if !inner.logs.contains_key(&id) {
            if inner.logs.len() >= MAX_LOGS {
                return Recorded::Over;
            }
            let log = Log {
                member: member.to_owned(),
                kept: VecDeque::new(),
                bytes: 0,
                over: false,
                last: now,
                idle,
                seq: 0,
                base: None,
            };
            inner.logs.insert(id.clone(), log);
        }
        let Some(log) = inner.logs.get_mut(&id) else { return Recorded::Over };
        log.last = now;
        log.idle = idle;
        log.member = member.to_owned();
        log.seq += 1;
        if checkpoint {
            inner.clear(&id, false);
            Recorded::Checkpoint
        } else {
            inner.keep(&id, limits, request)
        }
    }

    /// Every session's log, for the process that replaces this one; `budget`: bytes of kept
    /// requests still to hand over (a log past it goes as over its limits, without requests).
    pub fn export(&self, now: Instant, budget: &mut u64) -> Vec<Handoff> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = Vec::with_capacity(inner.logs.len());
        for ((route, session), log) in &inner.logs {
            let fits = !log.over && log.bytes <= *budget;
            if fits {
                *budget -= log.bytes;
            }
            list.push(Handoff {
                route: route.clone(),
                session: session.clone(),
                member: log.member.clone(),
                idle_ms: now.saturating_duration_since(log.last).as_millis() as u64,
                over: !fits,
                seq: log.seq,
                kept: if fits { log.kept.iter().map(|k| k.handoff()).collect() } else { vec![] },
            });
        }
        list
    }

    /// Takes over the logs a previous process exported ([`Store::export`]), under the limits
    /// `limits` gives for each route now; returns how many were taken. A log this process has
    /// changed since it took it over is kept when the previous process did not change it too;
    /// when both did, neither log is whole, and the session goes as over its limits. A log
    /// whose route is gone, whose session is idle past its timeout or whose requests cannot be
    /// read (logged) is left out.
    pub fn import(&self, list: &[Handoff], limits: RouteLimits<'_>, now: Instant) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = 0;
        for h in list {
            let Some((route_limits, idle)) = limits(&h.route) else { continue };
            let idle_for = Duration::from_millis(h.idle_ms);
            if idle_for >= idle || h.session.len() > MAX_SESSION_ID {
                continue;
            }
            let id = (h.route.clone(), h.session.clone());
            // Ours unchanged since taken over: theirs is newer; theirs unchanged: ours is.
            let (diverged, ours) = match inner.logs.get(&id) {
                None => (false, 0),
                Some(log) if log.base == Some(h.seq) => continue,
                Some(log) => (log.base != Some(log.seq), log.seq),
            };
            let kept: Result<Vec<Kept>, String> = h.kept.iter().map(Kept::from_handoff).collect();
            let kept = kept.unwrap_or_else(|e| {
                tracing::warn!(route = %h.route, "upgrade: a session's kept requests are not taken over (it fails over without replay): {e}");
                Vec::new()
            });
            let over = h.over || diverged || kept.len() < h.kept.len();
            inner.remove(&id);
            if inner.logs.len() >= MAX_LOGS {
                continue;
            }
            let seq = h.seq.max(ours);
            let log = Log {
                member: h.member.clone(),
                kept: VecDeque::new(),
                bytes: 0,
                over,
                last: now.checked_sub(idle_for).unwrap_or(now),
                idle,
                seq,
                base: Some(seq),
            };
            inner.logs.insert(id.clone(), log);
            for k in kept.into_iter().take_while(|_| !over) {
                if inner.keep(&id, route_limits, Some(k)) == Recorded::Over {
                    break;
                }
            }
            taken += 1;
        }
        taken
    }

    /// Bytes kept now, over every session.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// Sessions kept now.
    pub fn sessions(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).logs.len()
    }
}

/// Forgets logs idle past their session's idle timeout (at most once a second).
fn sweep(inner: &mut Inner, now: Instant) {
    if inner.last_sweep.is_some_and(|l| now.duration_since(l) < Duration::from_secs(1)) {
        return;
    }
    inner.last_sweep = Some(now);
    let mut freed: Vec<(String, u64)> = Vec::new();
    inner.logs.retain(|(route, _), log| {
        let keep = now.duration_since(log.last) < log.idle;
        if !keep {
            freed.push((route.clone(), log.bytes));
        }
        keep
    });
    for (route, n) in freed {
        inner.drop_kept(&route, n);
    }
}

/// A new random session id for the replay cookie (128 bits, hex).
pub fn new_id() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SessionReplay =
        SessionReplay { max_messages: 3, max_bytes: 10_000, max_total_bytes: 1 << 20 };
    const IDLE: Duration = Duration::from_secs(600);

    fn req(i: usize) -> Kept {
        let pq = PathAndQuery::try_from(format!("/m/{i}")).unwrap();
        Kept::new(Method::POST, pq, HeaderMap::new(), Bytes::from(vec![b'x'; 10]), None)
    }

    fn ids(plan: Plan) -> Vec<String> {
        match plan {
            Plan::Replay(v) => v.iter().map(|k| k.path_and_query.to_string()).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_moved_session_replays_in_order_and_a_checkpoint_empties_it() {
        let s = Store::default();
        for i in 0..2 {
            assert_eq!(s.record("r", LIMITS, IDLE, "s1", "a", Some(req(i)), false), Recorded::Kept);
        }
        assert!(matches!(s.plan("r", "s1", "a"), Plan::Nothing));
        assert_eq!(ids(s.plan("r", "s1", "b")), ["/m/0", "/m/1"]);
        s.moved("r", "s1", "b");
        assert!(matches!(s.plan("r", "s1", "b"), Plan::Nothing));
        assert_eq!(
            s.record("r", LIMITS, IDLE, "s1", "b", Some(req(2)), true),
            Recorded::Checkpoint
        );
        assert_eq!(s.bytes(), 0);
        assert!(matches!(s.plan("r", "s1", "c"), Plan::Nothing), "nothing to replay");
        assert!(matches!(s.plan("r", "unknown", "c"), Plan::Nothing));
    }

    fn same(route: &str) -> Option<(SessionReplay, Duration)> {
        (route == "r").then_some((LIMITS, IDLE))
    }

    #[test]
    fn logs_go_to_the_next_process_within_its_limits_and_a_byte_budget() {
        let old = Store::default();
        for i in 0..2 {
            old.record("r", LIMITS, IDLE, "s1", "a", Some(req(i)), false);
        }
        old.record("r", LIMITS, IDLE, "s2", "a", Some(req(9)), false);
        let now = Instant::now();
        let mut budget = u64::MAX;
        let list = old.export(now, &mut budget);
        let new = Store::default();
        assert_eq!(new.import(&list, &same, now), 2);
        assert_eq!(ids(new.plan("r", "s1", "b")), ["/m/0", "/m/1"]);
        assert_eq!(new.bytes(), old.bytes());
        // A route the new view no longer replays on is left out.
        assert_eq!(Store::default().import(&list, &|_| None, now), 0);
        // The new view's limits hold: one message per session now, so s1 is over them.
        let one = |_: &str| Some((SessionReplay { max_messages: 1, ..LIMITS }, IDLE));
        let tight = Store::default();
        assert_eq!(tight.import(&list, &one, now), 2);
        assert!(matches!(tight.plan("r", "s1", "b"), Plan::Skipped));
        assert_eq!(ids(tight.plan("r", "s2", "b")), ["/m/9"]);
        // Past the byte budget a session goes as over its limits, without its requests.
        let mut budget = req(0).size() * 2;
        let list = old.export(now, &mut budget);
        assert_eq!(list.iter().filter(|h| h.over && h.kept.is_empty()).count(), 1);
        // A request that cannot be read: the session goes as over its limits, not half kept.
        let mut bad = old.export(now, &mut u64::MAX.clone());
        for h in &mut bad {
            h.kept[0].body = "not base64!".into();
        }
        let broken = Store::default();
        assert_eq!(broken.import(&bad, &same, now), 2);
        assert!(matches!(broken.plan("r", "s1", "b"), Plan::Skipped));
        assert_eq!(broken.bytes(), 0);
    }

    #[test]
    fn at_the_hand_over_the_process_that_changed_a_log_wins_and_both_is_no_replay() {
        let old = Store::default();
        old.record("r", LIMITS, IDLE, "s", "a", Some(req(0)), false);
        old.record("r", LIMITS, IDLE, "t", "a", Some(req(0)), false);
        old.record("r", LIMITS, IDLE, "u", "a", Some(req(0)), false);
        let now = Instant::now();
        let offer = old.export(now, &mut u64::MAX.clone());
        let new = Store::default();
        new.import(&offer, &same, now);
        // Meanwhile the old process serves s, the new one t, and both u.
        old.record("r", LIMITS, IDLE, "s", "a", Some(req(1)), false);
        new.record("r", LIMITS, IDLE, "t", "a", Some(req(2)), false);
        old.record("r", LIMITS, IDLE, "u", "a", Some(req(3)), false);
        new.record("r", LIMITS, IDLE, "u", "a", Some(req(4)), false);
        let handover = old.export(Instant::now(), &mut u64::MAX.clone());
        new.import(&handover, &same, Instant::now());
        assert_eq!(ids(new.plan("r", "s", "b")), ["/m/0", "/m/1"]);
        assert_eq!(ids(new.plan("r", "t", "b")), ["/m/0", "/m/2"]);
        assert!(matches!(new.plan("r", "u", "b"), Plan::Skipped), "neither log is whole");
    }

    #[test]
    fn past_a_limit_the_session_fails_over_without_replay_then_starts_again() {
        let s = Store::default();
        for i in 0..3 {
            assert_eq!(s.record("r", LIMITS, IDLE, "s", "a", Some(req(i)), false), Recorded::Kept);
        }
        assert_eq!(s.record("r", LIMITS, IDLE, "s", "a", Some(req(3)), false), Recorded::Over);
        assert_eq!(s.bytes(), 0, "the useless log was dropped");
        assert!(matches!(s.plan("r", "s", "b"), Plan::Skipped));
        s.moved("r", "s", "b");
        assert_eq!(s.record("r", LIMITS, IDLE, "s", "b", Some(req(4)), false), Recorded::Kept);
        assert_eq!(ids(s.plan("r", "s", "c")), ["/m/4"]);
        // A body too large to keep.
        assert_eq!(s.record("r", LIMITS, IDLE, "t", "a", None, false), Recorded::Over);
        // The total over the route.
        let tight = SessionReplay { max_total_bytes: 2 * KEPT_OVERHEAD + 30, ..LIMITS };
        let s = Store::default();
        assert_eq!(s.record("r", tight, IDLE, "x", "a", Some(req(0)), false), Recorded::Kept);
        assert_eq!(s.record("r", tight, IDLE, "y", "a", Some(req(0)), false), Recorded::Over);
    }
}
