//! The chain's field edits compiled once: each step says when the chain is compiled which
//! names it removes, sets and adds ([`Edits`]), with each value either fixed or made per
//! request; the steps' edits, composed in order, make the chain's [`Table`]. A request then
//! carries only the values made for it, one after another in a fixed record ([`Record`],
//! allocation-free for the usual few short values), and the codecs write the table's fields
//! with them: no edit list is built per request.
//!
//! The converting and CORS steps decide per request which fields they edit, so a chain with
//! one of them gives its steps' edits as [`FieldOps`] per request instead ([`emit`]).

use http::{HeaderMap, HeaderName, HeaderValue};

use super::fields::{FieldOps, Pending, Value, valid, with_member};

/// Where a value the table adds comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Src {
    /// Made when the chain was compiled.
    Fixed(HeaderValue),
    /// The request's record's value in this slot, a valid field value; absent when a variable
    /// made it unfit (the field is not added, though its name still goes).
    Slot(u16),
    /// A response value rendered but for `${member}` (its placeholder still in it), valid or
    /// not only once the member is in it.
    Member(u16),
}

impl Src {
    /// The value for this request, `member` in place of its placeholder; `None` when there is
    /// no valid value.
    fn value(&self, record: &Record, member: &str) -> Option<Value> {
        match self {
            Src::Fixed(v) => Some(Value::Shared(v.clone())),
            Src::Slot(i) => record.get(*i).map(Value::of_valid),
            Src::Member(i) => {
                let text = std::str::from_utf8(record.get(*i)?).ok()?;
                Some(Value::of_valid(with_member(text, member)?.as_bytes()))
            }
        }
    }
}

/// One edit of a head, as a step makes it.
pub(super) enum Edit {
    Remove(HeaderName),
    Set(HeaderName, Src),
    Add(HeaderName, Src),
}

/// A step's edits of the request head and of the response head, in order.
#[derive(Default)]
pub(super) struct Edits {
    pub(super) request: Vec<Edit>,
    pub(super) response: Vec<Edit>,
}

impl Edits {
    pub(super) fn is_empty(&self) -> bool {
        self.request.is_empty() && self.response.is_empty()
    }
}

/// The next slot of the record, handed out in the order the steps fill them.
pub(super) fn slot(next: &mut u16) -> u16 {
    *next += 1;
    *next - 1
}

/// A chain's edits, composed: what the request's and the response's heads lose and gain, and
/// the same as the codecs write it ([`Lines`]).
#[derive(Default, Debug)]
pub(crate) struct Table {
    pub(super) request: FieldOps<Src>,
    pub(super) response: FieldOps<Src>,
    request_lines: Lines,
    response_lines: Lines,
}

/// One head's edits as the own path writes them: the names dropped, their lengths as a mask
/// (most of a head's fields are passed by one test), and each field added as its line, whole
/// when its value is fixed.
#[derive(Default, Debug)]
struct Lines {
    drop: Vec<HeaderName>,
    lengths: u64,
    add: Vec<(Line, HeaderName)>,
}

#[derive(Debug)]
enum Line {
    /// `name: value\r\n`, made when compiled.
    Whole(Box<[u8]>),
    /// `name: ` and the value's source.
    Made(Box<[u8]>, Src),
}

/// A name's bit in [`Lines::lengths`].
fn length_bit(name: &[u8]) -> u64 {
    1 << (name.len() % 64)
}

impl Lines {
    fn of(ops: &FieldOps<Src>) -> Lines {
        let lengths = ops.drop.iter().fold(0, |m, n| m | length_bit(n.as_str().as_bytes()));
        let add = ops.append.iter().map(|(name, src)| {
            let head = [name.as_str().as_bytes(), b": "].concat();
            let line = match src {
                Src::Fixed(v) => Line::Whole([&head[..], v.as_bytes(), b"\r\n"].concat().into()),
                src => Line::Made(head.into(), src.clone()),
            };
            (line, name.clone())
        });
        Lines { drop: ops.drop.clone(), lengths, add: add.collect() }
    }

