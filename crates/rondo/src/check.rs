//! `rondo check`: loads and checks a configuration file, printing `ok: FILE: SUMMARY` on success
//! or every problem, one per line, on failure.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

/// The view id a checked configuration gets (nothing runs it).
const CHECK_VIEW_ID: u64 = 1;

/// Checks the configuration at `path`: success goes to `out` and exits 0; every problem goes to
/// `err`, one per line (`FILE:LINE:COLUMN: field `FIELD`: MESSAGE`), and exits 1.
pub fn check(path: &Path, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match rondo_config::load_file(path, CHECK_VIEW_ID) {
        Ok(config) => {
            writeln!(out, "ok: {}: {}", path.display(), config.summary())
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
