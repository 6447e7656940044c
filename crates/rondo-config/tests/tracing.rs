//! `[tracing]` (issue 38 item 8): what compiles into a `TracingSpec`, every refusal located at
//! its file, line, column and field path, and the error of a build without the `otel` feature.

mod support;

use std::path::Path;
use std::time::Duration;

use rondo_config::{Features, TracingSpec, parse_str_with};
use support::{FILE, assert_error, errors, fails_once, ok, render};

fn with(tracing: &str) -> String {
    format!(
        "[tracing]\n{tracing}\n\n[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9101\" }}]\n"
    )
}

#[test]
fn tracing_compiles_with_its_defaults_and_its_settings() {
    let c = ok(&with(r#"otlp_endpoint = "http://127.0.0.1:4318""#));
    let want = TracingSpec {
        endpoint: "http://127.0.0.1:4318/v1/traces".into(),
        service_name: "rondo".into(),
        sample_ratio: 1.0,
        headers: Vec::new(),
        export_timeout: Duration::from_secs(10),
        max_queue: 2048,
    };
    assert_eq!(c.tracing, Some(want));

    let c = ok(&with(
        "otlp_endpoint = \"http://collector.local:4318/v1/traces/\"\nservice_name = \"edge\"\n\
         sample_ratio = 0.1\nheaders = { Authorization = \"Bearer x\" }\n\
         export_timeout = \"2s\"\nmax_queue = 100",
    ));
    let want = TracingSpec {
        endpoint: "http://collector.local:4318/v1/traces".into(),
        service_name: "edge".into(),
        sample_ratio: 0.1,
        headers: vec![("authorization".into(), "Bearer x".into())],
        export_timeout: Duration::from_secs(2),
        max_queue: 100,
    };
    assert_eq!(c.tracing, Some(want));
    let none = ok(&with("").replace("[tracing]\n", ""));
    assert_eq!(none.tracing, None);
}

#[test]
fn each_bad_setting_is_an_error_at_its_field() {
    let cases = [
        (
            r#"otlp_endpoint = "https://c:4318""#,
            "tracing.otlp_endpoint",
            "\"https",
            "speaks no tls",
        ),
        (r#"otlp_endpoint = "c:4318""#, "tracing.otlp_endpoint", "\"c:", "must be an http:// url"),
        (r#"otlp_endpoint = "http://""#, "tracing.otlp_endpoint", "\"http", "with a host"),
        (r#"otlp_endpoint = "http://u@c""#, "tracing.otlp_endpoint", "\"http", "no user"),
    ];
    for (text, field, needle, message) in cases {
        let text = with(text);
        let errs = errors(&text);
        assert_eq!(errs.len(), 1, "{}", render(&errs));
        let lower = errs[0].message.to_lowercase();
        assert!(lower.contains(message), "`{}` lacks `{message}`", errs[0]);
        assert_eq!(errs[0].field, field);
        assert_eq!((errs[0].line, errs[0].column), support::pos(&text, needle));
    }
    let base = "otlp_endpoint = \"http://127.0.0.1:4318\"\n";
    let one = |extra: &str, field: &str, needle: &str, message: &str| {
        fails_once(&with(&format!("{base}{extra}")), field, needle, message);
    };
    one("sample_ratio = 1.5", "tracing.sample_ratio", "1.5", "between 0.0 and 1.0");
    one("sample_ratio = -0.1", "tracing.sample_ratio", "-0.1", "between 0.0 and 1.0");
    one("service_name = \"\"", "tracing.service_name", "\"\"", "1 to 255 characters");
    one(
        "headers = { \"x y\" = \"v\" }",
        "tracing.headers.\"x y\"",
        "\"v\"",
        "not a header field name",
    );
    one(
        "headers = { content-type = \"v\" }",
        "tracing.headers.content-type",
        "\"v\"",
        "own to set",
    );
    one("headers = { k = \"a\\nb\" }", "tracing.headers.k", "\"a\\nb\"", "visible ASCII");
    one("export_timeout = \"0s\"", "tracing.export_timeout_ms", "\"0s\"", "greater than 0");
    one("export_timeout = \"6m\"", "tracing.export_timeout_ms", "\"6m\"", "at most 300000");
    one("max_queue = 0", "tracing.max_queue", "0\n", "between 1 and 1048576");
    one("sample = 1", "tracing.sample", "sample =", "unknown field");
}

#[test]
fn a_build_without_the_otel_feature_refuses_tracing_naming_the_feature() {
    let text = with(r#"otlp_endpoint = "http://127.0.0.1:4318""#);
    let without = Features { otel: false, ..Features::ALL };
    let errs = parse_str_with(&text, Path::new(FILE), 1, without).unwrap_err().errors;
    assert_eq!(errs.len(), 1, "{}", render(&errs));
    assert_error(&errs[0], &text, "tracing", "[tracing]", "`otel` cargo feature");
    assert!(errs[0].message.contains("--features otel"), "{}", errs[0]);
    assert!(parse_str_with(&text, Path::new(FILE), 1, Features::ALL).is_ok());
}
