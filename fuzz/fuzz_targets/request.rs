#![no_main]
// See sluice::fuzzing::request.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::request(data));
