//! Runs the real `rondo simulate` binary on a tiny scenario: the table on stdout, results.md and
//! well-formed SVG plots in --out, identical output for the same --seed, and a scenario mistake
//! reported as `file:line:column: field: message` with exit status 1.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{BIN, TempDir};

const TINY: &str = r#"
name = "tiny"
description = "three members, one slows down"
duration_s = 3
algorithms = ["round-robin", "p2c-ewma"]
[arrivals]
load = 0.6
[[member]]
name = "m"
count = 3
concurrency = 2
service = { dist = "exponential", mean_ms = 5 }
[[phase]]
at_s = 1
member = "m-2"
kind = "slow"
factor = 10
"#;

fn simulate(scenario: &Path, out: &Path, seed: &str) -> Output {
    Command::new(BIN)
        .args(["simulate", "--scenario"])
        .arg(scenario)
        .arg("--out")
        .arg(out)
        .args(["--seed", seed])
        .output()
        .expect("run rondo simulate")
}

#[test]
fn simulate_writes_the_table_and_well_formed_svg_plots() {
    let dir = TempDir::new("simulate");
    let scenario = dir.0.join("tiny.toml");
    std::fs::write(&scenario, TINY).expect("write scenario");
    let out = dir.0.join("out");
    let run = simulate(&scenario, &out, "3");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    // Not a terminal: no progress line on stderr.
    assert!(run.stderr.is_empty(), "{}", String::from_utf8_lossy(&run.stderr));
    for row in ["| round-robin |", "| p2c-ewma |", "| oracle |", "m-2 slow x10 at 1 s"] {
        assert!(stdout.contains(row), "missing {row:?} in\n{stdout}");
    }
    let table = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert!(stdout.starts_with(&table), "stdout starts with the saved table");
    let plots = ["latency-cdf.svg", "load-round-robin.svg", "load-p2c-ewma.svg", "load-oracle.svg"];
    for name in plots {
        let svg = std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg", "{name}");
        let lines = doc.descendants().filter(|n| n.has_tag_name("polyline")).count();
        assert!(lines >= 2, "{name}: {lines} lines");
    }
    // Same seed, same bytes.
    let again = dir.0.join("again");
    let second = simulate(&scenario, &again, "3");
    assert!(second.status.success());
    for name in std::iter::once("results.md").chain(plots) {
        assert_eq!(
            std::fs::read(out.join(name)).expect("first"),
            std::fs::read(again.join(name)).expect("second"),
            "{name} differs between two runs with the same seed"
        );
    }
}

#[test]
fn a_bad_scenario_exits_1_naming_file_line_and_field() {
    let dir = TempDir::new("simulate");
    let scenario = dir.0.join("bad.toml");
    std::fs::write(&scenario, TINY.replace("kind = \"slow\"", "kind = \"sluggish\""))
        .expect("write");
    let run = simulate(&scenario, &dir.0.join("out"), "1");
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    // The `kind = "sluggish"` line: 16, its value at column 8.
    let want =
        format!("{}:16:8: field `phase[0].kind`: unknown phase \"sluggish\"", scenario.display());
    assert!(stderr.contains(&want), "got {stderr}\nwant {want}");
    assert!(!dir.0.join("out").exists(), "no output for a bad scenario");
}
