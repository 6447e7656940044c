//! Replays every file of the fuzz corpus `fuzz/corpus/naming_register` through the function
//! the fuzz target calls (`api::check_registration`: the registration body's parse and checks),
//! with the target's split (first line the member name, the rest the JSON body), so `cargo test`
//! keeps every seed and every input the fuzzer found passing without nightly or cargo-fuzz.

use std::path::PathBuf;
use std::time::Duration;

use rondo_naming::api::check_registration;

/// The fuzz target's reading of one input.
fn split(data: &[u8]) -> (String, &[u8]) {
    let (member, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"m1"[..], data),
    };
    (String::from_utf8_lossy(member).into_owned(), body)
}

#[test]
fn every_corpus_file_passes_the_fuzz_target() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/naming_register");
    let mut results = Vec::new();
    for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = f.expect("directory entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let (member, body) = split(&data);
        let run = std::panic::catch_unwind(|| {
            check_registration(&member, body).map(|_| ()).map_err(|resp| resp.status().as_u16())
        });
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match run {
            Ok(r) => results.push((name, r)),
            Err(_) => panic!("corpus file {name} fails"),
        }
    }
    assert!(results.len() >= 15, "only {} corpus files", results.len());
    let result = |n: &str| results.iter().find(|(name, _)| name == n).expect(n).1;
    assert_eq!(result("minimal"), Ok(()));
    assert_eq!(result("full"), Ok(()));
    for bad in ["bad_member", "port_zero", "weight_zero", "ttl_small", "not_json", "bad_group"] {
        assert_eq!(result(bad), Err(400), "{bad}");
    }
}

#[test]
fn a_checked_registration_has_the_defaults() {
    let (m, ttl) = check_registration("m1", br#"{"address": "127.0.0.1:8001"}"#).expect("valid");
    assert_eq!((m.name.as_str(), m.address.as_str(), m.weight), ("m1", "127.0.0.1:8001", 100));
    assert_eq!(ttl, rondo_naming::registry::DEFAULT_TTL);
    assert!(ttl > Duration::ZERO);
}
