//! The embedded store's index in memory: the messages not yet delivered, the ready set by due
//! time, one FIFO per session key, the leases and the dead letters.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use crate::record::MetaRecord;

/// A message not yet delivered.
#[derive(Debug, Clone)]
pub(super) struct Live {
    pub(super) meta: MetaRecord,
    pub(super) attempts: u32,
    pub(super) due: Instant,
}

/// A dead letter.
#[derive(Debug, Clone)]
pub(super) struct Dead {
    pub(super) meta: MetaRecord,
    pub(super) attempts: u32,
    pub(super) dead_ms: u64,
    pub(super) last_reason: String,
}

#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) live: BTreeMap<u64, Live>,
    pub(super) ready: BTreeSet<(Instant, u64)>,
    pub(super) sessions: HashMap<String, VecDeque<u64>>,
    pub(super) leased: BTreeSet<u64>,
    pub(super) dead: BTreeMap<u64, Dead>,
    /// Messages and bytes held, live and dead, plus appends not yet committed.
    pub(super) count: u64,
    pub(super) bytes: u64,
    pub(super) next_seq: u64,
}

impl Index {
    /// Makes `seq` (live, not leased) deliverable at its due time, unless an earlier message of
    /// its session goes first.
    pub(super) fn schedule(&mut self, seq: u64) {
        let Some(l) = self.live.get(&seq) else { return };
        let due = l.due;
        match &l.meta.session {
            Some(k) => {
                let q = self.sessions.entry(k.clone()).or_default();
                if !q.contains(&seq) {
                    q.push_back(seq);
                }
                if q.front() == Some(&seq) {
                    self.ready.insert((due, seq));
                }
            }
            None => {
                self.ready.insert((due, seq));
            }
        }
    }

    /// `seq` leaves the live set (delivered or dead): the next message of its session may go.
    pub(super) fn unlink(&mut self, seq: u64) -> Option<Live> {
        self.leased.remove(&seq);
        let l = self.live.remove(&seq)?;
        self.ready.remove(&(l.due, seq));
        if let Some(k) = &l.meta.session
            && let Some(q) = self.sessions.get_mut(k)
        {
            q.retain(|s| *s != seq);
            match q.front().copied() {
                None => {
                    self.sessions.remove(k);
                }
                Some(next) => {
                    if !self.leased.contains(&next)
                        && let Some(n) = self.live.get(&next)
                    {
                        self.ready.insert((n.due, next));
                    }
                }
            }
        }
        Some(l)
    }

    /// The leased `seq` is due again at `due`.
    pub(super) fn release(&mut self, seq: u64, due: Instant) {
        if self.leased.remove(&seq)
            && let Some(l) = self.live.get_mut(&seq)
        {
            l.due = due;
            self.ready.insert((due, seq));
        }
    }
}
