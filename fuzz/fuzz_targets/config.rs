#![no_main]
// See sluice::fuzzing::config.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::config(data));
