//! The `rate_limit` filter: a token bucket per key (the core's [`Bucket`]), at most `max_keys`
//! of them per filter, the least recently used dropped first. A request that finds its bucket
//! empty is answered 429 with `Retry-After`; every request it sees gets the draft IETF
//! `RateLimit-Policy` and `RateLimit` fields on its response.
//!
//! The buckets outlive the chain: a chain is compiled anew for every view (a reload, a member
//! joining), so they live in the listener's [`Limits`], found by route, position and spec when
//! a chain is compiled (never per request). An unchanged filter keeps its buckets across views;
//! a changed or removed one loses them at the next compile. A listener's own `rate_limit` has
//! one set of buckets that all its routes share.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, header};
use lru::LruCache;
use rondo_config::ListenerSpec;
use rondo_core::bucket::{Bucket, Rate, Taken};
use rondo_core::traffic::{LimitKey, RateLimit, TrafficFilter};
use rondo_core::{Instant, Route};
use rondo_runtime::Live;
use rondo_runtime::metrics::{Counter, Gauge, Metrics};

use super::table::{Edit, Edits, Src, slot};
use super::{Answer, Applied, Info};
use crate::head::Headers;

/// The draft's field of a request's current limits.
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The draft's field of the policies.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The longest key kept as it is; a longer one (a header value, a subject) is kept as a hash
/// with the buckets' random seed, so a bucket's memory is bounded whatever the client sends.
const MAX_KEY: usize = 64;

/// The tags that start a stored key, so that no two kinds of key meet.
const TAG_AS_IS: u8 = 0;
const TAG_HASHED: u8 = 1;
/// Requests without the header (or the identity) the key names: one bucket for them all.
const TAG_ABSENT: u8 = 2;

/// Every `rate_limit`'s buckets of one listener, by the filter they belong to.
#[derive(Default, Debug)]
pub struct Limits {
    filters: Mutex<HashMap<Slot, Arc<Buckets>>>,
}

/// Which filter buckets belong to: its route (empty: the listener's own filter), its position
/// in the chain and its spec (a changed spec starts afresh).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Slot {
    route: String,
    position: usize,
    spec: RateLimit,
}

/// One filter's buckets, found by a seeded foldhash of the key (SipHash, the default, cost
/// more than the rest of the look-up).
pub(crate) struct Buckets {
    map: Mutex<LruCache<Vec<u8>, Bucket, foldhash::quality::RandomState>>,
    seed: RandomState,
    evicted: Counter,
}

impl fmt::Debug for Buckets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = self.map.lock().map_or(0, |m| m.len());
        f.debug_struct("Buckets").field("len", &len).finish()
    }
}

impl Buckets {
    fn new(max_keys: u64, evicted: Counter) -> Buckets {
        let cap = usize::try_from(max_keys).ok().and_then(NonZeroUsize::new);
        // Unbounded, then bounded: the map grows with the keys seen, not to `max_keys` at once.
        let mut map = LruCache::unbounded_with_hasher(foldhash::quality::RandomState::default());
        map.resize(cap.unwrap_or(NonZeroUsize::MIN));
        Buckets { map: Mutex::new(map), seed: RandomState::new(), evicted }
    }

    /// Takes a token from `key`'s bucket at `now`; a key not seen (or dropped) starts full,
    /// dropping the least recently used bucket when `max_keys` are kept already.
    /// Takes a token from `key`'s bucket of `rate` and `burst` (this router's share of the
    /// filter's, [`RateLimit::share`]).
    pub(crate) fn take(
        &self,
        (rate, burst): (Rate, u64),
        key: Option<&[u8]>,
        now: Instant,
    ) -> Taken {
        let mut stored = [0u8; 1 + MAX_KEY];
        let len = match key {
            None => {
                stored[0] = TAG_ABSENT;
                1
            }
            Some(k) if k.len() <= MAX_KEY => {
                stored[0] = TAG_AS_IS;
                stored[1..=k.len()].copy_from_slice(k);
                1 + k.len()
            }
            Some(k) => {
                stored[0] = TAG_HASHED;
                stored[1..9].copy_from_slice(&self.seed.hash_one(k).to_be_bytes());
                9
            }
        };
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let (bucket, dropped) =
            map.get_or_push_mut_ref(&stored[..len], || Bucket::full(&rate, burst, now));
        let taken = bucket.take(&rate, burst, now);
        drop(map);
        if dropped.is_some() {
            self.evicted.inc();
        }
        taken
    }

