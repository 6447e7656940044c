//! The command line: the commands and options `rondo` accepts. Only commands that work are
//! listed here, so `rondo --help` never offers one that does not.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// rondo, a load balancer.
#[derive(Debug, Parser)]
#[command(name = "rondo", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a configuration file and print a one-line summary of it.
    Check(CheckArgs),
}

/// Options of `rondo check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The configuration file (TOML).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
}
