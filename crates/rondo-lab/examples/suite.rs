//! The p99-to-oracle summary over several scenarios, one row per scenario and one column per
//! algorithm, as Markdown: the table in docs/algorithms.md.
//!
//! `cargo run --release -p rondo-lab --example suite -- [--seed N] examples/scenarios/drift.toml ...`
//!
//! Each cell is the algorithm's p99 over the oracle's in that scenario (seed from the file
//! unless `--seed` is given; `--full` prints each scenario's whole table before the summary;
//! `--out DIR` writes each scenario's table and plots into `DIR/NAME`, as `rondo simulate
//! --out` does),
//! `-` where the scenario does not run it; the best algorithm of each row is in bold.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

use rondo_lab::scenario::{Kind, Picker, Scenario};
use rondo_lab::stats::quantile;

fn main() -> ExitCode {
    let mut files: Vec<String> = std::env::args().skip(1).collect();
    let mut seed = None;
    let full = files.first().is_some_and(|a| a == "--full");
    if full {
        files.remove(0);
    }
    let mut out_dir = None;
    if files.first().is_some_and(|a| a == "--out") && files.len() > 1 {
        out_dir = Some(std::path::PathBuf::from(files.remove(1)));
        files.remove(0);
    }
    if files.first().is_some_and(|a| a == "--seed") {
        seed = files.get(1).and_then(|s| s.parse::<u64>().ok());
        if seed.is_none() {
            eprintln!("--seed needs a number");
            return ExitCode::FAILURE;
        }
        files.drain(..2);
    }
    if files.is_empty() {
        eprintln!("usage: suite [--full] [--out DIR] [--seed N] SCENARIO.toml...");
        return ExitCode::FAILURE;
    }
    let mut rows = Vec::new();
    let mut columns: Vec<Picker> = Vec::new();
    for file in &files {
        let text = match std::fs::read_to_string(Path::new(file)) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let s = match Scenario::parse(&text, file) {
            Ok(mut s) => {
                s.seed = seed.unwrap_or(s.seed);
                s
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let Kind::Queueing(q) = &s.kind else { continue };
        let results = rondo_lab::sim::run_all(&s, q, &mut |_| {});
        let rendered = rondo_lab::report::render(&s, q, &results);
        if full {
            println!("{}", rendered.table);
        }
        if let Some(dir) = &out_dir {
            // What `rondo simulate --out DIR/NAME` writes, byte for byte.
            let dir = dir.join(&s.name);
            let written = std::fs::create_dir_all(&dir).and_then(|()| {
                std::fs::write(dir.join("results.md"), &rendered.table)?;
                rendered
                    .plots
                    .iter()
                    .try_for_each(|(name, svg)| std::fs::write(dir.join(name), svg))
            });
            if let Err(e) = written {
                eprintln!("{}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        }
        let p99 = |p: Picker| {
            results.iter().find(|r| r.picker == p).and_then(|r| quantile(&r.latencies, 0.99))
        };
        let Some(oracle) = p99(Picker::Oracle).filter(|&o| o > 0) else { continue };
        let ratios: Vec<(Picker, f64)> = results
            .iter()
            .filter(|r| r.picker != Picker::Oracle)
            .filter_map(|r| Some((r.picker, quantile(&r.latencies, 0.99)? as f64 / oracle as f64)))
            .collect();
        for &(p, _) in &ratios {
            if !columns.contains(&p) {
                columns.push(p);
            }
        }
        rows.push((s.name.clone(), q.routers, ratios));
    }
    let mut out = String::from("| scenario | routers |");
    let mut rule = String::from("|---|---:|");
    for p in &columns {
        out.push_str(&format!(" `{}` |", p.name()));
        rule.push_str("---:|");
    }
    println!("{out}\n{rule}");
    for (name, routers, ratios) in rows {
        let best = ratios.iter().map(|&(_, r)| r).fold(f64::INFINITY, f64::min);
        let shown: BTreeSet<String> =
            ratios.iter().filter(|&&(_, r)| r <= best).map(|(p, _)| p.name().to_owned()).collect();
        let mut line = format!("| {name} | {routers} |");
        for p in &columns {
            match ratios.iter().find(|(q, _)| q == p) {
                Some(&(_, r)) if shown.contains(p.name()) => {
                    line.push_str(&format!(" **{r:.2}** |"))
                }
                Some(&(_, r)) => line.push_str(&format!(" {r:.2} |")),
                None => line.push_str(" - |"),
            }
        }
        println!("{line}");
    }
    ExitCode::SUCCESS
}
