//! `soap`: WCF's message transformation between SOAP 1.1 and SOAP 1.2, so a client of one
//! version reaches a service of the other (as the WCF Routing Service bridges them). Pure
//! rewriting of a whole message: the envelope's namespace, `actor` and `role`, and a fault's
//! structure (1.1's `faultcode`/`faultstring`/`faultactor`/`detail` and 1.2's
//! `Code/Value`/`Reason/Text`/`Role`/`Detail`), read and written with quick-xml; the content
//! types and the action (1.1's `SOAPAction` field, 1.2's `action` parameter) are the header
//! side ([`request_content_type`], [`response_content_type`]).

use http::{HeaderName, HeaderValue, header};
use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};
use quick_xml::{Reader, Writer};
use rondo_core::traffic::{Soap, SoapVersion};

use super::Applied;
use crate::head::Headers;

/// 1.1's action field.
const SOAP_ACTION: HeaderName = HeaderName::from_static("soapaction");

/// A request whose message is converted: to which version, within what size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The service's version (the client's is the other).
    pub(crate) to: Version,
    pub(crate) max_body_bytes: u64,
}

/// The request phase: a message of the other version than the service's gets its content type
/// (and action) converted here, and its body by the codec ([`convert`], hyper's path).
pub(super) fn request(spec: &Soap, headers: &impl Headers, applied: &mut Applied) {
    let to = match spec.to {
        SoapVersion::V11 => Version::V11,
        SoapVersion::V12 => Version::V12,
    };
    let Some(content_type) = headers.get_str(header::CONTENT_TYPE.as_str()) else { return };
    if Version::of_content_type(content_type.as_bytes()) != Some(to.other()) {
        return;
    }
    let action = headers.get_str(SOAP_ACTION.as_str());
    let (new_type, action) = request_content_type(content_type, action, to);
    let Ok(new_type) = HeaderValue::from_str(&new_type) else { return };
    applied.request.set(&header::CONTENT_TYPE, new_type);
    match action.and_then(|a| HeaderValue::from_str(&a).ok()) {
        Some(a) => applied.request.set(&SOAP_ACTION, a),
        None => applied.request.remove(&SOAP_ACTION),
    }
    applied.soap = Some(Plan { to, max_body_bytes: spec.max_body_bytes });
}

/// SOAP 1.1's envelope namespace.
pub(crate) const SOAP11: &str = "http://schemas.xmlsoap.org/soap/envelope/";
/// SOAP 1.2's envelope namespace.
pub(crate) const SOAP12: &str = "http://www.w3.org/2003/05/soap-envelope";
const NEXT11: &str = "http://schemas.xmlsoap.org/soap/actor/next";
const NEXT12: &str = "http://www.w3.org/2003/05/soap-envelope/role/next";

/// A SOAP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V11,
    V12,
}

impl Version {
    fn ns(self) -> &'static str {
        match self {
            Version::V11 => SOAP11,
            Version::V12 => SOAP12,
        }
    }

    pub(crate) fn other(self) -> Version {
        match self {
            Version::V11 => Version::V12,
            Version::V12 => Version::V11,
        }
    }

    /// The version a message of `content_type` is in, if it is a SOAP message's type.
    pub(crate) fn of_content_type(content_type: &[u8]) -> Option<Version> {
        let media = content_type.split(|b| *b == b';').next()?.trim_ascii();
        if media.eq_ignore_ascii_case(b"text/xml") {
            Some(Version::V11)
        } else if media.eq_ignore_ascii_case(b"application/soap+xml") {
            Some(Version::V12)
        } else {
            None
        }
    }
}

/// The `Content-Type` of a request converted to `to`, from its own and its `SOAPAction` (1.1)
/// or `action` parameter (1.2); and the `SOAPAction` value a 1.1 request gets.
pub(crate) fn request_content_type(
    content_type: &str,
    soap_action: Option<&str>,
    to: Version,
) -> (String, Option<String>) {
    let mut params = content_type.split(';').skip(1).map(str::trim).filter(|p| !p.is_empty());
    let mut kept = Vec::new();
    let mut action = soap_action.map(|a| a.trim().trim_matches('"').to_owned());
    for p in params.by_ref() {
        match p.split_once('=') {
            Some((k, v)) if k.trim().eq_ignore_ascii_case("action") => {
                action = Some(v.trim().trim_matches('"').to_owned());
            }
            _ => kept.push(p.to_owned()),
        }
    }
    let media = match to {
        Version::V11 => "text/xml",
        Version::V12 => "application/soap+xml",
    };
    let mut out = media.to_owned();
    for p in &kept {
        out.push_str("; ");
        out.push_str(p);
    }
    match (to, action) {
        (Version::V12, Some(a)) if !a.is_empty() => {
            out.push_str(&format!("; action=\"{a}\""));
            (out, None)
        }
        (Version::V11, a) => (out, Some(format!("\"{}\"", a.unwrap_or_default()))),
        (_, _) => (out, None),
    }
}

