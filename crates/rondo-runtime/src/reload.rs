//! Live reconfiguration from the config file: [`Reloader::reload`] loads and checks the file,
//! then swaps the new view in whole ([`Views::apply`](crate::Views::apply), which carries every surviving member's
//! health, load, EWMA and sessions over) and starts its probes; an invalid file is rejected with
//! every reason logged and the running view untouched. Two sources drive it: [`watch_file`]
//! (polling, with a debounce) and [`on_sighup`].
//!
//! The reloader lives here rather than in the binary so that the admin API can share it (and
//! its counters); `rondo-config` depends only on `rondo-core`, so there is no cycle.
//!
//! Listeners (addresses, protocol, limits, access logs), the router's group, the log settings
//! and the agent, admin and naming settings are bound at start: a reload that changes them logs that a restart is needed and
//! applies the rest (routes, clusters, members).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rondo_config::{Config, ConfigErrors};
use tokio::task::JoinHandle;

use crate::defaults::Defaults;
use crate::live::{Registrations, Views};
use crate::metrics::Metrics;
use crate::probe;

/// How often [`watch_file`] looks at the config file by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);
/// How long the file must stay unchanged before [`watch_file`] reloads it, by default.
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(200);

/// Reloads the view from the config file. Calls are serialised; view ids only ever grow.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    views: Views,
    registrations: Registrations,
    metrics: Arc<Metrics>,
    defaults: Arc<Defaults>,
    /// The settings bound at start that a reload cannot change.
    fixed: Fixed,
    serial: Mutex<()>,
    /// Reloads applied.
    pub accepted: AtomicU64,
    /// Reloads rejected (invalid config or unreadable file).
    pub rejected: AtomicU64,
    /// The clusters' `members_dns` resolvers, started with the process's config and changed
    /// by each reload.
    dns: crate::dns_members::DnsMembers,
}

/// The parts of a config that only apply at start.
#[derive(Debug, Clone, PartialEq)]
struct Fixed {
    listeners: Vec<rondo_config::ListenerSpec>,
    router: rondo_config::RouterSpec,
    admin: Option<rondo_config::AdminSpec>,
    naming: Option<rondo_config::NamingSpec>,
    agent: Option<rondo_config::AgentSpec>,
    log: rondo_config::LogSpec,
    queues: Vec<rondo_config::QueueSpec>,
    tracing: Option<rondo_config::TracingSpec>,
    tier: Option<rondo_config::TierSpec>,
}

impl Fixed {
    fn of(config: &Config) -> Fixed {
        Fixed {
            listeners: config.listeners.clone(),
            router: config.router.clone(),
            admin: config.admin.clone(),
            naming: config.naming.clone(),
            agent: config.agent.clone(),
            log: config.log.clone(),
            queues: config.queues.clone(),
            tracing: config.tracing.clone(),
            tier: config.tier.clone(),
        }
    }

    /// The sections of `new` that differ from what was started, for the restart warning.
    fn changed(&self, new: &Fixed) -> Vec<String> {
        let mut v = Vec::new();
        for l in &self.listeners {
            match new.listeners.iter().find(|n| n.name == l.name) {
                None => v.push(format!("listener {} (removed)", l.name)),
                Some(n) if n != l => v.push(format!("listener {}", l.name)),
                Some(_) => {}
            }
        }
        for n in &new.listeners {
            if !self.listeners.iter().any(|l| l.name == n.name) {
                v.push(format!("listener {} (added)", n.name));
            }
        }
        if self.router != new.router {
            v.push("[router]".to_owned());
        }
        if self.admin != new.admin {
            v.push("[admin]".to_owned());
        }
        if self.naming != new.naming {
            v.push("[naming]".to_owned());
        }
        if self.agent != new.agent {
            v.push("[agent]".to_owned());
        }
        if self.log != new.log {
            v.push("[log]".to_owned());
        }
        if self.queues != new.queues {
            v.push("[[queue]]".to_owned());
        }
        if self.tracing != new.tracing {
            v.push("[tracing]".to_owned());
        }
        if self.tier != new.tier {
            v.push("[tier]".to_owned());
        }
        v
    }
}

