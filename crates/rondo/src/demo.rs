//! `rondo demo`: the embedded default. Starts three members inside the process (one of them
//! slow), a router in front of them with one listener per algorithm (round-robin,
//! response-time, least-sessions), sends the same number of calls through each with a small
//! fixed concurrency, and prints who served the first calls and how the load spread. No config
//! file: the config text is generated from the members' actual addresses.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rondo_runtime::{Live, probe};
use tokio::task::JoinSet;

use crate::member::{self, Member};
use crate::serve;

/// The algorithms shown, in order; each names a listener, a route and a cluster.
pub const ALGORITHMS: [&str; 3] = ["round-robin", "response-time", "least-sessions"];

/// The members: name and how long each waits before answering, milliseconds.
const MEMBERS: [(&str, u64); 3] = [("m1", 0), ("m2", 0), ("m3", 20)];

/// The slow one.
const SLOW: usize = 2;

/// Calls in flight at once, per algorithm.
const CONCURRENCY: usize = 8;

/// How many of the first calls are listed by member.
const SHOWN: usize = 12;

/// Each algorithm's calls stop after this long, however many are left.
const TIME_LIMIT: Duration = Duration::from_secs(10);

/// One call's limit.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait for the first response-time probe round.
const RANKING_WAIT: Duration = Duration::from_secs(2);

/// Width of the progress bar, in characters.
const BAR_WIDTH: usize = 20;

/// The health check of the response-time cluster (its probes rank the members).
const HEALTH: &str = r#"health = { path = "/health", interval_ms = 200 }"#;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Runs the demo: `calls` calls per algorithm, then, with `keep_serving`, keeps the members and
/// the router up until Ctrl-C.
pub fn demo(
    calls: usize,
    keep_serving: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let runtime = serve::runtime(None)?;
    let result = runtime.block_on(run(calls, keep_serving, out, err));
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn run(
    calls: usize,
    keep_serving: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let members = spawn_members().await?;
    let text = config_text(&members);
    let config = rondo_config::parse_str(&text, Path::new("<rondo demo>"), 1)
        .map_err(|e| anyhow::anyhow!("the demo's embedded config is invalid:\n{e}"))?;
    let live = Arc::new(Live::new(config.view.clone(), config.router.group.clone()));
    probe::spawn(&live.load());
    let router = rondo_proxy::start(&config.listeners, live.clone()).await?;
    // With `--serve`, the admin API and its dashboard too, on a free port with a fresh token.
    let admin = if keep_serving { Some(start_admin(&live).await?) } else { None };
    let listeners: Vec<SocketAddr> = ALGORITHMS
        .iter()
        .map(|a| router.addr(a).with_context(|| format!("listener {a} is not bound")))
        .collect::<anyhow::Result<_>>()?;
    print_setup(out, &members, &listeners, calls)?;

    let mut runs = Vec::with_capacity(ALGORITHMS.len());
    let mut ranking = Vec::new();
    for (algorithm, addr) in ALGORITHMS.iter().zip(&listeners) {
        if *algorithm == "response-time" {
            ranking = wait_for_ranking(&live, algorithm).await;
        }
        runs.push(send_calls(algorithm, *addr, calls, err).await?);
        if *algorithm == "response-time" {
            ranking = probe_times(&live, algorithm).unwrap_or(ranking);
        }
    }

    report(out, calls, &runs, &ranking)?;
    let failed: usize = runs.iter().map(|r| r.failed).sum();
    if let Some(e) = runs.iter().find_map(|r| r.first_error.as_ref()) {
        writeln!(out, "{failed} calls failed; the first: {e}")?;
    }
    if !keep_serving {
        writeln!(out)?;
        writeln!(
            out,
            "to keep the members, the router and its live dashboard running: rondo demo --serve"
        )?;
    }
    out.flush()?;

    if keep_serving {
        print_serving(out, &listeners, &members, admin.as_ref())?;
        let _ = tokio::signal::ctrl_c().await;
    }
    router.stop();
    drop(admin);
    drop(members);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The demo's members on free loopback ports, as [`MEMBERS`] lists them.
async fn spawn_members() -> anyhow::Result<Vec<member::Member>> {
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut members = Vec::with_capacity(MEMBERS.len());
    for (name, delay_ms) in MEMBERS {
        let m = member::spawn(name, loopback, Duration::from_millis(delay_ms))
            .await
            .with_context(|| format!("member {name}: cannot listen on {loopback}"))?;
        members.push(m);
    }
    Ok(members)
}

/// The admin API and its dashboard on a free loopback port, with a fresh token.
async fn start_admin(live: &Arc<Live>) -> anyhow::Result<rondo_admin::AdminServer> {
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let token = random_token();
    let spec = rondo_config::AdminSpec {
        listen: loopback,
        token: Some(rondo_config::AdminToken::Inline(token)),
        tls: None,
        probes: Default::default(),
    };
    rondo_admin::start(&spec, rondo_admin::AdminParts::of(live))
        .await
        .with_context(|| format!("admin API: cannot listen on {loopback}"))
}

/// What runs where, and the calls about to be made.
fn print_setup(
    out: &mut dyn Write,
    members: &[member::Member],
    listeners: &[SocketAddr],
    calls: usize,
) -> anyhow::Result<()> {
    let (slow_name, slow_ms) = MEMBERS[SLOW];
    writeln!(
        out,
        "rondo demo: members {} on loopback ({slow_name} answers {slow_ms} ms late) behind a \
         router",
        names().join(", ")
    )?;
    let mut line = String::from("  members   ");
    for m in members {
        line.push_str(&format!("  {} {}", m.name, m.addr));
    }
    writeln!(out, "{line}")?;
    let mut line = String::from("  listeners ");
    for (algorithm, addr) in ALGORITHMS.iter().zip(listeners) {
        line.push_str(&format!("  {algorithm} {addr}"));
    }
    writeln!(out, "{line}")?;
    writeln!(out, "{calls} calls per algorithm, {CONCURRENCY} at a time")?;
    out.flush()?;
    Ok(())
}

/// With `--serve`: the addresses to try while the demo keeps running.
fn print_serving(
    out: &mut dyn Write,
    listeners: &[SocketAddr],
    members: &[member::Member],
    admin: Option<&rondo_admin::AdminServer>,
) -> anyhow::Result<()> {
    let (slow_name, _) = MEMBERS[SLOW];
    writeln!(out)?;
    writeln!(out, "serving until Ctrl-C:")?;
    for (algorithm, addr) in ALGORITHMS.iter().zip(listeners) {
        writeln!(out, "  {algorithm:<16}http://{addr}/")?;
    }
    for m in members {
        let slow = if m.name == slow_name { " (slow)" } else { "" };
        writeln!(out, "  {:<16}http://{}/{slow}", m.name, m.addr)?;
    }
    if let Some(server) = admin {
        writeln!(out, "  dashboard: {}", server.dashboard_link(true))?;
    }
    out.flush()?;
    Ok(())
}

/// 128 random bits as hex, for the demo's admin token (std's hasher keys come from the OS).
fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hex = String::with_capacity(32);
    for i in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        hex.push_str(&format!("{:016x}", h.finish()));
    }
    hex
}

