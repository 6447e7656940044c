//! Durations and sizes written with units. Every `_ms` field also takes a string with a unit
//! (`"250ms"`, `"30s"`, `"1m"`, `"1h 30m"`, through humantime) and has an alias without the
//! suffix (`timeout = "5s"` beside `timeout_ms = 5000`); `max_age_s` likewise (`max_age`). Every
//! `_bytes` field takes a string with a unit (`"64KiB"`, `"1.5MB"`, through bytesize: `KiB` is
//! 1,024 bytes and `KB` or `k` 1,000). The alias without a unit suffix must be given a unit:
//! `timeout = 5` is an error ([`unitless`]), since nobody can tell whether it meant 5 ms or 5 s.
//! The values reach the compiler as the integers they always were, so its range checks stay.

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, Visitor};

use crate::path::{FieldPath, SUFFIXES, Seg, integers};

/// What a field holds, for the messages.
#[derive(Clone, Copy)]
enum Unit {
    Millis,
    Seconds,
    Bytes,
}

struct UnitVisitor(Unit);

impl Visitor<'_> for UnitVisitor {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Unit::Millis => "milliseconds, or a duration with a unit such as \"250ms\" or \"30s\"",
            Unit::Seconds => "seconds, or a duration with a unit such as \"10m\"",
            Unit::Bytes => "bytes, or a size with a unit such as \"64KiB\"",
        })
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v).map(Some).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        parse(self.0, s).map(Some).map_err(E::custom)
    }
}

/// The value of `text` in the field's unit.
fn parse(unit: Unit, text: &str) -> Result<u64, String> {
    let text = text.trim();
    match unit {
        Unit::Bytes => text.parse::<bytesize::ByteSize>().map(|b| b.as_u64()).map_err(|_| {
            format!("invalid size {text:?}: write bytes and a unit, e.g. \"64KiB\" or \"1MB\"")
        }),
        Unit::Millis | Unit::Seconds => {
            let d = humantime::parse_duration(text).map_err(|e| {
                format!("invalid duration {text:?} ({e}): write a number and a unit, e.g. \"250ms\", \"30s\" or \"1m\"")
            })?;
            let (whole, name) = match unit {
                Unit::Millis => (d.as_millis(), "millisecond"),
                _ => (u128::from(d.as_secs()), "second"),
            };
            let exact = match unit {
                Unit::Millis => d.subsec_nanos() % 1_000_000 == 0,
                _ => d.subsec_nanos() == 0,
            };
            if !exact {
                return Err(format!("invalid duration {text:?}: this field counts whole {name}s"));
            }
            u64::try_from(whole).map_err(|_| format!("invalid duration {text:?}: too long"))
        }
    }
}

fn with_unit<'de, D: Deserializer<'de>>(d: D, unit: Unit) -> Result<Option<u64>, D::Error> {
    // `deserialize_u64` reaches `visit_str` for a TOML string as well (TOML's deserializer
    // forwards every primitive to `deserialize_any`), and answers the schema's capture with a
    // number, which keeps `schema::fields` walking.
    d.deserialize_u64(UnitVisitor(unit))
}

/// A `_ms` field: milliseconds, or a duration string.
pub(crate) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    with_unit(d, Unit::Millis)
}

/// A `_s` field: seconds, or a duration string of whole seconds.
pub(crate) fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    with_unit(d, Unit::Seconds)
}

/// A `_bytes` field: bytes, or a size string.
pub(crate) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    with_unit(d, Unit::Bytes)
}

/// The integers written under a unit-less alias (`timeout = 5` for `timeout_ms`): their paths,
/// spans, and messages. `schema` is [`crate::schema::fields`].
pub(crate) fn unitless(
    doc: &toml_edit::Table,
    schema: &[String],
) -> Vec<(FieldPath, Range<usize>, String)> {
    let patterns: Vec<(Vec<&str>, &str)> = schema
        .iter()
        .filter_map(|f| {
            let (base, suffix) = SUFFIXES.iter().find_map(|s| Some((f.strip_suffix(s)?, *s)))?;
            Some((base.split('.').collect(), suffix))
        })
        .collect();
    integers(doc)
        .into_iter()
        .filter_map(|(path, span)| {
            let keys: Vec<&str> = path
                .0
                .iter()
                .filter_map(|s| match s {
                    Seg::Key(k) => Some(k.as_str()),
                    Seg::Index(_) => None,
                })
                .collect();
            let (_, suffix) = patterns.iter().find(|(p, _)| {
                p.len() == keys.len() && p.iter().zip(&keys).all(|(p, k)| p == k || *p == "NAME")
            })?;
            let name = keys.last()?;
            let message = format!(
                "`{name}` needs a unit, e.g. \"{}\" (or write `{name}{suffix}` for a bare number)",
                if *suffix == "_ms" { "250ms" } else { "30s" }
            );
            Some((path, span, message))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse_to_the_fields_unit() {
        assert_eq!(parse(Unit::Millis, "250ms"), Ok(250));
        assert_eq!(parse(Unit::Millis, "30s"), Ok(30_000));
        assert_eq!(parse(Unit::Millis, "1m"), Ok(60_000));
        assert_eq!(parse(Unit::Millis, "1h 30m"), Ok(5_400_000));
        assert_eq!(parse(Unit::Seconds, "10m"), Ok(600));
        assert_eq!(parse(Unit::Bytes, "64KiB"), Ok(65_536));
        assert_eq!(parse(Unit::Bytes, "1MB"), Ok(1_000_000));
        assert_eq!(parse(Unit::Bytes, "1.5 MiB"), Ok(1_572_864));
        assert_eq!(parse(Unit::Bytes, "512"), Ok(512));
    }

    #[test]
    fn bad_and_inexact_values_are_errors() {
        assert!(parse(Unit::Millis, "30").unwrap_err().contains("invalid duration \"30\""));
        assert!(parse(Unit::Millis, "3x").is_err());
        assert!(parse(Unit::Millis, "").is_err());
        assert!(parse(Unit::Millis, "500us").unwrap_err().contains("whole milliseconds"));
        assert!(parse(Unit::Seconds, "1500ms").unwrap_err().contains("whole seconds"));
        assert!(parse(Unit::Bytes, "64 parsecs").unwrap_err().contains("invalid size"));
        assert!(parse(Unit::Bytes, "-1KiB").is_err());
    }
}
