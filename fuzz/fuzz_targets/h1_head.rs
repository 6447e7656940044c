//! The router's own HTTP/1 head parser on arbitrary bytes: request heads (under the default
//! limits, or limits the input chooses) and the same bytes as a response head, with the
//! invariants of `rondo_proxy::h1::fuzz::head_input` (spans inside the head, the verdict the
//! same however the bytes arrive).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rondo_proxy::h1::fuzz::head_input(data));
