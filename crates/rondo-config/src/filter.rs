//! The route conditions the core holds but cannot evaluate ([`rondo_core::Filter`]): regular
//! expressions on the path and on header values (the `regex` crate: linear time, no
//! backtracking), a JSON body field and an XML/SOAP body path with namespaces (`quick-xml`).
//! Each is compiled here, once per view, when the configuration is compiled, so a bad pattern
//! or path is a configuration error at its field's file:line:column; the data plane then calls
//! them through the core's trait for every request the route's other conditions let through.
//!
//! The JSON path subset (`body_json`): `$` followed by any number of `.name` (a member of an
//! object; any characters but `.` and `[`) and `[N]` (element `N` of an array, from 0), e.g.
//! `$.order.region` or `$.items[0].sku`. The field's value must be a string equal to the
//! condition's, or a number, boolean or `null` whose JSON text is (`"3"` matches `3`).
//!
//! The XPath subset (`body_xml`): an absolute path of child steps, `/p:Name/q:Other/Last`, each
//! a name with an optional prefix bound in `ns` (an unprefixed step names an element in no
//! namespace, as in XPath 1.0). Without `equals`, the route matches when such an element
//! exists; with it, when one of them has that string value (its text, descendants' included,
//! trimmed of white space at both ends). No wildcards, predicates, attributes or `//`.
//!
//! Body filters see at most the route's `max_peek_bytes` of the body. A JSON filter needs the
//! whole document: a body larger than the limit does not match. An XML filter reads the
//! document as a stream and matches as soon as the element is found complete within the bytes
//! it has (a SOAP header comes first), so a larger body matches when the element lies within
//! the limit. A body that is not well-formed JSON or XML (up to where it was read) does not
//! match. Neither ever fails the request: the route is simply not chosen.

use std::fmt;

use quick_xml::events::Event;
use quick_xml::name::{Namespace, ResolveResult};
use regex::Regex;
use rondo_core::{BodyPeek, Filter, RequestFacts};

/// Compiled regular expressions are held to this size (bytes of the compiled program).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles `pattern`, or says why it is not one.
pub(crate) fn regex(pattern: &str) -> Result<Regex, String> {
    regex::RegexBuilder::new(pattern).size_limit(REGEX_SIZE_LIMIT).build().map_err(|e| {
        // The crate's message spans lines (a caret under the pattern); one line here.
        let msg = e.to_string();
        let last = msg.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(&msg);
        format!(
            "`{pattern}` is not a regular expression: {}",
            last.trim().trim_start_matches("error: ")
        )
    })
}

/// `Debug` of the filters: the condition as written (their `text`), as `describe` says it.
macro_rules! debug_as_text {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.text)
            }
        }
    )*};
}

debug_as_text!(PathRegex, HeaderRegex, BodyJson, BodyXml);

/// [`Filter`] of a body condition: true of every head, decided on the body by the type's own
/// `body_matches`.
macro_rules! body_filter {
    ($t:ty) => {
        impl Filter for $t {
            fn describe(&self) -> &str {
                &self.text
            }

            fn matches_head(&self, _: &RequestFacts<'_>) -> bool {
                true
            }

            fn reads_body(&self) -> bool {
                true
            }

            fn matches_body(&self, body: &BodyPeek<'_>) -> bool {
                self.body_matches(body)
            }
        }
    };
}

/// `path_regex`: the normalized path matches the expression (anywhere, unless anchored).
pub(crate) struct PathRegex {
    text: String,
    re: Regex,
}

impl PathRegex {
    pub(crate) fn new(pattern: &str) -> Result<Self, String> {
        Ok(PathRegex { text: format!("path_regex = {pattern:?}"), re: regex(pattern)? })
    }
}

impl Filter for PathRegex {
    fn describe(&self) -> &str {
        &self.text
    }

    fn matches_head(&self, req: &RequestFacts<'_>) -> bool {
        self.re.is_match(req.path)
    }
}

/// `headers_regex`: the header's (first) value matches the expression; an absent header does
/// not.
pub(crate) struct HeaderRegex {
    text: String,
    name: String,
    re: Regex,
}

impl HeaderRegex {
    pub(crate) fn new(name: &str, pattern: &str) -> Result<Self, String> {
        let name = name.to_ascii_lowercase();
        let text = format!("headers_regex.{name} = {pattern:?}");
        Ok(HeaderRegex { text, name, re: regex(pattern)? })
    }
}

