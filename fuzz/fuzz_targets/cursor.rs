#![no_main]
// See sluice::fuzzing::cursor.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzzing::cursor(data));
