//! Replays every file of the fuzz corpora `fuzz/corpus/h1_head`, `fuzz/corpus/h1_chunked`,
//! `fuzz/corpus/h1_follow` and `fuzz/corpus/h1_member` through the functions the fuzz targets
//! call (`h1::fuzz::head_input`, `h1::fuzz::chunked_input`, `h1::fuzz::follow_input`,
//! `h1::fuzz::member_input`), so `cargo test` keeps every seed and every input the fuzzer
//! found (crashes included, once fixed) passing without nightly or cargo-fuzz. The request
//! corpus of the differential test (`testdata/h1`) goes through the head target too.

use std::path::PathBuf;

use rondo_proxy::h1::fuzz;

fn files(dir: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir);
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

fn replay(dir: &str, min: usize, target: fn(&[u8])) {
    let files = files(dir);
    assert!(files.len() >= min, "only {} files in {dir}", files.len());
    for (name, data) in &files {
        let run = std::panic::catch_unwind(|| target(data));
        assert!(run.is_ok(), "{dir}/{name} fails");
    }
}

#[test]
fn every_head_corpus_file_passes_the_fuzz_target() {
    replay("fuzz/corpus/h1_head", 20, fuzz::head_input);
}

#[test]
fn every_differential_case_passes_the_head_fuzz_target() {
    replay("testdata/h1", 150, fuzz::head_input);
}

#[test]
fn every_chunked_corpus_file_passes_the_fuzz_target() {
    replay("fuzz/corpus/h1_chunked", 20, fuzz::chunked_input);
}

#[test]
fn every_follow_corpus_file_passes_the_fuzz_target() {
    replay("fuzz/corpus/h1_follow", 12, fuzz::follow_input);
}

#[test]
fn every_member_corpus_file_passes_the_fuzz_target() {
    replay("fuzz/corpus/h1_member", 20, fuzz::member_input);
}
