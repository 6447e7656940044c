//! A naming hierarchy (PKUAS: a naming service falls back to the one above it). With
//! `[naming] parent`, a name this service does not hold is asked of the parent (through the
//! client library's [`NamingClient`], the parent's endpoints tried in order) and its answer
//! cached, with the parent's view id, for at most [`MAX_CACHED`] names (the oldest goes first).
//! Lookups of a cached name are picked here, from the parent's members and policy, by the same
//! core balancer the client library uses.
//!
//! One task long-polls the parent's watch: when the parent's view moves, every cached name is
//! fetched again, and a changed answer (or a name the parent dropped) makes a new local view id,
//! so that watches here see changes made above (relayed level by level). While the parent does
//! not answer, cached answers are served marked stale; a parent's own stale answers stay stale
//! here. A name registered or configured here shadows the parent's: the local view is asked
//! first.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rondo_client::NamingClient;
use rondo_client::wire::{Answer, Lookup};
use rondo_core::{Balancer, Decision, PickRequest, SplitMix64};
use rondo_runtime::{Views, WeakViews, clock};

/// Most names cached from the parent.
pub const MAX_CACHED: usize = 1024;
/// Timeout of one request to the parent.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long one watch of the parent waits.
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// Longest wait between two tries of a parent that does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A name as the parent answered it.
#[derive(Debug)]
pub struct Entry {
    /// The parent's answer (its members, policy and view id).
    pub answer: Answer,
    /// The naming service that holds the name (the parent's own `answered_by`).
    pub answered_by: String,
    /// The parent said its answer is stale.
    upstream_stale: bool,
    picker: Mutex<(Balancer, SplitMix64)>,
}

impl Entry {
    fn new(answer: Answer, answered_by: String, upstream_stale: bool) -> Entry {
        let spec = Arc::new(rondo_client::cluster_spec(&answer));
        let seed = clock::now().0 ^ rondo_core::hash::hash_key(answer.service.as_bytes());
        let picker = Mutex::new((Balancer::new(spec, clock::now()), SplitMix64::new(seed)));
        Entry { answer, answered_by, upstream_stale, picker }
    }

    /// One member picked by the parent's policy, as a lookup here (nothing counted on it).
    pub fn pick(&self, group: Option<&str>, key: Option<&str>) -> Option<(Lookup, Decision)> {
        let mut g = self.picker.lock().unwrap_or_else(|e| e.into_inner());
        let (balancer, rng) = &mut *g;
        let req = PickRequest {
            now: clock::now(),
            group,
            hash: key.map(|k| rondo_core::hash::hash_key(k.as_bytes())),
            context: None,
            exclude: &[],
        };
        let d = balancer.pick(&req, rng).ok()?;
        let spec = balancer.spec().members.get(d.member)?;
        let member = self.answer.members.iter().find(|m| m.name == spec.name)?.clone();
        let lookup = Lookup {
            service: self.answer.service.clone(),
            view_id: self.answer.view_id,
            member,
            why: format!("{}: {}", d.algorithm, d.why),
        };
        Some((lookup, d))
    }

    /// Whether `other` says the same (members, policy, staleness), view ids aside.
    fn same(&self, other: &Entry) -> bool {
        self.answer.members == other.answer.members
            && self.answer.policy == other.answer.policy
            && self.upstream_stale == other.upstream_stale
            && self.answered_by == other.answered_by
    }
}

/// Why the parent gave no answer.
#[derive(Debug)]
pub enum ParentError {
    /// The parent does not hold the name either (its message).
    NotFound(String),
    /// No parent endpoint answered (each one's failure).
    Unavailable(String),
}

/// The parent and what was cached from it.
#[derive(Debug)]
pub struct Parent {
    endpoints: Vec<NamingClient>,
    at: AtomicUsize,
    down: AtomicBool,
    cache: Mutex<Cache>,
    /// The view whose id a change of the parent's answers raises (watchers then refetch).
    views: WeakViews,
}

#[derive(Debug, Default)]
struct Cache {
    names: HashMap<String, Arc<Entry>>,
    /// Insertion order, for evicting the oldest past [`MAX_CACHED`].
    order: VecDeque<String>,
}

impl Parent {
    /// The parent at `endpoints` (checked by the configuration; one that does not parse is
    /// skipped) for the naming service over `views`, with its watch task; `None` without any.
    pub fn start(
        endpoints: &[String],
        views: &Views,
    ) -> Option<(Arc<Parent>, tokio::task::JoinHandle<()>)> {
        let endpoints: Vec<NamingClient> =
            endpoints.iter().filter_map(|e| NamingClient::new(e, TIMEOUT)).collect();
        if endpoints.is_empty() {
            return None;
        }
        let parent = Arc::new(Parent {
            endpoints,
            at: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            cache: Mutex::new(Cache::default()),
            views: views.downgrade(),
        });
        let task = tokio::spawn(follow(Arc::downgrade(&parent)));
        Some((parent, task))
    }

