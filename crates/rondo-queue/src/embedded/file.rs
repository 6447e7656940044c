//! The embedded store's file layout: its tables, reading the index from them when the store is
//! opened, and reading one message back for a delivery or an admin call.

use std::time::Instant;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use rondo_config::QueueSpec;
use rondo_runtime::queues::TryRecord;

use super::index::{Dead, Index, Live};
use crate::record;
use crate::store::{Message, unix_ms};

pub(super) const META: TableDefinition<u64, &[u8]> = TableDefinition::new("meta");
pub(super) const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
pub(super) const TRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("tries");
pub(super) const DEAD: TableDefinition<u64, u64> = TableDefinition::new("dead");
pub(super) const INFO: TableDefinition<&str, u64> = TableDefinition::new("info");

pub(super) fn read_message(db: &Database, seq: u64) -> Result<(Message, Vec<TryRecord>), String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let msgs = txn.open_table(MESSAGES).map_err(|e| e.to_string())?;
    let tries = txn.open_table(TRIES).map_err(|e| e.to_string())?;
    let m = msgs
        .get(seq)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("message {seq} is missing from the store"))?;
    let m = record::decode_message(m.value()).map_err(|e| format!("message {seq}: {e}"))?;
    let t = match tries.get(seq).map_err(|e| e.to_string())? {
        Some(t) => record::decode_tries(t.value()).map_err(|e| format!("message {seq}: {e}"))?,
        None => Vec::new(),
    };
    Ok((m, t))
}

/// Creates the tables if missing and reads the index.
pub(super) fn load(db: &Database, spec: &QueueSpec) -> Result<(u32, Index), String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("{what}: {err}");
    let txn = db.begin_write().map_err(|x| e("cannot write", &x))?;
    let uid = {
        let mut info = txn.open_table(INFO).map_err(|x| e("table info", &x))?;
        let got = info.get("uid").map_err(|x| e("table info", &x))?.map(|v| v.value());
        match got {
            Some(u) => u as u32,
            None => {
                let u = (rondo_core::hash::hash_key(
                    format!("{}/{}/{:?}", spec.name, std::process::id(), Instant::now()).as_bytes(),
                ) ^ unix_ms()) as u32;
                info.insert("uid", u64::from(u)).map_err(|x| e("table info", &x))?;
                u
            }
        }
    };
    for t in [META, MESSAGES, TRIES] {
        txn.open_table(t).map_err(|x| e("table", &x))?;
    }
    txn.open_table(DEAD).map_err(|x| e("table dead", &x))?;
    txn.commit().map_err(|x| e("cannot commit", &x))?;

    let txn = db.begin_read().map_err(|x| e("cannot read", &x))?;
    let info = txn.open_table(INFO).map_err(|x| e("table info", &x))?;
    let meta = txn.open_table(META).map_err(|x| e("table meta", &x))?;
    let msgs = txn.open_table(MESSAGES).map_err(|x| e("table messages", &x))?;
    let tries = txn.open_table(TRIES).map_err(|x| e("table tries", &x))?;
    let dead = txn.open_table(DEAD).map_err(|x| e("table dead", &x))?;
    let mut index = Index {
        next_seq: info.get("next_seq").map_err(|x| e("table info", &x))?.map_or(1, |v| v.value()),
        ..Index::default()
    };
    let now = Instant::now();
    let mut last = 0;
    for row in meta.iter().map_err(|x| e("table meta", &x))? {
        let (k, v) = row.map_err(|x| e("table meta", &x))?;
        let seq = k.value();
        last = seq;
        let m = record::decode_meta(v.value()).map_err(|x| format!("message {seq}: {x}"))?;
        if msgs.get(seq).map_err(|x| e("table messages", &x))?.is_none() {
            return Err(format!("message {seq} has metadata but no content"));
        }
        let t = match tries.get(seq).map_err(|x| e("table tries", &x))? {
            Some(t) => {
                record::decode_tries(t.value()).map_err(|x| format!("message {seq}: {x}"))?
            }
            None => Vec::new(),
        };
        index.count += 1;
        index.bytes += m.size;
        let attempts = t.len() as u32;
        match dead.get(seq).map_err(|x| e("table dead", &x))? {
            Some(at) => {
                let last_reason = t.last().map(|t| t.reason.clone()).unwrap_or_default();
                index
                    .dead
                    .insert(seq, Dead { meta: m, attempts, dead_ms: at.value(), last_reason });
            }
            None => {
                index.live.insert(seq, Live { meta: m, attempts, due: now });
            }
        }
    }
    index.next_seq = index.next_seq.max(last + 1);
    let seqs: Vec<u64> = index.live.keys().copied().collect();
    for seq in seqs {
        index.schedule(seq);
    }
    Ok((uid, index))
}
