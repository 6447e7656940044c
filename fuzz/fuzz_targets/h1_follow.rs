//! The follower of HTTP/1 requests on connections hyper serves, on arbitrary bytes: a stream
//! followed whole, split in two and byte by byte must get the same verdict
//! (`rondo_proxy::h1::fuzz::follow_input`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rondo_proxy::h1::fuzz::follow_input(data));
