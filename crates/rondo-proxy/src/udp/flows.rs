//! A `udp` listener's flow table: the flows open now, by key (the client's address, and the
//! member with `granularity = "request"`), bounded by `max_flows`. When it is full a new flow
//! takes the place of one idle longest, found by a second-chance sweep over the flows in the
//! order they were started or last passed over: at most [`SWEEP`] flows are looked at, so
//! making room costs the same whatever the table's size (a flood of spoofed source addresses
//! cannot make each datagram dearer, nor the table larger).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rondo_runtime::ClusterRt;
use rondo_runtime::metrics::UdpMetrics;
use tokio::net::UdpSocket;

/// Flows looked at to find the one idle longest when the table is full.
const SWEEP: usize = 8;

/// What a flow is kept under: the client's address, and with `granularity = "request"` the
/// member (a client's datagrams then go to several members, each over a flow of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub client: SocketAddr,
    /// The member's index with `granularity = "request"`; `u32::MAX` with `"flow"`.
    pub member: u32,
}

/// One flow: a socket connected to the member, which the flow's relay task reads answers from.
#[derive(Debug)]
pub(super) struct Flow {
    pub key: Key,
    /// Tells this flow from a later one under the same key.
    pub id: u64,
    pub socket: UdpSocket,
    pub rt: Arc<ClusterRt>,
    pub member: usize,
    pub metrics: UdpMetrics,
    /// The listener's clock ([`super::Shared::now_ms`]) at the last datagram either way.
    last: AtomicU64,
    /// Microseconds from the flow's start to the member's first answer (0: none yet).
    pub first_answer_us: AtomicU64,
    /// The member refused a datagram (ICMP port unreachable): a failure to charge.
    pub refused: AtomicBool,
    /// The relay task, aborted when the flow is evicted.
    pub task: std::sync::OnceLock<tokio::task::AbortHandle>,
}

impl Flow {
    pub fn new(
        key: Key,
        socket: UdpSocket,
        (rt, member): (Arc<ClusterRt>, usize),
        metrics: UdpMetrics,
        now_ms: u64,
    ) -> Flow {
        Flow {
            key,
            id: 0,
            socket,
            rt,
            member,
            metrics,
            last: AtomicU64::new(now_ms),
            first_answer_us: AtomicU64::new(0),
            refused: AtomicBool::new(false),
            task: std::sync::OnceLock::new(),
        }
    }

    /// A datagram passed either way at `now_ms`.
    pub fn touch(&self, now_ms: u64) {
        // A relaxed store: the idle check only needs a recent value, not an ordered one.
        if self.last.load(Ordering::Relaxed) != now_ms {
            self.last.store(now_ms, Ordering::Relaxed);
        }
    }

    pub fn last(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct FlowTable {
    map: HashMap<Key, Arc<Flow>>,
    /// Keys in the order flows started or were last passed over by a sweep, each with the
    /// flow's id; entries of flows that ended are skipped when met.
    order: VecDeque<(Key, u64)>,
    max: usize,
    next_id: u64,
}

impl FlowTable {
    pub fn new(max: usize) -> FlowTable {
        FlowTable { map: HashMap::new(), order: VecDeque::new(), max, next_id: 1 }
    }

    pub fn get(&self, key: &Key) -> Option<&Arc<Flow>> {
        self.map.get(key)
    }

    /// Whether a new flow needs room made first.
    pub fn is_full(&self) -> bool {
        self.map.len() >= self.max
    }

    /// Keeps `flow` (whose key holds no flow now), giving it its id.
    pub fn insert(&mut self, mut flow: Flow) -> Arc<Flow> {
        flow.id = self.next_id;
        self.next_id += 1;
        let flow = Arc::new(flow);
        self.order.push_back((flow.key, flow.id));
        self.map.insert(flow.key, flow.clone());
        // Entries of ended flows are dropped once they are half the queue: it stays within
        // twice the table's size.
        if self.order.len() > 2 * self.max + SWEEP {
            let map = &self.map;
            self.order.retain(|(k, id)| map.get(k).is_some_and(|f| f.id == *id));
        }
        flow
    }

    /// Forgets flow `id` under `key` (a later flow under the same key stays).
    pub fn remove(&mut self, key: &Key, id: u64) -> Option<Arc<Flow>> {
        match self.map.get(key) {
            Some(f) if f.id == id => self.map.remove(key),
            _ => None,
        }
    }

    /// Takes out the flow idle longest among the next [`SWEEP`] in the queue (the others go
    /// to its back: their second chance), to make room for a new one.
    pub fn evict(&mut self) -> Option<Arc<Flow>> {
        let map = &self.map;
        let live = |(key, id): &(Key, u64)| map.get(key).filter(|f| f.id == *id).map(|f| f.last());
        let (key, id) = sweep(&mut self.order, live)?;
        self.remove(&key, id)
    }
}

/// Pops entries off `order` until [`SWEEP`] live ones are seen (`last_of` says when each was
/// last active, `None` for an entry whose flow ended: dropped), puts all but the one idle
/// longest back at the end, and returns that one.
fn sweep<K: Copy>(order: &mut VecDeque<K>, last_of: impl Fn(&K) -> Option<u64>) -> Option<K> {
    let mut victim: Option<(K, u64)> = None;
    let mut passed = 0;
    while passed < SWEEP {
        let Some(k) = order.pop_front() else { break };
        let Some(last) = last_of(&k) else { continue };
        passed += 1;
        match victim {
            Some((_, vlast)) if vlast <= last => order.push_back(k),
            Some((v, _)) => {
                order.push_back(v);
                victim = Some((k, last));
            }
            None => victim = Some((k, last)),
        }
    }
    victim.map(|(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_of_a_sweep_goes() {
        // Twenty flows, flow i last active at 100 - i; flows 2 and 3 have ended.
        let mut q: VecDeque<u32> = (0..20).collect();
        let last = |k: &u32| (!matches!(k, 2 | 3)).then(|| 100 - u64::from(*k));
        // The sweep looks at 0, 1, 4..=9 (eight live ones): 9 was idle longest.
        assert_eq!(sweep(&mut q, last), Some(9));
        // The ended ones are gone, the seven passed over went to the back.
        assert_eq!(q.len(), 20 - 2 - 1);
        assert_eq!(q.front(), Some(&10));
        let mut back: Vec<u32> = q.iter().rev().take(7).copied().collect();
        back.sort_unstable();
        assert_eq!(back, [0, 1, 4, 5, 6, 7, 8]);
        // An empty queue, or one of ended flows only, has nothing to evict.
        assert_eq!(sweep(&mut VecDeque::<u32>::new(), last), None);
        assert_eq!(sweep(&mut VecDeque::from([2, 3]), last), None);
    }
}
