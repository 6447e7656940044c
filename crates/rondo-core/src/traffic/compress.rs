//! `compress`: which responses the router compresses and how, and the pure choices over them:
//! the encoding a request's `Accept-Encoding` takes (RFC 9110 section 12.5.3), and whether a
//! media type is one of the configured ones.

/// A content coding the router can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `gzip` (RFC 1952).
    Gzip,
    /// `br` (RFC 7932).
    Br,
    /// `zstd` (RFC 8878).
    Zstd,
}

impl Encoding {
    /// Every encoding with its name, in the default preference order.
    pub const ALL: [Encoding; 3] = [Encoding::Br, Encoding::Zstd, Encoding::Gzip];

    /// The name in `Accept-Encoding` and `Content-Encoding`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Br => "br",
            Encoding::Zstd => "zstd",
        }
    }

    /// The encoding of a name (`x-gzip` is gzip, RFC 9110 section 8.4.1.3); any case.
    pub fn from_name(name: &str) -> Option<Encoding> {
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "gzip" | "x-gzip" => Some(Encoding::Gzip),
            "br" => Some(Encoding::Br),
            "zstd" => Some(Encoding::Zstd),
            _ => None,
        }
    }
}

/// `compress`: responses of these types, at least this long, compressed at this level in the
/// encoding the client prefers among `encodings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compress {
    /// Media types (lower case, no parameters); `text/*` takes every subtype.
    pub types: Vec<String>,
    /// Bodies a `Content-Length` says are shorter stay as they are.
    pub min_bytes: u64,
    /// 1 (fastest) to 9 (smallest), on each encoder's own scale.
    pub level: u32,
    /// The router's preference, best first, among encodings the client rates equally.
    pub encodings: Vec<Encoding>,
}

impl Compress {
    /// The default `types`.
    pub const DEFAULT_TYPES: [&'static str; 5] = [
        "text/*",
        "application/json",
        "application/javascript",
        "application/xml",
        "image/svg+xml",
    ];
    /// The default `min_bytes`.
    pub const DEFAULT_MIN_BYTES: u64 = 1024;
    /// The default `level`.
    pub const DEFAULT_LEVEL: u32 = 6;

    /// Whether a response whose `Content-Type` is `content_type` is one to compress.
    pub fn compresses_type(&self, content_type: &str) -> bool {
        let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        self.types.iter().any(|t| match t.strip_suffix("/*") {
            Some(top) => essence.strip_prefix(top).is_some_and(|rest| rest.starts_with('/')),
            None => *t == essence,
        })
    }

    /// The encoding for a request with these `Accept-Encoding` values: the highest rated of
    /// `encodings` (`q=0` refuses one; `*` rates those not named), ties to the earlier in
    /// `encodings`; `None` without the field or when nothing acceptable is left.
    pub fn choose<'a>(&self, accept: impl IntoIterator<Item = &'a str>) -> Option<Encoding> {
        let mut named: Vec<(Option<Encoding>, u16)> = Vec::new();
        let mut any = false;
        for item in accept.into_iter().flat_map(|v| v.split(',')) {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            if coding.is_empty() {
                continue;
            }
            any = true;
            let q = parts
                .filter_map(|p| p.trim().split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1000), |(_, v)| qvalue(v.trim()));
            let Some(q) = q else { continue };
            let e = if coding == "*" { None } else { Encoding::from_name(coding) };
            if coding == "*" || e.is_some() {
                named.push((e, q));
            }
        }
        if !any {
            return None;
        }
        let rate = |e: Encoding| {
            named
                .iter()
                .find(|(n, _)| *n == Some(e))
                .or_else(|| named.iter().find(|(n, _)| n.is_none()))
                .map(|(_, q)| *q)
        };
        let mut best: Option<(Encoding, u16)> = None;
        for &e in &self.encodings {
            if let Some(q) = rate(e).filter(|q| *q > 0)
                && best.is_none_or(|(_, b)| q > b)
            {
                best = Some((e, q));
            }
        }
        best.map(|(e, _)| e)
    }
}

/// A qvalue in thousandths (`0`, `0.5`, `1.000`); `None` when malformed.
fn qvalue(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = match int {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    let thousandths = format!("{frac:0<3}").parse::<u16>().ok()?;
    let q = whole + thousandths;
    (q <= 1000).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(encodings: &[Encoding]) -> Compress {
        Compress {
            types: vec!["text/*".into(), "application/json".into()],
            min_bytes: 0,
            level: 6,
            encodings: encodings.to_vec(),
        }
    }

    #[test]
    fn the_client_rates_and_the_router_breaks_ties() {
        use Encoding::*;
        let s = spec(&Encoding::ALL);
        let c = |a: &str| s.choose([a]);
        assert_eq!(c("gzip, deflate, br, zstd"), Some(Br), "a tie: the router's order");
        assert_eq!(c("gzip;q=1, br;q=0.5"), Some(Gzip));
        assert_eq!(c("br;q=0, gzip"), Some(Gzip), "q=0 refuses");
        assert_eq!(c("br;q=0, zstd;q=0, gzip;q=0"), None);
        assert_eq!(c("*"), Some(Br));
        assert_eq!(c("*;q=0, gzip"), Some(Gzip));
        assert_eq!(c("identity"), None);
        assert_eq!(c("deflate"), None);
        assert_eq!(c("GZIP"), Some(Gzip));
        assert_eq!(c("x-gzip"), Some(Gzip));
        assert_eq!(c("gzip;q=2, br;q=0.1"), Some(Br), "a malformed q leaves the coding out");
        assert_eq!(s.choose([]), None, "no Accept-Encoding: no coding");
        assert_eq!(s.choose(["gzip;q=0.3", "zstd;q=0.4"]), Some(Zstd), "fields join");
        let gzip_first = spec(&[Gzip, Zstd]);
        assert_eq!(gzip_first.choose(["zstd, br, gzip"]), Some(Gzip));
        assert_eq!(gzip_first.choose(["br"]), None, "br is not configured");
    }

    #[test]
    fn types_match_by_essence_and_wildcard() {
        let s = spec(&Encoding::ALL);
        assert!(s.compresses_type("text/html; charset=utf-8"));
        assert!(s.compresses_type("Text/Plain"));
        assert!(s.compresses_type("application/json"));
        assert!(!s.compresses_type("application/jsonx"));
        assert!(!s.compresses_type("textual/html"));
        assert!(!s.compresses_type("image/png"));
        assert!(!s.compresses_type(""));
    }

    #[test]
    fn qvalues_parse_strictly() {
        assert_eq!(qvalue("1"), Some(1000));
        assert_eq!(qvalue("0.5"), Some(500));
        assert_eq!(qvalue("0.001"), Some(1));
        assert_eq!(qvalue("1.000"), Some(1000));
        assert_eq!(qvalue("1.5"), None);
        assert_eq!(qvalue("0.0001"), None);
        assert_eq!(qvalue("x"), None);
    }
}
