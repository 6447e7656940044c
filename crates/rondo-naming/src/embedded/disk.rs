//! The embedded registry's files: the snapshot and the log beside it (`journal`), written by
//! the writer thread (a log line per batch, a new snapshot when one is due) and read at start
//! (the snapshot, then the log replayed over it).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rondo_runtime::metrics::Metrics;
use serde::Deserialize;

use super::state::{State, insert, remove, restore, saved};
use crate::journal::{self, Change, SavedRegistration};
use crate::registry::StartError;

/// The snapshot file's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotFile {
    /// The last log batch it holds (0, or absent: none).
    #[serde(default)]
    seq: u64,
    registrations: Vec<SavedRegistration>,
}

/// The writer thread's files: the snapshot, the log beside it, and where they stand.
#[derive(Debug)]
pub(super) struct Disk {
    pub(super) snapshot: PathBuf,
    pub(super) log: PathBuf,
    /// The last batch number written (to the snapshot or the log).
    pub(super) seq: u64,
    /// Bytes in the log since the last snapshot.
    pub(super) log_len: u64,
    /// Bytes of the last snapshot written or read.
    pub(super) snapshot_len: u64,
    /// The next batch must go to a new snapshot: the first batch of this process (folding the
    /// log it started from, and a torn end), or a failed append left the log's end unknown.
    pub(super) must_compact: bool,
    /// Memory holds removals (lapsed leases) that no file does yet: write even with no change.
    pub(super) behind: bool,
    /// The log's least size for a compaction
    /// ([`DEFAULT_COMPACT_BYTES`](super::DEFAULT_COMPACT_BYTES)).
    pub(super) compact_bytes: u64,
}

impl Disk {
    /// Whether the next batch goes to a new snapshot rather than the log.
    pub(super) fn compaction_due(&self) -> bool {
        self.must_compact
            || self.behind
            || self.log_len >= self.compact_bytes.max(self.snapshot_len)
    }

    /// Writes `text` (every registration, through the batch it names) as the new snapshot, then
    /// empties the log (all of it is in the snapshot now; a crash between the two leaves lines
    /// the snapshot's batch number makes the replay skip).
    fn compact(&mut self, text: &str, metrics: &Metrics) -> Result<(), String> {
        save_snapshot(&self.snapshot, text)?;
        metrics.registry_bytes_written.inc_by(text.len() as u64);
        metrics.registry_compactions.inc();
        self.snapshot_len = text.len() as u64;
        self.behind = false;
        self.must_compact = false;
        match empty_log(&self.log) {
            Ok(()) => self.log_len = 0,
            Err(e) => {
                // Its lines are in the snapshot; what is appended after them must not follow
                // an unknown end: the next batch tries again.
                tracing::warn!("naming log {}: cannot empty it: {e}", self.log.display());
                self.must_compact = true;
            }
        }
        Ok(())
    }

    /// Writes batch `seq`: `snapshot` as the new snapshot when one is due (the batch's line
    /// goes to the log instead when that fails and the log is sound), else the batch's line.
    /// Returns the bytes written and the snapshot's error the log made up for.
    pub(super) fn write(
        &mut self,
        seq: u64,
        snapshot: Option<String>,
        changes: &[String],
        metrics: &Metrics,
    ) -> (Result<usize, String>, Option<String>) {
        let mut compaction_error = None;
        let written = match snapshot {
            Some(text) => match self.compact(&text, metrics) {
                Ok(()) => Ok(text.len()),
                Err(e) if self.must_compact || self.behind => Err(e),
                Err(e) => {
                    // The log is sound: the batch goes there, and the next one tries again.
                    tracing::warn!("{e}: appending to the log instead");
                    compaction_error = Some(e);
                    let line = journal::line(seq, changes);
                    self.append(&line, metrics).map(|()| line.len())
                }
            },
            None => {
                let line = journal::line(seq, changes);
                self.append(&line, metrics).map(|()| line.len())
            }
        };
        // A failed batch's number is not used again: its line may be partly on disk.
        self.seq = seq;
        (written, compaction_error)
    }

    /// Appends `line` to the log and syncs it. On failure the log is cut back to where it was
    /// (as far as that works) and the next batch goes to a new snapshot.
    fn append(&mut self, line: &[u8], metrics: &Metrics) -> Result<(), String> {
        use std::io::Write;
        let log = &self.log;
        let fail = |e: std::io::Error| format!("naming log {}: cannot write: {e}", log.display());
        // Opened per batch (one open and close beside the write and the sync), so the log is
        // the file at its path now, whatever happened to it.
        let mut file = match std::fs::OpenOptions::new().append(true).open(log) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(log)
                    .map_err(fail)?;
                sync_parent(log).map_err(fail)?;
                f
            }
            Err(e) => return Err(fail(e)),
        };
        let before = file.metadata().map_err(fail)?.len();
        match file.write_all(line).and_then(|()| file.sync_data()) {
            Ok(()) => {
                self.log_len = before + line.len() as u64;
                metrics.registry_bytes_written.inc_by(line.len() as u64);
                Ok(())
            }
            Err(e) => {
                self.must_compact = true;
                let _ = file.set_len(before).and_then(|()| file.sync_data());
                Err(fail(e))
            }
        }
    }
}

/// The temporary file a writer with process id `pid` uses for `path`: `registry.json` writes
/// `registry.tmp.<pid>` first.
fn temporary(path: &Path, pid: u32) -> PathBuf {
    path.with_extension(format!("tmp.{pid}"))
}

