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
//! Beyond errors, a valid file may get warnings ([`Config::warnings`]: things that are probably
//! not what was meant) and, for a build without some cargo features, errors for the settings that
//! need them ([`Features`], [`load_file_with`]).
//!
//! Defaults come from the `Default` impls of `rondo-core`'s model; the few settings the model
//! has no default for are the `DEFAULT_*` constants here and on the spec types.

pub mod access_format;
mod compile;
pub mod crypto;
mod defaults;
mod error;
mod filter;
mod include;
pub mod jwks;
pub mod ocsp;
mod path;
mod raw;
mod schema;
mod spec;
pub mod tls;
mod units;
mod warnings;

use std::path::Path;

pub use compile::{
    DEFAULT_EXPECT_STATUS, DEFAULT_HEALTH_PATH, DEFAULT_ROUTE_IDLE_TIMEOUT,
    DEFAULT_ROUTE_REQUEST_TIMEOUT, DEFAULT_WEIGHT, DeclaredPolicyError, MAX_RING_VNODES,
    MAX_WEIGHT, address_reaches, compile_declared_policy, upstream_protocol_str,
};
pub use defaults::{DefaultsOverride, EffectiveField, Origin};
pub use error::{ConfigError, ConfigErrors};
pub use include::config_files;
pub use schema::fields as schema_fields;
pub use spec::TracingSpec;
pub use spec::{
    AccessLogSpec, AccessLogTarget, AdminSpec, AdminToken, AgentKey, AgentSpec, DnsQuery, DnsSpec,
    ErrorDetail, Http2Limits, Http3Spec, ListenerProtocol, ListenerSpec, LogFormat, LogSpec,
    MembersDnsSpec, MetricsSpec, NamingSpec, ProbeSpec, ProxyProtocolMode, ProxyProtocolSpec,
    QueueBackend, QueueSpec, RegistrySpec, RouterSpec, Routing, Splice, Trusted, UdpGranularity,
    UdpSpec, XdsSpec,
};
pub use warnings::Features;

use crate::error::{escape_controls, line_column};
use crate::path::{FieldPath, key_value_spans, path_at, span_of};

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
    /// What is valid but probably not meant (an `[admin]` without a token, `least-cpu` without
    /// `[agent]`, a route an earlier one always answers first, a cluster nothing sends requests
    /// to), each with its file, line, column and field like an error; in file order.
    pub warnings: Vec<ConfigError>,
    /// The process's log (`[log]`; defaults when absent).
    pub log: LogSpec,
    /// `[metrics]` (defaults when absent).
    pub metrics: MetricsSpec,
    /// The durable queues (`[[queue]]`), in file order.
    pub queues: Vec<QueueSpec>,
    /// The clusters whose members are (also) discovered through DNS (`members_dns`), by name.
    pub members_dns: std::collections::BTreeMap<String, MembersDnsSpec>,
    /// The `[member.NAME]` members listed by two clusters or more, by name, with the clusters
    /// that list them (in name order): one state for the member in all of them.
    pub shared_members: std::collections::BTreeMap<String, Vec<String>>,
    /// The tier's shared load view (`[tier]`), when set.
    pub tier: Option<TierSpec>,
    /// Spans exported over OTLP/HTTP, when `[tracing]` is present (read at start).
    pub tracing: Option<TracingSpec>,
}

/// `[tier]`: every `interval` this router publishes its load per member on `subject` of the
/// NATS server at `nats`, and counts the other routers' (forgotten after 3 silent intervals).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    /// The NATS server (`nats://host:port`).
    pub nats: String,
    /// The core subject of this tier's load reports (`rondo.tier.NAME.load`).
    pub subject: String,
    /// How often each router publishes.
    pub interval: std::time::Duration,
}

impl Config {
    /// One line, e.g. `2 listeners, 3 routes, 4 clusters, 12 members, view 1` (`12 members (and
    /// members from DNS in 1 cluster)` with `members_dns`).
    pub fn summary(&self) -> String {
        fn count(n: usize, one: &str) -> String {
            if n == 1 { format!("1 {one}") } else { format!("{n} {one}s") }
        }
        let members: usize = self.view.clusters.values().map(|c| c.members.len()).sum();
        // Members from DNS are known only once resolved: say which clusters have them.
        let dns = match self.members_dns.len() {
            0 => String::new(),
            n => format!(" (and members from DNS in {})", count(n, "cluster")),
        };
        format!(
            "{}, {}, {}, {}{dns}, view {}",
            count(self.listeners.len(), "listener"),
            count(self.view.routes.len(), "route"),
            count(self.view.clusters.len(), "cluster"),
            count(members, "member"),
            self.view.id
        )
    }
}

