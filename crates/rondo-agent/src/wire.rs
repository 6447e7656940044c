//! The heartbeat datagram and the first-contact line, both authenticated with HMAC-SHA256 over
//! a shared key.
//!
//! A heartbeat (big-endian, version 2):
//!
//! ```text
//! "RNDA" | version u8 = 2 | epoch u64 | cluster_len u8 | cluster | member_len u8 | member
//!        | seq u64 | cpu_used f32 (0..=1) | mem_free u64 | sessions u32 | HMAC-SHA256 (32 bytes)
//! ```
//!
//! The MAC covers every byte before it. Decoding checks, in order: magic, version, length
//! (truncated or trailing bytes), MAC (constant time), then the fields (UTF-8 names, CPU range),
//! so nothing from an unauthenticated datagram is interpreted beyond its lengths.
//!
//! First contact (TCP): the agent sends `HELLO <cluster> <member> <hex tag>\n`, the tag being the
//! HMAC of `HELLO <cluster> <member>`; the router answers
//! `OK <interval_ms> <next_seq> <epoch> <hex tag>\n` (the tag is the HMAC of
//! `OK <cluster> <member> <interval_ms> <next_seq> <epoch>`), or `ERR bad key\n`,
//! `ERR unknown member <cluster>/<member>\n`, `ERR malformed hello\n`.
//!
//! The epoch is a random number the router draws when it starts. The agent copies it into every
//! heartbeat and the router refuses heartbeats of another epoch: a datagram captured before a
//! router restart cannot be replayed against the new process (whose last sequence numbers are
//! gone). A router answers such a heartbeat with [`STALE_EPOCH`] so the agent says hello again.

use ring::hmac;

/// The first four bytes of every heartbeat.
pub const MAGIC: &[u8; 4] = b"RNDA";
/// The heartbeat format this crate writes and reads (2: with the router's epoch).
pub const VERSION: u8 = 2;
/// The datagram a router sends back for an authenticated heartbeat of another epoch (it
/// restarted): "say hello again". Unauthenticated, so an agent only ever answers it with a hello,
/// at most once per [`STALE_EPOCH`] pause (see `agent.rs`).
pub const STALE_EPOCH: &[u8; 4] = b"RNDE";
/// Length of the MAC at the end of a heartbeat.
pub const MAC_LEN: usize = 32;
/// Longest cluster or member name a heartbeat carries.
pub const MAX_NAME: usize = 255;
/// Bytes of a heartbeat besides the two names.
const FIXED_LEN: usize = 4 + 1 + 8 + 1 + 1 + 8 + 4 + 8 + 4 + MAC_LEN;
/// Where the cluster name's length byte is (after magic, version and epoch).
const NAMES_AT: usize = 4 + 1 + 8;
/// Largest possible heartbeat (receive buffers use this).
pub const MAX_DATAGRAM: usize = FIXED_LEN + 2 * MAX_NAME;

/// The shared secret of agents and routers.
#[derive(Clone)]
pub struct Key(hmac::Key);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// A key from the secret's bytes (any length; HMAC hashes long keys).
    pub fn new(secret: &[u8]) -> Self {
        Key(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    fn sign(&self, data: &[u8]) -> hmac::Tag {
        hmac::sign(&self.0, data)
    }

    /// Constant-time check of `tag` over `data`.
    fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        hmac::verify(&self.0, data, tag).is_ok()
    }
}

/// One heartbeat's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    /// The epoch of the router this heartbeat is for (from its `OK`).
    pub epoch: u64,
    /// The member's cluster.
    pub cluster: String,
    /// The member.
    pub member: String,
    /// Sequence number, increasing with every heartbeat of one agent.
    pub seq: u64,
    /// CPU in use, 0.0..=1.0.
    pub cpu_used: f32,
    /// Free (available) memory, bytes.
    pub mem_free: u64,
    /// Sessions the member counts itself.
    pub sessions: u32,
}