    /// Whether the parent is not answering now (cached answers are then stale).
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Whether `entry` is served stale: the parent is down, or said so itself.
    pub fn is_stale(&self, entry: &Entry) -> bool {
        self.is_down() || entry.upstream_stale
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The parent's answer for `service`: cached, or asked for now (and cached).
    pub async fn answer(&self, service: &str) -> Result<Arc<Entry>, ParentError> {
        if let Some(e) = self.cache().names.get(service) {
            return Ok(e.clone());
        }
        let entry = Arc::new(self.fetch(service).await?);
        let mut cache = self.cache();
        if !cache.names.contains_key(service) {
            if cache.order.len() >= MAX_CACHED
                && let Some(oldest) = cache.order.pop_front()
            {
                cache.names.remove(&oldest);
            }
            cache.order.push_back(service.to_owned());
        }
        cache.names.insert(service.to_owned(), entry.clone());
        Ok(entry)
    }

    /// Asks the parent's endpoints in turn, from the one in use.
    async fn fetch(&self, service: &str) -> Result<Entry, ParentError> {
        let n = self.endpoints.len();
        let start = self.at.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..n {
            let at = (start + i) % n;
            match self.endpoints[at].answer_json(service).await {
                Ok(v) => {
                    self.at.store(at, Ordering::Relaxed);
                    return entry_of(v, &self.endpoints[at]).map_err(ParentError::Unavailable);
                }
                Err(e) if e.status == Some(404) => return Err(ParentError::NotFound(e.what)),
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(ParentError::Unavailable(failures.join("; ")))
    }

    /// Fetches every cached name again; a changed or dropped one makes a new local view id.
    /// Stops at the first transport failure (the parent is then down).
    async fn refresh(&self) -> Result<(), ()> {
        let names: Vec<String> = self.cache().order.iter().cloned().collect();
        let mut changed = false;
        for name in names {
            let fetched = self.fetch(&name).await;
            let mut cache = self.cache();
            match fetched {
                Ok(new) => {
                    // A name evicted meanwhile stays out (the cache's order must list it).
                    if let Some(old) = cache.names.get_mut(&name)
                        && !old.same(&new)
                    {
                        *old = Arc::new(new);
                        changed = true;
                    }
                }
                Err(ParentError::NotFound(_)) => {
                    cache.names.remove(&name);
                    cache.order.retain(|n| *n != name);
                    changed = true;
                }
                Err(ParentError::Unavailable(_)) => return Err(()),
            }
        }
        if changed {
            self.touch();
        }
        Ok(())
    }

    /// A new local view id, so that watches here wake.
    fn touch(&self) {
        if let Some(views) = self.views.upgrade() {
            views.touch();
        }
    }

    fn set_down(&self, down: bool) {
        if self.down.swap(down, Ordering::Relaxed) != down && !self.cache().names.is_empty() {
            // Cached answers turned stale (or fresh): their readers should look again.
            self.touch();
        }
    }
}

/// The parent's JSON answer as an entry (`answered_by` the endpoint when the parent holds the
/// name itself).
fn entry_of(v: serde_json::Value, endpoint: &NamingClient) -> Result<Entry, String> {
    let answered_by = v.get("answered_by").and_then(|a| a.as_str()).map_or_else(
        || endpoint.endpoint().trim_start_matches("http://").to_owned(),
        str::to_owned,
    );
    let stale = v.get("stale").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let answer: Answer = serde_json::from_value(v)
        .map_err(|e| format!("{}: bad answer: {e}", endpoint.endpoint()))?;
    Ok(Entry::new(answer, answered_by, stale))
}

/// The watch task: long-polls the parent's watch on the endpoint in use, refreshes the cache
/// when its view moves, and marks the parent down (and moves to its next endpoint, with a
/// doubling backoff) when it fails. Ends when the parent is dropped.
async fn follow(parent: Weak<Parent>) {
    let mut after = 0;
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(p) = parent.upgrade() else { return };
        let at = p.at.load(Ordering::Relaxed) % p.endpoints.len();
        let client = p.endpoints[at].clone();
        drop(p);
        let watched = client.watch(after, WATCH_WAIT).await;
        let Some(p) = parent.upgrade() else { return };
        let refreshed = match watched {
            Ok(w) if w.changed || w.view_id != after || p.is_down() => {
                after = w.view_id;
                p.refresh().await
            }
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, "naming parent watch failed");
                Err(())
            }
        };
        match refreshed {
            Ok(()) => {
                p.set_down(false);
                backoff = Duration::from_millis(50);
            }
            Err(()) => {
                p.set_down(true);
                after = 0;
                p.at.store((at + 1) % p.endpoints.len(), Ordering::Relaxed);
                drop(p);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
