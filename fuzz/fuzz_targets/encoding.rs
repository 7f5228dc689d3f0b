#![no_main]
// See sluice::fuzzing::encoding.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::encoding(data));
