//! The embedded registry's append-only log (`FILE.log` beside the snapshot `FILE`): its record
//! format, how one is encoded, and how a log is read back at start.
//!
//! One line per committed batch: `CRC SP JSON LF`, where `JSON` is
//! `{"seq":N,"changes":[{"put":{...}},{"del":{"cluster":..,"name":..}}]}` (a `put` is a
//! snapshot entry) and `CRC` is the CRC-32 (IEEE) of the JSON's bytes in 8 lower-case hex
//! digits. A batch is written with one `write` and made durable with one `fdatasync` before any
//! of its callers is answered, so a crash can only damage the last line, the one being written:
//! a last line that is cut short or fails its checksum is a torn write that nobody was told
//! about, and is ignored (and reported). A damaged line with anything after it cannot come from
//! a crash (its batch was synced before the next one was written) and stops the start, naming
//! the file and the byte offset, rather than silently dropping what follows it.
//!
//! Batch numbers (`seq`) grow by one per batch; the snapshot records the last one it holds, so
//! that lines a snapshot already folded in (a crash between writing the snapshot and emptying
//! the log) are skipped when the log is replayed over it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A registration as the snapshot and the log store it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SavedRegistration {
    pub cluster: String,
    pub name: String,
    pub address: String,
    pub weight: u32,
    pub group: Option<String>,
    pub ttl_ms: u64,
    pub lease: String,
    /// The policy the registration declared for its cluster (`[naming]
    /// allow_registered_clusters`), as given; absent for a configured cluster and in files
    /// written before declared policies.
    #[serde(default)]
    pub policy: Option<serde_json::Value>,
}

/// [`SavedRegistration`] borrowed from memory, for writing.
#[derive(Serialize)]
pub(crate) struct SavedRef<'a> {
    pub cluster: &'a str,
    pub name: &'a str,
    pub address: &'a str,
    pub weight: u32,
    pub group: Option<&'a str>,
    pub ttl_ms: u64,
    pub lease: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<&'a serde_json::Value>,
}

/// One change in a log line.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum Change {
    /// The member is registered (replacing any registration it had).
    Put(SavedRegistration),
    /// The member is gone (deregistered, or its lease lapsed).
    Del { cluster: String, name: String },
}

/// [`Change`] borrowed, for writing.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum ChangeRef<'a> {
    Put(SavedRef<'a>),
    Del { cluster: &'a str, name: &'a str },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    seq: u64,
    changes: Vec<Change>,
}

/// The log beside the snapshot `snapshot`: `registry.json` logs to `registry.json.log`.
pub(crate) fn log_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

/// A put's JSON, to go into a line with [`line`].
pub(crate) fn put(saved: SavedRef<'_>) -> String {
    // Plain strings and numbers into a String: serialising cannot fail.
    serde_json::to_string(&ChangeRef::Put(saved)).unwrap_or_default()
}

/// A deletion's JSON, to go into a line with [`line`].
pub(crate) fn del(cluster: &str, name: &str) -> String {
    serde_json::to_string(&ChangeRef::Del { cluster, name }).unwrap_or_default()
}

/// The line of batch `seq` with the changes `changes` (each from [`put`] or [`del`]), newline
/// included.
pub(crate) fn line(seq: u64, changes: &[String]) -> Vec<u8> {
    let mut json = String::with_capacity(32 + changes.iter().map(|c| c.len() + 1).sum::<usize>());
    json.push_str("{\"seq\":");
    json.push_str(&seq.to_string());
    json.push_str(",\"changes\":[");
    for (i, c) in changes.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str(c);
    }
    json.push_str("]}");
    let mut out = Vec::with_capacity(json.len() + 10);
    out.extend_from_slice(format!("{:08x} ", crc32(json.as_bytes())).as_bytes());
    out.extend_from_slice(json.as_bytes());
    out.push(b'\n');
    out
}

/// One line read back.
#[derive(Debug)]
pub(crate) struct Record {
    /// Where the line starts in the file.
    pub offset: u64,
    pub seq: u64,
    pub changes: Vec<Change>,
}

/// A log read back: its whole records, and the torn last one if any.
#[derive(Debug, Default)]
pub(crate) struct Read {
    pub records: Vec<Record>,
    /// A last line cut short or failing its checksum: (its offset, its length in bytes).
    pub torn: Option<(u64, u64)>,
}

/// Why a log cannot be replayed: the byte offset of the bad line and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Corrupt {
    pub offset: u64,
    pub reason: String,
}