fn names() -> Vec<&'static str> {
    MEMBERS.iter().map(|(n, _)| *n).collect()
}

/// The router's config: per algorithm a listener on `127.0.0.1:0`, a route and a cluster of
/// all the members.
fn config_text(members: &[Member]) -> String {
    let list: Vec<String> = members
        .iter()
        .map(|m| format!("{{ name = \"{}\", address = \"{}\" }}", m.name, m.addr))
        .collect();
    let list = list.join(", ");
    let mut text = String::new();
    for a in ALGORITHMS {
        text.push_str(&format!("[[listener]]\nname = \"{a}\"\nlisten = \"127.0.0.1:0\"\n\n"));
    }
    for a in ALGORITHMS {
        text.push_str(&format!("[[route]]\nlistener = \"{a}\"\ncluster = \"{a}\"\n\n"));
    }
    for a in ALGORITHMS {
        text.push_str(&format!("[cluster.{a}]\nalgorithm = \"{a}\"\nmembers = [{list}]\n"));
        if a == "response-time" {
            text.push_str(HEALTH);
            text.push('\n');
        }
        text.push('\n');
    }
    text
}

/// Each member's round trip in cluster `cluster`'s latest probe round, when every member has
/// one.
fn probe_times(live: &Live, cluster: &str) -> Option<Vec<(String, Duration)>> {
    let snapshot = live.load();
    let rt = snapshot.clusters.get(cluster)?;
    let times: Option<Vec<Duration>> =
        rt.with(|b| b.states().iter().map(|s| s.load.probe_rtt).collect());
    let mut ranked: Vec<(String, Duration)> =
        rt.spec.members.iter().map(|m| m.name.clone()).zip(times?).collect();
    ranked.sort_by_key(|(_, d)| *d);
    Some(ranked)
}