/// Why a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not a heartbeat at all.
    #[error("bad magic, expected \"RNDA\"")]
    BadMagic,
    /// A format this router does not read.
    #[error("unsupported version {0}, expected {VERSION}")]
    UnsupportedVersion(u8),
    /// Shorter than its own lengths say.
    #[error("truncated: {got} bytes, expected {want}")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// Longer than its own lengths say.
    #[error("trailing bytes: {got} bytes, expected {want}")]
    Trailing {
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The MAC does not match: wrong key or altered content.
    #[error("bad mac")]
    BadMac,
    /// Authenticated but not valid (a name that is not UTF-8, a CPU outside 0..=1).
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// A name too long to encode.
    #[error("{0} name longer than {MAX_NAME} bytes")]
    NameTooLong(&'static str),
}

/// Encodes and signs `hb`.
pub fn encode(hb: &Heartbeat, key: &Key) -> Result<Vec<u8>, WireError> {
    if hb.cluster.len() > MAX_NAME {
        return Err(WireError::NameTooLong("cluster"));
    }
    if hb.member.len() > MAX_NAME {
        return Err(WireError::NameTooLong("member"));
    }
    let mut out = Vec::with_capacity(FIXED_LEN + hb.cluster.len() + hb.member.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&hb.epoch.to_be_bytes());
    for name in [&hb.cluster, &hb.member] {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
    }
    out.extend_from_slice(&hb.seq.to_be_bytes());
    out.extend_from_slice(&hb.cpu_used.to_be_bytes());
    out.extend_from_slice(&hb.mem_free.to_be_bytes());
    out.extend_from_slice(&hb.sessions.to_be_bytes());
    let tag = key.sign(&out);
    out.extend_from_slice(tag.as_ref());
    Ok(out)
}

/// Decodes and authenticates a datagram. Never panics, whatever the bytes.
pub fn decode(buf: &[u8], key: &Key) -> Result<Heartbeat, WireError> {
    let truncated = |want: usize| WireError::Truncated { got: buf.len(), want };
    if buf.len() < MAGIC.len() {
        return Err(if MAGIC.starts_with(buf) {
            truncated(FIXED_LEN)
        } else {
            WireError::BadMagic
        });
    }
    if &buf[..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let Some(&version) = buf.get(4) else {
        return Err(truncated(FIXED_LEN));
    };
    if version != VERSION {
        return Err(WireError::UnsupportedVersion(version));
    }
    // The two length-prefixed names, after the epoch.
    let mut at = NAMES_AT;
    let mut names = [0..0, 0..0];
    for name in &mut names {
        let Some(&len) = buf.get(at) else {
            return Err(truncated(FIXED_LEN));
        };
        let len = usize::from(len);
        *name = at + 1..at + 1 + len;
        at += 1 + len;
    }
    let want = at + 8 + 4 + 8 + 4 + MAC_LEN;
    if buf.len() < want {
        return Err(truncated(want));
    }
    if buf.len() > want {
        return Err(WireError::Trailing { got: buf.len(), want });
    }
    let (body, mac) = buf.split_at(want - MAC_LEN);
    if !key.verify(body, mac) {
        return Err(WireError::BadMac);
    }
    let name = |r: std::ops::Range<usize>, what| {
        std::str::from_utf8(&buf[r]).map(str::to_owned).map_err(|_| WireError::Malformed(what))
    };
    let cluster = name(names[0].clone(), "cluster name")?;
    let member = name(names[1].clone(), "member name")?;
    let epoch = u64::from_be_bytes(body[5..NAMES_AT].try_into().unwrap_or_default());
    let fixed = &body[at..];
    let seq = u64::from_be_bytes(fixed[0..8].try_into().unwrap_or_default());
    let cpu_used = f32::from_be_bytes(fixed[8..12].try_into().unwrap_or_default());
    let mem_free = u64::from_be_bytes(fixed[12..20].try_into().unwrap_or_default());
    let sessions = u32::from_be_bytes(fixed[20..24].try_into().unwrap_or_default());
    if !(0.0..=1.0).contains(&cpu_used) {
        return Err(WireError::Malformed("cpu_used"));
    }
    Ok(Heartbeat { epoch, cluster, member, seq, cpu_used, mem_free, sessions })
}

/// The cluster and member a datagram claims to be from, read from its lengths alone (nothing
/// authenticated: for logs, escaped there). `None` when the datagram is too short to say.
pub fn claimed_names(buf: &[u8]) -> Option<(String, String)> {
    if buf.get(..4)? != MAGIC || *buf.get(4)? != VERSION {
        return None;
    }
    let mut at = NAMES_AT;
    let mut names = Vec::with_capacity(2);
    for _ in 0..2 {
        let len = usize::from(*buf.get(at)?);
        let name = buf.get(at + 1..at + 1 + len)?;
        names.push(String::from_utf8_lossy(name).into_owned());
        at += 1 + len;
    }
    let member = names.pop()?;
    let cluster = names.pop()?;
    Some((cluster, member))
}

/// The text a hello's tag covers.
fn hello_text(cluster: &str, member: &str) -> String {
    format!("HELLO {cluster} {member}")
}

/// The first-contact line an agent sends (with its trailing newline).
pub fn hello_line(cluster: &str, member: &str, key: &Key) -> String {
    let text = hello_text(cluster, member);
    let tag = key.sign(text.as_bytes());
    format!("{text} {}\n", hex(tag.as_ref()))
}

/// Why a hello line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// Not `HELLO <cluster> <member> <hex tag>`.
    #[error("malformed hello")]
    Malformed,
    /// The tag does not match.
    #[error("bad key")]
    BadKey,
}

/// Parses and authenticates a hello line (without its newline); returns cluster and member.
pub fn parse_hello(line: &str, key: &Key) -> Result<(String, String), HelloError> {
    let mut parts = line.trim_end_matches(['\r', '\n']).split(' ');
    let (Some("HELLO"), Some(cluster), Some(member), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HelloError::Malformed);
    };
    if cluster.is_empty() || member.is_empty() {
        return Err(HelloError::Malformed);
    }
    let tag = unhex(tag).ok_or(HelloError::Malformed)?;
    if !key.verify(hello_text(cluster, member).as_bytes(), &tag) {
        return Err(HelloError::BadKey);
    }
    Ok((cluster.to_owned(), member.to_owned()))
}

