//! The command line: the commands and options `rondo` accepts. Only commands that work are
//! listed here, so `rondo --help` never offers one that does not.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};

/// `rondo --version`: the version, the git commit built from and the enabled cargo features.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("RONDO_GIT_COMMIT"),
    "\nfeatures: ",
    env!("RONDO_FEATURES"),
);

/// rondo, a load balancer.
///
/// Logs go to stderr, at `info` by default (see Logging below).
#[derive(Debug, Parser)]
#[command(
    name = "rondo",
    version,
    long_version = LONG_VERSION,
    propagate_version = true,
    after_help = LOG_HELP
)]
pub struct Cli {
    /// Log settings (every command).
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The log's environment, after `--help`'s options.
const LOG_HELP: &str = "\
Logging: rondo logs to stderr, at `info` by default (member up/down, ejections, drains, reloads;
`demo` at `warn`).
  --log-level LEVEL   rondo's own level: error, warn, info, debug or trace (libraries stay at warn)
  --log-format FMT    text (default; colour only on a terminal, never with NO_COLOR set) or json
  RONDO_LOG=FILTER    a tracing EnvFilter for full control, e.g. RONDO_LOG=rondo_proxy=debug,warn
Precedence: --log-level, then RONDO_LOG, then the config's [log] level, then info.";

/// The log's level and format, accepted by every command.
#[derive(Debug, Clone, Default, Args)]
pub struct LogArgs {
    /// Log level of rondo's own lines: error, warn, info (default), debug or trace; overrides
    /// RONDO_LOG and the config's `[log] level`.
    #[arg(long, global = true, value_name = "LEVEL")]
    #[arg(value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: Option<String>,
    /// Log line format on stderr: text (default) or json (one object per line); overrides the
    /// config's `[log] format`.
    #[arg(long, global = true, value_name = "FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the router (listeners, routes, clusters) from a configuration file.
    Serve(ServeArgs),
    /// Check a configuration file: errors, warnings (exit 1 with errors), a one-line summary.
    Check(CheckArgs),
    /// Run a demo member that answers every request with its name (for trying rondo out).
    Member(MemberArgs),
    /// Try rondo out: three local members and a router, calls through three algorithms.
    Demo(DemoArgs),
    /// Run a load agent beside a member: reports its CPU, free memory and sessions to routers.
    Agent(AgentArgs),
    /// Control a running router through its admin API: status, drain, weights, algorithm, apply.
    Ctl(CtlArgs),
    /// TLS helpers: `rondo tls dev-ca DIR --name NAME...` writes a development CA and
    /// certificates (development only).
    Tls(TlsArgs),
    /// Sign-on helpers: `rondo auth dev-key DIR` writes a development signing key and its JWKS,
    /// `rondo auth token` mints a token with it (development only).
    Auth(AuthArgs),
    /// Simulate a scenario in virtual time through the real pickers, beside an oracle: a
    /// results table on stdout, and the table and SVG plots in --out.
    Simulate(SimulateArgs),
    /// Print a shell completion script (e.g. `rondo completions bash > /etc/bash_completion.d/rondo`).
    Completions(CompletionsArgs),
    /// Print rondo's man page in roff (e.g. `rondo man > rondo.1; man ./rondo.1`), or write a
    /// page per command with --dir.
    Man(ManArgs),
}

/// Options of `rondo tls`.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TlsCommand,
}

/// The commands of `rondo tls`.
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Write a DEVELOPMENT-ONLY certificate authority (ca.pem, ca.key) and certificates signed
    /// by it (NAME.pem and NAME.key per --name, client-NAME.pem and client-NAME.key per
    /// --client) into DIR. The CA key is unprotected: never trust ca.pem beyond a test setup.
    /// Never overwrites a file.
    DevCa {
        /// Directory to write into (created if missing).
        dir: PathBuf,
        /// A server name to make a certificate for (DNS name, `*.domain` or IP address);
        /// repeatable.
        #[arg(long = "name", value_name = "NAME")]
        names: Vec<String>,
        /// A client certificate's common name; repeatable.
        #[arg(long = "client", value_name = "NAME")]
        clients: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, value_name = "DAYS", default_value_t = 365)]
        days: u32,
    },
}