    fn drops(&self, name: &[u8]) -> bool {
        self.lengths & length_bit(name) != 0
            && self.drop.iter().any(|d| name.eq_ignore_ascii_case(d.as_str().as_bytes()))
    }

    /// Writes the fields added, as `name: value\r\n` lines, but those named `gone`.
    fn write(
        &self,
        record: &Record,
        member: &str,
        gone: impl Fn(&HeaderName) -> bool,
        out: &mut Vec<u8>,
    ) {
        for (line, name) in &self.add {
            if gone(name) {
                continue;
            }
            match line {
                Line::Whole(line) => out.extend_from_slice(line),
                Line::Made(head, Src::Member(i)) => {
                    let text = record.get(*i).and_then(|t| std::str::from_utf8(t).ok());
                    if let Some(value) = text.and_then(|t| with_member(t, member)) {
                        made(out, head, value.as_bytes());
                    }
                }
                Line::Made(head, src) => {
                    let value = match src {
                        Src::Fixed(v) => Some(v.as_bytes()),
                        Src::Slot(i) | Src::Member(i) => record.get(*i),
                    };
                    if let Some(value) = value {
                        made(out, head, value);
                    }
                }
            }
        }
    }
}

/// A field's line from its start (`name: `) and its value.
#[inline]
fn made(out: &mut Vec<u8>, head: &[u8], value: &[u8]) {
    out.reserve(head.len() + value.len() + 2);
    out.extend_from_slice(head);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

impl Table {
    /// The edits of `steps`, one after the other.
    pub(super) fn of<'e>(steps: impl Iterator<Item = &'e Edits>) -> Table {
        fn compose(ops: &mut FieldOps<Src>, edits: &[Edit]) {
            for e in edits {
                match e {
                    Edit::Remove(n) => ops.remove(n),
                    Edit::Set(n, s) => ops.set(n, s.clone()),
                    Edit::Add(n, s) => ops.add(n, s.clone()),
                }
            }
        }
        let (mut request, mut response) = (FieldOps::default(), FieldOps::default());
        for edits in steps {
            compose(&mut request, &edits.request);
            compose(&mut response, &edits.response);
        }
        let (request_lines, response_lines) = (Lines::of(&request), Lines::of(&response));
        Table { request, response, request_lines, response_lines }
    }

    /// Whether a field of the request head named `name` (as sent, any case) goes.
    pub(super) fn drops_request(&self, name: &[u8]) -> bool {
        self.request_lines.drops(name)
    }

    /// The same for the response head.
    pub(super) fn drops_response(&self, name: &[u8]) -> bool {
        self.response_lines.drops(name)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.request.is_empty() && self.response.is_empty()
    }

    /// The request's edits with this request's values (the tests).
    #[cfg(test)]
    pub(super) fn request_ops(&self, record: &Record) -> FieldOps {
        values(&self.request, record, "")
    }

    /// The response's edits with this request's values and `member`.
    pub(super) fn response_ops(&self, record: &Record, member: &str) -> FieldOps {
        values(&self.response, record, member)
    }

    /// Applies the request's edits to hyper's head.
    pub(super) fn apply_request(&self, record: &Record, headers: &mut HeaderMap) {
        for name in &self.request.drop {
            headers.remove(name);
        }
        for (name, src) in &self.request.append {
            if let Some(v) = src.value(record, "") {
                headers.append(name.clone(), v.to_header_value());
            }
        }
    }

    /// Writes the fields the request gains, as `name: value\r\n` lines, but those `later`
    /// (edits made after the chain's) takes away.
    pub(super) fn write_request(&self, record: &Record, later: &FieldOps, out: &mut Vec<u8>) {
        self.request_lines.write(record, "", |n| later.drop.contains(n), out);
    }

    /// The same for the response, `member` in the values that name it.
    pub(super) fn write_response(
        &self,
        record: &Record,
        member: &str,
        later: impl Fn(&HeaderName) -> bool,
        out: &mut Vec<u8>,
    ) {
        self.response_lines.write(record, member, later, out);
    }
}