/// The cluster and member a hello line claims, whatever its tag (for logs; escape before
/// printing). `None` when the line is not shaped like a hello.
pub fn claimed_hello(line: &str) -> Option<(String, String)> {
    let mut parts = line.trim_end_matches(['\r', '\n']).split(' ');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("HELLO"), Some(c), Some(m)) if !c.is_empty() && !m.is_empty() => {
            Some((c.to_owned(), m.to_owned()))
        }
        _ => None,
    }
}

/// What a router's `OK` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloOk {
    /// The heartbeat interval the router wants, milliseconds (at least 1).
    pub interval_ms: u64,
    /// The next sequence number the router accepts from this member.
    pub next_seq: u64,
    /// The router's epoch, to put in every heartbeat.
    pub epoch: u64,
}

fn ok_text(cluster: &str, member: &str, ok: &HelloOk) -> String {
    format!("OK {cluster} {member} {} {} {}", ok.interval_ms, ok.next_seq, ok.epoch)
}

/// The router's `OK` line for `cluster`/`member` (with its trailing newline), signed so that
/// nobody without the key can hand an agent another epoch.
pub fn ok_line(cluster: &str, member: &str, ok: &HelloOk, key: &Key) -> String {
    let tag = key.sign(ok_text(cluster, member, ok).as_bytes());
    format!("OK {} {} {} {}\n", ok.interval_ms, ok.next_seq, ok.epoch, hex(tag.as_ref()))
}

/// Parses and authenticates a router's answer to the hello of `cluster`/`member`: `Ok` for a
/// valid `OK` line, else the reason (the router's own `ERR ...` text, or what is wrong).
pub fn parse_ok(line: &str, cluster: &str, member: &str, key: &Key) -> Result<HelloOk, String> {
    let line = line.trim_end_matches(['\r', '\n']);
    if let Some(err) = line.strip_prefix("ERR ") {
        return Err(err.to_owned());
    }
    let mut parts = line.split(' ');
    let (Some("OK"), Some(ms), Some(next), Some(epoch), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("unexpected answer {:?}", line.chars().take(80).collect::<String>()));
    };
    let (Ok(interval_ms), Ok(next_seq), Ok(epoch)) = (ms.parse(), next.parse(), epoch.parse())
    else {
        return Err(format!("unexpected answer {:?}", line.chars().take(80).collect::<String>()));
    };
    let ok = HelloOk { interval_ms, next_seq, epoch };
    let tag = unhex(tag).ok_or_else(|| "the answer's tag is not hex".to_owned())?;
    if !key.verify(ok_text(cluster, member, &ok).as_bytes(), &tag) {
        return Err("the answer's tag does not match the key".to_owned());
    }
    if interval_ms == 0 {
        return Err("the router asks for a 0 ms interval".to_owned());
    }
    Ok(ok)
}