impl Filter for HeaderRegex {
    fn describe(&self) -> &str {
        &self.text
    }

    fn matches_head(&self, req: &RequestFacts<'_>) -> bool {
        (req.header)(&self.name).is_some_and(|v| self.re.is_match(v))
    }
}

/// One step of a JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// Parses `$.a.b[0]` into its steps, or says what is wrong with it.
fn json_path(path: &str) -> Result<Vec<Step>, String> {
    let Some(mut rest) = path.strip_prefix('$') else {
        return Err(format!("path `{path}` must start with `$`"));
    };
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let key = &after[..end];
            if key.is_empty() {
                return Err(format!("path `{path}` has an empty member name"));
            }
            steps.push(Step::Key(key.to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let Some((n, tail)) = after.split_once(']') else {
                return Err(format!("path `{path}` has a `[` without `]`"));
            };
            let Ok(i) = n.parse::<usize>() else {
                return Err(format!(
                    "path `{path}`: `[{n}]` is not an array index (only `[N]` is supported)"
                ));
            };
            steps.push(Step::Index(i));
            rest = tail;
        } else {
            return Err(format!("path `{path}`: expected `.name` or `[N]` at `{rest}`"));
        }
    }
    if steps.is_empty() {
        return Err(format!("path `{path}` names no field"));
    }
    Ok(steps)
}

/// `body_json`: every listed field of the JSON body has its value.
pub(crate) struct BodyJson {
    text: String,
    fields: Vec<(Vec<Step>, String)>,
}

impl BodyJson {
    /// From `(path, value)` pairs; the error names the pair's path.
    pub(crate) fn new<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, (String, String)> {
        let mut fields = Vec::new();
        let mut text = String::from("body_json = {");
        for (path, value) in pairs {
            let steps = json_path(path).map_err(|e| (path.to_owned(), e))?;
            text.push_str(&format!(" {path:?} = {value:?},"));
            fields.push((steps, value.to_owned()));
        }
        text.push_str(" }");
        Ok(BodyJson { text, fields })
    }
}

body_filter!(BodyJson);

impl BodyJson {
    /// Whether every field of `body` has its value.
    fn body_matches(&self, body: &BodyPeek<'_>) -> bool {
        // A JSON document cut short is no document.
        if !body.complete {
            return false;
        }
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body.bytes) else {
            return false;
        };
        self.fields.iter().all(|(steps, want)| {
            let mut at = &doc;
            for step in steps {
                let next = match step {
                    Step::Key(k) => at.get(k.as_str()),
                    Step::Index(i) => at.get(*i),
                };
                match next {
                    Some(v) => at = v,
                    None => return false,
                }
            }
            match at {
                serde_json::Value::String(s) => s == want,
                serde_json::Value::Number(_)
                | serde_json::Value::Bool(_)
                | serde_json::Value::Null => serde_json::to_string(at).is_ok_and(|t| t == *want),
                _ => false,
            }
        })
    }
}

/// `body_xml`: an element at an absolute path (namespace URI, local name per step) exists, or
/// one has the string value `equals`.
pub(crate) struct BodyXml {
    text: String,
    steps: Vec<(Option<String>, String)>,
    equals: Option<String>,
}

impl BodyXml {
    /// From the path, the prefixes it may use and the value; the error says what is wrong with
    /// the path.
    pub(crate) fn new(
        path: &str,
        ns: &[(String, String)],
        equals: Option<&str>,
    ) -> Result<Self, String> {
        let Some(rest) = path.strip_prefix('/') else {
            return Err(format!("path `{path}` must be absolute (start with `/`)"));
        };
        if rest.starts_with('/') {
            return Err(format!("path `{path}`: `//` is not supported (only child steps)"));
        }
        let mut steps = Vec::new();
        for step in rest.split('/') {
            if step.is_empty() {
                return Err(format!("path `{path}` has an empty step"));
            }
            if step.contains(['[', ']', '@', '*', '(', ')', '=', ' ', '.']) && step != "." {
                return Err(format!(
                    "path `{path}`: step `{step}` is not a name (only `prefix:name` or `name` \
                     child steps; no predicates, attributes, wildcards or functions)"
                ));
            }
            let (prefix, local) = match step.split_once(':') {
                Some((p, l)) => (Some(p), l),
                None => (None, step),
            };
            if local.is_empty() || local.contains(':') || prefix.is_some_and(str::is_empty) {
                return Err(format!("path `{path}`: step `{step}` is not a name"));
            }
            let uri = match prefix {
                None => None,
                Some(p) => match ns.iter().find(|(k, _)| k == p) {
                    Some((_, uri)) => Some(uri.clone()),
                    None => {
                        return Err(format!("path `{path}`: prefix `{p}` is not bound in `ns`"));
                    }
                },
            };
            steps.push((uri, local.to_owned()));
        }
        let mut text = format!("body_xml = {{ path = {path:?}");
        for (p, uri) in ns {
            text.push_str(&format!(", ns.{p} = {uri:?}"));
        }
        if let Some(v) = equals {
            text.push_str(&format!(", equals = {v:?}"));
        }
        text.push_str(" }");
        Ok(BodyXml { text, steps, equals: equals.map(str::to_owned) })
    }