/// Options of `rondo auth`.
#[derive(Debug, Args)]
pub struct AuthArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: AuthCommand,
}

/// The commands of `rondo auth`.
#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Write a DEVELOPMENT-ONLY Ed25519 signing key (dev-key.pem, private) and the JWKS a
    /// route's `auth.keys` reads (jwks.json) into DIR. Never overwrites a file.
    DevKey {
        /// Directory to write into (created if missing).
        dir: PathBuf,
        /// The key id (`kid`) in jwks.json.
        #[arg(long, value_name = "KID", default_value = "dev-1")]
        kid: String,
    },
    /// Print a token (EdDSA JWT) signed with a key `rondo auth dev-key` wrote.
    Token {
        /// The private key (dev-key.pem).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The `iss` claim (the route's `auth.issuer`).
        #[arg(long, value_name = "ISSUER")]
        issuer: String,
        /// The `aud` claim (the route's `auth.audience`).
        #[arg(long, value_name = "AUDIENCE")]
        audience: String,
        /// The `sub` claim: who the token speaks for.
        #[arg(long, value_name = "SUBJECT")]
        subject: String,
        /// Seconds the token is valid from now.
        #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
        ttl: u64,
        /// Another claim, `NAME=VALUE` (a string); repeatable.
        #[arg(long = "claim", value_name = "NAME=VALUE")]
        claims: Vec<String>,
        /// The `kid` header (omitted by default: the router then tries every EdDSA key).
        #[arg(long, value_name = "KID")]
        kid: Option<String>,
    },
}

/// Options of `rondo simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The scenario file (TOML; see examples/scenarios/ and docs/algorithms.md).
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// Write results.md and the SVG plots into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seed of every random choice (overrides the scenario's `seed`); the same seed gives the
    /// same output.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

