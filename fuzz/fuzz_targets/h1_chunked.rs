//! The router's chunked-coding follower on arbitrary bytes: a body read whole, split in two
//! and byte by byte must read the same (`rondo_proxy::h1::fuzz::chunked_input`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rondo_proxy::h1::fuzz::chunked_input(data));
