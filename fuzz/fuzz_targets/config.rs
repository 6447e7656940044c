//! The configuration parser and compiler on an arbitrary TOML text, the invariants of their
//! answer asserted (`rondo_config::fuzz_input`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rondo_config::fuzz_input(data));
