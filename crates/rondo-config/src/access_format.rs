//! What an access log line is made of beyond the default: the fields a listener's `access_log`
//! can name ([`AccessField`], one set of names for `fields = [...]` and for a format template),
//! and a template (`format = "{client_ip} {method} {path} {status}"`) parsed once at load into
//! [`Piece`]s, an unknown name reported with the nearest known one.

/// A field of an access log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessField {
    /// When the request arrived, UTC, milliseconds.
    Time,
    /// The client's address and port.
    Client,
    /// The client's address without the port.
    ClientIp,
    /// The request method.
    Method,
    /// The `Host` (HTTP/1) or `:authority` (HTTP/2, HTTP/3).
    Host,
    /// The path, without the query.
    Path,
    /// The query string, without the `?`.
    Query,
    /// `HTTP/1.1`, `HTTP/2`, ...
    Protocol,
    /// The status the client got.
    Status,
    /// The route that matched.
    Route,
    /// The cluster of the member that answered (the route's, for the router's own answer).
    Cluster,
    /// The member that answered (the last tried, for the router's own answer).
    Member,
    /// That member's address.
    MemberAddress,
    /// Request body bytes passed to the member.
    BytesIn,
    /// Response body bytes sent to the client.
    BytesOut,
    /// From the request's arrival to the end of its response, ms.
    DurationMs,
    /// Members tried.
    Tries,
    /// Each try's time, ms, in order (a failed try's until it failed, the answering one's
    /// until its response head).
    TryMs,
    /// From the request's arrival to the answering member's response head, ms.
    FirstByteMs,
    /// The time the answering try took to open a new connection to its member, ms (absent
    /// when it reused one).
    ConnectMs,
    /// Why the member was chosen.
    Reason,
    /// What failed, for the router's own answer.
    Error,
    /// The request id: the `request_id` filter's, else the request's `X-Request-Id`.
    RequestId,
    /// The request's `traceparent`.
    Traceparent,
    /// The request's `User-Agent`.
    UserAgent,
    /// The request's `Referer`.
    Referer,
    /// The TLS version the client negotiated (`TLSv1.3`).
    TlsVersion,
    /// The server name the client asked for in its TLS hello.
    Sni,
}

impl AccessField {
    /// Every field, in the order the reference lists them.
    pub const ALL: [AccessField; 28] = [
        AccessField::Time,
        AccessField::Client,
        AccessField::ClientIp,
        AccessField::Method,
        AccessField::Host,
        AccessField::Path,
        AccessField::Query,
        AccessField::Protocol,
        AccessField::Status,
        AccessField::Route,
        AccessField::Cluster,
        AccessField::Member,
        AccessField::MemberAddress,
        AccessField::BytesIn,
        AccessField::BytesOut,
        AccessField::DurationMs,
        AccessField::Tries,
        AccessField::TryMs,
        AccessField::FirstByteMs,
        AccessField::ConnectMs,
        AccessField::Reason,
        AccessField::Error,
        AccessField::RequestId,
        AccessField::Traceparent,
        AccessField::UserAgent,
        AccessField::Referer,
        AccessField::TlsVersion,
        AccessField::Sni,
    ];

    /// The name in the configuration, the text format's key and the JSON key.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessField::Time => "time",
            AccessField::Client => "client",
            AccessField::ClientIp => "client_ip",
            AccessField::Method => "method",
            AccessField::Host => "host",
            AccessField::Path => "path",
            AccessField::Query => "query",
            AccessField::Protocol => "protocol",
            AccessField::Status => "status",
            AccessField::Route => "route",
            AccessField::Cluster => "cluster",
            AccessField::Member => "member",
            AccessField::MemberAddress => "member_address",
            AccessField::BytesIn => "bytes_in",
            AccessField::BytesOut => "bytes_out",
            AccessField::DurationMs => "duration_ms",
            AccessField::Tries => "tries",
            AccessField::TryMs => "try_ms",
            AccessField::FirstByteMs => "first_byte_ms",
            AccessField::ConnectMs => "connect_ms",
            AccessField::Reason => "reason",
            AccessField::Error => "error",
            AccessField::RequestId => "request_id",
            AccessField::Traceparent => "traceparent",
            AccessField::UserAgent => "user_agent",
            AccessField::Referer => "referer",
            AccessField::TlsVersion => "tls_version",
            AccessField::Sni => "sni",
        }
    }

    /// The field called `name`, or an error naming the nearest field when one is close.
    pub fn parse(name: &str) -> Result<AccessField, String> {
        if let Some(f) = AccessField::ALL.into_iter().find(|f| f.as_str() == name) {
            return Ok(f);
        }
        let nearest = AccessField::ALL
            .into_iter()
            .map(|f| (strsim::damerau_levenshtein(name, f.as_str()), f.as_str()))
            .filter(|(d, known)| *d <= (known.len() / 3).max(1))
            .min();
        Err(match nearest {
            Some((_, known)) => {
                format!("unknown access log field `{name}`, did you mean `{known}`?")
            }
            None => format!(
                "unknown access log field `{name}`, expected one of {}",
                AccessField::ALL.map(|f| format!("`{}`", f.as_str())).join(", ")
            ),
        })
    }
}

/// A part of a template: text as written, or a field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Written as it is.
    Text(String),
    /// The field's value (`-` when absent).
    Field(AccessField),
}

/// Parses a template: `{name}` is a field, `{{` and `}}` are braces; at least one field.
pub fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        text.push_str(&rest[..i]);
        let (brace, after) = (rest.as_bytes()[i], &rest[i + 1..]);
        if after.as_bytes().first() == Some(&brace) {
            text.push(brace as char);
            rest = &after[1..];
            continue;
        }
        if brace == b'}' {
            return Err("a lone `}` in the access log format (write `}}` for one)".to_owned());
        }
        let Some(end) = after.find('}') else {
            return Err("an unclosed `{` in the access log format (write `{{` for one)".to_owned());
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Field(AccessField::parse(after[..end].trim())?));
        rest = &after[end + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    if !pieces.iter().any(|p| matches!(p, Piece::Field(_))) {
        return Err("the access log format names no field: write `text`, `json` or a template \
                    with `{field}`s"
            .to_owned());
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_fields_text_and_escaped_braces() {
        let p = parse_template("{client_ip} {{x}} {status}ms").expect("valid");
        assert_eq!(
            p,
            [
                Piece::Field(AccessField::ClientIp),
                Piece::Text(" {x} ".into()),
                Piece::Field(AccessField::Status),
                Piece::Text("ms".into()),
            ]
        );
        for f in AccessField::ALL {
            assert_eq!(AccessField::parse(f.as_str()), Ok(f));
        }
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        let e = parse_template("{hots} {status}").expect_err("unknown");
        assert_eq!(e, "unknown access log field `hots`, did you mean `host`?");
        assert!(parse_template("{status").expect_err("open").contains("unclosed `{`"));
        assert!(parse_template("a } b {status}").expect_err("lone").contains("lone `}`"));
        assert!(parse_template("plain").expect_err("none").contains("names no field"));
        let far = AccessField::parse("zzzzzzzz").expect_err("far");
        assert!(far.contains("expected one of `time`"), "{far}");
    }
}