/// Options of `rondo man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write rondo.1 and a page per command (rondo-serve.1, rondo-check.1, ...) into this
    /// directory instead of printing rondo.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Options of `rondo completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Options of `rondo ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The router's `[admin] listen` address; `https://HOST:PORT` when the admin API has `tls`
    /// (then --tls-ca is needed).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9900")]
    pub admin: String,
    /// TLS to the admin API.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
    /// The admin token (prefer --token-file or RONDO_TOKEN: command lines are visible to other
    /// users). Without --token and --token-file: the RONDO_TOKEN environment variable, else the
    /// file $XDG_CONFIG_HOME/rondo/token (default ~/.config/rondo/token).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the admin token (trailing newline ignored).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Recorded as `operator:NAME` on state changes (default: `admin-api`).
    #[arg(long, value_name = "NAME")]
    pub operator: Option<String>,
    /// Change only if the router's view is still VIEW (the `view N` line of `rondo ctl status`);
    /// otherwise nothing changes and the command fails naming the current view.
    #[arg(long, value_name = "VIEW")]
    pub if_match: Option<u64>,
    /// Naming endpoints for `rondo ctl lookup`, `HOST:PORT,HOST:PORT` (tried in order; default:
    /// the RONDO_NAMING_ENDPOINTS environment variable).
    #[arg(long, value_name = "HOST:PORT,...")]
    pub naming: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// The commands of `rondo ctl`.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Print every cluster's members: state, health, load, rank, agent reports.
    Status,
    /// Stop sending new requests and sessions to a member (sticky sessions finish); with
    /// --wait, return once it has no request in flight and no session left. `drain MEMBER`
    /// drains a shared member ([member.NAME]) in every cluster that lists it.
    Drain(DrainArgs),
    /// Make a draining member active again (`undrain MEMBER`: in every cluster it serves).
    Undrain(AnyMember),
    /// Take a member out entirely (not even panic mode uses it).
    Disable(MemberRef),
    /// Make a disabled member active again.
    Enable(MemberRef),
    /// Change a member's weight (a new view).
    Weight {
        /// The cluster.
        cluster: String,
        /// The member.
        member: String,
        /// The new weight, 1 to 1000000.
        #[arg(value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        weight: u64,
    },
    /// Change a cluster's algorithm (a new view).
    Algorithm {
        /// The cluster.
        cluster: String,
        /// The algorithm, e.g. `least-sessions`.
        name: String,
    },
    /// Evaluate a candidate algorithm beside a cluster's live one, moving no traffic; with
    /// ALGORITHM start, without it report, with --off stop.
    ///
    /// At every pick the router makes for the cluster, the shadow is asked what it would have
    /// picked. With ALGORITHM: start (a fresh report); without: print the report (share per
    /// member, picks that would have gone to failed or slow members, beside the live
    /// algorithm's); with --off: stop, printing the last report. `rondo ctl algorithm` then
    /// switches for real.
    Shadow(ShadowArgs),
    /// Check a configuration file and apply it (a new view; nothing changes if it is invalid).
    Apply {
        /// The configuration file (TOML).
        file: PathBuf,
    },
    /// Revoke sign-on tokens by their id (`jti`) or every token of a subject: refused at once
    /// by this router, and by every router of an etcd tier within about a second.
    Revoke {
        /// The token id (`jti`) of a JWT or of a tier session.
        #[arg(
            long,
            value_name = "ID",
            conflicts_with = "subject",
            required_unless_present = "subject"
        )]
        token_id: Option<String>,
        /// The subject (`sub`) whose every token is refused.
        #[arg(long, value_name = "SUBJECT")]
        subject: Option<String>,
        /// How long the revocation holds, milliseconds (default one day; 1000 to 30 days).
        #[arg(long, value_name = "MS")]
        ttl_ms: Option<u64>,
    },
    /// List the revocations in force (this router's and the tier's).
    Revocations,
    /// Start a hitless upgrade: the router starts `rondo serve --upgrade` with its own command
    /// line and executable path (a new binary there is a binary upgrade), which takes over its
    /// sockets and state; needs `[router] upgrade_socket`.
    Upgrade,
    /// The durable queues: depth, oldest age, in delivery, dead letters (list, show, requeue,
    /// purge).
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Ask the naming service (--naming, else RONDO_NAMING_ENDPOINTS; the first endpoint that
    /// answers) which member a call to SERVICE should go to; needs no admin token.
    Lookup {
        /// The service (cluster).
        service: String,
        /// The request key, for `hash` services.
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
        /// The caller's locality group.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
    },
}

/// The commands of `rondo ctl queue`.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Every queue: depth, oldest message's age, in delivery, dead letters, totals.
    Status,
    /// A queue's dead letters, oldest first, with the last attempt's reason.
    Dead {
        /// The queue.
        queue: String,
        /// Most dead letters listed.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// One dead letter: its tries (each attempt's reason), header fields and body.
    Show {
        /// The queue.
        queue: String,
        /// The message id.
        id: String,
    },
    /// Move a dead letter (or, with --all, every one) back for delivery with fresh attempts.
    Requeue {
        /// The queue.
        queue: String,
        /// The message id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every dead letter of the queue.
        #[arg(long)]
        all: bool,
    },
    /// Delete a dead letter (or, with --all, every one).
    Purge {
        /// The queue.
        queue: String,
        /// The message id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every dead letter of the queue.
        #[arg(long)]
        all: bool,
    },
}

/// Options of `rondo ctl shadow`.
#[derive(Debug, Args)]
pub struct ShadowArgs {
    /// The cluster.
    pub cluster: String,
    /// The candidate algorithm, e.g. `p2c-ewma`; without it, the report is printed.
    pub algorithm: Option<String>,
    /// Stop the shadow (prints its last report).
    #[arg(long, conflicts_with = "algorithm")]
    pub off: bool,
}

/// Options of `rondo ctl drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The member.
    #[command(flatten)]
    pub member: AnyMember,
    /// Wait until the member has no request in flight and no session (exit 1 at the timeout,
    /// saying what remains); needs the cluster.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 60_000, requires = "wait",
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub timeout_ms: u64,
}