impl Reloader {
    /// A reloader of the file at `path` into `views` (the members from DNS into
    /// `registrations`, counted in `metrics`, with `defaults` applied); `started` is the config
    /// the process started with (its listeners and other start-only settings are the ones
    /// bound). Starts the config's `members_dns` resolvers (inside a tokio runtime), which run
    /// while it lives.
    pub fn new(
        path: impl Into<PathBuf>,
        views: Views,
        registrations: Registrations,
        metrics: Arc<Metrics>,
        defaults: Arc<Defaults>,
        started: &Config,
    ) -> Reloader {
        let dns = crate::dns_members::DnsMembers::default();
        dns.apply(&registrations, &metrics, &started.members_dns);
        let path = path.into();
        defaults.from_file(&path);
        Reloader {
            path,
            views,
            registrations,
            metrics,
            defaults,
            fixed: Fixed::of(started),
            serial: Mutex::new(()),
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            dns,
        }
    }

    /// The config file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The view this reloader replaces.
    pub fn views(&self) -> &Views {
        &self.views
    }

    /// Loads the file with the next view id and, if it is valid, applies it and starts its
    /// probes (must run inside a tokio runtime); returns the new view id. Otherwise logs every
    /// error (one warning each, naming `source`, e.g. "file change" or "SIGHUP") and leaves the
    /// running view untouched.
    pub fn reload(&self, source: &str) -> Result<u64, ConfigErrors> {
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let next = self.views.load().view.id + 1;
        let over = self.defaults.over();
        let all = rondo_config::Features::ALL;
        let config = match rondo_config::load_file_over(&self.path, next, all, over.as_ref()) {
            Ok(c) => c,
            Err(errors) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                self.metrics.reload(false);
                for e in errors.iter() {
                    tracing::warn!("config reload ({source}) rejected: {e}");
                }
                tracing::warn!(
                    "config reload ({source}) rejected with {} error(s); view {} stays",
                    errors.len(),
                    next - 1
                );
                return Err(errors);
            }
        };
        for w in &config.warnings {
            tracing::warn!("config reload ({source}): {}", w.as_warning());
        }
        let changed = self.fixed.changed(&Fixed::of(&config));
        if !changed.is_empty() {
            tracing::warn!(
                "config reload ({source}): changes to {} need a restart and are not applied \
                 (routes, clusters and members apply live)",
                changed.join(", ")
            );
        }
        self.views.shared_members().set(config.shared_members);
        self.metrics.set_departed_grace(config.metrics.departed_grace);
        let snapshot = self.views.apply(config.view);
        self.defaults.from_file(&self.path);
        probe::spawn(&snapshot);
        self.dns.apply(&self.registrations, &self.metrics, &config.members_dns);
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.metrics.reload(true);
        tracing::info!(
            "config reload ({source}): view {} applied from {}",
            snapshot.view.id,
            self.path.display()
        );
        Ok(snapshot.view.id)
    }
}

/// What identifies a version of the file: modification time, length and inode (an editor that
/// saves by writing a new file and renaming it over the old one changes the inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

/// The fingerprints of the config file and of every file its `include` names now (a file
/// added to or removed from an included directory changes the list).
fn fingerprints(path: &Path) -> Vec<Option<Fingerprint>> {
    rondo_config::config_files(path).iter().map(|f| fingerprint(f)).collect()
}

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Fingerprint { modified: meta.modified().ok(), len: meta.len(), inode })
}

/// Watches the config file by polling its metadata every `poll` (no platform watcher: portable,
/// no dependency, and it follows the path, so saves by rename are seen), and reloads once a
/// change has been stable for `settle`. A missing file (mid-rename) is waited out.
pub fn watch_file(reloader: Arc<Reloader>, poll: Duration, settle: Duration) -> JoinHandle<()> {
    let mut seen = fingerprints(reloader.path());
    tokio::spawn(async move {
        let mut applied = seen.clone();
        let mut changed_at = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = fingerprints(reloader.path());
            if now != seen {
                seen = now;
                changed_at = tokio::time::Instant::now();
                continue;
            }
            if seen.first().is_some_and(Option::is_some)
                && seen != applied
                && changed_at.elapsed() >= settle
            {
                applied = seen.clone();
                let _ = reloader.reload("file change");
            }
        }
    })
}

/// Reloads on every SIGHUP (replacing its default action, which would end the process).
#[cfg(unix)]
pub fn on_sighup(reloader: Arc<Reloader>) -> std::io::Result<JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let _ = reloader.reload("SIGHUP");
        }
    }))
}

#[cfg(test)]
mod tests;