/// [`parse_str`] on arbitrary bytes, the invariants of its answer asserted: the fuzz target
/// `config` (`fuzz/`) and the tests replaying its corpus call this. Panics only when an
/// invariant breaks: a valid config keeps the view id it was given; every error points inside
/// the text (line and column), says something, and holds no control character (values and keys
/// are echoed escaped).
pub fn fuzz_input(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match parse_str(text, Path::new("fuzz.toml"), 3) {
        Ok(config) => {
            assert_eq!(config.view.id, 3);
            assert!(!config.summary().is_empty());
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "an error list with no error");
            let lines = text.split('\n').count();
            for e in &errors {
                assert!(e.line >= 1 && e.line <= lines, "line out of range: {e}");
                assert!(e.column >= 1, "column out of range: {e}");
                assert!(!e.message.is_empty(), "empty message at {}:{}", e.line, e.column);
                let shown = e.to_string();
                assert!(shown.starts_with("fuzz.toml:"), "{shown}");
                assert!(!shown.chars().any(char::is_control), "control character in {shown:?}");
            }
        }
    }
}

/// At most this many errors are read from a file that does not fit the schema (each unknown
/// field after the first costs one more parse of the text).
const MAX_READ_ERRORS: usize = 32;

/// The errors of a text that does not fit the schema, where each is, and its field path. serde
/// stops at the first; an unknown field is blanked out (its key and value, and the comma that
/// joined it to an inline table, turned into spaces, so every byte offset and line stays where
/// it was) and the text read again, so every misspelt field of a file is reported in one run,
/// each with the nearest field name the schema has (`did you mean`).
fn read_errors(
    text: &str,
    first: toml::de::Error,
    table: Option<&toml_edit::Table>,
) -> Vec<(Option<std::ops::Range<usize>>, Option<FieldPath>, String)> {
    let mut errors = Vec::new();
    let mut blanked = text.to_owned();
    let mut next = Some(first);
    while let Some(e) = next.take() {
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
        let unknown = message.starts_with("unknown field `");
        if unknown {
            message = suggest(&message);
        }
        let spans = table.zip(path.as_ref()).and_then(|(t, p)| key_value_spans(t, p));
        errors.push((span, path, message));
        if !unknown || errors.len() >= MAX_READ_ERRORS {
            break;
        }
        // Only a key/value pair can be blanked out; an unknown table stays the last error.
        let Some((key, value)) = spans else { break };
        blank(&mut blanked, key.start..value.end);
        // Blanking the last part of a dotted key (`tls.fooo = 1`) leaves `tls.` behind, which
        // no longer parses: stop there rather than report a syntax error the file has not.
        if toml_edit::Document::parse(blanked.as_str()).is_err() {
            break;
        }
        next = toml::from_str::<raw::RawConfig>(&blanked).err();
    }
    errors
}

/// Turns the key/value pair at `pair` into spaces (newlines kept), with the comma that joins it
/// to the rest of an inline table (after it, else before it).
fn blank(text: &mut String, pair: std::ops::Range<usize>) {
    let bytes = text.as_bytes();
    let is_space = |b: &u8| *b == b' ' || *b == b'\t';
    let after = bytes[pair.end..].iter().take_while(|b| is_space(b)).count();
    let before = bytes[..pair.start].iter().rev().take_while(|b| is_space(b)).count();
    let range = if bytes.get(pair.end + after) == Some(&b',') {
        pair.start..pair.end + after + 1
    } else if pair.start > before && bytes[pair.start - before - 1] == b',' {
        pair.start - before - 1..pair.end
    } else {
        pair
    };
    let spaces: String =
        text[range.clone()].chars().map(|c| if c == '\n' { '\n' } else { ' ' }).collect();
    // Each char became one byte: pad to keep the offsets of what follows.
    let pad = range.len() - spaces.len();
    text.replace_range(range, &(spaces + &" ".repeat(pad)));
}