/// Removes the [`temporary`] files beside the snapshot: a writer that crashed between creating
/// and renaming one left it (the snapshot itself is whole either way).
pub(super) fn remove_stale_temporaries(path: &Path) {
    let Some(name) = path.file_stem().and_then(|n| n.to_str()) else { return };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let prefix = format!("{name}.tmp.");
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else { continue };
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stale = e.path();
        let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir(&stale)
        } else {
            std::fs::remove_file(&stale)
        };
        match removed {
            Ok(()) => tracing::info!(file = %stale.display(), "stale snapshot temporary removed"),
            Err(e) => {
                tracing::warn!(file = %stale.display(), "cannot remove stale snapshot temporary: {e}")
            }
        }
    }
}

/// Reads the snapshot, checking every entry as the API checks a registration; returns the last
/// log batch it holds and its size in bytes (0 and 0 when there is no file).
pub(super) fn load_snapshot(path: &Path, st: &mut State) -> Result<(u64, u64), StartError> {
    let failed = |reason: String| StartError::Snapshot { path: path.to_owned(), reason };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(failed(format!("cannot read: {e}"))),
    };
    let file: SnapshotFile =
        serde_json::from_str(&text).map_err(|e| failed(format!("invalid: {e}")))?;
    let now = Instant::now();
    for (i, r) in file.registrations.into_iter().enumerate() {
        let what = format!("registrations[{i}] (`{}` in `{}`)", r.name, r.cluster);
        let bad = |why: String| failed(format!("{what}: {why}"));
        let (key, entry) = restore(r, now).map_err(bad)?;
        if st.leases.contains_key(&entry.lease) {
            return Err(bad(format!("lease `{}` is used twice", entry.lease)));
        }
        if st.regs.contains_key(&key) {
            return Err(bad("the member is registered twice".to_owned()));
        }
        insert(st, key, entry);
    }
    Ok((file.seq, text.len() as u64))
}

/// What replaying the log found.
#[derive(Debug, Default)]
pub(super) struct Replay {
    /// The last batch in the log (0: none).
    pub(super) seq: u64,
    /// The log's bytes up to its torn end, if any.
    pub(super) len: u64,
    pub(super) replayed: usize,
    /// Batches the snapshot already holds (a crash between a snapshot and emptying the log).
    pub(super) skipped: usize,
    /// A torn last record: its offset and length.
    pub(super) torn: Option<(u64, u64)>,
}

/// Replays the log `path` (if it exists) over the snapshot holding batches up to
/// `snapshot_seq`, checking every registration as the API does.
pub(super) fn replay_log(
    path: &Path,
    snapshot_seq: u64,
    st: &mut State,
) -> Result<Replay, StartError> {
    let failed = |offset: u64, reason: String| StartError::Log {
        path: path.to_owned(),
        offset,
        reason: format!("record at byte offset {offset}: {reason}"),
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Replay::default()),
        Err(e) => {
            let reason = format!("cannot read: {e}");
            return Err(StartError::Log { path: path.to_owned(), offset: 0, reason });
        }
    };
    let read = journal::read(&bytes).map_err(|c| failed(c.offset, c.reason))?;
    let mut replay = Replay {
        len: read.torn.map_or(bytes.len() as u64, |(offset, _)| offset),
        torn: read.torn,
        ..Replay::default()
    };
    let now = Instant::now();
    for record in read.records {
        replay.seq = record.seq;
        if record.seq <= snapshot_seq {
            replay.skipped += 1;
            continue;
        }
        replay.replayed += 1;
        for (i, change) in record.changes.into_iter().enumerate() {
            match change {
                Change::Put(r) => {
                    let what = format!(
                        "batch {}, change {i} (`{}` in `{}`)",
                        record.seq, r.name, r.cluster
                    );
                    let bad = |why: String| failed(record.offset, format!("{what}: {why}"));
                    let (key, entry) = restore(r, now).map_err(bad)?;
                    remove(st, &key);
                    if st.leases.contains_key(&entry.lease) {
                        return Err(bad(format!("lease `{}` is used twice", entry.lease)));
                    }
                    insert(st, key, entry);
                }
                Change::Del { cluster, name } => {
                    remove(st, &(cluster, name));
                }
            }
        }
    }
    Ok(replay)
}

/// The snapshot's text, holding batches up to `seq`: JSON, one registration per line.
pub(super) fn snapshot_text(st: &State, seq: u64) -> String {
    let mut text = String::with_capacity(64 + st.regs.len() * 160);
    text.push_str(&format!("{{\"seq\": {seq}, \"registrations\": ["));
    for (i, ((cluster, _), e)) in st.regs.iter().enumerate() {
        text.push_str(if i == 0 { "\n  " } else { ",\n  " });
        // Borrowed: no copy of the strings for each entry of each write. Plain strings and
        // numbers into a String: serialising cannot fail.
        if let Ok(line) = serde_json::to_string(&saved(cluster, e)) {
            text.push_str(&line);
        }
    }
    text.push_str("\n]}\n");
    text
}

/// Durable and atomic: a temporary file of this process, synced, renamed over the snapshot,
/// and the directory synced, so a crash leaves the old snapshot or the new one, whole.
fn save_snapshot(path: &Path, text: &str) -> Result<(), String> {
    let tmp = temporary(path, std::process::id());
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_parent(path)
    };
    write().map_err(|e| {
        // A temporary left by a failed write (the rename failed) goes now, not at next start.
        let _ = std::fs::remove_file(&tmp);
        format!("naming snapshot {}: cannot write: {e}", path.display())
    })
}

/// Empties the log (if there is one) and syncs it.
fn empty_log(log: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(log) {
        Ok(f) => {
            f.set_len(0)?;
            f.sync_all()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Syncs the directory holding `path` (a rename or a new file in it made durable).
fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => std::fs::File::open(".")?.sync_all(),
    }
}
