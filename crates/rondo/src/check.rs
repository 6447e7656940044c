//! `rondo check`: loads and checks a configuration file against this build's features, printing
//! every warning (`FILE:LINE:COLUMN: warning: field `FIELD`: MESSAGE`) and then
//! `ok: FILE: SUMMARY` on success, or every problem, one per line, on failure. Exit status 0
//! with warnings, 1 with errors (and with warnings under `--strict`).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use rondo_config::Origin;

/// The view id a checked configuration gets (nothing runs it).
const CHECK_VIEW_ID: u64 = 1;

/// Checks the configuration at `path` for this build ([`crate::features`]): warnings go to
/// `err`, the summary to `out`, and it exits 0, or 1 under `strict` when there are warnings;
/// every error goes to `err`, one per line (`FILE:LINE:COLUMN: field `FIELD`: MESSAGE`), and it
/// exits 1.
pub fn check(
    path: &Path,
    strict: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    match rondo_config::load_file_with(path, CHECK_VIEW_ID, crate::features()) {
        Ok(config) => {
            let taken = udp_taken(path, &config);
            if !taken.is_empty() {
                for e in &taken {
                    writeln!(err, "{e}").context("writing to stderr")?;
                }
                return Ok(ExitCode::FAILURE);
            }
            for w in &config.warnings {
                writeln!(err, "{}", w.as_warning()).context("writing to stderr")?;
            }
            let n = config.warnings.len();
            let warnings = match n {
                0 => String::new(),
                1 => " (1 warning)".to_owned(),
                n => format!(" ({n} warnings)"),
            };
            if strict && n > 0 {
                let what = if n == 1 { "1 warning".to_owned() } else { format!("{n} warnings") };
                writeln!(err, "{}: {what}, refused by --strict", path.display())
                    .context("writing to stderr")?;
                return Ok(ExitCode::FAILURE);
            }
            writeln!(out, "ok: {}: {}{warnings}", path.display(), config.summary())
                .context("writing to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors {
                writeln!(err, "{e}").context("writing to stderr")?;
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// HTTP/3 listeners whose UDP port another process holds while their TCP port is free, one
/// error each at the listener's `listen` value. (A router already running on the file holds
/// both ports: that is the usual case of `rondo check` before a reload, and no error. Port 0
/// is never taken.)
fn udp_taken(path: &Path, config: &rondo_config::Config) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for (i, l) in config.listeners.iter().enumerate() {
        if l.http3.is_none() || l.listen.port() == 0 {
            continue;
        }
        let tcp_free = std::net::TcpListener::bind(l.listen).is_ok();
        let udp = std::net::UdpSocket::bind(l.listen);
        let Err(e) = udp else { continue };
        if !tcp_free || e.kind() != std::io::ErrorKind::AddrInUse {
            continue;
        }
        let at = match text.find(&format!("\"{}\"", l.listen)) {
            Some(offset) => {
                let before = &text[..offset];
                let line = before.matches('\n').count() + 1;
                let start = before.rfind('\n').map_or(0, |n| n + 1);
                format!("{}:{line}:{}", path.display(), before[start..].chars().count() + 1)
            }
            None => path.display().to_string(),
        };
        out.push(format!(
            "{at}: field `listener[{i}].listen`: udp port {} is taken by another process (http3 \
             serves on the listener's port over udp)",
            l.listen.port()
        ));
    }
    out
}

/// The reference's default for `cluster.NAME.FIELD` (its third cell), for built-in fields.
fn documented_default(field: &str) -> Option<&'static str> {
    const REFERENCE: &str = include_str!("../../../docs/config.md");
    let row = format!("| `cluster.NAME.{field}` | ");
    let line = REFERENCE.lines().find(|l| l.starts_with(&row))?;
    line.split(" | ").nth(2).map(str::trim)
}

/// `rondo check --effective CLUSTER`: checks the file, then prints every field of `cluster` in
/// force, one a line: the field, its value, and where it comes from (`cluster FILE:LINE`,
/// `defaults FILE:LINE`, or `built-in` with the reference's default).
pub fn effective(
    path: &Path,
    cluster: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let code = check(path, false, out, err)?;
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    let fields = match rondo_config::effective(path, cluster, None) {
        Ok(f) => f,
        Err(errors) => {
            for e in &errors {
                writeln!(err, "{e}").context("writing to stderr")?;
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let width = fields.iter().map(|f| f.field.len()).max().unwrap_or(0);
    writeln!(out, "cluster {cluster}: fields in force").context("writing to stdout")?;
    for f in &fields {
        let (value, origin) = match &f.origin {
            Origin::Cluster(file, line) => {
                (f.value.clone(), format!("cluster {}:{line}", file.display()))
            }
            Origin::Defaults(file, line) => {
                (f.value.clone(), format!("defaults {}:{line}", file.display()))
            }
            Origin::Admin => (f.value.clone(), "admin API".to_owned()),
            Origin::BuiltIn => {
                let d = documented_default(&f.field).unwrap_or("see docs/config.md");
                (d.to_owned(), "built-in".to_owned())
            }
        };
        writeln!(out, "  {:width$}  {value}  ({origin})", f.field).context("writing to stdout")?;
    }
    Ok(ExitCode::SUCCESS)
}
