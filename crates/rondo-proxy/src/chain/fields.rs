//! Header field edits: the `headers` filter's compiled `set`/`add`/`remove`, and [`FieldOps`],
//! the edits of one head in the form both codecs apply (names whose fields go, fields
//! appended), whatever filters made them.

use http::{HeaderMap, HeaderName, HeaderValue};
use rondo_core::traffic::{FieldEdits, HeaderEdits, Template};

use super::{Applied, Info, MEMBER};

/// The edits of one head: every field named in `drop` goes, then `append`'s fields are added
/// in order. Filters' `remove`, `set` and `add` in any order come down to this.
#[derive(Default, Clone, Debug, PartialEq)]
pub(crate) struct FieldOps {
    pub(crate) drop: Vec<HeaderName>,
    pub(crate) append: Vec<(HeaderName, HeaderValue)>,
}

impl FieldOps {
    /// Every field `name` goes (those of the head and those added before).
    pub(crate) fn remove(&mut self, name: &HeaderName) {
        if !self.drop.contains(name) {
            self.drop.push(name.clone());
        }
        self.append.retain(|(n, _)| n != name);
    }

    /// `name` has exactly this value.
    pub(crate) fn set(&mut self, name: &HeaderName, value: HeaderValue) {
        self.remove(name);
        self.append.push((name.clone(), value));
    }

    /// `name` gets one more field.
    pub(crate) fn add(&mut self, name: &HeaderName, value: HeaderValue) {
        self.append.push((name.clone(), value));
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
            headers.append(name.clone(), value.clone());
        }
    }
}

/// A response edit as the request phase leaves it: its value rendered but for `${member}` (its
/// placeholder, [`MEMBER`]), which the response phase fills in ([`response_ops`]).
pub(super) enum Pending {
    Remove(HeaderName),
    Set(HeaderName, String),
    Add(HeaderName, String),
    /// A value made already (no `${member}` in it): cloned, not parsed, per response.
    SetValue(HeaderName, HeaderValue),
    /// The same, as one more field.
    AddValue(HeaderName, HeaderValue),
}

/// The response's edits with `member` in place of its placeholder; a value that is then no
/// valid field (a subject with a line break) is left out.
pub(super) fn response_ops(pending: &[Pending], member: &str) -> FieldOps {
    let mut out = FieldOps::default();
    let value = |text: &str| {
        if text.contains(MEMBER) {
            HeaderValue::from_bytes(text.replace(MEMBER, member).as_bytes()).ok()
        } else {
            HeaderValue::from_bytes(text.as_bytes()).ok()
        }
    };
    for p in pending {
        match p {
            Pending::Remove(n) => out.remove(n),
            Pending::SetValue(n, v) => out.set(n, v.clone()),
            Pending::AddValue(n, v) => out.add(n, v.clone()),
            Pending::Set(n, v) => {
                if let Some(v) = value(v) {
                    out.set(n, v)
                } else {
                    out.remove(n)
                }
            }
            Pending::Add(n, v) => {
                if let Some(v) = value(v) {
                    out.add(n, v)
                }
            }
        }
    }
    out
}

/// A `headers` filter, its names parsed once.
pub(super) struct HeaderStep {
    request: Vec<Op>,
    response: Vec<Op>,
}

enum Op {
    Remove(HeaderName),
    Set(HeaderName, Value),
    Add(HeaderName, Value),
}

/// A value: made once when it has no variable.
enum Value {
    Fixed(HeaderValue),
    Template(Template),
}

impl HeaderStep {
    pub(super) fn new(edits: &HeaderEdits) -> HeaderStep {
        HeaderStep { request: ops(&edits.request), response: ops(&edits.response) }
    }

    /// Adds this filter's edits to the request's and the response's.
    pub(super) fn request(&self, info: &Info<'_>, applied: &mut Applied) {
        for op in &self.request {
            let render = |v: &Value| match v {
                Value::Fixed(v) => Some(v.clone()),
                Value::Template(t) => {
                    HeaderValue::from_bytes(t.render(|var| info.var(applied, var)).as_bytes()).ok()
                }
            };
            match op {
                Op::Remove(n) => applied.request.remove(n),
                // A value a variable made unfit for a field (a subject with a line break):
                // the field goes rather than carry the client's value on.
                Op::Set(n, v) => match render(v) {
                    Some(v) => applied.request.set(n, v),
                    None => applied.request.remove(n),
                },
                Op::Add(n, v) => {
                    if let Some(v) = render(v) {
                        applied.request.add(n, v);
                    }
                }
            }
        }
        for op in &self.response {
            let pending = match op {
                Op::Remove(n) => Pending::Remove(n.clone()),
                Op::Set(n, Value::Fixed(v)) => Pending::SetValue(n.clone(), v.clone()),
                Op::Add(n, Value::Fixed(v)) => Pending::AddValue(n.clone(), v.clone()),
                Op::Set(n, Value::Template(t)) => {
                    Pending::Set(n.clone(), t.render(|var| info.var(applied, var)))
                }
                Op::Add(n, Value::Template(t)) => {
                    Pending::Add(n.clone(), t.render(|var| info.var(applied, var)))
                }
            };
            applied.response.push(pending);
        }
    }
}

/// The configuration's edits as ops, in the order they apply: remove, set, add.
fn ops(edits: &FieldEdits) -> Vec<Op> {
    let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).ok();
    let value = |t: &Template| match t.as_literal() {
        Some(text) => HeaderValue::from_str(text).ok().map(Value::Fixed),
        None => Some(Value::Template(t.clone())),
    };
    let mut out = Vec::new();
    out.extend(edits.remove.iter().filter_map(|n| name(n).map(Op::Remove)));
    out.extend(edits.set.iter().filter_map(|(n, t)| Some(Op::Set(name(n)?, value(t)?))));
    out.extend(edits.add.iter().filter_map(|(n, t)| Some(Op::Add(name(n)?, value(t)?))));
    out
}