/// A member in one cluster (`CLUSTER MEMBER`, or `MEMBER --cluster CLUSTER`), or in every
/// cluster it serves (`MEMBER` alone: a shared `[member.NAME]` in every cluster that lists it,
/// else the one cluster with a member of that name).
#[derive(Debug, Args)]
pub struct AnyMember {
    /// `CLUSTER MEMBER`, or `MEMBER` alone.
    #[arg(num_args = 1..=2, value_names = ["CLUSTER", "MEMBER"], required = true)]
    pub names: Vec<String>,
    /// Only in this cluster.
    #[arg(long)]
    pub cluster: Option<String>,
}

impl AnyMember {
    /// The cluster (`None`: every cluster the member serves) and the member.
    pub fn scope(self) -> Result<(Option<String>, String), String> {
        let mut names = self.names;
        match (names.len(), self.cluster) {
            (2, Some(_)) => {
                Err("name the cluster once: CLUSTER MEMBER or MEMBER --cluster CLUSTER".into())
            }
            (2, None) => {
                let member = names.pop().unwrap_or_default();
                Ok((names.pop(), member))
            }
            (_, cluster) => Ok((cluster, names.pop().unwrap_or_default())),
        }
    }
}

/// A cluster and one of its members.
#[derive(Debug, Args)]
pub struct MemberRef {
    /// The cluster.
    pub cluster: String,
    /// The member.
    pub member: String,
}

/// Options of `rondo agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// A router's `[agent] listen` address (repeat for several routers).
    #[arg(long, value_name = "HOST:PORT", required_unless_present = "register")]
    pub report_to: Vec<String>,
    /// Also register the member at this address with the naming service (--naming, else
    /// RONDO_NAMING_ENDPOINTS) and keep its lease alive while the agent runs.
    #[arg(long, value_name = "HOST:PORT")]
    pub register: Option<String>,
    /// Naming endpoints for --register, `HOST:PORT,HOST:PORT` (default: the
    /// RONDO_NAMING_ENDPOINTS environment variable).
    #[arg(long, value_name = "HOST:PORT,...", requires = "register")]
    pub naming: Option<String>,
    /// The registration's lease, milliseconds (renewed every third of it).
    #[arg(long, value_name = "MS", default_value_t = 10_000, requires = "register",
          value_parser = clap::value_parser!(u64).range(1_000..=3_600_000))]
    pub lease_ms: u64,
    /// The member's cluster.
    #[arg(long)]
    pub cluster: String,
    /// The member's name in that cluster.
    #[arg(long)]
    pub member: String,
    /// The shared key (prefer --key-file: command lines are visible to other users).
    #[arg(
        long,
        value_name = "KEY",
        conflicts_with = "key_file",
        required_unless_present_any = ["key_file", "register"]
    )]
    pub key: Option<String>,
    /// A file holding the shared key (one trailing newline ignored).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Heartbeat interval, milliseconds (default: the router's `interval_ms`; the shorter wins).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub interval_ms: Option<u64>,
    /// Sessions to report (static).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub sessions: u32,
    /// Report this CPU use (0 to 1) instead of measuring it.
    #[arg(long, value_name = "FRACTION")]
    pub fixed_cpu: Option<f32>,
    /// Report this much free memory (MiB) instead of measuring it.
    #[arg(long, value_name = "MIB")]
    pub fixed_mem_mib: Option<u64>,
    /// TLS to the routers' first-contact listeners (their `[agent] tls`): on with --tls-ca.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
    /// Fault injection for tests: skip this percentage of heartbeats at random.
    #[arg(long, value_name = "PERCENT", default_value_t = 0, hide = true)]
    #[arg(value_parser = clap::value_parser!(u8).range(0..=100))]
    pub drop_percent: u8,
}