fn values(ops: &FieldOps<Src>, record: &Record, member: &str) -> FieldOps {
    let append = ops.append.iter().filter_map(|(n, s)| Some((n.clone(), s.value(record, member)?)));
    FieldOps { drop: ops.drop.clone(), append: append.collect() }
}

/// A step's edits as [`FieldOps`] and [`Pending`] (a chain whose edits are not in a table):
/// added to the request's `request` and `response` edits made so far.
pub(super) fn emit(
    edits: &Edits,
    record: &Record,
    request: &mut FieldOps,
    response: &mut Vec<Pending>,
) {
    for e in &edits.request {
        match e {
            Edit::Remove(n) => request.remove(n),
            Edit::Set(n, s) => match s.value(record, "") {
                Some(v) => request.set(n, v),
                None => request.remove(n),
            },
            Edit::Add(n, s) => {
                if let Some(v) = s.value(record, "") {
                    request.add(n, v);
                }
            }
        }
    }
    for e in &edits.response {
        let text =
            |i: &u16| String::from_utf8_lossy(record.get(*i).unwrap_or_default()).into_owned();
        let pending = match e {
            Edit::Remove(n) => Pending::Remove(n.clone()),
            Edit::Set(n, Src::Member(i)) => Pending::Set(n.clone(), text(i)),
            Edit::Add(n, Src::Member(i)) => Pending::Add(n.clone(), text(i)),
            Edit::Set(n, s) => match s.value(record, "") {
                Some(v) => Pending::SetValue(n.clone(), v),
                None => Pending::Remove(n.clone()),
            },
            Edit::Add(n, s) => match s.value(record, "") {
                Some(v) => Pending::AddValue(n.clone(), v),
                None => continue,
            },
        };
        response.push(pending);
    }
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
        self.table.is_some_and(|(t, _)| t.drops_response(name))
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

/// Bytes of values kept in place; more go to the heap.
const CAP: usize = 160;
/// Values whose ends are kept in place.
const SLOTS: usize = 8;
/// Marks a slot's end as that of an absent value.
const ABSENT: u32 = 1 << 31;

/// The values made for one request, one after another, each in the slot the chain gave it
/// when compiled. A request id, a span, a client address and a rate-limit state fit in place.
pub(crate) struct Record {
    inline: [u8; CAP],
    /// All the bytes, once they no longer fit in place.
    spilled: Vec<u8>,
    len: usize,
    /// Where each value ends ([`ABSENT`] marked), the first [`SLOTS`] in place.
    ends: [u32; SLOTS],
    more_ends: Vec<u32>,
    slots: usize,
}

impl Default for Record {
    fn default() -> Record {
        Record {
            inline: [0; CAP],
            spilled: Vec::new(),
            len: 0,
            ends: [0; SLOTS],
            more_ends: Vec::new(),
            slots: 0,
        }
    }
}

impl Record {
    fn bytes(&self) -> &[u8] {
        if self.spilled.is_empty() { &self.inline[..self.len] } else { &self.spilled }
    }

    fn end(&self, slot: usize) -> u32 {
        if slot < SLOTS { self.ends[slot] } else { self.more_ends[slot - SLOTS] }
    }

    /// The value in `slot`, if made and present.
    #[inline]
    pub(crate) fn get(&self, slot: u16) -> Option<&[u8]> {
        self.bytes().get(self.span(slot)?)
    }

    /// Where the value in `slot` is, if made and present.
    #[inline]
    fn span(&self, slot: u16) -> Option<std::ops::Range<usize>> {
        let slot = usize::from(slot);
        if slot >= self.slots {
            return None;
        }
        let end = self.end(slot);
        if end & ABSENT != 0 {
            return None;
        }
        let start = if slot == 0 { 0 } else { self.end(slot - 1) & !ABSENT };
        Some(start as usize..end as usize)
    }

    /// Appends the value in `slot` (made before) to the value being made.
    pub(super) fn repeat(&mut self, slot: u16) {
        let Some(span) = self.span(slot) else { return };
        let end = self.len + span.len();
        if self.spilled.is_empty() && end <= CAP {
            self.inline.copy_within(span, self.len);
            self.len = end;
        } else {
            let value = self.bytes()[span].to_vec();
            self.spill(&value);
        }
    }

    /// Ends the value being made; when `check`, absent if it is no valid field value.
    pub(super) fn close_checked(&mut self, check: bool) -> u16 {
        let start = if self.slots == 0 { 0 } else { (self.end(self.slots - 1) & !ABSENT) as usize };
        let valid =
            !check || self.bytes().get(start..).is_some_and(|v| v.iter().all(|b| valid(*b)));
        self.close(valid)
    }

    /// Appends `bytes` to the value being made.
    #[inline]
    pub(super) fn extend(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        match self.inline.get_mut(self.len..end) {
            Some(to) if self.spilled.is_empty() => {
                to.copy_from_slice(bytes);
                self.len = end;
            }
            _ => self.spill(bytes),
        }
    }

    /// [`Record::extend`] past the room in place: every byte on the heap.
    #[cold]
    fn spill(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() {
            self.spilled.extend_from_slice(&self.inline[..self.len]);
        }
        self.spilled.extend_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Ends the value being made (dropped again when not `present`); its slot.
    pub(super) fn close(&mut self, present: bool) -> u16 {
        let start = if self.slots == 0 { 0 } else { (self.end(self.slots - 1) & !ABSENT) as usize };
        // Values are field values, far below 2 GiB together; one that is not is absent.
        let end = match u32::try_from(self.len) {
            Ok(end) if present && end & ABSENT == 0 => end,
            _ => {
                self.len = start;
                self.spilled.truncate(start);
                start as u32 | ABSENT
            }
        };
        if self.slots < SLOTS {
            self.ends[self.slots] = end;
        } else {
            self.more_ends.push(end);
        }
        self.slots += 1;
        u16::try_from(self.slots - 1).unwrap_or(u16::MAX)
    }

    /// `bytes` as the next value; its slot.
    pub(super) fn push(&mut self, bytes: &[u8]) -> u16 {
        self.extend(bytes);
        self.close(true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fields::response_ops;
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
    fn a_record_keeps_its_values_in_place_then_on_the_heap() {
        let mut r = Record::default();
        assert_eq!(r.push(b"abc"), 0);
        r.extend(b"bad");
        assert_eq!(r.close(false), 1);
        let long = vec![b'x'; CAP];
        let mut slots = vec![r.push(b""), r.push(&long)];
        slots.extend((0..2 * SLOTS).map(|i| r.push(i.to_string().as_bytes())));
        assert_eq!(r.get(0), Some(&b"abc"[..]));
        assert_eq!(r.get(1), None, "absent");
        assert_eq!(r.get(slots[0]), Some(&b""[..]));
        assert_eq!(r.get(slots[1]), Some(&long[..]));
        for (i, slot) in slots[2..].iter().enumerate() {
            assert_eq!(r.get(*slot), Some(i.to_string().as_bytes()));
        }
        assert_eq!(r.get(slots.last().unwrap() + 1), None, "not made");
        // A value made of an earlier one, on the heap now; one checked and found unfit.
        r.extend(b"id=");
        r.repeat(0);
        r.repeat(1);
        let again = r.close_checked(true);
        assert_eq!(r.get(again), Some(&b"id=abc"[..]));
        r.extend(b"a\r\nb");
        let bad = r.close_checked(true);
        assert_eq!(r.get(bad), None);

        let mut r = Record::default();
        r.push(b"abc");
        r.extend(b"id=");
        r.repeat(0);
        let again = r.close_checked(true);
        assert_eq!(r.get(again), Some(&b"id=abc"[..]), "in place");
        assert!(r.spilled.is_empty());
    }
}
