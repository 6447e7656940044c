//! The `rondo` binary: parses the command line and hands it to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    rondo::run(rondo::cli::Cli::parse())
}