    /// Whether the element named by step `i` is `(ns, local)`.
    fn step_is(&self, i: usize, ns: &ResolveResult<'_>, local: &[u8]) -> bool {
        let Some((want_ns, want_local)) = self.steps.get(i) else { return false };
        if want_local.as_bytes() != local {
            return false;
        }
        match (want_ns, ns) {
            (None, ResolveResult::Unbound) => true,
            (Some(uri), ResolveResult::Bound(Namespace(got))) => uri.as_bytes() == *got,
            _ => false,
        }
    }

    /// Scans `bytes` (the body's first bytes, or all of it) for the path.
    fn scan(&self, bytes: &[u8]) -> bool {
        let mut reader = quick_xml::NsReader::from_reader(bytes);
        reader.config_mut().check_end_names = true;
        let mut buf = Vec::new();
        // Open elements, and how many leading steps the open chain matches.
        let (mut depth, mut matched) = (0usize, 0usize);
        let target = self.steps.len();
        let mut value: Option<String> = None;
        loop {
            buf.clear();
            let event = match reader.read_resolved_event_into(&mut buf) {
                Ok(e) => e,
                // Malformed (or cut off inside a tag): no match.
                Err(_) => return false,
            };
            match event {
                (ns, Event::Start(e)) => {
                    if matched == depth && self.step_is(depth, &ns, e.local_name().as_ref()) {
                        matched = depth + 1;
                        if matched == target {
                            if self.equals.is_none() {
                                return true;
                            }
                            value = Some(String::new());
                        }
                    }
                    depth += 1;
                }
                // An empty element's string value is empty.
                (ns, Event::Empty(e))
                    if matched == depth
                        && depth + 1 == target
                        && self.step_is(depth, &ns, e.local_name().as_ref())
                        && self.equals.as_deref().is_none_or(str::is_empty) =>
                {
                    return true;
                }
                (_, Event::End(_)) => {
                    depth = depth.saturating_sub(1);
                    if matched > depth {
                        if matched == target
                            && let Some(v) = value.take()
                            && self.equals.as_deref() == Some(v.trim())
                        {
                            return true;
                        }
                        matched = depth;
                    }
                }
                (_, Event::Text(t)) => {
                    if let Some(v) = value.as_mut() {
                        match t.decode().ok().and_then(|d| {
                            quick_xml::escape::unescape(&d).ok().map(|u| u.into_owned())
                        }) {
                            Some(s) => v.push_str(&s),
                            None => return false,
                        }
                    }
                }
                (_, Event::CData(t)) => {
                    if let Some(v) = value.as_mut() {
                        v.push_str(&String::from_utf8_lossy(&t));
                    }
                }
                (_, Event::GeneralRef(r)) => {
                    if let Some(v) = value.as_mut() {
                        let Ok(name) = r.decode() else { return false };
                        let resolved = match r.resolve_char_ref() {
                            Ok(Some(c)) => c.to_string(),
                            _ => match quick_xml::escape::resolve_predefined_entity(&name) {
                                Some(s) => s.to_owned(),
                                None => return false,
                            },
                        };
                        v.push_str(&resolved);
                    }
                }
                (_, Event::Eof) => return false,
                _ => {}
            }
        }
    }
}

body_filter!(BodyXml);

