//! rondo's command-line front end: this crate owns the `rondo` binary's commands ([`cli`]) and
//! what each one does ([`check`]); `main.rs` only parses arguments and calls [`run`].

pub mod check;
pub mod cli;

use std::io::{self, Write};
use std::process::ExitCode;

use cli::{Cli, Command};

/// Runs a parsed command line, printing to stdout and stderr; returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    let stdout = io::stdout();
    let stderr = io::stderr();
    match run_with(cli, &mut stdout.lock(), &mut stderr.lock()) {
        Ok(code) => code,
        Err(e) => {
            // Output itself failed (a closed pipe); there is nowhere better to say so.
            let _ = writeln!(io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command line with the given outputs; an `Err` means writing output failed.
pub fn run_with(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check(args) => check::check(&args.config, out, err),
    }
}
