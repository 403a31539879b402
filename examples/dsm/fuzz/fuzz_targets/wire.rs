//! libFuzzer's target: every decoder of the DSM's wire, `dsm::fuzz::decode` (a panic is a
//! bug; an error is the expected answer to bytes that are not a message).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsm::fuzz::decode(data));