    /// Buckets kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().map_or(0, |m| m.len())
    }
}

impl Limits {
    /// The buckets of the filter in `slot`: those it had when its spec is unchanged, else new.
    fn buckets(&self, slot: Slot, evicted: impl FnOnce() -> Counter) -> Arc<Buckets> {
        let mut filters = self.filters.lock().unwrap_or_else(PoisonError::into_inner);
        let max_keys = slot.spec.max_keys;
        filters.entry(slot).or_insert_with(|| Arc::new(Buckets::new(max_keys, evicted()))).clone()
    }

    /// Drops the buckets of every filter not in `live`.
    fn keep(&self, live: &HashSet<Slot>) {
        let mut filters = self.filters.lock().unwrap_or_else(PoisonError::into_inner);
        filters.retain(|slot, _| live.contains(slot));
    }

    /// Filters with buckets.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.filters.lock().map_or(0, |f| f.len())
    }
}

/// What a chain being compiled needs to find its rate limits' buckets.
pub(crate) struct Binder<'a> {
    limits: &'a Limits,
    metrics: &'a Metrics,
    listener: &'a str,
    route: &'a str,
    /// How many of the chain's filters are the listener's (they come first).
    own: usize,
}

impl<'a> Binder<'a> {
    /// For `route`'s chain on `listener` (whose buckets are `limits`); first drops the buckets
    /// of filters the current view no longer has (a route removed, a spec changed).
    pub(crate) fn new(
        limits: &'a Limits,
        live: &'a Live,
        listener: &'a ListenerSpec,
        route: &'a Route,
    ) -> Binder<'a> {
        let binder = Binder {
            limits,
            metrics: &live.metrics,
            listener: &listener.name,
            route: &route.name,
            own: listener.filters.len(),
        };
        let view = live.load().view.clone();
        let mut kept = HashSet::new();
        for r in view.routes.iter().filter(|r| r.listener == listener.name) {
            let filters = listener.filters.iter().chain(&r.filters);
            for (position, f) in filters.enumerate() {
                if let TrafficFilter::RateLimit(spec) = f {
                    kept.insert(binder.slot(&r.name, position, spec));
                }
            }
        }
        binder.limits.keep(&kept);
        binder
    }

    /// For tests: buckets in `limits`, for a chain with no listener filter.
    #[cfg(test)]
    pub(crate) fn detached(limits: &'a Limits, metrics: &'a Metrics, route: &'a str) -> Self {
        Binder { limits, metrics, listener: "web", route, own: 0 }
    }

    fn slot(&self, route: &str, position: usize, spec: &RateLimit) -> Slot {
        // A listener's filter: the same buckets on every route.
        let route = if position < self.own { String::new() } else { route.to_owned() };
        Slot { route, position, spec: spec.clone() }
    }

    /// The compiled filter at `position` of the chain.
    pub(crate) fn step(&self, position: usize, spec: &RateLimit) -> LimitStep {
        let slot = self.slot(self.route, position, spec);
        let owner = slot.route.clone();
        let buckets =
            self.limits.buckets(slot, || self.metrics.rate_limit_evictions(self.listener, &owner));
        let id = format!("\"{}\"", spec.key.name());
        let policy = format!(
            "{id};q={};w={};rondo-burst={}",
            spec.rate.count, spec.rate.per_secs, spec.burst
        );
        // The key's name is a token and the numbers digits: always a valid value.
        let policy = HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static(""));
        LimitStep {
            spec: spec.clone(),
            buckets,
            limited: self.metrics.rate_limited(self.listener, self.route),
            routers: spec.tier.then(|| self.metrics.tier_routers.clone()),
            state: format!("{id};r=").into_bytes().into(),
            policy,
        }
    }
}