/// Reads the log's text `bytes` (see the module's comment for what is torn and what is corrupt).
pub(crate) fn read(bytes: &[u8]) -> Result<Read, Corrupt> {
    let mut out = Read::default();
    let mut pos = 0usize;
    let mut last_seq: Option<u64> = None;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            // No end of line: the last write stopped short.
            out.torn = Some((pos as u64, rest.len() as u64));
            break;
        };
        let text = &rest[..nl];
        let last = pos + nl + 1 == bytes.len();
        let json = match checked(text) {
            Ok(json) => json,
            Err(_) if last => {
                out.torn = Some((pos as u64, (nl + 1) as u64));
                break;
            }
            Err(why) => {
                return Err(Corrupt {
                    offset: pos as u64,
                    reason: format!(
                        "{why}, and {} more bytes follow it (a crash damages only the last \
                         record)",
                        bytes.len() - pos - nl - 1
                    ),
                });
            }
        };
        // The checksum matched: the line was written whole, so a bad one is corrupt even last.
        let bad = |reason: String| Corrupt { offset: pos as u64, reason };
        let line: Line =
            serde_json::from_slice(json).map_err(|e| bad(format!("not a log record: {e}")))?;
        if let Some(prev) = last_seq.filter(|&p| line.seq <= p) {
            return Err(bad(format!("batch {} follows batch {prev}", line.seq)));
        }
        last_seq = Some(line.seq);
        out.records.push(Record { offset: pos as u64, seq: line.seq, changes: line.changes });
        pos += nl + 1;
    }
    Ok(out)
}

/// The JSON of a line whose checksum matches.
fn checked(text: &[u8]) -> Result<&[u8], &'static str> {
    if text.len() < 10 || text[8] != b' ' {
        return Err("not `CHECKSUM JSON`");
    }
    let want = std::str::from_utf8(&text[..8])
        .ok()
        .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("not `CHECKSUM JSON`")?;
    let json = &text[9..];
    if crc32(json) == want { Ok(json) } else { Err("checksum mismatch") }
}

/// CRC-32 (IEEE 802.3, the one of zip and PNG), table-driven.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut c = !0u32;
    for &b in bytes {
        c = TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(name: &str) -> String {
        put(SavedRef {
            cluster: "c",
            name,
            address: "127.0.0.1:80",
            weight: 100,
            group: None,
            ttl_ms: 10_000,
            lease: "7".into(),
            policy: None,
        })
    }

    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn lines_read_back_in_order() {
        let mut log = line(1, &[saved("a"), saved("b")]);
        log.extend(line(2, &[del("c", "a")]));
        let read = read(&log).unwrap();
        assert!(read.torn.is_none());
        assert_eq!(read.records.len(), 2);
        assert_eq!(read.records[1].offset, line(1, &[saved("a"), saved("b")]).len() as u64);
        assert!(matches!(&read.records[0].changes[1], Change::Put(r) if r.name == "b"));
        assert!(matches!(&read.records[1].changes[0], Change::Del { name, .. } if name == "a"));
    }

    #[test]
    fn a_damaged_last_line_is_torn_and_one_in_the_middle_is_corrupt() {
        let one = line(1, &[saved("a")]);
        let two = line(2, &[saved("b")]);
        // Cut short, at every length.
        for cut in 1..two.len() {
            let mut log = one.clone();
            log.extend_from_slice(&two[..cut]);
            let read = read(&log).unwrap();
            assert_eq!(read.records.len(), 1, "cut {cut}");
            assert_eq!(read.torn, Some((one.len() as u64, cut as u64)), "cut {cut}");
        }
        // Whole length, a byte changed (writeback out of order), last: torn.
        let mut bad = two.clone();
        bad[20] ^= 0x20;
        let mut log = one.clone();
        log.extend_from_slice(&bad);
        let read = read(&log).unwrap();
        assert_eq!(read.torn, Some((one.len() as u64, bad.len() as u64)));
        // The same with a record after it: corrupt, naming the offset.
        log.extend(line(3, &[saved("c")]));
        let e = super::read(&log).unwrap_err();
        assert_eq!(e.offset, one.len() as u64);
        assert!(e.reason.contains("checksum mismatch"), "{}", e.reason);
        // Zeros where a line should be (a file extended but not written), last: torn.
        let mut log = one.clone();
        log.extend_from_slice(&[0; 300]);
        assert_eq!(super::read(&log).unwrap().torn, Some((one.len() as u64, 300)));
    }

    #[test]
    fn a_whole_line_that_is_not_a_record_is_corrupt_even_last() {
        let json = br#"{"seq":1,"changes":[{"put":{"cluster":"c"}}]}"#;
        let mut log = format!("{:08x} ", crc32(json)).into_bytes();
        log.extend_from_slice(json);
        log.push(b'\n');
        let e = read(&log).unwrap_err();
        assert_eq!(e.offset, 0);
        assert!(e.reason.contains("not a log record"), "{}", e.reason);
        // Batches out of order.
        let mut log = line(2, &[saved("a")]);
        log.extend(line(2, &[saved("b")]));
        assert!(read(&log).unwrap_err().reason.contains("batch 2 follows batch 2"));
    }
}
