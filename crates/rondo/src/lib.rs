//! rondo's command-line front end: this crate owns the `rondo` binary's commands ([`cli`]) and
//! what each one does ([`check`], [`serve`], [`member`], [`demo`], `agent`, which runs
//! `rondo_agent::agent`, and `ctl`, which runs `rondo_admin::client`); `main.rs` only parses
//! arguments and calls [`run`].

pub mod check;
pub mod cli;
mod ctl;
pub mod demo;
pub mod devca;
pub mod devkey;
mod json_lines;
pub mod member;
pub mod naming_cli;
pub mod serve;
pub mod simulate;
pub mod upgrade;

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use cli::{Cli, Command};
pub use ctl::default_token_file;

/// The optional parts this binary was built with (its cargo features): a configuration that
/// needs another is refused by `rondo check` and by `rondo serve` before it binds anything.
pub fn features() -> rondo_config::Features {
    rondo_config::Features {
        dns: cfg!(feature = "dns"),
        etcd: cfg!(feature = "etcd"),
        nats: cfg!(feature = "nats"),
        xds: cfg!(feature = "xds"),
        otel: cfg!(feature = "otel"),
    }
}

/// Runs a parsed command line, printing to stdout and stderr; returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    // `serve` starts its log once it has read the config's `[log]`. `demo` prints a report
    // of its own, which info lines about its in-process router would only clutter.
    match cli.command {
        Command::Serve(_) => {}
        Command::Demo(_) => init_tracing(&cli.log, None, "warn"),
        _ => init_tracing(&cli.log, None, "info"),
    }
    // Unlocked handles: each write takes the lock for itself. Holding `stderr().lock()` for
    // the whole run would block every log line written from another thread (a worker of
    // `rondo serve`) forever, and with it whatever that thread held.
    match run_with(cli, &mut io::stdout(), &mut io::stderr()) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the process's log on stderr: the level from `--log-level`, else `RONDO_LOG` (a
/// tracing `EnvFilter`), else `config`'s `[log] level`, else `default`; the format from
/// `--log-format`, else `[log] format`, else text. Text has colour only on a terminal (and not
/// with `NO_COLOR` set), so a file or a pipe gets no escape codes. Does nothing if a log was
/// started already (in-process tests).
pub fn init_tracing(args: &cli::LogArgs, config: Option<&rondo_config::LogSpec>, default: &str) {
    use std::io::IsTerminal;
    let (filter, ignored) = log_filter(
        args.log_level.as_deref(),
        std::env::var("RONDO_LOG").ok().as_deref(),
        config.and_then(|c| c.level.as_deref()),
        default,
    );
    let json = log_is_json(args, config);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(io::stderr);
    if json {
        // One object per line: timestamp, level, fields (the message among them), target.
        let _ = builder.json().with_current_span(false).with_span_list(false).try_init();
        // A panic's message goes through the log too, as JSON.
        std::panic::set_hook(Box::new(|info| tracing::error!(target: "rondo::panic", "{info}")));
    } else {
        let colour = io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let _ = builder.with_ansi(colour).try_init();
    }
    // Said through the log, once it exists, so it has the log's format.
    if let Some(e) = ignored {
        tracing::warn!("ignoring RONDO_LOG: {e}");
    }
}

/// Whether the log is JSON: `--log-format`, else `[log] format`, else text.
pub fn log_is_json(args: &cli::LogArgs, config: Option<&rondo_config::LogSpec>) -> bool {
    match args.log_format.as_deref() {
        Some(f) => f == "json",
        None => config.is_some_and(|c| c.format == rondo_config::LogFormat::Json),
    }
}

/// The filter of a `--log-level`, a `RONDO_LOG` and a config's `[log] level`, first set wins.
/// A level applies to rondo's own crates (their targets all start with `rondo`); libraries stay
/// at `warn` (or `error` with `error`), so `info` is not flooded by a dependency's chatter.
/// A `RONDO_LOG` that does not parse is ignored, and the reason returned beside the filter.
fn log_filter(
    cli: Option<&str>,
    env: Option<&str>,
    config: Option<&str>,
    default: &str,
) -> (tracing_subscriber::EnvFilter, Option<String>) {
    use tracing_subscriber::EnvFilter;
    let for_level = |level: &str| {
        let others = if level == "error" { "error" } else { "warn" };
        EnvFilter::new(format!("{others},rondo={level}"))
    };
    if let Some(level) = cli {
        return (for_level(level), None);
    }
    let mut ignored = None;
    if let Some(env) = env.filter(|e| !e.trim().is_empty()) {
        match EnvFilter::try_new(env) {
            Ok(f) => return (f, None),
            Err(e) => ignored = Some(format!("{env:?}: {e}")),
        }
    }
    (for_level(config.unwrap_or(default)), ignored)
}