/// A compiled `rate_limit`.
pub(crate) struct LimitStep {
    spec: RateLimit,
    buckets: Arc<Buckets>,
    limited: Counter,
    /// `scope = "tier"`: the tier's routers present in etcd, kept up to date by the registry.
    routers: Option<Gauge>,
    /// The start of `RateLimit`'s value: the policy's identifier (a structured-field string,
    /// the key's name) and `;r=`.
    state: Box<[u8]>,
    /// The `RateLimit-Policy` value, made once.
    policy: HeaderValue,
}

impl LimitStep {
    /// Takes a token from the request's bucket (the clock read once, here): the draft's fields
    /// go on the response, and an empty bucket answers 429.
    /// `subject` is the verified identity's (the route's `auth`, before this filter).
    pub(super) fn request(
        &self,
        info: &Info<'_>,
        subject: Option<&str>,
        headers: &impl Headers,
        applied: &mut Applied,
    ) -> Option<Answer> {
        let key = match &self.spec.key {
            LimitKey::ClientIp => Some(info.client_ip),
            LimitKey::Header(name) => headers.get(name),
            LimitKey::Identity => subject.map(str::as_bytes),
            LimitKey::Route => Some(&b""[..]),
        };
        let routers = self.routers.as_ref().map_or(1, |g| u64::try_from(g.get()).unwrap_or(1));
        let share = self.spec.share(routers);
        let taken = self.buckets.take(share, key, rondo_runtime::clock::now());
        self.fields(&taken, applied);
        if taken.admitted {
            return None;
        }
        self.limited.inc();
        let retry = seconds(taken.next_token).max(1);
        let headers = vec![
            (header::RETRY_AFTER, HeaderValue::from(retry)),
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
        ];
        let body = Bytes::from(format!("too many requests: retry after {retry} s\n"));
        Some(Answer { status: 429, headers, body })
    }

    /// `RateLimit-Policy` (made once) and `RateLimit` (this request's state, in the slot
    /// `next` gives) added to the response.
    pub(super) fn edits(&self, next: &mut u16) -> Edits {
        let response = vec![
            Edit::Add(RATELIMIT_POLICY, Src::Fixed(self.policy.clone())),
            Edit::Add(RATELIMIT, Src::Slot(slot(next))),
        ];
        Edits { request: Vec::new(), response }
    }

    /// `RateLimit`'s value (whole tokens left, seconds until one more) into the request's
    /// record. Written by hand rather than formatted: it runs for every request of the route.
    fn fields(&self, taken: &Taken, applied: &mut Applied) {
        // The key's name (a token, quoted) and two numbers: always a valid value. The numbers
        // are written from the end of one buffer: `<remaining>;t=<seconds>`.
        let mut end = [0u8; 43];
        let t = digits(seconds(taken.more_in), &mut end);
        let mut at = 43 - t;
        end[at - 3..at].copy_from_slice(b";t=");
        at -= 3;
        at -= digits(taken.remaining, &mut end[..at]);
        let record = &mut applied.record;
        record.extend(&self.state);
        record.extend(&end[at..]);
        record.close(true);
    }
}

/// `n` in decimal, at the end of `buf` (room for any `u64`: 20 bytes); how many digits.
fn digits(n: u64, buf: &mut [u8]) -> usize {
    let mut i = buf.len();
    let mut n = n;
    while let Some(d) = i.checked_sub(1) {
        i = d;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.len() - i
}

/// Whole seconds, rounded up.
fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
#[path = "limit_tests.rs"]
mod tests;
