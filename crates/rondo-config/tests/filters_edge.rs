//! `rondo check`-level errors of the edge filters (`cors`, `compress`): each bad option is
//! reported once, at its line and column, with its field path.

mod support;

/// A route with `filter` (one inline table's inside).
fn with(filter: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n[[route]]\nlistener = \"web\"\n\
         cluster = \"c\"\nfilters = [ {{ {filter} }} ]\n\n[cluster.c]\nmembers = [ {{ name = \"m\", address = \"127.0.0.1:9000\" }} ]\n"
    )
}

#[track_caller]
fn fails_once(filter: &str, field: &str, needle: &str, message: &str) {
    support::fails_once(&with(filter), field, needle, message);
}

#[test]
fn a_cors_filter_compiles() {
    let text = with(
        r#"cors = { allow_origins = ["https://app.example.com", "https://*.example.org"], allow_methods = ["GET", "POST"], allow_headers = ["Content-Type"], expose_headers = ["x-request-id"], allow_credentials = true, max_age_s = 600 }"#,
    );
    let config = support::ok(&text);
    let route = &config.view.routes[0];
    let rondo_core::traffic::TrafficFilter::Cors(c) = &route.filters[0] else { panic!() };
    assert_eq!(c.allow_headers, ["content-type"]);
    assert!(c.allows_origin("https://a.example.org"));
    assert_eq!(c.max_age_s, Some(600));
}

#[test]
fn cors_errors_name_the_option() {
    let f = "filters[0].cors";
    fails_once(
        r#"cors = { allow_origins = ["https://a.com/app"] }"#,
        &format!("route[0].{f}.allow_origins[0]"),
        "\"https://a.com/app\"",
        "is not an origin",
    );
    fails_once(
        r#"cors = { allow_origins = ["a.com"] }"#,
        &format!("route[0].{f}.allow_origins[0]"),
        "\"a.com\"",
        "scheme://host[:port]",
    );
    fails_once(
        r#"cors = { allow_origins = ["https://a.com", "*"], allow_credentials = true }"#,
        &format!("route[0].{f}.allow_origins[1]"),
        "\"*\"",
        "allow_credentials",
    );
    fails_once(
        r#"cors = { allow_origins = ["*"], allow_methods = ["GET", "FETCH"] }"#,
        &format!("route[0].{f}.allow_methods[1]"),
        "\"FETCH\"",
        "unknown method `FETCH`",
    );
    fails_once(
        r#"cors = { allow_origins = ["*"], allow_headers = ["x y"] }"#,
        &format!("route[0].{f}.allow_headers[0]"),
        "\"x y\"",
        "not a header name",
    );
    fails_once(
        r#"cors = { allow_origins = [] }"#,
        &format!("route[0].{f}.allow_origins"),
        "[]",
        "one origin at least",
    );
    fails_once(
        r#"cors = { allow_origins = ["*"], max_age_s = 100000 }"#,
        &format!("route[0].{f}.max_age_s"),
        "100000",
        "at most 86400",
    );
}

#[test]
fn a_compress_filter_compiles_with_defaults() {
    use rondo_core::traffic::{Compress, Encoding, TrafficFilter};
    let text = with(r#"compress = { types = ["text/*", "Application/JSON"], min_bytes = 2048 }"#);
    let config = support::ok(&text);
    let TrafficFilter::Compress(c) = &config.view.routes[0].filters[0] else { panic!() };
    assert_eq!(c.types, ["text/*", "application/json"]);
    assert_eq!(c.min_bytes, 2048);
    assert_eq!(c.level, Compress::DEFAULT_LEVEL);
    assert_eq!(c.encodings, [Encoding::Br, Encoding::Zstd, Encoding::Gzip]);
    let text = with(r#"compress = { level = 9, encodings = ["gzip", "zstd"] }"#);
    let config = support::ok(&text);
    let TrafficFilter::Compress(c) = &config.view.routes[0].filters[0] else { panic!() };
    assert_eq!(c.encodings, [Encoding::Gzip, Encoding::Zstd]);
    assert_eq!(c.types.len(), Compress::DEFAULT_TYPES.len());
    assert_eq!((c.level, c.min_bytes), (9, Compress::DEFAULT_MIN_BYTES));
}

#[test]
fn compress_errors_name_the_option() {
    let f = "route[0].filters[0].compress";
    fails_once(
        r#"compress = { types = ["text/*", "html"] }"#,
        &format!("{f}.types[1]"),
        "\"html\"",
        "is not a media type",
    );
    fails_once(
        r#"compress = { types = ["text/html; charset=utf-8"] }"#,
        &format!("{f}.types[0]"),
        "\"text/html; charset=utf-8\"",
        "no parameters",
    );
    fails_once(
        r#"compress = { types = ["*/*"] }"#,
        &format!("{f}.types[0]"),
        "\"*/*\"",
        "is not a media type",
    );
    fails_once(r#"compress = { types = [] }"#, &format!("{f}.types"), "[]", "one media type");
    fails_once(r#"compress = { level = 0 }"#, &format!("{f}.level"), "0 }", "between 1 and 9");
    fails_once(r#"compress = { level = 10 }"#, &format!("{f}.level"), "10", "between 1 and 9");
    fails_once(
        r#"compress = { encodings = ["gzip", "deflate"] }"#,
        &format!("{f}.encodings[1]"),
        "\"deflate\"",
        "unknown encoding `deflate`",
    );
    fails_once(
        r#"compress = { encodings = ["gzip", "gzip"] }"#,
        &format!("{f}.encodings[1]"),
        "\"gzip\"]",
        "named twice",
    );
    fails_once(r#"compress = { encodings = [] }"#, &format!("{f}.encodings"), "[]", "one encoding");
    fails_once(r#"compress = { gzip = true }"#, &format!("{f}.gzip"), "gzip", "unknown field");
}