/// TLS options of a client of rondo's control plane (`rondo ctl`, `rondo agent`).
#[derive(Debug, Args, Default)]
pub struct ClientTlsArgs {
    /// The CA file (PEM) the server's certificate is verified against.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate chain (PEM), for servers with `client_auth`.
    #[arg(long, value_name = "FILE", requires = "tls_key", requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must be valid for (default: the host connected to).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    /// The files, when --tls-ca is given.
    pub fn files(&self) -> Option<rondo_runtime::tls::client::ClientTlsFiles> {
        Some(rondo_runtime::tls::client::ClientTlsFiles {
            ca: self.tls_ca.clone()?,
            identity: self.tls_cert.clone().zip(self.tls_key.clone()),
            server_name: self.tls_server_name.clone(),
        })
    }
}

/// Options of `rondo serve`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("input").required(true).args(["file", "config"])))]
pub struct ServeArgs {
    /// The configuration file (TOML).
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The configuration file (TOML), as an option.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// How connections are spread over the workers: `work-stealing` (one runtime whose workers
    /// share every connection) or `per-core` (one single-threaded runtime per worker, each
    /// accepting and serving its own connections, like HAProxy's `nbthread`).
    #[arg(long, value_enum, value_name = "MODE", default_value = "work-stealing")]
    pub runtime: crate::serve::threads::RuntimeMode,
    /// With `--runtime per-core`: `by-core`, one SO_REUSEPORT socket per worker and listener
    /// (HAProxy's `shards by-thread`), or `one`, one socket every worker accepts on.
    #[arg(long, value_enum, value_name = "HOW", default_value = "by-core")]
    pub shards: crate::serve::threads::ShardsArg,
    /// Take over from the rondo serving on the config's `[router] upgrade_socket`: its
    /// listening sockets and its state pass to this process, which then serves while the old
    /// one drains and exits (a hitless restart, or a binary upgrade when this is a new binary).
    #[arg(long)]
    pub upgrade: bool,
}

/// Options of `rondo check`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("input").required(true).args(["file", "config"])))]
pub struct CheckArgs {
    /// The configuration file (TOML).
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The configuration file (TOML), as an option.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Treat warnings as errors (exit status 1).
    #[arg(long)]
    pub strict: bool,
    /// Also print every field of this cluster in force and where it comes from: the cluster,
    /// `[defaults]` (with its line) or built in.
    #[arg(long, value_name = "CLUSTER")]
    pub effective: Option<String>,
}

impl CheckArgs {
    /// The file, positional or `--config` (clap requires exactly one).
    pub fn path(&self) -> &std::path::Path {
        self.file.as_deref().or(self.config.as_deref()).unwrap_or(std::path::Path::new(""))
    }
}

impl ServeArgs {
    /// The file, positional or `--config` (clap requires exactly one).
    pub fn path(&self) -> &std::path::Path {
        self.file.as_deref().or(self.config.as_deref()).unwrap_or(std::path::Path::new(""))
    }
}

/// Options of `rondo member`.
#[derive(Debug, Args)]
pub struct MemberArgs {
    /// The name it answers with.
    #[arg(long)]
    pub name: String,
    /// Where to listen: an IP address and a port, like `127.0.0.1:9101`.
    #[arg(long, value_name = "ADDR", value_parser = listen_address)]
    pub listen: SocketAddr,
    /// Wait this long before every answer, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub delay_ms: u64,
}

/// `--listen`'s value: an IP address and port, with an example when it is not one (a bare
/// port, a host name or a scheme is the usual slip).
fn listen_address(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| {
        let example = match value.parse::<u16>() {
            Ok(port) => format!("127.0.0.1:{port}"),
            Err(_) => "127.0.0.1:9101".to_owned(),
        };
        format!("`{value}` is not an IP address and port; write it like `{example}`")
    })
}

/// Options of `rondo demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Calls sent through each algorithm.
    #[arg(long, value_name = "N", default_value_t = 300)]
    #[arg(value_parser = clap::value_parser!(u32).range(1..))]
    pub calls: u32,
    /// Keep the members and the router running after the summary, until Ctrl-C.
    #[arg(long)]
    pub serve: bool,
}
