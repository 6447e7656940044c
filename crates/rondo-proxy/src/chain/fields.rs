//! Header field edits: the `headers` filter's compiled `set`/`add`/`remove`, and [`FieldOps`],
//! the edits of one head in the form both codecs apply (names whose fields go, fields
//! appended), whatever filters made them; the response's edits as the own path writes them
//! ([`ResponseEdits`]). A value made per request (an id, a span, a rendered template) is kept in
//! place ([`Value::Inline`]): the chain allocates nothing for it.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};
use rondo_core::traffic::{FieldEdits, HeaderEdits, Part, Template};

use super::table::{Edit, Edits, Record, Src, Table, slot};
use super::{Applied, Info, MEMBER};

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
fn valid(b: u8) -> bool {
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
/// [`ResponseEdits`]).
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
    fn name(&self) -> &HeaderName {
        match self {
            Pending::Remove(n)
            | Pending::Set(n, _)
            | Pending::Add(n, _)
            | Pending::SetValue(n, _)
            | Pending::AddValue(n, _) => n,
        }
    }

    /// Whether this edit takes every field of its name away (the head's and those added before).
    fn clears(&self) -> bool {
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

/// The response's edits as the own path writes them into a head, `${member}` filled in as they
/// are written: what [`response_ops`] would make, without making it. The chain's table first
/// (with the request's values), then the edits made per request.
pub(crate) struct ResponseEdits<'a> {
    pub(super) table: Option<(&'a Table, &'a Record)>,
    pub(super) pending: &'a [Pending],
    pub(super) member: &'a str,
}

impl ResponseEdits<'_> {
    /// Whether a field of the head named `name` (as sent, any case) goes.
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        self.table.is_some_and(|(t, _)| t.response.drops(name))
            || self
                .pending
                .iter()
                .any(|p| p.clears() && name.eq_ignore_ascii_case(p.name().as_str().as_bytes()))
    }

    /// Writes the fields the edits add, as `name: value\r\n` lines, in their order: each one no
    /// later edit takes away, and whose value is valid with the member in it.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        if let Some((table, record)) = self.table {
            let later =
                |name: &HeaderName| self.pending.iter().any(|p| p.clears() && p.name() == name);
            table.write_response(record, self.member, later, out);
        }
        for (i, p) in self.pending.iter().enumerate() {
            let name = p.name();
            if self.pending[i + 1..].iter().any(|later| later.clears() && later.name() == name) {
                continue;
            }
            let line = |out: &mut Vec<u8>, value: &[u8]| {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            };
            match p {
                Pending::Remove(_) => {}
                Pending::SetValue(_, v) | Pending::AddValue(_, v) => line(out, v.as_bytes()),
                Pending::Set(_, text) | Pending::Add(_, text) => {
                    if let Some(v) = with_member(text, self.member) {
                        line(out, v.as_bytes());
                    }
                }
            }
        }
    }
}

/// A `headers` filter, its names parsed once.
pub(super) struct HeaderStep {
    request: Vec<Op>,
    response: Vec<Op>,
}

enum Op {
    Remove(HeaderName),
    Set(HeaderName, Source),
    Add(HeaderName, Source),
}

/// A configured value: made once when it has no variable.
enum Source {
    Fixed(HeaderValue),
    Template(Template),
}

impl HeaderStep {
    pub(super) fn new(edits: &HeaderEdits) -> HeaderStep {
        HeaderStep { request: ops(&edits.request), response: ops(&edits.response) }
    }

    /// The filter's edits; each template's value gets a slot of the record (`next`), the
    /// request's first, in order, then the response's.
    pub(super) fn edits(&self, next: &mut u16) -> Edits {
        let mut edits = |ops: &[Op], member: bool| {
            let mut src = |v: &Source| match v {
                Source::Fixed(v) => Src::Fixed(v.clone()),
                Source::Template(_) if member => Src::Member(slot(next)),
                Source::Template(_) => Src::Slot(slot(next)),
            };
            ops.iter()
                .map(|op| match op {
                    Op::Remove(n) => Edit::Remove(n.clone()),
                    Op::Set(n, v) => Edit::Set(n.clone(), src(v)),
                    Op::Add(n, v) => Edit::Add(n.clone(), src(v)),
                })
                .collect()
        };
        let request = edits(&self.request, false);
        Edits { request, response: edits(&self.response, true) }
    }

    /// Renders this request's values of the filter's templates into its record, in the order
    /// of [`HeaderStep::edits`]' slots. A request value a variable made unfit for a field (a
    /// subject with a line break) is absent: the field goes rather than carry the client's
    /// value on. A response value is checked once the member is in it.
    pub(super) fn request(&self, info: &Info<'_>, applied: &mut Applied) {
        for (ops, check) in [(&self.request, true), (&self.response, false)] {
            for op in ops {
                if let Op::Set(_, Source::Template(t)) | Op::Add(_, Source::Template(t)) = op {
                    render(t, info, applied, check);
                }
            }
        }
    }
}

