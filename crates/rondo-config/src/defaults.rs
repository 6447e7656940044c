//! `[defaults]` (SGD's global defaults, PKUAS's server-wide algorithm): merged into every
//! `[cluster.NAME]` and `[[route]]` of the file, field by field, before they are compiled, so a
//! cluster compiles exactly as if it had written the inherited fields itself.
//!
//! A field the cluster or route sets wins, under any unit spelling (`connect_timeout` and
//! `connect_timeout_ms` are one field); a table both set (`health`, `retry`...) is merged the
//! same way one level down; an array (`retry_on`, `filters`) is taken whole. The admin API's
//! defaults ([`DefaultsOverride`]) are merged over the file's the same way, so one view swap
//! changes every cluster that did not set the field. The keys of [`ROUTE_KEYS`] go to routes,
//! the others to clusters. Clusters created by registrations carry their own declared policy
//! and inherit nothing.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use toml::{Table, Value};

use crate::path::{FieldPath, SUFFIXES, span_exact};
use crate::raw::{RawConfig, RawDefaults};
use crate::{ConfigError, ConfigErrors};

/// The keys of `[defaults]` that are routes' fields (without their unit suffix).
pub(crate) const ROUTE_KEYS: [&str; 3] = ["idle_timeout", "request_timeout", "filters"];

/// A field's name without its unit suffix: the name under which a file may write it either way.
fn canonical(key: &str) -> &str {
    SUFFIXES.iter().find_map(|s| key.strip_suffix(s)).unwrap_or(key)
}

/// Merges `defaults` into `into`, field by field: a key `into` has (under any spelling) wins,
/// a table both have is merged one level down.
fn merge(into: &mut Table, defaults: &Table) {
    for (k, v) in defaults {
        let own = into.keys().find(|x| canonical(x) == canonical(k)).cloned();
        match own {
            None => {
                into.insert(k.clone(), v.clone());
            }
            Some(own) => {
                if let (Some(Value::Table(t)), Value::Table(d)) = (into.get_mut(&own), v) {
                    merge(t, d);
                }
            }
        }
    }
}

/// The defaults set through the admin API, merged over the file's `[defaults]`: checked like
/// the file's, kept by the reloader across reloads until removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DefaultsOverride(Table);

impl DefaultsOverride {
    /// Reads a `[defaults]` body (`algorithm = "p2c-ewma"`, `[health] interval = "2s"`...):
    /// every problem is an error at its line in `text`, which `origin` names.
    pub fn parse(text: &str, origin: &Path) -> Result<DefaultsOverride, ConfigErrors> {
        let fail = |e: toml::de::Error| {
            let (line, column) = match e.span() {
                Some(s) => crate::error::line_column(text, s.start),
                None => (1, 1),
            };
            let error = ConfigError {
                file: origin.to_path_buf(),
                line,
                column,
                field: "defaults".to_owned(),
                message: e.message().trim_end_matches('.').to_owned(),
            };
            ConfigErrors { errors: vec![error] }
        };
        toml::from_str::<RawDefaults>(text).map_err(fail)?;
        toml::from_str::<Table>(text).map(DefaultsOverride).map_err(fail)
    }

    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for DefaultsOverride {
    /// As TOML, the way it was given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&toml::to_string(&self.0).unwrap_or_default())
    }
}

/// The file's `[defaults]` with `over` merged over it.
fn defaults_of(doc: &mut Table, over: Option<&DefaultsOverride>) -> Table {
    let mut defaults = match doc.remove("defaults") {
        Some(Value::Table(t)) => t,
        _ => Table::new(),
    };
    if let Some(over) = over {
        let mut o = over.0.clone();
        merge(&mut o, &defaults);
        defaults = o;
    }
    defaults
}

/// `text` (already read once as a [`RawConfig`], so it fits the schema) read again with its
/// defaults, and `over`, merged into every cluster and route.
pub(crate) fn apply(text: &str, over: Option<&DefaultsOverride>) -> Result<RawConfig, String> {
    let mut doc: Table = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    let defaults = defaults_of(&mut doc, over);
    let (route, cluster): (Table, Table) =
        defaults.into_iter().partition(|(k, _)| ROUTE_KEYS.contains(&canonical(k)));
    if let Some(Value::Table(clusters)) = doc.get_mut("cluster") {
        for (_, c) in clusters.iter_mut() {
            if let Value::Table(c) = c {
                merge(c, &cluster);
            }
        }
    }
    if let Some(Value::Array(routes)) = doc.get_mut("route") {
        for r in routes {
            if let Value::Table(r) = r {
                merge(r, &route);
            }
        }
    }
    RawConfig::deserialize(Value::Table(doc)).map_err(|e| e.message().trim_end_matches('.').into())
}

/// Where a problem the compiler found at `path` should be shown: at the default a cluster or
/// route inherited, when the field is not in the cluster or route itself but in `[defaults]`.
pub(crate) fn inherited_from(doc: &toml_edit::Table, path: &FieldPath) -> Option<FieldPath> {
    use crate::path::Seg;
    let rest = match path.0.as_slice() {
        [Seg::Key(c), Seg::Key(_), rest @ ..] if c == "cluster" => rest,
        [Seg::Key(r), Seg::Index(_), rest @ ..] if r == "route" => rest,
        _ => return None,
    };
    if rest.is_empty() || span_exact(doc, path).is_some() {
        return None;
    }
    let mut d = FieldPath::root().key("defaults");
    d.0.extend(rest.iter().cloned());
    span_exact(doc, &d).map(|_| d)
}

