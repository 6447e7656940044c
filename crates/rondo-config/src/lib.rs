//! rondo's configuration file: this crate owns parsing a TOML config ([`parse_str`],
//! [`load_file`]), checking it, and compiling it into a [`Config`]: a `rondo_core::View` (routes
//! and clusters) plus the listeners, router identity, admin API, naming service and load-agent
//! receiver settings.
//!
//! Every problem is reported with its file, 1-based line and column, and field path
//! ([`ConfigError`]); semantic problems are all collected, not just the first. Field paths look
//! like `cluster.components.members[1].weight` or `route[0].cluster`: array indices are 0-based,
//! in file order, like TOML arrays. A TOML syntax or type error stops parsing, so it is reported
//! alone.
//!
//! Defaults come from the `Default` impls of `rondo-core`'s model; the few settings the model
//! has no default for are the `DEFAULT_*` constants here and on the spec types.

mod compile;
mod error;
mod path;
mod raw;
mod spec;

use std::path::Path;

pub use compile::{
    DEFAULT_EXPECT_STATUS, DEFAULT_HEALTH_PATH, DEFAULT_ROUTE_IDLE_TIMEOUT,
    DEFAULT_ROUTE_REQUEST_TIMEOUT, DEFAULT_WEIGHT, MAX_RING_VNODES, MAX_WEIGHT, address_reaches,
    upstream_protocol_str,
};
pub use error::{ConfigError, ConfigErrors};
pub use spec::{
    AdminSpec, AdminToken, AgentKey, AgentSpec, DnsSpec, ListenerProtocol, ListenerSpec,
    NamingSpec, RegistrySpec, RouterSpec,
};

use crate::error::line_column;
use crate::path::{FieldPath, path_at, span_of};

/// A checked configuration, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Routes (in file order) and clusters.
    pub view: rondo_core::View,
    /// Listeners, in file order.
    pub listeners: Vec<ListenerSpec>,
    /// This router's identity.
    pub router: RouterSpec,
    /// The admin API, when `[admin]` is present.
    pub admin: Option<AdminSpec>,
    /// The naming service, when `[naming]` is present.
    pub naming: Option<NamingSpec>,
    /// The load-agent receiver, when `[agent]` is present.
    pub agent: Option<AgentSpec>,
}

impl Config {
    /// One line, e.g. `2 listeners, 3 routes, 4 clusters, 12 members, view 1`.
    pub fn summary(&self) -> String {
        fn count(n: usize, one: &str) -> String {
            if n == 1 { format!("1 {one}") } else { format!("{n} {one}s") }
        }
        let members: usize = self.view.clusters.values().map(|c| c.members.len()).sum();
        format!(
            "{}, {}, {}, {}, view {}",
            count(self.listeners.len(), "listener"),
            count(self.view.routes.len(), "route"),
            count(self.view.clusters.len(), "cluster"),
            count(members, "member"),
            self.view.id
        )
    }
}

/// Reads and checks the configuration file at `path`; the view gets id `view_id`.
///
/// A file that cannot be read is one [`ConfigError`] (at 1:1) naming the file and the I/O error.
pub fn load_file(path: &Path, view_id: u64) -> Result<Config, ConfigErrors> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_str(&text, path, view_id),
        Err(e) => Err(ConfigErrors::whole_file(path, format!("cannot read config file: {e}"))),
    }
}

/// Parses and checks configuration `text`; `file` names it in errors and anchors relative paths
/// (`token_file`, `snapshot`) to its directory. The view gets id `view_id`.
pub fn parse_str(text: &str, file: &Path, view_id: u64) -> Result<Config, ConfigErrors> {
    // A span-keeping document to turn spans into field paths and field paths into spans.
    let doc = toml_edit::Document::parse(text).ok();
    let table = doc.as_ref().map(|d| d.as_table());
    let error_at = |span: Option<std::ops::Range<usize>>, field: String, message: String| {
        let (line, column) = span.map_or((1, 1), |s| line_column(text, s.start));
        ConfigError { file: file.to_path_buf(), line, column, field, message }
    };

    let raw: raw::RawConfig = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            let span = e.span();
            let mut message = e.message().trim_end_matches('.').to_owned();
            let mut path = match (table, &span) {
                (Some(t), Some(s)) => path_at(t, s.start),
                _ => None,
            };
            if let Some(missing) =
                message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`'))
            {
                path = Some(path.unwrap_or_else(FieldPath::root).key(missing));
            }
            if message == "duplicate key"
                && let Some(s) = &span
                && let Some(key) = text.get(s.clone())
            {
                message = format!("duplicate key `{key}`");
            }
            let field = path.map(|p| p.to_string()).unwrap_or_default();
            return Err(ConfigErrors { errors: vec![error_at(span, field, message)] });
        }
    };

    let base_dir = file.parent().unwrap_or(Path::new(""));
    compile::compile(raw, base_dir, view_id).map_err(|problems| {
        let mut errors: Vec<ConfigError> = problems
            .into_iter()
            .map(|p| {
                let span = table.and_then(|t| span_of(t, &p.path));
                error_at(span, p.path.to_string(), p.message)
            })
            .collect();
        errors.sort_by_key(|e| (e.line, e.column));
        ConfigErrors { errors }
    })
}
