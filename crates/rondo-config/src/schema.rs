//! Every field the configuration file accepts, read from the schema itself ([`fields`]): a
//! serde `Deserializer` that answers `deserialize_struct` by recording the `fields` list
//! serde-derive passes it and then feeding the struct every one of those fields, each with a
//! deserializer of its own one level down. Options are present, sequences hold one element and
//! maps one entry (keyed `NAME`), so every nested table is reached. The reference test
//! (`docs/config.md` has a line for every field) relies on it, so a field added to `raw.rs` or
//! `raw/` without documentation fails a test.

use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};

use crate::raw::RawConfig;

/// Every field path the schema accepts, in schema order: `router.group`, `listener.name`,
/// `route.match.host`, `cluster.NAME.members.weight`, ... Arrays (of tables or inline tables)
/// add nothing to the path; a map's key is `NAME`. A field holding a table is listed too
/// (`cluster.NAME.health`), before its own fields.
pub fn fields() -> Vec<String> {
    let mut out = Vec::new();
    // Cannot fail: every value the capture hands out has the type asked for.
    let _ = RawConfig::deserialize(Capture { path: String::new(), out: &mut out });
    // A cluster's `members` entry is a table or a `[member.NAME]`'s name, an untyped value the
    // walk reads as a string: its table's fields go in after it.
    let mut inline = Vec::new();
    let members = "cluster.NAME.members";
    let _ = crate::raw::RawMember::deserialize(Capture { path: members.into(), out: &mut inline });
    if let Some(at) = out.iter().position(|f| f == members) {
        out.splice(at + 1..at + 1, inline);
    }
    out
}

/// The capturing deserializer for the value at `path`.
struct Capture<'a> {
    path: String,
    out: &'a mut Vec<String>,
}

/// An error that never happens in practice (serde needs a type).
#[derive(Debug)]
struct Never(String);

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Never {}

impl de::Error for Never {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Never(msg.to_string())
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

impl<'de> Deserializer<'de> for Capture<'_> {
    type Error = Never;

    /// Untyped values (`OneOrMany`): a string.
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_str("")
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_bool(false)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_u64(0)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_i64(0)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_f64(0.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_string(String::new())
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        v.visit_seq(OneElement { inner: Some(self) })
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Never> {
        let path = join(&self.path, "NAME");
        v.visit_map(Entries {
            keys: vec!["NAME"],
            next: 0,
            out: self.out,
            path_of: Box::new(move |_| path.clone()),
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Never> {
        let base = self.path.clone();
        // serde lists aliases among the fields: the unit-less ones (`timeout` for `timeout_ms`,
        // see `units`) name the same field, so they are left out.
        let alias = |f: &str| {
            crate::path::SUFFIXES.iter().any(|s| fields.contains(&format!("{f}{s}").as_str()))
        };
        v.visit_map(Entries {
            keys: fields.iter().copied().filter(|f| !alias(f)).collect(),
            next: 0,
            out: self.out,
            path_of: Box::new(move |key| join(&base, key)),
        })
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u128 f32 char bytes byte_buf unit unit_struct
        newtype_struct tuple tuple_struct enum identifier ignored_any
    }
}

/// A sequence of exactly one element.
struct OneElement<'a> {
    inner: Option<Capture<'a>>,
}

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Never;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Never> {
        match self.inner.take() {
            Some(c) => seed.deserialize(c).map(Some),
            None => Ok(None),
        }
    }
}

/// A struct's fields (or a map's one entry), each recorded at its path as its value is asked
/// for.
struct Entries<'a> {
    keys: Vec<&'static str>,
    next: usize,
    out: &'a mut Vec<String>,
    path_of: Box<dyn Fn(&str) -> String>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = Never;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Never> {
        match self.keys.get(self.next) {
            Some(key) => seed.deserialize((*key).into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Never> {
        let key = self.keys[self.next];
        self.next += 1;
        let path = (self.path_of)(key);
        // Map entries (`NAME`) are not fields; struct fields are.
        if key != "NAME" {
            self.out.push(path.clone());
        }
        seed.deserialize(Capture { path, out: self.out })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_reach_every_nesting() {
        let f = super::fields();
        for want in [
            "router.group",
            "listener.name",
            "route.match",
            "route.match.host",
            "route.match.headers",
            "cluster",
            "cluster.NAME.members.weight",
            "cluster.NAME.health.expect_status",
            "cluster.NAME.ewma.decay_ms",
            "naming.etcd_endpoints",
        ] {
            assert!(f.iter().any(|x| x == want), "{want} missing from {f:?}");
        }
        // `headers` is a map of header names, not a table of fields.
        assert!(!f.iter().any(|x| x.starts_with("route.match.headers.")), "{f:?}");
    }
}
