//! rondo's command-line front end: this crate owns the `rondo` binary's commands ([`cli`]) and
//! what each one does ([`check`], [`serve`], [`member`], [`demo`], `agent`, which runs
//! `rondo_agent::agent`, and `ctl`, which runs `rondo_admin::client`); `main.rs` only parses
//! arguments and calls [`run`].

pub mod check;
pub mod cli;
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

/// `rondo ctl`: one call to a router's admin API (implemented in `rondo_admin::client`).
fn ctl(args: cli::CtlArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    use rondo_admin::client::{self, CtlCommand as C};
    if let cli::CtlCommand::Lookup { service, key, group } = &args.command {
        return ctl_lookup(
            args.naming.as_deref(),
            service,
            key.as_deref(),
            group.as_deref(),
            out,
            err,
        );
    }
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let env_token = match env("RONDO_TOKEN").map(|v| v.into_string()) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(_)) => {
            writeln!(err, "rondo ctl: RONDO_TOKEN is not valid UTF-8")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let token = match ctl_token(
        args.token.as_deref(),
        args.token_file.as_deref(),
        env_token,
        default_token_file(env("XDG_CONFIG_HOME"), env("HOME")),
    ) {
        Ok(t) => t,
        Err(e) => {
            writeln!(err, "rondo ctl: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let token = match rondo_admin::read_token(&token) {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(e) => {
            writeln!(err, "rondo ctl: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let admin =
        |action, m: cli::MemberRef| C::Admin { action, cluster: m.cluster, member: m.member };
    let any_member = |action, cluster: Option<String>, member| match cluster {
        Some(cluster) => C::Admin { action, cluster, member },
        None => C::AdminEverywhere { action, member },
    };
    let cmd = match args.command {
        cli::CtlCommand::Status => C::Status,
        cli::CtlCommand::Drain(d) => {
            let (wait, timeout_ms) = (d.wait, d.timeout_ms);
            match (d.member.scope(), wait) {
                (Ok((Some(cluster), member)), true) => C::DrainWait {
                    cluster,
                    member,
                    timeout: std::time::Duration::from_millis(timeout_ms),
                },
                (Ok((None, _)), true) => {
                    writeln!(err, "rondo ctl: drain --wait needs the cluster: CLUSTER MEMBER")?;
                    return Ok(ExitCode::FAILURE);
                }
                (Ok((cluster, member)), false) => any_member("drain", cluster, member),
                (Err(e), _) => {
                    writeln!(err, "rondo ctl: {e}")?;
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        cli::CtlCommand::Undrain(m) => match m.scope() {
            Ok((cluster, member)) => any_member("undrain", cluster, member),
            Err(e) => {
                writeln!(err, "rondo ctl: {e}")?;
                return Ok(ExitCode::FAILURE);
            }
        },
        cli::CtlCommand::Disable(m) => admin("disable", m),
        cli::CtlCommand::Enable(m) => admin("enable", m),
        cli::CtlCommand::Weight { cluster, member, weight } => {
            C::Weight { cluster, member, weight }
        }
        cli::CtlCommand::Algorithm { cluster, name } => C::Algorithm { cluster, name },
        cli::CtlCommand::Shadow(s) => match (s.algorithm, s.off) {
            (Some(name), _) => C::ShadowStart { cluster: s.cluster, name },
            (None, true) => C::ShadowStop { cluster: s.cluster },
            (None, false) => C::ShadowReport { cluster: s.cluster },
        },
        cli::CtlCommand::Revoke { token_id, subject, ttl_ms } => {
            C::Revoke { token_id, subject, ttl_ms }
        }
        cli::CtlCommand::Revocations => C::Revocations,
        cli::CtlCommand::Upgrade => C::Upgrade,
        cli::CtlCommand::Queue(q) => match q {
            cli::QueueCommand::Status => C::QueueStatus,
            cli::QueueCommand::Dead { queue, limit } => C::QueueDead { queue, limit },
            cli::QueueCommand::Show { queue, id } => C::QueueShow { queue, id },
            cli::QueueCommand::Requeue { queue, id, .. } => {
                C::QueueChange { queue, id, requeue: true }
            }
            cli::QueueCommand::Purge { queue, id, .. } => {
                C::QueueChange { queue, id, requeue: false }
            }
        },
        cli::CtlCommand::Lookup { .. } => unreachable!("answered above"),
        cli::CtlCommand::Apply { file } => match rondo_config::read_text(&file) {
            Ok(text) => C::Apply { file: file.display().to_string(), text },
            Err(e) => {
                writeln!(err, "rondo ctl: {e}")?;
                return Ok(ExitCode::FAILURE);
            }
        },
    };
    let (addr, tls) = match ctl_tls(&args.admin, &args.tls) {
        Ok(t) => t,
        Err(e) => {
            writeln!(err, "rondo ctl: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let target =
        client::CtlTarget { addr, tls, token, operator: args.operator, if_match: args.if_match };
    let rt = serve::runtime(Some(1))?;
    ctl_answer(rt.block_on(client::run(&target, cmd)), out, err)
}

/// What `rondo ctl` prints of an answer: its text on stdout, or the error on stderr.
fn ctl_answer(
    answer: Result<String, impl std::fmt::Display>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    match answer {
        Ok(text) => {
            write!(out, "{text}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            writeln!(err, "rondo ctl: {e}")?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `rondo ctl lookup`: one naming lookup (no admin token involved).
fn ctl_lookup(
    naming: Option<&str>,
    service: &str,
    key: Option<&str>,
    group: Option<&str>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let rt = serve::runtime(Some(1))?;
    let answer = rt.block_on(async {
        let naming = naming_cli::endpoints(naming)?;
        naming_cli::lookup(&naming, service, key, group).await
    });
    ctl_answer(answer, out, err)
}

/// The admin API's `HOST:PORT` and TLS from `--admin` and the TLS options: TLS with an
/// `https://` address or `--tls-ca` (an `https://` address needs `--tls-ca`).
fn ctl_tls(
    admin: &str,
    args: &cli::ClientTlsArgs,
) -> Result<(String, Option<rondo_runtime::tls::client::ClientTls>), String> {
    let (addr, https) = match (admin.strip_prefix("https://"), admin.strip_prefix("http://")) {
        (Some(rest), _) => (rest, true),
        (None, Some(rest)) => (rest, false),
        (None, None) => (admin, false),
    };
    let addr = addr.trim_end_matches('/').to_owned();
    match args.files() {
        None if https => Err(format!(
            "{admin}: an https admin address needs --tls-ca FILE (the CA that signed the admin \
             API's certificate)"
        )),
        None => Ok((addr, None)),
        Some(_) if admin.starts_with("http://") => {
            Err(format!("{admin}: --tls-ca needs an https:// admin address"))
        }
        Some(files) => {
            let alpn: &[&[u8]] = &[b"http/1.1"];
            rondo_runtime::tls::client::ClientTls::load(&files, alpn).map(|t| (addr, Some(t)))
        }
    }
}

/// Where `rondo ctl` looks for the admin token when given none: `$XDG_CONFIG_HOME/rondo/token`,
/// else `$HOME/.config/rondo/token`.
pub fn default_token_file(
    xdg_config_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    let base = match (xdg_config_home, home) {
        (Some(x), _) => std::path::PathBuf::from(x),
        (None, Some(h)) => std::path::PathBuf::from(h).join(".config"),
        (None, None) => return None,
    };
    Some(base.join("rondo").join("token"))
}

/// The admin token `rondo ctl` sends, by precedence: `--token`, `--token-file`, the
/// `RONDO_TOKEN` environment variable, then the default token file when it exists.
fn ctl_token(
    token: Option<&str>,
    token_file: Option<&std::path::Path>,
    env: Option<String>,
    default_file: Option<std::path::PathBuf>,
) -> anyhow::Result<rondo_config::AdminToken> {
    use rondo_config::AdminToken;
    if let Some(t) = token {
        return Ok(AdminToken::Inline(t.to_owned()));
    }
    if let Some(f) = token_file {
        return Ok(AdminToken::File(f.to_path_buf()));
    }
    if let Some(t) = env {
        return Ok(AdminToken::Inline(t));
    }
    match default_file {
        Some(f) if f.exists() => Ok(AdminToken::File(f)),
        Some(f) => anyhow::bail!(
            "no admin token: pass --token-file FILE or --token TOKEN, set RONDO_TOKEN, or put it \
             in {}",
            f.display()
        ),
        None => anyhow::bail!(
            "no admin token: pass --token-file FILE or --token TOKEN, or set RONDO_TOKEN"
        ),
    }
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
            serve::serve(args.path(), args.workers, args.upgrade, &cli.log, out, err)
        }
        Command::Completions(args) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut cmd, "rondo", out);
            Ok(ExitCode::SUCCESS)
        }
        Command::Man(args) => {
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
        Command::Tls(args) => match args.command {
            cli::TlsCommand::DevCa { dir, names, clients, days } => {
                let files = match devca::write(&dir, &devca::DevCa { names, clients, days }) {
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
        },
        Command::Auth(args) => match args.command {
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
        },
        Command::Simulate(args) => simulate::simulate(&args, out, err),
        Command::Demo(args) => demo::demo(args.calls as usize, args.serve, out, err),
        Command::Agent(args) => agent(args, err),
        Command::Ctl(args) => ctl(args, out, err),
        Command::Member(args) => {
            let rt = serve::runtime(Some(1))?;
            rt.block_on(async {
                let m =
                    member::spawn(&args.name, args.listen, Duration::from_millis(args.delay_ms))
                        .await
                        .map_err(|e| {
                            anyhow::anyhow!(
                                "member {}: cannot listen on {}: {e}",
                                args.name,
                                args.listen
                            )
                        })?;
                writeln!(out, "rondo member {} on {}", m.name, m.addr)?;
                out.flush()?;
                let _ = tokio::signal::ctrl_c().await;
                Ok(ExitCode::SUCCESS)
            })
        }
    }
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
