//! Header field edits made per request: [`FieldOps`], the edits of one head in the form both
//! codecs apply (names whose fields go, fields appended), and the response's edits before the
//! member is known ([`Pending`]). A short value (an id, a span, a rendered template) is kept in
//! place ([`Value::Inline`]). The edits a chain knows when compiled are its table's instead
//! (`table.rs`).

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::MEMBER;

/// The longest value kept in place.
const INLINE: usize = 62;

/// A field value the chain made: made once and shared, or made for one request and kept in
/// place. Either way a valid field value.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// Made once (a fixed value), cloned per request.
    Shared(HeaderValue),
    /// Made for one request (at most [`INLINE`] bytes).
    Inline { len: u8, bytes: [u8; INLINE] },
}

/// Whether `b` may be in a field value (what `HeaderValue::from_bytes` accepts).
pub(super) fn valid(b: u8) -> bool {
    (b >= 0x20 && b != 0x7f) || b == b'\t'
}

impl Value {
    /// `bytes` as a value, if they make a valid one.
    #[cfg(test)]
    pub(crate) fn new(bytes: &[u8]) -> Option<Value> {
        if !bytes.iter().all(|b| valid(*b)) {
            return None;
        }
        Some(Value::of_valid(bytes))
    }

    /// Bytes known to be a valid value (hex digits, an id checked already).
    pub(super) fn of_valid(bytes: &[u8]) -> Value {
        Value::of_parts(&[bytes])
    }

    /// `parts` one after the other, each known to be valid in a value (a token, digits).
    pub(super) fn of_parts(parts: &[&[u8]]) -> Value {
        let mut inline = [0u8; INLINE];
        let mut len = 0;
        for part in parts {
            let Some(to) = inline.get_mut(len..len + part.len()) else {
                return Value::Shared(
                    HeaderValue::from_bytes(&parts.concat())
                        .unwrap_or(HeaderValue::from_static("")),
                );
            };
            to.copy_from_slice(part);
            len += part.len();
        }
        Value::Inline { len: len as u8, bytes: inline }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Value::Shared(v) => v.as_bytes(),
            Value::Inline { len, bytes } => &bytes[..*len as usize],
        }
    }

    /// The value as text (tests).
    #[cfg(test)]
    pub(crate) fn to_str(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(self.as_bytes())
    }

    /// As hyper's path needs it.
    pub(crate) fn to_header_value(&self) -> HeaderValue {
        match self {
            Value::Shared(v) => v.clone(),
            Value::Inline { .. } => {
                HeaderValue::from_bytes(self.as_bytes()).unwrap_or(HeaderValue::from_static(""))
            }
        }
    }
}

impl From<HeaderValue> for Value {
    fn from(v: HeaderValue) -> Value {
        Value::Shared(v)
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for Value {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

/// The edits of one head: every field named in `drop` goes, then `append`'s fields are added
/// in order. Filters' `remove`, `set` and `add` in any order come down to this. The values are
/// the request's ([`Value`]), or in a chain's table where they come from (`table::Src`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldOps<V = Value> {
    pub(crate) drop: Vec<HeaderName>,
    pub(crate) append: Vec<(HeaderName, V)>,
}

impl<V> Default for FieldOps<V> {
    fn default() -> Self {
        FieldOps { drop: Vec::new(), append: Vec::new() }
    }
}

impl<V> FieldOps<V> {
    /// Every field `name` goes (those of the head and those added before).
    pub(crate) fn remove(&mut self, name: &HeaderName) {
        if !self.drop.contains(name) {
            self.drop.push(name.clone());
        }
        if self.append.iter().any(|(n, _)| n == name) {
            self.append.retain(|(n, _)| n != name);
        }
    }

    /// `name` has exactly this value.
    pub(crate) fn set(&mut self, name: &HeaderName, value: impl Into<V>) {
        self.remove(name);
        self.append.push((name.clone(), value.into()));
    }

    /// `name` gets one more field.
    pub(crate) fn add(&mut self, name: &HeaderName, value: impl Into<V>) {
        self.append.push((name.clone(), value.into()));
    }

    /// Whether a field of the head named `name` (as sent, any case) goes.
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        self.drop.iter().any(|d| name.eq_ignore_ascii_case(d.as_str().as_bytes()))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.drop.is_empty() && self.append.is_empty()
    }
}

impl FieldOps {
    /// These edits, then `later`'s.
    #[cfg(test)]
    pub(super) fn then(mut self, later: &FieldOps) -> FieldOps {
        for name in &later.drop {
            self.remove(name);
        }
        self.append.extend(later.append.iter().cloned());
        self
    }

    /// Applies the edits to a head's fields.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.drop {
            headers.remove(name);
        }
        for (name, value) in &self.append {
            headers.append(name.clone(), value.to_header_value());
        }
    }
}

/// A response edit as the request phase leaves it: its value rendered but for `${member}` (its
/// placeholder, [`MEMBER`]), which the response phase fills in ([`response_ops`],
/// `ResponseEdits`).
pub(super) enum Pending {
    Remove(HeaderName),
    Set(HeaderName, String),
    Add(HeaderName, String),
    /// A value made already (no `${member}` in it): cloned, not parsed, per response.
    SetValue(HeaderName, Value),
    /// The same, as one more field.
    AddValue(HeaderName, Value),
}

impl Pending {
    pub(super) fn name(&self) -> &HeaderName {
        match self {
            Pending::Remove(n)
            | Pending::Set(n, _)
            | Pending::Add(n, _)
            | Pending::SetValue(n, _)
            | Pending::AddValue(n, _) => n,
        }
    }

    /// Whether this edit takes every field of its name away (the head's and those added before).
    pub(super) fn clears(&self) -> bool {
        matches!(self, Pending::Remove(_) | Pending::Set(..) | Pending::SetValue(..))
    }
}

/// `text` with `member` in place of its placeholder, when that makes a valid value.
pub(super) fn with_member<'a>(text: &'a str, member: &str) -> Option<Cow<'a, str>> {
    let text = if text.contains(MEMBER) {
        Cow::Owned(text.replace(MEMBER, member))
    } else {
        Cow::Borrowed(text)
    };
    text.bytes().all(valid).then_some(text)
}

/// `before` (the chain's table's edits), then `pending`, with `member` in place of its
/// placeholder; a value that is then no valid field (a subject with a line break) is left out.
pub(super) fn response_ops(before: FieldOps, pending: &[Pending], member: &str) -> FieldOps {
    let mut out = before;
    for p in pending {
        match p {
            Pending::Remove(n) => out.remove(n),
            Pending::SetValue(n, v) => out.set(n, v.clone()),
            Pending::AddValue(n, v) => out.add(n, v.clone()),
            Pending::Set(n, v) => match with_member(v, member) {
                Some(v) => out.set(n, Value::of_valid(v.as_bytes())),
                None => out.remove(n),
            },
            Pending::Add(n, v) => {
                if let Some(v) = with_member(v, member) {
                    out.add(n, Value::of_valid(v.as_bytes()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_in_place_and_shared_are_alike() {
        let short = Value::new(b"abc").unwrap();
        assert!(matches!(short, Value::Inline { .. }));
        let long = "x".repeat(INLINE + 1);
        let long = Value::new(long.as_bytes()).unwrap();
        assert!(matches!(long, Value::Shared(_)));
        assert_eq!(long.to_header_value().as_bytes(), long.as_bytes());
        assert_eq!(short.to_header_value(), "abc");
        assert!(Value::new(b"a\r\nb").is_none());
        assert!(Value::new(b"tab\tok").is_some());
    }
}