/// serde's `unknown field `x`, expected one of `a`, `b`, ...` as `unknown field `x`, did you
/// mean `a`?` when one expected name is close (Damerau–Levenshtein distance at most a third
/// of its length, at least 1), else as it is.
fn suggest(message: &str) -> String {
    let Some((head, expected)) = message.split_once(", expected ") else {
        return message.to_owned();
    };
    let Some(unknown) = head.strip_prefix("unknown field `").and_then(|u| u.strip_suffix('`'))
    else {
        return message.to_owned();
    };
    let names = expected.split('`').skip(1).step_by(2);
    let nearest = names
        .map(|name| (strsim::damerau_levenshtein(unknown, name), name))
        .filter(|(d, name)| *d <= (name.len() / 3).max(1))
        .min();
    match nearest {
        Some((_, name)) => format!("{head}, did you mean `{name}`?"),
        None => message.to_owned(),
    }
}

/// Reads and checks the configuration file at `path`; the view gets id `view_id`. Every optional
/// feature is taken as available ([`load_file_with`] checks against a build's).
///
/// A file that cannot be read is one [`ConfigError`] without a position (line 0) naming the file
/// and the I/O error; one that is not UTF-8 is one at its first bad byte.
pub fn load_file(path: &Path, view_id: u64) -> Result<Config, ConfigErrors> {
    load_file_with(path, view_id, Features::ALL)
}

/// [`load_file`] for a build with `features`: settings that need a missing one are errors.
pub fn load_file_with(
    path: &Path,
    view_id: u64,
    features: Features,
) -> Result<Config, ConfigErrors> {
    load_file_over(path, view_id, features, None)
}

/// [`load_file_with`] with the defaults set through the admin API merged over the file's
/// `[defaults]`.
pub fn load_file_over(
    path: &Path,
    view_id: u64,
    features: Features,
    over: Option<&DefaultsOverride>,
) -> Result<Config, ConfigErrors> {
    let text = read_text(path)?;
    let sources = include::gather(&text, path).map_err(|errors| ConfigErrors { errors })?;
    parse_sources(&sources, path, view_id, features, true, over)
}

/// The fields of cluster `name` of the file at `path` as they are in force, each with where it
/// comes from: the cluster, `[defaults]` (with `over` merged over it), or built in
/// (`rondo check --effective`). The file must be valid.
pub fn effective(
    path: &Path,
    name: &str,
    over: Option<&DefaultsOverride>,
) -> Result<Vec<EffectiveField>, ConfigErrors> {
    let config = load_file_over(path, 0, Features::ALL, over)?;
    let text = read_text(path)?;
    let sources = include::gather(&text, path).map_err(|errors| ConfigErrors { errors })?;
    if !config.view.clusters.contains_key(name) {
        let known = config.view.clusters.keys().map(String::as_str);
        let message =
            format!("unknown cluster `{name}`, expected one of {}", compile::one_of(known));
        return Err(ConfigErrors::whole_file(path, message));
    }
    defaults::effective(&sources, name, over).map_err(|m| ConfigErrors::whole_file(path, m))
}

/// The text of the configuration file at `path`: a file that cannot be read is one error
/// without a position naming the I/O error, one that is not UTF-8 an error at its first bad
/// byte (`rondo check`, `serve`, reloads and `rondo ctl apply` read files through this).
pub fn read_text(path: &Path) -> Result<String, ConfigErrors> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigErrors::whole_file(path, format!("cannot read config file: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        let error = not_utf8(path, e.as_bytes(), &e.utf8_error());
        ConfigErrors { errors: vec![error] }
    })
}

/// The error of a file that is not UTF-8 (TOML must be), at the line and column of its first
/// bad byte, like every other problem of the file: an editor can go there.
fn not_utf8(file: &Path, bytes: &[u8], e: &std::str::Utf8Error) -> ConfigError {
    let good = e.valid_up_to();
    // Everything before the first bad byte is UTF-8, so it counts lines and characters.
    let before = std::str::from_utf8(&bytes[..good]).unwrap_or_default();
    let (line, column) = line_column(before, good);
    let message =
        format!("the file is not UTF-8 (as TOML must be): bad byte 0x{:02x}", bytes[good]);
    ConfigError { file: file.to_path_buf(), line, column, field: String::new(), message }
}

/// Parses and checks configuration `text`; `file` names it in errors and anchors relative paths
/// (`token_file`, `snapshot`) to its directory. The view gets id `view_id`. Every optional
/// feature is taken as available ([`parse_str_with`] checks against a build's).
pub fn parse_str(text: &str, file: &Path, view_id: u64) -> Result<Config, ConfigErrors> {
    parse_str_with(text, file, view_id, Features::ALL)
}

/// [`parse_str`] for a build with `features`: settings that need a missing one are errors.
/// A text reads no other file: `include` is an error here (it works in files, [`load_file`]).
pub fn parse_str_with(
    text: &str,
    file: &Path,
    view_id: u64,
    features: Features,
) -> Result<Config, ConfigErrors> {
    parse_sources(&include::Sources::single(text, file), file, view_id, features, false, None)
}