/// `t` rendered for this request as the next value of its record; when `check`, absent if it
/// is no valid field value.
fn render(t: &Template, info: &Info<'_>, applied: &mut Applied, check: bool) {
    const SHORT: usize = 128;
    let mut short = [0u8; SHORT];
    let mut len = 0;
    let mut long: Option<Vec<u8>> = None;
    for part in &t.parts {
        let text = match part {
            Part::Literal(s) => Cow::Borrowed(s.as_str()),
            Part::Var(v) => info.var(applied, *v),
        };
        let text = text.as_bytes();
        match (&mut long, short.get_mut(len..len + text.len())) {
            (Some(long), _) => long.extend_from_slice(text),
            (None, Some(to)) => {
                to.copy_from_slice(text);
                len += text.len();
            }
            (None, None) => long = Some([&short[..len], text].concat()),
        }
    }
    let bytes = long.as_deref().unwrap_or(&short[..len]);
    let record = &mut applied.record;
    record.extend(bytes);
    record.close(!check || bytes.iter().all(|b| valid(*b)));
}

/// The configuration's edits as ops, in the order they apply: remove, set, add.
fn ops(edits: &FieldEdits) -> Vec<Op> {
    let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).ok();
    let value = |t: &Template| match t.as_literal() {
        Some(text) => HeaderValue::from_str(text).ok().map(Source::Fixed),
        None => Some(Source::Template(t.clone())),
    };
    let mut out = Vec::new();
    out.extend(edits.remove.iter().filter_map(|n| name(n).map(Op::Remove)));
    out.extend(edits.set.iter().filter_map(|(n, t)| Some(Op::Set(name(n)?, value(t)?))));
    out.extend(edits.add.iter().filter_map(|(n, t)| Some(Op::Add(name(n)?, value(t)?))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &'static str) -> HeaderName {
        HeaderName::from_static(n)
    }

    /// The own path writes the response's edits straight into the head: exactly the fields
    /// (and drops) hyper's path gets from [`response_ops`], whatever the order of the edits,
    /// with a chain's table before them or not.
    #[test]
    fn written_edits_are_the_edits_applied() {
        let v = |s: &str| Value::new(s.as_bytes()).unwrap();
        let pending = [
            Pending::AddValue(name("x-a"), v("1")),
            Pending::Set(name("x-b"), "by \u{1}".into()),
            Pending::Add(name("x-c"), "c".into()),
            Pending::Remove(name("x-a")),
            Pending::Add(name("x-a"), "2-\u{1}".into()),
            Pending::SetValue(name("x-c"), v("3")),
            Pending::AddValue(name("x-d"), v("4")),
            Pending::Set(name("x-e"), "e".into()),
        ];
        // A table: x-f set from a slot, x-b added with the member, x-g added from an absent
        // slot, x-h removed, x-c added (then set again by the pending edits).
        let mut record = Record::default();
        let (f, b) = (record.push(b"f-value"), record.push(b"tb-\x01"));
        record.extend(b"bad\r\n");
        let g = record.close(false);
        let table = Table::of(
            [Edits {
                request: Vec::new(),
                response: vec![
                    Edit::Set(name("x-f"), Src::Slot(f)),
                    Edit::Add(name("x-b"), Src::Member(b)),
                    Edit::Add(name("x-g"), Src::Slot(g)),
                    Edit::Remove(name("x-h")),
                    Edit::Add(name("x-c"), Src::Fixed(HeaderValue::from_static("tc"))),
                ],
            }]
            .iter(),
        );
        for with_table in [false, true] {
            let table = with_table.then_some((&table, &record));
            for member in ["m1", "", "bad\r\nx: y"] {
                let before = table.map(|(t, r)| t.response_ops(r, member)).unwrap_or_default();
                let ops = response_ops(before, &pending, member);
                let mut expected = Vec::new();
                for (n, v) in &ops.append {
                    expected.extend_from_slice(format!("{}: ", n.as_str()).as_bytes());
                    expected.extend_from_slice(v.as_bytes());
                    expected.extend_from_slice(b"\r\n");
                }
                let edits = ResponseEdits { table, pending: &pending, member };
                let mut written = Vec::new();
                edits.write(&mut written);
                assert_eq!(
                    String::from_utf8_lossy(&written),
                    String::from_utf8_lossy(&expected),
                    "member {member:?}, table {with_table}"
                );
                for n in ["x-a", "X-B", "x-c", "x-d", "x-e", "x-f", "x-g", "X-H", "x-i"] {
                    let (got, want) = (edits.drops(n.as_bytes()), ops.drops(n.as_bytes()));
                    assert_eq!(got, want, "{n}, {member:?}, table {with_table}");
                }
            }
        }
        // The member's name is in the values that asked for it.
        let mut written = Vec::new();
        ResponseEdits { table: Some((&table, &record)), pending: &pending, member: "m1" }
            .write(&mut written);
        let text = String::from_utf8(written).unwrap();
        assert!(text.contains("x-b: by m1\r\n") && text.contains("x-a: 2-m1\r\n"), "{text}");
        assert!(text.starts_with("x-f: f-value\r\n"), "the table's first: {text}");
        assert!(!text.contains("x-a: 1\r\n") && !text.contains("x-c: c\r\n"), "{text}");
        assert!(!text.contains("tb-") && !text.contains("tc") && !text.contains("x-g"), "{text}");
    }

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
