//! Replays every file of the fuzz corpus `fuzz/corpus/config` through the function the fuzz
//! target calls (`rondo_config::fuzz_input`: parse, compile, check the answer's invariants), so
//! `cargo test` keeps every seed and every input the fuzzer found passing without nightly or
//! cargo-fuzz.

use std::path::PathBuf;

#[test]
fn every_corpus_file_passes_the_fuzz_target() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/config");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = f.expect("directory entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let run = std::panic::catch_unwind(|| rondo_config::fuzz_input(&data));
        assert!(run.is_ok(), "corpus file {} fails", path.display());
        n += 1;
    }
    assert!(n >= 10, "only {n} corpus files");
    // The example config is a seed, and valid.
    let example = std::fs::read(dir.join("example")).expect("the example seed");
    let text = String::from_utf8(example).unwrap();
    assert!(rondo_config::parse_str(&text, std::path::Path::new("x.toml"), 1).is_ok());
}
