//! rondo's balancing lab: a discrete-event simulator in virtual time that drives rondo-core's
//! own [`rondo_core::Balancer`] (the same `pick` / `begin_request` / `end_request`, health,
//! probe-round and agent calls the router makes, with time and randomness as arguments) over
//! simulated members, beside an oracle that knows the true service times. `rondo simulate` is a
//! thin command over [`run_file`].
//!
//! The lab lives outside rondo-core on purpose: the core stays pure (no clock, no global
//! randomness), and the simulator only ever calls its public API, so what it measures is what
//! the router runs.

pub mod bins;
mod located;
pub mod report;
pub mod scenario;
mod service;
mod shared_view;
pub mod sim;
pub mod stats;
pub mod svg;

use std::path::Path;

pub use scenario::{Scenario, ScenarioError};

/// Everything one `rondo simulate` run produced.
#[derive(Debug)]
pub struct LabOutput {
    /// The text report (tables), identical for identical scenario and seed.
    pub table: String,
    /// SVG files to write: file name and content.
    pub plots: Vec<(String, String)>,
}

/// Loads and runs the scenario in `path`; `seed` overrides the file's. `progress` is called with
/// the fraction done (0.0..=1.0) now and then, for a progress indicator.
pub fn run_file(
    path: &Path,
    seed: Option<u64>,
    progress: &mut dyn FnMut(f64),
) -> Result<LabOutput, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: path.display().to_string(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("cannot read the scenario: {e}"),
    })?;
    let mut scenario = Scenario::parse(&text, &path.display().to_string())?;
    if let Some(seed) = seed {
        scenario.seed = seed;
    }
    Ok(run(&scenario, progress))
}

/// Runs a parsed scenario.
pub fn run(scenario: &Scenario, progress: &mut dyn FnMut(f64)) -> LabOutput {
    match &scenario.kind {
        scenario::Kind::BallsIntoBins(b) => {
            let results = bins::run(b, scenario.seed, progress);
            LabOutput { table: bins::table(scenario, b, &results), plots: Vec::new() }
        }
        scenario::Kind::Queueing(q) => {
            let results = sim::run_all(scenario, q, progress);
            report::render(scenario, q, &results)
        }
    }
}