/// Every parser of this module on arbitrary bytes: the fuzz target `agent_wire` (`fuzz/`) and
/// the tests replaying its corpus call this. Panics only when an invariant breaks: a datagram
/// that decodes encodes back to the same bytes; the same bytes with a correct MAC (a fuzzer
/// cannot forge one) are never refused for their MAC; a hello signed for the names a line
/// claims parses back to those names.
pub fn fuzz_input(data: &[u8]) {
    let key = Key::new(b"fuzz-key");
    if let Ok(hb) = decode(data, &key) {
        assert!(encode(&hb, &key).is_ok_and(|d| d == data), "decode/encode round trip");
    }
    let _ = claimed_names(data);
    // The same bytes, signed, to reach the checks behind the MAC.
    if data.len() >= MAC_LEN {
        let mut signed = data.to_vec();
        let n = signed.len() - MAC_LEN;
        let tag = key.sign(&signed[..n]);
        signed[n..].copy_from_slice(tag.as_ref());
        match decode(&signed, &key) {
            Ok(hb) => {
                assert!(encode(&hb, &key).is_ok_and(|d| d == signed), "signed round trip");
                assert_eq!(claimed_names(&signed), Some((hb.cluster, hb.member)));
            }
            Err(e) => assert_ne!(e, WireError::BadMac, "a correctly signed datagram"),
        }
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = parse_hello(text, &key);
    let _ = parse_ok(text, "c", "m", &key);
    if let Some((cluster, member)) = claimed_hello(text) {
        let line = hello_line(&cluster, &member, &key);
        assert_eq!(parse_hello(&line, &key), Ok((cluster.clone(), member.clone())), "{line:?}");
        let ok = HelloOk { interval_ms: 1 + data.len() as u64, next_seq: 7, epoch: 9 };
        let line = ok_line(&cluster, &member, &ok, &key);
        assert_eq!(parse_ok(&line, &cluster, &member, &key), Ok(ok), "{line:?}");
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hb() -> Heartbeat {
        Heartbeat {
            epoch: 0x0102_0304_0506_0708,
            cluster: "web".into(),
            member: "m1".into(),
            seq: 42,
            cpu_used: 0.25,
            mem_free: 512 << 20,
            sessions: 7,
        }
    }

    fn key() -> Key {
        Key::new(b"secret")
    }

    /// Re-signs a modified datagram so only the intended field is wrong.
    fn resign(mut d: Vec<u8>, key: &Key) -> Vec<u8> {
        let n = d.len() - MAC_LEN;
        let tag = key.sign(&d[..n]);
        d[n..].copy_from_slice(tag.as_ref());
        d
    }

    #[test]
    fn round_trip() {
        let d = encode(&hb(), &key()).unwrap();
        assert_eq!(d.len(), FIXED_LEN + 3 + 2);
        assert_eq!(&d[..4], b"RNDA");
        assert_eq!(d[4], 2);
        assert_eq!(d[5..13], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(claimed_names(&d), Some(("web".into(), "m1".into())));
        assert_eq!(decode(&d, &key()), Ok(hb()));
    }

    #[test]
    fn every_corruption_has_its_error() {
        let k = key();
        let d = encode(&hb(), &k).unwrap();
        let mut bad = d.clone();
        bad[0] = b'X';
        assert_eq!(decode(&bad, &k), Err(WireError::BadMagic));
        assert_eq!(decode(b"HTTP", &k), Err(WireError::BadMagic));
        let mut bad = d.clone();
        bad[4] = 1;
        assert_eq!(decode(&bad, &k), Err(WireError::UnsupportedVersion(1)));
        // Another epoch is another MAC: the epoch cannot be changed without the key.
        let mut other_epoch = d.clone();
        other_epoch[12] ^= 1;
        assert_eq!(decode(&other_epoch, &k), Err(WireError::BadMac));
        for n in 0..d.len() {
            assert!(
                matches!(decode(&d[..n], &k), Err(WireError::Truncated { .. })),
                "prefix of {n} bytes: {:?}",
                decode(&d[..n], &k)
            );
        }
        let mut long = d.clone();
        long.push(0);
        assert_eq!(decode(&long, &k), Err(WireError::Trailing { got: d.len() + 1, want: d.len() }));
        assert_eq!(decode(&d, &Key::new(b"other")), Err(WireError::BadMac));
        for i in 5..d.len() {
            let mut flipped = d.clone();
            flipped[i] ^= 0x01;
            let r = decode(&flipped, &k);
            assert!(r.is_err(), "flipping byte {i} went unnoticed");
        }
        let mut seq_changed = d.clone();
        seq_changed[NAMES_AT + 4 + 3] ^= 1;
        assert_eq!(decode(&seq_changed, &k), Err(WireError::BadMac));
        let cpu = Heartbeat { cpu_used: 1.5, ..hb() };
        let d2 = resign(
            {
                let mut v = encode(&hb(), &k).unwrap();
                let at = NAMES_AT + 4 + 3 + 8;
                v[at..at + 4].copy_from_slice(&cpu.cpu_used.to_be_bytes());
                v
            },
            &k,
        );
        assert_eq!(decode(&d2, &k), Err(WireError::Malformed("cpu_used")));
        let mut bad_utf8 = d.clone();
        bad_utf8[NAMES_AT + 1] = 0xff;
        assert_eq!(decode(&resign(bad_utf8, &k), &k), Err(WireError::Malformed("cluster name")));
        let long_name = Heartbeat { member: "x".repeat(256), ..hb() };
        assert_eq!(encode(&long_name, &k), Err(WireError::NameTooLong("member")));
        let max = Heartbeat { cluster: "c".repeat(255), member: "m".repeat(255), ..hb() };
        let d = encode(&max, &k).unwrap();
        assert_eq!(d.len(), MAX_DATAGRAM);
        assert_eq!(decode(&d, &k), Ok(max));
    }

    #[test]
    fn hello_round_trip_and_refusals() {
        let k = key();
        let line = hello_line("web", "m1", &k);
        assert!(line.starts_with("HELLO web m1 ") && line.ends_with('\n'));
        assert_eq!(parse_hello(&line, &k), Ok(("web".into(), "m1".into())));
        assert_eq!(parse_hello(&line, &Key::new(b"x")), Err(HelloError::BadKey));
        let forged = line.replace("m1", "m2");
        assert_eq!(parse_hello(&forged, &k), Err(HelloError::BadKey));
        for bad in ["", "HELLO", "HELLO web m1", "HELLO web m1 zz", "HI web m1 00", "HELLO  m1 00"]
        {
            assert_eq!(parse_hello(bad, &k), Err(HelloError::Malformed), "{bad:?}");
        }
        assert_eq!(parse_hello("HELLO web m1 0é", &k), Err(HelloError::Malformed));
        assert_eq!(claimed_hello(&forged), Some(("web".into(), "m2".into())));
        assert_eq!(claimed_hello("GET / HTTP/1.1"), None);
    }

    #[test]
    fn ok_round_trip_and_refusals() {
        let k = key();
        let ok = HelloOk { interval_ms: 200, next_seq: 17, epoch: 99 };
        let line = ok_line("web", "m1", &ok, &k);
        assert!(line.starts_with("OK 200 17 99 ") && line.ends_with('\n'), "{line}");
        assert_eq!(parse_ok(&line, "web", "m1", &k), Ok(ok));
        // Signed for another member, with another key, or changed: refused.
        assert!(parse_ok(&line, "web", "m2", &k).is_err());
        assert!(parse_ok(&line, "web", "m1", &Key::new(b"x")).is_err());
        let changed = line.replacen("OK 200 17 99", "OK 200 17 98", 1);
        assert_eq!(
            parse_ok(&changed, "web", "m1", &k),
            Err("the answer's tag does not match the key".into())
        );
        assert_eq!(parse_ok("ERR bad key\n", "web", "m1", &k), Err("bad key".into()));
        // The version 1 answer has no epoch: an old router cannot be used by this agent.
        assert!(parse_ok("OK 200 17", "web", "m1", &k).is_err());
        let zero = ok_line("web", "m1", &HelloOk { interval_ms: 0, ..ok }, &k);
        assert!(parse_ok(&zero, "web", "m1", &k).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode(&bytes, &key());
        }

        #[test]
        fn arbitrary_bytes_after_a_valid_header_never_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..600)
        ) {
            let mut d = b"RNDA\x02".to_vec();
            d.extend_from_slice(&tail);
            let _ = decode(&d, &key());
            let _ = claimed_names(&d);
        }

        #[test]
        fn arbitrary_hello_lines_never_panic(line in ".{0,200}") {
            let _ = parse_hello(&line, &key());
            let _ = claimed_hello(&line);
            let _ = parse_ok(&line, "web", "m1", &key());
        }

        #[test]
        fn round_trips(
            cluster in "[a-z]{1,40}", member in "[a-z0-9-]{1,40}", seq in any::<u64>(),
            cpu in 0.0f32..=1.0, mem in any::<u64>(), sessions in any::<u32>(), epoch in any::<u64>()
        ) {
            let h = Heartbeat { epoch, cluster, member, seq, cpu_used: cpu, mem_free: mem, sessions };
            prop_assert_eq!(decode(&encode(&h, &key()).unwrap(), &key()), Ok(h));
        }
    }
}