/// Where one field of a cluster in force comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The cluster's own table, at this line of this file.
    Cluster(std::path::PathBuf, usize),
    /// The file's `[defaults]`, at this line of this file.
    Defaults(std::path::PathBuf, usize),
    /// The defaults set through the admin API.
    Admin,
    /// Set nowhere: the built-in default.
    BuiltIn,
}

/// One field of a cluster as it is in force ([`crate::effective`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveField {
    /// The field, as under `[cluster.NAME]` (`health.interval`).
    pub field: String,
    /// The value as TOML; empty for a built-in default.
    pub value: String,
    /// Where it comes from.
    pub origin: Origin,
}

/// Every leaf field of `table` (dotted, `health.interval`) with its value as TOML.
fn leaves(table: &Table) -> Vec<(String, String)> {
    fn walk(table: &Table, prefix: &str, out: &mut Vec<(String, String)>) {
        for (k, v) in table {
            let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                Value::Table(t) => walk(t, &name, out),
                v => out.push((name, v.to_string())),
            }
        }
    }
    let mut out = Vec::new();
    walk(table, "", &mut out);
    out
}

/// The fields of cluster `name` in force, each with its origin: set by the cluster, inherited
/// from `[defaults]` or the admin API, or built in (every other field `[defaults]` could set).
pub(crate) fn effective(
    sources: &crate::include::Sources,
    name: &str,
    over: Option<&DefaultsOverride>,
) -> Result<Vec<EffectiveField>, String> {
    let text = sources.text.as_str();
    let mut doc: Table = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    let spans = toml_edit::Document::parse(text).map_err(|e| e.to_string())?;
    let defaults = defaults_of(&mut doc, over);
    let own = match doc.get("cluster").and_then(|c| c.get(name)) {
        Some(Value::Table(t)) => t.clone(),
        _ => return Err(format!("no cluster `{name}` in the file")),
    };
    let line_of = |path: &str| {
        let mut p = FieldPath::root();
        for seg in path.split('.') {
            p = p.key(seg);
        }
        let span = span_exact(spans.as_table(), &p).unwrap_or(0..0);
        let (file, line, _) = sources.locate(span.start);
        (file.to_path_buf(), line)
    };
    let set =
        |field: &str, list: &[EffectiveField]| list.iter().any(|f| same_field(&f.field, field));
    let mut out = Vec::new();
    for (field, value) in leaves(&own) {
        let (file, line) = line_of(&format!("cluster.{name}.{field}"));
        out.push(EffectiveField { field, value, origin: Origin::Cluster(file, line) });
    }
    let admin = over.map(|o| leaves(&o.0)).unwrap_or_default();
    for (field, value) in leaves(&defaults) {
        let top = field.split('.').next().unwrap_or(&field);
        if ROUTE_KEYS.contains(&canonical(top)) || set(&field, &out) {
            continue;
        }
        let origin = if admin.iter().any(|(f, _)| same_field(f, &field)) {
            Origin::Admin
        } else {
            let (file, line) = line_of(&format!("defaults.{field}"));
            Origin::Defaults(file, line)
        };
        out.push(EffectiveField { field, value, origin });
    }
    let schema: Vec<String> = crate::schema::fields()
        .iter()
        .filter_map(|f| f.strip_prefix("defaults.").map(str::to_owned))
        .collect();
    for field in &schema {
        let top = field.split('.').next().unwrap_or(field);
        // A table (`health`) is listed through its fields.
        let table = schema.iter().any(|g| g.starts_with(&format!("{field}.")));
        if table || ROUTE_KEYS.contains(&canonical(top)) || set(field, &out) {
            continue;
        }
        out.push(EffectiveField {
            field: field.clone(),
            value: String::new(),
            origin: Origin::BuiltIn,
        });
    }
    Ok(out)
}

/// Whether two dotted field names are one field (each part compared without its unit suffix).
fn same_field(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.split('.'), b.split('.'));
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if canonical(x) == canonical(y) => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn own_fields_win_under_any_spelling_and_tables_merge_one_level_down() {
        let mut c = table("connect_timeout_ms = 100\n[health]\nkind = \"tcp\"\n");
        let d = table(
            "connect_timeout = \"2s\"\nalgorithm = \"random\"\n[health]\nkind = \"http\"\ninterval = \"1s\"\n",
        );
        merge(&mut c, &d);
        assert_eq!(c["connect_timeout_ms"].as_integer(), Some(100));
        assert!(!c.contains_key("connect_timeout"));
        assert_eq!(c["algorithm"].as_str(), Some("random"));
        assert_eq!(c["health"]["kind"].as_str(), Some("tcp"));
        assert_eq!(c["health"]["interval"].as_str(), Some("1s"));
    }

    #[test]
    fn arrays_are_taken_whole() {
        let mut c = table("grpc_failure_codes = [\"unavailable\"]\n");
        merge(&mut c, &table("grpc_failure_codes = [\"internal\", \"unknown\"]\n"));
        assert_eq!(c["grpc_failure_codes"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn fields_are_the_same_without_their_units() {
        assert!(same_field("health.interval_ms", "health.interval"));
        assert!(!same_field("health.interval", "health.timeout"));
        assert!(!same_field("health", "health.timeout"));
    }
}
