//! `rondo simulate`: a thin command over rondo-lab. Runs the scenario, prints the results table,
//! writes the table and the plots into `--out`, and shows a progress line on stderr while the
//! run is long (only when stderr is a terminal, so scripted output stays clean).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::SimulateArgs;

/// Runs `rondo simulate`.
pub fn simulate(
    args: &SimulateArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut last_shown = -1i64;
    let mut progress = |f: f64| {
        // Percent steps, and only once a run has taken a moment: short runs print nothing.
        let pct = (f * 100.0) as i64;
        if terminal && pct != last_shown && started.elapsed().as_millis() > 500 {
            last_shown = pct;
            eprint!("\rsimulating: {pct:3} %");
        }
    };
    let result = rondo_lab::run_file(&args.scenario, args.seed, &mut progress);
    if terminal && last_shown >= 0 {
        eprint!("\r\x1b[K");
    }
    let output = match result {
        Ok(o) => o,
        Err(e) => {
            writeln!(err, "rondo simulate: {e}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    out.write_all(output.table.as_bytes())?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the output directory {}", dir.display()))?;
        let table = dir.join("results.md");
        std::fs::write(&table, &output.table)
            .with_context(|| format!("writing {}", table.display()))?;
        for (name, svg) in &output.plots {
            let path = dir.join(name);
            std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        }
        writeln!(
            out,
            "\nwrote results.md and {} plot(s) in {}",
            output.plots.len(),
            dir.display()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
