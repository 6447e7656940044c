//! Header field edits: the `headers` filter's compiled `set`/`add`/`remove`, and [`FieldOps`],
//! the edits of one head in the form both codecs apply (names whose fields go, fields
//! appended), whatever filters made them; the response's edits as the own path writes them
//! ([`ResponseEdits`]). A value made per request (an id, a span, a rendered template) is kept in
//! place ([`Value::Inline`]): the chain allocates nothing for it.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};
use rondo_core::traffic::{FieldEdits, HeaderEdits, Part, Template};

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
/// in order. Filters' `remove`, `set` and `add` in any order come down to this.
#[derive(Default, Clone, Debug, PartialEq)]
pub(crate) struct FieldOps {
    pub(crate) drop: Vec<HeaderName>,
    pub(crate) append: Vec<(HeaderName, Value)>,
}

impl FieldOps {
    /// Room for `n` names dropped and `n` fields added.
    pub(super) fn with_capacity(n: usize) -> FieldOps {
        FieldOps { drop: Vec::with_capacity(n), append: Vec::with_capacity(n) }
    }

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
    pub(crate) fn set(&mut self, name: &HeaderName, value: impl Into<Value>) {
        self.remove(name);
        self.append.push((name.clone(), value.into()));
    }

    /// [`FieldOps::remove`] of a name no edit before touched (the chain knows it when compiled,
    /// [`first_touches`]): nothing to look through.
    pub(super) fn remove_first(&mut self, name: &HeaderName) {
        debug_assert!(!self.drop.contains(name) && self.append.iter().all(|(n, _)| n != name));
        self.drop.push(name.clone());
    }

    /// [`FieldOps::set`] of a name no edit before touched.
    pub(super) fn set_first(&mut self, name: &HeaderName, value: impl Into<Value>) {
        self.remove_first(name);
        self.append.push((name.clone(), value.into()));
    }

    /// `name` gets one more field.
    pub(crate) fn add(&mut self, name: &HeaderName, value: impl Into<Value>) {
        self.append.push((name.clone(), value.into()));
    }

    /// Whether a field of the head named `name` (as sent, any case) goes.
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        self.drop.iter().any(|d| name.eq_ignore_ascii_case(d.as_str().as_bytes()))
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
fn with_member<'a>(text: &'a str, member: &str) -> Option<Cow<'a, str>> {
    let text = if text.contains(MEMBER) {
        Cow::Owned(text.replace(MEMBER, member))
    } else {
        Cow::Borrowed(text)
    };
    text.bytes().all(valid).then_some(text)
}

/// The response's edits with `member` in place of its placeholder; a value that is then no
/// valid field (a subject with a line break) is left out.
pub(super) fn response_ops(pending: &[Pending], member: &str) -> FieldOps {
    let mut out = FieldOps::default();
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
/// are written: what [`response_ops`] would make, without making it.
pub(crate) struct ResponseEdits<'a> {
    pending: &'a [Pending],
    member: &'a str,
}

impl<'a> ResponseEdits<'a> {
    pub(super) fn new(pending: &'a [Pending], member: &'a str) -> Self {
        ResponseEdits { pending, member }
    }

    /// Whether a field of the head named `name` (as sent, any case) goes.
    pub(crate) fn drops(&self, name: &[u8]) -> bool {
        self.pending
            .iter()
            .any(|p| p.clears() && name.eq_ignore_ascii_case(p.name().as_str().as_bytes()))
    }

    /// Writes the fields the edits add, as `name: value\r\n` lines, in their order: each one no
    /// later edit takes away, and whose value is valid with the member in it.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
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

/// Which of `names`, the names a step edits on the request in order, no edit before touched in
/// the chain (`seen`, to which they are added): those are set or removed without looking
/// through the edits made so far. Names are few, and this runs once per compile.
pub(super) fn first_touches<'n>(
    names: impl Iterator<Item = &'n HeaderName>,
    seen: &mut Vec<HeaderName>,
) -> Vec<bool> {
    names
        .map(|n| {
            let first = !seen.contains(n);
            seen.push(n.clone());
            first
        })
        .collect()
}