/// [`parse_str`] with the defaults set through the admin API merged over the text's
/// `[defaults]`.
pub fn parse_str_over(
    text: &str,
    file: &Path,
    view_id: u64,
    over: Option<&DefaultsOverride>,
) -> Result<Config, ConfigErrors> {
    parse_sources(&include::Sources::single(text, file), file, view_id, Features::ALL, false, over)
}

/// Parses and checks the configuration of `sources` (the main `file` and its includes, when
/// `includes` says it may have them).
fn parse_sources(
    sources: &include::Sources,
    file: &Path,
    view_id: u64,
    features: Features,
    includes: bool,
    over: Option<&DefaultsOverride>,
) -> Result<Config, ConfigErrors> {
    let text = sources.text.as_str();
    // A span-keeping document to turn spans into field paths and field paths into spans.
    let doc = toml_edit::Document::parse(text).ok();
    let table = doc.as_ref().map(|d| d.as_table());
    let error_at = |span: Option<std::ops::Range<usize>>, field: String, message: String| {
        let (file, line, column) = match span {
            Some(s) => sources.locate(s.start),
            None => (file, 1, 1),
        };
        // Values are echoed in messages and keys in field paths: a control character in either
        // (an escape sequence, a newline) must not reach a terminal or log as it is.
        let field = escape_controls(&field).into_owned();
        let message = escape_controls(&message).into_owned();
        ConfigError { file: file.to_path_buf(), line, column, field, message }
    };
    let order = |f: &Path| sources.files().position(|x| x == f).unwrap_or(usize::MAX);

    let raw: raw::RawConfig = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            let errors = read_errors(text, e, table);
            let errors = errors.into_iter().map(|(span, field, message)| {
                error_at(span, field.map(|p| p.to_string()).unwrap_or_default(), message)
            });
            return Err(ConfigErrors { errors: errors.collect() });
        }
    };

    if raw._include.is_some() && !includes {
        let span = table.and_then(|t| span_of(t, &FieldPath::root().key("include")));
        let message = "`include` is read from configuration files (rondo check, rondo serve, \
                       reloads), not from a configuration given as text"
            .to_owned();
        return Err(ConfigErrors { errors: vec![error_at(span, "include".to_owned(), message)] });
    }
    // `timeout = 5` parsed (the alias shares `timeout_ms`'s field) but has no unit.
    let unitless = table.map(|t| units::unitless(t, &schema::fields())).unwrap_or_default();
    if !unitless.is_empty() {
        let errors = unitless
            .into_iter()
            .map(|(path, span, message)| error_at(Some(span), path.to_string(), message));
        return Err(ConfigErrors { errors: errors.collect() });
    }

    // `[defaults]` merged into every cluster and route, then compiled as if written there.
    let raw = if raw.defaults.is_some() || over.is_some() {
        match defaults::apply(text, over) {
            Ok(raw) => raw,
            Err(message) => {
                let span = table.and_then(|t| span_of(t, &FieldPath::root().key("defaults")));
                return Err(ConfigErrors {
                    errors: vec![error_at(span, "defaults".to_owned(), message)],
                });
            }
        }
    } else {
        raw
    };

    let located = |problems: Vec<compile::Problem>| {
        let mut errors: Vec<ConfigError> = problems
            .into_iter()
            .map(|p| {
                // A problem of an inherited field is shown at the default it came from.
                let from = table.and_then(|t| defaults::inherited_from(t, &p.path));
                let span = table.and_then(|t| span_of(t, from.as_ref().unwrap_or(&p.path)));
                let message = match from {
                    Some(d) => format!("{} (inherited from `{d}`)", p.message),
                    None => p.message,
                };
                error_at(span, p.path.to_string(), message)
            })
            .collect();
        errors.sort_by_key(|e| (order(&e.file), e.line, e.column));
        errors
    };
    let base_dir = file.parent().unwrap_or(Path::new(""));
    let unsupported = warnings::unsupported(&raw, features);
    match compile::compile(raw, base_dir, view_id) {
        Ok(mut config) if unsupported.is_empty() => {
            config.warnings = located(warnings::warnings(&config));
            Ok(config)
        }
        Ok(_) => Err(ConfigErrors { errors: located(unsupported) }),
        Err(mut problems) => {
            problems.extend(unsupported);
            Err(ConfigErrors { errors: located(problems) })
        }
    }
}