/// `rondo agent`: builds the options and runs the agent until interrupted.
fn agent(args: cli::AgentArgs, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    // `--register`: the naming endpoints are checked before anything runs.
    let register = match &args.register {
        None => None,
        Some(address) => match naming_cli::endpoints(args.naming.as_deref()) {
            Ok(n) => Some((n, address.clone())),
            Err(e) => {
                writeln!(err, "rondo agent: {e}")?;
                return Ok(ExitCode::FAILURE);
            }
        },
    };
    if args.report_to.is_empty() {
        let Some((naming, address)) = register else {
            anyhow::bail!("--report-to or --register is required")
        };
        let rt = serve::runtime(Some(1))?;
        return rt.block_on(async {
            let (cluster, member) = (args.cluster, args.member);
            let lease = Duration::from_millis(args.lease_ms);
            let keep = naming_cli::keep_registered(
                naming.clone(),
                cluster.clone(),
                member.clone(),
                address,
                lease,
            );
            tokio::select! {
                () = keep => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            naming_cli::deregister(&naming, &cluster, &member).await;
            Ok(ExitCode::SUCCESS)
        });
    }
    let key = match (&args.key, &args.key_file) {
        (Some(k), _) => rondo_config::AgentKey::Inline(k.clone()),
        (None, Some(f)) => rondo_config::AgentKey::File(f.clone()),
        (None, None) => anyhow::bail!("--key or --key-file is required"),
    };
    let key = match serve::read_key(&key) {
        Ok(k) => k,
        Err(e) => {
            writeln!(err, "rondo agent: {e:#}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let tls = match args.tls.files().map(|f| rondo_runtime::tls::client::ClientTls::load(&f, &[])) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            writeln!(err, "rondo agent: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let (cluster, member) = (args.cluster, args.member);
    let opts = rondo_agent::AgentOpts {
        tls,
        report_to: args.report_to,
        cluster: cluster.clone(),
        member: member.clone(),
        key: rondo_agent::Key::new(&key),
        interval: args.interval_ms.map(Duration::from_millis),
        sessions: args.sessions,
        fixed_cpu: args.fixed_cpu,
        fixed_mem: args.fixed_mem_mib.map(|m| m.saturating_mul(1 << 20)),
        drop_percent: args.drop_percent,
    };
    let rt = serve::runtime(Some(1))?;
    rt.block_on(async {
        let naming = register.as_ref().map(|(n, _)| n.clone());
        let keep = async {
            match register {
                Some((n, address)) => {
                    let lease = Duration::from_millis(args.lease_ms);
                    let (c, m) = (cluster.clone(), member.clone());
                    naming_cli::keep_registered(n, c, m, address, lease).await;
                }
                None => std::future::pending().await,
            }
        };
        let result = tokio::select! {
            () = keep => Ok(ExitCode::SUCCESS),
            r = rondo_agent::agent::run(opts) => match r {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    writeln!(err, "rondo agent: {e}")?;
                    Ok(ExitCode::FAILURE)
                }
            },
            _ = tokio::signal::ctrl_c() => Ok(ExitCode::SUCCESS),
        };
        if let Some(n) = naming {
            naming_cli::deregister(&n, &cluster, &member).await;
        }
        result
    })
}

/// Runs a parsed command line with the given outputs; an `Err` means writing output failed.
pub fn run_with(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    // Libraries that ask rustls for the process's provider (the NATS client's TLS) get the
    // build's: with both rustls providers compiled in, rustls would refuse to pick one.
    rondo_config::crypto::install_default();
    match cli.command {
        Command::Check(args) => match &args.effective {
            Some(cluster) => check::effective(args.path(), cluster, out, err),
            None => check::check(args.path(), args.strict, out, err),
        },
        Command::Serve(args) => {
            let threads = serve::threads::Threads {
                workers: args.workers,
                runtime: args.runtime,
                shards: args.shards,
            };
            serve::serve(args.path(), threads, args.upgrade, &cli.log, out, err)
        }
        Command::Completions(args) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut cmd, "rondo", out);
            Ok(ExitCode::SUCCESS)
        }
        Command::Man(args) => man(args, out, err),
        Command::Tls(args) => match args.command {
            cli::TlsCommand::DevCa { dir, names, clients, days } => {
                dev_ca(&dir, devca::DevCa { names, clients, days }, out, err)
            }
        },
        Command::Auth(args) => auth(args.command, out, err),
        Command::Simulate(args) => simulate::simulate(&args, out, err),
        Command::Demo(args) => demo::demo(args.calls as usize, args.serve, out, err),
        Command::Agent(args) => agent(args, err),
        Command::Ctl(args) => ctl::ctl(args, out, err),
        Command::Member(args) => run_member(&args, out),
    }
}

/// `rondo man`: the man page on stdout, or every page into `--dir`.
fn man(args: cli::ManArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match args.dir {
        None => clap_mangen::Man::new(cmd).render(out).context("writing the man page")?,
        Some(dir) => {
            if let Err(e) = clap_mangen::generate_to(cmd, &dir) {
                writeln!(err, "rondo man: cannot write pages to {}: {e}", dir.display())?;
                return Ok(ExitCode::FAILURE);
            }
            writeln!(out, "rondo man: pages written to {}", dir.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `rondo tls dev-ca`: a development CA and certificates written into `dir`.
fn dev_ca(
    dir: &std::path::Path,
    ca: devca::DevCa,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let files = match devca::write(dir, &ca) {
        Ok(f) => f,
        Err(e) => {
            writeln!(err, "rondo tls dev-ca: {e:#}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    for f in &files {
        writeln!(out, "wrote {}", f.display())?;
    }
    writeln!(
        out,
        "development only: anyone with {} can sign certificates that trust {} accepts",
        dir.join("ca.key").display(),
        dir.join("ca.pem").display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `rondo auth`: a development signing key, or a token signed with one.
fn auth(
    command: cli::AuthCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    match command {
        cli::AuthCommand::DevKey { dir, kid } => match devkey::write(&dir, &kid) {
            Ok(files) => {
                for f in &files {
                    writeln!(out, "wrote {}", f.display())?;
                }
                writeln!(
                    out,
                    "development only: anyone with {} can sign tokens that routes reading {} accept",
                    files[0].display(),
                    files[1].display()
                )?;
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                writeln!(err, "rondo auth dev-key: {e:#}")?;
                Ok(ExitCode::FAILURE)
            }
        },
        cli::AuthCommand::Token { key, issuer, audience, subject, ttl, claims, kid } => {
            let t = devkey::Mint { issuer, audience, subject, ttl, claims, kid };
            match devkey::token(&key, &t) {
                Ok(token) => {
                    writeln!(out, "{token}")?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    writeln!(err, "rondo auth token: {e:#}")?;
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// `rondo member`: a test member serving until Ctrl-C.
fn run_member(args: &cli::MemberArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let rt = serve::runtime(Some(1))?;
    rt.block_on(async {
        let m = member::spawn(&args.name, args.listen, Duration::from_millis(args.delay_ms))
            .await
            .map_err(|e| {
                anyhow::anyhow!("member {}: cannot listen on {}: {e}", args.name, args.listen)
            })?;
        writeln!(out, "rondo member {} on {}", m.name, m.addr)?;
        out.flush()?;
        let _ = tokio::signal::ctrl_c().await;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    fn filter(cli: Option<&str>, env: Option<&str>, config: Option<&str>) -> String {
        log_filter(cli, env, config, "info").0.to_string()
    }

    #[test]
    fn the_log_level_comes_from_the_flag_then_rondo_log_then_the_config_then_the_default() {
        let all = filter(Some("debug"), Some("hyper=trace"), Some("error"));
        assert!(all.contains("rondo=debug") && !all.contains("hyper"), "{all}");
        let env = filter(None, Some("hyper=trace"), Some("error"));
        assert!(env.contains("hyper=trace") && !env.contains("rondo="), "{env}");
        let config = filter(None, None, Some("error"));
        assert!(config.contains("rondo=error") && !config.contains("warn"), "{config}");
        let default = filter(None, Some("  "), None);
        assert!(default.contains("rondo=info") && default.contains("warn"), "{default}");
        // A RONDO_LOG that is no filter is ignored (with a note on stderr).
        let bad = filter(None, Some("rondo=loud=x"), None);
        assert!(bad.contains("rondo=info"), "{bad}");
    }
}
