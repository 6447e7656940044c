//! `rondo ctl`: the admin token, TLS and command of one call to a router's admin API (made by
//! `rondo_admin::client`), and `rondo ctl lookup`, one call to the naming service.

use std::io::Write;
use std::process::ExitCode;

use rondo_admin::client::{self, CtlCommand as C};

use crate::{cli, naming_cli, serve};

/// `rondo ctl`: one call to a router's admin API (implemented in `rondo_admin::client`).
pub(crate) fn ctl(
    args: cli::CtlArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
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
    let token = match admin_token(&args) {
        Ok(t) => t,
        Err(e) => return failed(err, e),
    };
    let cmd = match command(args.command) {
        Ok(c) => c,
        Err(e) => return failed(err, e),
    };
    let (addr, tls) = match ctl_tls(&args.admin, &args.tls) {
        Ok(t) => t,
        Err(e) => return failed(err, e),
    };
    let target =
        client::CtlTarget { addr, tls, token, operator: args.operator, if_match: args.if_match };
    let rt = serve::runtime(Some(1))?;
    ctl_answer(rt.block_on(client::run(&target, cmd)), out, err)
}

/// `rondo ctl`'s failure before any call: `e` on stderr.
fn failed(err: &mut dyn Write, e: impl std::fmt::Display) -> anyhow::Result<ExitCode> {
    writeln!(err, "rondo ctl: {e}")?;
    Ok(ExitCode::FAILURE)
}

/// The admin token's text, found as [`ctl_token`] says and read.
fn admin_token(args: &cli::CtlArgs) -> Result<String, String> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let env_token = match env("RONDO_TOKEN").map(|v| v.into_string()) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(_)) => return Err("RONDO_TOKEN is not valid UTF-8".to_owned()),
    };
    let token = ctl_token(
        args.token.as_deref(),
        args.token_file.as_deref(),
        env_token,
        default_token_file(env("XDG_CONFIG_HOME"), env("HOME")),
    )
    .map_err(|e| e.to_string())?;
    let token = rondo_admin::read_token(&token).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&token).into_owned())
}

/// The admin call a `rondo ctl` command makes (all but `lookup`, answered by the naming
/// service), or why it cannot be made.
fn command(command: cli::CtlCommand) -> Result<C, String> {
    let admin =
        |action, m: cli::MemberRef| C::Admin { action, cluster: m.cluster, member: m.member };
    let any_member = |action, cluster: Option<String>, member| match cluster {
        Some(cluster) => C::Admin { action, cluster, member },
        None => C::AdminEverywhere { action, member },
    };
    Ok(match command {
        cli::CtlCommand::Status => C::Status,
        cli::CtlCommand::Drain(d) => {
            let (wait, timeout_ms) = (d.wait, d.timeout_ms);
            match (d.member.scope()?, wait) {
                ((Some(cluster), member), true) => C::DrainWait {
                    cluster,
                    member,
                    timeout: std::time::Duration::from_millis(timeout_ms),
                },
                ((None, _), true) => {
                    return Err("drain --wait needs the cluster: CLUSTER MEMBER".to_owned());
                }
                ((cluster, member), false) => any_member("drain", cluster, member),
            }
        }
        cli::CtlCommand::Undrain(m) => {
            let (cluster, member) = m.scope()?;
            any_member("undrain", cluster, member)
        }
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
        cli::CtlCommand::Queue(q) => queue_command(q),
        cli::CtlCommand::Lookup { .. } => unreachable!("answered by the naming service"),
        cli::CtlCommand::Apply { file } => {
            let text = rondo_config::read_text(&file).map_err(|e| e.to_string())?;
            C::Apply { file: file.display().to_string(), text }
        }
    })
}

/// The admin call of a `rondo ctl queue` command.
fn queue_command(q: cli::QueueCommand) -> C {
    match q {
        cli::QueueCommand::Status => C::QueueStatus,
        cli::QueueCommand::Dead { queue, limit } => C::QueueDead { queue, limit },
        cli::QueueCommand::Show { queue, id } => C::QueueShow { queue, id },
        cli::QueueCommand::Requeue { queue, id, .. } => C::QueueChange { queue, id, requeue: true },
        cli::QueueCommand::Purge { queue, id, .. } => C::QueueChange { queue, id, requeue: false },
    }
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
        Err(e) => failed(err, e),
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