/// The `Content-Type` of a response converted to `to` (its parameters but `action` kept).
pub(crate) fn response_content_type(content_type: &str, to: Version) -> String {
    request_content_type(content_type, None, to).0
}

/// `body`, a SOAP message of the other version, as a message of version `to`.
pub(crate) fn convert(body: &[u8], to: Version) -> Result<Vec<u8>, String> {
    let from = to.other();
    let mut reader = Reader::from_reader(body);
    reader.config_mut().trim_text(false);
    let mut out = Writer::new(Vec::with_capacity(body.len() + 64));
    // Prefixes bound to the envelope's namespace (documents seldom rebind them).
    let mut env_prefixes: Vec<Vec<u8>> = Vec::new();
    let mut saw_envelope = false;
    loop {
        let event = reader.read_event().map_err(|e| format!("not well-formed XML: {e}"))?;
        match event {
            Event::Eof => break,
            Event::DocType(_) => return Err("a SOAP message has no document type".to_owned()),
            Event::Start(e) => {
                let e = rewrite_start(&e, from, to, &mut env_prefixes)?;
                let name = e.name().as_ref().to_vec();
                let (prefix, local) = split(&name);
                let in_env = env_prefixes.iter().any(|p| p.as_slice() == prefix);
                saw_envelope |= in_env && local == b"Envelope";
                if in_env && local == b"Fault" {
                    let fault = Fault::read(&mut reader, body, from, &e)?;
                    fault.write(&mut out, to, prefix)?;
                    continue;
                }
                write(&mut out, Event::Start(e))?;
            }
            Event::Empty(e) => {
                let e = rewrite_start(&e, from, to, &mut env_prefixes)?;
                write(&mut out, Event::Empty(e))?;
            }
            other => write(&mut out, other)?,
        }
    }
    if !saw_envelope {
        return Err(format!(
            "no SOAP {} envelope",
            if from == Version::V11 { "1.1" } else { "1.2" }
        ));
    }
    Ok(out.into_inner())
}

/// An element `name` around `inner`, XML copied as it is.
fn raw(out: &mut Writer<Vec<u8>>, name: &str, inner: &[u8]) -> Result<(), String> {
    write(out, Event::Start(BytesStart::new(name)))?;
    out.get_mut().extend_from_slice(inner);
    write(out, Event::End(BytesEnd::new(name)))
}

fn write(out: &mut Writer<Vec<u8>>, e: Event<'_>) -> Result<(), String> {
    out.write_event(e).map_err(|e| format!("cannot write the converted message: {e}"))
}

/// `prefix:local` split (an empty prefix without a colon).
fn split(name: &[u8]) -> (&[u8], &[u8]) {
    match name.iter().position(|b| *b == b':') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (&b""[..], name),
    }
}

/// An element with its namespace declarations of the envelope moved to `to`'s, and 1.1's
/// `actor` and 1.2's `role` attributes turned into each other.
fn rewrite_start(
    e: &BytesStart<'_>,
    from: Version,
    to: Version,
    env_prefixes: &mut Vec<Vec<u8>>,
) -> Result<BytesStart<'static>, String> {
    let name = String::from_utf8_lossy(e.name().as_ref()).into_owned();
    let mut new = BytesStart::new(name);
    for a in e.attributes() {
        let a = a.map_err(|e| format!("bad attribute: {e}"))?;
        let key = a.key.as_ref();
        let value = a.unescape_value().map_err(|e| format!("bad attribute value: {e}"))?;
        let (kp, kl) = split(key);
        let is_decl = key == b"xmlns" || kp == b"xmlns";
        if is_decl && value == from.ns() {
            env_prefixes.push(if key == b"xmlns" { Vec::new() } else { kl.to_vec() });
            new.push_attribute((key, to.ns().as_bytes()));
            continue;
        }
        let env_attr = env_prefixes.iter().any(|p| p.as_slice() == kp) && !kp.is_empty();
        if env_attr && (kl == b"actor" || kl == b"role") {
            let renamed = [kp, b":", if to == Version::V12 { b"role" } else { b"actor" }].concat();
            let v = match value.as_ref() {
                NEXT11 | NEXT12 => match to {
                    Version::V11 => NEXT11,
                    Version::V12 => NEXT12,
                },
                v => v,
            };
            new.push_attribute((renamed.as_slice(), v.as_bytes()));
            continue;
        }
        new.push_attribute((key, value.as_bytes()));
    }
    Ok(new)
}