impl BodyXml {
    /// Whether the element (with its value) is in `body`.
    fn body_matches(&self, body: &BodyPeek<'_>) -> bool {
        self.scan(body.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peek(b: &[u8], complete: bool) -> BodyPeek<'_> {
        BodyPeek { bytes: b, complete }
    }

    #[test]
    fn json_paths_parse_and_refuse() {
        assert_eq!(
            json_path("$.a.b[2].c").unwrap(),
            vec![
                Step::Key("a".into()),
                Step::Key("b".into()),
                Step::Index(2),
                Step::Key("c".into())
            ]
        );
        for bad in ["a.b", "$", "$..a", "$.a[", "$.a[x]", "$a"] {
            assert!(json_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_fields_match_strings_and_scalars_only_in_whole_documents() {
        let f = BodyJson::new([("$.order.region", "eu"), ("$.order.n", "3")]).unwrap();
        let doc = br#"{"order": {"region": "eu", "n": 3}}"#;
        assert!(f.matches_body(&peek(doc, true)));
        assert!(!f.matches_body(&peek(doc, false)), "a cut document never matches");
        assert!(!f.matches_body(&peek(br#"{"order": {"region": "us", "n": 3}}"#, true)));
        assert!(!f.matches_body(&peek(br#"{"order": {"region": "eu""#, true)), "malformed");
        assert!(!f.matches_body(&peek(b"", true)));
        let arr = BodyJson::new([("$.items[1].sku", "b")]).unwrap();
        assert!(arr.matches_body(&peek(br#"{"items": [{"sku": "a"}, {"sku": "b"}]}"#, true)));
        assert!(!arr.matches_body(&peek(br#"{"items": [{"sku": "a"}]}"#, true)));
    }

    const SOAP: &str = r#"<?xml version="1.0"?>
<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:a="http://www.w3.org/2005/08/addressing">
  <s:Header><a:Action s:mustUnderstand="1">urn:orders/Submit</a:Action></s:Header>
  <s:Body><Order xmlns="urn:orders"><Region>eu</Region></Order></s:Body>
</s:Envelope>"#;

    fn ns() -> Vec<(String, String)> {
        vec![
            ("soap".into(), "http://www.w3.org/2003/05/soap-envelope".into()),
            ("a".into(), "http://www.w3.org/2005/08/addressing".into()),
            ("o".into(), "urn:orders".into()),
        ]
    }

    #[test]
    fn xml_paths_follow_namespaces_not_prefixes() {
        let action = "/soap:Envelope/soap:Header/a:Action";
        let f = BodyXml::new(action, &ns(), Some("urn:orders/Submit")).unwrap();
        assert!(f.matches_body(&peek(SOAP.as_bytes(), true)));
        let other = BodyXml::new(action, &ns(), Some("urn:orders/Cancel")).unwrap();
        assert!(!other.matches_body(&peek(SOAP.as_bytes(), true)));
        // The default namespace counts: `Order` is in urn:orders, not in no namespace.
        let region = BodyXml::new("/soap:Envelope/soap:Body/o:Order/o:Region", &ns(), Some("eu"));
        assert!(region.unwrap().matches_body(&peek(SOAP.as_bytes(), true)));
        let unqualified = BodyXml::new("/soap:Envelope/soap:Body/Order", &ns(), None).unwrap();
        assert!(!unqualified.matches_body(&peek(SOAP.as_bytes(), true)));
        // Existence only.
        let exists = BodyXml::new("/soap:Envelope/soap:Header", &ns(), None).unwrap();
        assert!(exists.matches_body(&peek(SOAP.as_bytes(), true)));
    }

    #[test]
    fn xml_matches_within_a_prefix_and_never_on_malformed_input() {
        let f =
            BodyXml::new("/soap:Envelope/soap:Header/a:Action", &ns(), Some("urn:orders/Submit"))
                .unwrap();
        let cut = SOAP.find("<s:Body>").unwrap();
        assert!(f.matches_body(&peek(&SOAP.as_bytes()[..cut], false)), "the header came first");
        let mid = SOAP.find("Submit").unwrap();
        assert!(!f.matches_body(&peek(&SOAP.as_bytes()[..mid], false)), "value cut short");
        assert!(!f.matches_body(&peek(b"<s:Envelope><oops></s:Envelope>", true)));
        assert!(!f.matches_body(&peek(b"not xml at all", true)));
        assert!(!f.matches_body(&peek(b"", true)));
    }

    #[test]
    fn xml_paths_are_checked() {
        for bad in ["Envelope", "//a", "/a[1]", "/@x", "/x:a", "/a//b", "/*"] {
            assert!(BodyXml::new(bad, &ns(), None).is_err(), "{bad}");
        }
    }

    #[test]
    fn regexes_are_checked() {
        assert!(regex("^/orders/[0-9]+$").is_ok());
        let e = regex("(unclosed").unwrap_err();
        assert!(e.contains("(unclosed") && !e.contains('\n'), "{e}");
    }
}
