//! The naming API's registration body: the input's first line is the member name from the URL,
//! the rest the JSON body, through the same parse and checks as
//! `PUT /v1/services/{service}/members/{member}`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (member, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"m1"[..], data),
    };
    let member = String::from_utf8_lossy(member);
    let _ = rondo_naming::api::check_registration(&member, body);
});