/// A fault's parts, in either version's shape.
#[derive(Default)]
struct Fault {
    /// The code's value as written (`env:Receiver`, `soap:Server`).
    code: String,
    reason: String,
    role: Option<String>,
    /// The detail's content, as raw XML.
    detail: Option<Vec<u8>>,
}

impl Fault {
    /// Reads a fault's children up to its end tag.
    fn read(
        reader: &mut Reader<&[u8]>,
        body: &[u8],
        from: Version,
        start: &BytesStart<'_>,
    ) -> Result<Fault, String> {
        let mut fault = Fault::default();
        let mut path: Vec<Vec<u8>> = Vec::new();
        let end = start.name().as_ref().to_vec();
        loop {
            match reader.read_event().map_err(|e| format!("not well-formed XML: {e}"))? {
                Event::Start(e) => {
                    let local = split(e.name().as_ref()).1.to_ascii_lowercase();
                    if local == b"detail" && path.is_empty() {
                        // The detail is the service's own XML: copied as it is.
                        let span = reader.read_to_end(e.name()).map_err(|e| e.to_string())?;
                        let range = usize::try_from(span.start).unwrap_or(usize::MAX)
                            ..usize::try_from(span.end).unwrap_or(usize::MAX);
                        fault.detail = Some(body.get(range).unwrap_or_default().to_vec());
                        continue;
                    }
                    path.push(local);
                }
                Event::End(e) if path.is_empty() && e.name().as_ref() == end => break,
                Event::End(_) => {
                    path.pop();
                }
                Event::Text(t) => {
                    let text = t.decode().map_err(|e| e.to_string())?.into_owned();
                    let at: Vec<&[u8]> = path.iter().map(Vec::as_slice).collect();
                    match (from, at.as_slice()) {
                        (Version::V11, [b"faultcode"]) | (Version::V12, [b"code", b"value"]) => {
                            fault.code.push_str(text.trim());
                        }
                        (Version::V11, [b"faultstring"]) | (Version::V12, [b"reason", b"text"])
                            if fault.reason.is_empty() =>
                        {
                            fault.reason = text.trim().to_owned();
                        }
                        (Version::V11, [b"faultactor"]) | (Version::V12, [b"role"]) => {
                            fault.role = Some(text.trim().to_owned());
                        }
                        _ => {}
                    }
                }
                Event::Eof => return Err("the message ends inside a fault".to_owned()),
                _ => {}
            }
        }
        Ok(fault)
    }

