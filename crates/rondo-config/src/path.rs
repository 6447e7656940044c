//! Field paths (`cluster.components.members[1].weight`, `route[0].cluster`) and their mapping to
//! and from byte spans of the source text, by walking a span-keeping `toml_edit` document.
//!
//! Array indices are 0-based, in file order, like TOML arrays. A key that is not a bare key
//! (anything but ASCII letters, digits, `-` and `_`) is shown quoted, as TOML would write it.

use std::fmt;
use std::ops::Range;

use toml_edit::{Item, Table, Value};

/// The suffixes of fields that have an alias without them (`timeout` for `timeout_ms`: the
/// units of `units.rs`).
pub(crate) const SUFFIXES: [&str; 2] = ["_ms", "_s"];

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A table key.
    Key(String),
    /// A 0-based array (or array-of-tables) index.
    Index(usize),
}

/// A path from the document root to a field.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct FieldPath(pub(crate) Vec<Seg>);

impl FieldPath {
    /// The root.
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// This path followed by a key.
    pub(crate) fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_owned()));
        p
    }

    /// This path followed by an index.
    pub(crate) fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }
}

fn is_bare(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    if is_bare(k) {
                        f.write_str(k)?;
                    } else {
                        write!(f, "{k:?}")?;
                    }
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A borrowed node of the document.
#[derive(Clone, Copy)]
enum Node<'a> {
    /// A standard table (the root, `[x]`, or an element of `[[x]]`).
    Table(&'a Table),
    /// An item under a key.
    Item(&'a Item),
    /// An element of an inline array.
    Value(&'a Value),
}

impl<'a> Node<'a> {
    /// The span of the node itself: for a standard table its header, else the value text.
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Table(t) => t.span(),
            Node::Item(i) => i.span(),
            Node::Value(v) => v.span(),
        }
    }

    /// Normalizes an item holding a standard table or a value to the more specific variant.
    fn normalize(self) -> Node<'a> {
        match self {
            Node::Item(Item::Table(t)) => Node::Table(t),
            Node::Item(Item::Value(v)) => Node::Value(v),
            other => other,
        }
    }

    /// The children: (segment, key span, node).
    fn children(self) -> Vec<(Seg, Option<Range<usize>>, Node<'a>)> {
        match self.normalize() {
            Node::Table(t) => t
                .iter()
                .filter_map(|(k, _)| t.get_key_value(k))
                .map(|(key, item)| (Seg::Key(key.get().to_owned()), key.span(), Node::Item(item)))
                .collect(),
            Node::Item(Item::ArrayOfTables(a)) => {
                a.iter().enumerate().map(|(i, t)| (Seg::Index(i), None, Node::Table(t))).collect()
            }
            Node::Value(Value::InlineTable(t)) => t
                .iter()
                .filter_map(|(k, _)| t.get_key_value(k))
                .map(|(key, item)| (Seg::Key(key.get().to_owned()), key.span(), Node::Item(item)))
                .collect(),
            Node::Value(Value::Array(a)) => {
                a.iter().enumerate().map(|(i, v)| (Seg::Index(i), None, Node::Value(v))).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The child under `seg` and the span of its key, if any. A `_ms` or `_s` key that is not
    /// there is looked for under its unit alias (`timeout` for `timeout_ms`, `units.rs`), so an
    /// error about the field points at what the file wrote.
    fn child(self, seg: &Seg) -> Option<(Node<'a>, Option<Range<usize>>)> {
        self.child_exact(seg).or_else(|| {
            let Seg::Key(k) = seg else { return None };
            let alias = SUFFIXES.iter().find_map(|s| k.strip_suffix(s))?;
            self.child_exact(&Seg::Key(alias.to_owned()))
        })
    }

    fn child_exact(self, seg: &Seg) -> Option<(Node<'a>, Option<Range<usize>>)> {
        match (self.normalize(), seg) {
            (Node::Table(t), Seg::Key(k)) => {
                t.get_key_value(k).map(|(key, item)| (Node::Item(item), key.span()))
            }
            (Node::Item(Item::ArrayOfTables(a)), Seg::Index(i)) => {
                a.get(*i).map(|t| (Node::Table(t), None))
            }
            (Node::Value(Value::InlineTable(t)), Seg::Key(k)) => {
                t.get_key_value(k).map(|(key, item)| (Node::Item(item), key.span()))
            }
            (Node::Value(Value::Array(a)), Seg::Index(i)) => {
                a.get(*i).map(|v| (Node::Value(v), None))
            }
            _ => None,
        }
    }
}

/// The span that best shows `path` in `doc`: the value's text when the field is present (for a
/// standard table, its header), else its key, else the nearest present ancestor's.
pub(crate) fn span_of(doc: &Table, path: &FieldPath) -> Option<Range<usize>> {
    let mut node = Node::Table(doc);
    let mut best: Option<Range<usize>> = None;
    for seg in &path.0 {
        let Some((child, key_span)) = node.child(seg) else {
            break;
        };
        node = child;
        if let Some(s) = node.span().or(key_span) {
            best = Some(s);
        }
    }
    best
}

/// The span of the field at `path` when the field itself is present (its value, or a standard
/// table's header), with no fallback to an ancestor.
pub(crate) fn span_exact(doc: &Table, path: &FieldPath) -> Option<Range<usize>> {
    let mut node = Node::Table(doc);
    let mut key = None;
    for seg in &path.0 {
        let (child, key_span) = node.child(seg)?;
        node = child;
        key = key_span;
    }
    node.span().or(key)
}

/// The spans of the key and of the value of the key/value pair at `path` (inline ones
/// included); `None` for a standard table or an array of tables, which have no value text.
pub(crate) fn key_value_spans(
    doc: &Table,
    path: &FieldPath,
) -> Option<(Range<usize>, Range<usize>)> {
    let (last, parents) = path.0.split_last()?;
    let mut node = Node::Table(doc);
    for seg in parents {
        node = node.child(seg)?.0;
    }
    let (child, key) = node.child(last)?;
    match child.normalize() {
        Node::Value(v) => Some((key?, v.span()?)),
        _ => None,
    }
}

/// Every integer value of `doc`, with its path and span (for the unit-less aliases' check).
pub(crate) fn integers(doc: &Table) -> Vec<(FieldPath, Range<usize>)> {
    fn walk(node: Node<'_>, path: &mut FieldPath, out: &mut Vec<(FieldPath, Range<usize>)>) {
        for (seg, _, child) in node.children() {
            path.0.push(seg);
            if let Node::Value(v @ Value::Integer(_)) = child.normalize()
                && let Some(span) = v.span()
            {
                out.push((path.clone(), span));
            }
            walk(child, path, out);
            path.0.pop();
        }
    }
    let mut out = Vec::new();
    walk(Node::Table(doc), &mut FieldPath::root(), &mut out);
    out
}

/// The field path whose own text (key, value, or table header) most narrowly contains byte
/// `offset`; among equally narrow ones the deepest (an `[[x]]` header is both `x` and `x[N]`).
pub(crate) fn path_at(doc: &Table, offset: usize) -> Option<FieldPath> {
    /// Length of `span` when it contains `offset`.
    fn within(span: Option<Range<usize>>, offset: usize) -> Option<usize> {
        span.filter(|s| s.start <= offset && (offset < s.end || s.start == s.end)).map(|s| s.len())
    }
    fn walk(
        node: Node<'_>,
        path: &mut FieldPath,
        offset: usize,
        best: &mut Option<(usize, FieldPath)>,
    ) {
        for (seg, key_span, child) in node.children() {
            path.0.push(seg);
            let narrowest = [within(key_span, offset), within(child.span(), offset)]
                .into_iter()
                .flatten()
                .min();
            if let Some(len) = narrowest
                && best
                    .as_ref()
                    .is_none_or(|(l, b)| len < *l || (len == *l && b.0.len() < path.0.len()))
            {
                *best = Some((len, path.clone()));
            }
            walk(child, path, offset, best);
            path.0.pop();
        }
    }
    let mut best = None;
    walk(Node::Table(doc), &mut FieldPath::root(), offset, &mut best);
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> toml_edit::Document<&str> {
        toml_edit::Document::parse(text).expect("valid toml")
    }

    fn path(segs: &[Seg]) -> FieldPath {
        FieldPath(segs.to_vec())
    }

    #[test]
    fn display() {
        let p = FieldPath::root().key("cluster").key("a.b").key("members").index(1).key("weight");
        assert_eq!(p.to_string(), r#"cluster."a.b".members[1].weight"#);
        assert_eq!(
            FieldPath::root().key("route").index(0).key("cluster").to_string(),
            "route[0].cluster"
        );
    }

    #[test]
    fn span_of_finds_values_and_falls_back_to_ancestors() {
        let text =
            "[[route]]\ncluster = \"x\"\n[cluster.c]\nmembers = [{ name = \"m\", weight = 0 }]\n";
        let d = doc(text);
        let t = d.as_table();
        let s = span_of(t, &FieldPath::root().key("route").index(0).key("cluster")).unwrap();
        assert_eq!(&text[s], "\"x\"");
        let s = span_of(
            t,
            &FieldPath::root().key("cluster").key("c").key("members").index(0).key("weight"),
        )
        .unwrap();
        assert_eq!(&text[s], "0");
        // Absent field: the nearest present ancestor (the inline table).
        let s = span_of(
            t,
            &FieldPath::root().key("cluster").key("c").key("members").index(0).key("group"),
        )
        .unwrap();
        assert_eq!(&text[s], "{ name = \"m\", weight = 0 }");
        let s = span_of(t, &FieldPath::root().key("cluster").key("c")).unwrap();
        assert_eq!(&text[s], "[cluster.c]");
    }

    #[test]
    fn path_at_finds_the_deepest_field() {
        let text =
            "[[route]]\ncluster = \"x\"\n[cluster.c]\nmembers = [{ name = \"m\", wieght = 0 }]\n";
        let d = doc(text);
        let t = d.as_table();
        let at = |needle: &str| path_at(t, text.find(needle).unwrap());
        assert_eq!(at("[[route]]"), Some(path(&[Seg::Key("route".into()), Seg::Index(0)])));
        assert_eq!(
            at("\"x\""),
            Some(path(&[Seg::Key("route".into()), Seg::Index(0), Seg::Key("cluster".into())]))
        );
        assert_eq!(at("wieght").unwrap().to_string(), "cluster.c.members[0].wieght");
        assert_eq!(at("[cluster.c]").unwrap().to_string(), "cluster.c");
        // The key itself is narrower than the header it sits in.
        assert_eq!(at("cluster.c]").unwrap().to_string(), "cluster");
    }
}