/// A `headers` filter, its names parsed once.
pub(super) struct HeaderStep {
    request: Vec<Op>,
    response: Vec<Op>,
    /// For each request edit, whether it is the first of its name in the chain
    /// ([`first_touches`]; none until the chain says).
    first: Vec<bool>,
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
        let request = ops(&edits.request);
        let first = vec![false; request.len()];
        HeaderStep { request, response: ops(&edits.response), first }
    }

    /// Marks the request edits that are the first of their name in the chain.
    pub(super) fn mark_first(&mut self, seen: &mut Vec<HeaderName>) {
        let names = self.request.iter().map(|op| match op {
            Op::Remove(n) | Op::Set(n, _) | Op::Add(n, _) => n,
        });
        self.first = first_touches(names, seen);
    }

    /// Adds this filter's edits to the request's and the response's.
    pub(super) fn request(&self, info: &Info<'_>, applied: &mut Applied) {
        for (op, first) in self.request.iter().zip(&self.first) {
            let render = |v: &Source, applied: &Applied| match v {
                Source::Fixed(v) => Some(Value::Shared(v.clone())),
                Source::Template(t) => render(t, info, applied),
            };
            match op {
                Op::Remove(n) if *first => applied.request.remove_first(n),
                Op::Remove(n) => applied.request.remove(n),
                // A value a variable made unfit for a field (a subject with a line break):
                // the field goes rather than carry the client's value on.
                Op::Set(n, v) => match (render(v, applied), *first) {
                    (Some(v), true) => applied.request.set_first(n, v),
                    (Some(v), false) => applied.request.set(n, v),
                    (None, true) => applied.request.remove_first(n),
                    (None, false) => applied.request.remove(n),
                },
                Op::Add(n, v) => {
                    if let Some(v) = render(v, applied) {
                        applied.request.add(n, v);
                    }
                }
            }
        }
        for op in &self.response {
            let text = |t: &Template| {
                let mut out = String::new();
                for part in &t.parts {
                    match part {
                        Part::Literal(s) => out.push_str(s),
                        Part::Var(v) => out.push_str(&info.var(applied, *v)),
                    }
                }
                out
            };
            let pending = match op {
                Op::Remove(n) => Pending::Remove(n.clone()),
                Op::Set(n, Source::Fixed(v)) => Pending::SetValue(n.clone(), v.clone().into()),
                Op::Add(n, Source::Fixed(v)) => Pending::AddValue(n.clone(), v.clone().into()),
                Op::Set(n, Source::Template(t)) => Pending::Set(n.clone(), text(t)),
                Op::Add(n, Source::Template(t)) => Pending::Add(n.clone(), text(t)),
            };
            applied.response.push(pending);
        }
    }

    /// Fields this filter may edit on the request and on the response (room made for them
    /// once per request).
    pub(super) fn edits(&self) -> (usize, usize) {
        (self.request.len(), self.response.len())
    }
}

/// A request value: `t` rendered for this request, kept in place when it is short (the usual
/// case: a client address, a host); `None` when it makes no valid value.
fn render(t: &Template, info: &Info<'_>, applied: &Applied) -> Option<Value> {
    let mut inline = [0u8; INLINE];
    let mut len = 0;
    let mut long: Option<Vec<u8>> = None;
    for part in &t.parts {
        let text = match part {
            Part::Literal(s) => Cow::Borrowed(s.as_str()),
            Part::Var(v) => info.var(applied, *v),
        };
        let text = text.as_bytes();
        match (&mut long, inline.get_mut(len..len + text.len())) {
            (Some(long), _) => long.extend_from_slice(text),
            (None, Some(to)) => {
                to.copy_from_slice(text);
                len += text.len();
            }
            (None, None) => long = Some([&inline[..len], text].concat()),
        }
    }
    match long {
        Some(long) => Value::new(&long),
        None if inline[..len].iter().all(|b| valid(*b)) => {
            Some(Value::Inline { len: len as u8, bytes: inline })
        }
        None => None,
    }
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
    /// (and drops) hyper's path gets from [`response_ops`], whatever the order of the edits.
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
        for member in ["m1", "", "bad\r\nx: y"] {
            let ops = response_ops(&pending, member);
            let mut expected = Vec::new();
            for (n, v) in &ops.append {
                expected.extend_from_slice(format!("{}: ", n.as_str()).as_bytes());
                expected.extend_from_slice(v.as_bytes());
                expected.extend_from_slice(b"\r\n");
            }
            let edits = ResponseEdits::new(&pending, member);
            let mut written = Vec::new();
            edits.write(&mut written);
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&expected),
                "member {member:?}"
            );
            for n in ["x-a", "X-B", "x-c", "x-d", "x-e", "x-f"] {
                assert_eq!(edits.drops(n.as_bytes()), ops.drops(n.as_bytes()), "{n}, {member:?}");
            }
        }
        // The member's name is in the values that asked for it.
        let mut written = Vec::new();
        ResponseEdits::new(&pending, "m1").write(&mut written);
        let text = String::from_utf8(written).unwrap();
        assert!(text.contains("x-b: by m1\r\n") && text.contains("x-a: 2-m1\r\n"), "{text}");
        assert!(!text.contains("x-a: 1\r\n") && !text.contains("x-c: c\r\n"), "{text}");
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
