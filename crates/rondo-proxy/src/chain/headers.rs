//! The `headers` filter: its `remove`, `set` and `add` of request and response fields,
//! compiled once into the chain's edits ([`Edits`]); per request it only renders the values of
//! its `${…}` templates into the request's record.

use http::{HeaderName, HeaderValue};
use rondo_core::traffic::{FieldEdits, HeaderEdits, Part, Template, Var};

use super::table::{Edit, Edits, Src, slot};
use super::{Applied, Info};

/// A `headers` filter, its names parsed once.
pub(super) struct HeaderStep {
    request: Vec<Op>,
    response: Vec<Op>,
    /// The templates rendered per request, in the order of their slots, each with whether
    /// its value is checked (a request's; a response's is checked once the member is in it).
    templates: Vec<(Template, bool)>,
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
        let (request, response) = (ops(&edits.request), ops(&edits.response));
        let templates = |ops: &[Op], check: bool| {
            let templates = ops.iter().filter_map(move |op| match op {
                Op::Set(_, Source::Template(t)) | Op::Add(_, Source::Template(t)) => Some(t),
                _ => None,
            });
            templates.map(move |t| (t.clone(), check)).collect::<Vec<_>>()
        };
        let templates = [templates(&request, true), templates(&response, false)].concat();
        HeaderStep { request, response, templates }
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
        for (t, check) in &self.templates {
            render(t, info, applied, *check);
        }
    }
}

/// `t` rendered for this request as the next value of its record, straight into it; when
/// `check`, absent if it is no valid field value.
fn render(t: &Template, info: &Info<'_>, applied: &mut Applied, check: bool) {
    let Applied { record, path, identity, id, .. } = applied;
    for part in &t.parts {
        match part {
            Part::Literal(s) => record.extend(s.as_bytes()),
            // The id is in the record already.
            Part::Var(Var::RequestId) => {
                if let Some(slot) = *id {
                    record.repeat(slot);
                }
            }
            Part::Var(v) => record.extend(&info.var(path.as_deref(), identity.as_ref(), *v)),
        }
    }
    record.close_checked(check);
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
