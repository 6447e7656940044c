//! The server name (SNI) of a TLS ClientHello, read without terminating TLS: what `tcp`
//! listeners route on (`match = { sni = ... }`, like HAProxy's `req.ssl_sni`). [`parse`] looks at
//! the bytes a client sent first; the caller keeps them and sends them on to the member, which
//! does the handshake itself. Only a ClientHello in one TLS record is read (every common client
//! sends one); anything else is "no SNI".

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not enough bytes yet.
    Incomplete,
    /// A ClientHello naming this server (lower case).
    Sni(String),
    /// A ClientHello without a (usable) server name, or one this parser does not read.
    NoSni,
    /// Not a TLS ClientHello.
    NotTls,
}

/// The most bytes [`parse`] may need: a record header and the largest record.
pub const MAX_HELLO: usize = 5 + (1 << 14);

/// A forward-only reader over a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a `len_bytes`-byte length prefix.
    fn vec(&mut self, len_bytes: usize) -> Option<&'a [u8]> {
        let n = match len_bytes {
            1 => self.u8()?,
            _ => self.u16()?,
        };
        self.take(n)
    }
}

/// Reads the server name of the ClientHello at the start of `buf`.
pub fn parse(buf: &[u8]) -> Hello {
    // Record header: handshake (22), legacy version 3.x, length.
    if buf.first().is_some_and(|&b| b != 22) || buf.get(1).is_some_and(|&b| b != 3) {
        return Hello::NotTls;
    }
    if buf.len() < 5 {
        return Hello::Incomplete;
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len == 0 || len > 1 << 14 {
        return Hello::NotTls;
    }
    let Some(record) = buf.get(5..5 + len) else { return Hello::Incomplete };
    // Handshake header: ClientHello (1), 24-bit length.
    if record.len() < 4 || record[0] != 1 {
        return Hello::NotTls;
    }
    let hs_len =
        usize::from(record[1]) << 16 | usize::from(record[2]) << 8 | usize::from(record[3]);
    let Some(body) = record.get(4..4 + hs_len) else {
        // Spread over more records: not read here.
        return Hello::NoSni;
    };
    client_hello_sni(body).unwrap_or(Hello::NotTls)
}

/// The server name in a ClientHello body; `None` when it is malformed.
fn client_hello_sni(body: &[u8]) -> Option<Hello> {
    let mut c = Cursor(body);
    c.take(2 + 32)?; // legacy version, random
    c.vec(1)?; // session id
    c.vec(2)?; // cipher suites
    c.vec(1)?; // compression methods
    if c.0.is_empty() {
        return Some(Hello::NoSni); // no extensions at all
    }
    let mut exts = Cursor(c.vec(2)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec(2)?;
        if kind != 0 {
            continue;
        }
        let mut list = Cursor(Cursor(data).vec(2)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec(2)?;
            if name_type == 0 {
                let ok = !name.is_empty()
                    && name.iter().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(b));
                return Some(if ok {
                    Hello::Sni(String::from_utf8_lossy(name).to_ascii_lowercase())
                } else {
                    Hello::NoSni
                });
            }
        }
        return Some(Hello::NoSni);
    }
    Some(Hello::NoSni)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The first bytes a rustls client sends for `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn reads_the_name_of_a_real_client_hello_at_every_split() {
        let hello = client_hello("Api.Example.test");
        assert_eq!(parse(&hello), Hello::Sni("api.example.test".into()));
        for cut in 0..hello.len() {
            assert_eq!(parse(&hello[..cut]), Hello::Incomplete, "cut at {cut}");
        }
        // Extra bytes after the record change nothing.
        let mut more = hello.clone();
        more.extend_from_slice(b"trailing");
        assert_eq!(parse(&more), Hello::Sni("api.example.test".into()));
    }

    #[test]
    fn an_ip_address_sends_no_sni_and_other_protocols_are_not_tls() {
        assert_eq!(parse(&client_hello("127.0.0.1")), Hello::NoSni);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(b"\x16\x01"), Hello::NotTls);
        assert_eq!(parse(&[22, 3, 1, 0, 0]), Hello::NotTls);
    }

    #[test]
    fn no_prefix_of_a_mangled_hello_panics() {
        let hello = client_hello("a.test");
        for i in 5..hello.len() {
            for b in [0u8, 0xff, 1] {
                let mut m = hello.clone();
                m[i] = b;
                for cut in [i, i + 1, m.len()] {
                    let _ = parse(&m[..cut.min(m.len())]);
                }
            }
        }
    }
}