/// Waits (bounded) until the first probe round has ranked every member of `cluster`.
async fn wait_for_ranking(live: &Live, cluster: &str) -> Vec<(String, Duration)> {
    let until = Instant::now() + RANKING_WAIT;
    loop {
        if let Some(r) = probe_times(live, cluster) {
            return r;
        }
        if Instant::now() >= until {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One algorithm's calls.
#[derive(Debug)]
struct Run {
    algorithm: &'static str,
    /// Per call, in the order the calls were started: the member's index and the latency.
    served: Vec<(usize, Duration)>,
    failed: usize,
    first_error: Option<String>,
    elapsed: Duration,
}

impl Run {
    /// Calls member `m` served and their mean latency.
    fn member(&self, m: usize) -> (usize, Option<Duration>) {
        let mine: Vec<Duration> =
            self.served.iter().filter(|(i, _)| *i == m).map(|(_, d)| *d).collect();
        (mine.len(), mean(&mine))
    }

    fn all(&self) -> (usize, Option<Duration>) {
        let all: Vec<Duration> = self.served.iter().map(|(_, d)| *d).collect();
        (all.len(), mean(&all))
    }
}

fn mean(ds: &[Duration]) -> Option<Duration> {
    let n = u32::try_from(ds.len()).ok().filter(|n| *n > 0)?;
    Some(ds.iter().sum::<Duration>() / n)
}

/// Sends `calls` GETs to `addr`, `CONCURRENCY` at a time, for at most `TIME_LIMIT`, drawing a
/// progress bar on `err`.
async fn send_calls(
    algorithm: &'static str,
    addr: SocketAddr,
    calls: usize,
    err: &mut dyn Write,
) -> anyhow::Result<Run> {
    let uri: http::Uri = format!("http://{addr}/").parse()?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + TIME_LIMIT;
    let live_bar = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut results = Vec::with_capacity(calls);
    // First the calls listed by member, one at a time, so the list is the picker's own order;
    // then the rest, `CONCURRENCY` at a time.
    let first = SHOWN.min(calls);
    for (limit, width) in [(first, 1), (calls, CONCURRENCY.min(calls - first))] {
        let mut workers = JoinSet::new();
        for _ in 0..width {
            let (client, uri) = (client.clone(), uri.clone());
            let (next, done) = (next.clone(), done.clone());
            workers.spawn(async move {
                let mut results = Vec::new();
                loop {
                    let now = Instant::now();
                    if now >= deadline {
                        return results;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= limit {
                        next.fetch_min(limit, Ordering::Relaxed);
                        return results;
                    }
                    let wait = CALL_TIMEOUT.min(deadline - now);
                    let result = match tokio::time::timeout(wait, call(&client, &uri)).await {
                        Ok(r) => r.map(|m| (m, now.elapsed())),
                        Err(_) => Err(format!("no answer within {} ms", wait.as_millis())),
                    };
                    results.push((i, result));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if live_bar {
                        draw(err, done.load(Ordering::Relaxed), calls, algorithm)?;
                    }
                }
                finished = workers.join_next() => match finished {
                    Some(r) => results.extend(r.context("a demo client task failed")?),
                    None => break,
                },
            }
        }
    }
    let elapsed = start.elapsed();
    draw(err, done.load(Ordering::Relaxed), calls, algorithm)?;
    let note = if results.len() < calls {
        format!(", stopped at the {} s limit", TIME_LIMIT.as_secs())
    } else {
        String::new()
    };
    writeln!(err, " in {:.2} s{note}", elapsed.as_secs_f64())?;
    err.flush()?;

    results.sort_by_key(|(i, _)| *i);
    let mut run = Run { algorithm, served: Vec::new(), failed: 0, first_error: None, elapsed };
    for (_, r) in results {
        match r {
            Ok(served) => run.served.push(served),
            Err(e) => {
                run.failed += 1;
                run.first_error.get_or_insert(format!("{algorithm}: {e}"));
            }
        }
    }
    Ok(run)
}

/// One GET; the index of the member that answered.
async fn call(client: &HttpClient, uri: &http::Uri) -> Result<usize, String> {
    let resp = client.get(uri.clone()).await.map_err(|e| format!("request failed: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| format!("reading the answer: {e}"))?;
    let body = String::from_utf8_lossy(&body.to_bytes()).trim().to_owned();
    if !status.is_success() {
        return Err(format!("status {status}: {body}"));
    }
    MEMBERS
        .iter()
        .position(|(n, _)| *n == body)
        .ok_or_else(|| format!("unexpected answer {body:?}"))
}

/// Redraws the progress line, e.g. `[##########          ] 120/300 round-robin`.
fn draw(err: &mut dyn Write, done: usize, total: usize, label: &str) -> std::io::Result<()> {
    let filled = (done * BAR_WIDTH).checked_div(total).unwrap_or(BAR_WIDTH).min(BAR_WIDTH);
    let width = total.to_string().len();
    write!(
        err,
        "\r[{}{}] {done:>width$}/{total} {label}",
        "#".repeat(filled),
        " ".repeat(BAR_WIDTH - filled)
    )?;
    err.flush()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Width of one algorithm's columns in the summary.
const GROUP: usize = 24;

/// The first calls, the response-time table, the per-member summary and what it shows.
fn report(
    out: &mut dyn Write,
    calls: usize,
    runs: &[Run],
    ranking: &[(String, Duration)],
) -> anyhow::Result<()> {
    writeln!(out)?;
    writeln!(out, "who served the first {} calls", SHOWN.min(calls))?;
    for run in runs {
        let first: Vec<&str> = run.served.iter().take(SHOWN).map(|(m, _)| MEMBERS[*m].0).collect();
        writeln!(out, "  {:<16}{}", run.algorithm, first.join(" "))?;
    }
    writeln!(out)?;
    if ranking.is_empty() {
        writeln!(out, "response-time table: no probe round finished")?;
    } else {
        let ranks: Vec<String> = ranking
            .iter()
            .enumerate()
            .map(|(i, (n, d))| format!("{}. {n} {:.1} ms", i + 1, ms(*d)))
            .collect();
        writeln!(out, "response-time table, latest probe round: {}", ranks.join("   "))?;
    }
    writeln!(out)?;

    let mut line = format!("{:<12}", "");
    for run in runs {
        line.push_str(&format!("  {:^GROUP$}", run.algorithm));
    }
    writeln!(out, "{}", line.trim_end())?;
    let mut line = format!("{:<12}", "member");
    for _ in runs {
        line.push_str(&format!("  {:>6} {:>7} {:>9}", "calls", "share", "mean"));
    }
    writeln!(out, "{line}")?;
    for (m, (name, _)) in MEMBERS.iter().enumerate() {
        let label = if m == SLOW { format!("{name} (slow)") } else { (*name).to_owned() };
        let mut line = format!("{label:<12}");
        for run in runs {
            let total = run.served.len();
            let (n, mean) = run.member(m);
            line.push_str(&cells(n, total, mean));
        }
        writeln!(out, "{line}")?;
    }
    let mut line = format!("{:<12}", "all");
    for run in runs {
        let (n, mean) = run.all();
        line.push_str(&cells(n, n, mean));
    }
    writeln!(out, "{line}")?;
    let mut line = format!("{:<12}", "wall time");
    for run in runs {
        line.push_str(&format!("  {:>22.2} s", run.elapsed.as_secs_f64()));
    }
    writeln!(out, "{line}")?;

    let (slow, slow_ms) = MEMBERS[SLOW];
    let first = SHOWN.min(calls);
    let explanation = format!(
        "The first {first} calls go one at a time, the rest {CONCURRENCY} at a time. round-robin \
         deals calls in turn: {slow} serves a third, and each of those waits {slow_ms} ms. \
         response-time ranks the members by their 200 ms health probes, fastest first, and \
         shares calls by the inverse of each probe's round trip: {slow}'s probes wait \
         {slow_ms} ms too, so it ranks last and gets only a small share (CLB's exact walk \
         down the table, response-time-clb, would give it a third at this call rate). \
         least-sessions sends each call to the member with the fewest calls in \
         flight: one at a time every member is idle and it takes turns; {CONCURRENCY} at a \
         time {slow} is usually still busy, so it gets few calls and the mean latency falls."
    );
    writeln!(out)?;
    for line in wrap(&explanation, 92) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One algorithm's cells for a row: calls, share of `total`, mean latency.
fn cells(n: usize, total: usize, mean: Option<Duration>) -> String {
    let share = if total == 0 { 0.0 } else { n as f64 * 100.0 / total as f64 };
    let mean = match mean {
        Some(d) => format!("{:.1} ms", ms(d)),
        None => "-".to_owned(),
    };
    format!("  {n:>6} {share:>6.1}% {mean:>9}")
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}
