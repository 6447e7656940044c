//! Runs the real `rondo demo`: it must finish on its own, name every algorithm and member, and
//! its summary must account for every call of every algorithm.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rondo");

/// How long the demo may take before the test kills it.
const LIMIT: Duration = Duration::from_secs(60);

const ALGORITHMS: [&str; 3] = ["round-robin", "response-time", "least-sessions"];
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];

/// Runs `rondo ARGS`, killing it after `LIMIT`; its exit success, stdout and stderr.
fn run(args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rondo");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).ok();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for rondo") {
            break status;
        }
        if start.elapsed() > LIMIT {
            child.kill().ok();
            child.wait().ok();
            let (out, err) = (out.join().unwrap(), err.join().unwrap());
            panic!("rondo {args:?} still running after {LIMIT:?}\nstdout:\n{out}\nstderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.success(), out.join().unwrap(), err.join().unwrap())
}

/// The summary's rows (between its `member` header and its `all` row): each member's name and
/// calls per algorithm (in `ALGORITHMS` order).
fn summary_counts(stdout: &str) -> Vec<(String, Vec<u64>)> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("member "))
        .skip(1)
        .take_while(|l| !l.starts_with("all "))
        .map(|l| {
            let name = l.split_whitespace().next().unwrap_or_default().to_owned();
            let counts: Vec<u64> = l.split_whitespace().filter_map(|t| t.parse().ok()).collect();
            (name, counts)
        })
        .collect()
}

#[test]
fn demo_runs_and_accounts_for_every_call() {
    let calls = 60;
    let (ok, stdout, stderr) = run(&["demo", "--calls", &calls.to_string()]);
    assert!(ok, "rondo demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for word in ALGORITHMS.iter().chain(&MEMBERS) {
        assert!(stdout.contains(word), "stdout does not mention {word}:\n{stdout}");
    }
    assert!(stdout.lines().count() <= 40, "more than 40 lines:\n{stdout}");
    // It tells how to keep it running with the dashboard.
    assert!(
        stdout.lines().last().is_some_and(|l| l.ends_with("rondo demo --serve")),
        "the last line does not mention --serve:\n{stdout}"
    );

    let rows = summary_counts(&stdout);
    let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, MEMBERS, "one summary row per member:\n{stdout}");
    for (name, counts) in &rows {
        assert_eq!(counts.len(), ALGORITHMS.len(), "{name}: one count per algorithm:\n{stdout}");
    }
    for (k, algorithm) in ALGORITHMS.iter().enumerate() {
        let total: u64 = rows.iter().map(|(_, c)| c[k]).sum();
        assert_eq!(total, calls, "{algorithm}: the members' calls add up:\n{stdout}");
    }

    // The calls listed by member name only name members.
    for algorithm in ALGORITHMS {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(algorithm) && !l.contains("127.0.0.1"))
            .unwrap_or_else(|| panic!("no first-calls line for {algorithm}:\n{stdout}"));
        let served: Vec<&str> = line.split_whitespace().skip(1).collect();
        assert_eq!(served.len(), 12, "{algorithm}: the first 12 calls:\n{stdout}");
        assert!(served.iter().all(|m| MEMBERS.contains(m)), "{line}");
    }
    // The progress bar finished for every algorithm.
    for algorithm in ALGORITHMS {
        assert!(
            stderr.contains(&format!("{calls}/{calls} {algorithm}")),
            "no finished progress bar for {algorithm}:\n{stderr}"
        );
    }
}

#[test]
fn demo_rejects_zero_calls() {
    let (ok, _, stderr) = run(&["demo", "--calls", "0"]);
    assert!(!ok);
    assert!(stderr.contains("--calls"), "{stderr}");
}
