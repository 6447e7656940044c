//! Durations and sizes written with units (issue 38): `timeout = "5s"` beside `timeout_ms =
//! 5000`, `max_body_bytes = "1MiB"`; the same view either way, and every bad spelling an error
//! at its field's file, line and column.

mod support;

use std::path::Path;

use rondo_config::parse_str;
use support::{FILE, fails_once, ok};

/// `text` with every `NAME_ms = N` written as `NAME = "…"` (whole seconds as `"Ns"`, the rest
/// as `"Nms"`), every `max_age_s = N` as `max_age = "Ns"`, and every `NAME_bytes = N` as a
/// string with the largest binary unit that divides it.
fn with_units(text: &str) -> (String, usize) {
    let ms = regex::Regex::new(r"\b([a-z0-9_]+)_ms = ([0-9]+)").unwrap();
    let s = regex::Regex::new(r"\b(max_age)_s = ([0-9]+)").unwrap();
    let bytes = regex::Regex::new(r"\b([a-z0-9_]+_bytes) = ([0-9]+)").unwrap();
    let mut changed = 0;
    let text = ms.replace_all(text, |c: &regex::Captures| {
        changed += 1;
        let n: u64 = c[2].parse().unwrap();
        if n.is_multiple_of(1000) && n > 0 {
            format!("{} = \"{}s\"", &c[1], n / 1000)
        } else {
            format!("{} = \"{n}ms\"", &c[1])
        }
    });
    let text = s.replace_all(&text, |c: &regex::Captures| {
        changed += 1;
        format!("{} = \"{}s\"", &c[1], &c[2])
    });
    let text = bytes.replace_all(&text, |c: &regex::Captures| {
        changed += 1;
        let n: u64 = c[2].parse().unwrap();
        match n {
            0 => format!("{} = \"0B\"", &c[1]),
            n if n.is_multiple_of(1 << 20) => format!("{} = \"{}MiB\"", &c[1], n >> 20),
            n if n.is_multiple_of(1024) => format!("{} = \"{}KiB\"", &c[1], n >> 10),
            n => format!("{} = \"{n}B\"", &c[1]),
        }
    });
    (text.into_owned(), changed)
}

#[test]
fn every_example_compiles_to_the_same_view_with_units() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let mut fields = 0;
    for name in ["rondo.toml", "policy.toml", "queue.toml", "wcf.toml"] {
        let path = Path::new(dir).join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let (united, changed) = with_units(&text);
        assert_ne!(united, text, "{name} has no field to write with a unit");
        fields += changed;
        let before = parse_str(&text, &path, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = parse_str(&united, &path, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(format!("{before:?}"), format!("{after:?}"), "{name}:\n{united}");
    }
    assert!(fields >= 25, "only {fields} fields rewritten");
}

const BASE: &str = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n";
const ROUTE: &str = "\n[[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
                     [cluster.c]\nmembers = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n";

#[test]
fn a_unit_alias_gives_the_same_value_as_the_suffixed_field() {
    let text = format!(
        "{BASE}header_read_timeout = \"1m 30s\"\nmax_body_bytes = \"1.5MiB\"\n{ROUTE}\
         health = {{ interval = \"250ms\", timeout_ms = \"2s\" }}\n"
    );
    let c = ok(&text);
    let l = &c.listeners[0];
    assert_eq!(l.header_read_timeout, std::time::Duration::from_secs(90));
    assert_eq!(l.max_body_bytes, 1_572_864);
    let plain = ok(&format!(
        "{BASE}header_read_timeout_ms = 90000\nmax_body_bytes = 1572864\n{ROUTE}\
         health = {{ interval_ms = 250, timeout_ms = 2000 }}\n"
    ));
    assert_eq!(format!("{:?}", c.view), format!("{:?}", plain.view));
}

#[test]
fn a_number_without_a_unit_under_the_alias_is_an_error_at_the_value() {
    let text = format!("{ROUTE}health = {{ interval = 250 }}\n{BASE}");
    fails_once(&text, "cluster.c.health.interval", "250", "`interval` needs a unit");
    let text = format!("{BASE}header_read_timeout = 5\n{ROUTE}");
    fails_once(&text, "listener[0].header_read_timeout", "5\n", "write `header_read_timeout_ms`");
}

#[test]
fn a_bad_duration_or_size_is_an_error_at_the_value() {
    let text = format!("{BASE}header_read_timeout = \"5 fortnights\"\n{ROUTE}");
    fails_once(&text, "listener[0].header_read_timeout", "\"5 fortnights\"", "invalid duration");
    let text = format!("{BASE}header_read_timeout = \"10us\"\n{ROUTE}");
    fails_once(&text, "listener[0].header_read_timeout", "\"10us\"", "whole milliseconds");
    let text = format!("{BASE}max_body_bytes = \"64 KiBs\"\n{ROUTE}");
    fails_once(&text, "listener[0].max_body_bytes", "\"64 KiBs\"", "invalid size");
    // Out of range after the unit: the compiler's range check still applies.
    let text = format!("{BASE}max_header_bytes = \"8GiB\"\n{ROUTE}");
    let errors = support::errors(&text);
    assert!(errors.iter().any(|e| e.field == "listener[0].max_header_bytes"), "{errors:?}");
}

#[test]
fn the_alias_and_the_suffixed_field_together_are_a_duplicate() {
    let text =
        format!("{BASE}header_read_timeout = \"5s\"\nheader_read_timeout_ms = 5000\n{ROUTE}");
    let errors = support::errors(&text);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].message.contains("duplicate"), "{}", errors[0]);
    assert_eq!(errors[0].file, Path::new(FILE));
}
