//! The byte layout of what the stores keep: a message, its metadata and its tries. Plain
//! length-prefixed fields (little-endian `u32` lengths, `u64` numbers) behind a format byte, so
//! a record written by this version is read back exactly and a foreign or damaged one is an
//! error, never a guess.

use std::net::IpAddr;

use bytes::Bytes;
use rondo_runtime::queues::TryRecord;

use crate::store::Message;

const FORMAT: u8 = 1;
/// A message record with a multicast branch after its body (a message without one is written
/// in [`FORMAT`], as before branches existed).
const FORMAT_BRANCH: u8 = 2;

/// A record that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("damaged record: {0}")]
pub struct Damaged(pub &'static str);

struct W(Vec<u8>);

impl W {
    fn new() -> W {
        W(vec![FORMAT])
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

struct R<'a>(&'a [u8]);

impl<'a> R<'a> {
    fn new(b: &'a [u8]) -> Result<R<'a>, Damaged> {
        match b.split_first() {
            Some((&FORMAT, rest)) => Ok(R(rest)),
            Some(_) => Err(Damaged("unknown format byte")),
            None => Err(Damaged("empty")),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Damaged> {
        if self.0.len() < n {
            return Err(Damaged("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, Damaged> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, Damaged> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], Damaged> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, Damaged> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| Damaged("not UTF-8"))
    }
    fn end(&self) -> Result<(), Damaged> {
        if self.0.is_empty() { Ok(()) } else { Err(Damaged("trailing bytes")) }
    }
}

/// A message's bytes.
pub fn encode_message(m: &Message) -> Vec<u8> {
    let mut w = W::new();
    if m.branch.is_some() {
        w.0[0] = FORMAT_BRANCH;
    }
    w.bytes(m.listener.as_bytes());
    w.bytes(m.path.as_bytes());
    w.bytes(m.peer.map(|p| p.to_string()).unwrap_or_default().as_bytes());
    w.u32(m.headers.len() as u32);
    for (n, v) in &m.headers {
        w.bytes(n.as_bytes());
        w.bytes(v);
    }
    w.bytes(&m.body);
    if let Some(branch) = &m.branch {
        w.bytes(branch.as_bytes());
    }
    w.0
}

/// A message from its bytes.
pub fn decode_message(b: &[u8]) -> Result<Message, Damaged> {
    let with_branch = b.first() == Some(&FORMAT_BRANCH);
    let mut r = if with_branch { R(&b[1..]) } else { R::new(b)? };
    let listener = r.string()?;
    let path = r.string()?;
    let peer = r.string()?;
    let peer = if peer.is_empty() {
        None
    } else {
        Some(peer.parse::<IpAddr>().map_err(|_| Damaged("bad peer address"))?)
    };
    let n = r.u32()? as usize;
    let mut headers = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let name = r.string()?;
        let value = Bytes::copy_from_slice(r.bytes()?);
        headers.push((name, value));
    }
    let body = Bytes::copy_from_slice(r.bytes()?);
    let branch = if with_branch { Some(r.string()?) } else { None };
    r.end()?;
    Ok(Message { listener, path, headers, body, peer, branch })
}

/// What the store keeps in memory of every message: when it was accepted, its size and its
/// session key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRecord {
    /// Unix milliseconds.
    pub accepted_ms: u64,
    /// [`Message::size`].
    pub size: u64,
    /// The session key.
    pub session: Option<String>,
}

/// A metadata record's bytes.
pub fn encode_meta(m: &MetaRecord) -> Vec<u8> {
    let mut w = W::new();
    w.u64(m.accepted_ms);
    w.u64(m.size);
    match &m.session {
        None => w.u32(0),
        Some(s) => {
            w.u32(1);
            w.bytes(s.as_bytes());
        }
    }
    w.0
}

/// A metadata record from its bytes.
pub fn decode_meta(b: &[u8]) -> Result<MetaRecord, Damaged> {
    let mut r = R::new(b)?;
    let accepted_ms = r.u64()?;
    let size = r.u64()?;
    let session = match r.u32()? {
        0 => None,
        1 => Some(r.string()?),
        _ => return Err(Damaged("bad session flag")),
    };
    r.end()?;
    Ok(MetaRecord { accepted_ms, size, session })
}

/// A list of tries' bytes.
pub fn encode_tries(tries: &[TryRecord]) -> Vec<u8> {
    let mut w = W::new();
    w.u32(tries.len() as u32);
    for t in tries {
        w.u32(t.attempt);
        w.u64(t.at_ms);
        w.bytes(t.reason.as_bytes());
    }
    w.0
}

/// A list of tries from its bytes.
pub fn decode_tries(b: &[u8]) -> Result<Vec<TryRecord>, Damaged> {
    let mut r = R::new(b)?;
    let n = r.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let attempt = r.u32()?;
        let at_ms = r.u64()?;
        let reason = r.string()?;
        out.push(TryRecord { attempt, at_ms, reason });
    }
    r.end()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_exactly() {
        let m = Message {
            listener: "in".into(),
            path: "/queues/q?a=1".into(),
            headers: vec![("x-a".into(), Bytes::from_static(b"1")), ("k".into(), Bytes::new())],
            body: Bytes::from_static(b"hello"),
            peer: Some("127.0.0.1".parse().unwrap()),
            branch: None,
        };
        assert_eq!(decode_message(&encode_message(&m)).unwrap(), m);
        // A message without a branch keeps the first format, so older routers read it.
        assert_eq!(encode_message(&m)[0], FORMAT);
        let copy = Message { branch: Some("audit".into()), ..m.clone() };
        let b = encode_message(&copy);
        assert_eq!(b[0], FORMAT_BRANCH);
        assert_eq!(decode_message(&b).unwrap(), copy);
        for cut in 1..b.len() {
            assert!(decode_message(&b[..cut]).is_err(), "cut at {cut}");
        }
        let meta = MetaRecord { accepted_ms: 5, size: 9, session: Some("s".into()) };
        assert_eq!(decode_meta(&encode_meta(&meta)).unwrap(), meta);
        let tries = vec![TryRecord { attempt: 1, at_ms: 3, reason: "m1: answered 500".into() }];
        assert_eq!(decode_tries(&encode_tries(&tries)).unwrap(), tries);
    }

    #[test]
    fn damaged_records_are_errors() {
        let b = encode_message(&Message {
            listener: "in".into(),
            path: "/".into(),
            headers: vec![],
            body: Bytes::from_static(b"x"),
            peer: None,
            branch: None,
        });
        for cut in 0..b.len() {
            assert!(decode_message(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_message(&extra).is_err());
        let mut other = b;
        other[0] = 9;
        assert!(decode_message(&other).is_err());
    }
}
