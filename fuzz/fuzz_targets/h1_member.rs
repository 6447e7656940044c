//! A member's bytes on a pooled connection, read as the router's own HTTP/1 path reads a
//! response: no byte of one exchange is delivered in another
//! (`rondo_proxy::h1::fuzz::member_input`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rondo_proxy::h1::fuzz::member_input(data));
