//! Replays every file of the fuzz corpus `fuzz/corpus/agent_wire` through the function the fuzz
//! target calls (`wire::fuzz_input`), so `cargo test` keeps every seed and every input the
//! fuzzer found (crashes included, once fixed) passing without nightly or cargo-fuzz.

use std::path::PathBuf;

use rondo_agent::wire::{self, Heartbeat, Key};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/agent_wire");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| {
            let path = f.expect("directory entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("corpus file"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_passes_the_fuzz_target() {
    let files = corpus();
    assert!(files.len() >= 20, "only {} corpus files", files.len());
    for (name, data) in &files {
        let run = std::panic::catch_unwind(|| wire::fuzz_input(data));
        assert!(run.is_ok(), "corpus file {name} fails");
    }
}

#[test]
fn the_seeds_are_what_their_names_say() {
    let files = corpus();
    let get = |n: &str| &files.iter().find(|(name, _)| name == n).expect(n).1;
    // The seeds are signed with the fuzz function's key, so they reach the field checks.
    let key = Key::new(b"fuzz-key");
    let hb = wire::decode(get("hb_valid"), &key).expect("hb_valid decodes");
    let want = Heartbeat {
        epoch: 1,
        cluster: "web".into(),
        member: "m1".into(),
        seq: 42,
        cpu_used: 0.25,
        mem_free: 512 << 20,
        sessions: 7,
    };
    assert_eq!(hb, want);
    assert!(wire::decode(get("hb_max_names"), &key).is_ok());
    assert_eq!(
        wire::decode(get("hb_cpu_out_of_range"), &key),
        Err(wire::WireError::Malformed("cpu_used"))
    );
    assert_eq!(wire::decode(get("hb_version1"), &key), Err(wire::WireError::UnsupportedVersion(1)));
    let hello = std::str::from_utf8(get("hello_valid")).unwrap();
    assert_eq!(wire::parse_hello(hello, &key), Ok(("web".into(), "m1".into())));
    let ok = std::str::from_utf8(get("ok_valid")).unwrap();
    assert!(wire::parse_ok(ok, "c", "m", &key).is_ok());
}
