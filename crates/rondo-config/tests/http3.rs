//! `http3 = true` and its limits (issue 40): only on a TLS `http` listener, limits only with
//! it, each error at its field's file, line and column.

mod support;

use std::time::Duration;

use rondo_config::Http3Spec;
use support::{fails_once, fails_with, ok};

/// A listener `web` with `extra` keys (and, when `tls`, the example certificate), one route.
fn config(extra: &str, tls: bool) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tls");
    let tls = if tls {
        format!(
            "tls = {{ certs = [{{ cert = \"{dir}/localhost.pem\", key = \"{dir}/localhost.key\" }}] }}\n"
        )
    } else {
        String::new()
    };
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n{tls}{extra}\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"a\", address = \"127.0.0.1:9\" }}]\n"
    )
}

#[test]
fn http3_is_off_unless_asked_and_has_defaults_when_on() {
    assert_eq!(ok(&config("", true)).listeners[0].http3, None);
    let on = ok(&config("http3 = true", true)).listeners[0].http3;
    assert_eq!(
        on,
        Some(Http3Spec {
            max_streams: Http3Spec::DEFAULT_MAX_STREAMS,
            idle_timeout: Http3Spec::DEFAULT_IDLE_TIMEOUT,
            retry_above: Http3Spec::DEFAULT_RETRY_ABOVE,
            zero_rtt: false,
        })
    );
    let set =
        "http3 = true\nhttp3_max_streams = 7\nhttp3_idle_timeout_ms = 1500\nhttp3_retry_above = 0";
    let spec = ok(&config(set, true)).listeners[0].http3.unwrap();
    assert_eq!(
        (spec.max_streams, spec.idle_timeout, spec.retry_above),
        (7, Duration::from_millis(1500), 0)
    );
}

#[test]
fn http3_without_tls_is_an_error_at_the_field() {
    fails_once(&config("http3 = true", false), "listener[0].http3", "true", "http3 needs `tls`");
}

#[test]
fn http3_on_a_tcp_listener_is_an_error_at_the_field() {
    let text = config("protocol = \"tcp\"\nhttp3 = true", true).replace(
        "[[route]]\nlistener = \"web\"\ncluster = \"c\"",
        "[[route]]\nlistener = \"web\"\ncluster = \"c\"\nmatch = {}",
    );
    fails_with(&text, "listener[0].http3", "true", "only http listeners serve HTTP/3");
}

#[test]
fn http3_limits_need_http3_and_valid_values() {
    fails_once(
        &config("http3_max_streams = 10", true),
        "listener[0].http3_max_streams",
        "10",
        "http3_max_streams needs `http3 = true`",
    );
    fails_once(
        &config("http3 = true\nhttp3_max_streams = 0", true),
        "listener[0].http3_max_streams",
        "0\n",
        "must be greater than 0",
    );
    fails_once(
        &config("http3 = true\nhttp3_idle_timeout_ms = 0", true),
        "listener[0].http3_idle_timeout_ms",
        "0\n",
        "must be greater than 0",
    );
}

#[test]
fn http3_0rtt_needs_http3_and_no_client_certificates() {
    assert!(
        ok(&config("http3 = true\nhttp3_0rtt = true", true)).listeners[0].http3.unwrap().zero_rtt
    );
    fails_once(
        &config("http3_0rtt = true", true),
        "listener[0].http3_0rtt",
        "true",
        "http3_0rtt needs `http3 = true`",
    );
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tls");
    let text = config("http3 = true\nhttp3_0rtt = true", true).replace(
        "localhost.key\" }] }",
        &format!(
            "localhost.key\" }}], client_ca = \"{dir}/ca.pem\", client_auth = \"optional\" }}"
        ),
    );
    fails_once(
        &text,
        "listener[0].http3_0rtt",
        "$true",
        "before the client's certificate is checked",
    );
}
