//! What the router reports and how: `[metrics]` (how long a departed member's series stay) and
//! a listener's `access_log` (its target, and `text`, `json` or a template, with the `fields`
//! of each line).

use super::*;
use crate::access_format::{AccessField, parse_template};
use crate::raw::RawMetrics;
use crate::spec::MetricsSpec;

/// The longest `departed_grace`: a day.
const MAX_DEPARTED_GRACE_MS: u64 = 86_400_000;

pub(super) fn compile_metrics(c: &mut Compiler<'_>, m: &RawMetrics) -> MetricsSpec {
    let path = FieldPath::root().key("metrics");
    let departed_grace = match m.departed_grace_ms {
        None => MetricsSpec::DEFAULT_DEPARTED_GRACE,
        Some(ms) if ms <= MAX_DEPARTED_GRACE_MS => Duration::from_millis(ms),
        Some(_) => {
            let msg = "departed_grace must be 0 to 24h (86400000 ms)";
            c.err(path.key("departed_grace_ms"), msg);
            MetricsSpec::DEFAULT_DEPARTED_GRACE
        }
    };
    MetricsSpec { departed_grace }
}

pub(super) fn compile_access_log(
    c: &mut Compiler<'_>,
    path: FieldPath,
    a: &RawAccessLog,
) -> AccessLogSpec {
    // A format with braces is a template; any other is `text` or `json` (or an unknown name).
    let template = match a.format.as_deref() {
        Some(t) if t.contains(['{', '}']) => match parse_template(t) {
            Ok(pieces) => Some(pieces),
            Err(e) => {
                c.err(path.key("format"), e);
                None
            }
        },
        _ => None,
    };
    let format = match a.format.as_deref() {
        Some(t) if t.contains(['{', '}']) => LogFormat::Text,
        f => log_format(c, path.key("format"), f),
    };
    let fields = a.fields.as_ref().map(|names| {
        if template.is_some() {
            c.err(
                path.key("fields"),
                "`fields` is for the text and json formats: a template names its own fields",
            );
        }
        if names.is_empty() {
            c.err(path.key("fields"), "`fields` names no field");
        }
        let mut fields = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            match AccessField::parse(name) {
                Ok(f) if fields.contains(&f) => {
                    c.err(path.key("fields").index(i), format!("`{name}` is listed twice"));
                }
                Ok(f) => fields.push(f),
                Err(e) => c.err(path.key("fields").index(i), e),
            }
        }
        fields
    });
    let target = if a.path == "-" {
        AccessLogTarget::Stdout
    } else {
        // An empty path is reported by `file_path`; the target is then irrelevant.
        AccessLogTarget::File(c.file_path(path.key("path"), &a.path).unwrap_or_default())
    };
    AccessLogSpec { target, format, fields, template }
}
