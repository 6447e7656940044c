//! The load agents' wire format on arbitrary bytes: heartbeat datagrams (as sent, and re-signed
//! so the fuzzer reaches the checks behind the MAC), hello lines and `OK` answers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rondo_agent::wire::fuzz_input(data));