    /// Writes the fault in `to`'s shape, its element prefixed `prefix`.
    fn write(&self, out: &mut Writer<Vec<u8>>, to: Version, prefix: &[u8]) -> Result<(), String> {
        let p = String::from_utf8_lossy(prefix).into_owned();
        let q = |local: &str| if p.is_empty() { local.to_owned() } else { format!("{p}:{local}") };
        let (code_prefix, code_local) = match self.code.split_once(':') {
            Some((a, b)) => (a.to_owned(), b.to_owned()),
            None => (p.clone(), self.code.clone()),
        };
        let code_local = match (to, code_local.as_str()) {
            (Version::V11, "Sender") => "Client",
            (Version::V11, "Receiver" | "DataEncodingUnknown") => "Server",
            (Version::V12, "Client") => "Sender",
            (Version::V12, "Server") => "Receiver",
            (_, other) => other,
        };
        let code = if code_prefix.is_empty() {
            code_local.to_owned()
        } else {
            format!("{code_prefix}:{code_local}")
        };
        let fault = q("Fault");
        write(out, Event::Start(BytesStart::new(fault.as_str())))?;
        let leaf = |out: &mut Writer<Vec<u8>>, name: &str, text: &str| -> Result<(), String> {
            write(out, Event::Start(BytesStart::new(name)))?;
            write(out, Event::Text(BytesText::new(text)))?;
            write(out, Event::End(BytesEnd::new(name)))
        };
        match to {
            Version::V11 => {
                leaf(out, "faultcode", &code)?;
                leaf(out, "faultstring", &self.reason)?;
                if let Some(role) = &self.role {
                    leaf(out, "faultactor", role)?;
                }
                if let Some(detail) = &self.detail {
                    raw(out, "detail", detail)?;
                }
            }
            Version::V12 => {
                let (c, v) = (q("Code"), q("Value"));
                write(out, Event::Start(BytesStart::new(c.as_str())))?;
                leaf(out, &v, &code)?;
                write(out, Event::End(BytesEnd::new(c.as_str())))?;
                let (r, t) = (q("Reason"), q("Text"));
                write(out, Event::Start(BytesStart::new(r.as_str())))?;
                let mut text = BytesStart::new(t.as_str());
                text.push_attribute(("xml:lang", "en"));
                write(out, Event::Start(text))?;
                write(out, Event::Text(BytesText::new(&self.reason)))?;
                write(out, Event::End(BytesEnd::new(t.as_str())))?;
                write(out, Event::End(BytesEnd::new(r.as_str())))?;
                if let Some(role) = &self.role {
                    leaf(out, &q("Role"), role)?;
                }
                if let Some(detail) = &self.detail {
                    raw(out, &q("Detail"), detail)?;
                }
            }
        }
        write(out, Event::End(BytesEnd::new(fault.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST11: &str = r#"<?xml version="1.0"?><soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Header><a:To xmlns:a="urn:x" soap:actor="http://schemas.xmlsoap.org/soap/actor/next" soap:mustUnderstand="1">svc</a:To></soap:Header><soap:Body><m:Add xmlns:m="urn:calc"><a>1</a><b>2 &amp; 3</b></m:Add></soap:Body></soap:Envelope>"#;

    #[test]
    fn a_request_changes_envelope_and_actor_and_keeps_the_rest() {
        let out = String::from_utf8(convert(REQUEST11.as_bytes(), Version::V12).unwrap()).unwrap();
        assert!(out.contains(r#"xmlns:soap="http://www.w3.org/2003/05/soap-envelope""#), "{out}");
        assert!(!out.contains(SOAP11), "{out}");
        assert!(out.contains(r#"soap:role="http://www.w3.org/2003/05/soap-envelope/role/next""#));
        assert!(out.contains(r#"<m:Add xmlns:m="urn:calc"><a>1</a><b>2 &amp; 3</b></m:Add>"#));
        // And back again, to what it was (but the declaration's quoting).
        let back = String::from_utf8(convert(out.as_bytes(), Version::V11).unwrap()).unwrap();
        assert_eq!(back, REQUEST11);
    }

    #[test]
    fn faults_change_shape_both_ways() {
        let fault12 = r#"<env:Envelope xmlns:env="http://www.w3.org/2003/05/soap-envelope"><env:Body><env:Fault><env:Code><env:Value>env:Receiver</env:Value></env:Code><env:Reason><env:Text xml:lang="en">out of stock</env:Text></env:Reason><env:Detail><e:Why xmlns:e="urn:e">none left</e:Why></env:Detail></env:Fault></env:Body></env:Envelope>"#;
        let out = String::from_utf8(convert(fault12.as_bytes(), Version::V11).unwrap()).unwrap();
        assert!(out.contains("<env:Fault><faultcode>env:Server</faultcode><faultstring>out of stock</faultstring><detail><e:Why xmlns:e=\"urn:e\">none left</e:Why></detail></env:Fault>"), "{out}");
        let back = String::from_utf8(convert(out.as_bytes(), Version::V12).unwrap()).unwrap();
        assert!(
            back.contains("<env:Code><env:Value>env:Receiver</env:Value></env:Code>"),
            "{back}"
        );
        assert!(back.contains(r#"<env:Text xml:lang="en">out of stock</env:Text>"#), "{back}");
    }

    #[test]
    fn what_is_not_a_soap_message_is_refused() {
        assert!(convert(b"<a><b></a>", Version::V12).is_err());
        assert!(convert(b"<plain/>", Version::V12).unwrap_err().contains("envelope"));
        let doctype = b"<!DOCTYPE x [<!ENTITY e 'x'>]><x/>";
        assert!(convert(doctype, Version::V12).unwrap_err().contains("document type"));
    }

    #[test]
    fn content_types_carry_the_action_across() {
        let (ct, action) =
            request_content_type("text/xml; charset=utf-8", Some("\"urn:calc/Add\""), Version::V12);
        assert_eq!(ct, r#"application/soap+xml; charset=utf-8; action="urn:calc/Add""#);
        assert_eq!(action, None);
        let (ct, action) = request_content_type(
            r#"application/soap+xml; charset=utf-8; action="urn:calc/Add""#,
            None,
            Version::V11,
        );
        assert_eq!(
            (ct.as_str(), action.as_deref()),
            ("text/xml; charset=utf-8", Some("\"urn:calc/Add\""))
        );
        assert_eq!(Version::of_content_type(b"Text/XML; charset=utf-8"), Some(Version::V11));
        assert_eq!(Version::of_content_type(b"application/soap+xml"), Some(Version::V12));
        assert_eq!(Version::of_content_type(b"application/json"), None);
    }
}
